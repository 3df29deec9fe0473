//! Following a session's lifecycle over SSE (contract §4): a frame parser
//! (pure) and a follower task that resumes with `Last-Event-ID` when the
//! stream drops before the terminal status.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::api::RunnerApi;

/// Between reconnect attempts after the stream dropped.
const RECONNECT_DELAY: Duration = Duration::from_millis(250);
/// A runner that cannot be reached for this many attempts in a row is gone.
const MAX_RECONNECT_ATTEMPTS: u32 = 40;

/// One `event:`/`data:` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    pub id: Option<u64>,
    pub event: Option<String>,
    pub data: String,
}

/// Splits an SSE byte stream into frames, whatever the chunking.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseFrame> {
        self.buffer.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while let Some(end) = find_blank_line(&self.buffer) {
            let block: Vec<u8> = self.buffer.drain(..end.0 + end.1).collect();
            if let Some(frame) = parse_block(&String::from_utf8_lossy(&block[..end.0])) {
                frames.push(frame);
            }
        }
        frames
    }
}

/// Position of the first blank line and its length (`\n\n` or `\r\n\r\n`).
fn find_blank_line(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

fn parse_block(block: &str) -> Option<SseFrame> {
    let mut frame = SseFrame {
        id: None,
        event: None,
        data: String::new(),
    };
    let mut has_data = false;
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => frame.id = value.parse().ok(),
            "event" => frame.event = Some(value.to_owned()),
            "data" => {
                if has_data {
                    frame.data.push('\n');
                }
                frame.data.push_str(value);
                has_data = true;
            }
            _ => {} // comments (heartbeats) and unknown fields
        }
    }
    has_data.then_some(frame)
}

/// Whether a `RunStatus` ends the session.
pub fn is_terminal(status: &Value) -> bool {
    matches!(
        status.get("kind").and_then(Value::as_str),
        Some("exited" | "failed" | "stopped")
    )
}

/// What the follower reports.
#[derive(Debug, Clone)]
pub enum Lifecycle {
    /// A RunEvent (the `data` JSON, with its `type`).
    Event(Value),
    /// The stream cannot be followed any more (runner gone, session evicted).
    Lost(String),
}

/// Why a connection attempt ended without the terminal status.
enum Attempt {
    /// Reconnecting cannot help.
    Fatal(String),
    /// The connection failed; try again.
    Retry(String),
}

/// Follows `id`'s events until its terminal status, forwarding each RunEvent.
pub async fn follow(
    api: RunnerApi,
    id: String,
    events: mpsc::Sender<Lifecycle>,
    cancel: CancellationToken,
) {
    let path = format!("/v1/sessions/{id}/events");
    let mut last_event_id = 0u64;
    let mut failures = 0u32;
    loop {
        let attempt = async {
            let response = api
                .stream_request(&path)
                .header("last-event-id", last_event_id.to_string())
                .header("accept", "text/event-stream")
                .send()
                .await
                .map_err(|e| Attempt::Retry(e.to_string()))?;
            if response.status() == reqwest::StatusCode::NOT_FOUND {
                return Err(Attempt::Fatal(format!(
                    "session '{id}' is no longer known to the runner"
                )));
            }
            if response.status() == reqwest::StatusCode::UNAUTHORIZED {
                return Err(Attempt::Fatal(
                    "the runner refused the event stream without a valid token; pass --token or set TELO_RUNNER_TOKEN".to_owned(),
                ));
            }
            if !response.status().is_success() {
                return Ok(false);
            }
            let mut parser = SseParser::default();
            let mut body = response.bytes_stream();
            while let Some(chunk) = body.next().await {
                let Ok(chunk) = chunk else { break };
                for frame in parser.push(&chunk) {
                    if let Some(seen) = frame.id {
                        last_event_id = seen;
                    }
                    let Ok(event) = serde_json::from_str::<Value>(&frame.data) else {
                        continue;
                    };
                    if event.get("type").is_none() {
                        continue; // the `gap` marker: lifecycle events lost are not fatal here
                    }
                    let terminal = event.get("type").and_then(Value::as_str) == Some("status")
                        && event.get("status").is_some_and(is_terminal);
                    if events.send(Lifecycle::Event(event)).await.is_err() {
                        return Ok(true);
                    }
                    if terminal {
                        return Ok(true);
                    }
                }
            }
            Ok(false)
        };
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            outcome = attempt => outcome,
        };
        match outcome {
            Ok(true) => return,
            Ok(false) => failures = 0,
            Err(Attempt::Fatal(message)) => {
                let _ = events.send(Lifecycle::Lost(message)).await;
                return;
            }
            Err(Attempt::Retry(message)) => {
                failures += 1;
                if failures >= MAX_RECONNECT_ATTEMPTS {
                    let _ = events
                        .send(Lifecycle::Lost(format!(
                            "lost the runner's event stream: {message}"
                        )))
                        .await;
                    return;
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(RECONNECT_DELAY) => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_chunks_are_reassembled() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"id: 1\nevent: status\nda").is_empty());
        let frames = parser.push(b"ta: {\"a\":1}\n\n: heartbeat\n\nevent: gap\ndata: {}\n\n");
        assert_eq!(
            frames,
            [
                SseFrame {
                    id: Some(1),
                    event: Some("status".into()),
                    data: "{\"a\":1}".into()
                },
                SseFrame {
                    id: None,
                    event: Some("gap".into()),
                    data: "{}".into()
                },
            ]
        );
    }

    #[test]
    fn terminal_statuses_are_exited_failed_and_stopped() {
        for kind in ["exited", "failed", "stopped"] {
            assert!(is_terminal(&serde_json::json!({ "kind": kind })));
        }
        for kind in ["starting", "running"] {
            assert!(!is_terminal(&serde_json::json!({ "kind": kind })));
        }
    }
}
