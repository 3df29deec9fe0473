//! Session lifecycle webhooks: each session's steps (created, running,
//! suspended, resumed, ended) are POSTed to the operator's
//! `RUNNER_WEBHOOK_URL` as CloudEvents 1.0 in structured mode, signed with
//! the secret of `RUNNER_WEBHOOK_SECRET_FILE`.
//!
//! # The request
//!
//! ```text
//! POST <RUNNER_WEBHOOK_URL>
//! Content-Type: application/cloudevents+json
//! Webhook-Timestamp: 1767225600
//! Webhook-Signature: sha256=5d0c…
//!
//! {"specversion":"1.0","id":"0b6e…","source":"telo-runner",
//!  "type":"dev.telo.runner.session.ended","subject":"<session id>",
//!  "time":"2026-01-01T00:00:00.123Z","datacontenttype":"application/json",
//!  "data":{"sessionId":"<session id>","mode":"run","tenant":"acme",
//!          "principal":"alice","status":"exited","exitCode":0}}
//! ```
//!
//! `data` leaves out what the session does not have (`tenant`, `principal`,
//! and `status` and `exitCode` before it ends).
//!
//! # Verifying a delivery
//!
//! `Webhook-Signature` is `sha256=` followed by the lowercase hex
//! HMAC-SHA256, keyed with the secret file's contents (surrounding
//! whitespace trimmed), of the `Webhook-Timestamp` value, a `.`, and the
//! request body exactly as received:
//!
//! ```text
//! expected = "sha256=" + hex(hmac_sha256(secret, timestamp + "." + body))
//! ```
//!
//! A receiver compares the two in constant time and refuses a timestamp far
//! from its clock (say, more than five minutes), so a captured request
//! cannot be replayed. [`verify`] does exactly this check but the clock.
//!
//! # Delivery
//!
//! One worker sends the events in the order they were emitted, one at a
//! time, so a session's events arrive in order. A 2xx answer delivers the
//! event; a 4xx other than 408 and 429 (or a redirect, which is not
//! followed) drops it at once; 5xx, 408, 429, timeouts (10 s a request) and
//! connection failures are retried, up to 8 attempts, after 1 s, 2 s, 4 s …
//! up to 60 s, each shortened by up to half at random, or after what
//! `Retry-After` asks (at most 60 s). Delivery is at least once: a retry
//! after an answer that never arrived may repeat an event the receiver has
//! already seen, with the same `id`, so receivers drop repeated ids.
//!
//! Emitting never waits: events queue (1,000 at most) and when the queue is
//! full the oldest waiting one is dropped. Dropped events are logged and
//! counted ([`Webhooks::dropped`]). The secret is never logged, and neither
//! is the URL's query or user info.

mod config;
mod delivery;
mod event;
mod signature;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::tasks::OwnedTasks;

pub use config::{WebhookConfig, load_webhook_config, shown_url};
pub use delivery::DeliveryPolicy;
pub use event::{
    CLOUDEVENTS_CONTENT_TYPE, EVENT_SOURCE, LifecycleEvent, LifecycleKind, cloud_event,
    new_event_id,
};
pub use signature::{SIGNATURE_HEADER, TIMESTAMP_HEADER, sign, verify};

use delivery::{Outcome, deliver};

/// How long [`Webhooks::shutdown`] waits for the worker to stop once it has
/// been told to (it stops at once; the bound is against a wedged runtime).
const JOIN_BOUND: Duration = Duration::from_secs(5);

/// Running totals of the deliveries, for tests and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebhookStats {
    /// Events a receiver took (2xx).
    pub delivered: u64,
    /// Events given up on: pushed out of a full queue, refused, out of
    /// attempts, or still waiting when shutdown's grace ran out.
    pub dropped: u64,
    /// Attempts that failed and could be retried (5xx, 408, 429, timeouts,
    /// connection failures).
    pub failed_attempts: u64,
}

/// Counters the totals are also added to, for a metrics registry.
#[derive(Debug, Clone, Default)]
pub struct WebhookCounters {
    pub delivered: Counter,
    pub dropped: Counter,
    pub failed_attempts: Counter,
}

/// The lifecycle webhook sender: a bounded queue and the one task that
/// delivers from it. Clones share both.
#[derive(Clone)]
pub struct Webhooks {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("url", &shown_url(&self.inner.url))
            .field("stats", &*self.inner.shared.stats.borrow())
            .finish()
    }
}

struct Inner {
    shared: Arc<Shared>,
    tasks: OwnedTasks,
    /// Fires when the worker has delivered (or given up on) everything
    /// queued after shutdown began.
    drained: CancellationToken,
    url: reqwest::Url,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropped without shutdown: the worker goes with the last handle.
        self.tasks.stop();
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    stats: watch::Sender<WebhookStats>,
    counters: Option<WebhookCounters>,
    capacity: usize,
}

#[derive(Default)]
struct Queue {
    events: VecDeque<LifecycleEvent>,
    /// The worker holds an event it has not finished with.
    in_flight: bool,
    /// Shutdown has begun: nothing more is accepted.
    closed: bool,
}

enum Count {
    Delivered,
    Dropped(u64),
    FailedAttempt,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, count: Count) {
        self.stats.send_modify(|stats| match count {
            Count::Delivered => stats.delivered += 1,
            Count::Dropped(n) => stats.dropped += n,
            Count::FailedAttempt => stats.failed_attempts += 1,
        });
        if let Some(counters) = &self.counters {
            match count {
                Count::Delivered => counters.delivered.inc(),
                Count::Dropped(n) => counters.dropped.inc_by(n),
                Count::FailedAttempt => counters.failed_attempts.inc(),
            };
        }
    }
}

impl Webhooks {
    /// Starts the delivery task with the production [`DeliveryPolicy`]. The
    /// task is owned: [`Self::shutdown`] stops and joins it, and it stops
    /// when the last clone is dropped. Must be called inside a Tokio runtime.
    pub fn start(config: WebhookConfig, counters: Option<WebhookCounters>) -> Self {
        Self::start_with(config, counters, DeliveryPolicy::default())
    }

    /// [`Self::start`] with another policy (shorter waits for tests).
    pub fn start_with(
        config: WebhookConfig,
        counters: Option<WebhookCounters>,
        policy: DeliveryPolicy,
    ) -> Self {
        let (stats, _) = watch::channel(WebhookStats::default());
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            stats,
            counters,
            capacity: policy.queue_capacity.max(1),
        });
        let tasks = OwnedTasks::new();
        let drained = CancellationToken::new();
        let url = config.url.clone();
        tasks.spawn(run(shared.clone(), config, policy, drained.clone()));
        Self {
            inner: Arc::new(Inner {
                shared,
                tasks,
                drained,
                url,
            }),
        }
    }

    /// Queues `event` for delivery. Never blocks and never awaits: when the
    /// queue is full the oldest waiting event is dropped (and counted) to
    /// make room. After shutdown has begun, events are ignored.
    pub fn emit(&self, event: LifecycleEvent) {
        let shared = &self.inner.shared;
        let pushed_out = {
            let mut queue = shared.queue();
            if queue.closed {
                drop(queue);
                debug!(session = %event.session_id, event = event.kind.event_type(), "webhook event after shutdown ignored");
                return;
            }
            let pushed_out = if queue.events.len() >= shared.capacity {
                queue.events.pop_front()
            } else {
                None
            };
            queue.events.push_back(event);
            pushed_out
        };
        shared.wake.notify_one();
        if let Some(old) = pushed_out {
            shared.count(Count::Dropped(1));
            warn!(session = %old.session_id, event = old.kind.event_type(), "webhook event dropped: the queue is full");
        }
    }

    /// Stops accepting events, gives the worker at most `grace` to deliver
    /// what is queued, then stops it and waits for it. Events still undelivered
    /// then are dropped and counted.
    pub async fn shutdown(&self, grace: Duration) {
        let inner = &self.inner;
        inner.shared.queue().closed = true;
        inner.shared.wake.notify_one();
        let drained = tokio::time::timeout(grace, inner.drained.cancelled())
            .await
            .is_ok();
        inner.tasks.shutdown(JOIN_BOUND).await;
        let lost = {
            let mut queue = inner.shared.queue();
            let lost = queue.events.len() as u64 + u64::from(queue.in_flight);
            queue.events.clear();
            queue.in_flight = false;
            lost
        };
        if lost > 0 {
            inner.shared.count(Count::Dropped(lost));
            warn!(
                events = lost,
                drained, "webhook events undelivered at shutdown were dropped"
            );
        }
    }

    /// Events dropped: pushed out of a full queue, refused by the receiver,
    /// out of attempts, or undelivered when shutdown's grace ran out.
    pub fn dropped(&self) -> u64 {
        self.inner.shared.stats.borrow().dropped
    }

    /// The running totals, updated as deliveries happen.
    pub fn stats(&self) -> watch::Receiver<WebhookStats> {
        self.inner.shared.stats.subscribe()
    }
}

enum Next {
    Event(LifecycleEvent),
    Wait,
    Done,
}

/// The worker: delivers queued events one at a time, in order, until
/// shutdown has begun and the queue is empty.
async fn run(
    shared: Arc<Shared>,
    config: WebhookConfig,
    policy: DeliveryPolicy,
    drained: CancellationToken,
) {
    let client = crate::http_client::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|err| {
            warn!(error = %err, "webhook client could not be configured; using the default");
            reqwest::Client::new()
        });
    loop {
        let next = {
            let mut queue = shared.queue();
            match queue.events.pop_front() {
                Some(event) => {
                    queue.in_flight = true;
                    Next::Event(event)
                }
                None if queue.closed => Next::Done,
                None => Next::Wait,
            }
        };
        match next {
            Next::Event(event) => {
                let outcome = deliver(&client, &config, &policy, &event, || {
                    shared.count(Count::FailedAttempt);
                })
                .await;
                shared.queue().in_flight = false;
                shared.count(match outcome {
                    Outcome::Delivered => Count::Delivered,
                    Outcome::Dropped => Count::Dropped(1),
                });
            }
            // `notify_one` keeps a permit when the worker is not waiting, so
            // an event queued between the check and this wait still wakes it.
            Next::Wait => shared.wake.notified().await,
            Next::Done => break,
        }
    }
    drained.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::OffsetDateTime;

    fn event(n: usize) -> LifecycleEvent {
        LifecycleEvent {
            kind: LifecycleKind::Created,
            session_id: format!("s{n}"),
            mode: "run".into(),
            tenant: None,
            subject: None,
            status: None,
            exit_code: None,
            time: OffsetDateTime::UNIX_EPOCH,
        }
    }

    /// A webhook pointed at a port nothing listens on, so the worker is
    /// busy retrying its first event while the test fills the queue.
    fn unreachable(capacity: usize) -> Webhooks {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("port")
            .port();
        let config = WebhookConfig {
            url: reqwest::Url::parse(&format!("http://127.0.0.1:{port}/hook")).expect("url"),
            secret: b"secret".to_vec(),
        };
        Webhooks::start_with(
            config,
            None,
            DeliveryPolicy {
                queue_capacity: capacity,
                first_backoff: Duration::from_secs(3600),
                max_backoff: Duration::from_secs(3600),
                ..DeliveryPolicy::default()
            },
        )
    }

    #[tokio::test]
    async fn a_full_queue_drops_the_oldest_waiting_event() {
        let webhooks = unreachable(3);
        for n in 0..10 {
            webhooks.emit(event(n));
        }
        // Whether or not the worker has taken one event yet, the queue holds
        // the three newest and the others are counted.
        let (waiting, held) = {
            let queue = webhooks.inner.shared.queue();
            let waiting: Vec<String> = queue
                .events
                .iter()
                .map(|event| event.session_id.clone())
                .collect();
            let held = waiting.len() as u64 + u64::from(queue.in_flight);
            (waiting, held)
        };
        assert_eq!(waiting, ["s7", "s8", "s9"]);
        assert_eq!(webhooks.dropped(), 10 - held);
        webhooks.shutdown(Duration::ZERO).await;
        assert_eq!(webhooks.dropped(), 10);
    }

    #[tokio::test]
    async fn events_after_shutdown_are_ignored() {
        let webhooks = unreachable(3);
        webhooks.shutdown(Duration::from_secs(5)).await;
        webhooks.emit(event(1));
        assert!(webhooks.inner.shared.queue().events.is_empty());
        assert_eq!(webhooks.dropped(), 0);
    }

    #[tokio::test]
    async fn dropping_the_last_handle_stops_the_worker() {
        let webhooks = unreachable(3);
        let tasks = webhooks.inner.tasks.clone();
        let stopping = tasks.stopping();
        webhooks.emit(event(1));
        drop(webhooks);
        tokio::time::timeout(Duration::from_secs(10), stopping.cancelled())
            .await
            .expect("the worker is told to stop");
        tasks.shutdown(Duration::from_secs(10)).await;
    }
}
