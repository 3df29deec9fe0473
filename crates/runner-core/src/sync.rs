//! The runner's rule for its mutexes, in one place.
//!
//! Every `std::sync::Mutex` in the runner guards plain data that each holder
//! leaves whole before it can panic: a map, a list replaced in one step, a
//! counter. A panic on another task while it held the lock therefore leaves
//! nothing half-written, and refusing the data from then on (poisoning) would
//! only turn one failed task into a runner that fails everything. So a
//! poisoned lock is taken as it is.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking the data of a poisoned one as it is.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_still_gives_its_data() {
        let mutex = std::sync::Arc::new(Mutex::new(vec![1]));
        let held = mutex.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.lock().unwrap_or_else(PoisonError::into_inner);
            panic!("a holder panics");
        })
        .join();
        assert!(mutex.is_poisoned());
        lock(&mutex).push(2);
        assert_eq!(*lock(&mutex), vec![1, 2]);
    }
}
