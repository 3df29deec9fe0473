//! Filling the shared cache: the kernel run, in a sandbox of its own, on
//! the operator's warm-up manifest, into a fresh directory that becomes the
//! entry only once the kernel exited 0.
//!
//! A warm-up runs once per `CacheKey`: for the configured kernel after
//! its boot self-check passed, for a kernel chosen by version when a
//! session first needs it. Never while a session waits: a session that
//! starts before its entry is ready starts cold and the warm-up goes on in
//! the background. One warm-up runs at a time (each is a kernel start, and
//! a cold one installs npm packages); callers that want the same key wait
//! for the same run. A failed one is not tried again for
//! [`RETRY_FAILED_AFTER`].
//!
//! What the warm-up leaves is in no session's sandbox: sessions get copies
//! (see `kernel_cache`). Its own sandbox shows it its scratch `app` and
//! `home` and, at `KERNEL_CACHE_MOUNT` like a session, the directory it
//! fills.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner_core::sync::lock;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::kernel_cache::{
    CacheKey, EntryLease, KernelIdentity, Seeded, SessionCache, SharedKernelCache,
};
use crate::launch::{LaunchPlan, telo_argv, workload_env};
use crate::process::check_run::{CheckEnd, last_error_line, run_check};
use crate::process::executable::resolve_executable;
use crate::sandbox::bubblewrap::{SessionMounts, WorkloadSession};
use crate::sandbox::check::{SandboxHealth, SandboxMonitor};

/// The entry the warm-up's kernel runs, in its scratch app directory.
pub const WARM_UP_ENTRY: &str = "telo.yaml";
/// A warm-up that installs npm packages takes seconds; this bounds a hung
/// one (or a manifest that serves instead of exiting).
pub const WARM_UP_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a failed warm-up's verdict stands before a session's start
/// tries again.
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(300);
/// The largest warm-up manifest read.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WarmUpError {
    #[error("no warm-up manifest is configured (RUNNER_LOCAL_KERNEL_CACHE_WARM_UP)")]
    NotConfigured,
    #[error("the Telo CLI has not passed its self-check")]
    KernelUnusable,
    #[error("this runner has no telo {0}")]
    NoSuchKernel(String),
    #[error("the warm-up cannot be sandboxed: {0}")]
    Sandbox(String),
    #[error("could not prepare the warm-up: {0}")]
    Prepare(String),
    #[error("the warm-up's kernel could not be started: {0}")]
    Spawn(String),
    #[error("the warm-up's kernel exited with code {code}: {line}")]
    Failed { code: i64, line: String },
    #[error("the warm-up did not finish within {} s", .0.as_secs())]
    TimedOut(Duration),
    #[error("{0}")]
    Keep(String),
    #[error("the runner is shutting down")]
    ShuttingDown,
}

/// The manifest every kernel's cache is warmed with, read once at boot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WarmUpManifest {
    path: PathBuf,
    contents: Vec<u8>,
}

enum KeyState {
    /// Running; the outcome arrives on the channel.
    Warming(watch::Receiver<Option<Result<(), WarmUpError>>>),
    Failed {
        at: Instant,
        error: WarmUpError,
    },
}

struct Inner {
    store: Arc<SharedKernelCache>,
    manifest: Option<WarmUpManifest>,
    sandbox: Arc<SandboxMonitor>,
    /// The workload `PATH` (where the warm-up's `node` is found).
    path: String,
    states: Mutex<HashMap<CacheKey, KeyState>>,
    one_at_a_time: Semaphore,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

/// Runs warm-ups and knows which key each kernel's sessions start from.
#[derive(Clone)]
pub struct KernelCacheWarmer {
    inner: Arc<Inner>,
    /// Ends every warm-up (and kills its kernel) with the last handle.
    _stop: Arc<DropGuard>,
}

/// What a session's cache is filled from: the warmer, the kernel it runs,
/// and the most of its disk bound a copy may take.
#[derive(Clone)]
pub struct CacheSource {
    pub warmer: KernelCacheWarmer,
    /// `None`: the kernel is not known well enough to name its cache (a
    /// kernel the self-check has not passed yet): the session starts cold.
    pub kernel: Option<KernelIdentity>,
    pub budget: u64,
}

impl CacheSource {
    /// Fills `cache` from this kernel's entry, or leaves it empty. Blocking
    /// file work: call it off the async runtime.
    pub fn prepare(&self, cache: &SessionCache) -> std::io::Result<Seeded> {
        let lease: Option<EntryLease> = self
            .kernel
            .as_ref()
            .and_then(|kernel| self.warmer.key_for(kernel))
            .and_then(|key| self.warmer.store().lease(&key));
        cache.prepare(lease.as_ref(), self.budget)
    }

    /// After [`CacheSource::prepare`]: a session that started cold starts
    /// the warm-up later ones will find (in the background).
    pub fn after_prepare(&self, seeded: &Seeded) {
        match seeded {
            Seeded::Cold => {
                if let Some(kernel) = &self.kernel {
                    self.warmer.warm_in_background(kernel.clone());
                }
            }
            Seeded::Refused(err) => {
                warn!(reason = %err, "the session starts with an empty kernel cache: its warmed cache was not copied");
            }
            Seeded::Warm(_) | Seeded::Kept => {}
        }
    }
}

impl KernelCacheWarmer {
    /// Reads the warm-up manifest (`None`: none configured). One that
    /// cannot be read turns warm-ups off, said at boot.
    pub fn new(
        store: Arc<SharedKernelCache>,
        warm_up: Option<&Path>,
        sandbox: Arc<SandboxMonitor>,
        path: &str,
    ) -> Self {
        let manifest = warm_up.and_then(|path| match read_manifest(path) {
            Ok(contents) => Some(WarmUpManifest {
                path: path.to_owned(),
                contents,
            }),
            Err(err) => {
                warn!(manifest = %path.display(), error = %err, "the kernel cache warm-up manifest (RUNNER_LOCAL_KERNEL_CACHE_WARM_UP) cannot be read: every session's kernel starts with an empty cache");
                None
            }
        });
        let shutdown = CancellationToken::new();
        Self {
            inner: Arc::new(Inner {
                store,
                manifest,
                sandbox,
                path: path.to_owned(),
                states: Mutex::new(HashMap::new()),
                one_at_a_time: Semaphore::new(1),
                tasks: TaskTracker::new(),
                shutdown: shutdown.clone(),
            }),
            _stop: Arc::new(shutdown.drop_guard()),
        }
    }

    pub fn store(&self) -> &Arc<SharedKernelCache> {
        &self.inner.store
    }

    /// The entry `kernel`'s sessions start from; `None` without a warm-up
    /// manifest.
    pub fn key_for(&self, kernel: &KernelIdentity) -> Option<CacheKey> {
        let manifest = self.inner.manifest.as_ref()?;
        Some(CacheKey::derive(kernel, &manifest.contents))
    }

    /// Starts warming `kernel`'s cache unless it is ready, being warmed, or
    /// failed recently; returns at once. Without a Tokio runtime, nothing.
    pub fn warm_in_background(&self, kernel: KernelIdentity) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // The outcome is logged by the warm-up itself.
        drop(self.start(kernel));
    }

    /// Warms `kernel`'s cache unless it is ready, and waits for it. A
    /// warm-up that failed less than [`RETRY_FAILED_AFTER`] ago is not run
    /// again: its error is returned.
    pub async fn warm(&self, kernel: KernelIdentity) -> Result<CacheKey, WarmUpError> {
        let (key, outcome) = self.start(kernel)?;
        if let Some(mut outcome) = outcome {
            let done = outcome
                .wait_for(Option::is_some)
                .await
                .map_err(|_| WarmUpError::ShuttingDown)?;
            if let Some(Err(err)) = done.as_ref() {
                return Err(err.clone());
            }
        }
        Ok(key)
    }

    /// Ends every warm-up and waits for their tasks, at most `bound`.
    pub async fn shutdown(&self, bound: Duration) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        if tokio::time::timeout(bound, self.inner.tasks.wait())
            .await
            .is_err()
        {
            warn!("a kernel cache warm-up was still running after shutdown");
        }
    }

    /// The key, and the channel of the run to wait for (`None`: ready).
    #[allow(clippy::type_complexity)]
    fn start(
        &self,
        kernel: KernelIdentity,
    ) -> Result<
        (
            CacheKey,
            Option<watch::Receiver<Option<Result<(), WarmUpError>>>>,
        ),
        WarmUpError,
    > {
        let key = self.key_for(&kernel).ok_or(WarmUpError::NotConfigured)?;
        let mut states = lock(&self.inner.states);
        match states.get(&key) {
            Some(KeyState::Warming(outcome)) => return Ok((key, Some(outcome.clone()))),
            Some(KeyState::Failed { at, error }) if at.elapsed() < RETRY_FAILED_AFTER => {
                return Err(error.clone());
            }
            _ => {}
        }
        if self.inner.store.entry_dir(&key).is_dir() {
            return Ok((key, None));
        }
        let (report, outcome) = watch::channel(None);
        states.insert(key.clone(), KeyState::Warming(outcome.clone()));
        drop(states);
        let inner = self.inner.clone();
        let warming = key.clone();
        self.inner.tasks.spawn(async move {
            let result = tokio::select! {
                biased;
                () = inner.shutdown.cancelled() => Err(WarmUpError::ShuttingDown),
                result = inner.warm_up(&warming, &kernel) => result,
            };
            let mut states = lock(&inner.states);
            match &result {
                Ok(()) => {
                    states.remove(&warming);
                }
                Err(error) => {
                    states.insert(
                        warming,
                        KeyState::Failed {
                            at: Instant::now(),
                            error: error.clone(),
                        },
                    );
                }
            }
            drop(states);
            let _ = report.send(Some(result));
        });
        Ok((key, Some(outcome)))
    }
}

impl Inner {
    async fn warm_up(&self, key: &CacheKey, kernel: &KernelIdentity) -> Result<(), WarmUpError> {
        let _turn = self
            .one_at_a_time
            .acquire()
            .await
            .map_err(|_| WarmUpError::ShuttingDown)?;
        let manifest = self.manifest.as_ref().ok_or(WarmUpError::NotConfigured)?;
        let started = std::time::Instant::now();
        let build = self.store.warming_dir(key);
        let result = self.run_in(&build, key, kernel, manifest).await;
        let cleanup = build.clone();
        // What the warm-up's scratch held besides the cache (and the cache
        // itself when it failed) goes; a crash leaves it to the boot sweep.
        let _ =
            tokio::task::spawn_blocking(move || crate::kernel_cache::remove_tree(&cleanup)).await;
        match &result {
            Ok(bytes) => info!(
                entry = %key,
                kernel = %kernel.telo.display(),
                manifest = %manifest.path.display(),
                bytes,
                elapsed_ms = started.elapsed().as_millis(),
                "warmed the kernel cache sessions start from"
            ),
            Err(err) => warn!(
                entry = %key,
                kernel = %kernel.telo.display(),
                manifest = %manifest.path.display(),
                error = %err,
                "the kernel cache warm-up failed; sessions of this kernel start with an empty cache"
            ),
        }
        result.map(drop)
    }

    /// Runs the warm-up in `build` and makes its cache the entry.
    async fn run_in(
        &self,
        build: &Path,
        key: &CacheKey,
        kernel: &KernelIdentity,
        manifest: &WarmUpManifest,
    ) -> Result<u64, WarmUpError> {
        let sandbox = match self.sandbox.health().await {
            SandboxHealth::Unusable(problem) => return Err(WarmUpError::Sandbox(problem.message)),
            SandboxHealth::Off => None,
            SandboxHealth::Usable(sandbox) => Some(sandbox),
        };
        let scratch = Scratch::new(build, sandbox.is_some());
        let prepared = {
            let scratch = scratch.clone();
            let contents = manifest.contents.clone();
            tokio::task::spawn_blocking(move || scratch.create(&contents)).await
        };
        match prepared {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(WarmUpError::Prepare(err.to_string())),
            Err(join) => return Err(WarmUpError::Prepare(join.to_string())),
        }
        let plan = LaunchPlan {
            argv: telo_argv(&kernel.telo, WARM_UP_ENTRY, None),
            cwd: scratch.app(),
            env: workload_env(&[], &scratch.home(), &self.path, Some(&scratch.cache)),
        };
        let spawn = match &sandbox {
            None => plan.unsandboxed(),
            Some(sandbox) => {
                let node = resolve_executable("node", &self.path);
                let programs: Vec<&Path> = std::iter::once(kernel.telo.as_path())
                    .chain(node.as_deref())
                    .collect();
                let read_only = sandbox.installations(&programs);
                let read_write = [scratch.app(), scratch.home()];
                sandbox
                    .spawn_plan(
                        plan,
                        SessionMounts {
                            read_only: &read_only,
                            read_write: &read_write,
                            kernel_cache: Some(scratch.cache.host_dir()),
                        },
                        WorkloadSession::Shared,
                    )
                    .map_err(|err| WarmUpError::Sandbox(err.to_string()))?
            }
        };
        let run = run_check(spawn, WARM_UP_TIMEOUT).await;
        match run.end {
            CheckEnd::Exited(0) => {}
            CheckEnd::Exited(code) => {
                return Err(WarmUpError::Failed {
                    code,
                    line: last_error_line(&run.output)
                        .unwrap_or_else(|| "it printed nothing".to_owned()),
                });
            }
            CheckEnd::TimedOut(after) => return Err(WarmUpError::TimedOut(after)),
            CheckEnd::SpawnFailed(err) => return Err(WarmUpError::Spawn(err)),
        }
        let store = self.store.clone();
        let built = scratch.cache.host_dir().to_owned();
        let key = key.clone();
        tokio::task::spawn_blocking(move || store.promote(&built, &key))
            .await
            .map_err(|join| WarmUpError::Keep(join.to_string()))?
            .map_err(|err| WarmUpError::Keep(runner_core::errors::error_chain(&err)))
    }
}

/// A warm-up's directory: `app` (the manifest), `home`, and `cache` (what
/// becomes the entry).
#[derive(Debug, Clone)]
struct Scratch {
    root: PathBuf,
    cache: SessionCache,
}

impl Scratch {
    fn new(root: &Path, sandboxed: bool) -> Self {
        Self {
            root: root.to_owned(),
            cache: SessionCache::new(root.join("cache"), sandboxed),
        }
    }

    fn app(&self) -> PathBuf {
        self.root.join("app")
    }

    fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    fn create(&self, manifest: &[u8]) -> std::io::Result<()> {
        for dir in [self.app(), self.home()] {
            crate::kernel_cache::create_private_dir(&dir)?;
        }
        self.cache.prepare(None, 0)?;
        std::fs::write(self.app().join(WARM_UP_ENTRY), manifest)
    }
}

fn read_manifest(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut contents = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut contents)?;
    if contents.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(std::io::Error::other(format!(
            "it is larger than {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    Ok(contents)
}
