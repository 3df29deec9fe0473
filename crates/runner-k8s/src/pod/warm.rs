//! A warm pod: a run pod made before its session exists. It is hardened
//! exactly like a run pod and has the same volumes; its `session` container
//! waits, on the kernel image, until the runner hands it a session, and a
//! `workspace` container (the runner's own image, `telo-runner workspace`)
//! is how the runner hands it over: the bundle into `/app`, then the launch
//! file the waiting shell runs.
//!
//! Before either runs, its `warm-up` init container fills the pod's kernel
//! cache (see [`super::warm_up`]).
//!
//! Before a claim the pod has no session id, no session record and no
//! deadline; a claim adds all three in one conditional write.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use runner_core::types::PullPolicy;
use sha2::Digest;

use crate::pod::labels::{IDLE, IMAGE_ANNOTATION, MANAGED_BY_LABEL, POOL_LABEL, STATE_LABEL};
use crate::pod::spec::{
    APP_DIR, INSPECT_PORT, PodSettings, Resources, SESSION_CONTAINER, SESSION_RUNNER_ENV,
    TMP_MOUNT, WORK_DIR, env_var, hardened_container_security, image_pull_secrets, mount,
    non_root_pod_security, pull_policy_to_k8s, resource_requirements, run_session_mounts,
    run_session_volumes,
};
use crate::pod::watch::{WORKSPACE_CONTAINER, WORKSPACE_PORT};

/// What the waiting container runs once it appears in `/app`.
pub const LAUNCH_FILE: &str = ".telo-launch";

/// The pool label's value for `image`.
pub fn pool_key(image: &str) -> String {
    let digest = sha2::Sha256::digest(image.as_bytes());
    hex::encode(&digest[..6])
}

/// What the runner types into a claimed pod's terminal once the launch
/// file is written: the waiting shell's go-ahead.
pub const GO_AHEAD: &[u8] = b"\n";

/// The shell the `session` container waits in: the kernel image's own
/// `sh`, waiting for the launch file the claim writes, then running it.
pub fn waiting_script() -> String {
    waiting_script_for(APP_DIR)
}

/// [`waiting_script`] for a bundle directory `app`.
///
/// The shell waits on its terminal, blocked in a read (an idle pod costs
/// no CPU), with echo off so nothing it is sent shows. A claim writes the
/// launch file and then sends [`GO_AHEAD`] over the attach it just opened:
/// the line can only arrive once the container runtime has connected that
/// attach, so not a byte the kernel writes is missed by the live stream
/// (had the kernel started on the file alone, its first output could land
/// in the log only, and the runner would wait to be sure it was not also
/// coming live). The terminal's settings are restored before the kernel
/// runs. A terminal that closes first ends the container, and the pool
/// replaces the pod. Nothing of a request reaches this script.
pub fn waiting_script_for(app: &str) -> String {
    launch_waiting_script("app", app, LAUNCH_FILE)
}

/// The script a pooled container waits in (see [`waiting_script_for`]):
/// shell variable `var` holds `dir`, and the launch file is `launch` below
/// it.
pub(crate) fn launch_waiting_script(var: &str, dir: &str, launch: &str) -> String {
    format!(
        "{var}={dir}; launch=\"${var}\"/{launch}; \
         tty=$(stty -g 2>/dev/null) && stty -echo; \
         until [ -f \"$launch\" ]; do \
           read -r _ || {{ echo 'the terminal closed before a session claimed this pod' >&2; exit 1; }}; \
         done; \
         [ -z \"$tty\" ] || stty \"$tty\"; \
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
pub(crate) fn shell_quote(text: &str) -> String {
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
    /// The modules its kernel cache is warmed with before it runs
    /// (`RUNNER_WARM_POOL_MODULES`); empty: no warm-up.
    pub modules: &'a [String],
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
        volume_mounts: Some(run_session_mounts()),
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
            crate::pod::watch::pod_ip_env(),
            env_var("RUNNER_WORKSPACE_DIR", APP_DIR.to_owned()),
            env_var(
                "RUNNER_WORKSPACE_LISTEN",
                format!("$(POD_IP):{WORKSPACE_PORT}"),
            ),
            env_var("RUNNER_WORKSPACE_TOKEN", input.token.to_owned()),
            // Done once the session is launched: the pod is then the
            // session's container alone, and ends when it does.
            env_var("RUNNER_WORKSPACE_EXIT_AFTER_WRITE", LAUNCH_FILE.to_owned()),
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
            init_containers: (!input.modules.is_empty()).then(|| {
                vec![super::warm_up::container(
                    input.image,
                    input.pull_policy,
                    input.resources,
                    input.modules,
                )]
            }),
            containers: vec![session, workspace],
            volumes: Some(run_session_volumes()),
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

    /// The waiting script under `sh`, its terminal a pipe, over a bundle
    /// directory whose `telo` says how it was run.
    struct Waiting {
        dir: tempfile::TempDir,
        bin: tempfile::TempDir,
    }

    impl Waiting {
        fn new() -> Waiting {
            use std::os::unix::fs::PermissionsExt;
            let waiting = Waiting {
                dir: tempfile::tempdir().unwrap(),
                bin: tempfile::tempdir().unwrap(),
            };
            let telo = waiting.bin.path().join("telo");
            std::fs::write(&telo, "#!/bin/sh\necho \"telo $*\"\n").unwrap();
            std::fs::set_permissions(&telo, std::fs::Permissions::from_mode(0o755)).unwrap();
            waiting
        }

        fn app(&self) -> std::path::PathBuf {
            self.dir.path().to_owned()
        }

        fn spawn(&self, stdin: std::process::Stdio) -> tokio::process::Child {
            tokio::process::Command::new("sh")
                .args(["-c", &waiting_script_for(&self.app().display().to_string())])
                .env(
                    "PATH",
                    format!("{}:/usr/bin:/bin", self.bin.path().display()),
                )
                .stdin(stdin)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        }
    }

    const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

    /// A go-ahead with no launch file yet is not one: the shell waits on;
    /// with the file written, the next one runs it.
    #[tokio::test]
    async fn the_session_container_runs_its_launch_file_on_the_go_ahead() {
        use tokio::io::AsyncWriteExt;
        let waiting = Waiting::new();
        let mut shell = waiting.spawn(std::process::Stdio::piped());
        let mut terminal = shell.stdin.take().unwrap();
        terminal.write_all(GO_AHEAD).await.unwrap();
        std::fs::write(waiting.app().join("telo.yaml"), "kind: Telo.Application\n").unwrap();
        std::fs::write(
            waiting.app().join(LAUNCH_FILE),
            launch_file(&[], "telo.yaml", false),
        )
        .unwrap();
        terminal.write_all(GO_AHEAD).await.unwrap();
        let out = tokio::time::timeout(WAIT, shell.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("telo run {}/telo.yaml\n", waiting.app().display())
        );
    }

    /// A terminal that closes before any claim ends the container (the
    /// pool then replaces the pod) instead of leaving it spinning.
    #[tokio::test]
    async fn the_session_container_fails_when_its_terminal_closes_unclaimed() {
        let waiting = Waiting::new();
        let shell = waiting.spawn(std::process::Stdio::null());
        let out = tokio::time::timeout(WAIT, shell.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "the terminal closed before a session claimed this pod\n"
        );
    }

    #[test]
    fn warm_pod_names_are_told_apart_from_session_pod_names() {
        use crate::pod::session_record::{is_warm_pod_name, warm_pod_name};
        let name = warm_pod_name();
        assert!(is_warm_pod_name(&name), "{name}");
        assert!(!is_warm_pod_name("telo-run-abc234defghi"));
        assert!(!is_warm_pod_name("telo-warm-Nope"));
        assert_eq!(pool_key("telorun/node:latest-slim").len(), 12);
    }
}
