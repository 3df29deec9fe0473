//! One running local session: its terminal and its process group
//! ([`LocalSession`]); `wiring` connects a spawned process to it, `stop`
//! stops it (SIGTERM, then SIGKILL after the stop grace period) and holds
//! the task that turns the process's end into exactly one terminal status.

pub mod stop;
pub mod wiring;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use portable_pty::{MasterPty, PtySize};
use runner_core::{BackendSession, StopError};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::process::args_file::ArgsFile;
use crate::process::group::ProcessGroup;
use crate::process::pty::InputQueue;

pub struct LocalSession {
    id: String,
    group: Arc<ProcessGroup>,
    /// Between SIGTERM and SIGKILL; zero kills at once.
    pub(crate) stop_grace: Duration,
    /// A client (or shutdown) asked for the stop: the end is `stopped`.
    stop_requested: AtomicBool,
    /// Set by whoever sent the group SIGTERM first — a stop, the lifetime
    /// limit, or the registry letting go — so the signal is sent once and the
    /// grace period starts once, however many of them arrive.
    terminating: AtomicBool,
    /// Fires when SIGTERM was sent: the end task then owns the kill timer.
    pub(crate) terminated: CancellationToken,
    /// Present while the process runs; dropped when it ends, which closes the
    /// stdin queue (ending the input thread) and the terminal.
    terminal: Mutex<Option<Terminal>>,
    input_drops: runner_core::backend_session::InputDrops,
}

struct Terminal {
    /// `None` for a process on pipes, which has no size.
    master: Option<Box<dyn MasterPty + Send>>,
    input: InputQueue,
    /// The sandbox's arguments, readable while the session lives.
    _args_file: Option<ArgsFile>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LocalSession {
    pub fn new(
        id: String,
        group: Arc<ProcessGroup>,
        stop_grace: Duration,
        master: Option<Box<dyn MasterPty + Send>>,
        input: InputQueue,
        args_file: Option<ArgsFile>,
    ) -> Self {
        Self {
            id,
            group,
            stop_grace,
            stop_requested: AtomicBool::new(false),
            terminating: AtomicBool::new(false),
            terminated: CancellationToken::new(),
            terminal: Mutex::new(Some(Terminal {
                master,
                input,
                _args_file: args_file,
            })),
            input_drops: Default::default(),
        }
    }

    pub(crate) fn close_terminal(&self) {
        lock(&self.terminal).take();
    }
}

#[async_trait]
impl BackendSession for LocalSession {
    fn write_stdin(&self, bytes: Bytes) {
        let terminal = lock(&self.terminal);
        let Some(terminal) = terminal.as_ref() else {
            return;
        };
        match terminal.input.try_send(bytes) {
            Ok(()) => self.input_drops.delivered(&self.id),
            Err(TrySendError::Disconnected(_)) => {}
            // A workload that never reads its stdin must not stall the
            // runner's WebSocket handler: input beyond the queue is dropped.
            Err(TrySendError::Full(dropped)) => self.input_drops.dropped(&self.id, dropped.len()),
        }
    }

    fn resize(&self, cols: u16, rows: u16) {
        if cols == 0 || rows == 0 {
            return;
        }
        let terminal = lock(&self.terminal);
        let Some(master) = terminal.as_ref().and_then(|t| t.master.as_ref()) else {
            return;
        };
        let size = PtySize {
            rows,
            cols,
            pixel_width: 0,
            pixel_height: 0,
        };
        if let Err(err) = master.resize(size) {
            debug!(session_id = %self.id, error = %format!("{err:#}"), "terminal resize failed");
        }
    }

    /// Returns once the group was signalled; the grace period and the kill
    /// after it are the end task's, so a DELETE never waits for them.
    async fn stop(&self) -> Result<(), StopError> {
        self.stop_requested.store(true, Ordering::SeqCst);
        self.terminate("stop requested").map_err(|err| StopError {
            message: format!("could not stop the session's processes: {err}"),
        })
    }
}
