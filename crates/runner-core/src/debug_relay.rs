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

/// The largest debug frame relayed. A kernel's frames are a few KiB; one that
/// never ends (a hostile or broken kernel) must not grow the runner's memory
/// or its CPU time without bound: past this the frame is dropped, and the
/// parser skips to the next frame boundary.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Splits an SSE byte stream into the joined `data:` payload of each frame.
/// Linear in the bytes pushed: each byte is scanned for a frame end once.
#[derive(Debug, Default)]
pub struct SseFrameParser {
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no frame end.
    scanned: usize,
    /// Inside a frame that grew past [`MAX_FRAME_BYTES`]: its bytes are
    /// thrown away until it ends.
    discarding: bool,
}

impl SseFrameParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        loop {
            // A terminator may straddle the previous push: look back 3 bytes.
            let from = self.scanned.saturating_sub(3);
            let Some((at, len)) = find_frame_end(&self.pending[from..]) else {
                self.scanned = self.pending.len();
                if self.pending.len() > MAX_FRAME_BYTES {
                    // Keep the tail a terminator could start in.
                    let keep = self.pending.len().min(3);
                    self.pending.drain(..self.pending.len() - keep);
                    self.scanned = self.pending.len();
                    self.discarding = true;
                }
                return frames;
            };
            let end = from + at;
            let frame: Vec<u8> = self.pending.drain(..end + len).collect();
            self.scanned = 0;
            if std::mem::take(&mut self.discarding) {
                continue;
            }
            let text = String::from_utf8_lossy(&frame[..end]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if !data.is_empty() {
                frames.push(data.join("\n"));
            }
        }
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
    fn a_terminator_split_across_pushes_is_found() {
        let mut parser = SseFrameParser::default();
        assert!(parser.push(b"data: a\r\n\r").is_empty());
        assert_eq!(parser.push(b"\n"), vec!["a"]);
        assert!(parser.push(b"data: b\n").is_empty());
        assert_eq!(parser.push(b"\ndata: c\n\n"), vec!["b", "c"]);
    }

    #[test]
    fn a_frame_that_never_ends_is_dropped_and_memory_stays_bounded() {
        let mut parser = SseFrameParser::default();
        assert!(parser.push(b"data: ").is_empty());
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..64 {
            assert!(parser.push(&chunk).is_empty());
            assert!(parser.pending.len() <= MAX_FRAME_BYTES + chunk.len());
        }
        // The oversized frame ends; it is dropped, and the next one is whole.
        assert!(parser.push(b"\n\n").is_empty());
        assert_eq!(parser.push(b"data: {\"ok\":1}\n\n"), vec!["{\"ok\":1}"]);
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
