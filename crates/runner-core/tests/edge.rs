//! The session edge end to end: a test server routes by `Host` with
//! `PreviewBase::route` and forwards with `Edge::forward_on` (each client
//! connection linked, as the runner serves) to small upstream apps on
//! loopback, which count what reaches them.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State, WebSocketUpgrade, ws::Message as AxumMessage};
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _, stream};
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use runner_core::edge::{
    AccessPolicy, Edge, EdgeConfig, EdgeRefusal, EdgeResolver, Linked, Pass, PassKind,
    PreviewAccess, PreviewBase, SessionHost, Signer, prefers_html, refusal_response, unix_now,
};
use runner_core::reach::Reach;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tower::ServiceExt as _;

const ID: &str = "abcdefgh2345";
const OTHER_ID: &str = "zzzzzzzz7777";
const BASE: &str = "http://run.test:8061";
/// The longest any one test may take.
const DEADLINE: Duration = Duration::from_secs(60);
const CHUNK: usize = 64 * 1024;
const BIG_CHUNKS: usize = 1024; // 64 MiB

fn session_host_header(port: u16, id: &str) -> String {
    format!("{port}-{id}.run.test:8061")
}

// ---------------------------------------------------------------------------
// Upstream apps

/// An app on loopback that counts its connections and requests.
struct Upstream {
    address: SocketAddr,
    connections: Arc<AtomicUsize>,
    /// Connections open now.
    open: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    events: Arc<Mutex<Option<mpsc::Receiver<Bytes>>>>,
    _tasks: JoinSet<()>,
}

#[derive(Clone)]
struct AppState {
    events: Arc<Mutex<Option<mpsc::Receiver<Bytes>>>>,
}

fn chunk(index: usize) -> Bytes {
    Bytes::from(vec![(index % 251) as u8; CHUNK])
}

fn expected_hash(chunks: usize) -> String {
    let mut hash = Sha256::new();
    for index in 0..chunks {
        hash.update(chunk(index));
    }
    hex::encode(hash.finalize())
}

fn app(events: Arc<Mutex<Option<mpsc::Receiver<Bytes>>>>) -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello from upstream" }))
        .route("/headers", get(echo_headers))
        .route("/upload", post(upload))
        .route("/download/{chunks}", get(download))
        .route("/events", get(events_stream))
        .route("/ws", get(websocket))
        .with_state(AppState { events })
}

async fn echo_headers(request: Request<Body>) -> Response<Body> {
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for (name, value) in request.headers() {
        seen.entry(name.as_str().to_owned())
            .or_default()
            .push(value.to_str().unwrap_or("<bytes>").to_owned());
    }
    let body = serde_json::json!({"uri": request.uri().to_string(), "headers": seen});
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "x-hop")
        .header("x-hop", "1")
        .header("keep-alive", "timeout=5")
        .header(header::PROXY_AUTHENTICATE, "Basic")
        .header("x-kept", "1")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn upload(body: Body) -> String {
    let mut stream = body.into_data_stream();
    let mut hash = Sha256::new();
    let mut total = 0usize;
    while let Some(data) = stream.next().await {
        let data = data.unwrap();
        total += data.len();
        hash.update(&data);
    }
    format!("{total} {}", hex::encode(hash.finalize()))
}

async fn download(Path(chunks): Path<usize>) -> Body {
    Body::from_stream(stream::iter(
        (0..chunks).map(|i| Ok::<_, Infallible>(chunk(i))),
    ))
}

async fn events_stream(State(state): State<AppState>) -> Response<Body> {
    let receiver = state
        .events
        .lock()
        .unwrap()
        .take()
        .expect("one event stream");
    let events = stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|event| (Ok::<_, Infallible>(event), receiver))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(events))
        .unwrap()
}

async fn websocket(upgrade: WebSocketUpgrade) -> Response<Body> {
    upgrade.on_upgrade(|mut socket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            let echo = matches!(message, AxumMessage::Text(_) | AxumMessage::Binary(_));
            if matches!(message, AxumMessage::Close(_))
                || (echo && socket.send(message).await.is_err())
            {
                break;
            }
        }
    })
}

impl Upstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let events = Arc::new(Mutex::new(None));
        let router = app(events.clone());
        let mut tasks = JoinSet::new();
        let (count_connections, count_requests) = (connections.clone(), requests.clone());
        let count_open = open.clone();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                count_connections.fetch_add(1, Ordering::SeqCst);
                count_open.fetch_add(1, Ordering::SeqCst);
                let open = count_open.clone();
                let router = router.clone();
                let requests = count_requests.clone();
                let service = TowerToHyperService::new(tower::service_fn(
                    move |request: Request<Incoming>| {
                        requests.fetch_add(1, Ordering::SeqCst);
                        router.clone().oneshot(request.map(Body::new))
                    },
                ));
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .with_upgrades()
                        .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            address,
            connections,
            open,
            requests,
            events,
            _tasks: tasks,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Returns once exactly `n` of its connections are open.
    async fn until_open(&self, n: usize) {
        while self.open.load(Ordering::SeqCst) != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

// ---------------------------------------------------------------------------
// The edge under test

/// Maps session hosts to answers and counts its calls; `token`, when set,
/// guards every port, and `links` are the live share links.
#[derive(Default)]
struct FakeResolver {
    routes: HashMap<SessionHost, Result<SocketAddr, EdgeRefusal>>,
    calls: AtomicUsize,
    token: Option<String>,
    links: Mutex<Vec<String>>,
    /// Every resolve waits until this is true (a session waking).
    awake: Option<tokio::sync::watch::Receiver<bool>>,
    /// What the edge holds while a request or connection is open.
    in_use: Arc<()>,
}

#[async_trait]
impl EdgeResolver for FakeResolver {
    async fn resolve(
        &self,
        host: &SessionHost,
    ) -> Result<runner_core::edge::Upstream, EdgeRefusal> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(awake) = &self.awake {
            let mut awake = awake.clone();
            let _ = awake.wait_for(|awake| *awake).await;
        }
        self.routes
            .get(host)
            .cloned()
            .unwrap_or(Err(EdgeRefusal::UnknownSession))
            .map(|address: SocketAddr| runner_core::edge::Upstream {
                reach: Reach::Address(address.ip()),
                port: address.port(),
            })
    }

    fn token_guarded(&self, _host: &SessionHost) -> Result<bool, EdgeRefusal> {
        Ok(self.token.is_some())
    }

    fn hold(&self, _host: &SessionHost) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        Some(Box::new(self.in_use.clone()))
    }

    fn token_admits(&self, _host: &SessionHost, token: &str) -> bool {
        self.token.as_deref() == Some(token)
    }

    fn link_live(&self, _host: &SessionHost, link_id: &str) -> bool {
        self.links.lock().unwrap().iter().any(|id| id == link_id)
    }
}

fn host(port: u16, id: &str) -> SessionHost {
    SessionHost {
        port,
        session_id: id.to_owned(),
    }
}

struct EdgeServer {
    address: SocketAddr,
    edge: Edge,
    resolver: Arc<FakeResolver>,
    _tasks: JoinSet<()>,
}

impl EdgeServer {
    async fn start(
        routes: impl IntoIterator<Item = (SessionHost, Result<SocketAddr, EdgeRefusal>)>,
        config: EdgeConfig,
    ) -> Self {
        Self::start_with(routes, config, AccessPolicy::public(), None).await
    }

    async fn start_with(
        routes: impl IntoIterator<Item = (SessionHost, Result<SocketAddr, EdgeRefusal>)>,
        config: EdgeConfig,
        policy: AccessPolicy,
        token: Option<&str>,
    ) -> Self {
        let resolver = Arc::new(FakeResolver {
            routes: routes.into_iter().collect(),
            token: token.map(str::to_owned),
            ..FakeResolver::default()
        });
        let base = PreviewBase::parse(BASE).unwrap();
        let edge = Edge::new(base, resolver.clone(), config, policy);
        Self::serve(edge, resolver).await
    }

    async fn serve(edge: Edge, resolver: Arc<FakeResolver>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut tasks = JoinSet::new();
        let serving = edge.clone();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((tcp, peer)) = listener.accept().await else {
                    continue;
                };
                let edge = serving.clone();
                // As the runner serves: the upstream connections of each
                // client connection polled on its task.
                let link = edge.link();
                let service_link = link.clone();
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let edge = edge.clone();
                    let link = service_link.clone();
                    async move {
                        let response = match edge.base().route(&request) {
                            Ok(Some(host)) => {
                                edge.forward_on(Some(&link), host, request, peer, false)
                                    .await
                            }
                            Ok(None) => Response::new(Body::from("the api")),
                            Err(refusal) => {
                                refusal_response(&refusal, prefers_html(request.headers()), None)
                            }
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                connections.spawn(async move {
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let connection =
                        builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                    let _ = Linked::new(connection, Some(link)).await;
                });
            }
        });
        Self {
            address,
            edge,
            resolver,
            _tasks: tasks,
        }
    }

    fn resolves(&self) -> usize {
        self.resolver.calls.load(Ordering::SeqCst)
    }
}

fn quick() -> EdgeConfig {
    EdgeConfig {
        connect_timeout: Duration::from_secs(2),
        response_header_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(30),
        max_connections_per_session: 8,
        wake_timeout: Duration::from_secs(30),
        waking_page_after: Duration::from_millis(200),
    }
}

// ---------------------------------------------------------------------------
// Clients

/// Clients' connections to the edge, closed when dropped.
#[derive(Default)]
struct Clients {
    tasks: JoinSet<()>,
}

impl Clients {
    async fn send<B>(&mut self, edge: SocketAddr, request: Request<B>) -> Response<Incoming>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut sender = self.connect(edge).await;
        sender.send_request(request).await.unwrap()
    }

    /// A keep-alive connection to the edge, closed when the sender is
    /// dropped.
    async fn connect<B>(&mut self, edge: SocketAddr) -> SendRequest<B>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let tcp = TcpStream::connect(edge).await.unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        self.tasks.spawn(async move {
            let _ = connection.await;
        });
        sender
    }

    async fn get(&mut self, edge: SocketAddr, host: &str, path: &str) -> Response<Incoming> {
        let request = Request::get(path)
            .header(header::HOST, host)
            .body(Empty::<Bytes>::new())
            .unwrap();
        self.send(edge, request).await
    }
}

async fn text(response: Response<Incoming>) -> String {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// A streamed body's length and SHA-256, read frame by frame.
async fn length_and_hash(response: Response<Incoming>) -> (usize, String) {
    let mut body = response.into_body();
    let mut hash = Sha256::new();
    let mut total = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            total += data.len();
            hash.update(&data);
        }
    }
    (total, hex::encode(hash.finalize()))
}

async fn json_of(response: Response<Incoming>) -> serde_json::Value {
    serde_json::from_str(&text(response).await).unwrap()
}

/// An app that accepts connections and never answers, for as long as
/// `held` runs.
async fn silent_app(held: &mut JoinSet<()>) -> SocketAddr {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap();
    held.spawn(async move {
        let mut open = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            open.push(tcp);
        }
    });
    address
}

/// An address nothing listens on.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// Writes `request` as is and reads the answer until the edge closes.
async fn raw(edge: SocketAddr, request: &[u8]) -> String {
    let mut tcp = TcpStream::connect(edge).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

async fn within<T>(work: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, work)
        .await
        .expect("the test finished within its deadline")
}

// ---------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn hostile_hosts_never_reach_an_upstream() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start(
            [
                (host(8845, ID), Ok(upstream.address)),
                (host(8080, ID), Ok(upstream.address)),
                (host(3000, ID), Ok(upstream.address)),
            ],
            quick(),
        )
        .await;
        let long = "a".repeat(70);
        let hostile: Vec<Vec<u8>> = [
            format!("8845-{ID}.evil.example"),
            format!("8845-{ID}.run.test.evil.example:8061"),
            "127.0.0.1:8061".into(),
            "[::1]:8061".into(),
            "localhost:6443".into(),
            "run.test:8061".into(),
            format!("08080-{ID}.run.test:8061"),
            format!("0-{ID}.run.test:8061"),
            format!("99999-{ID}.run.test:8061"),
            format!("8845-{ID}.run.test:8062"),
            format!("8845-{ID}.run.test"),
            format!("8845-{ID}.run.test:08061"),
            format!("8845-{long}.run.test:8061"),
            format!("x.8845-{ID}.run.test:8061"),
            format!("{}.run.test:8061", "a.".repeat(150)),
            format!("8845-{}.run.test:8061", "abcdefgh234é"),
        ]
        .into_iter()
        .map(String::into_bytes)
        .collect();
        for host in hostile {
            let mut request = b"GET /hello HTTP/1.1\r\nHost: ".to_vec();
            request.extend_from_slice(&host);
            request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
            let answer = raw(server.address, &request).await;
            let shown = String::from_utf8_lossy(&host);
            match status_of(&answer) {
                200 => assert!(answer.ends_with("the api"), "{shown}: {answer}"),
                421 => assert!(answer.contains("misdirected_host"), "{shown}: {answer}"),
                400 => {} // refused by the HTTP parser itself
                other => panic!("{shown}: {other} {answer}"),
            }
        }
        // An absolute-form target names the host, whatever Host says.
        let answer = raw(
            server.address,
            format!(
                "GET http://evil.example/hello HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                session_host_header(8845, ID)
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(status_of(&answer), 200);
        assert!(answer.ends_with("the api"), "{answer}");
        assert_eq!(upstream.requests(), 0);
        assert_eq!(server.resolves(), 0);

        // Mixed case, a trailing dot and an absolute-form target do reach it,
        // re-targeted to the resolved address.
        for host in [
            format!("8845-{}.RUN.Test:8061", ID.to_uppercase()),
            format!("8845-{ID}.run.test.:8061"),
        ] {
            let answer = raw(
                server.address,
                format!("GET /hello HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await;
            assert!(answer.ends_with("hello from upstream"), "{host}: {answer}");
        }
        let authority = session_host_header(3000, ID);
        let answer = raw(
            server.address,
            format!(
                "GET http://{authority}/headers?x=1 HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        let body: serde_json::Value =
            serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["uri"], "/headers?x=1");
        assert_eq!(body["headers"]["host"][0], authority);
        assert_eq!(upstream.requests(), 3);
    })
    .await;
}

#[tokio::test]
async fn streams_a_large_upload_and_download() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start(
            [(host(8845, ID), Ok(upstream.address))],
            EdgeConfig::default(),
        )
        .await;
        let mut clients = Clients::default();
        let expected = expected_hash(BIG_CHUNKS);
        let frames =
            stream::iter((0..BIG_CHUNKS).map(|i| Ok::<_, io::Error>(Frame::data(chunk(i)))));
        let request = Request::post("/upload")
            .header(header::HOST, session_host_header(8845, ID))
            .body(StreamBody::new(frames))
            .unwrap();
        let response = clients.send(server.address, request).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            text(response).await,
            format!("{} {expected}", BIG_CHUNKS * CHUNK)
        );

        let response = clients
            .get(
                server.address,
                &session_host_header(8845, ID),
                &format!("/download/{BIG_CHUNKS}"),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            length_and_hash(response).await,
            (BIG_CHUNKS * CHUNK, expected)
        );
        server.edge.until_idle(ID).await;
    })
    .await;
}

#[tokio::test]
async fn event_stream_lines_arrive_one_by_one() {
    within(async {
        let upstream = Upstream::start().await;
        let (events, receiver) = mpsc::channel(1);
        *upstream.events.lock().unwrap() = Some(receiver);
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let mut clients = Clients::default();
        let response = clients
            .get(server.address, &session_host_header(8845, ID), "/events")
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/event-stream"
        );
        let mut body = response.into_body();
        for n in 0..3 {
            let event = format!("data: {n}\n\n");
            events.send(Bytes::from(event.clone())).await.unwrap();
            let mut got = Vec::new();
            while got.len() < event.len() {
                let frame = body.frame().await.expect("the stream is open").unwrap();
                got.extend_from_slice(&frame.into_data().unwrap());
            }
            assert_eq!(String::from_utf8(got).unwrap(), event);
        }
        // The response-header timeout is behind it: the stream outlived it.
        drop(events);
        assert!(body.frame().await.is_none());
        server.edge.until_idle(ID).await;
    })
    .await;
}

#[tokio::test]
async fn websockets_are_spliced_through() {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let tcp = TcpStream::connect(server.address).await.unwrap();
        let request = format!("ws://{}/ws", session_host_header(8845, ID))
            .into_client_request()
            .unwrap();
        let (mut socket, response) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(server.edge.connections(ID), 1);
        for text in ["one", "two", "three"] {
            socket.send(Message::text(text)).await.unwrap();
            let echoed = socket.next().await.unwrap().unwrap();
            assert_eq!(echoed, Message::text(text));
        }
        socket
            .send(Message::binary(vec![0u8, 1, 2, 255]))
            .await
            .unwrap();
        assert_eq!(
            socket.next().await.unwrap().unwrap(),
            Message::binary(vec![0u8, 1, 2, 255])
        );
        socket.close(None).await.unwrap();
        while let Some(Ok(_)) = socket.next().await {}
        // The spliced connection gave its slot back once it closed.
        server.edge.until_idle(ID).await;
        server.edge.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn forwarded_headers_are_added_and_hop_by_hop_ones_dropped() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let mut clients = Clients::default();
        let original = session_host_header(8845, ID);
        let request = Request::get("/headers")
            .header(header::HOST, &original)
            .header(header::CONNECTION, "keep-alive, X-Secret")
            .header("x-secret", "1")
            .header("keep-alive", "timeout=5")
            .header("proxy-connection", "keep-alive")
            .header(header::TE, "trailers")
            .header(header::UPGRADE, "websocket")
            .header(header::PROXY_AUTHORIZATION, "Basic eDp5")
            .header(header::AUTHORIZATION, "Bearer kept")
            .header("x-forwarded-for", "10.0.0.1")
            .header("x-forwarded-host", "spoofed.example")
            .header("x-forwarded-proto", "https")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = clients.send(server.address, request).await;
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers().clone();
        let seen: serde_json::Value = json_of(response).await;
        let seen = &seen["headers"];
        for gone in [
            "x-secret",
            "upgrade",
            "keep-alive",
            "proxy-connection",
            "te",
            "proxy-authorization",
        ] {
            assert!(seen.get(gone).is_none(), "{gone} reached the app: {seen}");
        }
        assert_eq!(seen["host"], serde_json::json!([original]));
        assert_eq!(seen["authorization"], serde_json::json!(["Bearer kept"]));
        assert_eq!(
            seen["x-forwarded-for"],
            serde_json::json!(["10.0.0.1, 127.0.0.1"])
        );
        assert_eq!(seen["x-forwarded-host"], serde_json::json!([original]));
        assert_eq!(seen["x-forwarded-proto"], serde_json::json!(["http"]));
        assert_eq!(seen["via"], serde_json::json!(["1.1 telo-runner"]));
        // And the app's hop-by-hop headers do not reach the client.
        for gone in ["x-hop", "keep-alive", "proxy-authenticate"] {
            assert!(
                !headers.contains_key(gone),
                "{gone} reached the client: {headers:?}"
            );
        }
        assert_eq!(headers["x-kept"], "1");
    })
    .await;
}

#[tokio::test]
async fn a_repeated_host_reaches_the_app_once_and_a_peer_secret_never() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let mut clients = Clients::default();
        let original = session_host_header(8845, ID);
        // A small header block and one past the size searched name by name.
        for extra in [0, 24] {
            let mut request = Request::get("/headers")
                .header(header::HOST, &original)
                .header(header::HOST, "other.example")
                .header(
                    runner_core::replicas::PEER_TOKEN_HEADER,
                    "a replica's secret",
                );
            for n in 0..extra {
                request = request.header(format!("x-extra-{n}"), "1");
            }
            let request = request.body(Empty::<Bytes>::new()).unwrap();
            let response = clients.send(server.address, request).await;
            assert_eq!(response.status(), StatusCode::OK);
            let seen: serde_json::Value = json_of(response).await;
            let seen = &seen["headers"];
            assert_eq!(seen["host"], serde_json::json!([original]), "{seen}");
            assert_eq!(seen["x-forwarded-host"], serde_json::json!([original]));
            assert!(
                seen.get(runner_core::replicas::PEER_TOKEN_HEADER).is_none(),
                "the peer secret reached the app: {seen}"
            );
            if extra > 0 {
                assert_eq!(seen["x-extra-23"], serde_json::json!(["1"]));
            }
        }
    })
    .await;
}

#[tokio::test]
async fn connections_to_an_app_are_kept_alive() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let mut clients = Clients::default();
        for _ in 0..5 {
            let response = clients
                .get(server.address, &session_host_header(8845, ID), "/hello")
                .await;
            assert_eq!(text(response).await, "hello from upstream");
        }
        assert_eq!(upstream.requests(), 5);
        let connections = upstream.connections.load(Ordering::SeqCst);
        assert!(connections < 5, "{connections} connections for 5 requests");
    })
    .await;
}

#[tokio::test]
async fn a_silent_app_times_out_with_504() {
    within(async {
        let mut held = JoinSet::new();
        let address = silent_app(&mut held).await;
        let server = EdgeServer::start([(host(8845, ID), Ok(address))], quick()).await;
        let mut clients = Clients::default();
        let started = Instant::now();
        let response = clients
            .get(server.address, &session_host_header(8845, ID), "/hello")
            .await;
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(started.elapsed() < Duration::from_secs(10));
        let body: serde_json::Value = json_of(response).await;
        assert_eq!(body["error"], "upstream_timeout");
        server.edge.until_idle(ID).await;
    })
    .await;
}

#[tokio::test]
async fn a_connection_that_is_never_accepted_times_out_with_504() {
    within(async {
        // A listener with a backlog of one that never accepts: once its
        // queue is full, further handshakes go unanswered.
        let socket = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .unwrap();
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        socket.listen(0).unwrap();
        let address = socket.local_addr().unwrap().as_socket().unwrap();
        let mut queued = Vec::new();
        loop {
            match std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)) {
                Ok(stream) => queued.push(stream),
                Err(err) if err.kind() == io::ErrorKind::TimedOut => break,
                Err(err) => panic!("{err}"),
            }
            assert!(queued.len() < 64, "the backlog never filled");
        }
        let config = EdgeConfig {
            connect_timeout: Duration::from_millis(300),
            response_header_timeout: Duration::from_secs(60),
            ..quick()
        };
        let server = EdgeServer::start([(host(8845, ID), Ok(address))], config).await;
        let mut clients = Clients::default();
        let started = Instant::now();
        let response = clients
            .get(server.address, &session_host_header(8845, ID), "/hello")
            .await;
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(started.elapsed() < Duration::from_secs(10));
        let body: serde_json::Value = json_of(response).await;
        assert_eq!(body["error"], "upstream_timeout");
        drop((queued, socket));
    })
    .await;
}

#[tokio::test]
async fn nothing_listening_is_502_with_retry_after() {
    within(async {
        let closed = closed_port().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(closed))], quick()).await;
        let mut clients = Clients::default();
        let response = clients
            .get(server.address, &session_host_header(8845, ID), "/hello")
            .await;
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let body: serde_json::Value = json_of(response).await;
        assert_eq!(body["error"], "port_not_listening");
    })
    .await;
}

#[tokio::test]
async fn each_session_is_bounded_in_what_it_holds_open() {
    within(async {
        let upstream = Upstream::start().await;
        let (events, receiver) = mpsc::channel(1);
        *upstream.events.lock().unwrap() = Some(receiver);
        let config = EdgeConfig {
            max_connections_per_session: 1,
            ..quick()
        };
        let server = EdgeServer::start(
            [
                (host(8845, ID), Ok(upstream.address)),
                (host(8845, OTHER_ID), Ok(upstream.address)),
            ],
            config,
        )
        .await;
        let mut clients = Clients::default();
        let held = clients
            .get(server.address, &session_host_header(8845, ID), "/events")
            .await;
        assert_eq!(held.status(), StatusCode::OK);
        let refused = clients
            .get(server.address, &session_host_header(8845, ID), "/hello")
            .await;
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        let body: serde_json::Value = serde_json::from_str(&text(refused).await).unwrap();
        assert_eq!(body["error"], "too_many_connections");
        // Another session is not held back.
        let other = clients
            .get(
                server.address,
                &session_host_header(8845, OTHER_ID),
                "/hello",
            )
            .await;
        assert_eq!(text(other).await, "hello from upstream");
        // The slot comes back when the held response ends.
        drop(events);
        assert_eq!(text(held).await, "");
        server.edge.until_idle(ID).await;
        let again = clients
            .get(server.address, &session_host_header(8845, ID), "/hello")
            .await;
        assert_eq!(text(again).await, "hello from upstream");
    })
    .await;
}

#[tokio::test]
async fn ambiguous_framing_is_refused_or_never_smuggled() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let host = session_host_header(8845, ID);
        // Differing lengths and a final encoding other than chunked: 400
        // from the HTTP parser, never forwarded.
        for framing in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: 5, 6\r\n",
            "Content-Length: +5\r\n",
            "Transfer-Encoding: gzip\r\n",
            "Transfer-Encoding: chunked, gzip\r\n",
        ] {
            let answer = raw(
                server.address,
                format!(
                    "POST /upload HTTP/1.1\r\nHost: {host}\r\n{framing}Connection: close\r\n\r\nhello"
                )
                .as_bytes(),
            )
            .await;
            assert_eq!(status_of(&answer), 400, "{framing:?}: {answer}");
        }
        assert_eq!(upstream.requests(), 0);
        // Content-Length beside Transfer-Encoding: the HTTP parser drops the
        // length before the edge sees the request (RFC 9112 section 6.1), reads the
        // chunked body and closes the connection after answering, so what
        // follows the body never becomes a request of its own.
        let empty = hex::encode(Sha256::digest(b""));
        for (n, framing) in [
            "Content-Length: 40\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 40\r\n",
        ]
        .into_iter()
        .enumerate()
        {
            let answer = raw(
                server.address,
                format!(
                    "POST /upload HTTP/1.1\r\nHost: {host}\r\n{framing}\r\n0\r\n\r\n\
                     GET /hello HTTP/1.1\r\nHost: {host}\r\n\r\n"
                )
                .as_bytes(),
            )
            .await;
            assert_eq!(status_of(&answer), 200, "{framing:?}: {answer}");
            assert!(answer.ends_with(&format!("0 {empty}")), "{framing:?}: {answer}");
            assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
            assert!(!answer.contains("hello from upstream"), "{answer}");
            assert_eq!(upstream.requests(), n + 1);
        }
        // Identical repeats are one length.
        let answer = raw(
            server.address,
            format!(
                "POST /upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(status_of(&answer), 200, "{answer}");
        assert!(answer.ends_with(&format!("5 {}", hex::encode(Sha256::digest(b"hello")))));
        assert_eq!(upstream.requests(), 3);
    })
    .await;
}

#[tokio::test]
async fn refusals_are_html_for_browsers_and_json_otherwise() {
    within(async {
        let server = EdgeServer::start(
            [
                (host(8845, ID), Err(EdgeRefusal::Ended)),
                (host(3000, ID), Err(EdgeRefusal::Starting)),
                (host(4000, ID), Err(EdgeRefusal::PortNotPublished)),
            ],
            quick(),
        )
        .await;
        let mut clients = Clients::default();
        let browser = Request::get("/")
            .header(header::HOST, session_host_header(8845, ID))
            .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = clients.send(server.address, browser).await;
        assert_eq!(response.status(), StatusCode::GONE);
        assert!(content_type(response.headers()).starts_with("text/html"));
        let page = text(response).await;
        assert!(page.contains("this session has ended"), "{page}");

        let response = clients
            .get(server.address, &session_host_header(8845, ID), "/")
            .await;
        assert_eq!(response.status(), StatusCode::GONE);
        assert_eq!(content_type(response.headers()), "application/json");
        let body: serde_json::Value = json_of(response).await;
        assert_eq!(body["error"], "session_ended");

        let response = clients
            .get(server.address, &session_host_header(3000, ID), "/")
            .await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");

        let response = clients
            .get(server.address, &session_host_header(4000, ID), "/")
            .await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let body: serde_json::Value = json_of(response).await;
        assert_eq!(
            body["message"],
            format!("session {ID} does not publish port 4000")
        );

        let response = clients
            .get(server.address, &session_host_header(5000, OTHER_ID), "/")
            .await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let body: serde_json::Value = json_of(response).await;
        assert_eq!(body["error"], "unknown_session");

        let misdirected = Request::get("/")
            .header(header::HOST, format!("08845-{ID}.run.test:8061"))
            .header(header::ACCEPT, "text/html")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = clients.send(server.address, misdirected).await;
        assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);
        assert!(content_type(response.headers()).starts_with("text/html"));
    })
    .await;
}

fn content_type(headers: &HeaderMap) -> &str {
    headers[header::CONTENT_TYPE].to_str().unwrap()
}

// ---------------------------------------------------------------------------
// Private ports

fn private_policy() -> AccessPolicy {
    AccessPolicy {
        access: PreviewAccess::Private,
        signer: Signer::new(vec![1; 32]),
        generated_key: false,
        grant_ttl: Duration::from_secs(600),
    }
}

fn pass(kind: PassKind, port: u16, id: &str, expires_in: i64) -> String {
    let expires_at = (unix_now() as i64 + expires_in).max(0) as u64;
    private_policy().signer.sign(&Pass {
        kind,
        session_id: id.to_owned(),
        port,
        expires_at,
    })
}

fn with_cookie(host: &str, path: &str, cookie: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header(header::HOST, host)
        .header(header::COOKIE, cookie)
        .body(Empty::<Bytes>::new())
        .unwrap()
}

/// The `telo_access=<value>` of a `Set-Cookie`, and its attributes.
fn cookie_of(response: &Response<Incoming>) -> (String, String) {
    let set = response.headers()[header::SET_COOKIE].to_str().unwrap();
    let (pair, attributes) = set.split_once(';').unwrap();
    (pair.trim().to_owned(), attributes.to_owned())
}

#[tokio::test]
async fn a_private_port_opens_only_with_a_grant_cookie_or_token() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start_with(
            [
                (host(8845, ID), Ok(upstream.address)),
                (host(8846, ID), Ok(upstream.address)),
                (host(8845, OTHER_ID), Ok(upstream.address)),
            ],
            quick(),
            private_policy(),
            Some("workload-token"),
        )
        .await;
        let mut clients = Clients::default();
        let session = session_host_header(8845, ID);

        // Nothing presented: 401 for every method, and the session is not
        // even looked up (a request without access wakes nothing).
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::POST] {
            let request = Request::builder()
                .method(method.clone())
                .uri("/headers")
                .header(header::HOST, &session)
                .body(Empty::<Bytes>::new())
                .unwrap();
            let response = clients.send(server.address, request).await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{method}");
        }
        let response = clients.get(server.address, &session, "/headers").await;
        let body: serde_json::Value = json_of(response).await;
        assert_eq!(body["error"], "unauthorized");
        assert_eq!(server.resolves(), 0);
        assert_eq!(upstream.requests(), 0);

        // A grant is traded for a host-only cookie, and the browser sent
        // back to the same target without it.
        let grant = pass(PassKind::Grant, 8845, ID, 60);
        let response = clients
            .get(
                server.address,
                &session,
                &format!("/headers?a=1&telo_access={grant}&b=2"),
            )
            .await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        assert_eq!(response.headers()[header::LOCATION], "/headers?a=1&b=2");
        let (cookie, attributes) = cookie_of(&response);
        for attribute in ["Path=/", "HttpOnly", "SameSite=Lax", "Max-Age=43200"] {
            assert!(attributes.contains(attribute), "{attributes}");
        }
        assert!(!attributes.contains("Domain"), "{attributes}");
        assert!(!attributes.contains("Secure"), "http base: {attributes}");
        assert_eq!(upstream.requests(), 0);

        // The cookie opens the port; the app sees neither it nor the grant.
        let response = clients
            .send(
                server.address,
                with_cookie(&session, "/headers", &format!("theme=dark; {cookie}")),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        let seen: serde_json::Value = json_of(response).await;
        assert_eq!(seen["headers"]["cookie"], serde_json::json!(["theme=dark"]));
        assert_eq!(seen["uri"], "/headers");
        // A grant on a request that is no navigation passes it on at once,
        // without the parameter.
        let before = upstream.requests();
        let post = Request::post(format!("/upload?telo_access={grant}"))
            .header(header::HOST, &session)
            .body(Full::new(Bytes::from_static(b"abc")))
            .unwrap();
        let response = clients.send(server.address, post).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(upstream.requests(), before + 1);

        // It opens no other port or session, and a grant that expired, was
        // signed with another key, or is a cookie in disguise opens nothing.
        for other in [
            session_host_header(8846, ID),
            session_host_header(8845, OTHER_ID),
        ] {
            let response = clients
                .send(server.address, with_cookie(&other, "/headers", &cookie))
                .await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{other}");
            let response = clients
                .get(server.address, &other, &format!("/?telo_access={grant}"))
                .await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{other}");
        }
        let foreign = Signer::new(vec![2; 32]).sign(&Pass {
            kind: PassKind::Grant,
            session_id: ID.into(),
            port: 8845,
            expires_at: unix_now() + 60,
        });
        for refused in [
            pass(PassKind::Grant, 8845, ID, -1),
            foreign,
            pass(PassKind::Cookie { link: None }, 8845, ID, 60),
        ] {
            let response = clients
                .get(
                    server.address,
                    &session,
                    &format!("/?telo_access={refused}"),
                )
                .await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        }
        let expired_cookie = pass(PassKind::Cookie { link: None }, 8845, ID, -1);
        let response = clients
            .send(
                server.address,
                with_cookie(&session, "/", &format!("telo_access={expired_cookie}")),
            )
            .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

        // The session's workload token opens it too; another token does not.
        for (token, status) in [
            ("workload-token", StatusCode::OK),
            ("other", StatusCode::UNAUTHORIZED),
        ] {
            let request = Request::get("/headers")
                .header(header::HOST, &session)
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .body(Empty::<Bytes>::new())
                .unwrap();
            let response = clients.send(server.address, request).await;
            assert_eq!(response.status(), status, "{token}");
        }

        // Each request of a pipelined connection is checked on its own, and
        // an HTTP/1.0 request is no way around it.
        let answer = raw(
            server.address,
            format!(
                "GET /headers HTTP/1.1\r\nHost: {session}\r\nCookie: {cookie}\r\n\r\n\
                 GET /headers HTTP/1.1\r\nHost: {session}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        let statuses: Vec<&str> = answer
            .split("HTTP/1.1 ")
            .skip(1)
            .map(|part| &part[..3])
            .collect();
        assert_eq!(statuses, ["200", "401"], "{answer}");
        let answer = raw(
            server.address,
            format!("GET /headers HTTP/1.0\r\nHost: {session}\r\n\r\n").as_bytes(),
        )
        .await;
        assert_eq!(status_of(&answer), 401, "{answer}");
        server.edge.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_share_link_opens_its_port_until_it_is_revoked() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start_with(
            [(host(8845, ID), Ok(upstream.address))],
            quick(),
            private_policy(),
            None,
        )
        .await;
        server.resolver.links.lock().unwrap().push("link1".into());
        let mut clients = Clients::default();
        let session = session_host_header(8845, ID);
        let link = pass(PassKind::Link { id: "link1".into() }, 8845, ID, 120);
        let response = clients
            .get(server.address, &session, &format!("/?telo_access={link}"))
            .await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let (cookie, attributes) = cookie_of(&response);
        // The cookie ends with the link.
        let max_age: u64 = attributes
            .split(';')
            .find_map(|a| a.trim().strip_prefix("Max-Age="))
            .unwrap()
            .parse()
            .unwrap();
        assert!((118..=120).contains(&max_age), "{attributes}");
        let response = clients
            .send(server.address, with_cookie(&session, "/headers", &cookie))
            .await;
        assert_eq!(response.status(), StatusCode::OK);

        // Revoked: neither the link nor its cookie opens anything.
        server.resolver.links.lock().unwrap().clear();
        let response = clients
            .get(server.address, &session, &format!("/?telo_access={link}"))
            .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let response = clients
            .send(server.address, with_cookie(&session, "/headers", &cookie))
            .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    })
    .await;
}

#[tokio::test]
async fn a_websocket_to_a_private_port_needs_access_like_any_request() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    use tokio_tungstenite::tungstenite::{Error as WsError, Message};
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start_with(
            [(host(8845, ID), Ok(upstream.address))],
            quick(),
            private_policy(),
            None,
        )
        .await;
        let session = session_host_header(8845, ID);
        let connect = |path: String, cookie: Option<String>| {
            let address = server.address;
            async move {
                let tcp = TcpStream::connect(address).await.unwrap();
                let mut request = format!("ws://{path}").into_client_request().unwrap();
                if let Some(cookie) = cookie {
                    request
                        .headers_mut()
                        .insert(header::COOKIE, cookie.parse().unwrap());
                }
                tokio_tungstenite::client_async(request, tcp).await
            }
        };
        match connect(format!("{session}/ws"), None).await {
            Err(WsError::Http(response)) => {
                assert_eq!(response.status(), StatusCode::UNAUTHORIZED)
            }
            other => panic!("a socket without access: {:?}", other.map(|(_, r)| r)),
        }
        let grant = pass(PassKind::Grant, 8845, ID, 60);
        let cookie = format!(
            "telo_access={}",
            pass(PassKind::Cookie { link: None }, 8845, ID, 60)
        );
        for (path, cookie) in [
            (format!("{session}/ws?telo_access={grant}"), None),
            (format!("{session}/ws"), Some(cookie)),
        ] {
            let (mut socket, response) = connect(path, cookie).await.unwrap();
            assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
            socket.send(Message::text("hi")).await.unwrap();
            assert_eq!(socket.next().await.unwrap().unwrap(), Message::text("hi"));
            socket.close(None).await.unwrap();
        }
        server.edge.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_public_edge_still_asks_a_guarded_ports_token() {
    within(async {
        let upstream = Upstream::start().await;
        let guarded = EdgeServer::start_with(
            [(host(8845, ID), Ok(upstream.address))],
            quick(),
            AccessPolicy::public(),
            Some("workload-token"),
        )
        .await;
        let open = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let mut clients = Clients::default();
        let session = session_host_header(8845, ID);
        let response = clients.get(guarded.address, &session, "/headers").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let request = Request::get("/headers")
            .header(header::HOST, &session)
            .header(header::AUTHORIZATION, "Bearer workload-token")
            .body(Empty::<Bytes>::new())
            .unwrap();
        assert_eq!(
            clients.send(guarded.address, request).await.status(),
            StatusCode::OK
        );
        let response = clients.get(open.address, &session, "/headers").await;
        assert_eq!(response.status(), StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn a_browser_waiting_on_a_waking_session_gets_a_page_that_reloads() {
    within(async {
        let upstream = Upstream::start().await;
        let (wake, awake) = tokio::sync::watch::channel(false);
        let resolver = Arc::new(FakeResolver {
            routes: [(host(8845, ID), Ok(upstream.address))]
                .into_iter()
                .collect(),
            awake: Some(awake),
            ..FakeResolver::default()
        });
        let edge = Edge::new(
            PreviewBase::parse(BASE).unwrap(),
            resolver.clone(),
            quick(),
            AccessPolicy::public(),
        );
        let session = session_host_header(8845, ID);
        let request = move |accept: &str| {
            Request::get("/headers")
                .header(header::HOST, session.as_str())
                .header(header::ACCEPT, accept)
                .body(Empty::<Bytes>::new())
                .unwrap()
        };
        let server = EdgeServer::serve(edge.clone(), resolver.clone()).await;
        let mut clients = Clients::default();
        // A browser is told the session is waking, by a page that reloads.
        let response = clients
            .send(server.address, request("text/html,*/*;q=0.8"))
            .await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let page = text(response).await;
        assert!(
            page.contains("<meta http-equiv=\"refresh\" content=\"2\">"),
            "{page}"
        );
        assert!(page.contains("is waking up"), "{page}");
        // A client that is no browser is held until the session answers.
        let mut api = Clients::default();
        let address = server.address;
        let held = tokio::spawn(async move {
            api.send(address, request("application/json"))
                .await
                .status()
        });
        while resolver.calls.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        assert!(!held.is_finished());
        wake.send(true).unwrap();
        assert_eq!(held.await.unwrap(), StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn an_open_connection_through_the_edge_keeps_its_session_in_use() {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let in_use = || Arc::strong_count(&server.resolver.in_use) - 1;
        let tcp = TcpStream::connect(server.address).await.unwrap();
        let request = format!("ws://{}/ws", session_host_header(8845, ID))
            .into_client_request()
            .unwrap();
        let (mut socket, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        socket.send(Message::text("hi")).await.unwrap();
        socket.next().await.unwrap().unwrap();
        assert_eq!(in_use(), 1, "held while the socket is open");
        socket.close(None).await.unwrap();
        while let Some(Ok(_)) = socket.next().await {}
        server.edge.until_idle(ID).await;
        assert_eq!(in_use(), 0, "let go with the socket");
        server.edge.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// A client connection's own upstream connections

fn get_request(host: &str, path: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header(header::HOST, host)
        .body(Empty::new())
        .unwrap()
}

async fn get_on(
    sender: &mut SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
) -> Response<Incoming> {
    sender.ready().await.unwrap();
    sender.send_request(get_request(host, path)).await.unwrap()
}

#[tokio::test]
async fn a_kept_client_connection_keeps_one_upstream_connection_and_closes_it() {
    within(async {
        let upstream = Upstream::start().await;
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], quick()).await;
        let host = session_host_header(8845, ID);
        let mut clients = Clients::default();
        let mut sender = clients.connect(server.address).await;
        for _ in 0..20 {
            let response = get_on(&mut sender, &host, "/hello").await;
            assert_eq!(text(response).await, "hello from upstream");
        }
        assert_eq!(upstream.requests(), 20);
        // The first request's pooled connection, and the client
        // connection's own for the rest.
        assert_eq!(upstream.connections(), 2);
        // Closing the client connection closes its own; the pool's stays.
        drop(sender);
        upstream.until_open(1).await;
        server.edge.until_idle(ID).await;
        // Another client connection is served as well.
        let response = clients.get(server.address, &host, "/hello").await;
        assert_eq!(text(response).await, "hello from upstream");
    })
    .await;
}

#[tokio::test]
async fn an_app_that_closes_a_kept_connection_between_requests_is_dialed_again() {
    within(async {
        // Answers one request per connection, then closes it without
        // saying so (as an app's idle timeout does).
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let mut app = JoinSet::new();
        app.spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut head = Vec::new();
                let mut buf = [0_u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        });
        let server = EdgeServer::start([(host(8845, ID), Ok(address))], quick()).await;
        let host = session_host_header(8845, ID);
        let mut clients = Clients::default();
        let mut sender = clients.connect(server.address).await;
        for _ in 0..4 {
            let response = get_on(&mut sender, &host, "/hello").await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(text(response).await, "ok");
            // The app's close arrives before the next request.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
        server.edge.until_idle(ID).await;
    })
    .await;
}

type Streamed = StreamBody<
    std::pin::Pin<Box<dyn futures_util::Stream<Item = io::Result<Frame<Bytes>>> + Send>>,
>;

fn streamed(
    frames: impl futures_util::Stream<Item = io::Result<Frame<Bytes>>> + Send + 'static,
) -> Streamed {
    StreamBody::new(Box::pin(frames))
}

#[tokio::test]
async fn bodies_stream_both_ways_on_a_kept_client_connection() {
    within(async {
        const CHUNKS: usize = 256; // 16 MiB
        let upstream = Upstream::start().await;
        let server = EdgeServer::start(
            [(host(8845, ID), Ok(upstream.address))],
            EdgeConfig::default(),
        )
        .await;
        let host = session_host_header(8845, ID);
        let tcp = TcpStream::connect(server.address).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Streamed>(TokioIo::new(tcp))
                .await
                .unwrap();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let _ = connection.await;
        });
        let expected = expected_hash(CHUNKS);
        for round in 0..3 {
            // Each chunk is made as the edge asks for it.
            let frames = stream::iter(0..CHUNKS).then(|i| async move {
                tokio::task::yield_now().await;
                Ok::<_, io::Error>(Frame::data(chunk(i)))
            });
            let request = Request::post("/upload")
                .header(header::HOST, &host)
                .body(streamed(frames))
                .unwrap();
            sender.ready().await.unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "round {round}");
            assert_eq!(
                text(response).await,
                format!("{} {expected}", CHUNKS * CHUNK)
            );

            let request = Request::get(format!("/download/{CHUNKS}"))
                .header(header::HOST, &host)
                .body(streamed(stream::empty()))
                .unwrap();
            sender.ready().await.unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(
                length_and_hash(response).await,
                (CHUNKS * CHUNK, expected.clone())
            );
        }
        assert_eq!(upstream.requests(), 6);
        assert_eq!(upstream.connections(), 2);
        server.edge.until_idle(ID).await;
    })
    .await;
}

#[tokio::test]
async fn a_kept_client_connection_gets_the_same_timeouts_and_refusals() {
    within(async {
        let mut held = JoinSet::new();
        let silent_address = silent_app(&mut held).await;
        let closed = closed_port().await;
        let server = EdgeServer::start(
            [
                (host(8845, ID), Ok(silent_address)),
                (host(8846, ID), Ok(closed)),
            ],
            quick(),
        )
        .await;
        let mut clients = Clients::default();
        let mut sender = clients.connect(server.address).await;
        for _ in 0..3 {
            let started = Instant::now();
            let response = get_on(&mut sender, &session_host_header(8845, ID), "/hello").await;
            assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
            assert!(started.elapsed() < Duration::from_secs(10));
            let body: serde_json::Value = json_of(response).await;
            assert_eq!(body["error"], "upstream_timeout");

            let response = get_on(&mut sender, &session_host_header(8846, ID), "/hello").await;
            assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
            let body: serde_json::Value = json_of(response).await;
            assert_eq!(body["error"], "port_not_listening");
        }
        server.edge.until_idle(ID).await;
    })
    .await;
}

#[tokio::test]
async fn a_kept_client_connections_idle_upstream_is_closed_after_the_idle_timeout() {
    within(async {
        let upstream = Upstream::start().await;
        let config = EdgeConfig {
            idle_timeout: Duration::from_millis(300),
            ..quick()
        };
        let server = EdgeServer::start([(host(8845, ID), Ok(upstream.address))], config).await;
        let host = session_host_header(8845, ID);
        let mut clients = Clients::default();
        let mut sender = clients.connect(server.address).await;
        for _ in 0..3 {
            let response = get_on(&mut sender, &host, "/hello").await;
            assert_eq!(text(response).await, "hello from upstream");
        }
        assert_eq!(upstream.connections(), 2);
        // The client connection stays open; both idle upstream connections
        // (the pool's and its own) are closed.
        let waited = Instant::now();
        upstream.until_open(0).await;
        assert!(waited.elapsed() < Duration::from_secs(10));
        let response = get_on(&mut sender, &host, "/hello").await;
        assert_eq!(text(response).await, "hello from upstream");
        assert_eq!(upstream.connections(), 3);
    })
    .await;
}
