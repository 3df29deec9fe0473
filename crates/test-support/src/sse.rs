//! A minimal SSE reader that keeps everything a test may assert on: ids, event
//! names, data, comments and the end of the stream.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde_json::Value;

use crate::WAIT;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseFrame {
    pub id: Option<u64>,
    pub event: Option<String>,
    pub data: Option<String>,
    pub comments: Vec<String>,
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
    buffer: BytesMut,
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
            buffer: BytesMut::new(),
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
            if frame.event.is_some() || frame.data.is_some() {
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
            if let Some(frame) = self.take_frame() {
                return Some(frame);
            }
            if self.ended {
                return None;
            }
            match self.body.next().await {
                Some(Ok(bytes)) => self.buffer.extend_from_slice(&bytes),
                Some(Err(_)) | None => self.ended = true,
            }
        }
    }

    fn take_frame(&mut self) -> Option<SseFrame> {
        let end = self.buffer.windows(2).position(|w| w == b"\n\n")?;
        let raw = self.buffer.split_to(end + 2);
        let text = String::from_utf8(raw[..end].to_vec()).expect("SSE is UTF-8");
        let mut frame = SseFrame::default();
        let mut data: Vec<String> = Vec::new();
        for line in text.split('\n') {
            if let Some(comment) = line.strip_prefix(':') {
                frame.comments.push(comment.trim_start().to_owned());
            } else if let Some(id) = line.strip_prefix("id: ") {
                frame.id = Some(id.parse().expect("numeric id"));
            } else if let Some(event) = line.strip_prefix("event: ") {
                frame.event = Some(event.to_owned());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push(d.to_owned());
            } else {
                panic!("unexpected SSE line {line:?}");
            }
        }
        if !data.is_empty() {
            frame.data = Some(data.join("\n"));
        }
        Some(frame)
    }
}
