//! Watch pools (`RUNNER_WARM_POOL_WATCH`): watch pods of the editor's
//! everyday shape — one app, no agent — kept up and ready per kernel image,
//! on the same machinery as run pools (claim, refill pacing, quota, restart
//! takeover).
//!
//! A pooled watch pod is a cold watch pod of one app built before its
//! session exists, with three differences:
//! - its app container is named [`POOLED_APP_CONTAINER`] (a container's
//!   name cannot change after creation, and `app-<name>` needs the app's
//!   name): the session record maps the app to it;
//! - that container waits, on its terminal, for the launch file the runner
//!   writes into the workspace's `.telo` directory (left out of the tree
//!   and of every checkpoint), and then runs exactly what a cold app
//!   container runs: the same script, environment, working directory and
//!   inspect port, the session's environment and entry coming from the
//!   launch file;
//! - it has no session id, no `watch` mode label and no deadline until a
//!   claim adds all three in one conditional write (an idle pod is nobody's
//!   session, so no sweep of watch pods touches it).
//!
//! Its workspace service's token is minted with the pod and becomes the
//! session's token at the claim; the pool forgets it then.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use runner_core::types::PullPolicy;
use runner_core::watch_types::{AppSpec, IoMode};
use serde_json::json;

use super::{Claimed, PoolKind, WarmPools};
use crate::cluster::api_error::is_quota_refusal;
use crate::images::telo::TeloPins;
use crate::pod::env_secret::PodEnvSecret;
use crate::pod::labels::POOLED_APP_ANNOTATION;
use crate::pod::labels::{IDLE, IMAGE_ANNOTATION, POOL_LABEL, STATE_LABEL};
use crate::pod::labels::{MANAGED_BY_LABEL, SESSION_ID_LABEL};
use crate::pod::labels::{MODE_LABEL, WATCH_MODE};
use crate::pod::spec::{PodSettings, Resources};
use crate::pod::warm::{pool_key, shell_quote};
use crate::pod::watch::{APP_SCRIPT, WORKSPACE_DIR, WatchPodInput, build_watch_pod};

/// The app container of a pooled watch pod (no `app-<name>` container can
/// be named this).
pub const POOLED_APP_CONTAINER: &str = "app";
/// Where the launch file goes, relative to the workspace: inside the
/// kernel's `.telo` directory, which the tree, the snapshots and the
/// checkpoints leave out.
pub const LAUNCH_PATH: &str = ".telo/runner-launch";
/// The variables an app container's runner sets; a session's entry of the
/// same name is dropped, as on a cold pod.
const RUNNER_NAMES: [&str; 6] = [
    "POD_IP",
    "HOME",
    "npm_config_cache",
    "TELO_ENTRY",
    "TELO_INSPECT_ADDR",
    "CLICOLOR_FORCE",
];

/// What a watch pool's pods are made with: a watch session's.
#[derive(Debug, Clone)]
pub struct WatchPoolShared {
    /// Per container; `ttl_seconds` is the watch pod's lifetime (set by the
    /// claim).
    pub resources: Resources,
    /// The workspace limits, as the `RUNNER_WORKSPACE_*` variables.
    pub workspace_limits: Vec<(String, String)>,
}

/// The pool label's value of the watch pool of `image` (never a run
/// pool's).
pub fn watch_pool_key(image: &str) -> String {
    pool_key(&format!("watch\n{image}"))
}

/// The `pool` label of a watch pool's metrics.
pub fn watch_pool_label(image: &str) -> String {
    format!("watch:{image}")
}

/// The shell a pooled app container waits in: blocked on its terminal
/// (echo off) until the launch file exists and the runner's go-ahead
/// arrives over the attach, then the launch file, which removes itself and
/// becomes the cold app container's script.
pub fn pooled_waiting_script() -> String {
    format!(
        "ws={WORKSPACE_DIR}; launch=\"$ws\"/{LAUNCH_PATH}; \
         tty=$(stty -g 2>/dev/null) && stty -echo; \
         until [ -f \"$launch\" ]; do \
           read -r _ || {{ echo 'the terminal closed before a session claimed this pod' >&2; exit 1; }}; \
         done; \
         [ -z \"$tty\" ] || stty \"$tty\"; \
         . \"$launch\""
    )
}

/// The launch file of a claimed pooled pod: the session's environment
/// (quoted for `sh`, never interpreted by it; the runner's own variables
/// win, as on a cold pod) and its entry, then the cold app container's
/// script.
pub fn watch_launch_file(env: &[(String, String)], entry_relative_path: &str) -> String {
    let mut line = String::from("rm -f \"$launch\"\nexec env");
    for (name, value) in env {
        if RUNNER_NAMES.contains(&name.as_str()) {
            continue;
        }
        line.push(' ');
        line.push_str(&shell_quote(&format!("{name}={value}")));
    }
    line.push_str(" TELO_ENTRY=\"$ws\"/");
    line.push_str(&shell_quote(entry_relative_path));
    line.push_str(" sh -c ");
    line.push_str(&shell_quote(APP_SCRIPT));
    line.push('\n');
    line
}

/// A pooled watch pod of `image`: a cold watch pod of one app, made the
/// same way, with the differences of the module's description.
pub fn build_pooled_watch_pod(
    settings: &PodSettings,
    shared: &WatchPoolShared,
    name: &str,
    image: &str,
    workspace_image: &str,
    token: &str,
) -> Pod {
    let apps = [AppSpec {
        name: String::new(),
        entry_relative_path: String::new(),
        ports: Vec::new(),
        io: IoMode::Tty,
        telo: None,
    }];
    let mut pod = build_watch_pod(
        settings,
        &WatchPodInput {
            session_id: "",
            apps: &apps,
            env: &[],
            image,
            pull_policy: PullPolicy::Missing,
            telo_pins: &TeloPins::default(),
            workspace_image,
            token,
            workspace_limits: &shared.workspace_limits,
            resources: &shared.resources,
            agent: None,
        },
        &mut PodEnvSecret::named(String::new()),
    );
    pod.metadata.name = Some(name.to_owned());
    pod.metadata.labels = Some(
        [
            (MANAGED_BY_LABEL.to_owned(), settings.managed_by.clone()),
            (POOL_LABEL.to_owned(), watch_pool_key(image)),
            (STATE_LABEL.to_owned(), IDLE.to_owned()),
        ]
        .into(),
    );
    pod.metadata.annotations = Some([(IMAGE_ANNOTATION.to_owned(), image.to_owned())].into());
    if let Some(spec) = pod.spec.as_mut() {
        spec.active_deadline_seconds = None;
        if let Some(app) = spec.containers.get_mut(1) {
            let cold_name = std::mem::replace(&mut app.name, POOLED_APP_CONTAINER.to_owned());
            app.command = Some(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                pooled_waiting_script(),
            ]);
            if let Some(env) = app.env.as_mut() {
                env.retain(|var| var.name != "TELO_ENTRY");
            }
            for mount in app.volume_mounts.iter_mut().flatten() {
                if mount.sub_path.as_deref() == Some(cold_name.as_str()) {
                    mount.sub_path = Some(POOLED_APP_CONTAINER.to_owned());
                }
            }
        }
    }
    pod
}

/// Why a watch session of this shape cannot start on a pooled pod (the
/// words in "No warm pod for this session's shape (…)"), if it cannot.
/// `image` and `pull_policy` are its one app's.
pub fn shape_misfit(
    apps: &[AppSpec],
    agent: bool,
    image: &str,
    pull_policy: PullPolicy,
    pooled: bool,
) -> Option<String> {
    if apps.len() != 1 {
        return Some(format!("{} apps", apps.len()));
    }
    if agent {
        return Some("an agent".to_owned());
    }
    if apps[0].io != IoMode::Tty {
        return Some("an app on streams".to_owned());
    }
    if pull_policy == PullPolicy::Always {
        return Some("a fresh image pull".to_owned());
    }
    if !pooled {
        return Some(format!("image {image}"));
    }
    None
}

impl WarmPools {
    /// Whether any watch pool is kept.
    pub fn has_watch_pools(&self) -> bool {
        self.pools.iter().any(|pool| pool.kind == PoolKind::Watch)
    }

    /// Whether watch pods of `image` are pooled.
    pub fn pools_watch(&self, image: &str) -> bool {
        self.pool_of(PoolKind::Watch, image).is_some()
    }

    /// Counts a watch session start of `image` (whose pool served or not).
    pub fn count_watch_start(&self, image: &str, warm: bool) {
        if let Some(pool) = self.pool_of(PoolKind::Watch, image) {
            pool.metrics.started(warm);
        }
    }

    /// Takes a ready pooled watch pod of `image` for session `session_id`,
    /// running app `app`: the session id and `watch` mode labels, the app
    /// annotation and the deadline (`ttl_seconds` of activity from now) go
    /// on in one conditional write. `None`: no pod could be had.
    pub async fn claim_watch(
        &self,
        image: &str,
        session_id: &str,
        app: &str,
        ttl_seconds: u32,
    ) -> Option<Claimed> {
        let pool = self.pool_of(PoolKind::Watch, image)?;
        let mut labels = serde_json::Map::new();
        labels.insert(MODE_LABEL.to_owned(), json!(WATCH_MODE));
        let annotations = BTreeMap::from([(POOLED_APP_ANNOTATION.to_owned(), app.to_owned())]);
        self.claim_from(pool, session_id, &labels, &annotations, ttl_seconds)
            .await
    }
}

/// Creates a session's pod. When the namespace's quota refuses it and an
/// idle warm pod (of any pool) can give way, the pool shrinks by one and
/// the create is tried again: a session asked for, a warm pod only might be.
pub async fn create_pod_giving_way(
    pods: &Api<Pod>,
    pools: Option<&WarmPools>,
    pod: &Pod,
) -> Result<Pod, kube::Error> {
    let mut attempts = 0u32;
    loop {
        match pods.create(&PostParams::default(), pod).await {
            Err(err)
                if is_quota_refusal(&err)
                    && attempts < 5
                    && match pools {
                        Some(pools) if attempts == 0 => pools.give_way().await,
                        Some(_) => true,
                        None => false,
                    } =>
            {
                // The deleted pod's quota is released once it is gone.
                attempts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200) * attempts).await;
            }
            other => return other,
        }
    }
}

/// Whether `pod` is a claimed pooled watch pod of session `session_id`.
pub fn is_claimed_by(pod: &Pod, session_id: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(SESSION_ID_LABEL))
        .is_some_and(|id| id == session_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::watch::app_container;

    fn settings() -> PodSettings {
        PodSettings {
            namespace: "telo-sessions".into(),
            managed_by: "telo-runner".into(),
            init_image: "busybox:stable".into(),
            default_image: "telorun/node:24-slim".into(),
            image_pull_secret: None,
            runtime_class: None,
            termination_grace_seconds: 10,
        }
    }

    fn resources() -> Resources {
        Resources {
            cpu: "500m".into(),
            memory: "512Mi".into(),
            ephemeral_storage: "1Gi".into(),
            ttl_seconds: 21600,
        }
    }

    fn pooled() -> Pod {
        build_pooled_watch_pod(
            &settings(),
            &WatchPoolShared {
                resources: resources(),
                workspace_limits: vec![("RUNNER_WORKSPACE_MAX_FILES".into(), "10".into())],
            },
            "telo-warm-abc",
            "telorun/node:24-slim",
            "telo-runner:test",
            "t0ken",
        )
    }

    /// The pooled pod is the cold pod of one app but for the app
    /// container's name, script, entry and scratch directories, and the
    /// pod's identity (labels, name, deadline).
    #[test]
    fn a_pooled_watch_pod_is_a_cold_one_app_watch_pod_but_for_its_wait() {
        let apps = [AppSpec {
            name: "web".into(),
            entry_relative_path: "telo.yaml".into(),
            ports: Vec::new(),
            io: IoMode::Tty,
            telo: None,
        }];
        let cold = build_watch_pod(
            &settings(),
            &WatchPodInput {
                session_id: "abc234defghi",
                apps: &apps,
                env: &[],
                image: "telorun/node:24-slim",
                pull_policy: PullPolicy::Missing,
                telo_pins: &TeloPins::default(),
                workspace_image: "telo-runner:test",
                token: "t0ken",
                workspace_limits: &[("RUNNER_WORKSPACE_MAX_FILES".into(), "10".into())],
                resources: &resources(),
                agent: None,
            },
            &mut PodEnvSecret::named(String::new()),
        );
        let warm = pooled();
        let (cold_spec, warm_spec) = (cold.spec.unwrap(), warm.spec.unwrap());
        assert_eq!(warm_spec.active_deadline_seconds, None);
        assert_eq!(cold_spec.containers[0], warm_spec.containers[0]);
        assert_eq!(cold_spec.volumes, warm_spec.volumes);
        let (cold_app, warm_app) = (&cold_spec.containers[1], &warm_spec.containers[1]);
        assert_eq!(cold_app.name, app_container("web"));
        assert_eq!(warm_app.name, POOLED_APP_CONTAINER);
        let mut expected = cold_app.clone();
        expected.name = POOLED_APP_CONTAINER.to_owned();
        expected.command = warm_app.command.clone();
        expected
            .env
            .as_mut()
            .unwrap()
            .retain(|e| e.name != "TELO_ENTRY");
        for mount in expected.volume_mounts.iter_mut().flatten() {
            if mount.sub_path.is_some() {
                mount.sub_path = Some(POOLED_APP_CONTAINER.to_owned());
            }
        }
        assert_eq!(&expected, warm_app);
        let labels = warm.metadata.labels.unwrap();
        assert_eq!(labels.get(STATE_LABEL).map(String::as_str), Some(IDLE));
        assert!(!labels.contains_key(MODE_LABEL) && !labels.contains_key(SESSION_ID_LABEL));
        assert_ne!(
            labels.get(POOL_LABEL),
            Some(&pool_key("telorun/node:24-slim")),
            "never a run pool's"
        );
    }

    /// Every variable the pooled app container's runner sets, and the
    /// entry, are the ones a session's entry cannot replace.
    #[test]
    fn the_runner_names_are_the_app_containers_own() {
        let pod = pooled();
        let spec = pod.spec.unwrap();
        let mut names: Vec<&str> = spec.containers[1]
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .chain(["TELO_ENTRY"])
            .collect();
        names.sort_unstable();
        let mut ours = RUNNER_NAMES.to_vec();
        ours.sort_unstable();
        assert_eq!(names, ours);
    }

    #[test]
    fn the_watch_launch_file_quotes_every_word_and_keeps_the_runners_variables() {
        let env = vec![
            ("GREETING".to_owned(), "it's $HOME".to_owned()),
            ("TELO_ENTRY".to_owned(), "/elsewhere".to_owned()),
        ];
        assert_eq!(
            watch_launch_file(&env, "apps/my app.yaml"),
            format!(
                "rm -f \"$launch\"\nexec env 'GREETING=it'\\''s $HOME' TELO_ENTRY=\"$ws\"/'apps/my app.yaml' sh -c {}\n",
                shell_quote(APP_SCRIPT)
            )
        );
    }

    /// The waiting script and the launch file under `sh`: the go-ahead
    /// before the file is no go-ahead; after it, the app script runs with
    /// the session's env and entry, and the launch file is gone.
    #[tokio::test]
    async fn a_pooled_app_container_runs_the_cold_script_on_the_go_ahead() {
        use std::os::unix::fs::PermissionsExt;
        use tokio::io::AsyncWriteExt;
        let ws = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let telo = bin.path().join("telo");
        std::fs::write(&telo, "#!/bin/sh\necho \"$V|$TELO_INSPECT_ADDR|$*\"\n").unwrap();
        std::fs::set_permissions(&telo, std::fs::Permissions::from_mode(0o755)).unwrap();
        let script = pooled_waiting_script().replace(WORKSPACE_DIR, &ws.path().to_string_lossy());
        let mut shell = tokio::process::Command::new("sh")
            .args(["-c", &script])
            .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
            .env("TELO_INSPECT_ADDR", "10.0.0.1:9230")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut terminal = shell.stdin.take().unwrap();
        terminal
            .write_all(crate::pod::warm::GO_AHEAD)
            .await
            .unwrap();
        std::fs::write(ws.path().join("telo.yaml"), "kind: Telo.Application\n").unwrap();
        std::fs::create_dir_all(ws.path().join(".telo")).unwrap();
        let env = [("V".to_owned(), "a'b $(c)".to_owned())];
        std::fs::write(
            ws.path().join(LAUNCH_PATH),
            watch_launch_file(&env, "telo.yaml"),
        )
        .unwrap();
        terminal
            .write_all(crate::pod::warm::GO_AHEAD)
            .await
            .unwrap();
        let out =
            tokio::time::timeout(std::time::Duration::from_secs(30), shell.wait_with_output())
                .await
                .unwrap()
                .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!(
                "a'b $(c)|10.0.0.1:9230|run --watch --inspect 10.0.0.1:9230 --no-open {}/telo.yaml\n",
                ws.path().display()
            )
        );
        assert!(
            !ws.path().join(LAUNCH_PATH).exists(),
            "the launch file is gone"
        );
    }

    #[test]
    fn only_one_tty_app_without_an_agent_or_a_fresh_pull_fits() {
        let app = |name: &str, io| AppSpec {
            name: name.into(),
            entry_relative_path: "telo.yaml".into(),
            ports: Vec::new(),
            io,
            telo: None,
        };
        let one = [app("web", IoMode::Tty)];
        let fit = |apps: &[AppSpec], agent, policy, pooled| {
            shape_misfit(apps, agent, "img:1", policy, pooled)
        };
        assert_eq!(fit(&one, false, PullPolicy::Missing, true), None);
        assert_eq!(
            fit(
                &[app("a", IoMode::Tty), app("b", IoMode::Tty)],
                false,
                PullPolicy::Missing,
                true
            )
            .as_deref(),
            Some("2 apps")
        );
        assert_eq!(
            fit(&one, true, PullPolicy::Missing, true).as_deref(),
            Some("an agent")
        );
        assert_eq!(
            fit(
                &[app("w", IoMode::Streams)],
                false,
                PullPolicy::Missing,
                true
            )
            .as_deref(),
            Some("an app on streams")
        );
        assert_eq!(
            fit(&one, false, PullPolicy::Always, true).as_deref(),
            Some("a fresh image pull")
        );
        assert_eq!(
            fit(&one, false, PullPolicy::Missing, false).as_deref(),
            Some("image img:1")
        );
    }
}
