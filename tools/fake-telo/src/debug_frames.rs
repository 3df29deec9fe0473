//! The frames of the kernel debug stream (`@telorun/debug-wire` over SSE),
//! as the real kernel writes them: what the fixed stream of a plain run and
//! the live stream of `--watch` both send.

use serde_json::json;
use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;

use crate::script::DebugEvent;

/// The log line sent before the events; the runner must drop it.
pub const BOOT_LOG_LINE: &str = "fake-telo booting";

const RFC3339_UTC_MILLIS: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// `2026-01-02T03:04:05.678Z`: RFC 3339 in UTC with milliseconds, as the real
/// kernel's `new Date().toISOString()` writes it.
pub fn frame_timestamp(at: OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(RFC3339_UTC_MILLIS)
        .unwrap_or_else(|_| String::from("1970-01-01T00:00:00.000Z"))
}

pub fn log_frame(timestamp: &str, line: &str) -> String {
    sse_data(&json!({
        "kind": "log",
        "timestamp": timestamp,
        "stream": "stdout",
        "line": line,
    }))
}

pub fn event_frame(timestamp: &str, event: &DebugEvent) -> String {
    sse_data(&json!({
        "kind": "event",
        "timestamp": timestamp,
        "event": event.name(),
        "payload": event.payload(),
    }))
}

fn sse_data(frame: &serde_json::Value) -> String {
    format!("data: {frame}\n\n")
}

/// Everything a new `/events` subscriber receives before the keep-alives.
pub fn initial_stream(at: OffsetDateTime, events: &[DebugEvent]) -> String {
    let timestamp = frame_timestamp(at);
    let mut stream = log_frame(&timestamp, BOOT_LOG_LINE);
    for event in events {
        stream.push_str(&event_frame(&timestamp, event));
    }
    stream
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(
            frame_timestamp(datetime!(2026-01-02 03:04:05.678901 UTC)),
            "2026-01-02T03:04:05.678Z"
        );
        assert_eq!(
            frame_timestamp(datetime!(2026-01-02 05:04:05 +02:00)),
            "2026-01-02T03:04:05.000Z"
        );
    }

    #[test]
    fn a_subscriber_gets_the_boot_log_then_every_event_in_order() {
        let stream = initial_stream(
            datetime!(2026-01-02 03:04:05.006 UTC),
            &["Kernel.Starting".into(), "Kernel.Started".into()],
        );
        assert_eq!(
            stream,
            concat!(
                "data: {\"kind\":\"log\",\"timestamp\":\"2026-01-02T03:04:05.006Z\",\"stream\":\"stdout\",\"line\":\"fake-telo booting\"}\n\n",
                "data: {\"kind\":\"event\",\"timestamp\":\"2026-01-02T03:04:05.006Z\",\"event\":\"Kernel.Starting\",\"payload\":{}}\n\n",
                "data: {\"kind\":\"event\",\"timestamp\":\"2026-01-02T03:04:05.006Z\",\"event\":\"Kernel.Started\",\"payload\":{}}\n\n",
            )
        );
    }

    #[test]
    fn event_names_are_json_escaped() {
        let frame = event_frame("t", &"odd \"name\"\n".into());
        assert_eq!(
            frame,
            "data: {\"kind\":\"event\",\"timestamp\":\"t\",\"event\":\"odd \\\"name\\\"\\n\",\"payload\":{}}\n\n"
        );
    }
}
