//! A container of a pod as a `docker create` command line: the pod's and
//! the container's securityContext merged as the kubelet merges them and
//! enforced by the engine, resource limits, the environment, volume mounts,
//! and `command`/`args` with Kubernetes' entrypoint semantics.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, SeccompProfile};

use super::env::expand_refs;
use super::spec::PodView;
use crate::storage::quantity::Quantity;

/// One bind mount of a pod volume into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EngineMount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

impl EngineMount {
    /// The `--mount` value. Its fields are comma-separated CSV, so a field
    /// holding a comma or a quote is quoted.
    fn flag(&self) -> String {
        let field = |f: String| {
            if f.contains([',', '"']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f
            }
        };
        let mut out = format!(
            "type=bind,{},{}",
            field(format!("source={}", self.source.display())),
            field(format!("target={}", self.target))
        );
        if self.read_only {
            out.push_str(",readonly");
        }
        out
    }
}

/// What `docker create` is given for one container.
pub(super) struct CreateSpec<'a> {
    /// The engine's name for the container.
    pub name: &'a str,
    pub labels: &'a [(String, String)],
    /// `--network`: `host`, or `container:<infra>` to join the pod's infra
    /// container's network namespace (the isolated pod network).
    pub network: &'a str,
    /// The pod's hostname (`None`: the host's, for an engine that refuses
    /// one with the host network, or the infra container's, which the
    /// engine gives a container joining its network).
    pub hostname: Option<&'a str>,
    pub pod: &'a PodView,
    pub container: &'a Container,
    /// The image's `USER`, for `runAsNonRoot` and `runAsGroup` alone.
    pub image_user: &'a str,
    /// The container's environment as the kubelet resolved it.
    pub env: &'a [(String, String)],
    pub mounts: &'a [EngineMount],
}

/// The securityContext fields the pod and the container both have: the
/// container's wins.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Effective {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_non_root: Option<bool>,
    pub seccomp: Option<SeccompProfile>,
}

pub(super) fn effective(pod: &PodView, c: &Container) -> Effective {
    let p = pod.spec.security_context.as_ref();
    let s = c.security_context.as_ref();
    Effective {
        run_as_user: s
            .and_then(|s| s.run_as_user)
            .or_else(|| p.and_then(|p| p.run_as_user)),
        run_as_group: s
            .and_then(|s| s.run_as_group)
            .or_else(|| p.and_then(|p| p.run_as_group)),
        run_as_non_root: s
            .and_then(|s| s.run_as_non_root)
            .or_else(|| p.and_then(|p| p.run_as_non_root)),
        seccomp: s
            .and_then(|s| s.seccomp_profile.clone())
            .or_else(|| p.and_then(|p| p.seccomp_profile.clone())),
    }
}

/// The image user's uid, or its name when it is not numeric (containerd's
/// reading of an image's `USER`: the part before `:`; none means root).
fn image_uid(user: &str) -> (Option<i64>, String) {
    let user = user.split(':').next().unwrap_or("");
    if user.is_empty() {
        return (Some(0), String::new());
    }
    match user.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, user.to_string()),
    }
}

/// `format.Pod`: how the kubelet names a pod in its messages.
pub(super) fn pod_ref(pod: &PodView) -> String {
    let m = &pod.metadata;
    format!(
        "{}_{}({})",
        m.name.as_deref().unwrap_or(""),
        m.namespace.as_deref().unwrap_or(""),
        m.uid.as_deref().unwrap_or("")
    )
}

/// The kubelet's `verifyRunAsNonRoot`, with its messages.
pub(super) fn verify_run_as_non_root(
    eff: &Effective,
    image_user: &str,
    pod: &PodView,
    container: &str,
) -> Result<(), String> {
    if eff.run_as_non_root != Some(true) {
        return Ok(());
    }
    let pod = pod_ref(pod);
    if let Some(uid) = eff.run_as_user {
        if uid == 0 {
            return Err(format!(
                "container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})"
            ));
        }
        return Ok(());
    }
    match image_uid(image_user) {
        (None, name) => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
        )),
        (Some(0), _) => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
        )),
        _ => Ok(()),
    }
}

/// `--user`: `runAsUser[:runAsGroup]`; `runAsGroup` alone applies to the
/// image's user (the kubelet fills the user in from the image, root when
/// it has none); neither leaves the image's user as it is.
pub(super) fn user_flag(eff: &Effective, image_user: &str) -> Option<String> {
    let user = match eff.run_as_user {
        Some(uid) => uid.to_string(),
        None if eff.run_as_group.is_some() => {
            let user = image_user.split(':').next().unwrap_or("");
            if user.is_empty() { "0" } else { user }.to_string()
        }
        None => return None,
    };
    Some(match eff.run_as_group {
        Some(gid) => format!("{user}:{gid}"),
        None => user,
    })
}

/// The securityContext as engine flags.
fn security_args(s: &CreateSpec<'_>, a: &mut Vec<String>) -> Result<(), String> {
    let c = s.container;
    let eff = effective(s.pod, c);
    verify_run_as_non_root(&eff, s.image_user, s.pod, &c.name)?;
    let sc = c.security_context.as_ref();
    let psc = s.pod.spec.security_context.as_ref();
    if let Some(user) = user_flag(&eff, s.image_user) {
        a.extend(["--user".into(), user]);
    }
    let mut groups: Vec<i64> = psc
        .and_then(|p| p.supplemental_groups.clone())
        .unwrap_or_default();
    groups.extend(psc.and_then(|p| p.fs_group));
    let mut seen = std::collections::HashSet::new();
    for g in groups {
        if seen.insert(g) {
            a.extend(["--group-add".into(), g.to_string()]);
        }
    }
    let privileged = sc.and_then(|s| s.privileged) == Some(true);
    if privileged {
        a.push("--privileged".into());
    }
    if sc.and_then(|s| s.read_only_root_filesystem) == Some(true) {
        a.push("--read-only".into());
    }
    if let Some(caps) = sc.and_then(|s| s.capabilities.as_ref()) {
        for cap in caps.drop.iter().flatten() {
            a.extend(["--cap-drop".into(), cap.clone()]);
        }
        for cap in caps.add.iter().flatten() {
            a.extend(["--cap-add".into(), cap.clone()]);
        }
    }
    if sc.and_then(|s| s.allow_privilege_escalation) == Some(false) {
        a.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    match eff.seccomp.as_ref().map(|p| p.type_.as_str()) {
        // Unset: the engine's default profile too (a kubelet with
        // `seccompDefault: true`; the stricter of the two settings).
        None | Some("RuntimeDefault") => {}
        Some("Unconfined") => a.extend(["--security-opt".into(), "seccomp=unconfined".into()]),
        Some("Localhost") => {
            let profile = eff
                .seccomp
                .as_ref()
                .and_then(|p| p.localhost_profile.as_deref())
                .unwrap_or("");
            return Err(format!(
                "seccompProfile type Localhost ({profile:?}) is not supported by kube-sim's docker runtime: it has no node profile directory (container: {})",
                c.name
            ));
        }
        Some(other) => {
            return Err(format!(
                "unknown seccompProfile type {other:?} (container: {})",
                c.name
            ));
        }
    }
    Ok(())
}

/// `limits.memory` → a memory limit without swap, `limits.cpu` → a CPU
/// quota, `requests.cpu` → CPU shares, as the kubelet sets the cgroup.
fn resource_args(c: &Container, a: &mut Vec<String>) -> Result<(), String> {
    let Some(res) = c.resources.as_ref() else {
        return Ok(());
    };
    let quantity = |map: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                    key: &str|
     -> Result<Option<Quantity>, String> {
        match map.as_ref().and_then(|m| m.get(key)) {
            None => Ok(None),
            Some(q) => Quantity::parse(&q.0)
                .map(Some)
                .ok_or_else(|| format!("invalid quantity {:?} for {key}", q.0)),
        }
    };
    if let Some(mem) = quantity(&res.limits, "memory")? {
        // The quantity in bytes, rounded up as `Quantity.Value()` does.
        let bytes = (mem.milli + 999) / 1000;
        a.extend([
            "--memory".into(),
            bytes.to_string(),
            "--memory-swap".into(),
            bytes.to_string(),
        ]);
    }
    if let Some(cpu) = quantity(&res.limits, "cpu")? {
        // The kubelet's smallest quota is 1 ms per 100 ms period: 10m.
        let milli = cpu.milli.max(10);
        a.extend([
            "--cpus".into(),
            format!("{}.{:03}", milli / 1000, milli % 1000),
        ]);
    }
    if let Some(cpu) = quantity(&res.requests, "cpu")? {
        let shares = (cpu.milli * 1024 / 1000).max(2);
        a.extend(["--cpu-shares".into(), shares.to_string()]);
    }
    Ok(())
}

/// The arguments of `docker create` (after the client) for a container.
pub(super) fn create_args(s: &CreateSpec<'_>) -> Result<Vec<String>, String> {
    let c = s.container;
    let mut a: Vec<String> = [
        "create",
        "--name",
        s.name,
        "--pull",
        "never",
        "--network",
        s.network,
        // The kubelet keeps the log from the attached output.
        "--log-driver",
        "none",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(h) = s.hostname {
        a.extend(["--hostname".into(), h.to_string()]);
    }
    for (k, v) in s.labels {
        a.extend(["--label".into(), format!("{k}={v}")]);
    }
    if c.stdin == Some(true) {
        a.push("--interactive".into());
    }
    if c.tty == Some(true) {
        a.push("--tty".into());
    }
    security_args(s, &mut a)?;
    resource_args(c, &mut a)?;
    for (k, v) in s.env {
        a.extend(["--env".into(), format!("{k}={v}")]);
    }
    for m in s.mounts {
        a.extend(["--mount".into(), m.flag()]);
    }
    if let Some(wd) = c.working_dir.as_deref().filter(|w| !w.is_empty()) {
        a.extend(["--workdir".into(), wd.to_string()]);
    }
    // `command` replaces the image's ENTRYPOINT and drops its CMD; `args`
    // alone replace the CMD. Both see `$(VAR)` expanded from the
    // container's environment, as the kubelet expands them.
    let expand = |v: &String| expand_refs(v, s.env);
    let command: Vec<String> = c.command.iter().flatten().map(expand).collect();
    let args: Vec<String> = c.args.iter().flatten().map(expand).collect();
    let image = c.image.as_deref().unwrap_or("");
    match command.split_first() {
        Some((entry, rest)) => {
            a.extend(["--entrypoint".into(), entry.clone()]);
            a.push(image.to_string());
            a.extend(rest.iter().cloned());
        }
        None => a.push(image.to_string()),
    }
    a.extend(args);
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> PodView {
        PodView::from_stored(&json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn args_of(p: &PodView, image_user: &str) -> Result<Vec<String>, String> {
        let mounts = [EngineMount {
            source: PathBuf::from("/sb/volumes/work"),
            target: "/work".into(),
            read_only: false,
        }];
        create_args(&CreateSpec {
            name: "k",
            labels: &[("kube-sim.instance".into(), "i".into())],
            network: "host",
            hostname: Some("p"),
            pod: p,
            container: &p.spec.containers[0],
            image_user,
            env: &[("GREETING".into(), "hi".into())],
            mounts: &mounts,
        })
    }

    fn has(args: &[String], pair: &[&str]) -> bool {
        args.windows(pair.len()).any(|w| w == pair)
    }

    #[test]
    fn the_hardened_shape_becomes_engine_flags() {
        let p = pod(json!({
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000,
                "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "busybox:stable", "command": ["sh", "-c"], "args": ["echo $(GREETING)"],
                "workingDir": "/work",
                "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"limits": {"memory": "32Mi", "cpu": "500m"}, "requests": {"cpu": "250m"}}}],
        }));
        let a = args_of(&p, "").unwrap();
        assert!(has(&a, &["--user", "1000:1000"]), "{a:?}");
        assert!(has(&a, &["--group-add", "1000"]));
        assert!(a.contains(&"--read-only".to_string()));
        assert!(has(&a, &["--cap-drop", "ALL"]));
        assert!(has(&a, &["--security-opt", "no-new-privileges"]));
        assert!(!a.iter().any(|x| x.starts_with("seccomp=")));
        assert!(has(
            &a,
            &["--memory", "33554432", "--memory-swap", "33554432"]
        ));
        assert!(has(&a, &["--cpus", "0.500"]));
        assert!(has(&a, &["--cpu-shares", "256"]));
        assert!(has(&a, &["--env", "GREETING=hi"]));
        assert!(has(
            &a,
            &["--mount", "type=bind,source=/sb/volumes/work,target=/work"]
        ));
        assert!(has(&a, &["--workdir", "/work"]));
        assert!(has(&a, &["--network", "host"]));
        assert!(has(&a, &["--hostname", "p"]));
        assert!(has(&a, &["--label", "kube-sim.instance=i"]));
        let tail = &a[a.len() - 4..];
        assert_eq!(tail, ["sh", "busybox:stable", "-c", "echo hi"]);
        assert_eq!(a[a.len() - 5], "--entrypoint");
    }

    #[test]
    fn args_alone_keep_the_image_entrypoint() {
        let p = pod(json!({"containers": [{"name": "c", "image": "img", "args": ["a", "$$(X)"]}]}));
        let a = args_of(&p, "").unwrap();
        assert!(!a.contains(&"--entrypoint".to_string()));
        assert_eq!(&a[a.len() - 3..], ["img", "a", "$(X)"]);
        let p = pod(json!({"containers": [{"name": "c", "image": "img"}]}));
        assert_eq!(args_of(&p, "").unwrap().last().unwrap(), "img");
    }

    #[test]
    fn run_as_non_root_refuses_a_root_image_with_the_kubelets_messages() {
        let p = pod(json!({"securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "c", "image": "busybox:stable"}]}));
        for user in ["", "0", "0:0"] {
            assert_eq!(
                args_of(&p, user).unwrap_err(),
                r#"container has runAsNonRoot and image will run as root (pod: "p_ns(u-1)", container: c)"#
            );
        }
        assert_eq!(
            args_of(&p, "root").unwrap_err(),
            r#"container has runAsNonRoot and image has non-numeric user (root), cannot verify user is non-root (pod: "p_ns(u-1)", container: c)"#
        );
        assert!(args_of(&p, "1000:1000").is_ok());
        let p = pod(
            json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 0},
            "containers": [{"name": "c", "image": "i"}]}),
        );
        assert_eq!(
            args_of(&p, "1000").unwrap_err(),
            r#"container's runAsUser breaks non-root policy (pod: "p_ns(u-1)", container: c)"#
        );
        // The container's own setting wins over the pod's.
        let p = pod(json!({"securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "c", "image": "i", "securityContext": {"runAsNonRoot": false}}]}));
        assert!(args_of(&p, "").is_ok());
    }

    #[test]
    fn users_and_groups_merge_like_the_kubelet() {
        let eff = |u: Option<i64>, g: Option<i64>| Effective {
            run_as_user: u,
            run_as_group: g,
            ..Effective::default()
        };
        assert_eq!(user_flag(&eff(None, None), "1000"), None);
        assert_eq!(user_flag(&eff(Some(7), None), "1000"), Some("7".into()));
        assert_eq!(
            user_flag(&eff(Some(7), Some(8)), "1000"),
            Some("7:8".into())
        );
        assert_eq!(
            user_flag(&eff(None, Some(8)), "node:node"),
            Some("node:8".into())
        );
        assert_eq!(user_flag(&eff(None, Some(8)), ""), Some("0:8".into()));
        let p = pod(json!({"securityContext": {"runAsUser": 1, "runAsGroup": 2},
            "containers": [{"name": "c", "image": "i", "securityContext": {"runAsUser": 3}}]}));
        let e = effective(&p, &p.spec.containers[0]);
        assert_eq!((e.run_as_user, e.run_as_group), (Some(3), Some(2)));
    }

    #[test]
    fn seccomp_profiles_map_to_the_engine_or_are_refused() {
        let with = |profile: serde_json::Value| {
            args_of(
                &pod(json!({"securityContext": {"seccompProfile": profile},
                    "containers": [{"name": "c", "image": "i"}]})),
                "",
            )
        };
        assert!(has(
            &with(json!({"type": "Unconfined"})).unwrap(),
            &["--security-opt", "seccomp=unconfined"]
        ));
        let err = with(json!({"type": "Localhost", "localhostProfile": "p.json"})).unwrap_err();
        assert!(err.contains("Localhost") && err.contains("p.json"), "{err}");
    }

    #[test]
    fn mount_fields_with_commas_are_quoted() {
        let m = EngineMount {
            source: PathBuf::from("/a,b"),
            target: "/c".into(),
            read_only: true,
        };
        assert_eq!(m.flag(), r#"type=bind,"source=/a,b",target=/c,readonly"#);
    }
}
