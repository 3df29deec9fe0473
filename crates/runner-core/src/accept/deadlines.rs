//! The header deadlines of one connection thread's connections, kept by the
//! thread itself instead of tokio's timer.
//!
//! hyper times every wait for a request head with a timer it makes when
//! the wait begins and drops when the head has arrived: with tokio's timer
//! that is a registration and a removal per request, and a write to the
//! runtime's wake-up descriptor whenever the new deadline is earlier than
//! the earliest the runtime last slept towards. The edge's response
//! deadlines are longer than the header deadline, so that was the rule: a
//! system call for a third of the requests through the edge, and a
//! wake-up of the thread's next sleep.
//!
//! Here a wait for a head is an entry in the thread's table: its deadline
//! and the connection's waker. One task per thread ([`Deadlines::keep`])
//! sleeps until the earliest deadline, never more often than every
//! [`GRANULARITY`], and wakes the connections whose deadline has passed.
//! Every head deadline is the same span from its start, so a new one is
//! later than those before it and never moves that task's sleep: waiting
//! for a head costs two uncontended locks and nothing else.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};
use slab::Slab;
use tokio::sync::Notify;

/// How close together two looks at the table may be: a deadline is kept
/// within this much (a connection is closed at most this late).
pub(super) const GRANULARITY: Duration = Duration::from_millis(250);

/// One thread's table of head deadlines.
#[derive(Clone, Default)]
pub(super) struct Deadlines {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    table: Mutex<Table>,
    /// Told when a deadline is earlier than the keeper's next look.
    earlier: Notify,
}

#[derive(Default)]
struct Table {
    entries: Slab<Entry>,
    /// When the keeper looks next; `None` while it waits for an entry.
    next_look: Option<Instant>,
}

struct Entry {
    deadline: Instant,
    waker: Waker,
    /// Woken once its deadline passed: not woken again, nor counted as
    /// the earliest deadline, while its connection gets to it.
    woken: bool,
}

fn lock(shared: &Shared) -> MutexGuard<'_, Table> {
    shared
        .table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Deadlines {
    /// Wakes each connection at its deadline, until dropped (the
    /// connection thread aborts it once its connections are over).
    pub(super) async fn keep(&self) {
        loop {
            let next_look = {
                let mut table = lock(&self.shared);
                let now = Instant::now();
                let mut earliest: Option<Instant> = None;
                for (_, entry) in table.entries.iter_mut().filter(|(_, entry)| !entry.woken) {
                    if entry.deadline <= now {
                        entry.woken = true;
                        entry.waker.wake_by_ref();
                    } else if earliest.is_none_or(|at| entry.deadline < at) {
                        earliest = Some(entry.deadline);
                    }
                }
                table.next_look = earliest.map(|at| at.max(now + GRANULARITY));
                table.next_look
            };
            match next_look {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at.into()) => {}
                        () = self.shared.earlier.notified() => {}
                    }
                }
                None => self.shared.earlier.notified().await,
            }
        }
    }

    /// How many waits for a head are in the table.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.shared).entries.len()
    }
}

impl Timer for Deadlines {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeadWait {
            deadline,
            shared: self.shared.clone(),
            entry: None,
        })
    }
}

/// One wait for a request head: in the table from its first poll until it
/// is over or dropped.
struct HeadWait {
    deadline: Instant,
    shared: Arc<Shared>,
    entry: Option<usize>,
}

impl HeadWait {
    fn leave(&mut self) {
        if let Some(key) = self.entry.take() {
            lock(&self.shared).entries.remove(key);
        }
    }
}

impl Future for HeadWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.deadline {
            this.leave();
            return Poll::Ready(());
        }
        let mut table = lock(&this.shared);
        match this.entry {
            Some(key) => {
                // A waker that would wake the same task is not replaced.
                if let Some(entry) = table.entries.get_mut(key) {
                    entry.waker.clone_from(cx.waker());
                }
                Poll::Pending
            }
            None => {
                this.entry = Some(table.entries.insert(Entry {
                    deadline: this.deadline,
                    waker: cx.waker().clone(),
                    woken: false,
                }));
                let earlier = table.next_look.is_none_or(|at| this.deadline < at);
                drop(table);
                if earlier {
                    this.shared.earlier.notify_one();
                }
                Poll::Pending
            }
        }
    }
}

impl Sleep for HeadWait {}

impl Drop for HeadWait {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long enough for any test machine to poll before it passes.
    const FAR: Duration = Duration::from_secs(3600);
    const WAIT: Duration = Duration::from_secs(10);

    /// A table with its keeper running; the keeper stops when the guard
    /// is dropped, a failed assertion included.
    fn kept() -> (Deadlines, Keeper) {
        let deadlines = Deadlines::default();
        let keeping = deadlines.clone();
        let keeper = Keeper(tokio::spawn(async move { keeping.keep().await }));
        (deadlines, keeper)
    }

    struct Keeper(tokio::task::JoinHandle<()>);

    impl Drop for Keeper {
        fn drop(&mut self) {
            self.0.abort();
        }
    }

    /// Waits until the keeper's next look is as `wanted` says.
    async fn until_next_look(
        deadlines: &Deadlines,
        wanted: impl Fn(&Option<Instant>) -> bool,
        what: &str,
    ) {
        tokio::time::timeout(WAIT, async {
            while !wanted(&lock(&deadlines.shared).next_look) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect(what);
    }

    #[tokio::test]
    async fn a_wait_ends_at_its_deadline_and_leaves_the_table() {
        let (deadlines, _keeper) = kept();
        let started = Instant::now();
        let wait = deadlines.sleep(Duration::from_millis(50));
        tokio::time::timeout(WAIT, wait)
            .await
            .expect("the wait ended");
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(deadlines.len(), 0);
    }

    #[tokio::test]
    async fn a_wait_dropped_before_its_deadline_leaves_the_table() {
        let (deadlines, _keeper) = kept();
        let mut waits: Vec<_> = (0..3).map(|_| deadlines.sleep(FAR)).collect();
        for wait in &mut waits {
            assert!(futures_util::poll!(wait.as_mut()).is_pending());
        }
        assert_eq!(deadlines.len(), 3);
        waits.remove(1);
        assert_eq!(deadlines.len(), 2);
        drop(waits);
        assert_eq!(deadlines.len(), 0);
    }

    #[tokio::test]
    async fn an_earlier_deadline_than_the_keepers_next_look_is_kept() {
        let (deadlines, _keeper) = kept();
        // The keeper first sleeps towards an hour from now.
        let mut late = deadlines.sleep(FAR);
        assert!(futures_util::poll!(late.as_mut()).is_pending());
        until_next_look(&deadlines, Option::is_some, "the keeper looked").await;
        let soon = deadlines.sleep(Duration::from_millis(20));
        tokio::time::timeout(WAIT, soon)
            .await
            .expect("the earlier wait ended");
        assert!(futures_util::poll!(late.as_mut()).is_pending());
        assert_eq!(deadlines.len(), 1);
    }

    #[tokio::test]
    async fn a_wait_past_its_deadline_is_woken_once_and_ends_when_polled() {
        let (deadlines, _keeper) = kept();
        let (woken_tx, mut woken_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut wait = deadlines.sleep(Duration::from_millis(20));
        let waker = futures_util::task::waker(Arc::new(Sender(woken_tx)));
        let mut cx = Context::from_waker(&waker);
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        tokio::time::timeout(WAIT, woken_rx.recv())
            .await
            .expect("woken at the deadline");
        // Until the connection polls it, its entry stays, marked woken,
        // and the keeper waits for new entries instead of spinning on it.
        until_next_look(
            &deadlines,
            Option::is_none,
            "the keeper went back to waiting",
        )
        .await;
        assert!(woken_rx.try_recv().is_err());
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        assert_eq!(deadlines.len(), 0);
    }

    struct Sender(tokio::sync::mpsc::UnboundedSender<()>);

    impl futures_util::task::ArcWake for Sender {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            let _ = arc_self.0.send(());
        }
    }
}
