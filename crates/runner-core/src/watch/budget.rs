//! The per-session reload budget: workspace writes and manual reloads share
//! one sliding window of a minute (docs/contract.md §7.4).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::lock;

/// The window the budget counts over.
pub const RELOAD_WINDOW: Duration = Duration::from_millis(runner_api::watch::RELOAD_WINDOW_MS);

#[derive(Debug, Default)]
pub struct ReloadBudget {
    admitted: Mutex<VecDeque<Instant>>,
}

impl ReloadBudget {
    /// Admits one more request unless `limit` were admitted within the last
    /// minute. Only admitted requests are counted, so a client hammering a
    /// limited session does not extend its own penalty.
    pub fn admit(&self, limit: usize) -> bool {
        let now = Instant::now();
        let mut admitted = lock(&self.admitted);
        while admitted
            .front()
            .is_some_and(|at| now.duration_since(*at) >= RELOAD_WINDOW)
        {
            admitted.pop_front();
        }
        if admitted.len() >= limit {
            return false;
        }
        admitted.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_window_slides_and_refusals_do_not_count() {
        let budget = ReloadBudget::default();
        assert!(budget.admit(2));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(budget.admit(2));
        assert!(!budget.admit(2));
        tokio::time::advance(Duration::from_secs(30)).await;
        // The first slot left the window; the refusal never took one.
        assert!(budget.admit(2));
        assert!(!budget.admit(2));
    }
}
