//! The terminal client: `run`, `attach`, `logs`, `sessions` and `stop` against a
//! `/v1` runner.

pub mod api;
pub mod ctrl_c;
pub mod events;
pub mod io;
pub mod logs;
pub mod output;
pub mod run;
pub mod sessions;
pub mod status;
pub mod terminal;

/// Where the client looks for a runner unless told otherwise.
pub const DEFAULT_RUNNER_URL: &str = "http://127.0.0.1:8061";
