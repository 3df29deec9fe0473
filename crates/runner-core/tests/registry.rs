//! Registry behaviour that needs control over when a backend's start resolves:
//! a scripted backend stands in for a slow workload.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use runner_core::backend::{
    Backend, BackendCapabilities, BackendSession, ProbeConfig, StartError, StartSpec, StartStage,
    StopError,
};
use runner_core::edge::{EdgeRefusal, EdgeResolver, SessionHost};
use runner_core::reach::Reach;
use runner_core::registry::{RegistryLimits, SessionRegistry, SessionSink};
use runner_core::types::{
    AvailabilityReport, PortMapping, PortProtocol, PullPolicy, RunBundle, RunStatus, SessionConfig,
};
use serde_json::{Value, json};
use tokio::sync::{Mutex, oneshot};

/// Starts resolve when the test says so.
struct GatedBackend {
    gates: Mutex<Vec<oneshot::Receiver<Result<(), StartError>>>>,
    stops: Arc<AtomicUsize>,
}

struct GatedSession {
    sink: SessionSink,
    stops: Arc<AtomicUsize>,
}

#[async_trait]
impl BackendSession for GatedSession {
    fn write_stdin(&self, bytes: Bytes) {
        self.sink.output(bytes);
    }
    fn resize(&self, _cols: u16, _rows: u16) {}
    async fn stop(&self) -> Result<(), StopError> {
        self.stops.fetch_add(1, Ordering::SeqCst);
        let status = if self.sink.is_user_stopped() {
            RunStatus::Stopped
        } else {
            RunStatus::failed("killed")
        };
        self.sink.status(status);
        Ok(())
    }
}

#[async_trait]
impl Backend for GatedBackend {
    fn capabilities(&self) -> BackendCapabilities {
        BackendCapabilities {
            display_name: "gated".into(),
            description: "test".into(),
            config_schema: json!({}),
            features: runner_core::backend::BackendFeatures {
                io: vec![runner_core::watch_types::IoMode::Tty],
                ports: false,
            },
            default_config: SessionConfig {
                image: "img".into(),
                pull_policy: PullPolicy::Missing,
                registry_url: None,
            },
        }
    }
    async fn probe(&self, _config: &ProbeConfig) -> AvailabilityReport {
        AvailabilityReport::Ready
    }
    async fn start(
        &self,
        spec: StartSpec,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        let gate = self.gates.lock().await.remove(0);
        gate.await.expect("gate kept")?;
        sink.reach_at(Reach::LOOPBACK);
        // Like a kernel, it says something once it is up: that is what
        // makes the runner announce `running`.
        sink.output(Bytes::from_static(b"up\r\n"));
        // The ports it was asked for are its endpoints, as a backend
        // without a routing layer reports them.
        sink.status(if spec.ports.is_empty() {
            RunStatus::Running {
                endpoints: None,
                inspect_url: None,
                agent: None,
            }
        } else {
            RunStatus::running_unrouted(&spec.ports)
        });
        Ok(Arc::new(GatedSession {
            sink,
            stops: self.stops.clone(),
        }))
    }
}

fn spec(id: &str, created_at: &str) -> StartSpec {
    StartSpec {
        session_id: id.into(),
        created_at: created_at.into(),
        bundle: RunBundle {
            entry_relative_path: "telo.yaml".into(),
            files: vec![],
        },
        entry_relative_path: "telo.yaml".into(),
        env: vec![],
        ports: vec![],
        config: SessionConfig {
            image: "x".into(),
            pull_policy: PullPolicy::Missing,
            registry_url: None,
        },
        app: None,
        inspect: false,
        telo: None,
        owner: None,
    }
}

type Gate = oneshot::Sender<Result<(), StartError>>;

fn registry(starts: usize) -> (SessionRegistry, Vec<Gate>, Arc<AtomicUsize>) {
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..starts {
        let (tx, rx) = oneshot::channel();
        senders.push(tx);
        receivers.push(rx);
    }
    let stops = Arc::new(AtomicUsize::new(0));
    let backend = GatedBackend {
        gates: Mutex::new(receivers),
        stops: stops.clone(),
    };
    let registry = SessionRegistry::new(
        Arc::new(backend),
        RegistryLimits {
            max_sessions: 4,
            exit_ttl: Duration::from_secs(3600),
            replay_buffer_bytes: 1_000_000,
            watch: Default::default(),
        },
    );
    (registry, senders, stops)
}

async fn statuses_until_terminal(registry: &SessionRegistry, id: &str) -> Vec<Value> {
    let session = registry.get(id).expect("session");
    let mut cursor = session.subscribe_events(0);
    let mut statuses = Vec::new();
    loop {
        let batch = tokio::time::timeout(Duration::from_secs(5), cursor.next())
            .await
            .expect("terminal status in time");
        for (_, frame) in batch.entries {
            let event: Value = serde_json::from_slice(&frame.data).unwrap();
            if frame.name == "status" {
                statuses.push(event["status"].clone());
            }
            if frame.terminal {
                return statuses;
            }
        }
    }
}

#[tokio::test]
async fn a_delete_during_start_is_honoured_once_the_workload_is_up() {
    let (registry, mut gates, stops) = registry(1);
    let created = registry.create(spec).unwrap();
    registry.stop(&created.session_id).await.unwrap();
    assert_eq!(stops.load(Ordering::SeqCst), 0, "nothing to stop yet");
    gates.remove(0).send(Ok(())).unwrap();
    let statuses = statuses_until_terminal(&registry, &created.session_id).await;
    assert_eq!(
        statuses,
        vec![
            json!({"kind": "starting"}),
            json!({"kind": "running"}),
            json!({"kind": "stopped"})
        ]
    );
    assert_eq!(stops.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_start_failure_is_a_terminal_failed_status_with_its_stage() {
    let (registry, mut gates, _) = registry(1);
    let created = registry.create(spec).unwrap();
    gates
        .remove(0)
        .send(Err(StartError::new(
            StartStage::Create,
            "could not create the session pod",
        )))
        .unwrap();
    let statuses = statuses_until_terminal(&registry, &created.session_id).await;
    assert_eq!(
        statuses.last().unwrap(),
        &json!({"kind": "failed", "message": "create: could not create the session pod"})
    );
    // A DELETE before a failed start still ends as `failed`.
    let snapshot = registry.get(&created.session_id).unwrap().snapshot();
    assert!(snapshot.exited_at.is_some());
}

#[tokio::test]
async fn nothing_follows_the_terminal_status() {
    let (registry, mut gates, _) = registry(1);
    let created = registry.create(spec).unwrap();
    gates.remove(0).send(Ok(())).unwrap();
    registry.stop(&created.session_id).await.unwrap();
    let statuses = statuses_until_terminal(&registry, &created.session_id).await;
    let session = registry.get(&created.session_id).unwrap();
    let handle = session.handle().expect("started");
    handle.stop().await.unwrap();
    let replay = session.replay_events(0);
    let terminal_count = replay.entries.iter().filter(|(_, f)| f.terminal).count();
    assert_eq!(terminal_count, 1);
    assert!(replay.entries.last().unwrap().1.terminal);
    assert_eq!(statuses.last().unwrap(), &json!({"kind": "stopped"}));
}

#[tokio::test]
async fn shutdown_reports_every_session_stopped_even_one_still_starting() {
    let (registry, mut gates, _) = registry(2);
    let live = registry.create(spec).unwrap();
    let starting = registry.create(spec).unwrap();
    gates.remove(0).send(Ok(())).unwrap();
    let live_session = registry.get(&live.session_id).unwrap();
    let mut cursor = live_session.subscribe_events(0);
    while live_session.handle().is_none() {
        cursor.next().await;
    }
    registry.shutdown(Duration::from_millis(200)).await;
    assert_eq!(
        registry.get(&live.session_id).unwrap().status(),
        RunStatus::Stopped
    );
    assert_eq!(
        registry.get(&starting.session_id).unwrap().status(),
        RunStatus::Stopped
    );
    drop(gates);
}

/// A registry with one session made by `build_spec`, once its start
/// resolved and its handle is installed.
async fn one_up(
    build_spec: fn(&str, &str) -> StartSpec,
) -> (SessionRegistry, Arc<runner_core::registry::Session>) {
    let (registry, mut gates, _) = registry(1);
    let created = registry.create(build_spec).unwrap();
    gates.remove(0).send(Ok(())).unwrap();
    let session = registry.get(&created.session_id).unwrap();
    let mut events = session.subscribe_events(0);
    while session.handle().is_none() {
        events.next().await;
    }
    (registry, session)
}

#[tokio::test]
async fn a_slow_subscriber_learns_of_evicted_output_through_a_gap() {
    let (_registry, session) = one_up(spec).await;
    let mut slow = session.subscribe_output(0);
    let handle = session.handle().unwrap();
    // 3 MB of output into a 1 MB buffer while the subscriber does not read.
    for _ in 0..48 {
        handle.write_stdin(Bytes::from(vec![b'x'; 64 * 1024]));
    }
    let batch = slow.next().await;
    assert!(batch.gap);
    let bytes: usize = batch.entries.iter().map(|(_, b)| b.bytes.len()).sum();
    assert!(bytes <= 1_000_000);
    // The backend's own `up` line was the first chunk.
    assert_eq!(batch.entries.last().unwrap().0, 49);
}

#[tokio::test]
async fn output_after_the_terminal_status_is_not_recorded() {
    let (registry, session) = one_up(spec).await;
    let handle = session.handle().unwrap();
    handle.write_stdin(Bytes::from_static(b"before\r\n"));
    registry.stop(session.id()).await.unwrap();
    assert!(session.is_terminal());
    let recorded = session.replay_output(0).entries.len();
    // An escaped process still writing into the finished session.
    handle.write_stdin(Bytes::from_static(b"after\r\n"));
    assert_eq!(session.replay_output(0).entries.len(), recorded);
}

fn spec_publishing_8080(id: &str, created_at: &str) -> StartSpec {
    StartSpec {
        ports: vec![PortMapping {
            port: 8080,
            protocol: PortProtocol::Tcp,
        }],
        ..spec(id, created_at)
    }
}

/// A request through the edge holds its session in use: it is not idle
/// while the answer is open, and its idle time starts when the answer
/// ends. A request for a port it does not publish is activity too.
#[tokio::test]
async fn an_edge_request_keeps_its_session_in_use_until_its_answer_ends() {
    let (registry, session) = one_up(spec_publishing_8080).await;
    let host = |port| SessionHost {
        port,
        session_id: session.id().to_owned(),
    };

    let before = tokio::time::Instant::now();
    let (upstream, hold) = registry
        .resolve_now(&host(8080))
        .expect("a running session is told at once")
        .expect("its published port");
    assert_eq!(upstream.port, 8080);
    assert_eq!(
        session.idle_since(),
        None,
        "in use while the answer is open"
    );
    drop(hold);
    let idle = session.idle_since().expect("idle once the answer ended");
    assert!(idle >= before, "idle from the answer's end");

    let before = tokio::time::Instant::now();
    let refused = registry.resolve_now(&host(9999)).expect("told at once");
    assert!(matches!(refused, Err(EdgeRefusal::PortNotPublished)));
    assert!(session.idle_since().expect("idle") >= before);
}
