//! Request and watch counters served at `/_sim/stats`, so a benchmark can
//! show how much apiserver load a runner generates.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

/// A snapshot of the counters.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Stats {
    /// Open watch streams by resource (`pods`, `ingresses`, …).
    pub watches: BTreeMap<String, i64>,
    /// Requests by verb, then by resource (`pods`, `pods/log`, …).
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// Container processes the kubelet simulator is running.
    pub processes: usize,
    /// Pods in the store.
    pub pods: usize,
}

#[derive(Default)]
pub struct StatsCollector {
    inner: Mutex<Stats>,
}

impl StatsCollector {
    fn lock(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn count_request(&self, verb: &str, resource: &str) {
        *self
            .lock()
            .requests
            .entry(verb.to_string())
            .or_default()
            .entry(resource.to_string())
            .or_default() += 1;
    }

    /// Counts an open watch until the guard drops.
    pub fn open_watch(self: &std::sync::Arc<Self>, resource: &str) -> WatchGuard {
        *self.lock().watches.entry(resource.to_string()).or_default() += 1;
        WatchGuard {
            stats: self.clone(),
            resource: resource.to_string(),
        }
    }

    pub fn snapshot(&self) -> Stats {
        let mut s = self.lock().clone();
        s.watches.retain(|_, n| *n > 0);
        s
    }

    pub fn reset_requests(&self) {
        self.lock().requests.clear();
    }
}

pub struct WatchGuard {
    stats: std::sync::Arc<StatsCollector>,
    resource: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Some(n) = self.stats.lock().watches.get_mut(&self.resource) {
            *n -= 1;
        }
    }
}
