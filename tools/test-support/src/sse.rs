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
        self.0.json().expect("frame data is JSON")
    }
}

/// An SSE response body read frame by frame with the contract's parser:
/// what the tests' [`SseStream`] and the benchmark harness both read with.
pub struct SseReader {
    body: std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    parser: SseParser,
    /// Frames parsed and not yet read.
    ready: std::collections::VecDeque<runner_api::sse::SseFrame>,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> Self {
        SseReader {
            body: Box::pin(response.bytes_stream()),
            parser: SseParser::new(MAX_FRAME_BYTES),
            ready: std::collections::VecDeque::new(),
        }
    }

    /// The next frame (comments included); `None` once the body ended.
    pub async fn next_frame(&mut self) -> reqwest::Result<Option<runner_api::sse::SseFrame>> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Ok(Some(frame));
            }
            match self.body.next().await {
                Some(bytes) => self.ready.extend(self.parser.push(&bytes?)),
                None => return Ok(None),
            }
        }
    }
}

pub struct SseStream {
    pub status: reqwest::StatusCode,
    pub headers: reqwest::header::HeaderMap,
    reader: SseReader,
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
            reader: SseReader::new(response),
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
        if self.ended {
            return None;
        }
        match self.reader.next_frame().await {
            Ok(Some(frame)) => {
                assert!(
                    frame.unexpected.is_empty(),
                    "unexpected SSE lines {:?}",
                    frame.unexpected
                );
                Some(SseFrame(frame))
            }
            Ok(None) | Err(_) => {
                self.ended = true;
                None
            }
        }
    }
}
