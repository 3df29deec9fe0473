//! Several replicas serving one installation, end to end: two or three
//! in-process routers on loopback, each with a replica view backed by one
//! shared ownership table, and requests sent to the replica that does not
//! hold the session.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use runner_core::apps::AppCatalog;
use runner_core::auth::AuthTokens;
use runner_core::backend::{
    Backend, BackendCapabilities, BackendSession, ProbeConfig, StartError, StartSpec, StopError,
};
use runner_core::http::{AppState, ServerOptions, router};
use runner_core::registry::{RegistryLimits, SessionRegistry, SessionSink};
use runner_core::replicas::{Owner, PEER_TOKEN_HEADER, Peer, PeerToken, Replicas};
use runner_core::types::{AvailabilityReport, PullPolicy, RunBundle, RunStatus, SessionConfig};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

const PEER_TOKEN: &str = "peer-secret";
const CLIENT_TOKEN: &str = "client-token";
/// The longest any one wait may take.
const DEADLINE: Duration = Duration::from_secs(20);

async fn within<T>(work: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, work)
        .await
        .expect("took too long")
}

// ---------------------------------------------------------------------------
// The cluster

/// What every replica reads: each replica's URL and each session's owner.
#[derive(Default)]
struct Table {
    urls: Mutex<HashMap<String, String>>,
    owners: Mutex<HashMap<String, String>>,
}

/// One replica's view of [`Table`], with what a test makes it believe
/// besides.
struct TestReplicas {
    id: String,
    table: Arc<Table>,
    token: PeerToken,
    believes: Mutex<HashMap<String, Owner>>,
    may_act: AtomicBool,
}

impl Replicas for TestReplicas {
    fn replica_id(&self) -> &str {
        &self.id
    }

    fn owner(&self, session_id: &str) -> Owner {
        if let Some(owner) = self.believes.lock().unwrap().get(session_id) {
            return owner.clone();
        }
        let Some(owner) = self.table.owners.lock().unwrap().get(session_id).cloned() else {
            return Owner::Here;
        };
        if owner == self.id {
            return Owner::Recorded;
        }
        let url = self.table.urls.lock().unwrap()[&owner].clone();
        Owner::Peer(Peer { id: owner, url })
    }

    fn peers(&self) -> Vec<Peer> {
        let mut peers: Vec<Peer> = self
            .table
            .urls
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| **id != self.id)
            .map(|(id, url)| Peer {
                id: id.clone(),
                url: url.clone(),
            })
            .collect();
        peers.sort_by(|a, b| a.id.cmp(&b.id));
        peers
    }

    fn peer_token(&self) -> &PeerToken {
        &self.token
    }

    fn may_act(&self) -> bool {
        self.may_act.load(Ordering::SeqCst)
    }
}

/// Starts at once; a session's stdin comes back as its output.
struct EchoBackend {
    replicas: Arc<TestReplicas>,
}

struct EchoSession {
    sink: SessionSink,
    /// Input, echoed by a task of its own: the session takes input under
    /// its lock, which its output takes too.
    stdin: tokio::sync::mpsc::UnboundedSender<Bytes>,
}

#[async_trait]
impl BackendSession for EchoSession {
    fn write_stdin(&self, bytes: Bytes) {
        let _ = self.stdin.send(bytes);
    }
    fn resize(&self, _cols: u16, _rows: u16) {}
    async fn stop(&self) -> Result<(), StopError> {
        self.sink.status(RunStatus::Stopped);
        Ok(())
    }
}

#[async_trait]
impl Backend for EchoBackend {
    fn capabilities(&self) -> BackendCapabilities {
        BackendCapabilities {
            display_name: "echo".into(),
            description: "replicas test".into(),
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
        _spec: StartSpec,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        sink.output(Bytes::from_static(b"up\r\n"));
        sink.status(RunStatus::Running {
            endpoints: None,
            inspect_url: None,
            agent: None,
        });
        let (stdin, mut input) = tokio::sync::mpsc::unbounded_channel();
        let echo = sink.clone();
        tokio::spawn(async move {
            while let Some(bytes) = input.recv().await {
                echo.output(bytes);
            }
        });
        Ok(Arc::new(EchoSession { sink, stdin }))
    }
    fn replicas(&self) -> Option<Arc<dyn Replicas>> {
        Some(self.replicas.clone())
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

/// One replica, served on a loopback port of its own.
struct Replica {
    address: SocketAddr,
    registry: SessionRegistry,
    replicas: Arc<TestReplicas>,
    table: Arc<Table>,
    _server: JoinSet<()>,
}

impl Replica {
    async fn start(id: &str, table: &Arc<Table>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let replicas = Arc::new(TestReplicas {
            id: id.to_owned(),
            table: table.clone(),
            token: PeerToken::new(PEER_TOKEN),
            believes: Mutex::default(),
            may_act: AtomicBool::new(true),
        });
        let registry = SessionRegistry::new(
            Arc::new(EchoBackend {
                replicas: replicas.clone(),
            }),
            RegistryLimits {
                max_sessions: 8,
                exit_ttl: Duration::from_secs(60),
                replay_buffer_bytes: 64 * 1024,
                watch: Default::default(),
            },
        );
        let options = ServerOptions {
            version: "test".into(),
            cors: runner_core::config::CorsOrigins::Any,
            terms: None,
            apps: AppCatalog::from_entries(vec![]),
            default_registry_url: None,
            max_body_bytes: 1024 * 1024,
            body_timeout: Duration::from_secs(30),
            sse_heartbeat: Duration::from_secs(3600),
            auth_tokens: Some(AuthTokens::parse(&format!("{CLIENT_TOKEN} admin\n")).unwrap()),
            io_frames: Default::default(),
            subscribers: Default::default(),
        };
        let app = router(
            AppState {
                registry: registry.clone(),
                options: Arc::new(options),
                going_away: Default::default(),
                sockets: Default::default(),
                subscribers: Default::default(),
                idempotency: Default::default(),
                access: Default::default(),
            },
            Router::new(),
        );
        let mut server = JoinSet::new();
        server.spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        table
            .urls
            .lock()
            .unwrap()
            .insert(id.to_owned(), format!("http://{address}"));
        Self {
            address,
            registry,
            replicas,
            table: table.clone(),
            _server: server,
        }
    }

    /// A running session held here, recorded as this replica's.
    async fn session(&self) -> String {
        let created = self.registry.create(spec).unwrap();
        let id = created.session_id;
        self.table
            .owners
            .lock()
            .unwrap()
            .insert(id.clone(), self.replicas.id.clone());
        let session = self.registry.get(&id).unwrap();
        within(async {
            let mut events = session.watch_events();
            while !matches!(session.status(), RunStatus::Running { .. }) {
                events.changed().await.unwrap();
            }
        })
        .await;
        id
    }

    fn believe(&self, session: &str, owner: Owner) {
        self.replicas
            .believes
            .lock()
            .unwrap()
            .insert(session.to_owned(), owner);
    }

    fn peer(&self) -> Peer {
        Peer {
            id: self.replicas.id.clone(),
            url: format!("http://{}", self.address),
        }
    }
}

async fn cluster(count: usize) -> Vec<Replica> {
    let table = Arc::new(Table::default());
    let mut replicas = Vec::new();
    for index in 0..count {
        replicas.push(Replica::start(&format!("r{index}"), &table).await);
    }
    replicas
}

// ---------------------------------------------------------------------------
// Clients

/// Sends `request` on a connection of its own; the connection lives on in
/// `connections` (a streamed body needs it).
async fn send(
    connections: &mut JoinSet<()>,
    to: SocketAddr,
    request: Request<Empty<Bytes>>,
) -> Response<Incoming> {
    let tcp = TcpStream::connect(to).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    connections.spawn(async move {
        let _ = connection.await;
    });
    within(sender.send_request(request)).await.unwrap()
}

fn request(method: Method, path: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "runner.test")
        .header(header::AUTHORIZATION, format!("Bearer {CLIENT_TOKEN}"))
}

async fn call(to: SocketAddr, method: Method, path: &str) -> (StatusCode, http::HeaderMap, Value) {
    call_with(to, request(method, path)).await
}

async fn call_with(
    to: SocketAddr,
    request: http::request::Builder,
) -> (StatusCode, http::HeaderMap, Value) {
    let mut connections = JoinSet::new();
    let response = send(
        &mut connections,
        to,
        request.body(Empty::<Bytes>::new()).unwrap(),
    )
    .await;
    let status = response.status();
    let headers = response.headers().clone();
    let body = within(response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    (status, headers, body)
}

fn session_ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|session| session["sessionId"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

// ---------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn a_session_is_read_and_stopped_through_a_replica_that_does_not_hold_it() {
    let replicas = cluster(2).await;
    let (owner, other) = (&replicas[0], &replicas[1]);
    let id = owner.session().await;

    let (status, _, body) = call(other.address, Method::GET, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["sessionId"], id.as_str());
    assert_eq!(body["replica"], "r0");
    assert_eq!(body["status"]["kind"], "running");

    let (status, _, _) = call(other.address, Method::DELETE, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let session = owner.registry.get(&id);
    assert!(
        session.is_none_or(|session| session.status() == RunStatus::Stopped),
        "the owner stopped it"
    );
    let metrics = other.registry.encode_metrics().unwrap();
    assert!(
        metrics.contains("telo_runner_peer_forwards_total{outcome=\"forwarded\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_unknown_session_is_answered_by_the_replica_asked() {
    let replicas = cluster(2).await;
    let (status, _, body) = call(replicas[1].address, Method::GET, "/v1/sessions/nosuch").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "not_found");
}

#[tokio::test]
async fn events_stream_through_a_replica_that_does_not_hold_the_session() {
    let replicas = cluster(2).await;
    let (owner, other) = (&replicas[0], &replicas[1]);
    let id = owner.session().await;
    let mut connections = JoinSet::new();
    let response = send(
        &mut connections,
        other.address,
        request(Method::GET, &format!("/v1/sessions/{id}/events"))
            .header(header::ACCEPT, "text/event-stream")
            .body(Empty::new())
            .unwrap(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body();
    let mut seen = String::new();
    // What is there already arrives without the stream ending...
    within(async {
        while !seen.contains("running") {
            let frame = body.frame().await.unwrap().unwrap();
            if let Some(data) = frame.data_ref() {
                seen.push_str(&String::from_utf8_lossy(data));
            }
        }
    })
    .await;
    assert!(!seen.contains("stopped"));
    // ...and an event that happens later arrives while it is open.
    owner.registry.stop(&id).await.unwrap();
    within(async {
        while !seen.contains("stopped") {
            let frame = body.frame().await.unwrap().unwrap();
            if let Some(data) = frame.data_ref() {
                seen.push_str(&String::from_utf8_lossy(data));
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_terminal_socket_is_spliced_through_a_replica_that_does_not_hold_the_session() {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let replicas = cluster(2).await;
    let (owner, other) = (&replicas[0], &replicas[1]);
    let id = owner.session().await;
    let mut request = format!("ws://{}/v1/sessions/{id}/io", other.address)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        header::AUTHORIZATION,
        format!("Bearer {CLIENT_TOKEN}").parse().unwrap(),
    );
    let tcp = TcpStream::connect(other.address).await.unwrap();
    let (mut socket, response) = within(tokio_tungstenite::client_async(request, tcp))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    socket
        .send(Message::binary(b"ping-through".to_vec()))
        .await
        .unwrap();
    let mut output = Vec::new();
    within(async {
        while !String::from_utf8_lossy(&output).contains("ping-through") {
            match socket.next().await.unwrap().unwrap() {
                Message::Binary(bytes) => output.extend_from_slice(&bytes),
                Message::Close(frame) => panic!("closed: {frame:?}"),
                _ => {}
            }
        }
    })
    .await;
    socket.close(None).await.unwrap();
}

#[tokio::test]
async fn the_session_list_holds_every_replicas_sessions() {
    let replicas = cluster(2).await;
    let first = replicas[0].session().await;
    let second = replicas[1].session().await;
    let mut both = vec![first.clone(), second.clone()];
    both.sort();
    for replica in &replicas {
        let (status, _, list) = call(replica.address, Method::GET, "/v1/sessions").await;
        assert_eq!(status, StatusCode::OK, "{list}");
        assert_eq!(session_ids(&list), both);
        for session in list["sessions"].as_array().unwrap() {
            let expected = if session["sessionId"] == first.as_str() {
                "r0"
            } else {
                "r1"
            };
            assert_eq!(session["replica"], expected);
        }
    }
    // A peer's call gets the replica's own list only.
    let (status, _, own) = call_with(
        replicas[0].address,
        request(Method::GET, "/v1/sessions").header(PEER_TOKEN_HEADER, PEER_TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(session_ids(&own), [first]);
}

#[tokio::test]
async fn a_replica_that_is_down_is_left_out_of_the_list() {
    let replicas = cluster(2).await;
    let mine = replicas[0].session().await;
    // A peer that takes no connections: a port nobody listens on.
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    replicas[0]
        .table
        .urls
        .lock()
        .unwrap()
        .insert("r9".into(), url);
    let (status, _, list) = call(replicas[0].address, Method::GET, "/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(session_ids(&list), [mine]);
}

#[tokio::test]
async fn a_wrong_peer_token_is_not_trusted() {
    let replicas = cluster(2).await;
    let (owner, other) = (&replicas[0], &replicas[1]);
    let id = owner.session().await;
    // With a wrong token the request is a client's: forwarded to the owner,
    // which answers it.
    let (status, _, body) = call_with(
        other.address,
        request(Method::GET, &format!("/v1/sessions/{id}")).header(PEER_TOKEN_HEADER, "guess"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["replica"], "r0");
    // And its list is the merged one.
    let (_, _, list) = call_with(
        other.address,
        request(Method::GET, "/v1/sessions").header(PEER_TOKEN_HEADER, "guess"),
    )
    .await;
    assert_eq!(session_ids(&list), std::slice::from_ref(&id));
    // A wrong token does not get past the bearer gate either.
    let (status, _, body) = call_with(
        other.address,
        Request::builder()
            .uri(format!("/v1/sessions/{id}"))
            .header(header::HOST, "runner.test")
            .header(PEER_TOKEN_HEADER, "guess"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"], "unauthorized");
    // With the right one the replica answers for itself: it does not
    // hold the session, and a peer's call is not forwarded again.
    let (status, headers, body) = call_with(
        other.address,
        request(Method::GET, &format!("/v1/sessions/{id}")).header(PEER_TOKEN_HEADER, PEER_TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"], "session_moving");
    assert_eq!(headers[header::RETRY_AFTER], "1");
}

#[tokio::test]
async fn replicas_that_name_each_other_do_not_pass_a_request_back_and_forth() {
    let replicas = cluster(2).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    // Neither holds it; each thinks the other does.
    a.believe("ghost", Owner::Peer(b.peer()));
    b.believe("ghost", Owner::Peer(a.peer()));
    for replica in [a, b] {
        let (status, headers, body) =
            call(replica.address, Method::GET, "/v1/sessions/ghost").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["error"], "session_moving");
        assert_eq!(headers[header::RETRY_AFTER], "1");
    }
}

#[tokio::test]
async fn a_moving_session_is_answered_with_retry_after() {
    let replicas = cluster(1).await;
    replicas[0].believe("moving", Owner::Moving { from: "r7".into() });
    let (status, headers, body) =
        call(replicas[0].address, Method::DELETE, "/v1/sessions/moving").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"], "session_moving");
    assert_eq!(headers[header::RETRY_AFTER], "1");
}

#[tokio::test]
async fn a_session_this_replica_is_still_adopting_is_answered_with_retry_after() {
    let replicas = cluster(2).await;
    // Its record names replica 0, which claimed it and has not added it
    // to its registry yet: neither replica says it does not exist.
    replicas[0].believe("adopting", Owner::Recorded);
    replicas[1].believe(
        "adopting",
        Owner::Peer(Peer {
            id: "r0".into(),
            url: format!("http://{}", replicas[0].address),
        }),
    );
    for replica in &replicas {
        let (status, headers, body) =
            call(replica.address, Method::GET, "/v1/sessions/adopting").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["error"], "session_moving");
        assert_eq!(headers[header::RETRY_AFTER], "1");
    }
}

#[tokio::test]
async fn an_owner_that_cannot_be_reached_is_answered_with_retry_after() {
    let replicas = cluster(1).await;
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    replicas[0].believe(
        "elsewhere",
        Owner::Peer(Peer {
            id: "r9".into(),
            url,
        }),
    );
    let (status, headers, body) =
        call(replicas[0].address, Method::GET, "/v1/sessions/elsewhere").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "replica_unavailable");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let metrics = replicas[0].registry.encode_metrics().unwrap();
    assert!(
        metrics.contains("telo_runner_peer_forwards_total{outcome=\"unavailable\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_fenced_replica_refuses_to_change_its_sessions() {
    let replicas = cluster(2).await;
    let (owner, other) = (&replicas[0], &replicas[1]);
    let id = owner.session().await;
    owner.replicas.may_act.store(false, Ordering::SeqCst);
    // Reads go on.
    let (status, _, _) = call(owner.address, Method::GET, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    // Writes do not, whichever replica they reach first.
    for to in [owner.address, other.address] {
        let (status, headers, body) = call(to, Method::DELETE, &format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["error"], "replica_fenced");
        assert_eq!(headers[header::RETRY_AFTER], "1");
    }
    let (status, _, body) = call(owner.address, Method::POST, "/v1/sessions").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"], "replica_fenced");
    assert!(matches!(
        owner.registry.get(&id).unwrap().status(),
        RunStatus::Running { .. }
    ));
    // Once it may act again, the write goes through.
    owner.replicas.may_act.store(true, Ordering::SeqCst);
    let (status, _, _) = call(other.address, Method::DELETE, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn an_unauthenticated_request_is_not_forwarded() {
    let replicas = cluster(2).await;
    let (owner, other) = (&replicas[0], &replicas[1]);
    let id = owner.session().await;
    let (status, _, _) = call_with(
        other.address,
        Request::builder()
            .uri(format!("/v1/sessions/{id}"))
            .header(header::HOST, "runner.test"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let metrics = other.registry.encode_metrics().unwrap();
    assert!(!metrics.contains("peer_forwards_total{"), "{metrics}");
}
