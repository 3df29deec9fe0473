//! An SSE reader that keeps everything a test may assert on: ids, event
//! names, data, comments and the end of the stream. Frames are parsed by the
//! contract's own parser; a line the contract never sends fails the test.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use runner_api::sse::SseParser;
use serde_json::Value;

use crate::WAIT;

/// No frame a test reads comes near this; a runner that sent one is broken.
const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// A parsed frame (its fields through `Deref`), with the readings tests use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseFrame(runner_api::sse::SseFrame);

impl std::ops::Deref for SseFrame {
    type Target = runner_api::sse::SseFrame;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl SseFrame {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().expect("frame has data")).expect("data is JSON")
    }

    /// `status.kind` of a status frame.
    pub fn status_kind(&self) -> Option<String> {
        if self.event.as_deref() != Some("status") {
            return None;
        }
        self.json()["status"]["kind"].as_str().map(str::to_owned)
    }
}

pub struct SseStream {
    pub status: reqwest::StatusCode,
    pub headers: reqwest::header::HeaderMap,
    body: std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    parser: SseParser,
    /// Frames parsed and not yet read.
    ready: std::collections::VecDeque<SseFrame>,
    ended: bool,
}

impl SseStream {
    pub async fn connect(url: &str, headers: &[(&str, &str)]) -> SseStream {
        let client = crate::http_client();
        let mut request = client.get(url).header("accept", "text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = tokio::time::timeout(WAIT, request.send())
            .await
            .expect("SSE connect timed out")
            .expect("SSE connect failed");
        SseStream {
            status: response.status(),
            headers: response.headers().clone(),
            body: Box::pin(response.bytes_stream()),
            parser: SseParser::new(MAX_FRAME_BYTES),
            ready: std::collections::VecDeque::new(),
            ended: false,
        }
    }

    /// The next frame (comments included), `None` when the server ended the
    /// stream. Panics after `timeout`.
    pub async fn next_frame_within(&mut self, timeout: Duration) -> Option<SseFrame> {
        tokio::time::timeout(timeout, self.read_frame())
            .await
            .expect("timed out waiting for an SSE frame")
    }

    pub async fn next_frame(&mut self) -> Option<SseFrame> {
        self.next_frame_within(WAIT).await
    }

    /// The next frame that is an event (skipping heartbeat comments).
    pub async fn next_event(&mut self) -> Option<SseFrame> {
        loop {
            let frame = self.next_frame().await?;
            if frame.is_event() {
                return Some(frame);
            }
        }
    }

    /// Every event until the server ends the stream.
    pub async fn events_until_end(&mut self) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next_event().await {
            frames.push(frame);
        }
        frames
    }

    /// Events up to and including the first for which `stop` holds.
    pub async fn events_until(&mut self, mut stop: impl FnMut(&SseFrame) -> bool) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next_event().await.expect("stream ended early");
            let done = stop(&frame);
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }

    async fn read_frame(&mut self) -> Option<SseFrame> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Some(frame);
            }
            if self.ended {
                return None;
            }
            match self.body.next().await {
                Some(Ok(bytes)) => {
                    for frame in self.parser.push(&bytes) {
                        assert!(
                            frame.unexpected.is_empty(),
                            "unexpected SSE lines {:?}",
                            frame.unexpected
                        );
                        self.ready.push_back(SseFrame(frame));
                    }
                }
                Some(Err(_)) | None => self.ended = true,
            }
        }
    }
}
