//! What the runner executes: a command line, working directory and
//! environment, who a stop signals, and the sandbox's arguments file.

use std::ffi::OsString;
use std::path::PathBuf;

use super::args_file::ArgsFile;
use super::group::Members;

/// What the runner executes for a [`crate::launch::LaunchPlan`]: the plan
/// itself (no sandbox), or the sandbox that runs it (see `sandbox::bubblewrap`).
#[derive(Debug)]
pub struct SpawnPlan {
    pub argv: Vec<OsString>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    /// Whether the PTY becomes the started process's controlling terminal;
    /// a sandboxed workload takes it itself, inside.
    pub controlling_tty: bool,
    /// Who a stop asks to end.
    pub members: Members,
    /// The sandbox's arguments, which must stay readable until the process
    /// has started.
    pub args_file: Option<ArgsFile>,
}
