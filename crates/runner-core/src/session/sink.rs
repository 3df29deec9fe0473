//! The sink a backend reports a session's life through: status, progress,
//! output, debug frames, reachability and routes, each recorded in the
//! session's replay buffers (see the parent module) and, for the start, held
//! by its start gate until the kernel has started.
//!
//! The sink only records. What a session's end or a finished run calls for
//! (retention, stopping the workload, the gate's fallback timer) the registry
//! does itself, watching the session, so the sink never reaches back into it.

use runner_api::types::{ReachabilityState, RouteState, RunPhase, is_event_frame};
use serde_json::Value;
use tracing::info;

use super::*;
use crate::start_gate::{KERNEL_STARTED, SILENT_START_FALLBACK};

/// What a backend reports a session's life through.
#[derive(Clone)]
pub struct SessionSink {
    session: Arc<Session>,
}

impl SessionSink {
    /// A sink recording into `session`.
    pub(crate) fn new(session: Arc<Session>) -> Self {
        Self { session }
    }

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

    /// Records the kernel's exit code; the registry, which watches for it,
    /// stops the workload (or the launch does, once it has one).
    fn end_finished_run(&self, code: i64) {
        if self.session.record_kernel_exit(code) {
            info!(session_id = %self.session.id, code, "the kernel reported its run finished; stopping the session");
        }
    }

    /// Asks for the start gate to open after its fallback
    /// ([`StartGate::fallback`]) unless something opens it before; the
    /// registry runs the timer.
    fn arm_start_fallback(&self) {
        let after = lock(&self.session.gate)
            .as_ref()
            .map_or(SILENT_START_FALLBACK, StartGate::fallback);
        self.session
            .arm_start_fallback(tokio::time::Instant::now() + after);
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
