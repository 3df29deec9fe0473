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

use runner_core::{WorkspaceCause, WorkspaceFailure};
use runner_workspace::{ErrorKind, WorkspaceError};

/// How the runner reports a workspace error to its client: the cause of
/// the error's kind and its message. Shared by the local backend (which
/// calls `runner-workspace` itself) and the service's client (which reads
/// the kind and message back from the wire).
pub fn failure(err: &WorkspaceError) -> WorkspaceFailure {
    WorkspaceFailure::new(cause(err.kind()), err.to_string())
}

/// The cause a workspace error kind stands for.
pub fn cause(kind: ErrorKind) -> WorkspaceCause {
    match kind {
        ErrorKind::INVALID_PATH => WorkspaceCause::InvalidPath,
        ErrorKind::NOT_A_FILE => WorkspaceCause::NotAFile,
        ErrorKind::INVALID_ENCODING => WorkspaceCause::InvalidEncoding,
        ErrorKind::NOT_FOUND => WorkspaceCause::NotFound,
        ErrorKind::PATH_CONFLICT => WorkspaceCause::Conflict,
        ErrorKind::TOO_LARGE => WorkspaceCause::TooLarge,
        // `IO_FAILED`, and any kind added later: the filesystem's failure.
        _ => WorkspaceCause::Io,
    }
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

#[cfg(test)]
mod tests {
    use runner_core::http::ErrorCode;

    use super::*;

    #[test]
    fn every_kind_reaches_the_client_with_its_own_status_and_code() {
        for kind in ErrorKind::ALL {
            let code = ErrorCode::from(cause(kind));
            assert_eq!(
                (code.status().as_u16(), code.as_str()),
                (kind.status, kind.code)
            );
        }
    }
}
