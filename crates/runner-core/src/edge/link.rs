//! The upstream connections of one client connection: HTTP/1.1 connections
//! to the sessions' apps that are polled by the client connection's own
//! task ([`Linked`]), so that a request, its response and the response's
//! body never cross to another task. A client's requests come one after
//! another on its connection, so it needs one upstream connection per app
//! it talks to; they are kept alive between its requests and closed with
//! it, or once idle for the edge's idle timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::body::RequestBody;
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
        }
        state
            .driving
            .retain_mut(|connection| connection.as_mut().poll(cx).is_pending());
        if let Some(expiry) = state.expiry.as_mut()
            && expiry.as_mut().poll(cx).is_ready()
        {
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

/// The waker the client connection and its upstream connections are
/// polled with. A wake while [`Linked`] is polling them (one of them
/// handing a request, a response or a body chunk to another) only asks
/// for one more pass: going through the scheduler for it would put the
/// task back on the run queue and wake an idle worker to steal it. Any
/// other wake (a socket's readiness, a timer, another task) wakes the
/// task.
struct PassWaker {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for PassWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// A client connection, with the upstream connections of its [`EdgeLink`]
/// polled on the same task. It ends when the client connection ends, and
/// the upstream connections are closed then.
pub struct Linked<F> {
    downstream: Pin<Box<F>>,
    link: Option<(EdgeLink, Arc<PassWaker>, Waker)>,
}

impl<F: Future> Linked<F> {
    pub fn new(downstream: F, link: Option<EdgeLink>) -> Self {
        Self {
            downstream: Box::pin(downstream),
            link: link.map(|link| {
                let passes = Arc::new(PassWaker {
                    task: AtomicWaker::new(),
                    polling: AtomicBool::new(false),
                    woken: AtomicBool::new(false),
                });
                let waker = Waker::from(passes.clone());
                (link, passes, waker)
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
        let Some((link, passes, waker)) = &this.link else {
            return this.downstream.as_mut().poll(cx);
        };
        passes.task.register(cx.waker());
        passes.polling.store(true, Ordering::SeqCst);
        let mut inner = Context::from_waker(waker);
        let mut polled = Poll::Pending;
        for _ in 0..MAX_PASSES {
            passes.woken.store(false, Ordering::SeqCst);
            // The apps' answers are read first, for the client connection
            // to pass them on; then the requests it made are written.
            link.poll_upstreams(&mut inner);
            polled = this.downstream.as_mut().poll(&mut inner);
            if polled.is_ready() {
                break;
            }
            link.poll_upstreams(&mut inner);
            if !passes.woken.load(Ordering::SeqCst) {
                break;
            }
        }
        passes.polling.store(false, Ordering::SeqCst);
        if polled.is_ready() {
            if let Some((link, ..)) = this.link.take() {
                link.close();
            }
            return polled;
        }
        // Woken during the last pass (or from elsewhere while it ran).
        if passes.woken.load(Ordering::SeqCst) {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl<F> Drop for Linked<F> {
    fn drop(&mut self) {
        if let Some((link, ..)) = self.link.take() {
            link.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_while_polling_take_another_pass_not_the_scheduler() {
        let task = Arc::new(CountingWaker::default());
        let waker = Waker::from(task.clone());
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
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
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
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert_eq!(linked.downstream.polls, MAX_PASSES);
    }

    #[test]
    fn without_a_link_the_connection_is_polled_as_it_is() {
        let task = Arc::new(CountingWaker::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let mut linked = Linked::new(
            SelfWaking {
                polls: 0,
                passes: 1,
            },
            None,
        );
        assert!(Pin::new(&mut linked).poll(&mut cx).is_pending());
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert_eq!(Pin::new(&mut linked).poll(&mut cx), Poll::Ready(2));
    }
}
