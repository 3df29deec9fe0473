//! Whether sessions can be sandboxed on this host, found out the only
//! reliable way: by starting one sandbox, with every flag a session's has,
//! around `setsid true`.
//!
//! Finding `bwrap` is not enough: in a container without the right seccomp
//! or AppArmor profile, or on a kernel that refuses unprivileged user
//! namespaces, it fails every start (`bwrap: No permissions to create a new
//! namespace …`). A session then fails at once with that reason and what to
//! do about it, and the probe says the same — never a bare exit code, and
//! never a session run without the isolation the operator did not opt out
//! of.
//!
//! The verdict is kept while `bwrap` is unchanged; a failed one is checked
//! again after [`RECHECK_FAILED_AFTER`], like the kernel's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::launch::LaunchPlan;
use crate::process::check_run::{
    CheckEnd, CheckRun, RECHECK_FAILED_AFTER, last_error_line, run_check,
};
use crate::process::executable::FileStamp;
use crate::process::executable::resolve_executable;
use crate::sandbox::bubblewrap::{HostLayout, Sandbox, SandboxPrograms};
use crate::sandbox::cgroup::CgroupTree;
use crate::sandbox::limits::{RunnerLimits, SessionLimits};
use crate::sandbox::{BubblewrapConfig, SandboxConfig};

/// Where the programs run inside every sandbox are looked up: directories
/// every sandbox shows.
pub const SANDBOX_SYSTEM_PATH: &str = "/usr/bin:/bin";
/// The shell that opens the sandbox's arguments and becomes `bwrap`.
pub const HOST_SHELL: &str = "/bin/sh";
/// A sandbox starts in milliseconds; this only bounds a hung one.
pub const SANDBOX_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

const OPT_OUT: &str =
    "or set RUNNER_LOCAL_SANDBOX=none to run sessions without isolation from the runner.";

/// Why sessions cannot be sandboxed, in the probe's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxProblem {
    pub message: String,
    pub remediation: String,
}

impl SandboxProblem {
    /// Both, as one text for a session's start failure.
    pub fn sentence(&self) -> String {
        format!("{} {}", self.message, self.remediation)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxHealth {
    /// `RUNNER_LOCAL_SANDBOX=none`.
    Off,
    Usable(Arc<Sandbox>),
    Unusable(SandboxProblem),
}

/// `bwrap` was not found.
pub fn bwrap_missing(bwrap: &str) -> SandboxProblem {
    SandboxProblem {
        message: format!(
            "Sessions run in a bubblewrap sandbox, but '{bwrap}' was not found on this runner's host."
        ),
        remediation: format!(
            "Install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap), {OPT_OUT}"
        ),
    }
}

/// A program the sandbox runs inside was not found.
pub fn sandbox_program_missing(program: &str, package: &str) -> SandboxProblem {
    SandboxProblem {
        message: format!(
            "Sessions run in a bubblewrap sandbox that needs '{program}', which is in neither /usr/bin nor /bin on this runner's host."
        ),
        remediation: format!("Install {package}, {OPT_OUT}"),
    }
}

/// What the check's run says about the sandbox: `None` when it works.
pub fn diagnose(run: &CheckRun, bwrap: &Path) -> Option<SandboxProblem> {
    let bwrap = bwrap.display();
    let message = match &run.end {
        CheckEnd::Exited(0) => return None,
        CheckEnd::Exited(code) => match last_error_line(&run.output) {
            Some(line) => {
                format!(
                    "bubblewrap ('{bwrap}') cannot create a session sandbox on this host: {line}"
                )
            }
            None => format!(
                "bubblewrap ('{bwrap}') cannot create a session sandbox on this host: it exited with code {code} and printed nothing."
            ),
        },
        CheckEnd::TimedOut(after) => format!(
            "bubblewrap ('{bwrap}') did not start a session sandbox within {} s.",
            after.as_secs()
        ),
        CheckEnd::SpawnFailed(error) => {
            format!("bubblewrap ('{bwrap}') could not be started: {error}")
        }
    };
    Some(SandboxProblem {
        message: with_period(message),
        remediation: format!(
            "Let the runner create user, PID and mount namespaces (the kernel must allow unprivileged user namespaces: sysctl user.max_user_namespaces above 0, and kernel.unprivileged_userns_clone=1 where it exists; in a container, a seccomp and AppArmor profile that permits them), {OPT_OUT}"
        ),
    })
}

fn with_period(text: String) -> String {
    if text.ends_with(['.', '!', '?']) {
        text
    } else {
        format!("{text}.")
    }
}

struct Verdict {
    bwrap: Option<FileStamp>,
    health: SandboxHealth,
    checked_at: Instant,
}

impl Verdict {
    fn holds_for(&self, bwrap: &Option<FileStamp>, now: Instant) -> bool {
        self.bwrap == *bwrap
            && (matches!(self.health, SandboxHealth::Usable(_))
                || now.saturating_duration_since(self.checked_at) < RECHECK_FAILED_AFTER)
    }
}

pub struct SandboxMonitor {
    config: SandboxConfig,
    work_root: PathBuf,
    limits: SessionLimits,
    cgroups: Option<Arc<CgroupTree>>,
    /// Held for the whole of a check: the single flight.
    verdict: Mutex<Option<Verdict>>,
}

impl SandboxMonitor {
    pub fn new(
        config: SandboxConfig,
        work_root: &Path,
        limits: SessionLimits,
        cgroups: Option<Arc<CgroupTree>>,
    ) -> Self {
        Self {
            config,
            work_root: work_root.to_owned(),
            limits,
            cgroups,
            verdict: Mutex::new(None),
        }
    }

    /// Whether sessions can be sandboxed now: the remembered verdict while
    /// `bwrap` is unchanged, else a fresh check's.
    pub async fn health(&self) -> SandboxHealth {
        let SandboxConfig::Bubblewrap(config) = &self.config else {
            return SandboxHealth::Off;
        };
        let bwrap = resolve_executable(&config.bwrap, &config.search_path);
        let stamp = bwrap.as_deref().and_then(FileStamp::of);
        let mut verdict = self.verdict.lock().await;
        if let Some(known) = verdict.as_ref()
            && known.holds_for(&stamp, Instant::now())
        {
            return known.health.clone();
        }
        let health = match bwrap {
            Some(bwrap) => self.check(config, bwrap).await,
            None => SandboxHealth::Unusable(bwrap_missing(&config.bwrap)),
        };
        if let SandboxHealth::Unusable(problem) = &health {
            warn!(
                cause = %problem.message,
                remediation = %problem.remediation,
                "sessions cannot be sandboxed; they will fail until this is fixed"
            );
        }
        *verdict = Some(Verdict {
            bwrap: stamp,
            health: health.clone(),
            checked_at: Instant::now(),
        });
        health
    }

    async fn check(&self, config: &BubblewrapConfig, bwrap: PathBuf) -> SandboxHealth {
        let found = |program: &str| resolve_executable(program, SANDBOX_SYSTEM_PATH);
        let Some(setsid) = found("setsid") else {
            return SandboxHealth::Unusable(sandbox_program_missing(
                "setsid",
                "util-linux (it provides setsid)",
            ));
        };
        let Some(prlimit) = found("prlimit") else {
            return SandboxHealth::Unusable(sandbox_program_missing(
                "prlimit",
                "util-linux (it provides prlimit)",
            ));
        };
        let Some(true_program) = found("true") else {
            return SandboxHealth::Unusable(sandbox_program_missing("true", "coreutils"));
        };
        if resolve_executable(HOST_SHELL, "").is_none() {
            return SandboxHealth::Unusable(sandbox_program_missing("sh", "a POSIX shell"));
        }
        let sandbox = Sandbox {
            programs: SandboxPrograms {
                sh: PathBuf::from(HOST_SHELL),
                bwrap: bwrap.clone(),
                setsid: setsid.clone(),
                prlimit,
            },
            layout: HostLayout::read(),
            work_root: self.work_root.clone(),
            home: config.home.clone(),
            // Compared with mount paths, which name what they show.
            hidden: config
                .hidden
                .iter()
                .map(|file| std::fs::canonicalize(file).unwrap_or_else(|_| file.clone()))
                .collect(),
            read_only: config.read_only.clone(),
            limits: self.limits,
            runner_limits: RunnerLimits::read(),
            cgroups: self.cgroups.clone(),
        };
        let plan = LaunchPlan {
            argv: vec![setsid.into(), true_program.into()],
            cwd: PathBuf::from("/"),
            env: vec![("PATH".to_owned(), SANDBOX_SYSTEM_PATH.to_owned())],
        };
        let started = std::time::Instant::now();
        let run = match sandbox.spawn_plan(
            plan,
            crate::sandbox::bubblewrap::SessionMounts::default(),
            crate::sandbox::bubblewrap::WorkloadSession::Shared,
        ) {
            Ok(spawn) => run_check(spawn, SANDBOX_CHECK_TIMEOUT).await,
            Err(err) => CheckRun {
                end: CheckEnd::SpawnFailed(format!(
                    "could not hand the sandbox its arguments: {err}"
                )),
                output: String::new(),
            },
        };
        match diagnose(&run, &bwrap) {
            None => {
                info!(bwrap = %bwrap.display(), elapsed_ms = started.elapsed().as_millis(), "sessions run sandboxed");
                SandboxHealth::Usable(Arc::new(sandbox))
            }
            Some(problem) => SandboxHealth::Unusable(problem),
        }
    }
}

impl std::fmt::Debug for SandboxMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxMonitor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i64, output: &str) -> CheckRun {
        CheckRun {
            end: CheckEnd::Exited(code),
            output: output.to_owned(),
        }
    }

    #[test]
    fn a_sandbox_that_starts_is_usable() {
        assert_eq!(diagnose(&exited(0, ""), Path::new("/usr/bin/bwrap")), None);
    }

    #[test]
    fn a_refused_namespace_is_quoted_with_the_fix_and_the_opt_out() {
        let problem = diagnose(
            &exited(
                1,
                "bwrap: No permissions to create a new namespace, likely because the kernel does not allow non-privileged user namespaces. On e.g. debian this can be enabled with 'sysctl kernel.unprivileged_userns_clone=1'.\n",
            ),
            Path::new("/usr/bin/bwrap"),
        )
        .unwrap();
        assert_eq!(
            problem.message,
            "bubblewrap ('/usr/bin/bwrap') cannot create a session sandbox on this host: bwrap: No permissions to create a new namespace, likely because the kernel does not allow non-privileged user namespaces. On e.g. debian this can be enabled with 'sysctl kernel.unprivileged_userns_clone=1'."
        );
        assert!(
            problem
                .remediation
                .ends_with("or set RUNNER_LOCAL_SANDBOX=none to run sessions without isolation from the runner."),
            "{}",
            problem.remediation
        );
    }

    #[test]
    fn a_silent_failure_names_its_exit_code() {
        let problem = diagnose(&exited(3, ""), Path::new("/opt/bwrap")).unwrap();
        assert_eq!(
            problem.message,
            "bubblewrap ('/opt/bwrap') cannot create a session sandbox on this host: it exited with code 3 and printed nothing."
        );
    }

    #[test]
    fn a_missing_bwrap_says_how_to_install_it() {
        assert_eq!(
            bwrap_missing("bwrap").sentence(),
            "Sessions run in a bubblewrap sandbox, but 'bwrap' was not found on this runner's host. Install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap), or set RUNNER_LOCAL_SANDBOX=none to run sessions without isolation from the runner."
        );
    }
}
