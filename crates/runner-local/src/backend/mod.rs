//! The local backend: every session is the Telo CLI (or an operator app's
//! command) running as a local process in its own PTY, in its own directory
//! and — unless the operator opted out — its own sandbox, with nothing of
//! the runner's environment but a `PATH`. `run_session` starts a run
//! session; watch sessions are `watch`'s.

mod run_session;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runner_api::telo::TeloVersion;
use runner_api::watch::IoMode;
use runner_api::watch::SessionMode;
use runner_core::backend::SessionResources;
use runner_core::capabilities::{SchemaOptions, session_config_schema};
use runner_core::tasks::OwnedTasks;
use runner_core::types::{AvailabilityReport, PullPolicy};
use runner_core::{
    Backend, BackendCapabilities, BackendFeatures, BackendSession, HeldSessions, ProbeConfig,
    Readiness, SessionSink, StartError, StartSpec, StartStage, SuspendedSession, TeloUnavailable,
    TeloVersions, WatchSessions, WatchSpec, WatchStart, WatchWorkload,
};
use tracing::{error, info, warn};

use crate::config::{LocalConfig, SandboxConfig};
use crate::kernel::cache_warm_up::{CacheSource, KernelCacheWarmer, WarmUpError};
use crate::kernel::check::TELO_NOT_FOUND_REMEDIATION;
use crate::kernel::monitor::{KernelHealth, KernelMonitor};
use crate::kernel_cache::{CacheKey, KernelIdentity, SEED_SHARE_OF_DISK_BOUND, SharedKernelCache};
use crate::process::executable::resolve_executable;
use crate::sandbox::check::{SandboxHealth, SandboxMonitor};
use crate::work_root::lock::{WorkRootLock, WorkRootLockError};
use crate::work_root::session_dir::{WorkDir, sweep_work_root};

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
    #[error(transparent)]
    WorkRoot(#[from] WorkRootLockError),
    #[error(transparent)]
    Network(#[from] crate::network::NetworkError),
}

pub struct LocalBackend {
    config: LocalConfig,
    kernel: Arc<KernelMonitor>,
    sandbox: Arc<SandboxMonitor>,
    /// Each session's network.
    networks: Arc<crate::network::Networks>,
    /// The warmed caches sessions' kernels start from.
    kernel_cache: KernelCacheWarmer,
    /// Every session's end task, reachability probe and debug relay.
    tasks: OwnedTasks,
    _work_root: WorkRootLock,
}

impl LocalBackend {
    pub fn new(config: LocalConfig) -> Result<Self, LocalBackendError> {
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
        let networks = Arc::new(crate::network::Networks::new(
            &config.network,
            tasks.clone(),
        )?);
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
            kernel,
            sandbox,
            networks,
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
}

#[async_trait]
impl Backend for LocalBackend {
    /// A watch session's links beside its record; a run session ends with
    /// this process, and its links with it.
    async fn keep_links(
        &self,
        session_id: &str,
        mode: SessionMode,
        links: &[runner_core::backend::KeptLink],
    ) -> Result<(), String> {
        if mode != SessionMode::Watch {
            return Ok(());
        }
        let root = self.config.work_root.clone();
        let id = session_id.to_owned();
        let links = links.to_vec();
        tokio::task::spawn_blocking(move || crate::watch::record::write_links(&root, &id, &links))
            .await
            .map_err(|err| err.to_string())?
            .map_err(|err| format!("could not write the session's links file: {err}"))
    }

    fn session_resources(&self, _kind: runner_core::backend::SessionKind) -> SessionResources {
        let limits = &self.config.limits;
        SessionResources {
            cpu_millis: limits.cpu_millis,
            memory_bytes: limits.memory_bytes,
        }
    }

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
            features: BackendFeatures {
                io: vec![IoMode::Tty, IoMode::Streams],
                ports: true,
            },
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
        spec: StartSpec,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        self.start_run(spec, sink).await
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
        self.networks.close();
    }

    fn telo_versions(&self) -> Option<&dyn TeloVersions> {
        self.config
            .telo_versions
            .as_ref()
            .map(|_| self as &dyn TeloVersions)
    }

    fn watch_sessions(&self) -> Option<&dyn WatchSessions> {
        Some(self)
    }
}

impl TeloVersions for LocalBackend {
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
}

#[async_trait]
impl WatchSessions for LocalBackend {
    fn offers_agents(&self) -> bool {
        true
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
            networks: self.networks.clone(),
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
}

/// How long shutdown waits for the backend's tasks once they are told to
/// stop (the sessions have ended by then; a kernel check may still run).
const TASKS_SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
