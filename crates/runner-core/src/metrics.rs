//! The runner's Prometheus metrics, served at `/metrics` in the OpenMetrics
//! text format.
//!
//! Every metric is an atomic (or a family of atomics): recording one never
//! takes a session's lock, and the handles the hot paths use (output bytes) are
//! resolved once, so relaying a chunk costs one atomic add. Sessions by state
//! are not tracked incrementally at all: they are counted from the registry at
//! scrape time, so a missed transition can never leave the gauge drifting.

use std::fmt;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use prometheus_client::metrics::counter::Counter;

/// The `Content-Type` of the exposition `encode` produces.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every status a session can be in, the values of the `state` label.
pub const SESSION_STATES: [&str; 5] = ["starting", "running", "exited", "failed", "stopped"];

/// Start-to-running latency buckets: 1 ms doubling to ~131 s, which covers a
/// local process (milliseconds) as well as a pod pulling a large image.
const START_LATENCY_BUCKETS: (f64, f64, u16) = (0.001, 2.0, 18);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DestinationLabel {
    destination: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabel {
    transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiRequestLabels {
    verb: String,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabel {
    watch: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The counters of connections turned away at the connection limits
/// (`telo_runner_connections_turned_away_total{reason}`). A default set
/// counts for nobody: a service without metrics passes one.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCounters {
    /// A connection that had sent nothing, closed to admit a new one.
    pub shed: Counter,
    /// A connection refused at the connection limit (`too_many_connections`).
    pub full: Counter,
    /// A connection refused at its client address's share
    /// (`too_many_connections_from_client`).
    pub client_full: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WarmPodLabels {
    pool: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WarmUpLabels {
    pool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WarmStartLabels {
    pool: String,
    start: &'static str,
}

/// A streaming subscriber of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Sse,
    WebSocket,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Self::Sse => "sse",
            Self::WebSocket => "websocket",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    sessions: Family<StateLabel, Gauge>,
    session_starts: Family<KindLabel, Counter>,
    start_failures: Family<StageLabel, Counter>,
    start_latency: Histogram,
    output_buffered: Counter,
    output_websocket: Counter,
    subscribers: Family<TransportLabel, Gauge>,
    apiserver_requests: Family<ApiRequestLabels, Counter>,
    watch_restarts: Family<WatchLabel, Counter>,
    warm_pods: Family<WarmPodLabels, Gauge>,
    warm_starts: Family<WarmStartLabels, Counter>,
    warm_ups: Family<WarmUpLabels, Counter>,
    workspace_checkpoints: Family<OutcomeLabel, Counter>,
    connections_turned_away: Family<ReasonLabel, Counter>,
    webhook_deliveries: Family<OutcomeLabel, Counter>,
    access_refusals: Family<ReasonLabel, Counter>,
    takeovers: Counter,
    peer_forwards: Family<OutcomeLabel, Counter>,
}

/// The gauges of one warm pool: its idle pods ready to be claimed, and
/// those still starting (created, not yet checked).
#[derive(Clone, Debug, Default)]
pub struct WarmPoolGauges {
    pub ready: Gauge,
    pub starting: Gauge,
    warm: Counter,
    cold: Counter,
    warmed_up: Counter,
    offered_cold: Counter,
}

impl WarmPoolGauges {
    /// A run session of this pool's image started on a warm pod (`true`)
    /// or on a new one.
    pub fn started(&self, warm: bool) {
        if warm {
            self.warm.inc();
        } else {
            self.cold.inc();
        }
    }

    /// A pod of this pool finished its kernel cache warm-up (`true`), or
    /// failed it and is offered with a cold cache.
    pub fn warm_up_done(&self, warm: bool) {
        if warm {
            self.warmed_up.inc();
        } else {
            self.offered_cold.inc();
        }
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("telo_runner");
        let sessions = Family::<StateLabel, Gauge>::default();
        registry.register(
            "sessions",
            "Sessions held by the runner, by status",
            sessions.clone(),
        );
        let takeovers = Counter::default();
        registry.register(
            "session_takeovers",
            "Sessions this replica took over from a replica whose Lease lapsed or that handed them over",
            takeovers.clone(),
        );
        let session_starts = Family::<KindLabel, Counter>::default();
        registry.register(
            "session_starts",
            "Sessions admitted, by kind (run = client bundle, app = catalog app)",
            session_starts.clone(),
        );
        let start_failures = Family::<StageLabel, Counter>::default();
        registry.register(
            "session_start_failures",
            "Session starts that failed, by the stage that failed (bundle, create, start, resume)",
            start_failures.clone(),
        );
        let (start, factor, length) = START_LATENCY_BUCKETS;
        let start_latency = Histogram::new(exponential_buckets(start, factor, length));
        registry.register(
            "session_start_duration_seconds",
            "Time from admission to the running status",
            start_latency.clone(),
        );
        let output = Family::<DestinationLabel, Counter>::default();
        registry.register(
            "output_bytes",
            "Terminal output bytes: entering the replay buffers, and sent to WebSocket clients",
            output.clone(),
        );
        let output_buffered = output
            .get_or_create(&DestinationLabel {
                destination: "replay_buffer",
            })
            .clone();
        let output_websocket = output
            .get_or_create(&DestinationLabel {
                destination: "websocket",
            })
            .clone();
        let subscribers = Family::<TransportLabel, Gauge>::default();
        registry.register(
            "subscribers",
            "Connected event-stream (sse) and terminal (websocket) subscribers",
            subscribers.clone(),
        );
        for transport in [Transport::Sse, Transport::WebSocket] {
            // Present at zero before the first subscriber connects.
            drop(subscribers.get_or_create(&TransportLabel {
                transport: transport.label(),
            }));
        }
        let apiserver_requests = Family::<ApiRequestLabels, Counter>::default();
        registry.register(
            "apiserver_requests",
            "Requests the runner sent to the Kubernetes apiserver, by verb and resource",
            apiserver_requests.clone(),
        );
        let watch_restarts = Family::<WatchLabel, Counter>::default();
        registry.register(
            "watch_restarts",
            "Times a shared Kubernetes watch had to be re-established",
            watch_restarts.clone(),
        );
        let warm_pods = Family::<WarmPodLabels, Gauge>::default();
        registry.register(
            "warm_pods",
            "Idle warm pods per pool (kernel image): ready to be claimed, or still starting",
            warm_pods.clone(),
        );
        let warm_starts = Family::<WarmStartLabels, Counter>::default();
        registry.register(
            "warm_pool_starts",
            "Run sessions of a pooled image, by whether they started on a warm pod or a new one",
            warm_starts.clone(),
        );
        let warm_ups = Family::<WarmUpLabels, Counter>::default();
        registry.register(
            "warm_pool_warm_ups",
            "Warm pods whose kernel cache warm-up ended, by outcome: warm, or cold (it failed, and the pod is offered with a cold cache)",
            warm_ups.clone(),
        );
        let workspace_checkpoints = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "workspace_checkpoints",
            "Watch-session workspace checkpoints (periodic and for a suspend), by outcome: stored or failed",
            workspace_checkpoints.clone(),
        );
        let connections_turned_away = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "connections_turned_away",
            "Connections turned away at the connection limits, by reason: shed (one that had sent nothing, closed to admit a new one), full (past RUNNER_MAX_CONNECTIONS), client_full (past a client address's share, RUNNER_MAX_CONNECTIONS_PER_CLIENT); past a limit only the probes are answered",
            connections_turned_away.clone(),
        );
        let webhook_deliveries = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Lifecycle webhook events, by outcome: delivered, dropped (the queue was full, the receiver refused it, or its attempts ran out) or failed_attempt (one try that will be retried)",
            webhook_deliveries.clone(),
        );
        let access_refusals = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "access_refusals",
            "Requests refused for who sent them, by reason: unauthorized (no or a refused token), rate_limited (past the tier's requestsPerMinute or startsPerMinute), quota_exceeded (the tenant at a quota of its tier)",
            access_refusals.clone(),
        );
        let peer_forwards = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "peer_forwards",
            "Requests for a session another replica owns, by outcome: forwarded (the owner answered), unavailable (the owner could not be reached), moving (the session is being taken over), refused (a peer's request for a session this replica does not hold)",
            peer_forwards.clone(),
        );
        Self {
            registry,
            sessions,
            session_starts,
            start_failures,
            start_latency,
            output_buffered,
            output_websocket,
            subscribers,
            apiserver_requests,
            watch_restarts,
            warm_pods,
            warm_starts,
            warm_ups,
            workspace_checkpoints,
            connections_turned_away,
            webhook_deliveries,
            access_refusals,
            takeovers,
            peer_forwards,
        }
    }

    /// The counters the webhook worker bumps.
    pub fn webhook_counters(&self) -> crate::webhooks::WebhookCounters {
        let counter = |outcome| {
            self.webhook_deliveries
                .get_or_create(&OutcomeLabel { outcome })
                .clone()
        };
        crate::webhooks::WebhookCounters {
            delivered: counter("delivered"),
            dropped: counter("dropped"),
            failed_attempts: counter("failed_attempt"),
        }
    }

    /// Counts a request refused for who sent it (`unauthorized`,
    /// `rate_limited`, `quota_exceeded`).
    /// A request for a session another replica owns, by what became of it.
    pub fn peer_forward(&self, outcome: &'static str) {
        self.peer_forwards
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    pub fn access_refused(&self, reason: &'static str) {
        self.access_refusals
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// The counters the accept loop bumps as it turns connections away.
    pub fn connection_counters(&self) -> ConnectionCounters {
        let counter = |reason| {
            self.connections_turned_away
                .get_or_create(&ReasonLabel { reason })
                .clone()
        };
        ConnectionCounters {
            shed: counter("shed"),
            full: counter("full"),
            client_full: counter("client_full"),
        }
    }

    /// The gauges and counters of warm pool `pool` (its kernel image).
    pub fn warm_pool(&self, pool: &str) -> WarmPoolGauges {
        let pods = |state| {
            self.warm_pods
                .get_or_create(&WarmPodLabels {
                    pool: pool.to_owned(),
                    state,
                })
                .clone()
        };
        let starts = |start| {
            self.warm_starts
                .get_or_create(&WarmStartLabels {
                    pool: pool.to_owned(),
                    start,
                })
                .clone()
        };
        let warm_ups = |outcome| {
            self.warm_ups
                .get_or_create(&WarmUpLabels {
                    pool: pool.to_owned(),
                    outcome,
                })
                .clone()
        };
        WarmPoolGauges {
            ready: pods("ready"),
            starting: pods("starting"),
            warm: starts("warm"),
            cold: starts("cold"),
            warmed_up: warm_ups("warm"),
            offered_cold: warm_ups("cold"),
        }
    }

    pub fn session_started(&self, app: bool) {
        let kind = if app { "app" } else { "run" };
        self.session_starts.get_or_create(&KindLabel { kind }).inc();
    }

    pub fn start_failed(&self, stage: crate::backend_session::StartStage) {
        self.start_failures
            .get_or_create(&StageLabel {
                stage: stage.as_str().to_owned(),
            })
            .inc();
    }

    pub fn session_running_after(&self, latency: std::time::Duration) {
        self.start_latency.observe(latency.as_secs_f64());
    }

    pub fn output_buffered(&self, bytes: usize) {
        self.output_buffered.inc_by(bytes as u64);
    }

    pub fn output_sent_to_websocket(&self, bytes: usize) {
        self.output_websocket.inc_by(bytes as u64);
    }

    /// Counts a subscriber until the returned guard drops.
    /// `count` sessions taken over from another replica.
    pub fn count_takeovers(&self, count: usize) {
        self.takeovers.inc_by(count as u64);
    }

    pub fn subscriber(&self, transport: Transport) -> SubscriberGuard {
        let gauge = self
            .subscribers
            .get_or_create(&TransportLabel {
                transport: transport.label(),
            })
            .clone();
        gauge.inc();
        SubscriberGuard { gauge }
    }

    pub fn apiserver_request(&self, verb: &str, resource: &str) {
        self.apiserver_requests
            .get_or_create(&ApiRequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            })
            .inc();
    }

    /// A watch session's workspace checkpoint was stored, or failed.
    pub fn workspace_checkpoint(&self, stored: bool) {
        let outcome = if stored { "stored" } else { "failed" };
        self.workspace_checkpoints
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// The counter a shared watch bumps each time it is re-established.
    pub fn watch_restarts(&self, watch: &'static str) -> Counter {
        self.watch_restarts
            .get_or_create(&WatchLabel { watch })
            .clone()
    }

    /// The exposition, with `sessions` set from `count_in_state`.
    pub fn encode(&self, count_in_state: impl Fn(&str) -> usize) -> Result<String, fmt::Error> {
        for state in SESSION_STATES {
            let count = i64::try_from(count_in_state(state)).unwrap_or(i64::MAX);
            self.sessions
                .get_or_create(&StateLabel { state })
                .set(count);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// A connected subscriber; uncounted on drop.
pub struct SubscriberGuard {
    gauge: Gauge,
}

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_and_state() {
        let metrics = Metrics::new();
        metrics.session_started(false);
        metrics.start_failed(crate::backend_session::StartStage::Create);
        metrics.output_buffered(5);
        metrics.apiserver_request("create", "pods");
        metrics.watch_restarts("pods").inc();
        let _guard = metrics.subscriber(Transport::Sse);
        let text = metrics
            .encode(|state| usize::from(state == "running"))
            .expect("encodes");
        for line in [
            r#"telo_runner_sessions{state="running"} 1"#,
            r#"telo_runner_sessions{state="stopped"} 0"#,
            r#"telo_runner_session_starts_total{kind="run"} 1"#,
            r#"telo_runner_session_start_failures_total{stage="create"} 1"#,
            r#"telo_runner_output_bytes_total{destination="replay_buffer"} 5"#,
            r#"telo_runner_subscribers{transport="sse"} 1"#,
            r#"telo_runner_subscribers{transport="websocket"} 0"#,
            r#"telo_runner_apiserver_requests_total{verb="create",resource="pods"} 1"#,
            r#"telo_runner_watch_restarts_total{watch="pods"} 1"#,
            "telo_runner_session_start_duration_seconds_count 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_subscriber_is_uncounted_when_it_goes_away() {
        let metrics = Metrics::new();
        let guard = metrics.subscriber(Transport::WebSocket);
        drop(guard);
        let text = metrics.encode(|_| 0).expect("encodes");
        assert!(text.contains(r#"telo_runner_subscribers{transport="websocket"} 0"#));
    }
}
