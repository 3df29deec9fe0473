//! Observing a workload from the outside while it runs: its tcp ports
//! probed (`reachability` events) and its kernel's debug stream relayed.
//! Both backends do this the same way once they know where the workload
//! listens; only where they dial differs (a pod IP, a session's own network
//! namespace, loopback).

use runner_api::ports::tcp_ports;
use runner_api::watch::AppSpec;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use crate::debug_relay::relay_debug_stream;
use crate::reach::Reach;
use crate::reachability::{probe_app_reachability, probe_reachability};
use crate::session::SessionSink;
use crate::tasks::OwnedTasks;

/// Where a workload can be observed from and what stops the observing.
pub struct Observer<'a> {
    pub tasks: &'a OwnedTasks,
    pub sink: &'a SessionSink,
    /// Where the workload's ports are dialed.
    pub reach: Reach,
    pub stop: &'a CancellationToken,
}

impl Observer<'_> {
    /// A run session: `tcp_ports` probed, and the kernel's debug stream on
    /// its `inspect` port relayed as the session's `debug` events. The edge
    /// dials the session where the observer does.
    pub fn run_session(&self, tcp_ports: Vec<u16>, inspect: Option<u16>) {
        self.sink.reach_at(self.reach.clone());
        if !tcp_ports.is_empty() {
            self.tasks.spawn(
                probe_reachability(
                    self.reach.clone(),
                    tcp_ports,
                    self.sink.clone(),
                    self.stop.clone(),
                )
                .instrument(Span::current()),
            );
        }
        if let Some(inspect) = inspect {
            self.sink.inspect_at(inspect);
            let frames = self.sink.clone();
            self.tasks.spawn(
                relay_debug_stream(
                    self.reach.clone(),
                    inspect,
                    move |frame| frames.debug(frame),
                    self.stop.clone(),
                )
                .instrument(Span::current()),
            );
        }
    }

    /// One app of a watch session: its kernel's debug stream relayed as
    /// the app's (the ports the kernel resolves announced, and new tcp ones
    /// probed: the kernel's own account of its ports wins over the
    /// request's), and the tcp ports it declares probed. Its kernel's
    /// debug port is `inspect`.
    pub fn observe_app(&self, app: &AppSpec, inspect: u16) {
        self.sink.reach_at(self.reach.clone());
        let sink = self.sink.clone();
        let name = app.name.clone();
        let probes = self.tasks.clone();
        let probe_stop = self.stop.clone();
        let reach = self.reach.clone();
        self.tasks.spawn(
            relay_debug_stream(
                self.reach.clone(),
                inspect,
                move |frame| {
                    if let Some(tcp) = sink.ports_resolved(&name, &frame)
                        && !tcp.is_empty()
                    {
                        probes.spawn(
                            probe_app_reachability(
                                reach.clone(),
                                name.clone(),
                                tcp,
                                sink.clone(),
                                probe_stop.clone(),
                            )
                            .instrument(Span::current()),
                        );
                    }
                    sink.app_debug(&name, frame);
                },
                self.stop.clone(),
            )
            .instrument(Span::current()),
        );
        let tcp = tcp_ports(&app.ports);
        if !tcp.is_empty() {
            self.tasks.spawn(
                probe_app_reachability(
                    self.reach.clone(),
                    app.name.clone(),
                    tcp,
                    self.sink.clone(),
                    self.stop.clone(),
                )
                .instrument(Span::current()),
            );
        }
    }
}
