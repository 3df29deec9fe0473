//! The forwarder: HTTP/1.1 to the sessions' apps, over a kept client
//! connection's own upstream connections ([`super::link`]) or else one
//! pooled client; bodies streamed both ways, upgrades spliced, and a bound
//! on what one session may hold open.

use std::error::Error as _;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt as _;
use tokio::runtime::Handle;
use tokio::sync::{Notify, oneshot};
use tracing::debug;

use super::access::AccessPolicy;
use super::admit::{Admission, admit};
use super::body::RequestBody;
use super::connector::Connector;
use super::headers::{
    address_value, carries, check_framing, request_host, strip_hop_by_hop, switched_head,
    upgrade_protocol,
};
use super::link::{AppKey, EdgeLink};
use super::refusal::{Preference, refusal_response};
use super::resolver::EdgeResolver;
use super::{EdgeRefusal, PreviewBase, SessionHost};
use crate::ids::IdMap;
use crate::tasks::OwnedTasks;

pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static PEER_TOKEN: HeaderName = HeaderName::from_static(crate::replicas::PEER_TOKEN_HEADER);
/// What the edge adds to `Via`.
const VIA: &str = "1.1 telo-runner";
/// Idle keep-alive connections kept to one app address.
const MAX_IDLE_PER_APP: usize = 32;
/// How long [`Edge::shutdown`] waits for spliced connections to close.
const SPLICE_CLOSE: Duration = Duration::from_secs(5);

/// The edge's timeouts and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeConfig {
    /// How long a connection to a session's app may take (then 504, or 502
    /// at once when it is refused).
    pub connect_timeout: Duration,
    /// How long the app may take to answer once the request is sent (then
    /// 504).
    pub response_header_timeout: Duration,
    /// How long an idle keep-alive connection to an app is kept.
    pub idle_timeout: Duration,
    /// Requests in flight plus upgraded connections one session may hold
    /// (past it 503).
    pub max_connections_per_session: usize,
    /// How long a request to a suspended or starting session is held while
    /// it comes up and its port answers (then 503).
    pub wake_timeout: Duration,
    /// How long a browser's navigation waits for a waking session before it
    /// is answered a page that reloads itself.
    pub waking_page_after: Duration,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            response_header_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(90),
            max_connections_per_session: 256,
            wake_timeout: Duration::from_secs(30),
            waking_page_after: Duration::from_secs(2),
        }
    }
}

/// The session edge: forwards requests for session hosts to the address the
/// resolver gives. Cheap to clone; clones share the client pool, the
/// per-session counts and the spliced connections.
#[derive(Clone)]
pub struct Edge {
    inner: Arc<Inner>,
}

struct Inner {
    base: PreviewBase,
    resolver: Arc<dyn EdgeResolver>,
    config: EdgeConfig,
    policy: AccessPolicy,
    client: Client<Connector, RequestBody>,
    connector: Connector,
    slots: Arc<Slots>,
    /// The spliced upgraded connections.
    tasks: OwnedTasks,
    /// The runtime the edge was made on, where a session is woken.
    main: Option<Handle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.tasks.stop();
    }
}

impl Edge {
    pub fn new(
        base: PreviewBase,
        resolver: Arc<dyn EdgeResolver>,
        config: EdgeConfig,
        policy: AccessPolicy,
    ) -> Self {
        let connector = Connector::new(config.connect_timeout);
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.idle_timeout)
            .pool_max_idle_per_host(MAX_IDLE_PER_APP)
            .build(connector.clone());
        Self {
            inner: Arc::new(Inner {
                base,
                resolver,
                config,
                policy,
                client,
                connector,
                slots: Arc::new(Slots::default()),
                tasks: OwnedTasks::new(),
                main: Handle::try_current().ok(),
            }),
        }
    }

    pub fn base(&self) -> &PreviewBase {
        &self.inner.base
    }

    pub fn config(&self) -> &EdgeConfig {
        &self.inner.config
    }

    /// Requests in flight plus upgraded connections of `session_id`.
    pub fn connections(&self, session_id: &str) -> usize {
        self.inner.slots.count(session_id)
    }

    /// Returns once `session_id` holds no request or connection through the
    /// edge.
    pub async fn until_idle(&self, session_id: &str) {
        let _watching = Watching::new(&self.inner.slots);
        loop {
            let released = self.inner.slots.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if self.inner.slots.count(session_id) == 0 {
                return;
            }
            released.await;
        }
    }

    /// Closes every spliced connection and waits for them (at most a few
    /// seconds). Requests in flight end with their client connections.
    pub async fn shutdown(&self) {
        self.inner.tasks.shutdown(SPLICE_CLOSE).await;
    }

    /// Whether this runner serves `host`'s session itself (not another
    /// replica).
    pub fn serves_here(&self, host: &SessionHost) -> bool {
        self.inner.resolver.serves_here(host)
    }

    /// Forwards `request` (already known to be for `host`) from the client
    /// at `client` (`tls`: whether its connection is TLS) and returns the
    /// app's response, streamed; or the page of an [`EdgeRefusal`].
    ///
    /// `client` is the connection's peer: its address is appended to the
    /// request's `X-Forwarded-For`. The connection must be served with
    /// upgrades on (`with_upgrades`) for WebSockets to pass.
    pub async fn forward(
        &self,
        host: SessionHost,
        request: Request<Incoming>,
        client: SocketAddr,
        tls: bool,
    ) -> Response<Body> {
        self.forward_on(None, host, request, client, tls).await
    }

    /// The upstream connections of one client connection, to be polled
    /// with it ([`super::Linked`]).
    pub fn link(&self) -> EdgeLink {
        EdgeLink::new(self.inner.config.idle_timeout)
    }

    /// [`Self::forward`] on the client connection that `link` is of: the
    /// request goes over one of its own upstream connections (an upgrade
    /// over the pooled client), so that the exchange stays on that
    /// connection's task. Without a link, the pooled client.
    pub async fn forward_on(
        &self,
        link: Option<&EdgeLink>,
        host: SessionHost,
        request: Request<Incoming>,
        client: SocketAddr,
        tls: bool,
    ) -> Response<Body> {
        let preference = Preference::of(request.headers());
        match self
            .try_forward(link, &host, request, client, tls, &preference)
            .await
        {
            Ok(response) => response,
            Err(refusal) => {
                debug!(session = %host.session_id, port = host.port, ?refusal, "edge refused a request");
                refusal_response(&refusal, preference.html(), Some(&host))
            }
        }
    }

    /// The resolver's answer once it has one (a session woken, or found
    /// started), waited for on the runtime the edge was made on: a wake
    /// starts the session's processes and tasks, which belong there and
    /// not on the connection thread the request came in on. Given up with
    /// the request, as the resolver's own future would be.
    async fn resolve_on_main(&self, host: &SessionHost) -> Result<super::Upstream, EdgeRefusal> {
        let Some(main) = &self.inner.main else {
            return self.inner.resolver.resolve(host).await;
        };
        let resolver = self.inner.resolver.clone();
        let host = host.clone();
        crate::tasks::run_on(main, async move { resolver.resolve(&host).await })
            .await
            // The runtime is shutting down: a retry finds the runner that
            // takes over.
            .unwrap_or(Err(EdgeRefusal::Starting))
    }

    /// Sends `request` to `upstream` over one of `link`'s connections: an
    /// idle one to the same app, or a new one. A request that an idle
    /// connection closed before taking is sent again on another.
    async fn send_on(
        &self,
        link: &EdgeLink,
        upstream: &super::Upstream,
        mut request: Request<RequestBody>,
    ) -> Result<Response<Incoming>, EdgeRefusal> {
        let key = AppKey::of(&upstream.reach, upstream.port);
        while let Some(mut sender) = link.take(key) {
            match sender.try_send_request(request).await {
                Ok(response) => {
                    link.put(key, sender);
                    return Ok(response);
                }
                Err(mut err) => match err.take_message() {
                    Some(unsent) => request = unsent,
                    None => {
                        debug!(error = %err.error(), "the exchange with a session's app failed");
                        return Err(EdgeRefusal::UpstreamFailed);
                    }
                },
            }
        }
        // Dialing is once per client connection and app: boxed, its state
        // does not weigh on every request's.
        let mut sender = Box::pin(self.dial_for(link, upstream)).await?;
        match sender.send_request(request).await {
            Ok(response) => {
                link.put(key, sender);
                Ok(response)
            }
            Err(err) => {
                debug!(error = %err, "the exchange with a session's app failed");
                Err(EdgeRefusal::UpstreamFailed)
            }
        }
    }

    /// A new connection of `link` to `upstream`.
    async fn dial_for(
        &self,
        link: &EdgeLink,
        upstream: &super::Upstream,
    ) -> Result<SendRequest<RequestBody>, EdgeRefusal> {
        let connecting = upstream.reach.connect(upstream.port);
        let stream = match tokio::time::timeout(self.inner.config.connect_timeout, connecting).await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => return Err(classify_connect(&err)),
            Err(_) => return Err(EdgeRefusal::Timeout),
        };
        link.open(TokioIo::new(stream)).await.map_err(|err| {
            debug!(error = %err, "the handshake with a session's app failed");
            EdgeRefusal::UpstreamFailed
        })
    }

    async fn try_forward(
        &self,
        link: Option<&EdgeLink>,
        host: &SessionHost,
        mut request: Request<Incoming>,
        client: SocketAddr,
        tls: bool,
        preference: &Preference,
    ) -> Result<Response<Body>, EdgeRefusal> {
        check_framing(request.headers_mut())?;
        if request.method() == Method::CONNECT {
            return Err(EdgeRefusal::BadRequest("CONNECT is not forwarded"));
        }
        // Asked before anything else of the session: a request without
        // access wakes nothing and holds no slot.
        let upgrade = upgrade_protocol(request.headers());
        let upgrading = upgrade.is_some();
        match admit(
            &self.inner.policy,
            &*self.inner.resolver,
            host,
            self.inner.base.scheme(),
            &mut request,
            upgrading,
        )? {
            Admission::Answer(response) => return Ok(response),
            Admission::Forward => {}
        }
        // Origin-form, as a connection of the link takes it (`None`: the
        // request's own already is).
        let origin = match request.uri().path_and_query() {
            Some(target) if target.as_str().starts_with('/') => {
                if request.uri().scheme().is_none() && request.uri().authority().is_none() {
                    None
                } else {
                    Some(Uri::from(target.clone()))
                }
            }
            Some(_) => return Err(EdgeRefusal::BadRequest("a target of * is not forwarded")),
            None => Some(Uri::from_static("/")),
        };
        let guard = Slots::acquire(
            &self.inner.slots,
            &host.session_id,
            self.inner.config.max_connections_per_session,
        )
        .ok_or(EdgeRefusal::TooManyConnections)?;
        let (upstream, hold) = match self.inner.resolver.resolve_now(host) {
            Some(resolved) => resolved?,
            None => {
                let navigation = request.method() == Method::GET && !upgrading && preference.html();
                let resolving = self.resolve_on_main(host);
                let upstream = if navigation {
                    // The wake goes on without this request; the page's
                    // reload waits on it again.
                    tokio::time::timeout(self.inner.config.waking_page_after, resolving)
                        .await
                        .map_err(|_| EdgeRefusal::Waking)??
                } else {
                    resolving.await?
                };
                (upstream, self.inner.resolver.hold(host))
            }
        };
        // An upgrade goes through the pooled client, which hands over the
        // upgraded connection for the splice.
        let link = link.filter(|link| link.reused() && !upgrading);
        let uri = match link {
            Some(_) => origin,
            None => {
                let authority = self
                    .inner
                    .connector
                    .authority(&upstream.reach, upstream.port);
                let target = request.uri().path_and_query().map_or("/", |t| t.as_str());
                Some(
                    format!("http://{authority}{target}")
                        .parse::<Uri>()
                        .map_err(|_| {
                            EdgeRefusal::BadRequest("the request target is not a valid path")
                        })?,
                )
            }
        };
        // The client's own value where it is one (a shared slice of what
        // the connection read); rebuilt only from an absolute-form target.
        let absolute = request.uri().authority().is_some();
        let original_host = if absolute {
            request_host(&request).and_then(|h| HeaderValue::from_str(&h).ok())
        } else {
            request
                .headers()
                .get(header::HOST)
                .filter(|value| value.to_str().is_ok())
                .cloned()
        };
        let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut request));

        let (mut parts, body) = request.into_parts();
        if let Some(uri) = uri {
            parts.uri = uri;
        }
        parts.version = Version::HTTP_11;
        // The client connection's own (its address, its upgrade) stay here.
        parts.extensions = http::Extensions::new();
        let headers = &mut parts.headers;
        let prior_forwarded_for = joined(headers, &X_FORWARDED_FOR);
        let prior_via = joined(headers, &header::VIA);
        strip_hop_by_hop(headers);
        // A peer replica's secret, on a request it forwarded here, is the
        // installation's, never the app's.
        if carries(headers, &PEER_TOKEN) {
            headers.remove(&PEER_TOKEN);
        }
        if let Some(protocol) = &upgrade {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol.clone());
        }
        // The edge's own headers, made room for at once.
        headers.reserve(4);
        if let Some(original) = original_host {
            // An origin-form request's one `Host` already is this value;
            // an absolute target's, or repeated ones, are replaced by it.
            if absolute || headers.len() != headers.keys_len() {
                headers.insert(header::HOST, original.clone());
            }
            headers.insert(X_FORWARDED_HOST, original);
        }
        let client_ip = client.ip().to_canonical();
        let forwarded_for = match (prior_forwarded_for, link) {
            (Some(prior), _) => HeaderValue::from_str(&format!("{prior}, {client_ip}")).ok(),
            (None, Some(link)) => link.address_value(client_ip),
            (None, None) => address_value(client_ip),
        };
        if let Some(value) = forwarded_for {
            headers.insert(X_FORWARDED_FOR, value);
        }
        headers.insert(
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if tls { "https" } else { "http" }),
        );
        let via = match prior_via {
            Some(prior) => HeaderValue::from_str(&format!("{prior}, {VIA}")).ok(),
            None => Some(HeaderValue::from_static(VIA)),
        };
        if let Some(value) = via {
            headers.insert(header::VIA, value);
        }

        let (body, sent_rx) = RequestBody::new(body);
        let request = Request::from_parts(parts, body);
        let timeout = self.inner.config.response_header_timeout;
        let mut response = match link {
            Some(link) => {
                let sending = pin!(self.send_on(link, &upstream, request));
                await_response(sending, sent_rx, timeout, Some(link)).await?
            }
            None => {
                let sending = self.inner.client.request(request);
                let sending = pin!(async { sending.await.map_err(classify) });
                await_response(sending, sent_rx, timeout, None).await?
            }
        };

        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_upgrade) = client_upgrade else {
                return Err(EdgeRefusal::UpstreamFailed);
            };
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            let parts = switched_head(response.into_parts().0, upgrade);
            self.inner.tasks.spawn(async move {
                let _guard = guard;
                let _hold = hold;
                match tokio::try_join!(client_upgrade, upstream_upgrade) {
                    Ok((client, upstream)) => {
                        splice(TokioIo::new(client), TokioIo::new(upstream)).await
                    }
                    Err(err) => {
                        debug!(error = %err, "an upgrade through the edge did not complete")
                    }
                }
            });
            return Ok(Response::from_parts(parts, Body::empty()));
        }

        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts.version = Version::HTTP_11;
        parts.extensions = http::Extensions::new();
        let body = Guarded {
            inner: body,
            _hold: hold,
            _guard: guard,
        };
        Ok(Response::from_parts(parts, Body::new(body)))
    }
}

/// Every value of `name`, joined with `, `, or `None` when there is none.
pub(crate) fn joined(headers: &http::HeaderMap, name: &HeaderName) -> Option<String> {
    if !carries(headers, name) {
        return None;
    }
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// Waits for the app's response header: without a limit while the request
/// body is still being sent (an upload takes as long as it takes), then at
/// most `timeout`.
/// The wait is timed by `link`'s timer when there is one. `sending` is
/// pinned where the caller keeps it (one copy of its state, not two).
pub(crate) async fn await_response<F>(
    mut sending: Pin<&mut F>,
    sent: Option<oneshot::Receiver<()>>,
    timeout: Duration,
    link: Option<&EdgeLink>,
) -> Result<Response<Incoming>, EdgeRefusal>
where
    F: Future<Output = Result<Response<Incoming>, EdgeRefusal>>,
{
    if let Some(sent) = sent {
        tokio::select! {
            result = &mut sending => return result,
            _ = sent => {}
        }
    }
    let answered = match link {
        Some(link) => link.within(timeout, sending).await,
        None => tokio::time::timeout(timeout, sending).await.ok(),
    };
    answered.unwrap_or(Err(EdgeRefusal::Timeout))
}

/// What a failed connection to an app means to its client.
fn classify_connect(err: &io::Error) -> EdgeRefusal {
    if err.kind() == io::ErrorKind::TimedOut {
        EdgeRefusal::Timeout
    } else {
        EdgeRefusal::NotListening
    }
}

/// What a failed exchange with an app means to its client.
pub(crate) fn classify(err: hyper_util::client::legacy::Error) -> EdgeRefusal {
    if !err.is_connect() {
        debug!(error = ?err, "the exchange with a session's app failed");
        return EdgeRefusal::UpstreamFailed;
    }
    let mut source = err.source();
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::TimedOut
        {
            return EdgeRefusal::Timeout;
        }
        source = cause.source();
    }
    EdgeRefusal::NotListening
}

/// Copies both ways until either side ends, then closes both.
pub(crate) async fn splice<A, B>(client: A, upstream: B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
    let up = async {
        let _ = tokio::io::copy(&mut client_read, &mut upstream_write).await;
        let _ = upstream_write.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut upstream_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Past this many sessions counted, those holding nothing are forgotten.
const SLOTS_PRUNE_PAST: usize = 64;

/// The count of each session's requests in flight and upgraded connections.
/// A session's counter stays while the session is in use; a guard gives
/// its slot back without taking the table's lock.
#[derive(Default)]
struct Slots {
    counts: Mutex<IdMap<Arc<AtomicUsize>>>,
    /// Fires whenever a slot is given back while someone watches.
    released: Notify,
    /// How many [`Edge::until_idle`] calls are waiting. A slot given back
    /// while none is (every request, nearly always) notifies nobody and
    /// takes no lock.
    watchers: AtomicUsize,
}

/// One [`Edge::until_idle`] call, counted while it waits.
struct Watching<'a>(&'a Slots);

impl<'a> Watching<'a> {
    fn new(slots: &'a Slots) -> Self {
        // Counted before the first look at the count: a slot given back
        // after that look sees the watcher and notifies it (both sides are
        // SeqCst, so one of them sees the other's change).
        slots.watchers.fetch_add(1, Ordering::SeqCst);
        Self(slots)
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slots {
    fn acquire(slots: &Arc<Slots>, session_id: &str, max: usize) -> Option<SlotGuard> {
        let mut counts = slots.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = match counts.get(session_id) {
            Some(count) => count.clone(),
            None => {
                if counts.len() >= SLOTS_PRUNE_PAST {
                    counts.retain(|_, count| count.load(Ordering::Acquire) > 0);
                }
                let count = Arc::new(AtomicUsize::new(0));
                counts.insert(session_id.to_owned(), count.clone());
                count
            }
        };
        // Taken under the lock: a counter is forgotten only at zero.
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < max).then_some(held + 1)
            })
            .ok()?;
        Some(SlotGuard {
            slots: slots.clone(),
            count,
        })
    }

    fn count(&self, session_id: &str) -> usize {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .get(session_id)
            .map_or(0, |count| count.load(Ordering::SeqCst))
    }
}

/// One slot of a session, given back when dropped (the response body or
/// the spliced connection has ended).
struct SlotGuard {
    slots: Arc<Slots>,
    count: Arc<AtomicUsize>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
        if self.slots.watchers.load(Ordering::SeqCst) > 0 {
            self.slots.released.notify_waiters();
        }
    }
}

/// The app's response body, holding the session's slot (and whatever keeps
/// it in use) until it ends.
struct Guarded {
    inner: Incoming,
    // Dropped before the slot: once a session's slots are all back, nothing
    // of the edge keeps it in use.
    _hold: Option<super::Hold>,
    _guard: SlotGuard,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_bound_each_session_and_come_back() {
        let slots = Arc::new(Slots::default());
        let first = Slots::acquire(&slots, "a", 2).expect("first");
        let second = Slots::acquire(&slots, "a", 2).expect("second");
        assert!(Slots::acquire(&slots, "a", 2).is_none());
        let other = Slots::acquire(&slots, "b", 2).expect("another session");
        assert_eq!(slots.count("a"), 2);
        drop(first);
        assert_eq!(slots.count("a"), 1);
        assert!(Slots::acquire(&slots, "a", 2).is_some());
        drop((second, other));
        assert_eq!(slots.count("a"), 0);
        assert_eq!(slots.count("b"), 0);
    }

    #[test]
    fn counters_of_sessions_holding_nothing_are_forgotten() {
        let slots = Arc::new(Slots::default());
        let held = Slots::acquire(&slots, "held", 1).expect("held");
        for n in 0..SLOTS_PRUNE_PAST {
            drop(Slots::acquire(&slots, &format!("s{n}"), 1).expect("a slot"));
        }
        let remembered = slots.counts.lock().expect("counts").len();
        assert!(remembered < SLOTS_PRUNE_PAST, "{remembered} counters kept");
        assert_eq!(slots.count("held"), 1);
        assert!(Slots::acquire(&slots, "held", 1).is_none());
        drop(held);
        assert!(Slots::acquire(&slots, "held", 1).is_some());
    }
}
