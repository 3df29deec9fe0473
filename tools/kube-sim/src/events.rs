//! Core/v1 Events written by the simulated kubelet, scheduler and
//! controllers, aggregated like the real event recorder (a repeat of the
//! same reason and message bumps `count` and `lastTimestamp`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::kinds;
use crate::meta;
use crate::storage::registry::Registry;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// (involved uid, field path, reason, message).
type EventKey = (String, String, String, String);

pub struct EventRecorder {
    registry: Arc<Registry>,
    /// (involved uid, field path, reason, message) → event name.
    seen: Mutex<HashMap<EventKey, (String, String)>>,
}

impl EventRecorder {
    pub fn new(registry: Arc<Registry>) -> Self {
        Self {
            registry,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event about `involved` (a stored object).
    pub fn record(
        &self,
        involved: &Value,
        field_path: Option<&str>,
        ty: EventType,
        reason: &str,
        message: &str,
        component: &str,
    ) {
        let ns = meta::namespace(involved).to_string();
        let ns = if ns.is_empty() {
            "default".to_string()
        } else {
            ns
        };
        let uid = meta::uid(involved).to_string();
        let key = (
            uid.clone(),
            field_path.unwrap_or("").to_string(),
            reason.to_string(),
            message.to_string(),
        );
        let events = kinds::id("events");
        let now = meta::now_timestamp();
        let existing = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        if let Some((ev_ns, name)) = existing {
            let bumped = self.registry.mutate(events, &ev_ns, &name, |ev| {
                let count = ev.get("count").and_then(Value::as_i64).unwrap_or(1);
                ev["count"] = json!(count + 1);
                ev["lastTimestamp"] = json!(now);
                true
            });
            if bumped.is_some() {
                return;
            }
        }
        // Like the recorder's `<name>.<unix nanos in hex>`: names sort by time.
        let nanos = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
        let name = format!("{}.{:x}", meta::name(involved), nanos);
        let mut involved_ref = json!({
            "kind": involved.get("kind").cloned().unwrap_or(Value::Null),
            "namespace": meta::namespace(involved),
            "name": meta::name(involved),
            "uid": uid,
            "apiVersion": involved.get("apiVersion").cloned().unwrap_or(Value::Null),
            "resourceVersion": meta::meta_str(involved, "resourceVersion").unwrap_or(""),
        });
        if let Some(fp) = field_path {
            involved_ref["fieldPath"] = json!(fp);
        }
        let host = crate::storage::defaults::NODE_NAME;
        let mut source = json!({"component": component});
        if component == "kubelet" {
            source["host"] = json!(host);
        }
        let event = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": involved_ref,
            "reason": reason,
            "message": message,
            "source": source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": ty.as_str(),
            "eventTime": null,
            "reportingComponent": component,
            "reportingInstance": if component == "kubelet" { host } else { "" },
        });
        if self.registry.create(events, &ns, event, false).is_ok() {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, (ns, name));
        }
    }

    /// Forgets aggregation state for an object that is gone.
    pub fn forget(&self, uid: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| k.0 != uid);
    }
}
