//! The local backend: every session is the Telo CLI (or an operator app's
//! command) running as a local process in its own PTY, in its own directory
//! and — unless the operator opted out — its own sandbox, with nothing of
//! the runner's environment but a `PATH`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runner_api::telo::TeloVersion;
use runner_api::watch::SessionMode;
use runner_core::capabilities::{SchemaOptions, session_config_schema};
use runner_core::errors::error_chain;
use runner_core::observe::Observer;
use runner_core::tasks::OwnedTasks;
use runner_core::types::{AvailabilityReport, PullPolicy, RunBundle, RunStatus};
use runner_core::{
    Backend, BackendCapabilities, BackendSession, HeldSessions, ProbeConfig, Readiness,
    SessionSink, StartError, StartSpec, StartStage, SuspendedSession, TeloUnavailable, WatchSpec,
    WatchStart, WatchWorkload,
};
use serde_json::json;
use tracing::{Instrument, Span, error, info, warn};

use crate::config::{LocalConfig, SandboxConfig};
use crate::kernel::cache_warm_up::{CacheSource, KernelCacheWarmer, WarmUpError};
use crate::kernel::check::TELO_NOT_FOUND_REMEDIATION;
use crate::kernel::monitor::{KernelHealth, KernelMonitor};
use crate::kernel_cache::{
    CacheKey, KernelIdentity, SEED_SHARE_OF_DISK_BOUND, SessionCache, SharedKernelCache,
};
use crate::launch::{LaunchPlan, app_argv, telo_argv, workload_env};
use crate::process::executable::resolve_executable;
use crate::process::group::Members;
use crate::process::pipes::Started;
use crate::process::plan::SpawnPlan;
use crate::process::pty::spawn_in_pty;
use crate::process::spawner::on_spawner_thread;
use crate::sandbox::check::{SandboxHealth, SandboxMonitor};
use crate::session::stop::{RunEnd, follow_run_to_end};
use crate::session::wiring::{free_loopback_port, wire_process};
use crate::work_root::lock::{WorkRootLock, WorkRootLockError};
use crate::work_root::session_dir::{WorkDir, sweep_work_root, with_bulk_file_work};

/// The image name advertised (read-only) in the config schema: there is no
/// image, the runner's host is the environment.
pub const LOCAL_IMAGE: &str = "local";
/// Bundles up to this many files are written at once, whatever else is
/// being written (see `with_bulk_file_work`).
pub const SMALL_BUNDLE_FILES: usize = 64;
const WORK_DIR_REMEDIATION: &str =
    "Set RUNNER_LOCAL_WORK_DIR to a directory the runner can write to.";

#[derive(Debug, thiserror::Error)]
pub enum LocalBackendError {
    #[error("could not create the HTTP client for debug streams")]
    HttpClient(#[source] reqwest::Error),
    #[error(transparent)]
    WorkRoot(#[from] WorkRootLockError),
}

pub struct LocalBackend {
    config: LocalConfig,
    http: reqwest::Client,
    kernel: Arc<KernelMonitor>,
    sandbox: Arc<SandboxMonitor>,
    /// The warmed caches sessions' kernels start from.
    kernel_cache: KernelCacheWarmer,
    /// Every session's end task, reachability probe and debug relay.
    tasks: OwnedTasks,
    _work_root: WorkRootLock,
}

impl LocalBackend {
    pub fn new(config: LocalConfig) -> Result<Self, LocalBackendError> {
        let http = runner_core::http_client::client_builder()
            // The debug stream is on loopback; a proxy from the runner's
            // environment must not be asked for it.
            .no_proxy()
            .build()
            .map_err(LocalBackendError::HttpClient)?;
        let work_root = WorkRootLock::acquire(&config.work_root)?;
        if config.sandbox == SandboxConfig::None {
            error!(
                "RUNNER_LOCAL_SANDBOX=none: sessions run WITHOUT a sandbox, as plain processes of the runner's user; every workload can read the runner's environment (its secrets included), its files and other sessions' directories, and signal the runner. Use it only where every session is trusted."
            );
        }
        let cgroups = match (
            &config.sandbox,
            crate::sandbox::cgroup::CgroupTree::delegated(),
        ) {
            (SandboxConfig::None, _) => None,
            (_, Ok(tree)) => {
                info!(
                    "sessions get a cgroup v2 child each: memory, processes and CPU are bounded per session"
                );
                Some(Arc::new(tree))
            }
            (_, Err(err)) => {
                warn!(reason = %err, "no cgroup v2 delegated to the runner: sessions are bounded by rlimits only (memory per process, processes per session unless the runner runs as root, no CPU bound)");
                None
            }
        };
        let sandbox = Arc::new(SandboxMonitor::new(
            config.sandbox.clone(),
            &config.work_root,
            config.limits,
            cgroups,
        ));
        let kernel = Arc::new(KernelMonitor::new(
            &config.telo,
            &config.path,
            &config.work_root,
            sandbox.clone(),
        ));
        kernel.spawn_boot_check();
        let store = Arc::new(SharedKernelCache::under(
            &config.work_root,
            config.kernel_cache.max_bytes,
        ));
        // Before any warm-up can start: what a previous runner left
        // half-done, or sessions wrote when this was their shared cache,
        // must never be taken for a warmed cache.
        match store.create() {
            Ok(()) => {
                store.sweep();
            }
            Err(err) => {
                warn!(dir = %store.root().display(), error = %err, "could not create the kernel cache");
            }
        }
        let kernel_cache = KernelCacheWarmer::new(
            store,
            config.kernel_cache.warm_up.as_deref(),
            sandbox.clone(),
            &config.path,
        );
        let tasks = OwnedTasks::new();
        if tokio::runtime::Handle::try_current().is_ok() {
            let kernel = kernel.clone();
            let warmer = kernel_cache.clone();
            // The configured kernel's cache is warmed once it passed its
            // self-check, so the first sessions find it ready.
            tasks.spawn(async move {
                if kernel.health().await == KernelHealth::Usable
                    && let Some(identity) = kernel.identity().await
                    && warmer.key_for(&identity).is_some()
                {
                    let _ = warmer.warm(identity).await;
                }
            });
        }
        Ok(Self {
            kernel_cache,
            config,
            http,
            kernel,
            sandbox,
            tasks,
            _work_root: work_root,
        })
    }

    /// Warms the kernel cache sessions of `version`'s kernel (`None`: the
    /// configured kernel, once it passed its self-check) start from, unless
    /// it is ready, and waits for it.
    pub async fn warm_kernel_cache(
        &self,
        version: Option<&TeloVersion>,
    ) -> Result<CacheKey, WarmUpError> {
        let kernel = match version {
            Some(version) => self
                .versioned_kernel(version)
                .ok_or_else(|| WarmUpError::NoSuchKernel(version.to_string()))?,
            None => {
                if self.kernel.health().await != KernelHealth::Usable {
                    return Err(WarmUpError::KernelUnusable);
                }
                self.kernel
                    .identity()
                    .await
                    .ok_or(WarmUpError::KernelUnusable)?
            }
        };
        self.kernel_cache.warm(kernel).await
    }

    /// The kernel a request naming `version` runs, as its cache knows it.
    fn versioned_kernel(&self, version: &TeloVersion) -> Option<KernelIdentity> {
        let dir = self.config.telo_versions.as_ref()?;
        let telo = crate::kernel::versions::supply(dir, version).ok()?;
        Some(KernelIdentity {
            telo,
            version: Some(version.to_string()),
            stamp: None,
        })
    }

    /// What the session cache of a Telo session running `version` (`None`:
    /// the configured kernel) is filled from.
    async fn cache_source(&self, version: Option<&str>) -> CacheSource {
        let kernel = match version.and_then(TeloVersion::parse) {
            Some(version) if self.config.telo_versions.is_some() => self.versioned_kernel(&version),
            _ => self.kernel.identity().await,
        };
        CacheSource {
            warmer: self.kernel_cache.clone(),
            kernel,
            budget: self.config.limits.disk_bytes / SEED_SHARE_OF_DISK_BOUND,
        }
    }

    /// Whether sessions can be sandboxed (see `sandbox::check`).
    pub async fn sandbox_health(&self) -> SandboxHealth {
        self.sandbox.health().await
    }

    /// Whether the Telo CLI can run sessions, from its self-check: waits for
    /// a check in progress (the boot check included), and runs one when the
    /// CLI or the `node` on the workload `PATH` changed since the last.
    pub async fn kernel_health(&self) -> KernelHealth {
        self.kernel.health().await
    }

    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// Boot sweep: removes every session directory under the work root (the
    /// registry is empty at boot, so they are all leftovers) except those
    /// of watch sessions, which are kept to be resumed. The shared kernel
    /// cache and the self-check's directory are not named like sessions, so
    /// they stay. Returns how many were removed.
    pub fn sweep_work_root(&self) -> usize {
        sweep_work_root(&self.config.work_root)
    }

    fn telo_not_found(&self) -> String {
        format!(
            "Telo CLI '{}' was not found on this runner's host",
            self.config.telo
        )
    }

    fn telo_not_found_report(&self) -> AvailabilityReport {
        AvailabilityReport::Unavailable {
            message: format!("{}.", self.telo_not_found()),
            remediation: Some(TELO_NOT_FOUND_REMEDIATION.to_owned()),
        }
    }

    /// The kernel that runs telo `version` (`None`: the configured Telo
    /// CLI). A version was checked when the request came in; one removed
    /// since fails the start, naming what the runner has now.
    fn kernel_for(&self, version: Option<&str>) -> Result<PathBuf, StartError> {
        match (
            version.and_then(TeloVersion::parse),
            &self.config.telo_versions,
        ) {
            (Some(version), Some(dir)) => crate::kernel::versions::supply(dir, &version)
                .map_err(|reason| StartError::new(StartStage::Start, reason.to_string())),
            _ => resolve_executable(&self.config.telo, &self.config.path).ok_or_else(|| {
                // The session's own failure says what to do, as the
                // probe does: a user may never look at the probe.
                StartError::new(
                    StartStage::Start,
                    format!("{}. {TELO_NOT_FOUND_REMEDIATION}", self.telo_not_found()),
                )
            }),
        }
    }

    /// The command line a session runs, with its program resolved; fails
    /// before anything is created on disk.
    fn command_line(
        &self,
        spec: &StartSpec,
        inspect_port: Option<u16>,
    ) -> Result<Vec<std::ffi::OsString>, StartError> {
        match &spec.app {
            Some(app) => {
                let Some(command) = app.command.as_deref().filter(|c| !c.is_empty()) else {
                    return Err(StartError::new(
                        StartStage::Start,
                        format!(
                            "app '{}' has no 'command' configured for the local backend",
                            app.name
                        ),
                    ));
                };
                let program =
                    resolve_executable(&command[0], &self.config.path).ok_or_else(|| {
                        StartError::new(
                            StartStage::Start,
                            format!(
                                "command '{}' of app '{}' was not found on this runner's host",
                                command[0], app.name
                            ),
                        )
                    })?;
                Ok(app_argv(&program, command))
            }
            None => {
                let telo = self.kernel_for(spec.telo.as_deref())?;
                Ok(telo_argv(&telo, &spec.entry_relative_path, inspect_port))
            }
        }
    }

    /// Creates the session's directory and writes its bundle, on Tokio's
    /// blocking pool: a bundle of thousands of files takes hundreds of
    /// milliseconds of file system calls, which on the async runtime stalled
    /// every other request (`/livez` included).
    async fn stage(
        &self,
        bundle: Option<RunBundle>,
        work: &WorkDir,
        kernel_cache: Option<(SessionCache, CacheSource)>,
    ) -> Result<(), StartError> {
        let dir = work.clone();
        let staged = tokio::task::spawn_blocking(move || {
            dir.create()?;
            let seeded = match &kernel_cache {
                Some((cache, source)) => {
                    let seeded = source.prepare(cache).map_err(|source| {
                        crate::work_root::session_dir::WorkDirError::CreateKernelCache {
                            path: cache.host_dir().to_owned(),
                            source,
                        }
                    })?;
                    Some((seeded, source.clone()))
                }
                None => None,
            };
            let written = match &bundle {
                // Not for the one file of a small bundle: no waiting behind
                // a big one.
                Some(bundle) if bundle.files.len() > SMALL_BUNDLE_FILES => {
                    with_bulk_file_work(|| dir.write_bundle(bundle))
                }
                Some(bundle) => dir.write_bundle(bundle),
                None => Ok(()),
            };
            written.map(|()| seeded)
        })
        .await;
        match staged {
            Ok(Ok(seeded)) => {
                if let Some((seeded, source)) = seeded {
                    source.after_prepare(&seeded);
                }
                Ok(())
            }
            Ok(Err(err)) => {
                Err(StartError::new(StartStage::Create, error_chain(&err)).with_source(err))
            }
            Err(join) => Err(StartError::new(
                StartStage::Create,
                format!("writing the bundle was interrupted: {join}"),
            )),
        }
    }

    /// What runs `plan`: the sandbox around it, when sessions are sandboxed.
    /// `programs` are the executables whose installations it must show,
    /// `extra_read_only` further paths shown as they are.
    fn spawn_plan(
        &self,
        plan: LaunchPlan,
        sandbox: Option<&crate::sandbox::bubblewrap::Sandbox>,
        programs: &[&Path],
        extra_read_only: &[PathBuf],
        read_write: &[PathBuf],
        kernel_cache: Option<&Path>,
    ) -> Result<SpawnPlan, StartError> {
        let Some(sandbox) = sandbox else {
            return Ok(plan.unsandboxed());
        };
        let mut read_only = sandbox.installations(programs);
        read_only.extend(extra_read_only.iter().cloned());
        sandbox
            .spawn_plan(
                plan,
                crate::sandbox::bubblewrap::SessionMounts {
                    read_only: &read_only,
                    read_write,
                    kernel_cache,
                },
                crate::sandbox::bubblewrap::WorkloadSession::Terminal,
            )
            .map_err(|err| {
                StartError::new(
                    StartStage::Start,
                    format!("could not hand the sandbox its arguments: {err}"),
                )
                .with_source(err)
            })
    }
}

#[async_trait]
impl Backend for LocalBackend {
    /// Not ready while the boot self-check of the Telo CLI runs: a session
    /// started meanwhile waits for its verdict, a kernel start's length.
    fn readiness(&self) -> Readiness {
        let mut waiting = Vec::new();
        if self.kernel.boot_check_pending() {
            waiting.push("the Telo CLI self-check".to_owned());
        }
        Readiness { waiting }
    }

    fn capabilities(&self) -> BackendCapabilities {
        BackendCapabilities {
            display_name: "Local runner".to_owned(),
            description: "Runs each session as a Telo CLI process on the runner's own machine, in a private directory and terminal.".to_owned(),
            config_schema: session_config_schema(&SchemaOptions {
                image_default: LOCAL_IMAGE.to_owned(),
                enforced: true,
                image_enum: Vec::new(),
                registry_url: true,
                pull_policy_default: PullPolicy::Missing,
                pull_policy_description: Some(
                    "Ignored by the local runner: sessions use the Telo CLI installed on the runner's host.".to_owned(),
                ),
            }),
            features: json!({ "io": ["tty", "streams"], "ports": true }),
            default_config: runner_api::types::SessionConfig {
                image: LOCAL_IMAGE.to_owned(),
                pull_policy: PullPolicy::Missing,
                registry_url: None,
            },
        }
    }

    async fn probe(&self, _config: &ProbeConfig) -> AvailabilityReport {
        if resolve_executable(&self.config.telo, &self.config.path).is_none() {
            return self.telo_not_found_report();
        }
        if let Err(err) = std::fs::create_dir_all(&self.config.work_root) {
            warn!(dir = %self.config.work_root.display(), error = %err, "session work root is not usable");
            return AvailabilityReport::Unavailable {
                message: format!("The runner cannot create session directories: {err}."),
                remediation: Some(WORK_DIR_REMEDIATION.to_owned()),
            };
        }
        if let SandboxHealth::Unusable(problem) = self.sandbox.health().await {
            return AvailabilityReport::Unavailable {
                message: problem.message,
                remediation: Some(problem.remediation),
            };
        }
        match self.kernel.health().await {
            KernelHealth::Usable => AvailabilityReport::Ready,
            KernelHealth::Unusable(problem) => AvailabilityReport::Unavailable {
                message: problem.message,
                remediation: Some(problem.remediation),
            },
            // Removed between the lookup above and the check.
            KernelHealth::Missing => self.telo_not_found_report(),
            KernelHealth::Unchecked(message) => AvailabilityReport::Unavailable {
                message,
                remediation: Some(WORK_DIR_REMEDIATION.to_owned()),
            },
        }
    }

    async fn start(
        &self,
        mut spec: StartSpec,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        let work = WorkDir::for_session(&self.config.work_root, &spec.session_id)
            .map_err(|err| StartError::new(StartStage::Start, err.to_string()))?;
        // An app runs its own command; only the Telo CLI gets `--inspect`.
        let inspect_port = if spec.inspect && !spec.self_contained() {
            Some(free_loopback_port().map_err(|err| {
                StartError::new(
                    StartStage::Start,
                    format!("could not reserve a port for --inspect: {err}"),
                )
                .with_source(err)
            })?)
        } else {
            None
        };
        let argv = self.command_line(&spec, inspect_port)?;
        // Never run a session unsandboxed the operator did not opt out of:
        // say why it cannot be sandboxed instead.
        let sandbox = match self.sandbox.health().await {
            SandboxHealth::Unusable(problem) => {
                return Err(StartError::new(StartStage::Start, problem.sentence()));
            }
            SandboxHealth::Off => None,
            SandboxHealth::Usable(sandbox) => Some(sandbox),
        };
        // A kernel known to fail every run would fail this one too, with only
        // an exit code to show for it: say why instead. (An app runs its own
        // program, not the Telo CLI.)
        if spec.app.is_none()
            && spec.telo.is_none()
            && let KernelHealth::Unusable(problem) = self.kernel.health().await
        {
            return Err(StartError::new(StartStage::Start, problem.sentence()));
        }
        // What the default kernel said it is, for `run started` (a kernel
        // before 0.95 does not say on its debug stream).
        if spec.app.is_none()
            && spec.telo.is_none()
            && let Some(version) = self.kernel.version().await
        {
            sink.kernel_version(None, version);
        }
        // Moved, not copied: a big bundle is megabytes.
        let bundle = (!spec.self_contained()).then(|| RunBundle {
            entry_relative_path: spec.bundle.entry_relative_path.clone(),
            files: std::mem::take(&mut spec.bundle.files),
        });
        // A Telo session's kernel caches into a directory of its own (an
        // operator's app is its own program and gets none).
        let kernel_cache = match &spec.app {
            Some(_) => None,
            None => Some(SessionCache::new(work.kernel_cache(), sandbox.is_some())),
        };
        let seed = match &kernel_cache {
            Some(cache) => Some((cache.clone(), self.cache_source(spec.telo.as_deref()).await)),
            None => None,
        };
        if let Err(err) = self.stage(bundle, &work, seed).await {
            work.discard();
            return Err(err);
        }
        let program = PathBuf::from(&argv[0]);
        let node = resolve_executable("node", &self.config.path);
        let mut programs = vec![program.as_path()];
        let mut read_only = Vec::new();
        let read_write = vec![work.root().to_owned()];
        if kernel_cache.is_some() {
            // The kernel runs `node` from its PATH (the Telo CLI is a Node.js
            // program).
            programs.extend(node.as_deref());
        } else {
            // An operator's command may name files it runs or reads (a
            // script, a manifest): those files, exactly, are shown too
            // (never a directory: `ls /` must not show the host's root).
            read_only.extend(
                argv.iter()
                    .skip(1)
                    .map(Path::new)
                    .filter(|arg| arg.is_absolute() && arg.is_file())
                    .map(Path::to_path_buf),
            );
        }
        let plan = LaunchPlan {
            argv,
            cwd: work.app(),
            env: workload_env(
                &spec.env,
                &work.home(),
                &self.config.path,
                kernel_cache.as_ref(),
            ),
        };
        let spawn = match self.spawn_plan(
            plan,
            sandbox.as_deref(),
            &programs,
            &read_only,
            &read_write,
            kernel_cache.as_ref().map(SessionCache::host_dir),
        ) {
            Ok(spawn) => spawn,
            Err(err) => {
                work.discard();
                return Err(err);
            }
        };
        let members = spawn.members;
        let launched = on_spawner_thread(move || spawn_in_pty(spawn).map(Started::from))
            .await
            .map_err(|err| crate::process::pty::PtyError::Spawn(err.to_string()))
            .flatten()
            .map_err(|err| {
                let program = match &spec.app {
                    Some(app) => app.command.as_ref().and_then(|c| c.first()).cloned(),
                    None => Some(self.config.telo.clone()),
                };
                let message = format!("could not start '{}': {err}", program.unwrap_or_default());
                StartError::new(StartStage::Start, message).with_source(err)
            });
        let process = match launched {
            Ok(process) => process,
            Err(err) => {
                work.discard();
                return Err(err);
            }
        };
        let (session, run_end) = match wire_session(
            &spec,
            process,
            members,
            &sink,
            self.config.max_ttl,
            self.config.stop_grace,
            crate::disk_bound::DiskBound {
                dir: work.root().to_owned(),
                max_bytes: self.config.limits.disk_bytes,
            },
        ) {
            Ok(wired) => wired,
            Err(err) => {
                work.discard();
                return Err(err);
            }
        };
        info!(session_id = %spec.session_id, dir = %work.root().display(), "session process started");

        sink.status(RunStatus::running_unrouted(spec.ports.iter()));
        // Only now: the terminal status must never overtake `running`.
        // The directory goes as soon as the session has ended: its output
        // lives in the registry's memory, and a finished session's files
        // kept for the exit TTL were disk a tenant could fill and leave.
        let finished = work.clone();
        self.tasks.spawn(
            async move {
                follow_run_to_end(run_end).await;
                finished.discard();
            }
            .instrument(Span::current()),
        );

        Observer {
            tasks: &self.tasks,
            http: &self.http,
            sink: &sink,
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            stop: &sink.ended(),
        }
        .run_session(
            spec.tcp_ports(),
            inspect_port.map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
        );
        Ok(session)
    }

    fn offers_watch(&self) -> bool {
        true
    }

    fn offers_agents(&self) -> bool {
        true
    }

    fn offers_telo_versions(&self) -> bool {
        self.config.telo_versions.is_some()
    }

    fn supply_telo(
        &self,
        version: &TeloVersion,
        _mode: SessionMode,
    ) -> Result<(), TeloUnavailable> {
        match &self.config.telo_versions {
            Some(dir) => crate::kernel::versions::supply(dir, version).map(drop),
            None => Err(TeloUnavailable::OnlyConfiguredKernel),
        }
    }

    async fn start_watch(
        &self,
        spec: WatchSpec,
        start: WatchStart,
        sink: SessionSink,
    ) -> Result<Arc<dyn WatchWorkload>, StartError> {
        let telo = self.kernel_for(None)?;
        for app in &spec.apps {
            self.kernel_for(app.telo.as_deref())?;
        }
        let sandbox = match self.sandbox.health().await {
            SandboxHealth::Unusable(problem) => {
                return Err(StartError::new(StartStage::Start, problem.sentence()));
            }
            SandboxHealth::Off => None,
            SandboxHealth::Usable(sandbox) => Some(sandbox),
        };
        if spec.apps.iter().any(|app| app.telo.is_none())
            && let KernelHealth::Unusable(problem) = self.kernel.health().await
        {
            return Err(StartError::new(StartStage::Start, problem.sentence()));
        }
        if let Some(version) = self.kernel.version().await {
            for app in spec.apps.iter().filter(|app| app.telo.is_none()) {
                sink.kernel_version(Some(&app.name), version.clone());
            }
        }
        let launcher = crate::watch::Launcher {
            telo,
            telo_versions: self.config.telo_versions.clone(),
            node: resolve_executable("node", &self.config.path),
            path: self.config.path.clone(),
            kernel_cache: self.cache_source(None).await,
            sandbox,
            stop_grace: self.config.stop_grace,
            http: self.http.clone(),
            tasks: self.tasks.clone(),
            limits: self.config.workspace,
            disk_bytes: self.config.limits.disk_bytes,
        };
        let watch =
            crate::watch::start(launcher, self.config.work_root.clone(), spec, start, sink).await?;
        Ok(watch)
    }

    async fn has_checkpoint(&self, session_id: &str) -> bool {
        crate::watch::record::has_checkpoint(&self.config.work_root, session_id)
    }

    async fn recover_suspended(&self, held: HeldSessions) -> Vec<SuspendedSession> {
        let root = self.config.work_root.clone();
        tokio::task::spawn_blocking(move || crate::watch::record::kept_sessions(&root, &held))
            .await
            .unwrap_or_default()
    }

    fn release(&self, session_id: &str) {
        if let Ok(work) = WorkDir::for_session(&self.config.work_root, session_id) {
            work.discard();
        }
    }

    async fn shutdown(&self) {
        self.tasks.shutdown(TASKS_SHUTDOWN_BOUND).await;
        self.kernel.shutdown(TASKS_SHUTDOWN_BOUND).await;
        self.kernel_cache.shutdown(TASKS_SHUTDOWN_BOUND).await;
    }
}

/// How long shutdown waits for the backend's tasks once they are told to
/// stop (the sessions have ended by then; a kernel check may still run).
const TASKS_SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// Starts the threads of a freshly spawned process and prepares its
/// end task. On failure the process group is killed.
fn wire_session(
    spec: &StartSpec,
    process: Started,
    members: Members,
    sink: &SessionSink,
    max_ttl: Duration,
    stop_grace: Duration,
    disk: crate::disk_bound::DiskBound,
) -> Result<(Arc<dyn BackendSession>, RunEnd), StartError> {
    let output_sink = sink.clone();
    let wired = wire_process(
        &spec.session_id,
        process,
        members,
        move |_, bytes| output_sink.output(bytes),
        stop_grace,
    )?;
    let run_end = RunEnd {
        session: wired.session.clone(),
        sink: sink.clone(),
        exited: wired.exited,
        output_drained: wired.output_drained,
        max_ttl,
        disk: Some(disk),
    };
    Ok((wired.session, run_end))
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
