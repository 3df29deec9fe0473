//! Watch pools (`RUNNER_WARM_POOL_WATCH`): watch pods of the editor's
//! everyday shape — one app, no agent — kept up and ready per kernel image,
//! on the same machinery as run pools (claim, refill pacing, quota, restart
//! takeover). The pods are built in [`crate::pod::pooled_watch`].
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
use crate::pod::labels::{MODE_LABEL, POOLED_APP_ANNOTATION, WATCH_MODE};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::telo::TeloPins;
    use crate::pod::env_secret::PodEnvSecret;
    use crate::pod::labels::{IDLE, POOL_LABEL, SESSION_ID_LABEL, STATE_LABEL};
    use crate::pod::pooled_watch::*;
    use crate::pod::spec::{PodSettings, Resources};
    use crate::pod::warm::{pool_key, shell_quote};
    use crate::pod::watch::{
        APP_SCRIPT, WORKSPACE_DIR, WatchPodInput, app_container, build_watch_pod,
    };

    fn settings() -> PodSettings {
        PodSettings::for_tests()
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
