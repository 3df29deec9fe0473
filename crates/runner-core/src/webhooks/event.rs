//! Lifecycle events and their CloudEvents 1.0 rendering (structured mode).

use serde_json::{Map, Value, json};
use time::OffsetDateTime;

/// The CloudEvents `source` of every event this runner sends.
pub const EVENT_SOURCE: &str = "telo-runner";
/// The media type of a structured-mode CloudEvent.
pub const CLOUDEVENTS_CONTENT_TYPE: &str = "application/cloudevents+json";

/// A step in a session's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleKind {
    Created,
    Running,
    Suspended,
    Resumed,
    Ended,
}

impl LifecycleKind {
    /// The CloudEvents `type`: `dev.telo.runner.session.<kind>`.
    pub fn event_type(self) -> &'static str {
        match self {
            LifecycleKind::Created => "dev.telo.runner.session.created",
            LifecycleKind::Running => "dev.telo.runner.session.running",
            LifecycleKind::Suspended => "dev.telo.runner.session.suspended",
            LifecycleKind::Resumed => "dev.telo.runner.session.resumed",
            LifecycleKind::Ended => "dev.telo.runner.session.ended",
        }
    }
}

/// One lifecycle event of one session.
#[derive(Debug, Clone)]
pub struct LifecycleEvent {
    pub kind: LifecycleKind,
    pub session_id: String,
    /// `run` or `watch`.
    pub mode: String,
    pub tenant: Option<String>,
    /// The principal that owns the session.
    pub subject: Option<String>,
    /// For `Ended`: `exited`, `failed` or `stopped`.
    pub status: Option<String>,
    pub exit_code: Option<i64>,
    pub time: OffsetDateTime,
}

/// A CloudEvents `id`: 122 random bits in the shape of a version 4 UUID.
pub fn new_event_id() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The structured-mode CloudEvent for `event` under `id`; fields of `data`
/// the event does not have are left out.
pub fn cloud_event(event: &LifecycleEvent, id: &str) -> Value {
    let mut data = Map::new();
    data.insert("sessionId".into(), Value::from(event.session_id.as_str()));
    data.insert("mode".into(), Value::from(event.mode.as_str()));
    if let Some(tenant) = &event.tenant {
        data.insert("tenant".into(), Value::from(tenant.as_str()));
    }
    if let Some(principal) = &event.subject {
        data.insert("principal".into(), Value::from(principal.as_str()));
    }
    if let Some(status) = &event.status {
        data.insert("status".into(), Value::from(status.as_str()));
    }
    if let Some(code) = event.exit_code {
        data.insert("exitCode".into(), Value::from(code));
    }
    json!({
        "specversion": "1.0",
        "id": id,
        "source": EVENT_SOURCE,
        "type": event.kind.event_type(),
        "subject": event.session_id,
        "time": crate::time::iso(event.time),
        "datacontenttype": "application/json",
        "data": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_event_carries_every_field() {
        let event = LifecycleEvent {
            kind: LifecycleKind::Ended,
            session_id: "abcdefghijkl".into(),
            mode: "run".into(),
            tenant: Some("acme".into()),
            subject: Some("alice".into()),
            status: Some("exited".into()),
            exit_code: Some(3),
            time: OffsetDateTime::from_unix_timestamp_nanos(1_767_225_600_123_456_789)
                .expect("time"),
        };
        assert_eq!(
            cloud_event(&event, "id-1").to_string(),
            r#"{"specversion":"1.0","id":"id-1","source":"telo-runner","type":"dev.telo.runner.session.ended","subject":"abcdefghijkl","time":"2026-01-01T00:00:00.123Z","datacontenttype":"application/json","data":{"sessionId":"abcdefghijkl","mode":"run","tenant":"acme","principal":"alice","status":"exited","exitCode":3}}"#
        );
    }

    #[test]
    fn absent_fields_are_left_out_of_data() {
        let event = LifecycleEvent {
            kind: LifecycleKind::Created,
            session_id: "s1".into(),
            mode: "watch".into(),
            tenant: None,
            subject: None,
            status: None,
            exit_code: None,
            time: OffsetDateTime::UNIX_EPOCH,
        };
        let rendered = cloud_event(&event, "id-2");
        assert_eq!(rendered["type"], "dev.telo.runner.session.created");
        assert_eq!(rendered["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rendered["data"],
            serde_json::json!({"sessionId": "s1", "mode": "watch"})
        );
    }

    #[test]
    fn event_ids_look_like_uuids_and_do_not_repeat() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_event_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert_eq!(id.len(), 36);
            assert_eq!(&id[14..15], "4");
            assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        }
    }
}
