//! Following a session's lifecycle over SSE (docs/contract.md §4): a frame parser
//! (pure) and a follower task that resumes with `Last-Event-ID` when the
//! stream drops before the terminal status.

use std::time::Duration;

use futures_util::StreamExt;
use runner_api::sse::SseParser;
use runner_api::types::{RunEvent, RunStatus};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::api::RunnerApi;

/// Between reconnect attempts after the stream dropped.
const RECONNECT_DELAY: Duration = Duration::from_millis(250);
/// A runner that cannot be reached for this many attempts in a row is gone.
const MAX_RECONNECT_ATTEMPTS: u32 = 40;

/// The largest event frame read. The runner's frames are small; a kernel
/// debug frame it relays is at most 1 MiB of JSON, wrapped.
const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// The status of an event that ends the session.
pub fn terminal_status(event: &RunEvent) -> Option<&RunStatus> {
    match event {
        RunEvent::Status { status } if status.is_terminal() => Some(status),
        _ => None,
    }
}

/// What the follower reports.
#[derive(Debug, Clone)]
pub enum Lifecycle {
    /// A RunEvent this client knows (others, from a newer runner, are
    /// skipped).
    Event(RunEvent),
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
            let mut parser = SseParser::new(MAX_FRAME_BYTES);
            let mut body = response.bytes_stream();
            while let Some(chunk) = body.next().await {
                let Ok(chunk) = chunk else { break };
                for frame in parser.push(&chunk) {
                    if let Some(seen) = frame.id {
                        last_event_id = seen;
                    }
                    // The `gap` marker is no RunEvent: lifecycle events lost
                    // to eviction are not fatal here.
                    let Some(event) = frame
                        .data
                        .and_then(|data| serde_json::from_str::<RunEvent>(&data).ok())
                    else {
                        continue;
                    };
                    let terminal = terminal_status(&event).is_some();
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
    fn terminal_statuses_are_exited_failed_and_stopped() {
        let event = |status: serde_json::Value| -> RunEvent {
            serde_json::from_value(serde_json::json!({"type": "status", "status": status})).unwrap()
        };
        for status in [
            serde_json::json!({"kind": "exited", "code": 0}),
            serde_json::json!({"kind": "failed", "message": "x"}),
            serde_json::json!({"kind": "stopped"}),
        ] {
            assert!(terminal_status(&event(status)).is_some());
        }
        for kind in ["starting", "running"] {
            assert!(terminal_status(&event(serde_json::json!({ "kind": kind }))).is_none());
        }
    }
}
