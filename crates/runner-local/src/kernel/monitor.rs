//! What the runner knows about its kernel: the last self-check's verdict,
//! kept per [`KernelFingerprint`], so the check runs once at boot and again
//! only when the Telo CLI or the `node` on the workload `PATH` changed —
//! or, for a failed check, once [`RECHECK_FAILED_AFTER`] has passed, so a
//! failure that was the machine's and not the kernel's (a check that timed
//! out under load, a full disk) does not refuse sessions until a restart.
//! Callers that arrive while a check runs wait for that one check, a
//! session's start included (a kernel that fails its check fails the start
//! saying why). The boot check takes as long as a kernel start (about a
//! second), so the runner is not ready until it has a verdict
//! ([`KernelMonitor::boot_check_pending`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::kernel::check::{
    KernelProblem, SELF_CHECK_ENTRY, SELF_CHECK_MANIFEST, SELF_CHECK_TIMEOUT,
    TELO_NOT_FOUND_REMEDIATION, diagnose, needs_newer_node, node_version, telo_version,
};
use crate::kernel::fingerprint::KernelFingerprint;
use crate::kernel_cache::{KernelIdentity, SessionCache};
use crate::launch::{LaunchPlan, telo_argv, workload_env};
use crate::process::check_run::{CheckEnd, RECHECK_FAILED_AFTER, run_check};
use crate::sandbox::bubblewrap::SessionMounts;
use crate::sandbox::check::{SandboxHealth, SandboxMonitor};

/// The check's scratch directory under the work root: a fixed name (so a
/// check interrupted by a crash leaves nothing behind the next one does not
/// remove) that can never be a session id.
pub const KERNEL_CHECK_DIR_NAME: &str = ".kernel-check";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelHealth {
    /// The Telo CLI was not found.
    Missing,
    Usable,
    Unusable(KernelProblem),
    /// The check could not be run (its scratch directory could not be made).
    /// Not remembered: the next probe or start tries again.
    Unchecked(String),
}

#[derive(Debug, thiserror::Error)]
enum ScratchError {
    #[error("could not prepare the self-check directory '{}'", path.display())]
    Prepare {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

struct Verdict {
    fingerprint: KernelFingerprint,
    health: KernelHealth,
    checked_at: Instant,
    /// What `telo --version` printed, for a usable kernel that says.
    version: Option<String>,
}

impl Verdict {
    /// Whether this verdict still answers for the kernel `now` looks like.
    fn holds_for(&self, fingerprint: &KernelFingerprint, now: Instant) -> bool {
        self.fingerprint == *fingerprint
            && (self.health == KernelHealth::Usable
                || now.saturating_duration_since(self.checked_at) < RECHECK_FAILED_AFTER)
    }
}

struct Inner {
    telo: String,
    path: String,
    work_root: PathBuf,
    /// The check runs in the sandbox sessions run in.
    sandbox: Arc<SandboxMonitor>,
    /// Held for the whole of a check: the single flight.
    verdict: Arc<Mutex<Option<Verdict>>>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// Set while the boot check has not reached a verdict.
    boot_check_pending: AtomicBool,
}

pub struct KernelMonitor {
    inner: Arc<Inner>,
    /// Ends a running check (and kills its processes) with the monitor.
    _stop_checks: DropGuard,
}

impl KernelMonitor {
    pub fn new(telo: &str, path: &str, work_root: &Path, sandbox: Arc<SandboxMonitor>) -> Self {
        let shutdown = CancellationToken::new();
        Self {
            inner: Arc::new(Inner {
                telo: telo.to_owned(),
                path: path.to_owned(),
                work_root: work_root.to_owned(),
                sandbox,
                verdict: Arc::new(Mutex::new(None)),
                tasks: TaskTracker::new(),
                shutdown: shutdown.clone(),
                boot_check_pending: AtomicBool::new(false),
            }),
            _stop_checks: shutdown.drop_guard(),
        }
    }

    /// Ends a running check and waits for its task, at most `bound`.
    pub async fn shutdown(&self, bound: std::time::Duration) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        if tokio::time::timeout(bound, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("the kernel check was still running after shutdown");
        }
    }

    /// Starts the boot check in the background, so the first probe or start
    /// finds the verdict ready (or waits for this check rather than starting
    /// another). Without a Tokio runtime nothing starts, and the first
    /// caller of [`KernelMonitor::health`] runs the check.
    pub fn spawn_boot_check(&self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let inner = self.inner.clone();
        inner.boot_check_pending.store(true, Ordering::SeqCst);
        self.inner.tasks.spawn(async move {
            let health = tokio::select! {
                biased;
                () = inner.shutdown.cancelled() => return,
                health = inner.health() => health,
            };
            inner.boot_check_pending.store(false, Ordering::SeqCst);
            // The first run must not be the first place a broken kernel
            // shows: say so at boot, with what to do.
            match &health {
                KernelHealth::Missing => warn!(
                    telo = %inner.telo,
                    "the Telo CLI '{}' was not found; Telo sessions will fail until it is there. {TELO_NOT_FOUND_REMEDIATION}",
                    inner.telo
                ),
                KernelHealth::Unusable(problem) => warn!(
                    telo = %inner.telo,
                    "Telo sessions will fail: {}",
                    problem.sentence()
                ),
                KernelHealth::Usable | KernelHealth::Unchecked(_) => {}
            }
        });
    }

    /// The kernel's health now: the remembered verdict while the kernel's
    /// fingerprint is unchanged, else a fresh self-check's.
    pub async fn health(&self) -> KernelHealth {
        self.inner.health().await
    }

    /// Whether the boot check has yet to reach its verdict.
    pub fn boot_check_pending(&self) -> bool {
        self.inner.boot_check_pending.load(Ordering::SeqCst)
    }

    /// The release the kernel said it is at its last self-check (`telo
    /// --version`), if it is usable and said one.
    pub async fn version(&self) -> Option<String> {
        self.inner.verdict.lock().await.as_ref()?.version.clone()
    }

    /// The kernel as its cache knows it, if its last self-check passed.
    pub async fn identity(&self) -> Option<KernelIdentity> {
        let verdict = self.inner.verdict.lock().await;
        let verdict = verdict
            .as_ref()
            .filter(|verdict| verdict.health == KernelHealth::Usable)?;
        let stamp = verdict.fingerprint.telo.clone()?;
        Some(KernelIdentity {
            telo: stamp.path.clone(),
            version: verdict.version.clone(),
            stamp: verdict.version.is_none().then_some(stamp),
        })
    }
}

impl Inner {
    async fn health(self: &Arc<Self>) -> KernelHealth {
        let fingerprint = KernelFingerprint::take(&self.telo, &self.path);
        if fingerprint.telo.is_none() {
            return KernelHealth::Missing;
        }
        let verdict = self.verdict.clone().lock_owned().await;
        if let Some(known) = verdict.as_ref()
            && known.holds_for(&fingerprint, Instant::now())
        {
            return known.health.clone();
        }
        // The check runs in a task of its own holding the lock, so a caller
        // that gives up (a probe whose client went away) neither cancels it
        // nor loses its verdict for the callers waiting behind it.
        let inner = self.clone();
        let check = self.tasks.spawn(async move {
            let mut verdict = verdict;
            let health = tokio::select! {
                biased;
                () = inner.shutdown.cancelled() => {
                    return KernelHealth::Unchecked("the runner is shutting down".to_owned());
                }
                health = inner.check(&fingerprint) => health,
            };
            let version = match (&health, fingerprint.telo_path()) {
                (KernelHealth::Usable, Some(telo)) => telo_version(telo, &inner.path).await,
                _ => None,
            };
            if !matches!(health, KernelHealth::Unchecked(_)) {
                *verdict = Some(Verdict {
                    fingerprint,
                    health: health.clone(),
                    checked_at: Instant::now(),
                    version,
                });
            }
            health
        });
        check.await.unwrap_or_else(|err| {
            KernelHealth::Unchecked(format!("the Telo CLI self-check was lost: {err}"))
        })
    }

    async fn check(&self, fingerprint: &KernelFingerprint) -> KernelHealth {
        let Some(telo) = fingerprint.telo_path() else {
            return KernelHealth::Missing;
        };
        let scratch = self.work_root.join(KERNEL_CHECK_DIR_NAME);
        let sandbox = match self.sandbox.health().await {
            SandboxHealth::Off => None,
            SandboxHealth::Usable(sandbox) => Some(sandbox),
            // Sessions cannot start either; the probe and every start say why.
            SandboxHealth::Unusable(problem) => {
                return KernelHealth::Unchecked(problem.message);
            }
        };
        // A cache of its own, gone with the scratch directory: the check
        // writes nothing any session or warm-up reads.
        let cache = SessionCache::new(scratch.join("cache"), sandbox.is_some());
        let plan = match self.prepare(&scratch, &cache, telo) {
            Ok(plan) => plan,
            Err(err) => {
                warn!(error = ?err, "could not run the Telo CLI self-check");
                // The path stays in the log: this text reaches clients.
                let cause = std::error::Error::source(&err)
                    .map_or_else(|| err.to_string(), ToString::to_string);
                return KernelHealth::Unchecked(format!(
                    "The runner could not prepare the Telo CLI self-check in its work directory: {cause}."
                ));
            }
        };
        let spawn = match sandbox {
            None => plan.unsandboxed(),
            Some(sandbox) => {
                let programs: Vec<&Path> = std::iter::once(telo)
                    .chain(fingerprint.node_path())
                    .collect();
                let read_only = sandbox.installations(&programs);
                let read_write = [scratch.join("app"), scratch.join("home")];
                match sandbox.spawn_plan(
                    plan,
                    SessionMounts {
                        read_only: &read_only,
                        read_write: &read_write,
                        kernel_cache: Some(cache.host_dir()),
                    },
                    crate::sandbox::bubblewrap::WorkloadSession::Shared,
                ) {
                    Ok(spawn) => spawn,
                    Err(err) => {
                        remove_scratch(&scratch);
                        return KernelHealth::Unchecked(format!(
                            "The runner could not hand the Telo CLI self-check its sandbox: {err}."
                        ));
                    }
                }
            }
        };
        let started = std::time::Instant::now();
        let run = run_check(spawn, SELF_CHECK_TIMEOUT).await;
        let node = match (&run.end, fingerprint.node_path()) {
            (CheckEnd::Exited(code), Some(node)) if *code != 0 && needs_newer_node(&run.output) => {
                node_version(node, &self.path).await
            }
            _ => None,
        };
        remove_scratch(&scratch);
        match diagnose(&run, &self.telo, node.as_deref()) {
            None => {
                info!(telo = %telo.display(), elapsed_ms = started.elapsed().as_millis(), "the Telo CLI passed its self-check");
                KernelHealth::Usable
            }
            Some(problem) => {
                warn!(
                    telo = %telo.display(),
                    cause = %problem.message,
                    remediation = %problem.remediation,
                    "the Telo CLI failed its self-check; sessions will fail until it is fixed"
                );
                KernelHealth::Unusable(problem)
            }
        }
    }

    /// A fresh scratch directory holding the check's application, and the
    /// launch a session of it would get: same command line shape, a scratch
    /// `HOME`, an empty kernel cache of its own, no session env.
    fn prepare(
        &self,
        scratch: &Path,
        cache: &SessionCache,
        telo: &Path,
    ) -> Result<LaunchPlan, ScratchError> {
        use std::os::unix::fs::DirBuilderExt;
        remove_scratch(scratch);
        let app = scratch.join("app");
        let home = scratch.join("home");
        let fail = |path: &Path| {
            let path = path.to_owned();
            move |source| ScratchError::Prepare { path, source }
        };
        for dir in [&app, &home] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(fail(dir))?;
        }
        cache.prepare(None, 0).map_err(fail(cache.host_dir()))?;
        let entry = app.join(SELF_CHECK_ENTRY);
        std::fs::write(&entry, SELF_CHECK_MANIFEST).map_err(fail(&entry))?;
        Ok(LaunchPlan {
            argv: telo_argv(telo, SELF_CHECK_ENTRY, None),
            cwd: app,
            env: workload_env(&[], &home, &self.path, Some(cache)),
        })
    }
}

fn remove_scratch(scratch: &Path) {
    match std::fs::remove_dir_all(scratch) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => {
            warn!(dir = %scratch.display(), error = %err, "could not remove the self-check directory");
        }
    }
}

impl std::fmt::Debug for KernelMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelMonitor")
            .field("telo", &self.inner.telo)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::executable::FileStamp;
    use std::time::Duration;

    fn fingerprint(inode: u64) -> KernelFingerprint {
        KernelFingerprint {
            telo: Some(FileStamp {
                path: PathBuf::from("/opt/telo"),
                len: 10,
                mtime: (1, 0),
                dev: 1,
                inode,
            }),
            node: None,
        }
    }

    fn verdict(health: KernelHealth, checked_at: Instant) -> Verdict {
        Verdict {
            fingerprint: fingerprint(1),
            health,
            checked_at,
            version: None,
        }
    }

    fn problem() -> KernelHealth {
        KernelHealth::Unusable(KernelProblem {
            message: "broken".to_owned(),
            remediation: "fix it".to_owned(),
        })
    }

    #[test]
    fn a_passed_check_holds_until_the_kernel_changes() {
        let then = Instant::now();
        let passed = verdict(KernelHealth::Usable, then);
        assert!(passed.holds_for(&fingerprint(1), then + Duration::from_secs(86_400)));
        assert!(!passed.holds_for(&fingerprint(2), then));
    }

    #[test]
    fn a_failed_check_is_repeated_after_a_while_or_when_the_kernel_changes() {
        let then = Instant::now();
        let failed = verdict(problem(), then);
        assert!(failed.holds_for(&fingerprint(1), then + RECHECK_FAILED_AFTER / 2));
        assert!(!failed.holds_for(&fingerprint(1), then + RECHECK_FAILED_AFTER));
        assert!(!failed.holds_for(&fingerprint(2), then));
    }
}
