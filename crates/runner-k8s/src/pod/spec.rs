//! The Pods a session runs as (docs/contract.md §9.3: run sessions and app
//! sessions), each carrying its session record ([`crate::pod::session_record`]) so
//! that a restarted runner can adopt it.
//!
//! Everything here is a plain function from data to a manifest: no client, no
//! runtime. The backend maps its config and limits onto [`PodSettings`] and
//! [`Resources`] and hands the result to the API.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, LocalObjectReference,
    Pod, PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecurityContext,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use runner_core::types::{PortMapping, PortProtocol, PullPolicy};

use crate::pod::env_secret::PodEnvSecret;
use crate::pod::labels::{MANAGED_BY_LABEL, SESSION_ID_LABEL};
use crate::pod::session_record::{SessionKind, SessionRecord, pod_name, record_annotations};

/// Where `telo run --inspect` listens inside a run-session pod. Never declared
/// as a container port: only the runner dials it, on the pod IP.
pub const INSPECT_PORT: u16 = 9230;
pub const APP_DIR: &str = "/app";
pub const WORK_DIR: &str = "/work";
pub const DEPS_DIR: &str = "/telo-cache";
pub const HOME_DIR: &str = "/home/telo";
pub const TMP_MOUNT: &str = "/tmp";

/// The workload container of every session pod; failure messages name it.
pub const SESSION_CONTAINER: &str = "session";
/// What the runner sets in a run pod's `session` container, over the
/// session's own variables of the same names.
pub(crate) const SESSION_RUNNER_ENV: [(&str, &str); 4] = [
    ("TELO_CACHE_DIR", DEPS_DIR),
    ("HOME", HOME_DIR),
    ("npm_config_cache", "/home/telo/.npm"),
    ("FORCE_COLOR", "1"),
];
/// The init container that downloads and unpacks the bundle.
pub const BODY_FETCH_CONTAINER: &str = "body-fetch";

/// Every session pod runs as this non-root user and group.
const SESSION_UID: i64 = 1000;

/// The part of the runner's configuration every session pod depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSettings {
    /// `RUNNER_SESSION_NAMESPACE`.
    pub namespace: String,
    /// `RUNNER_MANAGED_BY`: the value of [`MANAGED_BY_LABEL`].
    pub managed_by: String,
    /// `RUNNER_INIT_IMAGE`; it needs `sh`, `wget` and `tar`.
    pub init_image: String,
    /// The image used when a session names none.
    pub default_image: String,
    /// `RUNNER_IMAGE_PULL_SECRET`.
    pub image_pull_secret: Option<String>,
    /// `RUNNER_RUNTIME_CLASS`.
    pub runtime_class: Option<String>,
    /// `RUNNER_STOP_GRACE_SECONDS`: the pods' termination grace period, so a
    /// deletion from outside (a drain, an operator) gives the kernel the same
    /// time to tear down as a stop does.
    pub termination_grace_seconds: i64,
}

#[cfg(test)]
impl PodSettings {
    /// The settings the unit tests build pods with.
    pub(crate) fn for_tests() -> Self {
        Self {
            namespace: "telo-sessions".into(),
            managed_by: "telo-runner".into(),
            init_image: "busybox:stable".into(),
            default_image: "telorun/node:24-slim".into(),
            image_pull_secret: None,
            runtime_class: None,
            termination_grace_seconds: 10,
        }
    }
}

/// Clamped limits of one session (docs/contract.md §9.6): quantities are
/// passed to Kubernetes verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    pub cpu: String,
    pub memory: String,
    pub ephemeral_storage: String,
    /// The pod's `activeDeadlineSeconds`.
    pub ttl_seconds: u32,
}

/// What a run session (a client bundle executed by `telo run`) needs in its pod.
#[derive(Debug, Clone, Copy)]
pub struct RunPodInput<'a> {
    pub session_id: &'a str,
    /// ISO-8601, as reported to clients.
    pub created_at: &'a str,
    /// Where the init container downloads the staged bundle from
    /// ([`crate::bundle_store::BundleStore::stage`]).
    pub bundle_url: &'a str,
    /// Normalized, traversal-checked, without a leading `/`.
    pub entry_relative_path: &'a str,
    /// The requested image; empty means [`PodSettings::default_image`].
    pub image: &'a str,
    pub pull_policy: PullPolicy,
    /// The session environment, in insertion order.
    pub env: &'a [(String, String)],
    pub ports: &'a [PortMapping],
    pub inspect: bool,
    pub resources: &'a Resources,
    /// The principal that created the session, recorded on the pod.
    pub owner: Option<&'a runner_core::identity::Owner>,
}

/// What an app session (an operator catalog image run with its own
/// entrypoint) needs in its pod.
#[derive(Debug, Clone, Copy)]
pub struct AppPodInput<'a> {
    pub session_id: &'a str,
    pub created_at: &'a str,
    /// The catalog name of the app.
    pub app_name: &'a str,
    /// The catalog image; empty means [`PodSettings::default_image`].
    pub image: &'a str,
    pub pull_policy: PullPolicy,
    /// The merged environment (operator keys already won), in order.
    pub env: &'a [(String, String)],
    pub ports: &'a [PortMapping],
    /// Only recorded: the image's own entrypoint decides whether anything
    /// listens on the inspect port, so the pod itself does not change.
    pub inspect: bool,
    /// The session's workload token (`tokenEnv`), already in `env`; its
    /// digest is recorded so a later runner can still check it at the edge.
    pub token: Option<&'a str>,
    pub resources: &'a Resources,
    /// The principal that created the session, recorded on the pod.
    pub owner: Option<&'a runner_core::identity::Owner>,
}

/// `pullPolicyToK8s`: `missing` is Kubernetes' `IfNotPresent`.
pub fn pull_policy_to_k8s(policy: PullPolicy) -> &'static str {
    match policy {
        PullPolicy::Always => "Always",
        PullPolicy::Never => "Never",
        PullPolicy::Missing => "IfNotPresent",
    }
}

/// The run-session pod (docs/contract.md §9.3).
///
/// Departures from the reference, each invisible to a workload that behaves:
/// - the pod carries the [`SessionRecord`] annotations (the reference's run
///   pods carry none) so a restarted runner can adopt it;
/// - session env values are escaped against Kubernetes' `$(VAR)` expansion,
///   so a value such as `pa$$word` reaches the workload unchanged;
/// - a session env entry whose name the runner sets itself (`HOME`, …) is
///   left out instead of duplicated; Kubernetes would let the runner's later
///   entry win anyway, so the workload sees the same environment.
pub fn build_session_pod(settings: &PodSettings, run: &RunPodInput<'_>) -> Pod {
    let record = SessionRecord {
        session_id: run.session_id.to_owned(),
        created_at: run.created_at.to_owned(),
        kind: SessionKind::Run,
        ports: run.ports.to_vec(),
        inspect: run.inspect,
        app: None,
        token_digest: None,
        owner: run.owner.cloned(),
    };

    let mut command = vec!["telo".to_owned(), "run".to_owned()];
    if run.inspect {
        // Options go before the manifest path: everything after it belongs to
        // the app.
        command.extend([
            "--inspect".to_owned(),
            format!("0.0.0.0:{INSPECT_PORT}"),
            "--no-open".to_owned(),
        ]);
    }
    command.push(format!("{APP_DIR}/{}", run.entry_relative_path));

    let runner_env = SESSION_RUNNER_ENV.map(|(name, value)| (name, value.to_owned()));

    let body_fetch = Container {
        name: BODY_FETCH_CONTAINER.to_owned(),
        image: Some(settings.init_image.clone()),
        command: Some(vec!["sh".to_owned(), "-c".to_owned()]),
        args: Some(vec![body_fetch_script(run.bundle_url)]),
        volume_mounts: Some(vec![mount("app", APP_DIR), mount("tmp", TMP_MOUNT)]),
        // A ResourceQuota on limits/requests (the chart ships one) makes the
        // apiserver refuse any pod with a container that declares none, init
        // containers included — the reference's init container declared none.
        // The session's own limits cost no extra quota: a pod's effective
        // request is the larger of its init and its regular containers.
        resources: Some(resource_requirements(run.resources)),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    };

    let session = Container {
        name: SESSION_CONTAINER.to_owned(),
        image: Some(image_or_default(run.image, settings)),
        image_pull_policy: Some(pull_policy_to_k8s(run.pull_policy).to_owned()),
        working_dir: Some(WORK_DIR.to_owned()),
        command: Some(command),
        env: Some(container_env(run.env, &runner_env)),
        stdin: Some(true),
        stdin_once: Some(false),
        tty: Some(true),
        ports: container_ports(run.ports),
        resources: Some(resource_requirements(run.resources)),
        volume_mounts: Some(run_session_mounts()),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    };

    Pod {
        metadata: session_metadata(settings, &record),
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            active_deadline_seconds: Some(i64::from(run.resources.ttl_seconds)),
            termination_grace_period_seconds: Some(settings.termination_grace_seconds),
            automount_service_account_token: Some(false),
            image_pull_secrets: image_pull_secrets(settings),
            runtime_class_name: settings.runtime_class.clone(),
            security_context: Some(non_root_pod_security()),
            init_containers: Some(vec![body_fetch]),
            containers: vec![session],
            volumes: Some(run_session_volumes()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The app-session pod (docs/contract.md §9.3): the catalog image runs its
/// own entrypoint as its own user, so the pod is deliberately less locked
/// down than a run pod (no user, no read-only root, no volumes).
///
/// Like [`build_session_pod`], it carries the [`SessionRecord`] annotations;
/// `FORCE_COLOR` set by the runner replaces one in the merged env.
///
/// Departure from the reference: every value of the merged env — the
/// operator's catalog `env`, the workload token, the client's values — is
/// kept in `env_secret` and read from there (`secretKeyRef`), never written
/// into the spec, where anyone who may read pods would see it. The env
/// arrives merged, without saying whose each value is, and a client's value
/// for the operator's program (a key of its own) deserves the same.
pub fn build_app_pod(
    settings: &PodSettings,
    app: &AppPodInput<'_>,
    env_secret: &mut PodEnvSecret,
) -> Pod {
    let record = SessionRecord {
        session_id: app.session_id.to_owned(),
        created_at: app.created_at.to_owned(),
        kind: SessionKind::App,
        ports: app.ports.to_vec(),
        inspect: app.inspect,
        app: Some(app.app_name.to_owned()),
        token_digest: app.token.map(runner_core::session::token_digest),
        owner: app.owner.cloned(),
    };

    let session = Container {
        name: SESSION_CONTAINER.to_owned(),
        image: Some(image_or_default(app.image, settings)),
        image_pull_policy: Some(pull_policy_to_k8s(app.pull_policy).to_owned()),
        env: Some(secret_container_env(
            env_secret,
            SESSION_CONTAINER,
            app.env,
            &[("FORCE_COLOR", "1".to_owned())],
        )),
        stdin: Some(true),
        stdin_once: Some(false),
        tty: Some(true),
        ports: container_ports(app.ports),
        resources: Some(resource_requirements(app.resources)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(drop_all_capabilities()),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };

    Pod {
        metadata: session_metadata(settings, &record),
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            active_deadline_seconds: Some(i64::from(app.resources.ttl_seconds)),
            termination_grace_period_seconds: Some(settings.termination_grace_seconds),
            automount_service_account_token: Some(false),
            image_pull_secrets: image_pull_secrets(settings),
            runtime_class_name: settings.runtime_class.clone(),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(runtime_default_seccomp()),
                ..PodSecurityContext::default()
            }),
            containers: vec![session],
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn session_metadata(settings: &PodSettings, record: &SessionRecord) -> ObjectMeta {
    ObjectMeta {
        name: Some(pod_name(&record.session_id)),
        namespace: Some(settings.namespace.clone()),
        labels: Some(BTreeMap::from([
            (MANAGED_BY_LABEL.to_owned(), settings.managed_by.clone()),
            (SESSION_ID_LABEL.to_owned(), record.session_id.clone()),
        ])),
        annotations: Some(record_annotations(record)),
        ..ObjectMeta::default()
    }
}

/// The init container's shell script. The URL is ours (self URL, session id,
/// hex token), but the self URL comes from configuration, so the characters
/// the shell still interprets inside double quotes are escaped: for every
/// ordinary URL the script is exactly the reference's.
fn body_fetch_script(bundle_url: &str) -> String {
    let mut quoted = String::with_capacity(bundle_url.len());
    for c in bundle_url.chars() {
        if matches!(c, '"' | '\\' | '$' | '`') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    format!("set -e; wget -qO /tmp/body.tgz \"{quoted}\"; tar xzf /tmp/body.tgz -C {APP_DIR}")
}

pub(crate) fn image_or_default(image: &str, settings: &PodSettings) -> String {
    if image.trim().is_empty() {
        settings.default_image.clone()
    } else {
        image.to_owned()
    }
}

/// The session env in order, then the runner's entries. Kubernetes expands
/// `$(NAME)` and collapses `$$` in env values; doubling every `$` turns that
/// off, so a client's value arrives byte for byte as it does on the local
/// backend.
pub(crate) fn container_env(
    session_env: &[(String, String)],
    runner_env: &[(&str, String)],
) -> Vec<EnvVar> {
    session_env
        .iter()
        .filter(|(name, _)| !runner_env.iter().any(|(ours, _)| ours == name))
        .map(|(name, value)| env_var(name, value.replace('$', "$$")))
        .chain(
            runner_env
                .iter()
                .map(|(name, value)| env_var(name, value.clone())),
        )
        .collect()
}

/// [`container_env`] for values no spec may show: the session env's values
/// go into `secret` (as written: a value read from a Secret is never
/// expanded), the runner's entries stay literal.
pub(crate) fn secret_container_env(
    secret: &mut PodEnvSecret,
    container: &str,
    session_env: &[(String, String)],
    runner_env: &[(&str, String)],
) -> Vec<EnvVar> {
    let mut env: Vec<EnvVar> = session_env
        .iter()
        .filter(|(name, _)| !runner_env.iter().any(|(ours, _)| ours == name))
        .map(|(name, value)| secret.refer(container, name, value))
        .collect();
    env.extend(
        runner_env
            .iter()
            .map(|(name, value)| env_var(name, value.clone())),
    );
    env
}

pub(crate) fn env_var(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    }
}

/// Declared ports; `None` (the key omitted) when there are none.
pub(crate) fn container_ports(ports: &[PortMapping]) -> Option<Vec<ContainerPort>> {
    if ports.is_empty() {
        return None;
    }
    Some(
        ports
            .iter()
            .map(|p| ContainerPort {
                container_port: i32::from(p.port),
                protocol: Some(
                    match p.protocol {
                        PortProtocol::Tcp => "TCP",
                        PortProtocol::Udp => "UDP",
                    }
                    .to_owned(),
                ),
                ..ContainerPort::default()
            })
            .collect(),
    )
}

/// Requests equal limits for cpu and memory (Guaranteed-style sizing);
/// ephemeral storage is only capped, never reserved.
pub(crate) fn resource_requirements(resources: &Resources) -> ResourceRequirements {
    ResourceRequirements {
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(resources.cpu.clone())),
            ("memory".to_owned(), Quantity(resources.memory.clone())),
            (
                "ephemeral-storage".to_owned(),
                Quantity(resources.ephemeral_storage.clone()),
            ),
        ])),
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(resources.cpu.clone())),
            ("memory".to_owned(), Quantity(resources.memory.clone())),
        ])),
        claims: None,
    }
}

pub(crate) fn image_pull_secrets(settings: &PodSettings) -> Option<Vec<LocalObjectReference>> {
    settings
        .image_pull_secret
        .as_ref()
        .map(|name| vec![LocalObjectReference { name: name.clone() }])
}

/// The pod-level context of every pod that runs a client's code: the
/// session user and group, RuntimeDefault seccomp.
pub(crate) fn non_root_pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(SESSION_UID),
        run_as_group: Some(SESSION_UID),
        // The emptyDir volumes are writable by the non-root user only
        // through this group.
        fs_group: Some(SESSION_UID),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..PodSecurityContext::default()
    }
}

pub(crate) fn hardened_container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(drop_all_capabilities()),
        ..SecurityContext::default()
    }
}

fn drop_all_capabilities() -> Capabilities {
    Capabilities {
        add: None,
        drop: Some(vec!["ALL".to_owned()]),
    }
}

pub(crate) fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        localhost_profile: None,
    }
}

/// A run session's `session` container's volumes, where they are mounted:
/// the bundle, the kernel's cache, its working directory, home and `/tmp`
/// (the root filesystem is read-only). Warm pods mount the same.
pub(crate) fn run_session_mounts() -> Vec<VolumeMount> {
    vec![
        mount("app", APP_DIR),
        mount("telo-cache", DEPS_DIR),
        mount("work", WORK_DIR),
        mount("home", HOME_DIR),
        mount("tmp", TMP_MOUNT),
    ]
}

/// The emptyDir volumes behind [`run_session_mounts`].
pub(crate) fn run_session_volumes() -> Vec<Volume> {
    ["app", "telo-cache", "work", "home", "tmp"]
        .into_iter()
        .map(empty_dir)
        .collect()
}

pub(crate) fn mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: path.to_owned(),
        ..VolumeMount::default()
    }
}

pub(crate) fn empty_dir(volume: &str) -> Volume {
    Volume {
        name: volume.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_fetch_script_quotes_what_the_shell_would_interpret() {
        assert_eq!(
            body_fetch_script("http://r:8062/internal/bundles/abc?token=t"),
            r#"set -e; wget -qO /tmp/body.tgz "http://r:8062/internal/bundles/abc?token=t"; tar xzf /tmp/body.tgz -C /app"#
        );
        assert_eq!(
            body_fetch_script(r#"http://r/$(id)`x`"\"#),
            r#"set -e; wget -qO /tmp/body.tgz "http://r/\$(id)\`x\`\"\\"; tar xzf /tmp/body.tgz -C /app"#
        );
    }

    #[test]
    fn pull_policies_map_to_kubernetes_names() {
        assert_eq!(pull_policy_to_k8s(PullPolicy::Always), "Always");
        assert_eq!(pull_policy_to_k8s(PullPolicy::Never), "Never");
        assert_eq!(pull_policy_to_k8s(PullPolicy::Missing), "IfNotPresent");
    }
}
