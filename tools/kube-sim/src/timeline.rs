//! Wall-clock moments in each pod's life, served at `/_sim/timeline`, so a
//! benchmark can split "request sent → output seen" into the part spent in
//! the cluster and the part spent in the runner. Times are microseconds since
//! the Unix epoch, taken when the store commits the change — the instant a
//! watcher could first learn of it.

use std::collections::{HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How many pods the timeline remembers; the oldest are forgotten first.
const MAX_PODS: usize = 100_000;

/// One pod's moments. `None` until the pod got there.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodTimeline {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Stored by a create.
    pub created_us: Option<u64>,
    /// Assigned to the node (`spec.nodeName` set).
    pub scheduled_us: Option<u64>,
    /// First stored with `status.phase: Running`.
    pub running_us: Option<u64>,
    /// First stored in `Succeeded` or `Failed`.
    pub finished_us: Option<u64>,
    /// Removed from the store.
    pub deleted_us: Option<u64>,
}

#[derive(Default)]
pub struct Timeline {
    pods: HashMap<String, PodTimeline>,
    order: VecDeque<String>,
}

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn phase(value: &Value) -> Option<&str> {
    value.pointer("/status/phase").and_then(Value::as_str)
}

fn scheduled(value: &Value) -> bool {
    value
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
}

impl Timeline {
    /// Notes a pod write: `prev` is the stored state before it, `value` the
    /// new one (`None` for a removal).
    pub fn observe(&mut self, uid: &str, prev: Option<&Value>, value: Option<&Value>) {
        if uid.is_empty() {
            return;
        }
        let at = now_us();
        if !self.pods.contains_key(uid) {
            let Some(current) = value.or(prev) else {
                return;
            };
            if self.order.len() >= MAX_PODS
                && let Some(oldest) = self.order.pop_front()
            {
                self.pods.remove(&oldest);
            }
            self.order.push_back(uid.to_string());
            self.pods.insert(
                uid.to_string(),
                PodTimeline {
                    namespace: crate::meta::namespace(current).to_string(),
                    name: crate::meta::name(current).to_string(),
                    uid: uid.to_string(),
                    ..PodTimeline::default()
                },
            );
        }
        let Some(entry) = self.pods.get_mut(uid) else {
            return;
        };
        let Some(value) = value else {
            entry.deleted_us.get_or_insert(at);
            return;
        };
        if prev.is_none() {
            entry.created_us.get_or_insert(at);
        }
        if scheduled(value) && !prev.is_some_and(scheduled) {
            entry.scheduled_us.get_or_insert(at);
        }
        match phase(value) {
            Some("Running") => {
                entry.running_us.get_or_insert(at);
            }
            Some("Succeeded" | "Failed") => {
                entry.finished_us.get_or_insert(at);
            }
            _ => {}
        }
    }

    /// Every remembered pod, oldest first.
    pub fn snapshot(&self) -> Vec<PodTimeline> {
        self.order
            .iter()
            .filter_map(|uid| self.pods.get(uid).cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_is_followed_from_create_to_deletion() {
        let mut t = Timeline::default();
        let created = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "status": {"phase": "Pending"}});
        let scheduled = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}});
        let running = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"nodeName": "n"}, "status": {"phase": "Running"}});
        t.observe("u", None, Some(&created));
        t.observe("u", Some(&created), Some(&scheduled));
        t.observe("u", Some(&scheduled), Some(&running));
        t.observe("u", Some(&running), Some(&running));
        t.observe("u", Some(&running), None);
        let [pod] = t.snapshot().try_into().unwrap();
        assert_eq!((pod.namespace.as_str(), pod.name.as_str()), ("ns", "p"));
        let c = pod.created_us.unwrap();
        let s = pod.scheduled_us.unwrap();
        let r = pod.running_us.unwrap();
        let d = pod.deleted_us.unwrap();
        assert!(c <= s && s <= r && r <= d);
        assert_eq!(pod.finished_us, None);
    }

    #[test]
    fn the_oldest_pods_are_forgotten_first() {
        let mut t = Timeline::default();
        for i in 0..MAX_PODS + 3 {
            let uid = format!("u{i}");
            let v = json!({"metadata": {"name": uid, "namespace": "ns", "uid": uid}});
            t.observe(&uid, None, Some(&v));
        }
        let all = t.snapshot();
        assert_eq!(all.len(), MAX_PODS);
        assert_eq!(all[0].uid, "u3");
    }
}
