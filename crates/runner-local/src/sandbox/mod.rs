//! The bubblewrap sandbox every session process runs in: what it shows and
//! how `bwrap` is started (`bubblewrap`), what bounds it (`limits`: rlimits;
//! `cgroup`: a cgroup where the host delegates one), whether this host can
//! start one (`check`), and its settings.

pub(crate) mod bubblewrap;
pub(crate) mod cgroup;
pub mod check;
pub mod limits;

use std::path::PathBuf;

/// The bubblewrap executable, looked up on the runner's `PATH`.
pub const DEFAULT_BWRAP: &str = "bwrap";

/// How session processes are isolated (`RUNNER_LOCAL_SANDBOX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxConfig {
    /// Each session in its own bubblewrap sandbox (the default).
    Bubblewrap(BubblewrapConfig),
    /// The operator opted out: sessions run as plain child processes of the
    /// runner and can read everything the runner's user can.
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BubblewrapConfig {
    /// `bwrap`: a path, or a name looked up on `search_path`.
    pub bwrap: String,
    /// The runner's own `PATH` (not the workload's).
    pub search_path: String,
    /// The runner's `HOME`: an installation directory that holds it is never
    /// shown to a sandbox whole.
    pub home: Option<PathBuf>,
    /// Files of the runner no sandbox may show, whatever mount would
    /// (`RUNNER_AUTH_TOKENS_FILE`).
    pub hidden: Vec<PathBuf>,
    /// Shown read-only in every sandbox besides what a session needs
    /// (`RUNNER_LOCAL_SANDBOX_READ_ONLY`): what a kernel wrapper runs from
    /// elsewhere than its own installation.
    pub read_only: Vec<PathBuf>,
}
