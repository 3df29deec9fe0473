//! Relays a kernel's debug stream (SSE at `http://<addr>/events`) as parsed
//! JSON frames. The kernel may not be listening yet when the session starts, so
//! the relay retries until it is stopped.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub const RETRY_DELAY: Duration = Duration::from_millis(500);

/// Relay frames from `url` to `on_frame` until `stop` fires.
pub async fn relay_debug_stream(
    client: reqwest::Client,
    url: String,
    mut on_frame: impl FnMut(Value) + Send,
    stop: CancellationToken,
) {
    let relay = async {
        loop {
            if let Err(err) = relay_once(&client, &url, &mut on_frame).await {
                debug!(%url, error = %err, "debug stream unavailable, retrying");
            }
            tokio::time::sleep(RETRY_DELAY).await;
        }
    };
    tokio::select! {
        () = relay => {}
        () = stop.cancelled() => {}
    }
}

async fn relay_once(
    client: &reqwest::Client,
    url: &str,
    on_frame: &mut (impl FnMut(Value) + Send),
) -> Result<(), reqwest::Error> {
    let response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await?
        .error_for_status()?;
    let mut body = response.bytes_stream();
    let mut parser = SseFrameParser::default();
    while let Some(chunk) = body.next().await {
        for data in parser.push(&chunk?) {
            if let Ok(frame) = serde_json::from_str::<Value>(&data) {
                on_frame(frame);
            }
        }
    }
    Ok(())
}

/// Splits an SSE byte stream into the joined `data:` payload of each frame.
#[derive(Debug, Default)]
pub struct SseFrameParser {
    pending: Vec<u8>,
}

impl SseFrameParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while let Some(end) = find_frame_end(&self.pending) {
            let frame: Vec<u8> = self.pending.drain(..end.0 + end.1).collect();
            let text = String::from_utf8_lossy(&frame[..end.0]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if !data.is_empty() {
                frames.push(data.join("\n"));
            }
        }
        frames
    }
}

/// Position and length of the first blank-line frame terminator.
fn find_frame_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_chunks_are_joined() {
        let mut parser = SseFrameParser::default();
        assert!(parser.push(b"data: {\"a\":").is_empty());
        assert_eq!(
            parser.push(b"1}\n\n: comment\n\ndata: 2\n"),
            vec!["{\"a\":1}"]
        );
        assert_eq!(parser.push(b"\n"), vec!["2"]);
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let mut parser = SseFrameParser::default();
        assert_eq!(
            parser.push(b"event: x\ndata: a\ndata: b\r\n\r\n"),
            vec!["a\nb"]
        );
    }
}
