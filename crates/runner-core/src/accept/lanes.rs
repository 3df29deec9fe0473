//! The threads that serve accepted connections: one per core, each a
//! single-threaded runtime of its own. A connection is served wholly on
//! the thread it was handed to — its socket registered with that thread's
//! reactor, its requests parsed, forwarded by the edge and answered there —
//! so that a request's several wake-ups (the client's bytes, the app's
//! answer) never hop between threads or contend for a shared run queue, as
//! they did when any worker of the main runtime could steal a connection's
//! task. The API's own handlers still run on the main runtime (see
//! `on_main`).
//!
//! The accept loop hands each connection to the lane serving the fewest,
//! which admits it to the connection table (or refuses it) and serves it.
//! When the loop stops, each lane serves what it holds for
//! [`CLOSE_GRACE`](super::CLOSE_GRACE), closes the rest and ends; the
//! threads are joined before the service returns. A service dropped
//! without stopping takes its lanes' connections down at once.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use hyper::server::conn::http1;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;

use super::deadlines::Deadlines;
use super::{CLOSE_GRACE, Door};

/// An accepted connection on its way to a lane.
type Accepted = (std::net::TcpStream, SocketAddr);

/// One connection counted against its lane until it ends.
pub(super) struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Lane {
    incoming: mpsc::UnboundedSender<Accepted>,
    open: Arc<AtomicUsize>,
    /// Whether every connection ended within the grace, once the lane is
    /// done.
    done: oneshot::Receiver<bool>,
    thread: JoinHandle<()>,
}

/// The connection threads of one service.
pub(super) struct Lanes {
    lanes: Vec<Lane>,
    /// Where the search for the least busy lane starts: ties go round.
    next: usize,
    /// Cancelled when the service is dropped without finishing.
    _gone: DropGuard,
}

impl Lanes {
    /// Starts `count` lanes (at least one) serving through `door`; their
    /// connections finish their request in flight once `closing` fires.
    pub(super) fn start(
        count: usize,
        door: Arc<Door>,
        closing: CancellationToken,
    ) -> io::Result<Self> {
        let gone = CancellationToken::new();
        let mut lanes = Vec::with_capacity(count.max(1));
        for index in 0..count.max(1) {
            let (incoming, accepted) = mpsc::unbounded_channel();
            let (finished, done) = oneshot::channel();
            let open = Arc::new(AtomicUsize::new(0));
            let serve = Serve {
                door: door.clone(),
                accepted,
                open: open.clone(),
                closing: closing.clone(),
                gone: gone.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("connections-{index}"))
                .spawn(move || {
                    let all_closed = serve.run();
                    let _ = finished.send(all_closed);
                });
            match thread {
                Ok(thread) => lanes.push(Lane {
                    incoming,
                    open,
                    done,
                    thread,
                }),
                Err(err) => {
                    // The lanes started so far end with the guard.
                    gone.cancel();
                    return Err(err);
                }
            }
        }
        Ok(Self {
            lanes,
            next: 0,
            _gone: gone.drop_guard(),
        })
    }

    /// Hands `tcp` to the lane serving the fewest connections.
    pub(super) fn hand(&mut self, tcp: TcpStream, peer: SocketAddr) {
        // Registered again with the chosen lane's reactor.
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(err) => {
                warn!(error = %err, "could not hand over an accepted connection");
                return;
            }
        };
        let count = self.lanes.len();
        let start = self.next;
        self.next = (self.next + 1) % count;
        let chosen = (0..count)
            .map(|offset| (start + offset) % count)
            .min_by_key(|index| self.lanes[*index].open.load(Ordering::Relaxed))
            .unwrap_or(0);
        let lane = &self.lanes[chosen];
        lane.open.fetch_add(1, Ordering::Relaxed);
        // A lane whose thread is gone (it panicked) drops the connection;
        // its count is given back with it.
        if lane.incoming.send((tcp, peer)).is_err() {
            lane.open.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Lets every lane serve what it holds for the grace, then joins their
    /// threads; `false` when connections were still open after it.
    pub(super) async fn finish(self) -> bool {
        let Self { lanes, _gone, .. } = self;
        let mut all_closed = true;
        let mut threads = Vec::with_capacity(lanes.len());
        for lane in lanes {
            drop(lane.incoming);
            // A lane whose thread panicked sends nothing.
            all_closed &= lane.done.await.unwrap_or(false);
            threads.push(lane.thread);
        }
        // Each thread has sent its last word: joining is immediate.
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                if thread.join().is_err() {
                    warn!("a connection thread panicked");
                }
            }
        })
        .await;
        if joined.is_err() {
            warn!("could not join the connection threads");
        }
        all_closed
    }
}

/// One lane's thread.
struct Serve {
    door: Arc<Door>,
    accepted: mpsc::UnboundedReceiver<Accepted>,
    open: Arc<AtomicUsize>,
    closing: CancellationToken,
    gone: CancellationToken,
}

impl Serve {
    /// Serves connections until the accept loop is over and they have
    /// ended (or the grace has); `false` when some had to be closed.
    fn run(self) -> bool {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(err) => {
                warn!(error = %err, "could not start a connection thread's runtime");
                return false;
            }
        };
        runtime.block_on(self.serve())
    }

    async fn serve(self) -> bool {
        let deadlines = Deadlines::default();
        let http = self.door.http_on(&deadlines);
        // Kept until the thread's last connection is over.
        let keeper = tokio::spawn({
            let deadlines = deadlines.clone();
            async move { deadlines.keep().await }
        });
        let all_closed = self.serve_with(&http).await;
        keeper.abort();
        let _ = keeper.await;
        all_closed
    }

    async fn serve_with(mut self, http: &http1::Builder) -> bool {
        let mut tasks = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                accepted = self.accepted.recv() => accepted,
                () = self.gone.cancelled() => {
                    tasks.shutdown().await;
                    return false;
                }
            };
            let Some((tcp, peer)) = accepted else { break };
            while tasks.try_join_next().is_some() {}
            let open = Open(self.open.clone());
            match TcpStream::from_std(tcp) {
                Ok(tcp) => self
                    .door
                    .take(http, tcp, peer, open, &mut tasks, &self.closing),
                Err(err) => warn!(error = %err, "could not take over an accepted connection"),
            }
        }
        let finished = async { while tasks.join_next().await.is_some() {} };
        let all_closed = tokio::select! {
            finished = tokio::time::timeout(CLOSE_GRACE, finished) => finished.is_ok(),
            () = self.gone.cancelled() => false,
        };
        tasks.shutdown().await;
        all_closed
    }
}
