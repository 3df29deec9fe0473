//! The editor's side of the contract, lean enough to run thousands at once:
//! session creation, an SSE reader and a WebSocket reader.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use runner_api::io::{FrameFormat, ServerMessage, parse_server_message, split_output_frame};
use serde_json::{Value, json};
use test_support::sse::SseReader;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::procs::Stack;

/// How long any single step may take before the scenario gives up.
pub const STEP: Duration = Duration::from_secs(120);

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A `POST /v1/sessions` body whose workload is fake-telo running `script`.
pub fn start_body(script: &Value) -> Value {
    let manifest =
        format!("kind: Telo.Application\nmetadata: {{ name: bench }}\nfakeTelo: {script}\n");
    json!({
        "bundle": {
            "entryRelativePath": "telo.yaml",
            "files": [{ "relativePath": "telo.yaml", "contents": manifest }],
        },
        "env": {},
        "ports": [],
        "config": { "image": "telorun/node:0-slim", "pullPolicy": "missing" },
        "inspect": false,
    })
}

/// A created session and when its POST was sent and answered.
pub struct Created {
    pub id: String,
    pub sent_us: u64,
    pub answered_us: u64,
}

pub async fn create(stack: &Stack, script: &Value) -> anyhow::Result<Created> {
    create_with(stack, &start_body(script)).await
}

/// `POST /v1/sessions` with a whole body (a bundle of any app).
pub async fn create_with(stack: &Stack, body: &Value) -> anyhow::Result<Created> {
    post_session(stack, "/v1/sessions", body).await
}

/// `POST /v1/apps/{app}/sessions`: a session of an operator catalog app.
pub async fn create_app(stack: &Stack, app: &str) -> anyhow::Result<Created> {
    post_session(stack, &format!("/v1/apps/{app}/sessions"), &json!({})).await
}

async fn post_session(stack: &Stack, path: &str, body: &Value) -> anyhow::Result<Created> {
    let sent_us = now_us();
    let resp = tokio::time::timeout(STEP, stack.http.post(stack.url(path)).json(body).send())
        .await
        .map_err(|_| anyhow!("POST {path} timed out"))??;
    let answered_us = now_us();
    let status = resp.status();
    let value: Value = resp.json().await?;
    if status.as_u16() != 201 {
        bail!("POST {path} answered {status}: {value}");
    }
    let id = value["sessionId"]
        .as_str()
        .context("sessionId in the 201 body")?
        .to_string();
    Ok(Created {
        id,
        sent_us,
        answered_us,
    })
}

pub async fn delete(stack: &Stack, id: &str) -> anyhow::Result<()> {
    let resp = stack
        .http
        .delete(stack.url(&format!("/v1/sessions/{id}")))
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("DELETE session {id} answered {}", resp.status());
    }
    Ok(())
}

/// One SSE event: its name and JSON data.
pub struct SseEvent {
    pub event: String,
    pub data: Value,
}

impl SseEvent {
    /// `status.kind` of a status event.
    pub fn status_kind(&self) -> Option<&str> {
        (self.event == "status")
            .then(|| self.data["status"]["kind"].as_str())
            .flatten()
    }
}

pub struct Sse {
    reader: SseReader,
}

impl Sse {
    pub async fn connect(stack: &Stack, id: &str) -> anyhow::Result<Sse> {
        let resp = tokio::time::timeout(
            STEP,
            stack
                .http
                .get(stack.url(&format!("/v1/sessions/{id}/events")))
                .header("accept", "text/event-stream")
                .send(),
        )
        .await
        .map_err(|_| anyhow!("SSE connect timed out"))??;
        if !resp.status().is_success() {
            bail!("SSE answered {}", resp.status());
        }
        Ok(Sse {
            reader: SseReader::new(resp),
        })
    }

    /// The next event (comments skipped); `None` when the stream ended.
    pub async fn next(&mut self) -> anyhow::Result<Option<SseEvent>> {
        loop {
            let frame = tokio::time::timeout(STEP, self.reader.next_frame())
                .await
                .map_err(|_| anyhow!("no SSE frame within {STEP:?}"))??;
            let Some(frame) = frame else {
                return Ok(None);
            };
            if let Some(event) = frame.event.clone() {
                let data = frame.json().unwrap_or(Value::Null);
                return Ok(Some(SseEvent { event, data }));
            }
        }
    }

    /// Reads until a status event of `kind`; the time it arrived.
    pub async fn wait_status(&mut self, kind: &str) -> anyhow::Result<u64> {
        while let Some(event) = self.next().await? {
            match event.status_kind() {
                Some(k) if k == kind => return Ok(now_us()),
                Some("failed") => bail!("session failed: {}", event.data),
                _ => {}
            }
        }
        bail!("the event stream ended before status {kind}")
    }

    /// Reads until the stream ends; the terminal status kind it saw last.
    pub async fn wait_end(&mut self) -> anyhow::Result<Option<String>> {
        let mut last = None;
        while let Some(event) = self.next().await? {
            if let Some(kind) = event.status_kind() {
                last = Some(kind.to_string());
            }
        }
        Ok(last)
    }
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What a WebSocket reader receives.
pub enum IoFrame {
    Output { bytes: Bytes },
    Gap,
    Closed,
}

pub struct Io {
    pub tx: SplitSink<Socket, Message>,
    rx: SplitStream<Socket>,
}

impl Io {
    /// Connects to `/io?lastSeq=0` and reads the `seq` frame.
    pub async fn connect(stack: &Stack, id: &str) -> anyhow::Result<Io> {
        let url = stack.ws_url(&format!("/v1/sessions/{id}/io?lastSeq=0"));
        let (socket, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
            .await
            .map_err(|_| anyhow!("WebSocket connect timed out"))??;
        let (tx, rx) = socket.split();
        let mut io = Io { tx, rx };
        match tokio::time::timeout(STEP, io.rx.next()).await {
            Ok(Some(Ok(Message::Text(text))))
                if matches!(parse_server_message(&text), ServerMessage::Seq(_)) =>
            {
                Ok(io)
            }
            other => bail!("expected the seq frame first, got {other:?}"),
        }
    }

    pub async fn send_stdin(&mut self, bytes: &'static [u8]) -> anyhow::Result<()> {
        self.tx
            .send(Message::Binary(Bytes::from_static(bytes)))
            .await?;
        Ok(())
    }

    pub async fn next(&mut self) -> anyhow::Result<IoFrame> {
        loop {
            let message = tokio::time::timeout(STEP, self.rx.next())
                .await
                .map_err(|_| anyhow!("no WebSocket frame within {STEP:?}"))?;
            match message {
                None | Some(Ok(Message::Close(_))) => return Ok(IoFrame::Closed),
                Some(Err(err)) => return Err(err.into()),
                Some(Ok(Message::Binary(data))) => {
                    // The stacks the bench starts speak the default wire.
                    let Some(frame) = split_output_frame(FrameFormat::Tagged, &data) else {
                        bail!("binary frame shorter than its header");
                    };
                    let payload = frame.payload;
                    // The payload without copying it out of the frame.
                    let header = data.len() - payload.len();
                    return Ok(IoFrame::Output {
                        bytes: data.slice(header..),
                    });
                }
                Some(Ok(Message::Text(text))) => {
                    if parse_server_message(&text) == ServerMessage::Gap {
                        return Ok(IoFrame::Gap);
                    }
                }
                Some(Ok(_)) => {}
            }
        }
    }
}
