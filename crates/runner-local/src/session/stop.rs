//! Stopping a session's processes — SIGTERM to the whole group once, SIGKILL
//! once the stop grace period is over — and the task that follows a run
//! session's process to its end and reports exactly one terminal status.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::errno::Errno;
use runner_core::SessionSink;
use runner_core::types::RunStatus;
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::LocalSession;
use crate::process::OUTPUT_DRAIN_TIMEOUT;

impl LocalSession {
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
        // Even when the signal failed, the end task's timer must run: its
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
}

/// Everything a run session's end task waits on.
pub struct RunEnd {
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
pub async fn follow_run_to_end(end: RunEnd) {
    let RunEnd {
        session,
        sink,
        mut exited,
        output_drained,
        max_ttl,
        disk,
    } = end;
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
