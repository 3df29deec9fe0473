//! The HTTP accept loop of every server the runner binary runs (the runner's
//! API, `telo-runner workspace`), bounded so that anonymous clients cannot
//! take a service down: a connection limit at which the oldest connection
//! that has not sent a byte is shed for a new one (and past which, with
//! none left to shed, a clear refusal), a cap on the connections of one
//! client address, a deadline for every request's header block (idle
//! keep-alive connections included), a header size cap, and the open-file
//! limit raised at boot.
//!
//! HTTP/1.1 only, with upgrades for the terminal WebSocket: every client of
//! the runner (the editor, the terminal client, probes, proxies in front of
//! it, the runner itself for the workspace service) speaks it, and a
//! cleartext HTTP/2 preface would only be one more thing to bound.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

mod deadlines;
mod lanes;
mod stops;
mod table;

use crate::client_addr::TrustedProxies;
use crate::config::ConnectionLimits;
use crate::http::ErrorCode;
use crate::metrics::ConnectionCounters;
use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{Request, header};
use axum::response::{IntoResponse as _, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use lanes::Lanes;
use prometheus_client::metrics::counter::Counter;
use stops::{Stop, Stops};
use table::{Refused, Table, Ticket, Watched};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::{info, warn};

/// File descriptors kept free of client connections: session terminals and
/// logs, apiserver connections, bundle files.
pub const RESERVED_FDS: u64 = 512;
/// How many refusals may be in flight at once; past it a connection is
/// dropped without an answer (a flood is not owed one).
const MAX_REFUSALS_IN_FLIGHT: usize = 256;
/// Time a refused client gets to take its 503.
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// Open connections get this long to finish once the service stops.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long the loop pauses after an accept error that is about the
/// process (out of file descriptors), not the peer.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Connections kept for `/livez` and `/readyz` past the connection limit:
/// a kubelet whose probe gets a 503 restarts the runner, so a client that
/// holds every slot (thousands of event streams) must not be able to take
/// the probes' too.
const PROBE_SLOTS: usize = 8;
/// How much of a request past the limit is read to tell a probe from the
/// rest: its request line.
const REQUEST_LINE_BYTES: usize = 1024;
/// How long a probe served past the limit may take.
const PROBE_TIME: Duration = Duration::from_secs(5);
/// The paths served past the connection limit.
const PROBE_PATHS: &[&str] = &["/livez", "/readyz"];

/// Raises the open-file soft limit to the hard limit and returns the soft
/// limit now in force (`None` where it cannot be read).
pub fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => Some(hard),
        Err(err) => {
            warn!(soft, hard, error = %err, "could not raise the open-file limit");
            Some(soft)
        }
    }
}

/// The connection limit the process can honour: the configured one, lowered
/// to what the open-file limit leaves beside [`RESERVED_FDS`].
pub fn effective_max_connections(configured: usize, fd_limit: Option<u64>) -> usize {
    let Some(limit) = fd_limit else {
        return configured;
    };
    let room = usize::try_from(limit.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    configured.min(room.max(1))
}

/// Which service a refusal at the connection limit speaks for, and the
/// setting that raises the limit (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceName {
    /// `runner`: "The runner is serving its limit of …".
    pub name: &'static str,
    /// `RUNNER_MAX_CONNECTIONS`, named in the refusal and the warnings.
    pub limit_setting: Option<&'static str>,
    /// `RUNNER_MAX_CONNECTIONS_PER_CLIENT`, named in the per-client refusal.
    pub client_limit_setting: Option<&'static str>,
}

impl ServiceName {
    /// The refusal's message at `limit` connections.
    pub fn refusal(&self, limit: usize) -> String {
        match self.limit_setting {
            Some(setting) => format!(
                "The {} is serving its limit of {limit} connections ({setting}); try again shortly.",
                self.name
            ),
            None => format!(
                "The {} is serving its limit of {limit} connections; try again shortly.",
                self.name
            ),
        }
    }

    /// The refusal's message to a client holding `limit` connections.
    pub fn client_refusal(&self, limit: usize) -> String {
        match self.client_limit_setting {
            Some(setting) => format!(
                "This client holds its limit of {limit} connections to the {} ({setting}); close one or try again shortly.",
                self.name
            ),
            None => format!(
                "This client holds its limit of {limit} connections to the {}; close one or try again shortly.",
                self.name
            ),
        }
    }
}

/// A refusal written on a connection that was not admitted.
#[derive(Debug, Clone)]
struct Refusal {
    error: ErrorCode,
    message: Arc<str>,
}

impl Refusal {
    fn body(&self) -> String {
        serde_json::json!({"error": self.error.as_str(), "message": &*self.message}).to_string()
    }

    /// The same refusal as a response on a connection that was admitted
    /// (it closes once written).
    fn response(&self) -> Response {
        (
            self.error.status(),
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::RETRY_AFTER, "1"),
                (header::CONNECTION, "close"),
            ],
            self.body(),
        )
            .into_response()
    }
}

/// The connection cap of one client address: the configured one, or a
/// quarter of the connection limit in force.
pub fn max_connections_per_client(configured: Option<usize>, max_connections: usize) -> usize {
    configured.unwrap_or((max_connections / 4).max(1))
}

/// Serves `router` on `listener` until `stop` fires, then gives open
/// connections [`CLOSE_GRACE`] to finish and drops the rest.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    name: ServiceName,
    counters: ConnectionCounters,
    stop: CancellationToken,
) -> io::Result<()> {
    serve_with_edge(listener, router, None, limits, name, counters, stop).await
}

/// [`serve`], with a request for a session host (`<port>-<id>.<base host>`)
/// forwarded by `edge` to that session's port instead of routed to the API.
pub async fn serve_with_edge(
    listener: TcpListener,
    router: Router,
    edge: Option<crate::edge::Edge>,
    limits: ConnectionLimits,
    name: ServiceName,
    counters: ConnectionCounters,
    stop: CancellationToken,
) -> io::Result<()> {
    let max_connections = effective_max_connections(limits.max_connections, raise_fd_limit());
    if max_connections < limits.max_connections {
        warn!(
            configured = limits.max_connections,
            serving = max_connections,
            setting = name.limit_setting.unwrap_or("the connection limit"),
            "the connection limit is more than the open-file limit allows; serving fewer"
        );
    }
    let per_client = max_connections_per_client(limits.max_connections_per_client, max_connections);
    info!(
        max_connections,
        max_connections_per_client = per_client,
        trusted_proxies = !limits.trusted_proxies.is_empty(),
        header_timeout_s = limits.header_timeout.as_secs(),
        "accepting connections"
    );
    // Each connection thread adds its own timer for the header deadline
    // (see `deadlines`).
    let mut http = http1::Builder::new();
    http
        // The head alone is bounded: a body is read in chunks as large as
        // hyper's adaptive buffer grows (a cap here would also cut every
        // upload into reads of this size).
        .max_header_size(limits.max_header_bytes);
    // A header block has at most 100 lines (more is 431): hyper's own
    // bound. Setting the same bound explicitly would have hyper fill its
    // parse arrays for every request.
    let door = Arc::new(Door {
        http,
        header_timeout: limits.header_timeout,
        table: Table::new(max_connections, per_client),
        full: Refusal {
            error: ErrorCode::TooManyConnections,
            message: name.refusal(max_connections).into(),
        },
        client_full: Refusal {
            error: ErrorCode::TooManyConnectionsFromClient,
            message: name.client_refusal(per_client).into(),
        },
        refusals: Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT)),
        probes: Arc::new(Semaphore::new(PROBE_SLOTS)),
        router,
        edge,
        trusted_proxies: limits.trusted_proxies.clone(),
        counters,
        max_connections,
        main: Handle::current(),
        last_shed_warning: std::sync::Mutex::new(None),
    });
    let closing = CancellationToken::new();
    let lane_count = limits.connection_threads.unwrap_or_else(lane_count);
    let mut lanes = Lanes::start(lane_count, door, closing.clone())?;
    let mut last_accept_warning: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) if is_peer_error(&err) => continue,
            Err(err) => {
                // Out of descriptors: the connections already open go on;
                // retry shortly instead of spinning on the same error.
                if last_accept_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    warn!(error = %err, "could not accept a connection");
                    last_accept_warning = Some(Instant::now());
                }
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    () = stop.cancelled() => break,
                }
            }
        };
        lanes.hand(tcp, peer);
    }
    drop(listener);
    closing.cancel();
    if !lanes.finish().await {
        warn!("connections still open after shutdown; closing them");
    }
    Ok(())
}

/// How many threads serve connections: one per core.
fn lane_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// What the connection threads share: how a connection is admitted, served
/// or refused.
struct Door {
    /// How connections are served, less the header deadline, which each
    /// connection thread keeps itself.
    http: http1::Builder,
    header_timeout: Duration,
    table: Arc<Table>,
    full: Refusal,
    client_full: Refusal,
    refusals: Arc<Semaphore>,
    probes: Arc<Semaphore>,
    router: Router,
    edge: Option<crate::edge::Edge>,
    trusted_proxies: TrustedProxies,
    counters: ConnectionCounters,
    max_connections: usize,
    /// The runtime the service was started on: the API's handlers run
    /// there, never on a connection thread.
    main: Handle,
    last_shed_warning: std::sync::Mutex<Option<Instant>>,
}

impl Door {
    /// How a connection thread serves its connections: [`Door::http`] with
    /// the thread's own header deadlines.
    fn http_on(&self, deadlines: &deadlines::Deadlines) -> http1::Builder {
        let mut http = self.http.clone();
        http.timer(deadlines.clone())
            .header_read_timeout(self.header_timeout);
        http
    }

    /// Admits `tcp` on the connection thread it was handed to and spawns
    /// its serving with `http` on `tasks` (or its refusal, past the
    /// limit); `open` is held until it ends. Connections handed to
    /// different threads at the same moment are admitted in either order.
    fn take(
        &self,
        http: &http1::Builder,
        tcp: TcpStream,
        peer: SocketAddr,
        open: lanes::Open,
        tasks: &mut JoinSet<()>,
        closing: &CancellationToken,
    ) {
        // Frames are written as they happen (SSE events, terminal output);
        // with Nagle's algorithm on, a small write waits for the previous
        // one's delayed ACK — up to 40 ms on Linux.
        if let Err(err) = tcp.set_nodelay(true) {
            warn!(error = %err, "could not turn off Nagle's algorithm on a connection");
        }
        // A trusted proxy's connection is counted against the client of
        // each request it carries, once its header block names it.
        let peer_ip = peer.ip().to_canonical();
        let proxied = self.trusted_proxies.trusts(peer_ip);
        let tcp = Arc::new(tcp);
        let ticket = match self.table.admit(&tcp, (!proxied).then_some(peer_ip)) {
            Ok(ticket) => ticket,
            Err(refused) => {
                match refused {
                    Refused::Full => self.counters.full.inc(),
                    Refused::ClientFull => self.counters.client_full.inc(),
                };
                let Ok(tcp) = Arc::try_unwrap(tcp) else {
                    return;
                };
                if let Ok(refusal) = self.refusals.clone().try_acquire_owned() {
                    let past = PastTheLimit {
                        refusal: match refused {
                            Refused::Full => self.full.clone(),
                            Refused::ClientFull => self.client_full.clone(),
                        },
                        probes: self.probes.clone(),
                        http: http.clone(),
                        service: per_connection(
                            self.router.clone(),
                            self.main.clone(),
                            peer,
                            None,
                            None,
                        ),
                    };
                    tasks.spawn(async move {
                        past.answer(tcp).await;
                        drop(refusal);
                        drop(open);
                    });
                }
                return;
            }
        };
        if ticket.shed_another() {
            self.counters.shed.inc();
            self.warn_of_shedding();
        }
        let shed = ticket.shed().clone();
        // The edge's connections to the apps this client asks for, polled
        // on the client connection's task.
        let link = self.edge.as_ref().map(crate::edge::Edge::link);
        let service = per_connection(
            self.router.clone(),
            self.main.clone(),
            peer,
            self.edge.clone().zip(link.clone()),
            proxied.then(|| Proxied {
                ticket: ticket.clone(),
                proxies: self.trusted_proxies.clone(),
                refusal: self.client_full.clone(),
                refused: self.counters.client_full.clone(),
            }),
        );
        let connection = crate::edge::Linked::new(
            http.serve_connection(TokioIo::new(Watched::new(tcp, ticket)), service)
                .with_upgrades(),
            link,
        );
        let mut stops = Stops::new(shed, closing.clone());
        tasks.spawn(async move {
            // A connection error is the peer's business (reset, timed out
            // headers, a malformed request hyper already answered).
            let mut connection = connection;
            let stop = std::future::poll_fn(|cx| {
                if Pin::new(&mut connection).poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                stops.poll_stop(cx).map(Some)
            })
            .await;
            match stop {
                // Ended by its client, or shed for a newer connection: it
                // has sent nothing, so there is nothing to answer.
                None | Some(Stop::Shed) => {}
                Some(Stop::Closing) => {
                    // Finish the request in flight, take no other.
                    connection.downstream().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(open);
        });
    }

    /// At most one warning in ten seconds that connections are being shed.
    fn warn_of_shedding(&self) {
        let mut last = self
            .last_shed_warning
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
            warn!(
                max_connections = self.max_connections,
                shed = self.table.shed_count(),
                "at the connection limit: closing connections that have sent nothing to admit new ones"
            );
            *last = Some(Instant::now());
        }
    }
}

/// Errors of one incoming connection, not of the listener.
fn is_peer_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// What a trusted proxy's connection needs to count each request against
/// its client.
struct Proxied {
    ticket: Arc<Ticket>,
    proxies: TrustedProxies,
    refusal: Refusal,
    refused: Counter,
}

/// The router, with the client's address on every request (as axum's
/// `ConnectInfo`): the subscriber caps count a client without a token by
/// its address. The client is the peer, or for a trusted proxy the one its
/// `X-Forwarded-For` names, whose connection cap is applied here: past it
/// the request is refused and the connection closed.
///
/// A hyper service, not a tower one behind hyper-util's adapter: the
/// adapter clones the service for each request and moves the request and
/// its future through a state machine of its own, copies that every edge
/// request paid for.
fn per_connection(
    router: Router,
    main: Handle,
    peer: SocketAddr,
    edge: Option<(crate::edge::Edge, crate::edge::EdgeLink)>,
    proxied: Option<Proxied>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    let proxied = proxied.map(Arc::new);
    hyper::service::service_fn(move |mut request: Request<Incoming>| {
        let router = router.clone();
        let main = main.clone();
        let mut client = peer;
        let mut refused = None;
        if let Some(proxied) = &proxied {
            client = SocketAddr::new(
                proxied.proxies.client(peer.ip(), request.headers()),
                peer.port(),
            );
            if proxied.ticket.attribute(client.ip()).is_err() {
                proxied.refused.inc();
                refused = Some(proxied.refusal.response());
            }
        }
        // A session host goes to the edge; a malformed one under the base
        // is refused there and never reaches the API either.
        let routed = edge.as_ref().map(|(edge, link)| {
            (
                (edge.clone(), link.clone()),
                link.route(edge.base(), &request),
            )
        });
        async move {
            if let Some(response) = refused {
                return Ok(response);
            }
            match routed {
                Some(((edge, link), Ok(Some(host)))) if edge.serves_here(&host) => Ok(edge
                    .forward_on(Some(&link), host, request, peer, false)
                    .await),
                // Another replica holds the session: the router's replica
                // layer forwards the request to it.
                Some((_, Ok(Some(host)))) => {
                    let extensions = request.extensions_mut();
                    extensions.insert(ConnectInfo(client));
                    extensions.insert(crate::edge::ElsewhereSession(host));
                    on_main(&main, router.oneshot(request)).await
                }
                Some((_, Err(refusal))) => Ok(crate::edge::refusal_response(
                    &refusal,
                    crate::edge::prefers_html(request.headers()),
                    None,
                )),
                _ => {
                    request.extensions_mut().insert(ConnectInfo(client));
                    on_main(&main, router.oneshot(request)).await
                }
            }
        }
    })
}

/// Runs an API request's handling on `main`, the runtime the service was
/// started on, and gives its response to the connection thread: whatever
/// a handler spawns (a session's supervision, a terminal socket's relay)
/// belongs to that runtime and outlives no owner of it. The handling is
/// aborted if the connection goes away first, as it was when it ran on
/// the connection's own task.
async fn on_main(
    main: &Handle,
    handling: impl Future<Output = Result<Response, std::convert::Infallible>> + Send + 'static,
) -> Result<Response, std::convert::Infallible> {
    // `None`: the runtime is shutting down under the request.
    crate::tasks::run_on(main, handling)
        .await
        .unwrap_or_else(|| {
            Ok(Refusal {
                error: ErrorCode::ShuttingDown,
                message: "The service is shutting down; try again shortly.".into(),
            }
            .response())
        })
}

/// What a connection past the limit gets: a probe is served on one of the
/// slots kept for probes, anything else a 503.
struct PastTheLimit<S> {
    /// The refusal (it names the service and its limit).
    refusal: Refusal,
    probes: Arc<Semaphore>,
    http: http1::Builder,
    service: S,
}

impl<S> PastTheLimit<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = axum::response::Response> + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send,
{
    async fn answer(self, mut tcp: TcpStream) {
        let head = tokio::time::timeout(REFUSAL_TIME, read_request_line(&mut tcp))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        if is_probe(&head)
            && let Ok(probe_slot) = self.probes.try_acquire_owned()
        {
            let mut http = self.http;
            http.keep_alive(false);
            let connection =
                http.serve_connection(TokioIo::new(Replayed::new(head, tcp)), self.service);
            let _ = tokio::time::timeout(PROBE_TIME, connection).await;
            drop(probe_slot);
            return;
        }
        refuse(tcp, &self.refusal).await;
    }
}

/// Reads up to the end of the request line (or [`REQUEST_LINE_BYTES`]).
async fn read_request_line(tcp: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0_u8; 256];
    while !head.contains(&b'\n') && head.len() < REQUEST_LINE_BYTES {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

/// Whether a request line is a `GET` of one of the [`PROBE_PATHS`].
fn is_probe(head: &[u8]) -> bool {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return false;
    };
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    method == b"GET" && PROBE_PATHS.iter().any(|probe| probe.as_bytes() == path)
}

/// A connection whose first bytes were already read: they are read again
/// first, then the socket.
struct Replayed {
    head: Vec<u8>,
    at: usize,
    tcp: TcpStream,
}

impl Replayed {
    fn new(head: Vec<u8>, tcp: TcpStream) -> Self {
        Self { head, at: 0, tcp }
    }
}

impl AsyncRead for Replayed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.head.len() {
            let n = (this.head.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// A connection past the limit (or its client's) gets a 503 (a 429)
/// saying so, then is closed. The request is read and discarded only so
/// that closing does not reset the connection before the client has read
/// the answer.
async fn refuse(mut tcp: TcpStream, refusal: &Refusal) {
    let body = refusal.body();
    let response = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        refusal.error.status().as_u16(),
        refusal
            .error
            .status()
            .canonical_reason()
            .unwrap_or_default(),
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        tcp.write_all(response.as_bytes()).await?;
        tcp.shutdown().await?;
        let mut discard = [0_u8; 4096];
        while tcp.read(&mut discard).await? > 0 {}
        Ok::<(), io::Error>(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;

    /// The thread this code runs on, by name.
    fn thread_name() -> String {
        std::thread::current().name().unwrap_or_default().to_owned()
    }

    /// A service on `threads` connection threads whose one route answers
    /// with the thread its handler ran on (a header) and the thread its body
    /// was written from (the body). `marker` is held by the router.
    async fn thread_telling_service(
        threads: usize,
        marker: Arc<()>,
    ) -> (
        SocketAddr,
        CancellationToken,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let router = Router::new()
            .route(
                "/",
                get(|| async {
                    let body =
                        futures_util::stream::once(async { Ok::<_, io::Error>(thread_name()) });
                    (
                        [("x-handler-thread", thread_name())],
                        Body::from_stream(body),
                    )
                }),
            )
            .layer(axum::Extension(marker));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let limits = ConnectionLimits {
            connection_threads: Some(threads),
            ..ConnectionLimits::default()
        };
        let name = ServiceName {
            name: "test",
            limit_setting: None,
            client_limit_setting: None,
        };
        let served = tokio::spawn(serve(
            listener,
            router,
            limits,
            name,
            ConnectionCounters::default(),
            stop.clone(),
        ));
        (addr, stop, served)
    }

    /// Sends `GET /` on `tcp` (kept alive) and returns the handler's thread
    /// and the body's.
    async fn threads_of_a_request(tcp: &mut TcpStream) -> (String, String) {
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        let mut read = Vec::new();
        let mut buf = [0_u8; 1024];
        // Chunked: the response ends with its last chunk.
        while !read.ends_with(b"0\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&read));
            read.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&read).into_owned();
        let handler = text
            .lines()
            .find_map(|line| line.strip_prefix("x-handler-thread: "))
            .expect("the handler's thread")
            .to_owned();
        let body = text
            .split("\r\n\r\n")
            .nth(1)
            .and_then(|chunks| chunks.lines().nth(1))
            .expect("the body's thread")
            .to_owned();
        (handler, body)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_is_served_on_its_own_thread_and_the_api_on_the_main_runtime() {
        let marker = Arc::new(());
        let (addr, stop, served) = thread_telling_service(2, marker.clone()).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let (handler, body) = threads_of_a_request(&mut first).await;
        assert!(!handler.starts_with("connections-"), "{handler}");
        assert!(body.starts_with("connections-"), "{body}");
        // Kept alive, the connection stays on its thread.
        assert_eq!(threads_of_a_request(&mut first).await.1, body);
        // The next connection goes to the thread serving fewer.
        let mut second = TcpStream::connect(addr).await.unwrap();
        let (_, second_body) = threads_of_a_request(&mut second).await;
        assert!(second_body.starts_with("connections-"), "{second_body}");
        assert_ne!(second_body, body);
        stop.cancel();
        served.await.unwrap().unwrap();
        // Every thread has let go of the service: they were joined.
        assert_eq!(Arc::strong_count(&marker), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_service_dropped_without_stopping_closes_its_connections() {
        let (addr, _stop, served) = thread_telling_service(2, Arc::new(())).await;
        let mut kept = TcpStream::connect(addr).await.unwrap();
        threads_of_a_request(&mut kept).await;
        served.abort();
        let mut buf = [0_u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(10), kept.read(&mut buf))
            .await
            .expect("the connection closed");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    #[test]
    fn only_a_get_of_livez_or_readyz_is_a_probe() {
        assert!(is_probe(b"GET /livez HTTP/1.1\r\nhost: x\r\n"));
        assert!(is_probe(b"GET /readyz?verbose HTTP/1.1\r\n"));
        assert!(!is_probe(b"POST /livez HTTP/1.1\r\n"));
        assert!(!is_probe(b"GET /livez/x HTTP/1.1\r\n"));
        assert!(!is_probe(b"GET /v1/sessions HTTP/1.1\r\n"));
        assert!(!is_probe(b"GET /liv"));
        assert!(!is_probe(b""));
    }

    #[test]
    fn the_limit_leaves_room_for_the_runners_own_files() {
        assert_eq!(effective_max_connections(6000, None), 6000);
        assert_eq!(effective_max_connections(6000, Some(1_048_576)), 6000);
        assert_eq!(effective_max_connections(6000, Some(1024)), 512);
        assert_eq!(effective_max_connections(6000, Some(100)), 1);
    }

    #[test]
    fn a_refusal_names_the_service_and_its_setting() {
        let runner = ServiceName {
            name: "runner",
            limit_setting: Some("RUNNER_MAX_CONNECTIONS"),
            client_limit_setting: Some("RUNNER_MAX_CONNECTIONS_PER_CLIENT"),
        };
        assert_eq!(
            runner.refusal(8),
            "The runner is serving its limit of 8 connections (RUNNER_MAX_CONNECTIONS); try again shortly."
        );
        let workspace = ServiceName {
            name: "workspace service",
            limit_setting: None,
            client_limit_setting: None,
        };
        assert_eq!(
            workspace.refusal(64),
            "The workspace service is serving its limit of 64 connections; try again shortly."
        );
        assert_eq!(
            runner.client_refusal(2),
            "This client holds its limit of 2 connections to the runner (RUNNER_MAX_CONNECTIONS_PER_CLIENT); close one or try again shortly."
        );
    }
}
