//! A warm pod: a run pod made before its session exists. It is hardened
//! exactly like a run pod and has the same volumes; its `session` container
//! waits, on the kernel image, until the runner hands it a session, and a
//! `workspace` container (the runner's own image, `telo-runner workspace`)
//! is how the runner hands it over: the bundle into `/app`, then the launch
//! file the waiting shell runs.
//!
//! Before a claim the pod has no session id, no session record and no
//! deadline; a claim adds all three in one conditional write.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use runner_core::types::PullPolicy;
use sha2::Digest;

use crate::pod_spec::{
    APP_DIR, DEPS_DIR, HOME_DIR, INSPECT_PORT, PodSettings, Resources, SESSION_CONTAINER,
    SESSION_RUNNER_ENV, TMP_MOUNT, WORK_DIR, empty_dir, env_var, hardened_container_security,
    image_pull_secrets, mount, non_root_pod_security, pull_policy_to_k8s, resource_requirements,
};
use crate::session_record::MANAGED_BY_LABEL;
use crate::watch::pod::{WORKSPACE_CONTAINER, WORKSPACE_PORT};

/// The pool a warm pod belongs to (a digest of its kernel image: a label
/// value cannot hold an image reference).
pub const POOL_LABEL: &str = "telo.run/warm-pool";
/// `idle` while the pod waits for a session; removed by the claim.
pub const STATE_LABEL: &str = "telo.run/warm";
pub const IDLE: &str = "idle";
/// The kernel image a pool's pods run, as written (the label is a digest).
pub const IMAGE_ANNOTATION: &str = "telo.run/warm-image";
/// What the waiting container runs once it appears in `/app`.
pub const LAUNCH_FILE: &str = ".telo-launch";
/// `telo-warm-`: every warm pod's name starts so.
pub const NAME_PREFIX: &str = "telo-warm-";

/// A new warm pod's name: the prefix and a fresh id from the session-id
/// alphabet (never the id of the session it will serve).
pub fn warm_pod_name() -> String {
    format!("{NAME_PREFIX}{}", runner_core::ids::new_session_id())
}

/// Whether `pod` is a warm pod no session has claimed.
pub fn is_idle(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(STATE_LABEL))
        .is_some_and(|state| state == IDLE)
}

/// Whether `name` is a warm pod's.
pub fn is_warm_pod_name(name: &str) -> bool {
    name.strip_prefix(NAME_PREFIX)
        .is_some_and(runner_core::ids::is_session_id)
}

/// The pool label's value for `image`.
pub fn pool_key(image: &str) -> String {
    let digest = sha2::Sha256::digest(image.as_bytes());
    hex::encode(&digest[..6])
}

/// The named pipe a warm pod's workspace service holds open until it is
/// done (`RUNNER_WORKSPACE_WAKE_FIFO`), on the `tmp` volume both
/// containers mount.
pub const WAKE_PIPE: &str = "/tmp/.telo-warm-wake";

/// The shell the `session` container waits in: the kernel image's own
/// `sh`, waiting for the launch file the claim writes, then running it.
pub fn waiting_script() -> String {
    waiting_script_for(APP_DIR, WAKE_PIPE)
}

/// [`waiting_script`] for a bundle directory `app` and a wake pipe `wake`.
///
/// An idle pod costs nothing: the shell is blocked reading the workspace
/// service's wake pipe, which ends (end-of-file) when the service exits —
/// and it exits once it has written the launch file. Only while the pipe
/// is not there yet (the service still starting) does it look again every
/// 50 ms. A pipe that ends with no launch file means the service died
/// before any claim: the container fails and the pool replaces the pod.
/// Nothing of a request reaches this script.
pub fn waiting_script_for(app: &str, wake: &str) -> String {
    format!(
        "app={app}; launch=\"$app\"/{LAUNCH_FILE}; wake={wake}; \
         until [ -f \"$launch\" ]; do \
           if [ -p \"$wake\" ]; then \
             if {{ while read -r _; do :; done; }} <\"$wake\"; then \
               [ -f \"$launch\" ] || {{ echo 'the workspace service ended before a session claimed this pod' >&2; exit 1; }}; \
             fi; \
           else sleep 0.05; fi; \
         done; \
         . \"$launch\""
    )
}

/// The launch file of a claimed pod: the kernel started as a cold run
/// pod's `session` container starts it, with the session's environment
/// (quoted for `sh`, never interpreted by it; the runner's own variables
/// win, as on a cold pod).
pub fn launch_file(env: &[(String, String)], entry_relative_path: &str, inspect: bool) -> String {
    let mut line = String::from("exec env");
    for (name, value) in env {
        if SESSION_RUNNER_ENV.iter().any(|(ours, _)| ours == name) {
            continue;
        }
        line.push(' ');
        line.push_str(&shell_quote(&format!("{name}={value}")));
    }
    line.push_str(" telo run");
    if inspect {
        line.push_str(&format!(" --inspect 0.0.0.0:{INSPECT_PORT} --no-open"));
    }
    line.push_str(" \"$app\"/");
    line.push_str(&shell_quote(entry_relative_path));
    line.push('\n');
    line
}

/// `text` as one `sh` word: single quotes, each `'` as `'\''`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// What one warm pod is made of.
#[derive(Debug, Clone, Copy)]
pub struct WarmPodInput<'a> {
    pub name: &'a str,
    /// The kernel image (the pool's).
    pub image: &'a str,
    pub pull_policy: PullPolicy,
    /// `RUNNER_WORKSPACE_IMAGE`.
    pub workspace_image: &'a str,
    /// The bearer token its workspace service demands.
    pub token: &'a str,
    /// A run session's limits; the deadline is set by the claim.
    pub resources: &'a Resources,
}

pub fn build_warm_pod(settings: &PodSettings, input: &WarmPodInput<'_>) -> Pod {
    let session = Container {
        name: SESSION_CONTAINER.to_owned(),
        image: Some(input.image.to_owned()),
        image_pull_policy: Some(pull_policy_to_k8s(input.pull_policy).to_owned()),
        working_dir: Some(WORK_DIR.to_owned()),
        command: Some(vec!["sh".to_owned(), "-c".to_owned(), waiting_script()]),
        env: Some(
            SESSION_RUNNER_ENV
                .iter()
                .map(|(name, value)| env_var(name, (*value).to_owned()))
                .collect(),
        ),
        stdin: Some(true),
        stdin_once: Some(false),
        tty: Some(true),
        resources: Some(resource_requirements(input.resources)),
        volume_mounts: Some(vec![
            mount("app", APP_DIR),
            mount("telo-cache", DEPS_DIR),
            mount("work", WORK_DIR),
            mount("home", HOME_DIR),
            mount("tmp", TMP_MOUNT),
        ]),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    };
    let workspace = Container {
        name: WORKSPACE_CONTAINER.to_owned(),
        image: Some(input.workspace_image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        working_dir: Some(TMP_MOUNT.to_owned()),
        command: Some(vec!["telo-runner".to_owned(), "workspace".to_owned()]),
        env: Some(vec![
            crate::watch::pod::pod_ip_env(),
            env_var("RUNNER_WORKSPACE_DIR", APP_DIR.to_owned()),
            env_var(
                "RUNNER_WORKSPACE_LISTEN",
                format!("$(POD_IP):{WORKSPACE_PORT}"),
            ),
            env_var("RUNNER_WORKSPACE_TOKEN", input.token.to_owned()),
            // Done once the session is launched: the pod is then the
            // session's container alone, and ends when it does.
            env_var("RUNNER_WORKSPACE_EXIT_AFTER_WRITE", LAUNCH_FILE.to_owned()),
            // What the session container waits on (see `waiting_script`).
            env_var("RUNNER_WORKSPACE_WAKE_FIFO", WAKE_PIPE.to_owned()),
            env_var("HOME", TMP_MOUNT.to_owned()),
        ]),
        resources: Some(resource_requirements(input.resources)),
        volume_mounts: Some(vec![mount("app", APP_DIR), mount("tmp", TMP_MOUNT)]),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(input.name.to_owned()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(
                [
                    (MANAGED_BY_LABEL.to_owned(), settings.managed_by.clone()),
                    (POOL_LABEL.to_owned(), pool_key(input.image)),
                    (STATE_LABEL.to_owned(), IDLE.to_owned()),
                ]
                .into(),
            ),
            annotations: Some([(IMAGE_ANNOTATION.to_owned(), input.image.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            termination_grace_period_seconds: Some(settings.termination_grace_seconds),
            automount_service_account_token: Some(false),
            image_pull_secrets: image_pull_secrets(settings),
            runtime_class_name: settings.runtime_class.clone(),
            security_context: Some(non_root_pod_security()),
            containers: vec![session, workspace],
            volumes: Some(
                ["app", "telo-cache", "work", "home", "tmp"]
                    .into_iter()
                    .map(empty_dir)
                    .collect(),
            ),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The workspace token a warm pod's service demands, read back from its
/// spec (a runner that adopts the pool after a restart never minted it).
pub fn token_of(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == WORKSPACE_CONTAINER)?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == "RUNNER_WORKSPACE_TOKEN")?
        .value
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launch_file_quotes_every_word_and_keeps_the_runners_variables() {
        let env = vec![
            ("GREETING".to_owned(), "it's $HOME; `rm -rf /`".to_owned()),
            ("HOME".to_owned(), "/elsewhere".to_owned()),
            ("A.B-C".to_owned(), "x\ny".to_owned()),
        ];
        assert_eq!(
            launch_file(&env, "apps/my app.yaml", true),
            "exec env 'GREETING=it'\\''s $HOME; `rm -rf /`' 'A.B-C=x\ny' telo run --inspect \
             0.0.0.0:9230 --no-open \"$app\"/'apps/my app.yaml'\n"
        );
        assert_eq!(
            launch_file(&[], "telo.yaml", false),
            "exec env telo run \"$app\"/'telo.yaml'\n"
        );
    }

    #[test]
    fn the_launch_file_runs_in_sh_as_written() {
        use std::os::unix::fs::PermissionsExt;
        let bin = tempfile::tempdir().unwrap();
        let telo = bin.path().join("telo");
        std::fs::write(&telo, "#!/bin/sh\nprintf '%s|' \"$V\" \"$HOME\" \"$@\"\n").unwrap();
        std::fs::set_permissions(&telo, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = vec![
            ("V".to_owned(), "a'b \"c\" $(d) \\e".to_owned()),
            ("HOME".to_owned(), "/elsewhere".to_owned()),
        ];
        let script = format!("app=/app; {}", launch_file(&env, "x.yaml", false));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
            .env("HOME", "/home/telo")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "a'b \"c\" $(d) \\e|/home/telo|run|/app/x.yaml|"
        );
    }

    /// A pod's two halves, as processes: the waiting script under `sh`
    /// and the workspace service, over one bundle directory and pipe.
    struct Halves {
        dir: tempfile::TempDir,
        bin: tempfile::TempDir,
    }

    impl Halves {
        fn new() -> Halves {
            use std::os::unix::fs::PermissionsExt;
            let halves = Halves {
                dir: tempfile::tempdir().unwrap(),
                bin: tempfile::tempdir().unwrap(),
            };
            let telo = halves.bin.path().join("telo");
            std::fs::write(&telo, "#!/bin/sh\necho \"telo $*\"\n").unwrap();
            std::fs::set_permissions(&telo, std::fs::Permissions::from_mode(0o755)).unwrap();
            halves
        }

        fn app(&self) -> std::path::PathBuf {
            self.dir.path().join("app")
        }

        fn wake(&self) -> std::path::PathBuf {
            self.dir.path().join("wake")
        }

        fn session(&self) -> tokio::process::Child {
            let script = waiting_script_for(
                &self.app().display().to_string(),
                &self.wake().display().to_string(),
            );
            tokio::process::Command::new("sh")
                .args(["-c", &script])
                .env(
                    "PATH",
                    format!("{}:/usr/bin:/bin", self.bin.path().display()),
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        }

        async fn workspace(
            &self,
            shutdown: tokio_util::sync::CancellationToken,
        ) -> (
            runner_workspace_service::client::WorkspaceClient,
            tokio::task::JoinHandle<Result<(), runner_workspace_service::ServeError>>,
        ) {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let token = "t".repeat(48);
            let config = runner_workspace_service::Config {
                dir: self.app(),
                listen: addr,
                token: token.clone(),
                limits: runner_workspace::WorkspaceLimits::default(),
                exit_after_write: Some(LAUNCH_FILE.to_owned()),
                wake_fifo: Some(self.wake()),
            };
            let served = tokio::spawn(runner_workspace_service::serve_on(
                listener, config, shutdown,
            ));
            let client = runner_workspace_service::client::WorkspaceClient::new(
                runner_core::http_client::client(),
                addr,
                token,
            );
            (client, served)
        }
    }

    const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

    /// The session half waits (first for the pipe, then on it) until the
    /// claim's launch file is written, then runs it; the service is gone.
    #[tokio::test]
    async fn the_session_container_waits_for_its_launch_file_then_runs_it() {
        let halves = Halves::new();
        // Started before the service: no pipe yet, so it looks again.
        let session = halves.session();
        let (workspace, served) = halves.workspace(Default::default()).await;
        let write = |path: &str, content: String| runner_api::watch::WorkspaceChangeSet {
            write: vec![runner_api::watch::WorkspaceWrite {
                path: path.to_owned(),
                content,
                encoding: None,
            }],
            delete: Vec::new(),
        };
        workspace
            .apply(&write("telo.yaml", "kind: Telo.Application\n".to_owned()))
            .await
            .unwrap();
        workspace
            .apply(&write(LAUNCH_FILE, launch_file(&[], "telo.yaml", false)))
            .await
            .unwrap();
        tokio::time::timeout(WAIT, served)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let out = tokio::time::timeout(WAIT, session.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("telo run {}/telo.yaml\n", halves.app().display())
        );
        assert!(!halves.wake().exists());
    }

    /// A service that ends before any claim fails the session container
    /// (the pool then replaces the pod) instead of leaving it waiting.
    #[tokio::test]
    async fn the_session_container_fails_when_the_service_ends_unclaimed() {
        let halves = Halves::new();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let (workspace, served) = halves.workspace(shutdown.clone()).await;
        assert!(
            tokio::time::timeout(WAIT, workspace.health())
                .await
                .unwrap()
        );
        let session = halves.session();
        // Once the shell has the pipe open (its file table says so), the
        // service ends without a launch file.
        let fds = format!("/proc/{}/fd", session.id().unwrap());
        let holds_pipe = || {
            std::fs::read_dir(&fds).is_ok_and(|entries| {
                entries.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|target| target == halves.wake())
                })
            })
        };
        let deadline = tokio::time::Instant::now() + WAIT;
        while !holds_pipe() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the shell never opened the pipe"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        tokio::time::timeout(WAIT, served)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let out = tokio::time::timeout(WAIT, session.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "the workspace service ended before a session claimed this pod\n"
        );
    }

    #[test]
    fn warm_pod_names_are_told_apart_from_session_pod_names() {
        let name = warm_pod_name();
        assert!(is_warm_pod_name(&name), "{name}");
        assert!(!is_warm_pod_name("telo-run-abc234defghi"));
        assert!(!is_warm_pod_name("telo-warm-Nope"));
        assert_eq!(pool_key("telorun/node:latest-slim").len(), 12);
    }
}
