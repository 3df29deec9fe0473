//! The upstream connections of one client connection: HTTP/1.1 connections
//! to the sessions' apps that are polled by the client connection's own
//! task ([`Linked`]), so that a request, its response and the response's
//! body never cross to another task. A client's requests come one after
//! another on its connection, so it needs one upstream connection per app
//! it talks to; they are kept alive between its requests and closed with
//! it, or once idle for the edge's idle timeout.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use http::{HeaderValue, Request, header};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::body::RequestBody;
use super::{EdgeRefusal, PreviewBase, SessionHost};
use crate::reach::Reach;
use crate::sync::lock;

/// Idle upstream connections one client connection keeps; past it the
/// longest idle is closed.
const MAX_IDLE: usize = 4;

type Driving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An app's port as the connections to it are kept: its address or its
/// network namespace, and the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AppKey {
    Address(std::net::IpAddr, u16),
    Namespace(u64, u16),
}

impl AppKey {
    pub(super) fn of(reach: &Reach, port: u16) -> Self {
        match reach {
            Reach::Address(ip) => Self::Address(*ip, port),
            Reach::Namespace(opener) => Self::Namespace(opener.id(), port),
        }
    }
}

struct Idle {
    key: AppKey,
    sender: SendRequest<RequestBody>,
    since: Instant,
}

#[derive(Default)]
struct State {
    /// Each upstream connection's own future, polled by [`Linked`].
    driving: Vec<Driving>,
    /// Connections that answered their last request, most recent last.
    idle: Vec<Idle>,
    /// Fires when the oldest idle connection has been idle too long.
    expiry: Option<Pin<Box<Sleep>>>,
    /// Whether `expiry` has been polled since it was set: then it holds
    /// the task's waker (the same on every pass) and needs polling again
    /// only once it has fired.
    expiry_polled: bool,
    /// The task polling the connections, woken when one is added.
    waker: Option<Waker>,
    /// The client connection is gone: nothing more is kept.
    closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Whether the client connection has sent a request to an app before.
    reused: AtomicBool,
    /// The client's address as `X-Forwarded-For` gets it, made once.
    address: OnceLock<(IpAddr, Option<HeaderValue>)>,
    /// The session host the last request's `Host` named, with that value:
    /// a client sends the same `Host` on each request of a connection, and
    /// comparing it costs less than parsing it again.
    last_host: Mutex<Option<(HeaderValue, SessionHost)>>,
    /// The limit on the wait for an app's response head. The client's
    /// requests come one at a time, so one timer serves them all: moving a
    /// registered timer to a later deadline is a store, where a timer per
    /// request is registered and removed each time.
    deadline: Mutex<Option<Pin<Box<Sleep>>>>,
}

/// The upstream connections of one client connection. Cheap to clone:
/// clones share them.
#[derive(Clone)]
pub struct EdgeLink {
    shared: Arc<Shared>,
    idle_timeout: Duration,
}

impl EdgeLink {
    pub(super) fn new(idle_timeout: Duration) -> Self {
        Self {
            shared: Arc::default(),
            idle_timeout,
        }
    }

    /// Whether a request to an app came on this client connection before
    /// (this one is counted). A connection's first request goes through
    /// the pooled client: a client that sends one request per connection
    /// then reuses the pool's connections instead of opening one each
    /// time; one that keeps its connection gets its own from the second.
    pub(super) fn reused(&self) -> bool {
        self.shared.reused.swap(true, Ordering::Relaxed)
    }

    /// `ip` as a header value; the client connection's own address is made
    /// into one once (its clones share the bytes).
    pub(super) fn address_value(&self, ip: IpAddr) -> Option<HeaderValue> {
        let (known, value) = self
            .shared
            .address
            .get_or_init(|| (ip, super::headers::address_value(ip)));
        if *known == ip {
            value.clone()
        } else {
            super::headers::address_value(ip)
        }
    }

    /// What [`PreviewBase::route`] says of `request`, remembered for the
    /// `Host` value it came from (an origin-form request's, the usual
    /// kind): the next request with the same value is routed without
    /// parsing it.
    pub fn route<B>(
        &self,
        base: &PreviewBase,
        request: &Request<B>,
    ) -> Result<Option<SessionHost>, EdgeRefusal> {
        // An absolute-form target's authority wins over `Host`: not kept.
        let value = match request.uri().authority() {
            None => request.headers().get(header::HOST),
            Some(_) => None,
        };
        if let Some(value) = value
            && let Some((seen, host)) = &*lock(&self.shared.last_host)
            && seen == value
        {
            return Ok(Some(host.clone()));
        }
        let routed = base.route(request);
        if let (Some(value), Ok(Some(host))) = (value, &routed) {
            *lock(&self.shared.last_host) = Some((value.clone(), host.clone()));
        }
        routed
    }

    /// `work`'s output, or `None` once `timeout` has passed (counted from
    /// now) without it.
    pub(super) async fn within<T>(
        &self,
        timeout: Duration,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(output) = work.as_mut().poll(cx) {
                return Poll::Ready(Some(output));
            }
            let mut timer = lock(&self.shared.deadline);
            let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            // A timer set for an earlier request's deadline is left to
            // fire, and only then set again: every request moves the
            // deadline on, and setting a timer costs more than polling it.
            if timer.deadline() > deadline {
                timer.as_mut().reset(deadline);
            }
            loop {
                match timer.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) if timer.deadline() >= deadline => return Poll::Ready(None),
                    Poll::Ready(()) => timer.as_mut().reset(deadline),
                }
            }
        })
        .await
    }

    /// An idle connection to `key` that can take a request now; those that
    /// closed are dropped on the way.
    pub(super) fn take(&self, key: AppKey) -> Option<SendRequest<RequestBody>> {
        let mut state = lock(&self.shared.state);
        state.idle.retain(|idle| !idle.sender.is_closed());
        let at = state
            .idle
            .iter()
            .rposition(|idle| idle.key == key && idle.sender.is_ready())?;
        Some(state.idle.remove(at).sender)
    }

    /// Keeps `sender` for the next request to `key` (once its answer's body
    /// has been read, it is ready for one).
    pub(super) fn put(&self, key: AppKey, sender: SendRequest<RequestBody>) {
        let mut state = lock(&self.shared.state);
        if state.closed || sender.is_closed() {
            return;
        }
        if state.idle.len() >= MAX_IDLE {
            state.idle.remove(0);
        }
        let since = Instant::now();
        if state.expiry.is_none() {
            // Polled (and so armed) by the task right after the request
            // that put the connection here.
            state.expiry = Some(Box::pin(tokio::time::sleep_until(
                since + self.idle_timeout,
            )));
            state.expiry_polled = false;
        }
        state.idle.push(Idle { key, sender, since });
    }

    /// Opens an HTTP/1.1 connection over `io`, driven from here on by the
    /// client connection's task.
    pub(super) async fn open(
        &self,
        io: TokioIo<tokio::net::TcpStream>,
    ) -> hyper::Result<SendRequest<RequestBody>> {
        let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        let mut state = lock(&self.shared.state);
        if !state.closed {
            state.driving.push(Box::pin(async move {
                if let Err(err) = connection.await {
                    debug!(error = %err, "a connection to a session's app ended");
                }
            }));
            wake(&mut state);
        }
        // When closed, the connection is dropped: its request fails.
        Ok(sender)
    }

    /// Polls every upstream connection and the idle timer.
    fn poll_upstreams(&self, cx: &mut Context<'_>) {
        let mut state = lock(&self.shared.state);
        if state.closed {
            return;
        }
        if !state
            .waker
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
        {
            state.waker = Some(cx.waker().clone());
            // The timer must learn the new waker.
            state.expiry_polled = false;
        }
        state
            .driving
            .retain_mut(|connection| connection.as_mut().poll(cx).is_pending());
        let State {
            expiry,
            expiry_polled,
            ..
        } = &mut *state;
        let fired = match expiry {
            Some(expiry) if !*expiry_polled || expiry.is_elapsed() => {
                *expiry_polled = true;
                expiry.as_mut().poll(cx).is_ready()
            }
            _ => false,
        };
        if fired {
            let now = Instant::now();
            let timeout = self.idle_timeout;
            // Dropping a connection's sender closes it once it is idle.
            state.idle.retain(|idle| now < idle.since + timeout);
            match state.idle.first().map(|idle| idle.since + timeout) {
                Some(next) => {
                    if let Some(expiry) = state.expiry.as_mut() {
                        expiry.as_mut().reset(next);
                        let _ = expiry.as_mut().poll(cx);
                    }
                }
                None => state.expiry = None,
            }
            // The connections whose senders went are done now.
            state
                .driving
                .retain_mut(|connection| connection.as_mut().poll(cx).is_pending());
        }
    }

    fn close(&self) {
        let mut state = lock(&self.shared.state);
        state.closed = true;
        let driving = std::mem::take(&mut state.driving);
        let idle = std::mem::take(&mut state.idle);
        state.expiry = None;
        state.waker = None;
        drop(state);
        drop((idle, driving));
    }
}

fn wake(state: &mut State) {
    if let Some(waker) = &state.waker {
        waker.wake_by_ref();
    }
}

/// Passes of one [`Linked::poll`] over the client connection and its
/// upstream connections while they keep waking each other; past it the
/// task yields.
const MAX_PASSES: usize = 32;

/// What the wakers of a [`Linked`] task share: the task's own waker, and
/// whether the task is polling now.
struct Passes {
    task: AtomicWaker,
    polling: AtomicBool,
}

/// The waker one side of a [`Linked`] task (the client connection, or its
/// upstream connections) is polled with. A wake while the task is polling
/// (one side handing a request, a response or a body chunk to the other)
/// only asks for one more pass over the side woken: going through the
/// scheduler for it would put the task back on the run queue and wake an
/// idle worker to steal it. Any other wake (a socket's readiness, a timer,
/// another task) wakes the task, and its next poll passes over the sides
/// woken, not the others.
struct SideWaker {
    passes: Arc<Passes>,
    woken: AtomicBool,
}

impl SideWaker {
    fn take(&self) -> bool {
        self.woken.swap(false, Ordering::SeqCst)
    }
}

impl Wake for SideWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.passes.polling.load(Ordering::SeqCst) {
            self.passes.task.wake();
        }
    }
}

/// One side's waker, and the flag it sets.
struct Side {
    flag: Arc<SideWaker>,
    waker: Waker,
}

impl Side {
    fn new(passes: &Arc<Passes>) -> Self {
        let flag = Arc::new(SideWaker {
            passes: passes.clone(),
            woken: AtomicBool::new(false),
        });
        Self {
            waker: Waker::from(flag.clone()),
            flag,
        }
    }
}

/// The upstream connections a [`Linked`] task polls, and its wakers.
struct Polled {
    link: EdgeLink,
    passes: Arc<Passes>,
    downstream: Side,
    upstreams: Side,
    /// Not polled yet: both sides are.
    fresh: bool,
}

/// A client connection, with the upstream connections of its [`EdgeLink`]
/// polled on the same task. It ends when the client connection ends, and
/// the upstream connections are closed then.
pub struct Linked<F> {
    downstream: Pin<Box<F>>,
    link: Option<Polled>,
}

impl<F: Future> Linked<F> {
    pub fn new(downstream: F, link: Option<EdgeLink>) -> Self {
        Self {
            downstream: Box::pin(downstream),
            link: link.map(|link| {
                let passes = Arc::new(Passes {
                    task: AtomicWaker::new(),
                    polling: AtomicBool::new(false),
                });
                Polled {
                    link,
                    downstream: Side::new(&passes),
                    upstreams: Side::new(&passes),
                    passes,
                    fresh: true,
                }
            }),
        }
    }

    /// The client connection (for a graceful shutdown).
    pub fn downstream(&mut self) -> Pin<&mut F> {
        self.downstream.as_mut()
    }
}

impl<F: Future> Future for Linked<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let Some(polled_link) = &mut this.link else {
            return this.downstream.as_mut().poll(cx);
        };
        let Polled {
            link,
            passes,
            downstream,
            upstreams,
            fresh,
        } = polled_link;
        passes.task.register(cx.waker());
        passes.polling.store(true, Ordering::SeqCst);
        let mut down = downstream.flag.take() || *fresh;
        let mut up = upstreams.flag.take() || *fresh;
        *fresh = false;
        let mut polled = Poll::Pending;
        for _ in 0..MAX_PASSES {
            if !down && !up {
                break;
            }
            // The apps' answers are read first, for the client connection
            // to pass them on; the requests it makes are written on the
            // next pass.
            if up {
                link.poll_upstreams(&mut Context::from_waker(&upstreams.waker));
            }
            if down {
                polled = this
                    .downstream
                    .as_mut()
                    .poll(&mut Context::from_waker(&downstream.waker));
                if polled.is_ready() {
                    break;
                }
            }
            down = downstream.flag.take();
            up = upstreams.flag.take();
        }
        passes.polling.store(false, Ordering::SeqCst);
        if polled.is_ready() {
            if let Some(polled_link) = this.link.take() {
                polled_link.link.close();
            }
            return polled;
        }
        // Sides still woken after the last pass, or woken from elsewhere
        // while it ran, are polled on the task's next poll.
        if down {
            downstream.flag.woken.store(true, Ordering::SeqCst);
        }
        if up {
            upstreams.flag.woken.store(true, Ordering::SeqCst);
        }
        if downstream.flag.woken.load(Ordering::SeqCst)
            || upstreams.flag.woken.load(Ordering::SeqCst)
        {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl<F> Drop for Linked<F> {
    fn drop(&mut self) {
        if let Some(polled) = self.link.take() {
            polled.link.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_waker::CountingWaker;
    use std::sync::atomic::AtomicUsize;

    /// Wakes itself on each of its first `passes` polls, then is done.
    struct SelfWaking {
        polls: usize,
        passes: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.passes {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn wakes_while_polling_take_another_pass_not_the_scheduler() {
        let (task, waker) = CountingWaker::waker();
        let mut cx = Context::from_waker(&waker);
        let link = EdgeLink::new(Duration::from_secs(1));
        let mut linked = Linked::new(
            SelfWaking {
                polls: 0,
                passes: 5,
            },
            Some(link.clone()),
        );
        assert_eq!(Pin::new(&mut linked).poll(&mut cx), Poll::Ready(6));
        assert_eq!(task.wakes(), 0);
        // The client connection ended: nothing more is kept.
        assert!(lock(&link.shared.state).closed);

        // One that keeps waking itself has the task yield.
        let mut linked = Linked::new(
            SelfWaking {
                polls: 0,
                passes: usize::MAX,
            },
            Some(EdgeLink::new(Duration::from_secs(1))),
        );
        assert!(Pin::new(&mut linked).poll(&mut cx).is_pending());
        assert_eq!(task.wakes(), 1);
        assert_eq!(linked.downstream.polls, MAX_PASSES);
    }

    /// Counts its polls and keeps the waker of the last; never done.
    #[derive(Clone, Default)]
    struct Watching {
        polls: Arc<AtomicUsize>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Watching {
        fn polls(&self) -> usize {
            self.polls.load(Ordering::SeqCst)
        }

        fn wake(&self) {
            lock(&self.waker).take().expect("polled").wake();
        }
    }

    impl Future for Watching {
        type Output = usize;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            *lock(&self.waker) = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_has_only_the_side_woken_polled_again() {
        let (task, waker) = CountingWaker::waker();
        let mut cx = Context::from_waker(&waker);
        let link = EdgeLink::new(Duration::from_secs(1));
        let upstream = Watching::default();
        let watched = upstream.clone();
        lock(&link.shared.state).driving.push(Box::pin(async move {
            watched.await;
        }));
        let downstream = Watching::default();
        let mut linked = Linked::new(downstream.clone(), Some(link));
        assert!(Pin::new(&mut linked).poll(&mut cx).is_pending());
        assert_eq!((downstream.polls(), upstream.polls()), (1, 1));

        downstream.wake();
        assert_eq!(task.wakes(), 1);
        assert!(Pin::new(&mut linked).poll(&mut cx).is_pending());
        assert_eq!((downstream.polls(), upstream.polls()), (2, 1));

        upstream.wake();
        assert_eq!(task.wakes(), 2);
        assert!(Pin::new(&mut linked).poll(&mut cx).is_pending());
        assert_eq!((downstream.polls(), upstream.polls()), (2, 2));

        // A poll nothing of it asked for polls nothing.
        assert!(Pin::new(&mut linked).poll(&mut cx).is_pending());
        assert_eq!((downstream.polls(), upstream.polls()), (2, 2));
    }

    #[test]
    fn without_a_link_the_connection_is_polled_as_it_is() {
        let (task, waker) = CountingWaker::waker();
        let mut cx = Context::from_waker(&waker);
        let mut linked = Linked::new(
            SelfWaking {
                polls: 0,
                passes: 1,
            },
            None,
        );
        assert!(Pin::new(&mut linked).poll(&mut cx).is_pending());
        assert_eq!(task.wakes(), 1);
        assert_eq!(Pin::new(&mut linked).poll(&mut cx), Poll::Ready(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_counts_from_its_own_request_whatever_the_timer_holds() {
        let link = EdgeLink::new(Duration::from_secs(60));
        let timeout = Duration::from_secs(10);
        let began = Instant::now();
        // A first request, answered in 2 s, leaves its timer set for 10 s.
        let answered = link
            .within(timeout, tokio::time::sleep(Duration::from_secs(2)))
            .await;
        assert_eq!(answered, Some(()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // One sent at 5 s that is never answered times out at 15 s, not
        // when the first one's timer fires.
        let sent = Instant::now();
        assert_eq!(
            link.within(timeout, std::future::pending::<()>()).await,
            None
        );
        assert_eq!(sent - began, Duration::from_secs(5));
        assert_eq!(Instant::now() - sent, timeout);
        // After the timer fired, and after a pause longer than a timeout,
        // one answered in time is answered.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let answered = link
            .within(timeout, tokio::time::sleep(Duration::from_secs(9)))
            .await;
        assert_eq!(answered, Some(()));
        // A shorter timeout than the one the timer holds is kept too.
        let sent = Instant::now();
        let short = Duration::from_secs(1);
        assert_eq!(link.within(short, std::future::pending::<()>()).await, None);
        assert_eq!(Instant::now() - sent, short);
    }

    #[test]
    fn a_connection_routes_each_host_it_names_and_keeps_only_the_last() {
        let base = PreviewBase::parse("http://run.example").expect("base");
        let link = EdgeLink::new(Duration::from_secs(1));
        let get = |host: &str, target: &str| {
            Request::get(target)
                .header(header::HOST, host)
                .body(())
                .expect("request")
        };
        let first = SessionHost {
            port: 8080,
            session_id: "abcdefgh2345".to_owned(),
        };
        let routed = |request: &Request<()>| link.route(&base, request);
        // The same host twice (the second from what was kept), mixed case
        // included: a host is case-insensitive, and it is parsed again.
        let request = get("8080-abcdefgh2345.run.example", "/");
        assert_eq!(routed(&request), Ok(Some(first.clone())));
        assert_eq!(routed(&request), Ok(Some(first.clone())));
        assert_eq!(
            routed(&get("8080-ABCDEFGH2345.Run.Example", "/")),
            Ok(Some(first.clone()))
        );
        // Another host on the same connection is its own.
        assert_eq!(
            routed(&get("9000-abcdefgh2345.run.example", "/")),
            Ok(Some(SessionHost {
                port: 9000,
                session_id: "abcdefgh2345".to_owned()
            }))
        );
        // Refusals and the API's hosts are told each time, never kept.
        assert_eq!(
            routed(&get("8080-abcdefgh2345.run.example:81", "/")),
            Err(EdgeRefusal::MisdirectedHost)
        );
        assert_eq!(routed(&get("run.example", "/")), Ok(None));
        assert_eq!(
            routed(&get("8080-abcdefgh2345.run.example", "/")),
            Ok(Some(first))
        );
        // An absolute-form target names its own host, whatever `Host` was
        // seen before or says now.
        assert_eq!(
            routed(&get(
                "8080-abcdefgh2345.run.example",
                "http://7000-abcdefgh2345.run.example/x"
            )),
            Ok(Some(SessionHost {
                port: 7000,
                session_id: "abcdefgh2345".to_owned()
            }))
        );
        assert_eq!(
            routed(&get(
                "8080-abcdefgh2345.run.example",
                "http://localhost:6443/"
            )),
            Ok(None)
        );
    }
}
