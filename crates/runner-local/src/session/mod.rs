//! One running local session: its terminal, its process group, and the task
//! that turns the process's end into exactly one terminal status.

pub mod wiring;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use nix::errno::Errno;
use portable_pty::{MasterPty, PtySize};
use runner_core::types::RunStatus;
use runner_core::{BackendSession, SessionSink, StopError};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::process::OUTPUT_DRAIN_TIMEOUT;
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
    /// Fires when SIGTERM was sent: the supervisor then owns the kill timer.
    pub(crate) terminated: CancellationToken,
    /// Present while the process runs; dropped when it ends, which closes the
    /// stdin queue (ending the input thread) and the terminal.
    terminal: Mutex<Option<Terminal>>,
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
        }
    }

    /// Asks the whole group to end (SIGTERM; SIGKILL when there is no grace
    /// period) — once: later calls do nothing, so a second stop during the
    /// grace period neither signals again nor restarts the timer.
    pub(crate) fn terminate(&self, why: &str) -> Result<(), Errno> {
        if self.terminating.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let sent = if self.stop_grace.is_zero() {
            debug!(session_id = %self.id, why, "killing the session's process group");
            self.group.kill()
        } else {
            debug!(session_id = %self.id, why, grace_ms = self.stop_grace.as_millis(), "terminating the session's process group");
            self.group.terminate()
        };
        // Even when the signal failed, the supervisor's timer must run: its
        // SIGKILL is the bound on how long the processes may linger.
        self.terminated.cancel();
        sent
    }

    pub(crate) fn terminate_logged(&self, why: &str) {
        if let Err(err) = self.terminate(why) {
            warn!(session_id = %self.id, error = %err, "could not signal the session's process group");
        }
    }

    pub(crate) fn kill(&self, why: &str) {
        debug!(session_id = %self.id, why, "killing the session's process group");
        if let Err(err) = self.group.kill() {
            warn!(session_id = %self.id, error = %err, "could not kill the session's process group");
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
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            // A workload that never reads its stdin must not stall the
            // runner's WebSocket handler: input beyond the queue is dropped.
            Err(TrySendError::Full(dropped)) => {
                warn!(session_id = %self.id, bytes = dropped.len(), "stdin queue full, input dropped");
            }
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
    /// after it are the supervisor's, so a DELETE never waits for them.
    async fn stop(&self) -> Result<(), StopError> {
        self.stop_requested.store(true, Ordering::SeqCst);
        self.terminate("stop requested").map_err(|err| StopError {
            message: format!("could not stop the session's processes: {err}"),
        })
    }
}

/// Everything the supervisor waits on.
pub struct Supervision {
    pub session: Arc<LocalSession>,
    pub sink: SessionSink,
    /// The exit code, once the process ended and was reaped.
    pub exited: oneshot::Receiver<i64>,
    /// Fires once all terminal output was delivered.
    pub output_drained: oneshot::Receiver<()>,
    pub max_ttl: Duration,
    /// The session's directory and the most it may hold.
    pub disk: Option<crate::disk_bound::DiskBound>,
}

/// Waits for the session to end — on its own, by `stop`, by its lifetime
/// running out, or because the registry let go of it — and reports the one
/// terminal status, after all of its output (including whatever the workload
/// printed while it shut down).
pub async fn supervise(supervision: Supervision) {
    let Supervision {
        session,
        sink,
        mut exited,
        output_drained,
        max_ttl,
        disk,
    } = supervision;
    let ended = sink.ended();
    let mut lifetime_exceeded = false;
    let mut disk_exceeded = None;
    let disk_bound = disk.as_ref().map(|bound| bound.max_bytes);
    let over_disk_bound = async move {
        match disk {
            Some(bound) => crate::disk_bound::exceeded(bound).await,
            None => std::future::pending().await,
        }
    };
    let ran_out = tokio::select! {
        code = &mut exited => Some(code),
        () = tokio::time::sleep(max_ttl) => {
            lifetime_exceeded = true;
            session.terminate_logged("maximum lifetime exceeded");
            None
        }
        // The registry finished the session without us (shutdown) or dropped
        // it: its processes must not run on unobserved.
        () = ended.cancelled() => {
            session.terminate_logged("session ended");
            None
        }
        () = session.terminated.cancelled() => None,
        used = over_disk_bound => {
            disk_exceeded = disk_bound;
            warn!(session_id = %session.id, used_bytes = used, "session directory past its disk bound");
            session.terminate_logged("disk bound exceeded");
            None
        }
    };
    let exit_code = match ran_out {
        Some(code) => code,
        // Every way of ending it comes through here, so there is one kill
        // timer; it is dropped with this task once the process is gone.
        None => match tokio::time::timeout(session.stop_grace, &mut exited).await {
            Ok(code) => code,
            Err(_) => {
                session.kill("stop grace period elapsed");
                exited.await
            }
        },
    };
    if tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, output_drained)
        .await
        .is_err()
    {
        warn!(session_id = %session.id, "terminal still open after the session's process ended");
    }
    session.close_terminal();
    let stopped = session.stop_requested.load(Ordering::SeqCst) || sink.is_user_stopped();
    let status = match exit_code {
        _ if stopped => RunStatus::Stopped,
        _ if disk_exceeded.is_some() => RunStatus::failed(crate::disk_bound::exceeded_message(
            disk_exceeded.unwrap_or_default(),
        )),
        _ if lifetime_exceeded => RunStatus::failed(format!(
            "session exceeded its maximum lifetime of {} s and was stopped",
            max_ttl.as_secs()
        )),
        Ok(code) => RunStatus::Exited { code },
        Err(_) => RunStatus::failed("lost track of the session's process"),
    };
    sink.status(status);
}
