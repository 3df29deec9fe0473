//! What can go wrong, with messages a client may see.
//!
//! No message names the workspace's absolute location on the runner's disk:
//! paths are always the client's relative ones.

use std::fmt;
use std::io;

/// Which of the runner's limits a request ran into, and the environment
/// variable that sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The size of one file.
    FileBytes,
    /// The decoded size of one change set.
    ChangeSetBytes,
    /// The total size of the files the tree lists.
    WorkspaceBytes,
    /// The number of files the tree lists.
    Files,
    /// The number of entries of any kind one walk looks at (four per file
    /// of the file limit).
    Entries,
    /// How deep the tree walk goes.
    Depth,
}

impl Limit {
    /// The environment variable that sets this limit, or `None` for the fixed
    /// depth limit.
    pub fn env_var(self) -> Option<&'static str> {
        match self {
            Limit::FileBytes => Some("RUNNER_WORKSPACE_MAX_FILE_BYTES"),
            Limit::ChangeSetBytes => Some("RUNNER_WORKSPACE_MAX_CHANGE_BYTES"),
            Limit::WorkspaceBytes => Some("RUNNER_WORKSPACE_MAX_BYTES"),
            Limit::Files | Limit::Entries => Some("RUNNER_WORKSPACE_MAX_FILES"),
            Limit::Depth => None,
        }
    }
}

/// A failed workspace operation.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The path breaks the bundle path rules: it escapes the root with
    /// `..`, names the root itself, holds a NUL, is overlong or ends in `/`.
    #[error("invalid bundle relativePath '{path}'")]
    InvalidPath { path: String },
    /// The path goes through, or ends at, a symbolic link. Links are never
    /// followed, since the workload can plant them.
    #[error("'{path}' goes through a symbolic link in the workspace, which is never followed")]
    SymlinkInPath { path: String },
    /// A limit was exceeded. `actual` is the size found, or `None` when a
    /// walk stopped as soon as it went past the limit.
    #[error("{}", too_large_message(*limit, path.as_deref(), *actual, *max))]
    TooLarge {
        limit: Limit,
        path: Option<String>,
        actual: Option<u64>,
        max: u64,
    },
    /// Nothing exists at the path.
    #[error("no file '{path}' in the workspace")]
    NotFound { path: String },
    /// The path names a directory, FIFO, socket or device, not a regular
    /// file.
    #[error("'{path}' is not a regular file")]
    NotAFile { path: String },
    /// The path cannot be written as asked: a parent is a file, or the target
    /// is a directory.
    #[error("'{path}' cannot be written: {reason}")]
    PathConflict { path: String, reason: &'static str },
    /// A write's content does not decode.
    #[error("the content of '{path}' is not valid {encoding}: {reason}")]
    BadEncoding {
        path: String,
        encoding: &'static str,
        reason: String,
    },
    /// The filesystem refused an operation.
    #[error("workspace {op} failed for '{path}': {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

fn too_large_message(limit: Limit, path: Option<&str>, actual: Option<u64>, max: u64) -> String {
    let env = limit
        .env_var()
        .map(|var| format!(" ({var})"))
        .unwrap_or_default();
    let path = path.unwrap_or("");
    match (limit, actual) {
        (Limit::FileBytes, Some(actual)) => {
            format!("'{path}' is {actual} bytes, over this runner's limit of {max} per file{env}")
        }
        (Limit::FileBytes, None) => {
            format!("'{path}' is over this runner's limit of {max} bytes per file{env}")
        }
        (Limit::ChangeSetBytes, Some(actual)) => format!(
            "the change set is {actual} bytes decoded, over this runner's limit of {max}{env}"
        ),
        (Limit::ChangeSetBytes, None) => {
            format!("the change set is over this runner's limit of {max} bytes decoded{env}")
        }
        (Limit::WorkspaceBytes, Some(actual)) => format!(
            "the workspace would hold {actual} bytes, over this runner's limit of {max}{env}"
        ),
        (Limit::WorkspaceBytes, None) => {
            format!("the workspace holds more than this runner's limit of {max} bytes{env}")
        }
        (Limit::Files, Some(actual)) => format!(
            "the workspace would hold {actual} files, over this runner's limit of {max}{env}"
        ),
        (Limit::Files, None) => {
            format!("the workspace holds more than this runner's limit of {max} files{env}")
        }
        (Limit::Entries, _) => format!(
            "the workspace has more than {max} entries to walk, four times this runner's file limit{env}"
        ),
        (Limit::Depth, _) => format!(
            "the workspace nests directories deeper than this runner's limit of {max} levels"
        ),
    }
}

/// How a caller answers an error over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorKind {
    /// The HTTP status.
    pub status: u16,
    /// The `error` code of the JSON envelope.
    pub code: &'static str,
}

impl WorkspaceError {
    /// The HTTP status and error code this error answers with. Everything
    /// the client caused is a 4xx; a filesystem failure is a 500.
    pub fn kind(&self) -> ErrorKind {
        match self {
            WorkspaceError::InvalidPath { .. } | WorkspaceError::SymlinkInPath { .. } => {
                ErrorKind::INVALID_PATH
            }
            WorkspaceError::TooLarge { .. } => ErrorKind::TOO_LARGE,
            WorkspaceError::NotFound { .. } => ErrorKind::NOT_FOUND,
            WorkspaceError::NotAFile { .. } => ErrorKind::NOT_A_FILE,
            WorkspaceError::PathConflict { .. } => ErrorKind::PATH_CONFLICT,
            WorkspaceError::BadEncoding { .. } => ErrorKind::INVALID_ENCODING,
            WorkspaceError::Io { .. } => ErrorKind::IO_FAILED,
        }
    }

    pub(crate) fn io(op: &'static str, path: &str, source: io::Error) -> Self {
        WorkspaceError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    }

    pub(crate) fn too_large(
        limit: Limit,
        path: Option<&str>,
        actual: Option<u64>,
        max: u64,
    ) -> Self {
        WorkspaceError::TooLarge {
            limit,
            path: path.map(str::to_owned),
            actual,
            max,
        }
    }
}

impl ErrorKind {
    /// `400 invalid_path`: the bundle path rules, or a symbolic link.
    pub const INVALID_PATH: ErrorKind = ErrorKind::new(400, "invalid_path");
    /// `400 not_a_file`.
    pub const NOT_A_FILE: ErrorKind = ErrorKind::new(400, "not_a_file");
    /// `400 invalid_encoding`.
    pub const INVALID_ENCODING: ErrorKind = ErrorKind::new(400, "invalid_encoding");
    /// `404 file_not_found`.
    pub const NOT_FOUND: ErrorKind = ErrorKind::new(404, "file_not_found");
    /// `409 path_conflict`.
    pub const PATH_CONFLICT: ErrorKind = ErrorKind::new(409, "path_conflict");
    /// `413 workspace_too_large`: one of the limits.
    pub const TOO_LARGE: ErrorKind = ErrorKind::new(413, "workspace_too_large");
    /// `500 workspace_io_failed`.
    pub const IO_FAILED: ErrorKind = ErrorKind::new(500, "workspace_io_failed");

    /// Every kind an error can have.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::INVALID_PATH,
        ErrorKind::NOT_A_FILE,
        ErrorKind::INVALID_ENCODING,
        ErrorKind::NOT_FOUND,
        ErrorKind::PATH_CONFLICT,
        ErrorKind::TOO_LARGE,
        ErrorKind::IO_FAILED,
    ];

    const fn new(status: u16, code: &'static str) -> Self {
        ErrorKind { status, code }
    }

    /// The kind whose code is `code`, for a client reading an error back
    /// from the wire; `None` for any other code.
    pub fn from_code(code: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|kind| kind.code == code)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.code)
    }
}
