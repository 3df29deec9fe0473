//! The backend-session traits: a started session as the core drives it
//! (`BackendSession`: input, resize, stop, detach; `WatchWorkload` for a
//! watch session) and how starting or stopping one fails. Kept apart from
//! the backend trait that starts them, so that a session's record and the
//! metrics can name them without depending on the backend seam.

use async_trait::async_trait;
use bytes::Bytes;
use runner_api::watch::{
    AppSpec, WorkspaceApplyResult, WorkspaceChangeSet, WorkspaceFileContent, WorkspaceTree,
};

/// Where a start failed. It is the first word of the failure on the wire
/// (`"<stage>: <message>"`) and the `stage` label of the start-failure metric,
/// so its spellings are part of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StartStage {
    /// Receiving or staging the application's bundle.
    Bundle,
    /// Making what the session runs in: its directory, its pod.
    Create,
    /// Starting the workload in it.
    Start,
    /// Taking a session over from a previous runner.
    Resume,
    /// Stopped while it came up: the session ends `stopped`, not `failed`.
    Cancelled,
}

impl StartStage {
    pub fn as_str(self) -> &'static str {
        match self {
            StartStage::Bundle => "bundle",
            StartStage::Create => "create",
            StartStage::Start => "start",
            StartStage::Resume => "resume",
            StartStage::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for StartStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A start failure. On the wire only `"<stage>: <message>"` appears; the source
/// goes to the log.
#[derive(Debug, thiserror::Error)]
#[error("{stage}: {message}")]
pub struct StartError {
    pub stage: StartStage,
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StartError {
    pub fn cancelled() -> Self {
        Self::new(
            StartStage::Cancelled,
            "the session was stopped while it was starting",
        )
    }

    pub fn is_cancelled(&self) -> bool {
        self.stage == StartStage::Cancelled
    }

    pub fn new(stage: StartStage, message: impl Into<String>) -> Self {
        Self {
            stage,
            message: message.into(),
            source: None,
        }
    }

    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
}

/// A failed stop; its message becomes `500 stop_failed`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StopError {
    pub message: String,
}

/// Where a runner's newest output frames of one app ended, left for the
/// runner that adopts the session (`session::carry` says how they are
/// used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputMarks {
    pub app: String,
    /// `(seq, end)`: frame `seq` ended `end` bytes into the app's output;
    /// ascending in both.
    pub points: Vec<(u64, u64)>,
    /// The output's bytes just before the last point.
    pub tail: Vec<u8>,
}

/// A started workload.
#[async_trait]
pub trait BackendSession: Send + Sync + 'static {
    /// Write to the workload's stdin; a no-op once it ended. Must not block
    /// (queue or drop): it is called with the session's state locked.
    fn write_stdin(&self, bytes: Bytes);

    /// Resize the workload's terminal; a no-op once it ended. Must not block.
    fn resize(&self, cols: u16, rows: u16);

    /// Input for one app of a multi-app (watch) session; a session of one
    /// app takes it as [`BackendSession::write_stdin`].
    fn write_app_stdin(&self, _app: &str, bytes: Bytes) {
        self.write_stdin(bytes);
    }

    /// Resize one app's terminal.
    fn resize_app(&self, _app: &str, cols: u16, rows: u16) {
        self.resize(cols, rows);
    }

    /// Force-stop; idempotent. The terminal status arrives through the sink.
    async fn stop(&self) -> Result<(), StopError>;

    /// The runner exits and a successor adopts the workload: stop observing
    /// it, and never stop or delete it. Called before the session's `ended`
    /// fires.
    fn detach(&self) {}

    /// [`BackendSession::detach`], leaving the runner that adopts the
    /// workload `marks`: where this runner's newest output frames ended, so
    /// a client resuming from one of them is served from the same byte
    /// (`session::carry`). A backend that cannot keep them only detaches.
    /// The caller bounds how long this takes.
    async fn hand_over(&self, marks: Vec<OutputMarks>) {
        let _ = marks;
        self.detach();
    }
}

/// Where a backend publishes a session's ports (a Service and an Ingress or
/// HTTPRoute per session): told when an app's kernel resolved other ports
/// while it runs, so they are published live, as the reference does.
pub trait PortRouter: Send + Sync + 'static {
    /// Publish `all` (every port the session's apps declare now) in the
    /// background, and say how clients reach `added`. Must not block: it is
    /// called from the session's event path.
    fn ports_changed(
        &self,
        added: &[runner_api::types::PortMapping],
        all: &[runner_api::types::PortMapping],
    ) -> Vec<runner_api::types::RunnerEndpoint>;
}

/// Why a workspace operation failed. Only the HTTP layer turns a cause into
/// a status and an error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceCause {
    /// A path broke the bundle path rules, or met a symbolic link.
    InvalidPath,
    /// The path names something that is not a regular file.
    NotAFile,
    /// Content that is not what its encoding says.
    InvalidEncoding,
    /// No file at that path.
    NotFound,
    /// A path is both a file and a directory of the change.
    Conflict,
    /// One of the workspace's limits was passed.
    TooLarge,
    /// The filesystem failed.
    Io,
    /// The session runs no app of that name.
    UnknownApp,
    /// The workspace could not be reached or did not answer.
    Unavailable,
}

/// A workspace operation that failed, as the client is told: its cause and
/// a sentence naming the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct WorkspaceFailure {
    pub cause: WorkspaceCause,
    pub message: String,
}

impl WorkspaceFailure {
    pub fn new(cause: WorkspaceCause, message: impl Into<String>) -> Self {
        Self {
            cause,
            message: message.into(),
        }
    }

    /// The session runs no app named `app`.
    pub fn unknown_app(app: &str) -> Self {
        Self::new(
            WorkspaceCause::UnknownApp,
            format!("session runs no app named '{app}'"),
        )
    }

    /// The workspace could not be reached or did not answer.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(WorkspaceCause::Unavailable, message)
    }
}

/// A running watch session: apps over one workspace the runner edits.
#[async_trait]
pub trait WatchWorkload: BackendSession {
    /// Every file of the workspace with its hash.
    async fn tree(&self) -> Result<WorkspaceTree, WorkspaceFailure>;

    /// One file as UTF-8, with its size in bytes.
    async fn read_file(&self, path: &str) -> Result<WorkspaceFileContent, WorkspaceFailure>;

    /// Writes, then deletes; paths are already checked by the bundle path
    /// rules. The kernel's own watch picks the change up.
    async fn apply(
        &self,
        changes: WorkspaceChangeSet,
    ) -> Result<WorkspaceApplyResult, WorkspaceFailure>;

    /// Makes app `app`'s kernel re-run its entry (a touch, not a signal).
    async fn reload(&self, app: &str) -> Result<(), WorkspaceFailure>;

    /// Saves the workspace where a resume (on this runner or its successor)
    /// finds it.
    async fn checkpoint(&self) -> Result<(), WorkspaceFailure>;

    /// Replaces the app set, keeping the workspace; reports `running` again
    /// with the new endpoints through the sink.
    async fn set_apps(&self, apps: Vec<AppSpec>) -> Result<(), StartError>;

    /// Checkpoints and ends the workload, keeping what a resume needs. The
    /// session is not over: nothing terminal is reported.
    async fn suspend(&self) -> Result<(), StopError>;
}

/// Input a backend dropped because the workload does not read its stdin
/// (its queue is full). A client can send chunks far faster than a log can
/// take a line each, so this says it twice per episode: once when dropping
/// begins, and once, with the bytes lost, when input flows again.
#[derive(Debug, Default)]
pub struct InputDrops {
    bytes: std::sync::atomic::AtomicU64,
}

impl InputDrops {
    /// `bytes` of input for `whose` were dropped.
    pub fn dropped(&self, whose: &str, bytes: usize) {
        use std::sync::atomic::Ordering;
        if self.bytes.fetch_add(bytes as u64, Ordering::Relaxed) == 0 {
            tracing::warn!(
                session = whose,
                "stdin queue full: the workload is not reading its input, which is dropped until it does"
            );
        }
    }

    /// Input for `whose` was queued again.
    pub fn delivered(&self, whose: &str) {
        use std::sync::atomic::Ordering;
        if self.bytes.load(Ordering::Relaxed) == 0 {
            return;
        }
        let lost = self.bytes.swap(0, Ordering::Relaxed);
        if lost > 0 {
            tracing::warn!(
                session = whose,
                bytes = lost,
                "stdin flows again; input dropped while the queue was full"
            );
        }
    }
}
