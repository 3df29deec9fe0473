//! Starting and signalling processes: what is executed (`plan`), the one
//! spawner thread, a process on a terminal or on pipes, its process group
//! (where SIGTERM and SIGKILL are sent), the processes of a sandbox as the
//! host sees them, finding a program on `PATH`, the memory file that hands
//! `bwrap` its arguments, and a short run to its end for the checks.

pub(crate) mod args_file;
pub mod check_run;
pub mod executable;
pub(crate) mod group;
pub(crate) mod pipes;
pub(crate) mod plan;
pub(crate) mod pty;
pub(crate) mod spawner;
pub(crate) mod tree;

use std::time::Duration;

/// How long, after the process exited, its last output may take to arrive
/// before the terminal status is reported anyway. Output normally drains in
/// microseconds; this bound only matters when a process escaped the group
/// (a daemon that called `setsid`) and still holds the terminal open.
pub const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
