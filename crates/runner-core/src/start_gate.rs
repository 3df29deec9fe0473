//! When a new session is announced `running`: once the kernel has said it
//! started, not when its process was spawned (the Telo kernel takes one to
//! three seconds to load an application, and the editor treats `running` as
//! "the app is up").
//!
//! The backend reports `running` as soon as its workload runs; this gate holds
//! that status (and the reachability and route events that follow it) until
//! one of:
//!
//! - the debug stream's `Kernel.Started` frame (sessions run with `inspect`);
//! - the workload's first output (sessions without `inspect`: the kernel
//!   prints nothing of the application's before it has loaded it; its
//!   controller resolution lines, [`crate::kernel_progress`], are not the
//!   application's and do not count);
//! - one of the session's ports answering;
//! - [`SILENT_START_FALLBACK`] after the backend reported `running`
//!   ([`INSPECT_START_FALLBACK`] with `inspect`), for a workload that says
//!   nothing at all — unless its debug stream is talking, in which case the
//!   kernel will say `Kernel.Started` itself, or it is still resolving
//!   controllers (an npm install can outlast the fallback): then once the
//!   last resolution it started has ended.
//!
//! A workload that ends before any of these never was `running`: its status
//! goes from `starting` to its terminal status. Sessions adopted from a
//! previous runner have no gate (their kernel started long ago).
//!
//! Pure state: the registry feeds it signals and emits what it returns.

use std::time::Duration;

use runner_api::types::{ReachabilityState, RunEvent, RunStatus};

/// How long a workload that neither prints nor answers on a port, and whose
/// debug stream says nothing, stays `starting` after its process started.
pub const SILENT_START_FALLBACK: Duration = Duration::from_secs(3);

/// The same, for a session run with `inspect` (the editor's): its kernel was
/// asked for a debug stream and will say `Kernel.Started` on it, and the Telo
/// kernel, a Node.js program, can take longer than [`SILENT_START_FALLBACK`]
/// to open it on a busy host. Announcing `running` before the kernel has
/// loaded the application would tell the editor the app is up when it is not.
pub const INSPECT_START_FALLBACK: Duration = Duration::from_secs(10);

/// The debug-stream event a kernel sends once its application has started.
pub const KERNEL_STARTED: &str = "Kernel.Started";

#[derive(Debug)]
pub struct StartGate {
    inspect: bool,
    /// The `running` status the backend reported, held back.
    held: Option<RunStatus>,
    /// Events that must not precede `running` (reachability, routes).
    held_events: Vec<RunEvent>,
    output_seen: bool,
    kernel_started: bool,
    port_reachable: bool,
    debug_stream_seen: bool,
    fallback_elapsed: bool,
    /// The kernel said it is resolving a controller and has not said it
    /// finished.
    resolving: bool,
}

/// What happened that may open the gate.
#[derive(Debug, Clone, PartialEq)]
pub enum GateSignal {
    Output,
    /// Any debug frame; `started` when it is `Kernel.Started`.
    DebugFrame {
        started: bool,
    },
    FallbackElapsed,
    /// The kernel printed controller resolution lines; `busy` while one it
    /// started has not ended.
    Resolving {
        busy: bool,
    },
}

/// What the registry does with an event it was about to emit.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Emit it now.
    Pass(RunEvent),
    /// Kept by the gate until it opens.
    Held,
    /// The gate opened: emit these in order, then drop the gate.
    Open(Vec<RunEvent>),
}

impl StartGate {
    pub fn new(inspect: bool) -> Self {
        Self {
            inspect,
            held: None,
            held_events: Vec::new(),
            output_seen: false,
            kernel_started: false,
            port_reachable: false,
            debug_stream_seen: false,
            fallback_elapsed: false,
            resolving: false,
        }
    }

    /// How long after the backend's `running` a silent workload is
    /// announced `running` anyway.
    pub fn fallback(&self) -> Duration {
        if self.inspect {
            INSPECT_START_FALLBACK
        } else {
            SILENT_START_FALLBACK
        }
    }

    /// Whether the backend's `running` is being held (the fallback timer
    /// should be armed now).
    pub fn is_holding(&self) -> bool {
        self.held.is_some()
    }

    fn started(&self) -> bool {
        let silent_fallback =
            self.fallback_elapsed && !(self.inspect && self.debug_stream_seen) && !self.resolving;
        self.kernel_started
            || self.port_reachable
            || (!self.inspect && self.output_seen)
            || silent_fallback
    }

    fn open(&mut self, then: Option<RunEvent>) -> Admission {
        let mut events = Vec::with_capacity(self.held_events.len() + 2);
        if let Some(status) = self.held.take() {
            events.push(RunEvent::Status { status });
        }
        events.append(&mut self.held_events);
        events.extend(then);
        Admission::Open(events)
    }

    /// A lifecycle event the session is about to emit.
    pub fn admit(&mut self, event: RunEvent) -> Admission {
        match event {
            RunEvent::Status { status } if status.is_terminal() => {
                // Never running: the held `running` is dropped, what waited
                // behind it is not.
                self.held = None;
                let mut events = std::mem::take(&mut self.held_events);
                events.push(RunEvent::Status { status });
                Admission::Open(events)
            }
            RunEvent::Status {
                status: status @ RunStatus::Running { .. },
            } => {
                self.held = Some(status);
                if self.started() {
                    self.open(None)
                } else {
                    Admission::Held
                }
            }
            RunEvent::Reachability {
                state: ReachabilityState::Reachable,
                ..
            } => {
                self.port_reachable = true;
                if self.held.is_some() {
                    self.open(Some(event))
                } else {
                    Admission::Pass(event)
                }
            }
            RunEvent::Reachability { .. } | RunEvent::Route { .. } if self.held.is_some() => {
                self.held_events.push(event);
                Admission::Held
            }
            other => Admission::Pass(other),
        }
    }

    /// Something happened that is not itself an event to hold.
    pub fn signal(&mut self, signal: GateSignal) -> Option<Admission> {
        match signal {
            GateSignal::Output => self.output_seen = true,
            GateSignal::DebugFrame { started } => {
                self.debug_stream_seen = true;
                self.kernel_started |= started;
            }
            GateSignal::FallbackElapsed => self.fallback_elapsed = true,
            GateSignal::Resolving { busy } => self.resolving = busy,
        }
        (self.held.is_some() && self.started()).then(|| self.open(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running() -> RunStatus {
        RunStatus::Running {
            endpoints: None,
            inspect_url: None,
            agent: None,
        }
    }

    fn status(status: RunStatus) -> RunEvent {
        RunEvent::Status { status }
    }

    fn reach(state: ReachabilityState) -> RunEvent {
        RunEvent::Reachability {
            app: None,
            port: 8080,
            state,
        }
    }

    #[test]
    fn without_inspect_running_waits_for_the_first_output() {
        let mut gate = StartGate::new(false);
        assert_eq!(gate.admit(status(running())), Admission::Held);
        assert_eq!(
            gate.admit(reach(ReachabilityState::Checking)),
            Admission::Held
        );
        assert_eq!(
            gate.signal(GateSignal::Output),
            Some(Admission::Open(vec![
                status(running()),
                reach(ReachabilityState::Checking)
            ]))
        );
    }

    #[test]
    fn output_before_the_backend_reports_running_opens_at_once() {
        let mut gate = StartGate::new(false);
        assert_eq!(gate.signal(GateSignal::Output), None);
        assert_eq!(
            gate.admit(status(running())),
            Admission::Open(vec![status(running())])
        );
    }

    #[test]
    fn with_inspect_output_is_not_enough_but_kernel_started_is() {
        let mut gate = StartGate::new(true);
        assert_eq!(gate.admit(status(running())), Admission::Held);
        assert_eq!(gate.signal(GateSignal::Output), None);
        assert_eq!(gate.signal(GateSignal::DebugFrame { started: false }), None);
        // The stream talks, so the silent fallback does not apply.
        assert_eq!(gate.signal(GateSignal::FallbackElapsed), None);
        assert_eq!(
            gate.signal(GateSignal::DebugFrame { started: true }),
            Some(Admission::Open(vec![status(running())]))
        );
    }

    #[test]
    fn a_kernel_asked_for_its_debug_stream_gets_longer_to_open_it() {
        assert_eq!(StartGate::new(false).fallback(), SILENT_START_FALLBACK);
        assert_eq!(StartGate::new(true).fallback(), INSPECT_START_FALLBACK);
        assert!(INSPECT_START_FALLBACK > SILENT_START_FALLBACK);
    }

    #[test]
    fn a_silent_workload_is_running_after_the_fallback() {
        for inspect in [false, true] {
            let mut gate = StartGate::new(inspect);
            assert_eq!(gate.admit(status(running())), Admission::Held);
            assert_eq!(
                gate.signal(GateSignal::FallbackElapsed),
                Some(Admission::Open(vec![status(running())])),
                "inspect {inspect}"
            );
        }
    }

    #[test]
    fn a_reachable_port_opens_the_gate_and_follows_running() {
        let mut gate = StartGate::new(true);
        assert_eq!(gate.admit(status(running())), Admission::Held);
        assert_eq!(
            gate.admit(reach(ReachabilityState::Checking)),
            Admission::Held
        );
        assert_eq!(
            gate.admit(reach(ReachabilityState::Reachable)),
            Admission::Open(vec![
                status(running()),
                reach(ReachabilityState::Checking),
                reach(ReachabilityState::Reachable)
            ])
        );
    }

    #[test]
    fn an_end_before_the_start_drops_running_but_keeps_the_rest() {
        let mut gate = StartGate::new(true);
        assert_eq!(gate.admit(status(running())), Admission::Held);
        assert_eq!(
            gate.admit(reach(ReachabilityState::Checking)),
            Admission::Held
        );
        assert_eq!(
            gate.admit(status(RunStatus::Exited { code: 1 })),
            Admission::Open(vec![
                reach(ReachabilityState::Checking),
                status(RunStatus::Exited { code: 1 })
            ])
        );
    }

    #[test]
    fn a_kernel_resolving_controllers_is_not_running_until_it_is_done() {
        let mut gate = StartGate::new(false);
        assert_eq!(gate.admit(status(running())), Admission::Held);
        assert_eq!(gate.signal(GateSignal::Resolving { busy: true }), None);
        // An npm install outlasts the silent fallback: still starting.
        assert_eq!(gate.signal(GateSignal::FallbackElapsed), None);
        assert_eq!(
            gate.signal(GateSignal::Resolving { busy: false }),
            Some(Admission::Open(vec![status(running())]))
        );
        // Before the fallback, the application's first output opens it.
        let mut gate = StartGate::new(false);
        assert_eq!(gate.admit(status(running())), Admission::Held);
        assert_eq!(gate.signal(GateSignal::Resolving { busy: true }), None);
        assert_eq!(gate.signal(GateSignal::Resolving { busy: false }), None);
        assert_eq!(
            gate.signal(GateSignal::Output),
            Some(Admission::Open(vec![status(running())]))
        );
    }

    #[test]
    fn progress_and_debug_pass_while_holding() {
        let mut gate = StartGate::new(true);
        assert_eq!(gate.admit(status(running())), Admission::Held);
        let debug = RunEvent::Debug {
            app: None,
            frame: serde_json::json!({"event": "Kernel.Starting"}),
        };
        assert_eq!(gate.admit(debug.clone()), Admission::Pass(debug));
    }
}
