//! Several replicas, one API: a request for a session another replica
//! holds is served for its owner.
//!
//! Two layers, on when the backend runs replicas ([`Backend::replicas`]):
//!
//! - [`identify_peer`], outside the bearer gate, tells a peer's call from
//!   a client's. A request whose [`PEER_TOKEN_HEADER`] matches the peer
//!   token is marked [`FromPeer`] and its client address is the one the
//!   forwarding replica saw; a header with any other value is dropped and
//!   the request is a client's like any other.
//! - [`serve_for_owner`], inside the gate (an unauthenticated request
//!   causes no peer traffic), forwards a request for a session this
//!   replica does not hold to the replica that does — streamed both ways,
//!   upgrades spliced — answers `503` with `Retry-After` while a session
//!   is moving or its owner cannot be reached, keeps a fenced replica from
//!   changing its sessions, and merges the session list of every live
//!   replica. A peer's call is never forwarded again, so two replicas that
//!   disagree about an owner answer `503 session_moving` instead of
//!   passing a request back and forth.
//!
//! [`Backend::replicas`]: crate::backend::Backend::replicas

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};
use http_body_util::{BodyExt as _, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::error::{ApiError, ErrorCode};
use crate::edge::{EdgeRefusal, ElsewhereSession, SessionHost, prefers_html, refusal_response};
use crate::edge::{
    RequestBody, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, await_response,
    check_framing, joined, splice, strip_hop_by_hop, switched_head, upgrade_protocol,
};
use crate::metrics::Metrics;
use crate::registry::SessionRegistry;
use crate::replicas::{Owner, PEER_TOKEN_HEADER, Peer, Replicas};
use crate::tasks::OwnedTasks;

/// How long connecting to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a peer may take to answer once the request is sent.
const RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a peer's session list may take; past it the list goes without.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest session list read from a peer.
const MAX_LIST_BYTES: usize = 16 * 1024 * 1024;
/// Idle keep-alive connections kept to one peer.
const MAX_IDLE_PER_PEER: usize = 32;
/// How long an idle connection to a peer is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// What the runner adds to `Via`.
const VIA: &str = "1.1 telo-runner";

/// Marks a request that carried the peer token: another replica's call,
/// never forwarded again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FromPeer;

/// What the two layers share: the replicas, the pooled client to peers and
/// the spliced upgraded connections.
pub(crate) struct Peers {
    replicas: Arc<dyn Replicas>,
    registry: SessionRegistry,
    metrics: Arc<Metrics>,
    client: Client<HttpConnector, RequestBody<Body>>,
    tasks: OwnedTasks,
    /// Fired when the service is about to exit: relayed terminal sockets
    /// are closed with 1001, as this replica's own are.
    going_away: tokio_util::sync::CancellationToken,
    /// Every open terminal socket (relayed ones too), so shutdown can let
    /// each send its close frame.
    sockets: tokio_util::task::TaskTracker,
    /// The output marks peers send this replica ([`super::peer_marks`]).
    marks: Arc<crate::session::shipping::PeerMarks>,
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.tasks.stop();
    }
}

impl Peers {
    pub(crate) fn new(
        replicas: Arc<dyn Replicas>,
        registry: SessionRegistry,
        going_away: tokio_util::sync::CancellationToken,
        sockets: tokio_util::task::TaskTracker,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // Event frames and terminal output are small writes, sent as they
        // happen.
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(MAX_IDLE_PER_PEER)
            .build(connector);
        let tasks = OwnedTasks::new();
        // Sessions publish their output through the mark stream from now
        // on; the stream ends with these tasks.
        let (shipper, shipments) = crate::session::shipping::OutputShipper::channel();
        let marks = Arc::new(crate::session::shipping::PeerMarks::default());
        registry.set_mark_stream(shipper, marks.clone());
        tasks.spawn(super::peer_marks::ship(
            shipments,
            replicas.clone(),
            client.clone(),
        ));
        Self {
            metrics: registry.metrics().clone(),
            replicas,
            registry,
            client,
            tasks,
            going_away,
            sockets,
            marks,
        }
    }
}

/// What a request is, as far as replicas go.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    /// One session: `/v1/sessions/{id}[/...]` or
    /// `/internal/sessions/{id}/access`.
    Session(&'a str),
    /// `GET /v1/sessions`.
    List,
    /// `POST /v1/sessions` or `POST /v1/apps/{name}/sessions`.
    Create,
    Other,
}

fn target<'a>(method: &Method, path: &'a str) -> Target<'a> {
    if path == "/v1/sessions" {
        return match *method {
            Method::GET => Target::List,
            Method::POST => Target::Create,
            _ => Target::Other,
        };
    }
    if let Some(rest) = path.strip_prefix("/v1/sessions/") {
        let id = rest.split('/').next().unwrap_or_default();
        return if id.is_empty() {
            Target::Other
        } else {
            Target::Session(id)
        };
    }
    if let Some(id) = path
        .strip_prefix("/internal/sessions/")
        .and_then(|rest| rest.strip_suffix("/access"))
        .filter(|id| !id.is_empty() && !id.contains('/'))
    {
        return Target::Session(id);
    }
    if *method == Method::POST
        && let Some(name) = path
            .strip_prefix("/v1/apps/")
            .and_then(|rest| rest.strip_suffix("/sessions"))
        && !name.is_empty()
        && !name.contains('/')
    {
        return Target::Create;
    }
    Target::Other
}

/// Whether `method` may change what it is sent to.
fn writes(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A `503` with `Retry-After: 1`.
fn retry_soon(code: ErrorCode, message: String) -> Response {
    let mut response = ApiError::new(code, message).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Outside the bearer gate: marks a peer's call, and drops a peer header
/// that does not carry the peer token.
pub(crate) async fn identify_peer(
    State(peers): State<Arc<Peers>>,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = request.headers_mut().remove(PEER_TOKEN_HEADER);
    let from_peer = presented
        .as_ref()
        .is_some_and(|presented| peers.replicas.peer_token().matches(presented.as_bytes()));
    // A peer opening its mark stream to this replica.
    if request.uri().path() == super::peer_marks::MARKS_PATH {
        if !from_peer {
            return StatusCode::NOT_FOUND.into_response();
        }
        return super::peer_marks::accept(request, peers.marks.clone(), &peers.tasks);
    }
    // A peer asking whether this replica holds a session (it has no record
    // of it yet: the session is being created here).
    if let Some(id) = request.uri().path().strip_prefix(HOLDS_PREFIX) {
        let held = from_peer && peers.registry.get(id).is_some();
        return if held {
            StatusCode::NO_CONTENT.into_response()
        } else {
            StatusCode::NOT_FOUND.into_response()
        };
    }
    if presented.is_some() {
        if from_peer {
            request.extensions_mut().insert(FromPeer);
            // The client is the one the forwarding replica saw: the last
            // address it appended.
            if let Some(client) = forwarded_client(request.headers()) {
                let port = request
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .map_or(0, |ConnectInfo(peer)| peer.port());
                request
                    .extensions_mut()
                    .insert(ConnectInfo(SocketAddr::new(client, port)));
            }
        } else {
            debug!("a request carried a peer header without the peer token; treated as a client's");
        }
    }
    next.run(request).await
}

/// Where a peer asks whether this replica holds a session; answered only
/// to peers (204 or 404).
const HOLDS_PREFIX: &str = "/internal/replica/holds/";
/// How long a peer may take to say whether it holds a session.
const HOLDS_TIMEOUT: Duration = Duration::from_secs(2);

/// Which live peer holds a session no record names yet.
enum Holder {
    /// This peer (the session was just created there).
    Peer(Peer),
    /// Every live peer said it does not.
    Nobody,
    /// Some peer could not be asked (it may be on its way out, handing
    /// the session over): the client should ask again shortly.
    Unsure,
}

/// The live peer that holds `id` though no record names it yet: a session
/// just created there, whose pod or record is still on its way. Asked of
/// every live peer at once.
async fn holder_among_peers(peers: &Peers, id: &str) -> Holder {
    let known = peers.replicas.peers();
    match holder_among(peers, known.clone(), id).await {
        Holder::Nobody => {}
        found => return found,
    }
    // A replica that started a moment ago (and created the session) may
    // not be among the peers this one has seen yet.
    let joined: Vec<Peer> = peers
        .replicas
        .peers_now()
        .await
        .into_iter()
        .filter(|peer| !known.iter().any(|k| k.id == peer.id))
        .collect();
    if joined.is_empty() {
        return Holder::Nobody;
    }
    holder_among(peers, joined, id).await
}

/// Which of `asked` holds `id`, asked of all at once.
async fn holder_among(peers: &Peers, asked: Vec<Peer>, id: &str) -> Holder {
    let asks = asked.into_iter().map(|peer| async move {
        let uri = peer_uri(&peer, &format!("{HOLDS_PREFIX}{id}"))?;
        let mut request = http::Request::get(uri)
            .body(RequestBody::new(Body::empty()).0)
            .ok()?;
        request.headers_mut().insert(
            HeaderName::from_static(PEER_TOKEN_HEADER),
            peer_token_value(peers)?,
        );
        let answer = tokio::time::timeout(HOLDS_TIMEOUT, peers.client.request(request))
            .await
            .ok()?
            .ok()?;
        Some((answer.status() == StatusCode::NO_CONTENT).then_some(peer))
    });
    let answers = join_all(asks).await;
    if let Some(peer) = answers.iter().flatten().flatten().next() {
        return Holder::Peer(peer.clone());
    }
    if answers.iter().any(Option::is_none) {
        Holder::Unsure
    } else {
        Holder::Nobody
    }
}

/// The last address of `X-Forwarded-For`.
fn forwarded_client(headers: &http::HeaderMap) -> Option<std::net::IpAddr> {
    joined(headers, &X_FORWARDED_FOR)?
        .rsplit(',')
        .next()
        .and_then(|last| last.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| ip.to_canonical())
}

/// Inside the bearer gate: serves a request for its session's owner.
pub(crate) async fn serve_for_owner(
    State(peers): State<Arc<Peers>>,
    request: Request,
    next: Next,
) -> Response {
    let from_peer = request.extensions().get::<FromPeer>().is_some();
    if let Some(ElsewhereSession(host)) = request.extensions().get::<ElsewhereSession>().cloned() {
        return serve_session_host(&peers, &host, from_peer, request).await;
    }
    let method = request.method().clone();
    match target(&method, request.uri().path()) {
        Target::Other => next.run(request).await,
        Target::Create => {
            if peers.replicas.may_act() {
                next.run(request).await
            } else {
                fenced()
            }
        }
        Target::List if from_peer => next.run(request).await,
        Target::List => merged_list(&peers, request, next).await,
        Target::Session(id) => {
            let id = id.to_owned();
            if peers.registry.get(&id).is_some() {
                if writes(&method) && !peers.replicas.may_act() {
                    return fenced();
                }
                return next.run(request).await;
            }
            match peers.replicas.owner(&id) {
                Owner::Here if from_peer => next.run(request).await,
                Owner::Here => match holder_among_peers(&peers, &id).await {
                    Holder::Peer(peer) => forward(&peers, &peer, request, Relay::Api).await,
                    Holder::Nobody => next.run(request).await,
                    Holder::Unsure => {
                        peers.metrics.peer_forward("unavailable");
                        moving(&id)
                    }
                },
                Owner::Moving { from } => {
                    peers.metrics.peer_forward("moving");
                    debug!(session = %id, from = %from, "a request for a session being taken over");
                    moving(&id)
                }
                Owner::Recorded => {
                    // Claimed by this replica, whose registry does not have
                    // it yet: it is being adopted here.
                    peers.metrics.peer_forward("moving");
                    debug!(session = %id, "a request for a session this replica is adopting");
                    moving(&id)
                }
                Owner::Peer(peer) if from_peer => {
                    // The forwarding replica thinks this one holds it, and
                    // this one thinks `peer` does: the record is changing.
                    peers.metrics.peer_forward("refused");
                    debug!(session = %id, owner = %peer.id, "a peer's request for a session held elsewhere");
                    moving(&id)
                }
                Owner::Peer(peer) => forward(&peers, &peer, request, Relay::Api).await,
            }
        }
    }
}

/// A request for a session host whose session this replica does not hold:
/// forwarded to the owner, whose edge serves it (its `Host` kept); the
/// edge's own pages otherwise.
async fn serve_session_host(
    peers: &Peers,
    host: &SessionHost,
    from_peer: bool,
    request: Request,
) -> Response {
    let wants_html = prefers_html(request.headers());
    let refusal = match peers.replicas.owner(&host.session_id) {
        Owner::Peer(peer) if !from_peer => {
            return forward(peers, &peer, request, Relay::SessionHost).await;
        }
        Owner::Peer(_) | Owner::Moving { .. } | Owner::Recorded => {
            peers.metrics.peer_forward("moving");
            EdgeRefusal::Starting
        }
        Owner::Here if from_peer => EdgeRefusal::UnknownSession,
        Owner::Here => match holder_among_peers(peers, &host.session_id).await {
            Holder::Peer(peer) => {
                return forward(peers, &peer, request, Relay::SessionHost).await;
            }
            Holder::Nobody => EdgeRefusal::UnknownSession,
            Holder::Unsure => EdgeRefusal::Starting,
        },
    };
    refusal_response(&refusal, wants_html, Some(host))
}

fn fenced() -> Response {
    retry_soon(
        ErrorCode::ReplicaFenced,
        "this replica may not change sessions until it renews its lease; retry shortly".into(),
    )
}

fn moving(id: &str) -> Response {
    retry_soon(
        ErrorCode::SessionMoving,
        format!("session '{id}' is moving to another replica; retry shortly"),
    )
}

fn unavailable(peer: &Peer, why: &str) -> Response {
    retry_soon(
        ErrorCode::ReplicaUnavailable,
        format!(
            "the replica that holds the session ({}) {why}; retry shortly",
            peer.id
        ),
    )
}

/// The URL of `target` (a path and query) at `peer`.
fn peer_uri(peer: &Peer, target: &str) -> Option<Uri> {
    format!("{}{target}", peer.url.trim_end_matches('/'))
        .parse()
        .ok()
}

/// The client address the server recorded for a request.
fn client_ip(extensions: &http::Extensions) -> Option<String> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(client)| client.ip().to_canonical().to_string())
}

/// The `X-Forwarded-*` a request to a peer carries: the client's address
/// appended to those before it; the protocol and host the client used,
/// unless a proxy in front already said.
fn set_forwarded(headers: &mut http::HeaderMap, client: Option<String>, host: Option<HeaderValue>) {
    let prior = joined(headers, &X_FORWARDED_FOR);
    let forwarded_for = match (prior, client) {
        (Some(prior), Some(client)) => Some(format!("{prior}, {client}")),
        (prior, client) => prior.or(client),
    };
    if let Some(value) = forwarded_for.and_then(|v| HeaderValue::from_str(&v).ok()) {
        headers.insert(X_FORWARDED_FOR, value);
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if !headers.contains_key(&X_FORWARDED_HOST)
        && let Some(host) = host
    {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

fn peer_token_value(peers: &Peers) -> Option<HeaderValue> {
    HeaderValue::from_str(peers.replicas.peer_token().as_str()).ok()
}

/// What a forwarded request is, for how an upgrade is relayed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Relay {
    /// The runner's own API: its WebSockets are relayed message by message
    /// ([`super::peer_socket`]), so they end with a close frame.
    Api,
    /// A session's app through the edge: whatever protocol it upgrades
    /// to passes as bytes.
    SessionHost,
}

/// Forwards `request` to `peer` and returns its answer, streamed; an
/// upgrade is relayed both ways.
async fn forward(peers: &Peers, peer: &Peer, mut request: Request, relay: Relay) -> Response {
    if check_framing(request.headers_mut()).is_err() || request.method() == Method::CONNECT {
        return ApiError::new(
            ErrorCode::InvalidRequest,
            "the request's framing is ambiguous",
        )
        .into_response();
    }
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |target| target.as_str())
        .to_owned();
    let Some(uri) = peer_uri(peer, &target) else {
        peers.metrics.peer_forward("unavailable");
        warn!(peer = %peer.id, url = %peer.url, "a peer's URL is not one a request can be sent to");
        return unavailable(peer, "has no usable address");
    };
    let Some(token) = peer_token_value(peers) else {
        return ApiError::new(
            ErrorCode::InternalError,
            "the peer token is not a header value",
        )
        .into_response();
    };
    let upgrade = upgrade_protocol(request.headers());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let client = client_ip(request.extensions());

    let (mut parts, body) = request.into_parts();
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    parts.extensions = http::Extensions::new();
    let headers = &mut parts.headers;
    let prior_via = joined(headers, &header::VIA);
    strip_hop_by_hop(headers);
    if let Some(protocol) = &upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol.clone());
    }
    let host = headers.get(header::HOST).cloned();
    set_forwarded(headers, client, host);
    let via = match prior_via {
        Some(prior) => format!("{prior}, {VIA}"),
        None => VIA.to_owned(),
    };
    if let Ok(value) = HeaderValue::from_str(&via) {
        headers.insert(header::VIA, value);
    }
    headers.insert(HeaderName::from_static(PEER_TOKEN_HEADER), token);

    let (body, sent_rx) = RequestBody::new(body);
    let sending = peers.client.request(http::Request::from_parts(parts, body));
    let sending = std::pin::pin!(async { sending.await.map_err(crate::edge::classify) });
    let mut response = match await_response(sending, sent_rx, RESPONSE_HEADER_TIMEOUT, None).await {
        Ok(response) => response,
        Err(refusal) => {
            peers.metrics.peer_forward("unavailable");
            warn!(peer = %peer.id, url = %peer.url, ?refusal, "could not reach the replica that holds a session");
            return unavailable(peer, "could not be reached");
        }
    };
    peers.metrics.peer_forward("forwarded");

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return unavailable(peer, "switched protocols unasked");
        };
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        let messages = relay == Relay::Api
            && upgrade
                .as_ref()
                .is_some_and(|protocol| protocol.as_bytes().eq_ignore_ascii_case(b"websocket"));
        let parts = switched_head(response.into_parts().0, upgrade);
        let leaving = peers.going_away.clone();
        peers.tasks.spawn(peers.sockets.track_future(async move {
            match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok((client, upstream)) if messages => {
                    super::peer_socket::relay(
                        TokioIo::new(client),
                        TokioIo::new(upstream),
                        leaving,
                    )
                    .await;
                }
                Ok((client, upstream)) => {
                    splice(TokioIo::new(client), TokioIo::new(upstream)).await;
                }
                Err(err) => debug!(error = %err, "an upgrade through a peer did not complete"),
            }
        }));
        return Response::from_parts(parts, Body::empty());
    }

    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::HTTP_11;
    parts.extensions = http::Extensions::new();
    Response::from_parts(parts, Body::new(body))
}

/// `GET /v1/sessions` from a client: this replica's list and every live
/// peer's, merged.
async fn merged_list(peers: &Peers, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    let client = client_ip(request.extensions());
    let host = request.headers().get(header::HOST).cloned();
    let target = request
        .uri()
        .path_and_query()
        .map_or("/v1/sessions", |target| target.as_str())
        .to_owned();
    let live = peers.replicas.peers();
    let fetches = join_all(live.iter().map(|peer| {
        let request = list_request(peers, peer, &target, authorization.clone(), client.clone(), host.clone());
        async move {
            let Some(request) = request else {
                warn!(peer = %peer.id, url = %peer.url, "a peer's URL is not one a request can be sent to");
                return None;
            };
            match tokio::time::timeout(LIST_TIMEOUT, fetch_list(peers, request)).await {
                Ok(Ok(sessions)) => Some((peer.id.clone(), sessions)),
                Ok(Err(why)) => {
                    warn!(peer = %peer.id, why, "a peer's session list is left out");
                    None
                }
                Err(_) => {
                    warn!(peer = %peer.id, "a peer's session list is left out: it took too long");
                    None
                }
            }
        }
    }));
    let (local, fetched) = tokio::join!(next.run(request), fetches);
    if local.status() != StatusCode::OK {
        return local;
    }
    let (parts, body) = local.into_parts();
    let Ok(bytes) = body.collect().await.map(|body| body.to_bytes()) else {
        return ApiError::new(
            ErrorCode::InternalError,
            "the session list could not be read",
        )
        .into_response();
    };
    let Some(own) = sessions_of(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let mut lists = vec![(peers.replicas.replica_id().to_owned(), own)];
    lists.extend(fetched.into_iter().flatten());
    let merged = merge(lists, |id| match peers.replicas.owner(id) {
        Owner::Here | Owner::Recorded => Some(peers.replicas.replica_id().to_owned()),
        Owner::Peer(peer) => Some(peer.id),
        Owner::Moving { .. } => None,
    });
    (parts.status, axum::Json(json!({ "sessions": merged }))).into_response()
}

fn list_request(
    peers: &Peers,
    peer: &Peer,
    target: &str,
    authorization: Option<HeaderValue>,
    client: Option<String>,
    host: Option<HeaderValue>,
) -> Option<http::Request<RequestBody<Body>>> {
    let uri = peer_uri(peer, target)?;
    let mut request = http::Request::get(uri)
        .body(RequestBody::new(Body::empty()).0)
        .ok()?;
    let headers = request.headers_mut();
    if let Some(authorization) = authorization {
        headers.insert(header::AUTHORIZATION, authorization);
    }
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    set_forwarded(headers, client, host);
    headers.insert(
        HeaderName::from_static(PEER_TOKEN_HEADER),
        peer_token_value(peers)?,
    );
    Some(request)
}

async fn fetch_list(
    peers: &Peers,
    request: http::Request<RequestBody<Body>>,
) -> Result<Vec<Value>, String> {
    let response = peers
        .client
        .request(request)
        .await
        .map_err(|err| format!("unreachable: {err}"))?;
    if response.status() != StatusCode::OK {
        return Err(format!("answered {}", response.status()));
    }
    let bytes = Limited::new(response.into_body(), MAX_LIST_BYTES)
        .collect()
        .await
        .map_err(|err| format!("the body could not be read: {err}"))?
        .to_bytes();
    sessions_of(&bytes).ok_or_else(|| "the body is not a session list".to_owned())
}

/// The `sessions` of a list body.
fn sessions_of(bytes: &[u8]) -> Option<Vec<Value>> {
    match serde_json::from_slice::<Value>(bytes).ok()? {
        Value::Object(mut body) => match body.remove("sessions")? {
            Value::Array(sessions) => Some(sessions),
            _ => None,
        },
        _ => None,
    }
}

/// One list of `lists` (each the replica that answered it and its
/// sessions), each session once: the copy of the replica `owner_of` names,
/// else the first.
fn merge(
    lists: Vec<(String, Vec<Value>)>,
    owner_of: impl Fn(&str) -> Option<String>,
) -> Vec<Value> {
    let mut merged: Vec<Value> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (replica, sessions) in lists {
        for session in sessions {
            let Some(id) = session["sessionId"].as_str().map(str::to_owned) else {
                merged.push(session);
                continue;
            };
            match index.get(&id) {
                None => {
                    index.insert(id, merged.len());
                    merged.push(session);
                }
                Some(&at) => {
                    if owner_of(&id).as_deref() == Some(replica.as_str()) {
                        merged[at] = session;
                    }
                }
            }
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_sorted_by_what_they_are_for() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(target(&get, "/v1/sessions"), Target::List);
        assert_eq!(target(&post, "/v1/sessions"), Target::Create);
        assert_eq!(target(&post, "/v1/apps/demo/sessions"), Target::Create);
        assert_eq!(target(&get, "/v1/apps/demo/sessions"), Target::Other);
        assert_eq!(target(&get, "/v1/sessions/abc"), Target::Session("abc"));
        assert_eq!(
            target(&Method::DELETE, "/v1/sessions/abc/links/l1"),
            Target::Session("abc")
        );
        assert_eq!(target(&get, "/v1/sessions/abc/io"), Target::Session("abc"));
        assert_eq!(
            target(&get, "/internal/sessions/abc/access"),
            Target::Session("abc")
        );
        assert_eq!(target(&get, "/internal/sessions/abc/other"), Target::Other);
        assert_eq!(target(&get, "/v1/sessions/"), Target::Other);
        assert_eq!(target(&get, "/v1/health"), Target::Other);
        assert_eq!(target(&get, "/internal/bundles/x"), Target::Other);
    }

    #[test]
    fn the_owners_copy_of_a_listed_session_wins() {
        let session = |id: &str, by: &str| json!({"sessionId": id, "replica": by});
        let lists = vec![
            ("a".to_owned(), vec![session("s1", "a"), session("s2", "a")]),
            ("b".to_owned(), vec![session("s2", "b"), session("s3", "b")]),
            ("c".to_owned(), vec![session("s3", "c")]),
        ];
        let merged = merge(lists, |id| match id {
            "s2" => Some("b".to_owned()),
            _ => None,
        });
        assert_eq!(
            merged,
            [session("s1", "a"), session("s2", "b"), session("s3", "b")]
        );
    }

    #[test]
    fn the_forwarded_client_is_the_last_address() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(forwarded_client(&headers), None);
        headers.insert(
            X_FORWARDED_FOR,
            HeaderValue::from_static("203.0.113.9, 10.0.0.7"),
        );
        assert_eq!(
            forwarded_client(&headers),
            Some("10.0.0.7".parse().expect("ip"))
        );
    }
}
