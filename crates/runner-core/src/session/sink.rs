//! The sink a backend reports a session's life through: status, progress,
//! output, debug frames, reachability and routes, each recorded in the
//! session's replay buffers (see the parent module) and, for the start, held
//! by its start gate until the kernel has started.
//!
//! The sink only records. What a session's end or a finished run calls for
//! (retention, stopping the workload, the gate's fallback timer) the registry
//! does itself, supervising the session, so the sink never reaches back into it.

use runner_api::types::{ReachabilityState, RouteState, RunPhase, RunnerEndpoint, is_event_frame};
use runner_api::watch::{DEFAULT_APP_NAME, RejectedPort, SessionMode, StreamTag};
use serde_json::Value;
use tracing::info;

use super::*;
use crate::start_gate::{KERNEL_STARTED, SILENT_START_FALLBACK};

/// The debug-stream event listing the ports a kernel's application declares.
pub const KERNEL_PORTS_RESOLVED: &str = "Kernel.PortsResolved";

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
            app: None,
            phase,
            message: message.into(),
            done,
        });
    }

    /// Progress of one app's start.
    pub fn app_progress(&self, app: &str, phase: RunPhase, message: impl Into<String>) {
        self.session.emit(RunEvent::Progress {
            app: Some(app.to_owned()),
            phase,
            message: message.into(),
            done: None,
        });
    }

    /// Output the backend knows it could not get (a container log that
    /// could not be read): readers are told of a gap at this point instead
    /// of getting silence.
    pub fn output_lost(&self) {
        self.session.leave_output_hole(None);
    }

    /// [`SessionSink::output_lost`] for app `app` (`None`: the first).
    pub fn app_output_lost(&self, app: Option<&str>) {
        self.session.leave_output_hole(app);
    }

    /// The telo release app `app` (`None`: the first) runs, when the
    /// backend knows it (it read it off the kernel it launched): `run
    /// started` carries it when the kernel's own event names none.
    pub fn kernel_version(&self, app: Option<&str>, version: impl Into<String>) {
        self.session.set_kernel_version(app, version.into());
    }

    /// Text of the runner's own (a terminal that could not be attached)
    /// on app `app`'s output (`None`: the first), on stream `tag`.
    pub fn note(&self, app: Option<&str>, tag: StreamTag, text: Bytes) {
        self.session.push_note(app, tag, text);
    }

    /// Terminal output of the session's (first) app.
    pub fn output(&self, bytes: Bytes) {
        let scan = self.session.push_output(None, StreamTag::Tty, bytes);
        self.after_output(None, scan);
    }

    /// The workload has written `bytes`, which the backend will relay once
    /// it knows where they go (a container log read before the live stream
    /// is joined to it): when they are the application's, it is up, so a
    /// `running` held for its first output goes out now, ahead of them.
    pub fn output_pending(&self, bytes: &[u8]) {
        if crate::kernel_progress::holds_app_output(bytes) {
            self.session.signal_gate(GateSignal::Output);
        }
    }

    /// Output of app `app` on stream `tag`.
    pub fn app_output(&self, app: &str, tag: StreamTag, bytes: Bytes) {
        let scan = self.session.push_output(Some(app), tag, bytes);
        self.after_output(Some(app), scan);
    }

    /// The kernel's controller resolutions in recorded output become
    /// `progress` events (of app `app`; `None`: a run session's, which
    /// names none); the application's own output opens the start gate.
    fn after_output(&self, app: Option<&str>, scan: Option<crate::session::OutputScan>) {
        let Some(scan) = scan else {
            return;
        };
        for resolution in &scan.resolutions {
            self.session.emit(RunEvent::Progress {
                app: app.map(str::to_owned),
                phase: RunPhase::Boot,
                message: resolution.message(),
                done: resolution.done(),
            });
        }
        if !scan.resolutions.is_empty() {
            self.session.signal_gate(GateSignal::Resolving {
                busy: scan.resolving,
            });
        }
        if scan.app_output {
            self.session.signal_gate(GateSignal::Output);
        }
    }

    /// Relays a kernel debug frame; only event frames are kept. The kernel's
    /// own account of its run feeds the start gate, and a run it reports
    /// finished (`Kernel.Stopped`) while holding it open under `--inspect`
    /// is ended with the kernel's exit code.
    pub fn debug(&self, frame: Value) {
        self.app_debug(DEFAULT_APP_NAME, frame);
    }

    /// A debug frame of app `app`'s kernel. Every frame feeds the app's run
    /// projection (`run` events); under a watch session a stopped
    /// generation is only that, while a run session ends with it.
    pub fn app_debug(&self, app: &str, frame: Value) {
        let event = frame.get("event").and_then(Value::as_str);
        let started = event == Some(KERNEL_STARTED);
        let exit_code = (event == Some(KERNEL_STOPPED) && self.session.mode == SessionMode::Run)
            .then(|| frame.pointer("/payload/exitCode").and_then(js_integer))
            .flatten();
        let runs = self.session.project_run(app, &frame);
        if is_event_frame(&frame) {
            self.session.emit(RunEvent::Debug {
                app: Some(app.to_owned()),
                frame,
            });
        }
        for run in runs {
            self.session.emit(RunEvent::Run(run));
        }
        self.session.signal_gate(GateSignal::DebugFrame { started });
        if let Some(code) = exit_code {
            self.end_finished_run(code);
        }
    }

    /// App `app`'s workload ended by itself while the session lives on (a
    /// watch session's app process or container): its open generation ends
    /// `completed` with `code`, or `failed` with `reason`.
    pub fn app_ended(&self, app: &str, code: Option<i64>, reason: Option<String>) {
        if let Some(run) = self.session.end_app_run(app, code, reason) {
            self.session.emit(RunEvent::Run(run));
        }
    }

    /// `Kernel.PortsResolved` of app `app`'s kernel, on a backend that
    /// publishes ports as they are (the local one: endpoints with host
    /// `""`): the app's declared ports become the kernel's, except those
    /// another app of the session declares, which are rejected. `None` for
    /// any other frame; else the tcp ports newly accepted (to probe).
    pub fn ports_resolved(&self, app: &str, frame: &Value) -> Option<Vec<u16>> {
        if frame.get("event").and_then(Value::as_str) != Some(KERNEL_PORTS_RESOLVED) {
            return None;
        }
        let declared: Vec<runner_api::types::PortMapping> = frame
            .pointer("/payload/ports")
            .and_then(Value::as_array)
            .map(|ports| {
                ports
                    .iter()
                    .filter_map(|port| {
                        let number = u16::try_from(port.get("port")?.as_u64()?).ok()?;
                        let protocol = match port.get("protocol").and_then(Value::as_str) {
                            Some("udp") => runner_api::types::PortProtocol::Udp,
                            _ => runner_api::types::PortProtocol::Tcp,
                        };
                        Some(runner_api::types::PortMapping {
                            port: number,
                            protocol,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let (accepted, removed, taken) = self.session.diff_ports(app, &declared);
        if accepted.is_empty() && removed.is_empty() && taken.is_empty() {
            return Some(Vec::new());
        }
        let rejected = taken
            .iter()
            .map(|port| RejectedPort {
                port: port.port,
                reason: format!(
                    "another app in this session already declares {} port {}",
                    port.protocol.as_str(),
                    port.port
                ),
            })
            .collect();
        let tcp = accepted
            .iter()
            .filter(|p| p.protocol == runner_api::types::PortProtocol::Tcp)
            .map(|p| p.port)
            .collect();
        let router = lock(&self.session.port_router).clone();
        let added = match router {
            Some(router) => {
                let all = self.session.ports_after(app, &accepted, &removed);
                router.ports_changed(&accepted, &all)
            }
            None => accepted
                .iter()
                .copied()
                .map(RunnerEndpoint::unrouted)
                .collect(),
        };
        self.endpoints(
            app,
            added,
            removed
                .iter()
                .copied()
                .map(RunnerEndpoint::unrouted)
                .collect(),
            rejected,
        );
        Some(tcp)
    }

    /// The session's kernel serves its inspection on `port`.
    pub fn inspect_at(&self, port: u16) {
        self.session.record_inspect_port(port);
    }

    /// The session's current workload is dialed at `reach`.
    pub fn reach_at(&self, reach: crate::reach::Reach) {
        self.session.record_reach(reach);
    }

    /// From now on, ports an app's kernel resolves are published by
    /// `router` (replacing any router before it: a new pod has its own).
    pub fn route_ports(&self, router: Arc<dyn crate::backend_session::PortRouter>) {
        *lock(&self.session.port_router) = Some(router);
    }

    /// An app's routable ports changed.
    pub fn endpoints(
        &self,
        app: &str,
        added: Vec<RunnerEndpoint>,
        removed: Vec<RunnerEndpoint>,
        rejected: Vec<RejectedPort>,
    ) {
        self.session.apply_endpoints(app, &added, &removed);
        fn some<T>(items: Vec<T>) -> Option<Vec<T>> {
            (!items.is_empty()).then_some(items)
        }
        self.session.emit(RunEvent::Endpoints {
            app: app.to_owned(),
            added: some(added),
            removed: some(removed),
            rejected: some(rejected),
        });
    }

    /// Records the kernel's exit code; the registry, which waits for it,
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
        self.app_reachability(DEFAULT_APP_NAME, port, state);
    }

    pub fn app_reachability(&self, app: &str, port: u16, state: ReachabilityState) {
        self.session.publish(RunEvent::Reachability {
            app: Some(app.to_owned()),
            port,
            state,
        });
    }

    /// Whether the routing layer serves `host` (Kubernetes backend only).
    pub fn route(&self, host: &str, port: u16, state: RouteState, reason: Option<String>) {
        self.session.publish(RunEvent::Route {
            app: Some(DEFAULT_APP_NAME.to_owned()),
            host: host.to_owned(),
            port,
            state,
            reason,
        });
    }

    /// Resolves once clients have been told the session runs (its kernel
    /// started: the start gate opened) or once it ended.
    pub async fn announced(&self) {
        let mut events = self.session.watch_events();
        loop {
            let status = self.session.status();
            if matches!(status, RunStatus::Running { .. }) || status.is_terminal() {
                return;
            }
            if events.changed().await.is_err() {
                return;
            }
        }
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
pub(crate) fn js_integer(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_f64()
            .filter(|n| n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15)
            .map(|n| n as i64)
    })
}
