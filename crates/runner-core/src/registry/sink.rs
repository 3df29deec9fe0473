//! The sink a backend reports a session's life through: status, progress,
//! output, debug frames, reachability and routes, each recorded in the
//! session's replay buffers (see the parent module) and, for the start, held
//! by its start gate until the kernel has started.

use std::sync::Weak;

use runner_api::types::{ReachabilityState, RouteState, RunPhase, is_event_frame};
use serde_json::Value;

use super::*;
use crate::start_gate::{KERNEL_STARTED, SILENT_START_FALLBACK};

/// What a backend reports a session's life through.
#[derive(Clone)]
pub struct SessionSink {
    pub(super) session: Arc<Session>,
    pub(super) registry: Weak<RegistryInner>,
}

impl SessionSink {
    pub fn session_id(&self) -> &str {
        &self.session.id
    }

    pub fn status(&self, status: RunStatus) {
        let status = match (status, self.session.kernel_exit()) {
            // The runner stopped a run the kernel had already finished and
            // was only holding open: what the client sees is how it ended.
            (RunStatus::Stopped, Some(code)) if !self.session.is_user_stopped() => {
                RunStatus::Exited { code }
            }
            (status, _) => status,
        };
        let terminal = status.is_terminal();
        let running = matches!(status, RunStatus::Running { .. });
        let kind = status.kind();
        if self.session.publish(RunEvent::Status { status }).is_none() {
            if running && self.session.is_holding_running() {
                self.arm_start_fallback();
            }
            return;
        }
        info!(session_id = %self.session.id, status = kind, "session status");
        if terminal {
            self.session.ended.cancel();
            if let Some(registry) = self.registry.upgrade() {
                registry.schedule_removal(&self.session);
            }
        }
    }

    pub fn progress(&self, phase: RunPhase, message: impl Into<String>, done: Option<bool>) {
        self.session.emit(RunEvent::Progress {
            phase,
            message: message.into(),
            done,
        });
    }

    /// Output the backend knows it could not get (a container log that
    /// could not be read): readers are told of a gap at this point instead
    /// of getting silence.
    pub fn output_lost(&self) {
        let last = {
            let mut state = lock(&self.session.state);
            if state.status.is_terminal() || state.handed_over {
                return;
            }
            state.output.leave_hole()
        };
        self.session.output_seq.send_replace(last);
    }

    pub fn output(&self, bytes: Bytes) {
        let empty = bytes.is_empty();
        self.session.push_output(bytes);
        if !empty {
            self.session.signal_gate(GateSignal::Output);
        }
    }

    /// Relays a kernel debug frame; only event frames are kept. The kernel's
    /// own account of its run feeds the start gate, and a run it reports
    /// finished (`Kernel.Stopped`) while holding it open under `--inspect`
    /// is ended with the kernel's exit code.
    pub fn debug(&self, frame: Value) {
        let event = frame.get("event").and_then(Value::as_str);
        let started = event == Some(KERNEL_STARTED);
        let exit_code = (event == Some(KERNEL_STOPPED))
            .then(|| frame.pointer("/payload/exitCode").and_then(js_integer))
            .flatten();
        if is_event_frame(&frame) {
            self.session.emit(RunEvent::Debug { frame });
        }
        self.session.signal_gate(GateSignal::DebugFrame { started });
        if let Some(code) = exit_code {
            self.end_finished_run(code);
        }
    }

    fn end_finished_run(&self, code: i64) {
        {
            let mut kernel_exit = lock(&self.session.kernel_exit);
            if kernel_exit.is_some() {
                return;
            }
            *kernel_exit = Some(code);
        }
        info!(session_id = %self.session.id, code, "the kernel reported its run finished; stopping the session");
        // Without a handle yet, the launch stops it once it has one.
        let (Some(handle), Some(registry)) = (self.session.handle(), self.registry.upgrade())
        else {
            return;
        };
        let id = self.session.id.clone();
        registry.tasks.spawn(async move {
            if let Err(err) = handle.stop().await {
                warn!(session_id = %id, error = %err, "stopping a finished run failed");
            }
        });
    }

    /// Opens the start gate after its fallback ([`StartGate::fallback`])
    /// unless something opened it before.
    fn arm_start_fallback(&self) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let session = self.session.clone();
        let after = lock(&session.gate)
            .as_ref()
            .map_or(SILENT_START_FALLBACK, StartGate::fallback);
        let ended = session.ended.clone();
        registry.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(after) => {
                    session.signal_gate(GateSignal::FallbackElapsed);
                }
                () = ended.cancelled() => {}
            }
        });
    }

    pub fn reachability(&self, port: u16, state: ReachabilityState) {
        self.session.publish(RunEvent::Reachability { port, state });
    }

    /// Whether the routing layer serves `host` (Kubernetes backend only).
    pub fn route(&self, host: &str, port: u16, state: RouteState, reason: Option<String>) {
        self.session.publish(RunEvent::Route {
            host: host.to_owned(),
            port,
            state,
            reason,
        });
    }

    pub fn is_user_stopped(&self) -> bool {
        self.session.is_user_stopped()
    }

    pub fn is_terminal(&self) -> bool {
        self.session.is_terminal()
    }

    /// Fires when the session ends: background work tied to it stops.
    pub fn ended(&self) -> CancellationToken {
        self.session.ended.clone()
    }

    /// Fires when a client or shutdown asked the session to stop.
    pub fn stop_requested(&self) -> CancellationToken {
        self.session.stop_requested.clone()
    }
}

/// A JSON number that is a whole number (the kernel writes `exitCode` from
/// JavaScript, where `3` and `3.0` are the same value).
fn js_integer(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_f64()
            .filter(|n| n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15)
            .map(|n| n as i64)
    })
}
