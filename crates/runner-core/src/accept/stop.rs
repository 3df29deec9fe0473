//! A connection's work raced against what stops it (its shedding, the
//! service's shutdown), without polling the stop signals on every wake of
//! the connection: a kept connection's task wakes several times per
//! request, and the signals only change once.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// How [`until_stopped`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended<W, S> {
    /// The work ended on its own.
    Done(W),
    /// The stop signal fired first.
    Stopped(S),
}

/// Whether the stop signal woke the task, and the task to wake.
struct StopWaker {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for StopWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.task.wake();
    }
}

/// `work` until it ends, or until `stop` does. `stop` is polled on the
/// first poll and then only when it has woken the task.
pub(super) async fn until_stopped<W, S>(mut work: W, stop: S) -> Ended<W::Output, S::Output>
where
    W: Future + Unpin,
    S: Future,
{
    let flag = Arc::new(StopWaker {
        woken: AtomicBool::new(true),
        task: AtomicWaker::new(),
    });
    let stop_waker = Waker::from(flag.clone());
    let mut stop = pin!(stop);
    std::future::poll_fn(|cx| {
        flag.task.register(cx.waker());
        if flag.woken.swap(false, Ordering::SeqCst)
            && let Poll::Ready(stopped) = stop.as_mut().poll(&mut Context::from_waker(&stop_waker))
        {
            return Poll::Ready(Ended::Stopped(stopped));
        }
        Pin::new(&mut work).poll(cx).map(Ended::Done)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::sync::Notify;
    use tokio_util::sync::CancellationToken;

    /// Counts its polls; done once `done` is notified.
    struct Counted<F> {
        polls: Arc<AtomicUsize>,
        inner: Pin<Box<F>>,
    }

    impl<F: Future> Future for Counted<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            self.inner.as_mut().poll(cx)
        }
    }

    fn counted<F: Future>(inner: F) -> (Counted<F>, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = Counted {
            polls: polls.clone(),
            inner: Box::pin(inner),
        };
        (counted, polls)
    }

    #[tokio::test]
    async fn the_stop_signal_is_polled_only_when_it_woke_the_task() {
        let (ticks_tx, mut ticks_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let work = Box::pin(async move {
            let mut seen = 0;
            while ticks_rx.recv().await.is_some() {
                seen += 1;
            }
            seen
        });
        let token = CancellationToken::new();
        let (stop, stop_polls) = counted(token.clone().cancelled_owned());
        let ended = tokio::spawn(until_stopped(work, stop));
        for _ in 0..50 {
            ticks_tx.send(()).expect("the work runs");
            tokio::task::yield_now().await;
        }
        drop(ticks_tx);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(10), ended)
                .await
                .expect("ends")
                .expect("joined"),
            Ended::Done(50)
        );
        assert_eq!(stop_polls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_stop_signal_ends_work_that_would_go_on() {
        let work = Box::pin(std::future::pending::<()>());
        let notify = Arc::new(Notify::new());
        let fired = notify.clone();
        let ended = tokio::spawn(until_stopped(work, async move {
            fired.notified().await;
            "stopped"
        }));
        tokio::task::yield_now().await;
        notify.notify_one();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(10), ended)
                .await
                .expect("ends")
                .expect("joined"),
            Ended::Stopped("stopped")
        );
    }
}
