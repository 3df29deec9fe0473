//! The container engine of the docker runtime: kube-sim drives a docker CLI
//! (never an engine API library) to inspect images and to create, start,
//! stop, inspect and remove containers, and follows the engine's events to
//! learn the moment a container has started.
//!
//! With an isolated pod network it also starts each pod's infra container
//! ([`Engine::start_infra`]), whose network namespace the pod's containers
//! join.
//!
//! Every container it creates carries this simulator's instance label, so
//! none outlives the simulator: [`Engine::close`] removes what is left
//! when the simulator shuts down, a guardian process (a shell waiting on a
//! pipe only this process holds) removes it when the simulator is dropped
//! without shutting down or dies, and a simulator starting removes those
//! of simulators that are gone ([`OWNER_LABEL`]).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The label every container of one simulator carries (`<key>=<instance>`).
pub const INSTANCE_LABEL: &str = "kube-sim.instance";
/// The label naming the pod a container belongs to, as the kubelet's
/// docker integration names it.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// The label naming the process that made a container, as
/// `<pid namespace>.<pid>.<start time>` (see [`owner_of`]): a simulator
/// starting removes the containers of one that is gone, should its
/// guardian have been killed with it.
pub const OWNER_LABEL: &str = "kube-sim.owner";
/// The label telling a pod's infra container (`podsandbox`) from its
/// containers (`container`), as the kubelet's docker integration has it.
pub const TYPE_LABEL: &str = "io.kubernetes.docker.type";
/// The image of the pods' infra containers: the local busybox the project
/// builds (`scripts/image.sh bases`), whose `sleep` holds the pod's
/// namespaces as a pause container does.
pub const INFRA_IMAGE: &str = "busybox:stable";
/// The environment variable naming the docker client when none is given.
pub const ENGINE_ENV: &str = "TELO_RUNNER_CONTAINER_ENGINE";

/// The client's own environment: what a docker CLI reads to find and talk
/// to its daemon. Everything else of kube-sim's environment stays out.
const CLIENT_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "DOCKER_API_VERSION",
];

/// A TTY client's detach sequence. The docker CLI always has one (default
/// ctrl-p,ctrl-q, which would swallow a shell's ctrl-p); kubectl attach has
/// none, so it is set to a sequence nobody types.
const DETACH_KEYS: &str = "ctrl-@,ctrl-@,ctrl-@,ctrl-@,ctrl-@,ctrl-@,ctrl-@,ctrl-@";

/// How containers run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Runtime {
    /// Every container is a local process (the image behaviour table says
    /// which).
    #[default]
    Process,
    /// Every container is a real container of a docker engine.
    Docker,
}

impl FromStr for Runtime {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "process" => Ok(Self::Process),
            "docker" => Ok(Self::Docker),
            other => Err(format!(
                "unknown runtime {other:?}: expected process or docker"
            )),
        }
    }
}

/// What the kubelet needs to know of a local image.
#[derive(Debug, Clone, Default)]
pub struct ImageInfo {
    /// `imageID` as a CRI runtime reports it: the repo digest when the
    /// image has one, else its id.
    pub image_id: String,
    /// The image's `USER` (`""`, `1000`, `1000:1000`, `node`).
    pub user: String,
    pub size: u64,
}

/// How long a SIGKILLed container's exit waits for the engine's OOM mark.
const OOM_MARK_WAIT: Duration = Duration::from_secs(1);
/// How often the exit is read again meanwhile.
const OOM_MARK_POLL: Duration = Duration::from_millis(50);

/// A container's state after its client exited (`docker inspect .State`).
#[derive(Debug, Clone, Default)]
pub struct ContainerExit {
    pub running: bool,
    pub oom_killed: bool,
    pub exit_code: i32,
    /// Why the runtime could not start it (empty when it started).
    pub error: String,
    pub started: bool,
}

pub struct Engine {
    client: PathBuf,
    instance: String,
    client_env: Vec<(String, String)>,
    server_version: String,
    /// Set once the simulator stops: no container is created after.
    closed: AtomicBool,
    /// Containers waiting for their `start` event, by name.
    starts: Mutex<HashMap<String, oneshot::Sender<()>>>,
    /// Whether the events stream is followed (a waiter is answered at
    /// once, without a start, when it is not).
    events_up: AtomicBool,
    /// The write end of the guardian's pipe: closing it (or this process
    /// dying) makes the guardian remove every container left.
    guardian: Mutex<Option<std::process::ChildStdin>>,
    /// This process as [`OWNER_LABEL`] names it (`None` without `/proc`).
    owner: Option<String>,
}

/// Process `pid` of this process's pid namespace as
/// `<pid namespace>.<pid>.<start time>`: the start time tells a process
/// from a later one given the same pid, the namespace says whether a
/// label's pid can be looked up here at all.
fn owner_of(pid: u32) -> Option<String> {
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let ns = ns
        .to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .to_owned();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's `(...)`: the start time is the 22nd
    // field of the line, the 20th after it.
    let start = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?;
    Some(format!("{ns}.{pid}.{start}"))
}

/// Whether a container labelled `owner` belongs to a simulator that is
/// gone: one of this pid namespace whose process has ended (or whose pid
/// another process now has). Others' are left alone.
fn owner_is_gone(owner: &str, own: &str) -> bool {
    let mut parts = owner.splitn(3, '.');
    let (Some(ns), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if own.split('.').next() != Some(ns) {
        return false;
    }
    match pid.parse::<u32>() {
        Ok(pid) => owner_of(pid).as_deref() != Some(owner),
        Err(_) => false,
    }
}

/// The docker client named by `client`, else by `TELO_RUNNER_CONTAINER_ENGINE`,
/// else `docker`, resolved on `PATH`.
pub fn resolve_client(client: Option<&Path>) -> Result<PathBuf, String> {
    let named = match client {
        Some(c) => c.to_path_buf(),
        None => std::env::var_os(ENGINE_ENV)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from("docker"), PathBuf::from),
    };
    if named.components().count() > 1 {
        return if named.is_file() {
            Ok(named)
        } else {
            Err(format!(
                "the container engine client {} does not exist",
                named.display()
            ))
        };
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(&named))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no container engine client {:?} on PATH (set {ENGINE_ENV} or name one)",
                named.display().to_string()
            )
        })
}

impl Engine {
    /// Checks that the engine answers, then follows its events for this
    /// instance's containers until `shutdown`.
    pub async fn connect(
        client: Option<&Path>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, String> {
        let client = resolve_client(client)?;
        let client_env: Vec<(String, String)> = CLIENT_ENV
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        let instance = crate::meta::random_hex(8);
        let mut engine = Self {
            client,
            instance,
            client_env,
            server_version: String::new(),
            closed: AtomicBool::new(false),
            starts: Mutex::new(HashMap::new()),
            events_up: AtomicBool::new(false),
            guardian: Mutex::new(None),
            owner: owner_of(std::process::id()),
        };
        engine.server_version = engine
            .run(&["version", "--format", "{{.Server.Version}}"])
            .await
            .map(|v| v.trim().to_string())
            .map_err(|e| {
                format!(
                    "the container engine does not answer ({} version: {e})",
                    engine.client.display()
                )
            })?;
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(Duration::from_secs(1));
        let events = engine
            .command()
            .args(["events", "--format", "{{json .}}"])
            .args(["--filter", "type=container", "--filter", "event=start"])
            .arg("--filter")
            .arg(format!("label={}", engine.label()))
            .arg("--since")
            .arg(format!("{}.{:09}", since.as_secs(), since.subsec_nanos()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not follow the engine's events: {e}"))?;
        *engine.guardian.lock().unwrap_or_else(|p| p.into_inner()) =
            engine.spawn_guardian(events.id());
        engine.events_up.store(true, Ordering::SeqCst);
        let engine = Arc::new(engine);
        tokio::spawn(engine.clone().follow_events(events, shutdown));
        tokio::spawn({
            let engine = engine.clone();
            async move { engine.sweep_dead().await }
        });
        Ok(engine)
    }

    /// This process as [`OWNER_LABEL`] names it, for its containers.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// Removes the containers of simulators that are gone (killed with
    /// their guardian), infra containers included.
    async fn sweep_dead(&self) {
        let Some(own) = self.owner.as_deref() else {
            return;
        };
        let format = format!("{{{{.ID}}}} {{{{.Label \"{OWNER_LABEL}\"}}}}");
        let filter = format!("label={OWNER_LABEL}");
        let Ok(out) = self
            .run(&["ps", "--all", "--filter", &filter, "--format", &format])
            .await
        else {
            return;
        };
        let gone: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, owner)| owner_is_gone(owner.trim(), own))
            .map(|(id, _)| id)
            .collect();
        if !gone.is_empty() {
            let mut rm = vec!["rm", "--force", "--volumes", "--"];
            rm.extend(gone);
            let _ = self.run(&rm).await;
        }
    }

    /// `kube-sim.instance=<instance>`: every container of this simulator
    /// carries it.
    pub fn label(&self) -> String {
        format!("{INSTANCE_LABEL}={}", self.instance)
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn client(&self) -> &Path {
        &self.client
    }

    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    pub fn client_env(&self) -> Vec<(String, String)> {
        self.client_env.clone()
    }

    fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.client);
        cmd.env_clear()
            .envs(self.client_env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Runs the client to completion: its stdout, or why it failed (its
    /// stderr without the CLI's `Error response from daemon: `).
    async fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String, String> {
        let out = self
            .command()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .await
            .map_err(|e| format!("could not run {}: {e}", self.client.display()))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.trim();
        let err = err
            .strip_prefix("Error response from daemon: ")
            .or_else(|| err.strip_prefix("Error: "))
            .unwrap_or(err);
        Err(if err.is_empty() {
            format!("exited with {}", out.status)
        } else {
            err.to_string()
        })
    }

    /// The local image `reference`, if the engine has it. Nothing is ever
    /// pulled.
    pub async fn image(&self, reference: &str) -> Option<ImageInfo> {
        let out = self
            .run(&[
                "image",
                "inspect",
                "--format",
                "{{json .}}",
                "--",
                reference,
            ])
            .await
            .ok()?;
        let v: Value = serde_json::from_str(out.trim()).ok()?;
        let id = v
            .get("Id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let digest = v
            .get("RepoDigests")
            .and_then(Value::as_array)
            .and_then(|d| d.first())
            .and_then(Value::as_str)
            .map(str::to_string);
        Some(ImageInfo {
            image_id: digest.unwrap_or(id),
            user: crate::meta::path_str(&v, "Config.User")
                .unwrap_or("")
                .to_string(),
            size: v.get("Size").and_then(Value::as_u64).unwrap_or(0),
        })
    }

    /// `docker create <args>`: the new container's id.
    pub async fn create(&self, args: &[String]) -> Result<String, String> {
        if self.is_closed() {
            return Err("the simulator is shutting down".into());
        }
        let id = self.run(args).await?.trim().to_string();
        if self.is_closed() {
            // Created while the simulator stopped: the sweep may have
            // missed it.
            let _ = self.run(&["rm", "-f", "-v", &id]).await;
            return Err("the simulator is shutting down".into());
        }
        Ok(id)
    }

    /// Whether this engine's containers can join a bridge of this machine
    /// (the isolated pod network): their processes must be processes of
    /// this machine, which a remote or rootless engine's are not, and the
    /// infra image must be there.
    pub async fn probe_infra(&self) -> Result<(), String> {
        if let Some((host, _)) = self
            .client_env
            .iter()
            .find(|(k, _)| k == "DOCKER_HOST")
            .filter(|(_, v)| !v.is_empty() && !v.starts_with("unix://"))
        {
            return Err(format!(
                "the container engine at DOCKER_HOST={host:?} is not on this machine"
            ));
        }
        let security = self
            .run(&["info", "--format", "{{json .SecurityOptions}}"])
            .await
            .map_err(|e| format!("the container engine does not say how it runs ({e})"))?;
        if security.contains("rootless") {
            return Err(
                "the container engine is rootless: its containers' namespaces are not this machine's to join"
                    .into(),
            );
        }
        if self.image(INFRA_IMAGE).await.is_none() {
            return Err(format!(
                "the pods' infra image {INFRA_IMAGE} is not a local image of the engine (scripts/image.sh bases builds it)"
            ));
        }
        Ok(())
    }

    /// Creates and starts a pod's infra container `name`: a process with
    /// a network namespace of its own holding nothing but its loopback, the
    /// pod's hostname, doing nothing. The pod's containers join it
    /// (`--network container:<name>`). Returns its process id, for its
    /// network namespace (`/proc/<pid>/ns/net`).
    pub async fn start_infra(
        &self,
        name: &str,
        labels: &[(String, String)],
        hostname: &str,
    ) -> Result<u32, String> {
        let mut args: Vec<String> = [
            "create",
            "--name",
            name,
            "--pull",
            "never",
            "--network",
            "none",
            "--hostname",
            hostname,
            "--log-driver",
            "none",
            // It needs nothing: no capability, no write, no root.
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--read-only",
            "--user",
            "65534:65534",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (k, v) in labels {
            args.extend(["--label".into(), format!("{k}={v}")]);
        }
        args.extend(
            ["--entrypoint", "sleep", INFRA_IMAGE, "infinity"]
                .iter()
                .map(|s| s.to_string()),
        );
        let id = self
            .create(&args)
            .await
            .map_err(|e| format!("could not create the pod's infra container: {e}"))?;
        let started = async {
            self.run(&["start", "--", name]).await?;
            let pid = self
                .run(&[
                    "container",
                    "inspect",
                    "--format",
                    "{{.State.Pid}}",
                    "--",
                    name,
                ])
                .await?;
            let pid: u32 = pid
                .trim()
                .parse()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("it has no process (pid {:?})", pid.trim()))?;
            // The engine's pid names a process of this machine only if the
            // engine runs here (and not rootless): else the pid may be some
            // other process's, whose namespace must not be touched. The
            // container's process is in a cgroup named after it from
            // before it runs its command (`runc init`) on.
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if id.len() < 12 || !cgroup.contains(id.as_str()) {
                return Err(format!(
                    "its process {pid} is not a process of this machine (is the engine remote?)"
                ));
            }
            Ok(pid)
        };
        match started.await {
            Ok(pid) => Ok(pid),
            Err(e) => {
                self.remove(name).await;
                Err(format!("could not start the pod's infra container: {e}"))
            }
        }
    }

    /// The client arguments that start container `name` attached to its
    /// output (and to its stdin when it has one): the process the kubelet
    /// runs for it.
    pub fn start_args(&self, name: &str, stdin: bool, tty: bool) -> Vec<String> {
        let mut args = vec!["start".to_string(), "--attach".to_string()];
        if stdin {
            args.push("--interactive".into());
        }
        if tty {
            args.push(format!("--detach-keys={DETACH_KEYS}"));
        }
        args.push(name.to_string());
        args
    }

    /// Resolves once container `name` has started. Register before starting
    /// it. An error means the events are not followed (any more): the
    /// caller cannot learn the moment and takes it as started.
    pub fn watch_start(&self, name: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        if self.events_up.load(Ordering::SeqCst) {
            self.starts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_string(), tx);
        }
        rx
    }

    pub fn unwatch_start(&self, name: &str) {
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    async fn follow_events(
        self: Arc<Self>,
        mut child: tokio::process::Child,
        shutdown: CancellationToken,
    ) {
        if let Some(stdout) = child.stdout.take() {
            let mut lines = BufReader::new(stdout).lines();
            loop {
                tokio::select! {
                    line = lines.next_line() => match line {
                        Ok(Some(line)) => self.on_event(&line),
                        _ => break,
                    },
                    _ = shutdown.cancelled() => break,
                }
            }
        }
        self.events_up.store(false, Ordering::SeqCst);
        // Dropping the senders answers every waiter.
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let _ = child.kill().await;
    }

    fn on_event(&self, line: &str) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            return;
        };
        let action = v.get("Action").and_then(Value::as_str).unwrap_or("");
        if action != "start" {
            return;
        }
        if let Some(name) = crate::meta::path_str(&v, "Actor.Attributes.name")
            && let Some(tx) = self
                .starts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name)
        {
            let _ = tx.send(());
        }
    }

    /// [`Self::exit_state`], with the engine's out-of-memory mark settled.
    /// The engine takes a container's exit and its cgroup's OOM kill as two
    /// events, and may show the exit first: a container SIGKILLed (137)
    /// and not marked is read again for up to [`OOM_MARK_WAIT`].
    pub async fn settled_exit_state(&self, name: &str) -> Option<ContainerExit> {
        let deadline = tokio::time::Instant::now() + OOM_MARK_WAIT;
        loop {
            let state = self.exit_state(name).await?;
            let unmarked_kill = !state.running && state.exit_code == 137 && !state.oom_killed;
            if !unmarked_kill || tokio::time::Instant::now() >= deadline {
                return Some(state);
            }
            tokio::time::sleep(OOM_MARK_POLL).await;
        }
    }

    /// The state of container `name` after its client exited.
    pub async fn exit_state(&self, name: &str) -> Option<ContainerExit> {
        let out = self
            .run(&[
                "container",
                "inspect",
                "--format",
                "{{json .State}}",
                "--",
                name,
            ])
            .await
            .ok()?;
        let s: Value = serde_json::from_str(out.trim()).ok()?;
        let started_at = s.get("StartedAt").and_then(Value::as_str).unwrap_or("");
        Some(ContainerExit {
            running: s.get("Running").and_then(Value::as_bool).unwrap_or(false),
            oom_killed: s.get("OOMKilled").and_then(Value::as_bool).unwrap_or(false),
            exit_code: s
                .get("ExitCode")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(255),
            error: s
                .get("Error")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            started: !started_at.is_empty() && !started_at.starts_with("0001-"),
        })
    }

    /// Stops container `name`: its stop signal, then SIGKILL after `grace`
    /// (at once for a zero grace period). Returns when it has stopped.
    pub async fn stop(&self, name: &str, grace: Duration) {
        let _ = if grace.is_zero() {
            self.run(&["kill", "--", name]).await
        } else {
            let secs = grace.as_secs().to_string();
            self.run(&["stop", "--time", &secs, "--", name]).await
        };
    }

    /// Removes container `name` (and its anonymous volumes), running or not.
    pub async fn remove(&self, name: &str) {
        let _ = self.run(&["rm", "--force", "--volumes", "--", name]).await;
    }

    /// Removes every container of this simulator that carries all of
    /// `labels` as well; `false` when there was none.
    async fn remove_labelled(&self, labels: &[String]) -> bool {
        let mut args = vec![
            "ps".to_string(),
            "--all".into(),
            "--quiet".into(),
            "--filter".into(),
            format!("label={}", self.label()),
        ];
        for l in labels {
            args.push("--filter".into());
            args.push(format!("label={l}"));
        }
        let Ok(out) = self.run(&args).await else {
            return false;
        };
        let ids: Vec<&str> = out.split_whitespace().collect();
        if ids.is_empty() {
            return false;
        }
        let mut rm = vec!["rm", "--force", "--volumes", "--"];
        rm.extend(ids);
        let _ = self.run(&rm).await;
        true
    }

    /// Removes whatever is left of a pod's containers.
    pub async fn remove_pod(&self, uid: &str) {
        self.remove_labelled(&[format!("{POD_UID_LABEL}={uid}")])
            .await;
    }

    /// Removes this simulator's containers until none is listed: a
    /// container another removal is already taking down is refused ("already
    /// in progress") and still listed until that removal ends.
    async fn remove_all(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while self.remove_labelled(&[]).await && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The simulator stops: no more containers, and every one left is
    /// removed before this returns.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.remove_all().await;
        self.release_guardian();
    }

    /// The simulator is dropped without [`Engine::close`]: no more
    /// containers, and the guardian removes what is left (or, without a
    /// guardian, this call does, blocking).
    pub fn close_now(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if !self.release_guardian() {
            self.remove_all_blocking();
        }
    }

    /// Closes the guardian's pipe; `false` when there is no guardian.
    fn release_guardian(&self) -> bool {
        let stdin = self
            .guardian
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match stdin {
            Some(mut s) => {
                let _ = s.flush();
                true
            }
            None => false,
        }
    }

    fn remove_all_blocking(&self) {
        let blocking = |args: &[&str]| {
            std::process::Command::new(&self.client)
                .env_clear()
                .envs(self.client_env.iter().map(|(k, v)| (k, v)))
                .args(args)
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        };
        let filter = format!("label={}", self.label());
        let Some(out) = blocking(&["ps", "--all", "--quiet", "--filter", &filter]) else {
            return;
        };
        let mut rm = vec!["rm", "--force", "--volumes", "--"];
        rm.extend(out.split_whitespace());
        if rm.len() > 4 {
            let _ = blocking(&rm);
        }
    }

    /// A shell that waits for its stdin to close — when this simulator
    /// releases it, or when this process dies however it dies — then
    /// removes every container of this simulator, and once more a few
    /// seconds later for a create that was still under way. It also ends
    /// the events client `events` (process id), which a simulator killed
    /// outright could not end itself: only if that process still follows
    /// this simulator's label.
    fn spawn_guardian(&self, events: Option<u32>) -> Option<std::process::ChildStdin> {
        use std::os::unix::process::CommandExt as _;
        const SCRIPT: &str = r#"cat >/dev/null
if [ -n "$3" ] && grep -qa -- "label=$2" "/proc/$3/cmdline" 2>/dev/null; then
  kill "$3" 2>/dev/null
fi
for pause in 0 5; do
  sleep "$pause"
  ids=$("$1" ps --all --quiet --filter "label=$2") || exit 0
  [ -z "$ids" ] || "$1" rm --force --volumes -- $ids >/dev/null 2>&1
done"#;
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("kube-sim-guardian")
            .arg(&self.client)
            .arg(self.label())
            .arg(events.map(|p| p.to_string()).unwrap_or_default())
            .env_clear()
            .envs(self.client_env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // Its own group: a Ctrl-C meant for the simulator does not
            // stop it before it has cleaned up.
            .process_group(0)
            .spawn()
            .ok()?;
        let stdin = child.stdin.take();
        std::thread::spawn(move || child.wait());
        stdin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_parse_by_name() {
        assert_eq!("process".parse::<Runtime>(), Ok(Runtime::Process));
        assert_eq!("docker".parse::<Runtime>(), Ok(Runtime::Docker));
        assert!("podman".parse::<Runtime>().is_err());
        assert_eq!(Runtime::default(), Runtime::Process);
    }

    #[test]
    fn only_gone_owners_of_this_pid_namespace_are_swept() {
        let own = owner_of(std::process::id()).expect("/proc");
        assert!(!owner_is_gone(&own, &own), "this process is alive");
        let ns = own.split('.').next().unwrap();
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        ended.wait().unwrap();
        assert!(owner_is_gone(&format!("{ns}.{}.1", ended.id()), &own));
        // This process, but an earlier one with its pid.
        let earlier = format!("{ns}.{}.0", std::process::id());
        assert!(owner_is_gone(&earlier, &own));
        // Another pid namespace's, or unreadable: not ours to judge.
        assert!(!owner_is_gone(&format!("1.{}.0", ended.id()), &own));
        assert!(!owner_is_gone("garbage", &own));
    }

    #[test]
    fn a_client_path_must_exist() {
        assert!(resolve_client(Some(Path::new("/nonexistent/docker"))).is_err());
        assert_eq!(
            resolve_client(Some(Path::new("/bin/sh"))),
            Ok(PathBuf::from("/bin/sh"))
        );
    }
}
