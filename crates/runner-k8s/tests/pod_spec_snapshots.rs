//! The session pod manifests: snapshots of the three shapes (a spec change
//! shows up as a reviewed diff), the behaviours of the reference's
//! `pod-spec.test.ts`, and the session record round trip adoption relies on.

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, SecurityContext};
use proptest::prelude::*;
use runner_core::types::{PortMapping, PortProtocol, PullPolicy};
use runner_k8s::pod::env_secret::PodEnvSecret;
use runner_k8s::pod::session_record::{
    SessionKind, SessionRecord, pod_name, session_record_from_pod,
};
use runner_k8s::pod::spec::{
    AppPodInput, PodSettings, Resources, RunPodInput, build_app_pod, build_session_pod,
};

const SESSION: &str = "abc234defghi";
const CREATED_AT: &str = "2026-01-01T00:00:00.123Z";
/// The env Secret of the session's pod, named as a test can know it.
const ENV_SECRET: &str = "telo-run-abc234defghi-env-0badc0de";
const BUNDLE_URL: &str =
    "http://k8s-runner.telo-runner.svc:8062/internal/bundles/abc234defghi?token=t";

/// The reference's defaults with only `RUNNER_SELF_URL` set.
fn settings() -> PodSettings {
    PodSettings {
        namespace: "telo-sessions".to_owned(),
        managed_by: "telo-k8s-runner".to_owned(),
        init_image: "busybox:stable".to_owned(),
        default_image: "telorun/node:0-slim".to_owned(),
        image_pull_secret: None,
        runtime_class: None,
        termination_grace_seconds: 5,
    }
}

fn run_limits() -> Resources {
    Resources {
        cpu: "500m".to_owned(),
        memory: "512Mi".to_owned(),
        ephemeral_storage: "1Gi".to_owned(),
        ttl_seconds: 3600,
    }
}

fn app_limits() -> Resources {
    Resources {
        ttl_seconds: 21600,
        ..run_limits()
    }
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn tcp(port: u16) -> PortMapping {
    PortMapping {
        port,
        protocol: PortProtocol::Tcp,
    }
}

fn udp(port: u16) -> PortMapping {
    PortMapping {
        port,
        protocol: PortProtocol::Udp,
    }
}

fn run_input<'a>(
    env: &'a [(String, String)],
    ports: &'a [PortMapping],
    resources: &'a Resources,
) -> RunPodInput<'a> {
    RunPodInput {
        session_id: SESSION,
        created_at: CREATED_AT,
        bundle_url: BUNDLE_URL,
        entry_relative_path: "telo.yaml",
        image: "telorun/node:0.30.1-slim",
        pull_policy: PullPolicy::Always,
        env,
        ports,
        inspect: false,
        resources,
        owner: None,
    }
}

fn app_input<'a>(
    env: &'a [(String, String)],
    ports: &'a [PortMapping],
    resources: &'a Resources,
) -> AppPodInput<'a> {
    AppPodInput {
        session_id: SESSION,
        created_at: CREATED_AT,
        app_name: "tool",
        image: "acme/tool:1",
        pull_policy: PullPolicy::Always,
        env,
        ports,
        inspect: false,
        token: None,
        resources,
        owner: None,
    }
}

fn spec(pod: &Pod) -> &PodSpec {
    pod.spec.as_ref().unwrap()
}

fn session(pod: &Pod) -> &Container {
    let containers = &spec(pod).containers;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].name, "session");
    &containers[0]
}

fn env_of(container: &Container) -> Vec<(String, String)> {
    container
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|EnvVar { name, value, .. }| (name.clone(), value.clone().unwrap()))
        .collect()
}

fn limit(container: &Container, resource: &str) -> String {
    container
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap()[resource]
        .0
        .clone()
}

#[test]
fn run_pod_minimal() {
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    insta::assert_yaml_snapshot!(pod);
}

#[test]
fn run_pod_with_inspect_ports_pull_secret_and_runtime_class() {
    let settings = PodSettings {
        image_pull_secret: Some("regcred".to_owned()),
        runtime_class: Some("gvisor".to_owned()),
        ..settings()
    };
    let env = env(&[
        ("FOO", "bar"),
        ("TELO_REGISTRY_URL", "https://registry.telo.run"),
    ]);
    let ports = [tcp(8080), udp(5353)];
    let resources = run_limits();
    let pod = build_session_pod(
        &settings,
        &RunPodInput {
            inspect: true,
            entry_relative_path: "apps/demo/telo.yaml",
            pull_policy: PullPolicy::Missing,
            ..run_input(&env, &ports, &resources)
        },
    );
    insta::assert_yaml_snapshot!(pod);
}

#[test]
fn app_pod() {
    let env = env(&[("SERVICE_TOKEN", "s3cret")]);
    let ports = [tcp(8080)];
    let resources = app_limits();
    let mut secret = PodEnvSecret::named(ENV_SECRET);
    let pod = build_app_pod(
        &settings(),
        &app_input(&env, &ports, &resources),
        &mut secret,
    );
    insta::assert_yaml_snapshot!(pod);
    insta::assert_yaml_snapshot!(
        "app_pod_env_secret",
        secret.manifest("telo-k8s-runner", SESSION, "telo-run-abc234defghi")
    );
}

// --- pod-spec.test.ts: buildSessionPod ---

#[test]
fn run_pod_uses_the_requested_image_and_pull_policy() {
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    let session = session(&pod);
    assert_eq!(session.image.as_deref(), Some("telorun/node:0.30.1-slim"));
    assert_eq!(session.image_pull_policy.as_deref(), Some("Always"));
}

#[test]
fn run_pod_falls_back_to_the_default_image() {
    let resources = run_limits();
    let pod = build_session_pod(
        &settings(),
        &RunPodInput {
            image: "",
            ..run_input(&[], &[], &resources)
        },
    );
    assert_eq!(session(&pod).image.as_deref(), Some("telorun/node:0-slim"));
}

#[test]
fn run_pod_points_the_telo_cache_at_its_own_volume() {
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    let session = session(&pod);
    assert!(env_of(session).contains(&("TELO_CACHE_DIR".to_owned(), "/telo-cache".to_owned())));
    let cache_mount = session
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == "telo-cache")
        .unwrap();
    assert_eq!(cache_mount.mount_path, "/telo-cache");
    let cache_volume = spec(&pod)
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "telo-cache")
        .unwrap();
    assert_eq!(cache_volume.empty_dir, Some(Default::default()));
}

#[test]
fn run_pod_runs_the_entry_with_telo_run() {
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    assert_eq!(
        session(&pod).command.as_deref().unwrap(),
        ["telo", "run", "/app/telo.yaml"]
    );
}

#[test]
fn inspect_options_precede_the_manifest_path() {
    let resources = run_limits();
    let pod = build_session_pod(
        &settings(),
        &RunPodInput {
            inspect: true,
            ..run_input(&[], &[], &resources)
        },
    );
    assert_eq!(
        session(&pod).command.as_deref().unwrap(),
        [
            "telo",
            "run",
            "--inspect",
            "0.0.0.0:9230",
            "--no-open",
            "/app/telo.yaml"
        ]
    );
    // The inspect port is for the runner only, never declared.
    assert_eq!(session(&pod).ports, None);
}

#[test]
fn run_pod_limits_are_the_clamped_limits() {
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    let session = session(&pod);
    assert_eq!(limit(session, "cpu"), "500m");
    assert_eq!(limit(session, "memory"), "512Mi");
    assert_eq!(limit(session, "ephemeral-storage"), "1Gi");
    let requests = session
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(
        requests.keys().collect::<Vec<_>>(),
        ["cpu", "memory"],
        "no storage request"
    );
    assert_eq!(spec(&pod).active_deadline_seconds, Some(3600));
}

#[test]
fn the_init_container_fetches_the_bundle_url_with_its_token() {
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    let init = spec(&pod).init_containers.as_ref().unwrap();
    assert_eq!(init.len(), 1);
    assert_eq!(init[0].name, "body-fetch");
    assert_eq!(init[0].image.as_deref(), Some("busybox:stable"));
    let script = &init[0].args.as_ref().unwrap()[0];
    assert!(
        script.contains("/internal/bundles/abc234defghi?token=t"),
        "{script}"
    );
    assert_eq!(
        init[0].security_context,
        session(&pod).security_context,
        "both hardened"
    );
    assert_eq!(
        init[0].resources,
        session(&pod).resources,
        "declared, so a limits quota admits the pod"
    );
}

#[test]
fn run_pod_is_hardened() {
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    let security = session(&pod).security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(spec(&pod).automount_service_account_token, Some(false));
    let pod_security = spec(&pod).security_context.as_ref().unwrap();
    assert_eq!(pod_security.run_as_user, Some(1000));
    assert_eq!(pod_security.fs_group, Some(1000));
}

#[test]
fn pull_secret_and_runtime_class_appear_only_when_configured() {
    let resources = run_limits();
    let plain = build_session_pod(&settings(), &run_input(&[], &[], &resources));
    assert_eq!(spec(&plain).image_pull_secrets, None);
    assert_eq!(spec(&plain).runtime_class_name, None);
}

#[test]
fn session_env_comes_first_in_order_then_the_runners() {
    let env = env(&[("ZED", "1"), ("ALPHA", "2")]);
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&env, &[], &resources));
    assert_eq!(
        env_of(session(&pod)),
        [
            ("ZED", "1"),
            ("ALPHA", "2"),
            ("TELO_CACHE_DIR", "/telo-cache"),
            ("HOME", "/home/telo"),
            ("npm_config_cache", "/home/telo/.npm"),
            ("FORCE_COLOR", "1"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
}

#[test]
fn env_values_survive_kubernetes_variable_expansion_literally() {
    // Kubernetes turns `$$` into `$` and `$(NAME)` into NAME's value; doubling
    // each `$` makes the kubelet hand the workload the original text.
    let env = env(&[
        ("PASSWORD", "pa$$word"),
        ("REF", "$(HOME)/x"),
        ("PLAIN", "$x"),
    ]);
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&env, &[], &resources));
    let values = env_of(session(&pod));
    assert_eq!(values[0], ("PASSWORD".to_owned(), "pa$$$$word".to_owned()));
    assert_eq!(values[1], ("REF".to_owned(), "$$(HOME)/x".to_owned()));
    assert_eq!(values[2], ("PLAIN".to_owned(), "$$x".to_owned()));
}

#[test]
fn a_session_env_entry_the_runner_sets_is_not_duplicated() {
    let env = env(&[("HOME", "/root"), ("FOO", "bar")]);
    let resources = run_limits();
    let pod = build_session_pod(&settings(), &run_input(&env, &[], &resources));
    let values = env_of(session(&pod));
    let homes: Vec<_> = values.iter().filter(|(k, _)| k == "HOME").collect();
    assert_eq!(homes, [&("HOME".to_owned(), "/home/telo".to_owned())]);
    assert_eq!(values[0], ("FOO".to_owned(), "bar".to_owned()));
}

// --- pod-spec.test.ts: buildAppPod ---

fn tool_pod() -> Pod {
    tool_pod_and_secret().0
}

fn tool_pod_and_secret() -> (Pod, PodEnvSecret) {
    let env = env(&[("SERVICE_TOKEN", "s3cret"), ("PRICE", "$(HOME) $$5")]);
    let ports = [tcp(8080)];
    let resources = app_limits();
    let mut secret = PodEnvSecret::named(ENV_SECRET);
    let pod = build_app_pod(
        &settings(),
        &app_input(&env, &ports, &resources),
        &mut secret,
    );
    (pod, secret)
}

#[test]
fn app_pod_runs_the_image_entrypoint_without_a_bundle() {
    let pod = tool_pod();
    assert_eq!(spec(&pod).init_containers, None);
    assert_eq!(spec(&pod).volumes, None);
    let session = session(&pod);
    assert_eq!(session.image.as_deref(), Some("acme/tool:1"));
    assert_eq!(session.command, None);
    assert_eq!(session.working_dir, None);
    assert_eq!(session.image_pull_policy.as_deref(), Some("Always"));
}

#[test]
fn app_pod_reads_the_merged_env_from_its_secret_and_carries_its_ports() {
    let (pod, secret) = tool_pod_and_secret();
    let session = session(&pod);
    // Every value of the merged env is read from the pod's Secret, as
    // written (a value read from a Secret is never expanded); only the
    // runner's own variable is a literal.
    /// An entry: its name, its literal value, the Secret and key it reads.
    type Entry = (String, Option<String>, Option<(String, String)>);
    let entries: Vec<Entry> = session
        .env
        .iter()
        .flatten()
        .map(|e| {
            let reference = e
                .value_from
                .as_ref()
                .and_then(|f| f.secret_key_ref.as_ref());
            (
                e.name.clone(),
                e.value.clone(),
                reference.map(|r| (r.name.clone(), r.key.clone())),
            )
        })
        .collect();
    let from_secret = |key: &str| Some((ENV_SECRET.to_owned(), key.to_owned()));
    assert_eq!(
        entries,
        [
            ("SERVICE_TOKEN".to_owned(), None, from_secret("session.0")),
            ("PRICE".to_owned(), None, from_secret("session.1")),
            ("FORCE_COLOR".to_owned(), Some("1".to_owned()), None),
        ]
    );
    let data = secret
        .manifest("telo-k8s-runner", SESSION, "telo-run-abc234defghi")
        .data
        .unwrap();
    assert_eq!(data["session.0"].0, b"s3cret");
    assert_eq!(data["session.1"].0, b"$(HOME) $$5");
    assert!(!serde_json::to_string(&pod).unwrap().contains("s3cret"));
    let ports = session.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].container_port, 8080);
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
}

#[test]
fn app_pod_uses_the_app_limits() {
    let pod = tool_pod();
    assert_eq!(limit(session(&pod), "memory"), "512Mi");
    assert_eq!(spec(&pod).active_deadline_seconds, Some(21600));
}

#[test]
fn app_pod_security_leaves_the_image_its_own_user() {
    let pod = tool_pod();
    assert_eq!(spec(&pod).automount_service_account_token, Some(false));
    let pod_security = spec(&pod).security_context.as_ref().unwrap();
    assert_eq!(
        pod_security.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    assert_eq!(pod_security.run_as_non_root, None);
    assert_eq!(pod_security.run_as_user, None);
    assert_eq!(pod_security.fs_group, None);
    assert_eq!(
        session(&pod).security_context,
        Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                add: None,
                drop: Some(vec!["ALL".to_owned()]),
            }),
            ..SecurityContext::default()
        })
    );
}

#[test]
fn both_pod_shapes_carry_the_managed_by_and_session_id_labels() {
    let resources = run_limits();
    for pod in [
        tool_pod(),
        build_session_pod(&settings(), &run_input(&[], &[], &resources)),
    ] {
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "telo-k8s-runner");
        assert_eq!(labels["telo.run/session-id"], SESSION);
        assert_eq!(pod.metadata.name.as_deref(), Some("telo-run-abc234defghi"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("telo-sessions"));
        assert_eq!(spec(&pod).restart_policy.as_deref(), Some("Never"));
    }
}

#[test]
fn pod_names_are_telo_run_and_the_session_id() {
    assert_eq!(pod_name("abc234defghi"), "telo-run-abc234defghi");
}

// --- adoption: the record a pod carries ---

fn session_id() -> impl Strategy<Value = String> {
    "[a-z2-7]{12}"
}

fn created_at() -> impl Strategy<Value = String> {
    // Any millisecond between 1970 and 2200.
    (0i64..7_258_118_400_000).prop_map(|millis| {
        let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000)
            .unwrap();
        runner_core::time::iso(at)
    })
}

fn port() -> impl Strategy<Value = PortMapping> {
    (any::<u16>(), any::<bool>()).prop_map(|(port, is_tcp)| PortMapping {
        port,
        protocol: if is_tcp {
            PortProtocol::Tcp
        } else {
            PortProtocol::Udp
        },
    })
}

fn record() -> impl Strategy<Value = SessionRecord> {
    (
        session_id(),
        created_at(),
        prop::option::of(".{1,40}"),
        prop::collection::vec(port(), 0..6),
        any::<bool>(),
    )
        .prop_map(
            |(session_id, created_at, app, ports, inspect)| SessionRecord {
                session_id,
                created_at,
                kind: if app.is_some() {
                    SessionKind::App
                } else {
                    SessionKind::Run
                },
                ports,
                inspect,
                app,
                token_digest: None,
                owner: None,
            },
        )
}

/// The pod the backend would create for `record`.
fn pod_for(record: &SessionRecord) -> Pod {
    let resources = run_limits();
    match &record.app {
        None => build_session_pod(
            &settings(),
            &RunPodInput {
                session_id: &record.session_id,
                created_at: &record.created_at,
                ports: &record.ports,
                inspect: record.inspect,
                ..run_input(&[], &[], &resources)
            },
        ),
        Some(app) => build_app_pod(
            &settings(),
            &AppPodInput {
                session_id: &record.session_id,
                created_at: &record.created_at,
                app_name: app,
                ports: &record.ports,
                inspect: record.inspect,
                ..app_input(&[], &[], &resources)
            },
            &mut PodEnvSecret::named(ENV_SECRET),
        ),
    }
}

proptest! {
    #[test]
    fn every_session_pod_gives_back_its_record(record in record()) {
        let pod = pod_for(&record);
        prop_assert_eq!(session_record_from_pod(&pod).unwrap(), record.clone());
        // What the apiserver hands back after a JSON round trip still parses.
        let stored: Pod = serde_json::from_value(serde_json::to_value(&pod).unwrap()).unwrap();
        prop_assert_eq!(session_record_from_pod(&stored).unwrap(), record);
    }

    #[test]
    fn reading_a_record_never_panics_on_arbitrary_annotations(
        id in prop_oneof![session_id(), ".{0,16}"],
        annotations in prop::collection::btree_map(
            prop_oneof![
                Just("telo.run/created-at".to_owned()),
                Just("telo.run/kind".to_owned()),
                Just("telo.run/ports".to_owned()),
                Just("telo.run/inspect".to_owned()),
                Just("telo.run/app".to_owned()),
                ".{0,8}",
            ],
            ".{0,40}",
            0..7,
        ),
    ) {
        let mut pod = Pod::default();
        pod.metadata.name = Some(pod_name(&id));
        pod.metadata.labels = Some([("telo.run/session-id".to_owned(), id)].into());
        pod.metadata.annotations = Some(annotations);
        let _ = session_record_from_pod(&pod);
    }
}

/// A pooled watch pod (`RUNNER_WARM_POOL_WATCH`) as it idles: the cold
/// one-app watch pod but for its app container's name and wait, and no
/// session, mode or deadline until a claim.
#[test]
fn pooled_watch_pod() {
    use runner_k8s::pod::pooled_watch::{WatchPoolShared, build_pooled_watch_pod};
    let pod = build_pooled_watch_pod(
        &settings(),
        &WatchPoolShared {
            resources: app_limits(),
            workspace_limits: vec![
                (
                    "RUNNER_WORKSPACE_MAX_FILE_BYTES".to_owned(),
                    "1048576".to_owned(),
                ),
                ("RUNNER_WORKSPACE_MAX_FILES".to_owned(), "1000".to_owned()),
            ],
        },
        "telo-warm-abc234defghi",
        "telorun/node:0-slim",
        "ghcr.io/telorun/telo-runner:1",
        "workspace-t0ken",
    );
    insta::assert_yaml_snapshot!(pod);
}

fn warm_pod(modules: &[&str]) -> Pod {
    use runner_k8s::pod::warm::{WarmPodInput, build_warm_pod};
    let resources = run_limits();
    let modules: Vec<String> = modules.iter().map(|m| (*m).to_owned()).collect();
    build_warm_pod(
        &settings(),
        &WarmPodInput {
            name: "telo-warm-abc234defghi",
            image: "telorun/node:0-slim",
            pull_policy: PullPolicy::Missing,
            workspace_image: "ghcr.io/telorun/telo-runner:0",
            token: "t",
            resources: &resources,
            modules: &modules,
        },
    )
}

#[test]
fn warm_pod_with_its_kernel_cache_warm_up() {
    insta::assert_yaml_snapshot!(warm_pod(&["http-server", "run", "console", "javascript"]));
}

#[test]
fn warm_pod_without_a_warm_up() {
    let pod = warm_pod(&[]);
    assert_eq!(spec(&pod).init_containers, None);
    insta::assert_yaml_snapshot!(pod);
}

/// The warm-up runs the kernel as the session will: the pod's kernel
/// image, the session container's environment (its `TELO_CACHE_DIR`),
/// volumes, limits and hardening.
#[test]
fn the_warm_up_runs_like_the_session_container_and_as_hardened() {
    let pod = warm_pod(&["http-server"]);
    let inits = spec(&pod).init_containers.as_ref().unwrap();
    assert_eq!(inits.len(), 1);
    let warm_up = &inits[0];
    let session = spec(&pod)
        .containers
        .iter()
        .find(|c| c.name == "session")
        .unwrap();
    assert_eq!(warm_up.name, "warm-up");
    assert_eq!(warm_up.image, session.image);
    assert_eq!(warm_up.env, session.env);
    assert_eq!(warm_up.volume_mounts, session.volume_mounts);
    assert_eq!(warm_up.working_dir, session.working_dir);
    assert_eq!(warm_up.resources, session.resources);
    assert_eq!(warm_up.security_context, session.security_context);
    let security = warm_up.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.run_as_non_root, Some(true));
    assert!(
        env_of(warm_up).contains(&("TELO_CACHE_DIR".to_owned(), "/telo-cache".to_owned())),
        "{:?}",
        env_of(warm_up)
    );
}
