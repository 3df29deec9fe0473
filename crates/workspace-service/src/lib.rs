//! A watch session's workspace over HTTP, for a backend that cannot touch
//! the directory itself.
//!
//! On Kubernetes the workspace is an `emptyDir` volume inside the session's
//! pod, shared by its app containers. A `workspace` container of the same
//! pod runs `telo-runner workspace`, which serves [`server::router`] over
//! that directory; the runner reaches it with [`client::WorkspaceClient`]
//! and a bearer token only it and that container know. Every file
//! operation is `runner-workspace`'s, so the service follows no symbolic
//! link and stays within the same limits as the local backend.

pub mod client;
mod config;
pub mod server;
pub mod wire;

pub use config::{
    Config, DEFAULT_LISTEN, MAX_CONNECTIONS, MIN_TOKEN_CHARS, RUNNER_WORKSPACE_DIR,
    RUNNER_WORKSPACE_EXIT_AFTER_WRITE, RUNNER_WORKSPACE_LISTEN, RUNNER_WORKSPACE_MAX_BYTES,
    RUNNER_WORKSPACE_MAX_CHANGE_BYTES, RUNNER_WORKSPACE_MAX_FILE_BYTES, RUNNER_WORKSPACE_MAX_FILES,
    RUNNER_WORKSPACE_TOKEN, WORKSPACE_LIMIT_SETTINGS, WORKSPACE_SERVICE_SETTINGS,
    connection_limits, workspace_limits_from_env,
};
pub use server::{ServeError, serve, serve_on};

use runner_core::WorkspaceFailure;
use runner_workspace::WorkspaceError;

/// How the runner reports a workspace error to its client: the status and
/// code of the error's kind and its message. Shared by the local backend
/// (which calls `runner-workspace` itself) and the service's client (which
/// reads the same three back from the wire).
pub fn failure(err: &WorkspaceError) -> WorkspaceFailure {
    let kind = err.kind();
    WorkspaceFailure::new(kind.status, kind.code, err.to_string())
}

/// The largest request body a route accepts when its content may hold
/// `decoded` bytes: base64 makes 4 bytes of 3, plus [`BODY_SLACK_BYTES`]
/// for paths, hashes and JSON framing.
pub fn body_cap(decoded: u64) -> u64 {
    decoded
        .div_ceil(3)
        .saturating_mul(4)
        .saturating_add(BODY_SLACK_BYTES)
}

/// What a body may hold beyond its (encoded) content.
pub const BODY_SLACK_BYTES: u64 = 1024 * 1024;
