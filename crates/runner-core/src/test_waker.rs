//! A task waker for the unit tests of hand-written futures: it only counts
//! how often it was woken.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

#[derive(Default)]
pub(crate) struct CountingWaker(AtomicUsize);

impl CountingWaker {
    /// A new counter and a waker that counts into it.
    pub(crate) fn waker() -> (Arc<Self>, Waker) {
        let counting = Arc::new(Self::default());
        (counting.clone(), Waker::from(counting))
    }

    /// How often the waker was woken.
    pub(crate) fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
