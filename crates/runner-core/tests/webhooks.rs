//! Lifecycle webhooks against a real receiver on a loopback port: what is
//! sent, how it is signed, and what happens when the receiver is down, slow,
//! failing, refusing or swamped.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use runner_core::webhooks::{
    DeliveryPolicy, LifecycleEvent, LifecycleKind, WebhookConfig, WebhookStats, Webhooks, verify,
};
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

const SECRET: &[u8] = b"webhook test secret";
const WAIT: Duration = Duration::from_secs(30);

/// How the receiver answers one request.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Status(u16),
    /// The status with `Retry-After: 0`.
    StatusRetryNow(u16),
    /// No answer until [`Receiver::release`] (or ever).
    Hold,
}

/// One request the receiver answered.
#[derive(Debug)]
struct Record {
    status: u16,
    content_type: Option<String>,
    signed: bool,
    timestamp: i64,
    body: Value,
}

impl Record {
    fn id(&self) -> &str {
        self.body["id"].as_str().unwrap_or_default()
    }

    fn session(&self) -> &str {
        self.body["subject"].as_str().unwrap_or_default()
    }
}

#[derive(Clone)]
struct Hook {
    script: Arc<Mutex<VecDeque<Answer>>>,
    records: mpsc::UnboundedSender<Record>,
    held: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

async fn hook(State(hook): State<Hook>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = hook
        .script
        .lock()
        .expect("script")
        .pop_front()
        .unwrap_or(Answer::Status(200));
    let (status, retry_now) = match answer {
        Answer::Status(status) => (status, false),
        Answer::StatusRetryNow(status) => (status, true),
        Answer::Hold => {
            let released = hook.release.notified();
            let _ = hook.held.send(());
            released.await;
            (200, false)
        }
    };
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let timestamp = text("webhook-timestamp").unwrap_or_default();
    let signature = text("webhook-signature").unwrap_or_default();
    let _ = hook.records.send(Record {
        status,
        content_type: text("content-type"),
        signed: verify(SECRET, &timestamp, &signature, &body),
        timestamp: timestamp.parse().unwrap_or_default(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    let status = StatusCode::from_u16(status).expect("status");
    if retry_now {
        (status, [(header::RETRY_AFTER, "0")]).into_response()
    } else {
        status.into_response()
    }
}

/// A webhook receiver that records every request it answers.
struct Receiver {
    addr: SocketAddr,
    records: mpsc::UnboundedReceiver<Record>,
    held: mpsc::UnboundedReceiver<()>,
    release: Arc<Notify>,
    server: JoinHandle<()>,
}

impl Receiver {
    async fn start(script: &[Answer]) -> Self {
        Self::start_on(
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind"),
            script,
        )
    }

    fn start_on(listener: tokio::net::TcpListener, script: &[Answer]) -> Self {
        let addr = listener.local_addr().expect("addr");
        let (records_tx, records) = mpsc::unbounded_channel();
        let (held_tx, held) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let state = Hook {
            script: Arc::new(Mutex::new(script.iter().copied().collect())),
            records: records_tx,
            held: held_tx,
            release: release.clone(),
        };
        let app = Router::new().route("/hook", post(hook)).with_state(state);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            records,
            held,
            release,
            server,
        }
    }

    fn url(&self) -> reqwest::Url {
        url_on(self.addr)
    }

    async fn next(&mut self) -> Record {
        tokio::time::timeout(WAIT, self.records.recv())
            .await
            .expect("a request in time")
            .expect("the receiver is running")
    }

    /// The next `count` requests that were answered with a 2xx.
    async fn delivered(&mut self, count: usize) -> Vec<Record> {
        let mut delivered = Vec::new();
        while delivered.len() < count {
            let record = self.next().await;
            if (200..300).contains(&record.status) {
                delivered.push(record);
            }
        }
        delivered
    }

    async fn until_held(&mut self) {
        tokio::time::timeout(WAIT, self.held.recv())
            .await
            .expect("a held request in time")
            .expect("the receiver is running");
    }

    fn release(&self) {
        self.release.notify_waiters();
    }

    async fn stop(self) {
        self.server.abort();
        let _ = self.server.await;
    }
}

fn url_on(addr: SocketAddr) -> reqwest::Url {
    reqwest::Url::parse(&format!("http://{addr}/hook")).expect("url")
}

fn config(url: reqwest::Url) -> WebhookConfig {
    WebhookConfig {
        url,
        secret: SECRET.to_vec(),
    }
}

/// The production policy with waits short enough for a test.
fn quick() -> DeliveryPolicy {
    DeliveryPolicy {
        request_timeout: Duration::from_secs(10),
        first_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        ..DeliveryPolicy::default()
    }
}

fn event(kind: LifecycleKind, session: &str) -> LifecycleEvent {
    LifecycleEvent {
        kind,
        session_id: session.to_owned(),
        mode: "run".into(),
        tenant: None,
        subject: None,
        status: None,
        exit_code: None,
        time: OffsetDateTime::now_utc(),
    }
}

async fn until(stats: &mut watch::Receiver<WebhookStats>, what: impl Fn(&WebhookStats) -> bool) {
    tokio::time::timeout(WAIT, stats.wait_for(|stats| what(stats)))
        .await
        .expect("the stats in time")
        .expect("the webhooks are running");
}

fn sessions(records: &[Record]) -> Vec<&str> {
    records.iter().map(Record::session).collect()
}

#[tokio::test]
async fn events_arrive_in_order_as_signed_cloud_events() {
    let mut receiver = Receiver::start(&[]).await;
    let webhooks = Webhooks::start_with(config(receiver.url()), None, quick());
    let at = OffsetDateTime::from_unix_timestamp_nanos(1_767_225_600_123_456_789).expect("time");
    let before = OffsetDateTime::now_utc().unix_timestamp();
    webhooks.emit(LifecycleEvent {
        kind: LifecycleKind::Created,
        session_id: "aaaaaaaaaaaa".into(),
        mode: "watch".into(),
        tenant: Some("acme".into()),
        subject: Some("alice".into()),
        status: None,
        exit_code: None,
        time: at,
    });
    for kind in [
        LifecycleKind::Running,
        LifecycleKind::Suspended,
        LifecycleKind::Resumed,
    ] {
        webhooks.emit(event(kind, "aaaaaaaaaaaa"));
    }
    webhooks.emit(LifecycleEvent {
        status: Some("exited".into()),
        exit_code: Some(0),
        ..event(LifecycleKind::Ended, "aaaaaaaaaaaa")
    });

    let records = receiver.delivered(5).await;
    let after = OffsetDateTime::now_utc().unix_timestamp();
    for record in &records {
        assert_eq!(
            record.content_type.as_deref(),
            Some("application/cloudevents+json")
        );
        assert!(record.signed, "bad signature on {:?}", record.body);
        assert!((before..=after).contains(&record.timestamp));
        assert_eq!(record.body["specversion"], "1.0");
        assert_eq!(record.body["source"], "telo-runner");
        assert_eq!(record.body["subject"], "aaaaaaaaaaaa");
        assert_eq!(record.body["datacontenttype"], "application/json");
        assert_eq!(record.body["data"]["sessionId"], "aaaaaaaaaaaa");
    }
    let types: Vec<&str> = records
        .iter()
        .map(|record| record.body["type"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        types,
        [
            "dev.telo.runner.session.created",
            "dev.telo.runner.session.running",
            "dev.telo.runner.session.suspended",
            "dev.telo.runner.session.resumed",
            "dev.telo.runner.session.ended",
        ]
    );
    assert_eq!(records[0].body["time"], "2026-01-01T00:00:00.123Z");
    assert_eq!(
        records[0].body["data"],
        json!({"sessionId": "aaaaaaaaaaaa", "mode": "watch", "tenant": "acme", "principal": "alice"})
    );
    assert_eq!(
        records[4].body["data"],
        json!({"sessionId": "aaaaaaaaaaaa", "mode": "run", "status": "exited", "exitCode": 0})
    );
    let ids: std::collections::HashSet<&str> = records.iter().map(Record::id).collect();
    assert_eq!(ids.len(), 5);

    webhooks.shutdown(WAIT).await;
    assert_eq!(
        *webhooks.stats().borrow(),
        WebhookStats {
            delivered: 5,
            dropped: 0,
            failed_attempts: 0
        }
    );
    receiver.stop().await;
}

#[tokio::test]
async fn a_receiver_down_then_slow_then_up_gets_every_event_once_in_order() {
    // Down: every connection is cut before an answer. The port stays this
    // test's, so nothing else can take it before the receiver comes up.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("port");
    let addr = listener.local_addr().expect("addr");
    let down = tokio_util::sync::CancellationToken::new();
    let cutter = {
        let down = down.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = down.cancelled() => return listener,
                    accepted = listener.accept() => drop(accepted),
                }
            }
        })
    };
    let policy = DeliveryPolicy {
        request_timeout: Duration::from_millis(300),
        max_attempts: 100,
        ..quick()
    };
    let webhooks = Webhooks::start_with(config(url_on(addr)), None, policy);
    let mut stats = webhooks.stats();
    let names: Vec<String> = (0..5).map(|n| format!("session{n}")).collect();
    for name in &names {
        webhooks.emit(event(LifecycleKind::Created, name));
    }
    until(&mut stats, |stats| stats.failed_attempts >= 1).await;

    // Up, but too slow: the first two requests get no answer in time.
    down.cancel();
    let listener = cutter.await.expect("the cut-off listener");
    let mut receiver = Receiver::start_on(listener, &[Answer::Hold, Answer::Hold]);
    receiver.until_held().await;
    receiver.until_held().await;

    // Then answering: everything arrives, once and in order.
    let records = receiver.delivered(names.len()).await;
    assert_eq!(sessions(&records), names);
    assert!(records.iter().all(|record| record.signed));
    let ids: std::collections::HashSet<&str> = records.iter().map(Record::id).collect();
    assert_eq!(ids.len(), names.len());

    webhooks.shutdown(WAIT).await;
    let stats = *webhooks.stats().borrow();
    assert_eq!(stats.delivered, 5);
    assert_eq!(stats.dropped, 0);
    assert!(stats.failed_attempts >= 3, "{stats:?}");
    assert!(
        receiver.records.try_recv().is_err(),
        "an event arrived twice"
    );
    receiver.stop().await;
}

#[tokio::test]
async fn server_errors_408_and_429_are_retried_with_the_same_id() {
    let mut receiver = Receiver::start(&[
        Answer::Status(500),
        Answer::StatusRetryNow(429),
        Answer::Status(408),
        Answer::Status(503),
    ])
    .await;
    let webhooks = Webhooks::start_with(config(receiver.url()), None, quick());
    webhooks.emit(event(LifecycleKind::Running, "retried"));
    let mut statuses = Vec::new();
    let mut ids = Vec::new();
    loop {
        let record = receiver.next().await;
        assert!(record.signed);
        statuses.push(record.status);
        ids.push(record.id().to_owned());
        if record.status == 200 {
            break;
        }
    }
    assert_eq!(statuses, [500, 429, 408, 503, 200]);
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    webhooks.shutdown(WAIT).await;
    assert_eq!(
        *webhooks.stats().borrow(),
        WebhookStats {
            delivered: 1,
            dropped: 0,
            failed_attempts: 4
        }
    );
    receiver.stop().await;
}

#[tokio::test]
async fn a_client_error_drops_the_event_at_once() {
    let mut receiver = Receiver::start(&[Answer::Status(400)]).await;
    let webhooks = Webhooks::start_with(config(receiver.url()), None, quick());
    webhooks.emit(event(LifecycleKind::Created, "refused"));
    webhooks.emit(event(LifecycleKind::Created, "accepted"));
    let first = receiver.next().await;
    assert_eq!((first.status, first.session()), (400, "refused"));
    let second = receiver.next().await;
    assert_eq!((second.status, second.session()), (200, "accepted"));
    webhooks.shutdown(WAIT).await;
    assert_eq!(webhooks.dropped(), 1);
    assert_eq!(
        *webhooks.stats().borrow(),
        WebhookStats {
            delivered: 1,
            dropped: 1,
            failed_attempts: 0
        }
    );
    receiver.stop().await;
}

#[tokio::test]
async fn an_event_out_of_attempts_is_dropped_and_the_next_one_sent() {
    let mut receiver = Receiver::start(&[Answer::Status(502); 3]).await;
    let policy = DeliveryPolicy {
        max_attempts: 3,
        ..quick()
    };
    let webhooks = Webhooks::start_with(config(receiver.url()), None, policy);
    webhooks.emit(event(LifecycleKind::Created, "given-up"));
    webhooks.emit(event(LifecycleKind::Created, "next"));
    for _ in 0..3 {
        let record = receiver.next().await;
        assert_eq!((record.status, record.session()), (502, "given-up"));
    }
    let record = receiver.next().await;
    assert_eq!((record.status, record.session()), (200, "next"));
    webhooks.shutdown(WAIT).await;
    assert_eq!(
        *webhooks.stats().borrow(),
        WebhookStats {
            delivered: 1,
            dropped: 1,
            failed_attempts: 3
        }
    );
    receiver.stop().await;
}

#[tokio::test]
async fn a_full_queue_drops_the_oldest_and_emit_returns_at_once() {
    let mut receiver = Receiver::start(&[Answer::Hold]).await;
    let policy = DeliveryPolicy {
        request_timeout: Duration::from_secs(60),
        ..quick()
    };
    let webhooks = Webhooks::start_with(config(receiver.url()), None, policy);
    webhooks.emit(event(LifecycleKind::Created, "held"));
    receiver.until_held().await;

    // The worker is stuck on the first event; 1,500 more overflow the
    // 1,000-event queue without slowing the caller.
    let started = Instant::now();
    for n in 0..1_500 {
        webhooks.emit(event(LifecycleKind::Running, &format!("e{n}")));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "emit took {took:?}");
    assert_eq!(webhooks.dropped(), 500);

    receiver.release();
    let records = receiver.delivered(1_001).await;
    let expected: Vec<String> = std::iter::once("held".to_owned())
        .chain((500..1_500).map(|n| format!("e{n}")))
        .collect();
    assert_eq!(sessions(&records), expected);
    webhooks.shutdown(WAIT).await;
    assert_eq!(webhooks.dropped(), 500);
    receiver.stop().await;
}

#[tokio::test]
async fn shutdown_delivers_what_is_queued_within_its_grace() {
    let mut receiver = Receiver::start(&[Answer::Hold]).await;
    let webhooks = Webhooks::start_with(config(receiver.url()), None, quick());
    let names: Vec<String> = (0..10).map(|n| format!("queued{n}")).collect();
    for name in &names {
        webhooks.emit(event(LifecycleKind::Ended, name));
    }
    receiver.until_held().await;

    let shutting = {
        let webhooks = webhooks.clone();
        tokio::spawn(async move { webhooks.shutdown(WAIT).await })
    };
    // What was queued before shutdown began still goes out, in order.
    receiver.release();
    let records = receiver.delivered(names.len()).await;
    assert_eq!(sessions(&records), names);
    tokio::time::timeout(WAIT, shutting)
        .await
        .expect("shutdown returns once the queue is empty")
        .expect("shutdown");
    webhooks.emit(event(LifecycleKind::Ended, "late"));
    assert_eq!(webhooks.dropped(), 0);
    assert_eq!(webhooks.stats().borrow().delivered, 10);
    assert!(receiver.records.try_recv().is_err());
    receiver.stop().await;
}

#[tokio::test]
async fn shutdown_gives_up_when_its_grace_runs_out() {
    let mut receiver = Receiver::start(&[Answer::Hold]).await;
    let policy = DeliveryPolicy {
        request_timeout: Duration::from_secs(60),
        ..quick()
    };
    let webhooks = Webhooks::start_with(config(receiver.url()), None, policy);
    for n in 0..10 {
        webhooks.emit(event(LifecycleKind::Ended, &format!("s{n}")));
    }
    receiver.until_held().await;
    let started = Instant::now();
    webhooks.shutdown(Duration::from_millis(200)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
    // The held one and the nine behind it.
    assert_eq!(webhooks.dropped(), 10);
    receiver.stop().await;
}
