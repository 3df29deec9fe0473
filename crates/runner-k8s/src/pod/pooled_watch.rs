//! The pooled watch pod (`RUNNER_WARM_POOL_WATCH`, kept by
//! `crate::warm_pool`): a cold watch pod of one app built before its
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

use k8s_openapi::api::core::v1::Pod;
use runner_core::types::PullPolicy;
use runner_core::watch_types::{AppSpec, IoMode};

use crate::images::telo::TeloPins;
use crate::pod::env_secret::PodEnvSecret;
use crate::pod::labels::{IDLE, IMAGE_ANNOTATION, MANAGED_BY_LABEL, POOL_LABEL, STATE_LABEL};
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
pub(crate) const RUNNER_NAMES: [&str; 6] = [
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
    crate::pod::warm::launch_waiting_script("ws", WORKSPACE_DIR, LAUNCH_PATH)
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
