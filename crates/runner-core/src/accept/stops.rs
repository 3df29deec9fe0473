//! What ends a connection from outside: being shed for a newer one, or the
//! service closing. Both are pending for nearly every connection's whole
//! life, so they are looked at only once one of them has fired, not on each
//! of the connection's wake-ups (two or more per request): polling two
//! cancellation futures was a lock and a few hundred instructions on every
//! request a kept-alive connection carried.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Why a connection is to end before its client ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// Shed at the connection limit for a newer connection.
    Shed,
    /// The service is closing: finish the request in flight.
    Closing,
}

/// Set by either signal; wakes the connection's task.
struct Fired {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Fired {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::SeqCst);
        self.task.wake();
    }
}

/// A connection's two stop signals, polled only after they woke its task.
pub(super) struct Stops {
    shed: Pin<Box<WaitForCancellationFutureOwned>>,
    closing: Pin<Box<WaitForCancellationFutureOwned>>,
    fired: Arc<Fired>,
    /// Wakes `fired`: the waker the signals are polled with.
    waker: Waker,
    /// The task waker `fired` wakes.
    task: Option<Waker>,
}

impl Stops {
    pub(super) fn new(shed: CancellationToken, closing: CancellationToken) -> Self {
        let fired = Arc::new(Fired {
            fired: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        Self {
            shed: Box::pin(shed.cancelled_owned()),
            closing: Box::pin(closing.cancelled_owned()),
            waker: Waker::from(fired.clone()),
            fired,
            task: None,
        }
    }

    /// Ready once a signal fired (shedding first). The signals are polled
    /// on the first call, when the task's waker changed, and after they
    /// woke it; otherwise this is one atomic swap.
    pub(super) fn poll_stop(&mut self, cx: &mut Context<'_>) -> Poll<Stop> {
        let known = self
            .task
            .as_ref()
            .is_some_and(|task| task.will_wake(cx.waker()));
        if !known {
            self.fired.task.register(cx.waker());
            self.task = Some(cx.waker().clone());
        }
        // A signal firing after this swap sets the flag again and wakes the
        // task, which polls the signals on its next poll.
        if known && !self.fired.fired.swap(false, Ordering::SeqCst) {
            return Poll::Pending;
        }
        let mut signals = Context::from_waker(&self.waker);
        if self.shed.as_mut().poll(&mut signals).is_ready() {
            return Poll::Ready(Stop::Shed);
        }
        if self.closing.as_mut().poll(&mut signals).is_ready() {
            return Poll::Ready(Stop::Closing);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_waker::CountingWaker;

    /// Two signals that have not fired, and the connection's `Stops`.
    fn unfired() -> (CancellationToken, CancellationToken, Stops) {
        let (shed, closing) = (CancellationToken::new(), CancellationToken::new());
        let stops = Stops::new(shed.clone(), closing.clone());
        (shed, closing, stops)
    }

    #[test]
    fn nothing_fired_is_pending_and_a_later_signal_wakes_the_task() {
        let (_shed, closing, mut stops) = unfired();
        let (woken, waker) = CountingWaker::waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(stops.poll_stop(&mut cx), Poll::Pending);
        assert_eq!(stops.poll_stop(&mut cx), Poll::Pending);
        assert_eq!(woken.wakes(), 0);

        closing.cancel();
        assert_eq!(woken.wakes(), 1);
        assert_eq!(stops.poll_stop(&mut cx), Poll::Ready(Stop::Closing));
    }

    #[test]
    fn shedding_is_told_before_closing() {
        let (shed, closing, mut stops) = unfired();
        let (_, waker) = CountingWaker::waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(stops.poll_stop(&mut cx), Poll::Pending);
        closing.cancel();
        shed.cancel();
        assert_eq!(stops.poll_stop(&mut cx), Poll::Ready(Stop::Shed));
    }

    #[test]
    fn a_signal_fired_before_the_first_poll_is_seen() {
        let (shed, closing) = (CancellationToken::new(), CancellationToken::new());
        shed.cancel();
        let mut stops = Stops::new(shed, closing);
        let (_, waker) = CountingWaker::waker();
        assert_eq!(
            stops.poll_stop(&mut Context::from_waker(&waker)),
            Poll::Ready(Stop::Shed)
        );
    }

    #[test]
    fn a_new_task_waker_is_the_one_woken() {
        let (shed, _closing, mut stops) = unfired();
        let (first, first_waker) = CountingWaker::waker();
        let (second, second_waker) = CountingWaker::waker();
        assert_eq!(
            stops.poll_stop(&mut Context::from_waker(&first_waker)),
            Poll::Pending
        );
        assert_eq!(
            stops.poll_stop(&mut Context::from_waker(&second_waker)),
            Poll::Pending
        );
        shed.cancel();
        assert_eq!(first.wakes(), 0);
        assert_eq!(second.wakes(), 1);
        assert_eq!(
            stops.poll_stop(&mut Context::from_waker(&second_waker)),
            Poll::Ready(Stop::Shed)
        );
    }
}
