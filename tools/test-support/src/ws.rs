//! WebSocket client helpers for the `/io` channel.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runner_api::io::{FrameFormat, split_output_frame};
use runner_api::watch::StreamTag;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::WAIT;

/// A terminal socket and the frame layout its runner speaks; it derefs to
/// the WebSocket stream, so a test sends on it directly.
pub struct Socket {
    stream: WebSocketStream<MaybeTlsStream<TcpStream>>,
    format: FrameFormat,
}

impl std::ops::Deref for Socket {
    type Target = WebSocketStream<MaybeTlsStream<TcpStream>>;
    fn deref(&self) -> &Self::Target {
        &self.stream
    }
}

impl std::ops::DerefMut for Socket {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.stream
    }
}

/// What the server sent, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum IoFrame {
    Output {
        seq: u32,
        stream: StreamTag,
        bytes: Vec<u8>,
    },
    Text(serde_json::Value),
    Close {
        code: u16,
        reason: String,
    },
}

impl Socket {
    /// A stream connected some other way (with custom headers), read as
    /// `format`.
    pub fn wrap(stream: WebSocketStream<MaybeTlsStream<TcpStream>>, format: FrameFormat) -> Self {
        Self { stream, format }
    }
}

/// Connects to a runner speaking the tagged frames (the default).
pub async fn connect(url: &str, origin: Option<&str>) -> Socket {
    connect_with(url, origin, FrameFormat::Tagged).await
}

/// Connects to a runner whose frames are laid out as `format`.
pub async fn connect_with(url: &str, origin: Option<&str>, format: FrameFormat) -> Socket {
    let mut request = url.into_client_request().expect("valid ws url");
    if let Some(origin) = origin {
        request
            .headers_mut()
            .insert("origin", origin.parse().expect("origin header"));
    }
    let (socket, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("ws connect timed out")
        .expect("ws connect failed");
    Socket {
        stream: socket,
        format,
    }
}

/// [`connect`], trying again while the runner answers the upgrade `503`
/// with `Retry-After` (a session moving between replicas), as the editor
/// does; for up to [`WAIT`].
pub async fn connect_when_served(url: &str) -> Socket {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let request = url.into_client_request().expect("valid ws url");
        let connected = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("ws connect timed out");
        match connected {
            Ok((stream, _)) => {
                return Socket {
                    stream,
                    format: FrameFormat::Tagged,
                };
            }
            Err(tokio_tungstenite::tungstenite::Error::Http(answer))
                if answer.status() == 503
                    && answer.headers().contains_key("retry-after")
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("ws connect failed: {err}"),
        }
    }
}

/// The next meaningful frame; `None` when the connection ended without a close frame.
pub async fn next_frame_within(socket: &mut Socket, timeout: Duration) -> Option<IoFrame> {
    loop {
        let message = tokio::time::timeout(timeout, socket.next())
            .await
            .expect("timed out waiting for a ws frame");
        match message {
            Some(Ok(Message::Binary(bytes))) => {
                let frame = split_output_frame(socket.format, &bytes)
                    .expect("binary frame shorter than its header");
                return Some(IoFrame::Output {
                    seq: frame.seq,
                    stream: frame.stream,
                    bytes: frame.payload.to_vec(),
                });
            }
            Some(Ok(Message::Text(text))) => {
                return Some(IoFrame::Text(
                    serde_json::from_str(text.as_str()).expect("text frames are JSON"),
                ));
            }
            Some(Ok(Message::Close(frame))) => {
                let (code, reason) = frame
                    .map(|CloseFrame { code, reason }| (u16::from(code), reason.to_string()))
                    .unwrap_or((1005, String::new()));
                return Some(IoFrame::Close { code, reason });
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return None,
        }
    }
}

pub async fn next_frame(socket: &mut Socket) -> Option<IoFrame> {
    next_frame_within(socket, WAIT).await
}

/// Read output until `needle` appeared in the concatenated bytes; returns the
/// frames read (close included if it came first, which fails the wait).
pub async fn read_until_output(socket: &mut Socket, needle: &str) -> Vec<IoFrame> {
    read_until_output_within(socket, needle, WAIT).await
}

/// [`read_until_output`] with each frame awaited up to `timeout` (a real
/// kernel's first output on a loaded machine comes later than [`WAIT`]).
pub async fn read_until_output_within(
    socket: &mut Socket,
    needle: &str,
    timeout: Duration,
) -> Vec<IoFrame> {
    let mut frames = Vec::new();
    let mut text = Vec::new();
    loop {
        let frame = next_frame_within(socket, timeout).await.unwrap_or_else(|| {
            panic!(
                "socket ended before {needle:?}; got {:?}",
                String::from_utf8_lossy(&text)
            )
        });
        if let IoFrame::Output { bytes, .. } = &frame {
            text.extend_from_slice(bytes);
        }
        let closed = matches!(frame, IoFrame::Close { .. });
        frames.push(frame);
        if String::from_utf8_lossy(&text).contains(needle) {
            return frames;
        }
        assert!(
            !closed,
            "socket closed before {needle:?}; got {:?}",
            String::from_utf8_lossy(&text)
        );
    }
}

/// Every frame until the server closes.
pub async fn read_until_close(socket: &mut Socket) -> Vec<IoFrame> {
    let mut frames = Vec::new();
    while let Some(frame) = next_frame(socket).await {
        let closed = matches!(frame, IoFrame::Close { .. });
        frames.push(frame);
        if closed {
            break;
        }
    }
    frames
}

/// The concatenated output bytes of `frames`.
pub fn output_of(frames: &[IoFrame]) -> Vec<u8> {
    frames
        .iter()
        .filter_map(|f| match f {
            IoFrame::Output { bytes, .. } => Some(bytes.as_slice()),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

/// The highest output seq among `frames`, where a reconnect resumes.
pub fn last_seq(frames: &[IoFrame]) -> Option<u32> {
    frames
        .iter()
        .filter_map(|f| match f {
            IoFrame::Output { seq, .. } => Some(*seq),
            _ => None,
        })
        .max()
}

pub async fn send_stdin(socket: &mut Socket, bytes: &[u8]) {
    socket
        .send(Message::Binary(Bytes::copy_from_slice(bytes)))
        .await
        .expect("send stdin");
}

pub async fn send_text(socket: &mut Socket, text: &str) {
    socket
        .send(Message::Text(text.into()))
        .await
        .expect("send text");
}
