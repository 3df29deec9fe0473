//! The debug stream under `--watch`: frames are published while the process
//! runs (one set per generation), so `/events` subscribers get every frame
//! published so far and then each new one as it is published.
//!
//! Every subscriber replays from the start of the process (the boot log frame
//! first), as a reconnecting relay expects; the frames are few and small.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::debug_frames::{BOOT_LOG_LINE, event_frame, frame_timestamp, log_frame};
use crate::script::DebugEvent;

/// Every frame published so far, and how far each subscriber has written.
pub struct Hub {
    state: Mutex<HubState>,
    /// Signalled on a new frame and on a subscriber's progress.
    changed: Condvar,
}

struct HubState {
    frames: Vec<String>,
    /// Subscriber id -> how many frames it has written to its connection.
    written: HashMap<u64, usize>,
    next_id: u64,
}

impl Hub {
    pub fn new() -> Self {
        let timestamp = frame_timestamp(OffsetDateTime::now_utc());
        Hub {
            state: Mutex::new(HubState {
                frames: vec![log_frame(&timestamp, BOOT_LOG_LINE)],
                written: HashMap::new(),
                next_id: 0,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends an event frame stamped now and wakes every subscriber.
    pub fn publish(&self, event: &DebugEvent) {
        let frame = event_frame(&frame_timestamp(OffsetDateTime::now_utc()), event);
        self.lock().frames.push(frame);
        self.changed.notify_all();
    }

    /// Waits (at most `timeout`) until every connected subscriber has written
    /// every published frame, so frames published just before the process
    /// exits reach the relay instead of dying with it.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            let total = state.frames.len();
            if state.written.values().all(|&written| written >= total) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    pub fn subscribe(&self) -> u64 {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.written.insert(id, 0);
        id
    }

    pub fn unsubscribe(&self, id: u64) {
        self.lock().written.remove(&id);
        self.changed.notify_all();
    }

    /// The frames after the first `from`, joined, and the new count; waits up
    /// to `idle` for one to be published. `None` when none came in time.
    pub fn frames_after(&self, from: usize, idle: Duration) -> Option<(String, usize)> {
        let deadline = Instant::now() + idle;
        let mut state = self.lock();
        loop {
            if state.frames.len() > from {
                return Some((state.frames[from..].concat(), state.frames.len()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Records that subscriber `id` has written its first `count` frames.
    pub fn written(&self, id: u64, count: usize) {
        if let Some(written) = self.lock().written.get_mut(&id) {
            *written = count;
        }
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscriber_gets_the_boot_log_then_each_published_event() {
        let hub = Hub::new();
        let id = hub.subscribe();
        let (first, count) = hub.frames_after(0, Duration::ZERO).unwrap();
        assert_eq!(count, 1);
        assert!(first.contains(BOOT_LOG_LINE), "{first}");
        assert_eq!(hub.frames_after(count, Duration::ZERO), None);
        hub.publish(&"Kernel.Starting".into());
        let (next, count) = hub.frames_after(count, Duration::ZERO).unwrap();
        assert_eq!(count, 2);
        assert!(next.contains("\"event\":\"Kernel.Starting\""), "{next}");
        hub.written(id, count);
        hub.flush(Duration::ZERO);
    }
}
