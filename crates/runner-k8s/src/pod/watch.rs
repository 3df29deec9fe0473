//! The watch pod (docs/contract.md §9.4): a `workspace` container serving
//! the session's files to the runner, and one `app-<name>` container per app
//! running `telo run --watch` over the same `workspace` volume.
//!
//! Departures from the reference, each on purpose:
//! - the workspace service is the runner's own binary (`telo-runner
//!   workspace`, [`WatchPodInput::workspace_image`]) instead of a Telo
//!   manifest in a ConfigMap, and it answers only requests carrying the
//!   session's token; no ConfigMap, no Telo kernel in the workspace
//!   container, no port declared for it;
//! - every listener binds the pod IP (`$(POD_IP)`), not `0.0.0.0`: the
//!   runner dials the pod IP anyway, and nothing listens where a sidecar or
//!   a port-forward would find it by accident;
//! - the pod is named `telo-watch-<id>`: a new pod for the same session is
//!   created only once the previous one is gone, so the name never clashes;
//! - the agent's env (the operator's values and its token) is read from the
//!   pod's env Secret ([`crate::pod::env_secret`]), never written into the spec.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use runner_core::AgentLaunch;
use runner_core::types::{PortMapping, PortProtocol, PullPolicy};
use runner_core::watch_types::{AppSpec, IoMode};

use crate::images::telo::TeloPins;
use crate::pod::env_secret::PodEnvSecret;
use crate::pod::labels::{MANAGED_BY_LABEL, MODE_LABEL, SESSION_ID_LABEL, WATCH_MODE};
use crate::pod::spec::{
    HOME_DIR, INSPECT_PORT, PodSettings, Resources, TMP_MOUNT, WORK_DIR, container_env,
    container_ports, empty_dir, env_var, hardened_container_security, image_or_default,
    image_pull_secrets, mount, non_root_pod_security, pull_policy_to_k8s, resource_requirements,
    secret_container_env,
};

/// The container serving the workspace to the runner.
pub const WORKSPACE_CONTAINER: &str = "workspace";
/// Where the workspace service listens, on the pod IP.
pub const WORKSPACE_PORT: u16 = 8099;
/// The shared volume every container of the pod mounts.
pub const WORKSPACE_DIR: &str = "/workspace";

/// `telo-watch-<sessionId>`.
pub fn watch_pod_name(session_id: &str) -> String {
    format!("telo-watch-{session_id}")
}

/// `app-<name>`: the container of one app.
pub fn app_container(app: &str) -> String {
    format!("app-{app}")
}

/// The inspect port of the app at `index`: `9230 + index`.
pub fn inspect_port_for(index: usize) -> u16 {
    INSPECT_PORT.saturating_add(u16::try_from(index).unwrap_or(u16::MAX))
}

/// What one watch pod is made of.
#[derive(Debug, Clone, Copy)]
pub struct WatchPodInput<'a> {
    pub session_id: &'a str,
    pub apps: &'a [AppSpec],
    /// The session environment (apps only, never the workspace container).
    pub env: &'a [(String, String)],
    /// The apps' kernel image; empty means [`PodSettings::default_image`].
    pub image: &'a str,
    pub pull_policy: PullPolicy,
    /// App containers that run a named telo release, on its image instead.
    pub telo_pins: &'a TeloPins,
    /// `RUNNER_WORKSPACE_IMAGE`.
    pub workspace_image: &'a str,
    /// The bearer token the workspace service demands.
    pub token: &'a str,
    /// The workspace limits the service enforces, as `RUNNER_WORKSPACE_*`
    /// variables.
    pub workspace_limits: &'a [(String, String)],
    /// Per container; `ttl_seconds` is `RUNNER_WATCH_MAX_TTL_SECONDS`.
    pub resources: &'a Resources,
    /// The co-resident agent, when the session runs one.
    pub agent: Option<&'a AgentLaunch>,
}

/// The agent's container: a name no app container can have (`app-…`).
pub const AGENT_CONTAINER: &str = "agent";

/// The script of an app container: wait until the entry exists (the
/// workspace is seeded once the pod runs), then become the kernel. Paths
/// come through the environment, so nothing of the request reaches the
/// shell line.
pub(crate) const APP_SCRIPT: &str = r#"while [ ! -f "$TELO_ENTRY" ]; do sleep 0.2; done; exec telo run --watch --inspect "$TELO_INSPECT_ADDR" --no-open "$TELO_ENTRY""#;

/// The watch pod of `input`; the agent's env values go into `env_secret`.
pub fn build_watch_pod(
    settings: &PodSettings,
    input: &WatchPodInput<'_>,
    env_secret: &mut PodEnvSecret,
) -> Pod {
    let mut containers = vec![workspace_container(settings, input)];
    containers.extend(
        input
            .apps
            .iter()
            .enumerate()
            .map(|(index, app)| app_container_spec(settings, input, index, app)),
    );
    containers.extend(
        input
            .agent
            .map(|agent| agent_container(input, agent, env_secret)),
    );
    Pod {
        metadata: ObjectMeta {
            name: Some(watch_pod_name(input.session_id)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(
                [
                    (MANAGED_BY_LABEL.to_owned(), settings.managed_by.clone()),
                    (SESSION_ID_LABEL.to_owned(), input.session_id.to_owned()),
                    (MODE_LABEL.to_owned(), WATCH_MODE.to_owned()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            active_deadline_seconds: Some(i64::from(input.resources.ttl_seconds)),
            termination_grace_period_seconds: Some(settings.termination_grace_seconds),
            automount_service_account_token: Some(false),
            image_pull_secrets: image_pull_secrets(settings),
            runtime_class_name: settings.runtime_class.clone(),
            security_context: Some(non_root_pod_security()),
            containers,
            volumes: Some(
                ["workspace", "work", "home", "tmp"]
                    .into_iter()
                    .map(empty_dir)
                    .collect(),
            ),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// `POD_IP` from the downward API; later entries say `$(POD_IP)`.
pub(crate) fn pod_ip_env() -> EnvVar {
    EnvVar {
        name: "POD_IP".to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: "status.podIP".to_owned(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// `/work`, `/home/telo` and `/tmp` of one container: its own directory of
/// the shared scratch volumes.
fn scratch_mounts(owner: &str) -> Vec<VolumeMount> {
    [("work", WORK_DIR), ("home", HOME_DIR), ("tmp", TMP_MOUNT)]
        .into_iter()
        .map(|(volume, path)| VolumeMount {
            sub_path: Some(owner.to_owned()),
            ..mount(volume, path)
        })
        .collect()
}

fn workspace_container(settings: &PodSettings, input: &WatchPodInput<'_>) -> Container {
    let mut env = vec![
        pod_ip_env(),
        env_var("RUNNER_WORKSPACE_DIR", WORKSPACE_DIR.to_owned()),
        env_var(
            "RUNNER_WORKSPACE_LISTEN",
            format!("$(POD_IP):{WORKSPACE_PORT}"),
        ),
        env_var("RUNNER_WORKSPACE_TOKEN", input.token.to_owned()),
        env_var("HOME", HOME_DIR.to_owned()),
    ];
    env.extend(
        input
            .workspace_limits
            .iter()
            .map(|(name, value)| env_var(name, value.clone())),
    );
    let mut mounts = vec![mount("workspace", WORKSPACE_DIR)];
    mounts.extend(scratch_mounts(WORKSPACE_CONTAINER));
    Container {
        name: WORKSPACE_CONTAINER.to_owned(),
        image: Some(image_or_default(input.workspace_image, settings)),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        working_dir: Some(WORK_DIR.to_owned()),
        command: Some(vec!["telo-runner".to_owned(), "workspace".to_owned()]),
        env: Some(env),
        resources: Some(resource_requirements(input.resources)),
        volume_mounts: Some(mounts),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    }
}

fn app_container_spec(
    settings: &PodSettings,
    input: &WatchPodInput<'_>,
    index: usize,
    app: &AppSpec,
) -> Container {
    let tty = app.io == IoMode::Tty;
    let mut runner_env = vec![
        ("HOME", HOME_DIR.to_owned()),
        ("npm_config_cache", format!("{HOME_DIR}/.npm")),
        (
            "TELO_ENTRY",
            format!("{WORKSPACE_DIR}/{}", app.entry_relative_path),
        ),
        (
            "TELO_INSPECT_ADDR",
            format!("$(POD_IP):{}", inspect_port_for(index)),
        ),
    ];
    if tty {
        runner_env.push(("CLICOLOR_FORCE", "1".to_owned()));
    }
    // POD_IP first, so `$(POD_IP)` expands; a session entry of that name
    // cannot replace it.
    let mut env = vec![pod_ip_env()];
    env.extend(
        container_env(input.env, &runner_env)
            .into_iter()
            .filter(|e| e.name != "POD_IP"),
    );
    let name = app_container(&app.name);
    let mut mounts = vec![mount("workspace", WORKSPACE_DIR)];
    mounts.extend(scratch_mounts(&name));
    let (image, pull_policy) = match input.telo_pins.of_container(&name) {
        Some(pin) => (pin.image.clone(), pin.pull_policy),
        None => (image_or_default(input.image, settings), input.pull_policy),
    };
    Container {
        name,
        image: Some(image),
        image_pull_policy: Some(pull_policy_to_k8s(pull_policy).to_owned()),
        working_dir: Some(WORK_DIR.to_owned()),
        command: Some(vec![
            "sh".to_owned(),
            "-c".to_owned(),
            APP_SCRIPT.to_owned(),
        ]),
        env: Some(env),
        stdin: Some(true),
        stdin_once: Some(false),
        tty: Some(tty),
        ports: container_ports(&app.ports),
        resources: Some(resource_requirements(input.resources)),
        volume_mounts: Some(mounts),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    }
}

/// The co-resident agent: the operator's image (its `command`, when the
/// entry has one, replaces the image's entrypoint) over the shared
/// workspace, with the operator's env and its token (both read from the
/// pod's env Secret), and `WORKSPACE_DIR`; never the session's env. Not
/// attached: it has no terminal.
fn agent_container(
    input: &WatchPodInput<'_>,
    agent: &AgentLaunch,
    env_secret: &mut PodEnvSecret,
) -> Container {
    let runner_env = [
        ("WORKSPACE_DIR", WORKSPACE_DIR.to_owned()),
        ("HOME", HOME_DIR.to_owned()),
        ("CLICOLOR_FORCE", "1".to_owned()),
    ];
    let mut mounts = vec![mount("workspace", WORKSPACE_DIR)];
    mounts.extend(scratch_mounts(AGENT_CONTAINER));
    Container {
        name: AGENT_CONTAINER.to_owned(),
        image: Some(agent.image.clone()),
        image_pull_policy: Some(pull_policy_to_k8s(agent.pull_policy).to_owned()),
        working_dir: Some(WORKSPACE_DIR.to_owned()),
        command: agent.command.clone(),
        env: Some(secret_container_env(
            env_secret,
            AGENT_CONTAINER,
            &agent.env,
            &runner_env,
        )),
        ports: container_ports(&[PortMapping {
            port: agent.port,
            protocol: PortProtocol::Tcp,
        }]),
        resources: Some(resource_requirements(input.resources)),
        volume_mounts: Some(mounts),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PodSettings {
        PodSettings::for_tests()
    }

    fn pod_spec_json(spec: &PodSpec) -> serde_json::Value {
        serde_json::to_value(spec).expect("a pod spec serializes")
    }

    fn app(name: &str, entry: &str, ports: Vec<PortMapping>) -> AppSpec {
        AppSpec {
            name: name.into(),
            entry_relative_path: entry.into(),
            ports,
            io: IoMode::Tty,
            telo: None,
        }
    }

    fn env_of(c: &Container) -> Vec<(String, Option<String>)> {
        c.env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect()
    }

    #[test]
    fn session_env_reaches_the_apps_only_and_the_token_the_workspace_only() {
        let apps = [
            app(
                "web",
                "telo.yaml",
                vec![PortMapping {
                    port: 8080,
                    protocol: PortProtocol::Tcp,
                }],
            ),
            app("api", "api/telo.yaml", vec![]),
        ];
        let resources = Resources {
            cpu: "500m".into(),
            memory: "512Mi".into(),
            ephemeral_storage: "1Gi".into(),
            ttl_seconds: 21600,
        };
        let env = [("GREETING".to_owned(), "pa$$".to_owned())];
        let pod = build_watch_pod(
            &settings(),
            &WatchPodInput {
                session_id: "abc234defghi",
                apps: &apps,
                env: &env,
                image: "",
                pull_policy: PullPolicy::Missing,
                telo_pins: &TeloPins::default(),
                workspace_image: "telo-runner:test",
                token: "t0ken",
                workspace_limits: &[("RUNNER_WORKSPACE_MAX_FILES".into(), "10".into())],
                resources: &resources,
                agent: None,
            },
            &mut PodEnvSecret::named("telo-watch-abc234defghi-env-00000000"),
        );
        let spec = pod.spec.expect("spec");
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("telo-watch-abc234defghi")
        );
        assert_eq!(spec.active_deadline_seconds, Some(21600));
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["workspace", "app-web", "app-api"]);
        let workspace = env_of(&spec.containers[0]);
        assert!(workspace.contains(&("RUNNER_WORKSPACE_TOKEN".into(), Some("t0ken".into()))));
        assert!(workspace.contains(&("RUNNER_WORKSPACE_MAX_FILES".into(), Some("10".into()))));
        assert!(!workspace.iter().any(|(n, _)| n == "GREETING"));
        assert_eq!(spec.containers[0].ports, None);
        for (index, c) in spec.containers[1..].iter().enumerate() {
            let env = env_of(c);
            assert_eq!(env[0].0, "POD_IP");
            assert!(env.contains(&("GREETING".into(), Some("pa$$$$".into()))));
            assert!(!env.iter().any(|(n, _)| n == "RUNNER_WORKSPACE_TOKEN"));
            assert!(env.contains(&(
                "TELO_INSPECT_ADDR".into(),
                Some(format!("$(POD_IP):{}", 9230 + index))
            )));
            assert_eq!(c.image.as_deref(), Some("telorun/node:24-slim"));
            assert_eq!(c.tty, Some(true));
            let security = c.security_context.as_ref().expect("hardened");
            assert_eq!(security.read_only_root_filesystem, Some(true));
            let mounts = c.volume_mounts.as_ref().expect("mounts");
            assert!(
                mounts
                    .iter()
                    .any(|m| m.mount_path == "/workspace" && m.read_only.is_none())
            );
        }
        assert_eq!(
            env_of(&spec.containers[2])
                .iter()
                .find(|(n, _)| n == "TELO_ENTRY")
                .and_then(|(_, v)| v.clone())
                .as_deref(),
            Some("/workspace/api/telo.yaml")
        );
        assert!(spec.containers[1].ports.is_some());
    }

    #[test]
    fn a_streams_app_has_no_tty_but_its_stdin_and_no_forced_colour() {
        let mut worker = app("worker", "worker.yaml", vec![]);
        worker.io = IoMode::Streams;
        let apps = [app("web", "telo.yaml", vec![]), worker];
        let resources = Resources {
            cpu: "500m".into(),
            memory: "512Mi".into(),
            ephemeral_storage: "1Gi".into(),
            ttl_seconds: 21600,
        };
        let pod = build_watch_pod(
            &settings(),
            &WatchPodInput {
                session_id: "abc234defghi",
                apps: &apps,
                env: &[],
                image: "",
                pull_policy: PullPolicy::Missing,
                telo_pins: &TeloPins::default(),
                workspace_image: "telo-runner:test",
                token: "t0ken",
                workspace_limits: &[],
                resources: &resources,
                agent: None,
            },
            &mut PodEnvSecret::named("telo-watch-abc234defghi-env-00000000"),
        );
        let spec = pod.spec.expect("spec");
        let (web, worker) = (&spec.containers[1], &spec.containers[2]);
        assert_eq!(
            (web.tty, web.stdin, web.stdin_once),
            (Some(true), Some(true), Some(false))
        );
        assert_eq!(
            (worker.tty, worker.stdin, worker.stdin_once),
            (Some(false), Some(true), Some(false))
        );
        let forced = |c: &Container| env_of(c).iter().any(|(n, _)| n == "CLICOLOR_FORCE");
        assert!(forced(web));
        assert!(!forced(worker));
        assert!(!env_of(worker).iter().any(|(n, _)| n == "FORCE_COLOR"));
    }

    #[test]
    fn the_agent_gets_the_operators_env_and_the_workspace_never_the_sessions() {
        let apps = [app("web", "telo.yaml", vec![])];
        let resources = Resources {
            cpu: "500m".into(),
            memory: "512Mi".into(),
            ephemeral_storage: "1Gi".into(),
            ttl_seconds: 21600,
        };
        let agent = AgentLaunch {
            name: "helper".into(),
            image: "acme/agent:1".into(),
            pull_policy: PullPolicy::Always,
            command: None,
            port: 7000,
            env: vec![
                ("API_KEY".into(), "operator".into()),
                ("AGENT_TOKEN".into(), "t".repeat(32)),
            ],
        };
        let mut env_secret = PodEnvSecret::named("telo-watch-abc234defghi-env-00000000");
        let pod = build_watch_pod(
            &settings(),
            &WatchPodInput {
                session_id: "abc234defghi",
                apps: &apps,
                env: &[("SESSION_ONLY".into(), "x".into())],
                image: "",
                pull_policy: PullPolicy::Missing,
                telo_pins: &TeloPins::default(),
                workspace_image: "telo-runner:test",
                token: "t0ken",
                workspace_limits: &[],
                resources: &resources,
                agent: Some(&agent),
            },
            &mut env_secret,
        );
        let spec = pod.spec.expect("spec");
        let agent_container = spec.containers.last().expect("containers");
        assert_eq!(agent_container.name, AGENT_CONTAINER);
        assert_eq!(agent_container.image.as_deref(), Some("acme/agent:1"));
        assert_eq!(agent_container.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(agent_container.command, None, "the image's own entrypoint");
        let env = env_of(agent_container);
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert!(names.contains(&"API_KEY") && names.contains(&"AGENT_TOKEN"));
        assert!(names.contains(&"WORKSPACE_DIR"));
        assert!(!names.contains(&"SESSION_ONLY"), "{names:?}");
        // The operator's values are in the pod's Secret, not in its spec.
        let stored = serde_json::to_string(&pod_spec_json(&spec)).expect("json");
        assert!(!stored.contains("operator"), "{stored}");
        assert!(!stored.contains(&"t".repeat(32)), "{stored}");
        let data = env_secret
            .manifest("telo-runner", "abc234defghi", "telo-watch-abc234defghi")
            .data
            .expect("data");
        let values: Vec<&[u8]> = data.values().map(|v| v.0.as_slice()).collect();
        assert_eq!(values, [b"operator".as_slice(), "t".repeat(32).as_bytes()]);
        let api_key = agent_container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "API_KEY")
            .expect("API_KEY");
        let reference = api_key
            .value_from
            .as_ref()
            .and_then(|from| from.secret_key_ref.as_ref())
            .expect("a Secret reference");
        assert_eq!(reference.name, env_secret.name());
        for other in &spec.containers[..spec.containers.len() - 1] {
            let names: Vec<String> = env_of(other).into_iter().map(|(name, _)| name).collect();
            assert!(
                !names.iter().any(|n| n == "API_KEY" || n == "AGENT_TOKEN"),
                "{names:?}"
            );
        }
        let mounts = agent_container.volume_mounts.as_ref().expect("mounts");
        assert!(
            mounts
                .iter()
                .any(|m| m.name == "workspace" && m.mount_path == "/workspace")
        );
        assert_eq!(
            agent_container.ports.as_ref().expect("ports")[0].container_port,
            7000
        );
        assert!(agent_container.tty.is_none() && agent_container.stdin.is_none());
    }
}
