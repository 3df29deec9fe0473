//! The pod `attach` subresource on a WebSocket of our own.
//!
//! kube's `Api::attach` opens its WebSocket with tungstenite's default
//! configuration, whose 128 KiB read buffer is zero-filled before the first
//! read: every live session paid 128 KiB of resident memory for a stream that
//! mostly carries keystroke echoes. This opens the same upgrade through the
//! same kube client (so authentication, the request counters and error
//! bodies are unchanged) with a 16 KiB read buffer, and speaks the channel
//! protocol (`v5.channel.k8s.io`, else `v4`) itself: one binary frame per
//! message, its first byte the channel — 0 stdin, 1 stdout, 2 stderr,
//! 3 the container's final status, 4 terminal size.

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use http::header;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::AttachParams;
use kube::core::Status;
use kube::{Api, Error};
use runner_core::watch_types::StreamTag;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// Large output still arrives in full frames; it takes more reads.
const READ_BUFFER_BYTES: usize = 16 * 1024;

const PROTOCOLS: &str = "v5.channel.k8s.io, v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const RESIZE: u8 = 4;

pub type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// What came out of the attach stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// Output on the stdout (`StreamTag::Stdout`) or stderr channel; with a
    /// TTY everything comes on stdout.
    Output(StreamTag, Bytes),
    /// The container ended (its final status arrived).
    Ended,
    /// Nothing the relay needs (pings, empty frames, unknown channels).
    Other,
    /// The stream is over without a final status.
    Closed,
}

/// What an attach asks for: stdin and stdout, then either the TTY the
/// container was given (`tty`) or stderr apart — a kubelet attaches with
/// the container's own TTY setting and drops stderr from a request that
/// asks for a TTY.
pub fn attach_params(container: &str, tty: bool) -> AttachParams {
    let params = if tty {
        AttachParams::interactive_tty()
    } else {
        AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(true)
    };
    params.container(container)
}

/// Opens the attach to `container` of the pod: stdin, stdout and, for a
/// container with a TTY (`tty`), that TTY, else stderr apart.
///
/// Boxed: the terminal relay, which lives as long as its session, awaits it
/// (again after a dropped stream), and the request built inline would keep
/// kilobytes of room in every idle session's task.
pub fn attach<'a>(
    pods: &'a Api<Pod>,
    pod_name: &'a str,
    container: &'a str,
    tty: bool,
) -> BoxFuture<'a, Result<Socket, Error>> {
    attach_inline(pods, pod_name, container, tty).boxed()
}

async fn attach_inline(
    pods: &Api<Pod>,
    pod_name: &str,
    container: &str,
    tty: bool,
) -> Result<Socket, Error> {
    let params = attach_params(container, tty);
    let request = kube::core::Request::new(pods.resource_url())
        .attach(pod_name, &params)
        .map_err(Error::BuildRequest)?;
    let (mut parts, body) = request.into_parts();
    let key = generate_key();
    let headers = &mut parts.headers;
    headers.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    headers.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        header::SEC_WEBSOCKET_VERSION,
        header::HeaderValue::from_static("13"),
    );
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        header::HeaderValue::from_static(PROTOCOLS),
    );
    if let Ok(value) = header::HeaderValue::from_str(&key) {
        headers.insert(header::SEC_WEBSOCKET_KEY, value);
    }
    parts.extensions.insert("attach");
    let client = pods.clone().into_client();
    let response = client
        .send(http::Request::from_parts(
            parts,
            kube::client::Body::from(body),
        ))
        .await?;
    let status = response.status();
    if status != http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(refusal(response).await);
    }
    let accepted = response
        .headers()
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .is_some_and(|v| v.as_bytes() == derive_accept_key(key.as_bytes()).as_bytes());
    if !accepted {
        return Err(Error::Api(
            Status::failure("the attach upgrade was not accepted", "BadUpgrade")
                .with_code(502)
                .boxed(),
        ));
    }
    let upgraded = hyper::upgrade::on(response).await.map_err(|err| {
        Error::Api(
            Status::failure(&err.to_string(), "BadUpgrade")
                .with_code(502)
                .boxed(),
        )
    })?;
    let config = WebSocketConfig::default().read_buffer_size(READ_BUFFER_BYTES);
    Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(config)).await)
}

/// A refused upgrade as the apiserver said it (a `Status` body), like kube's
/// own requests report it.
async fn refusal(response: http::Response<kube::client::Body>) -> Error {
    let code = response.status().as_u16();
    let body = match response.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => return err,
    };
    match serde_json::from_slice::<Status>(&body) {
        Ok(status) => Error::Api(status.boxed()),
        Err(_) => Error::Api(
            Status::failure(
                String::from_utf8_lossy(&body).trim(),
                "Failed to parse error data",
            )
            .with_code(code)
            .boxed(),
        ),
    }
}

/// Reads what the next message means.
pub fn incoming(
    message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
) -> Incoming {
    match message {
        Some(Ok(Message::Binary(data))) => match data.first() {
            Some(&STDOUT) if data.len() > 1 => Incoming::Output(StreamTag::Stdout, data.slice(1..)),
            Some(&STDERR) if data.len() > 1 => Incoming::Output(StreamTag::Stderr, data.slice(1..)),
            Some(&STATUS) => Incoming::Ended,
            _ => Incoming::Other,
        },
        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => Incoming::Closed,
        Some(Ok(_)) => Incoming::Other,
    }
}

/// A stdin frame.
pub fn stdin_frame(bytes: &[u8]) -> Message {
    let mut frame = BytesMut::with_capacity(bytes.len() + 1);
    frame.put_u8(STDIN);
    frame.put_slice(bytes);
    Message::Binary(frame.freeze())
}

/// A terminal-size frame.
pub fn resize_frame(width: u16, height: u16) -> Message {
    let json = format!(r#"{{"Width":{width},"Height":{height}}}"#);
    let mut frame = BytesMut::with_capacity(json.len() + 1);
    frame.put_u8(RESIZE);
    frame.put_slice(json.as_bytes());
    Message::Binary(frame.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_channel_first() {
        assert_eq!(
            stdin_frame(b"ls\n"),
            Message::Binary(Bytes::from_static(b"\0ls\n"))
        );
        assert_eq!(
            resize_frame(120, 40),
            Message::Binary(Bytes::from_static(b"\x04{\"Width\":120,\"Height\":40}"))
        );
        assert_eq!(
            incoming(Some(Ok(Message::Binary(Bytes::from_static(b"\x01hi"))))),
            Incoming::Output(StreamTag::Stdout, Bytes::from_static(b"hi"))
        );
        assert_eq!(
            incoming(Some(Ok(Message::Binary(Bytes::from_static(b"\x02oops"))))),
            Incoming::Output(StreamTag::Stderr, Bytes::from_static(b"oops"))
        );
        assert_eq!(
            incoming(Some(Ok(Message::Binary(Bytes::from_static(b"\x03{}"))))),
            Incoming::Ended
        );
        assert_eq!(
            incoming(Some(Ok(Message::Binary(Bytes::from_static(b"\x01"))))),
            Incoming::Other
        );
        assert_eq!(incoming(None), Incoming::Closed);
    }

    #[test]
    fn a_tty_attach_asks_for_the_tty_and_a_piped_one_for_stderr_apart() {
        let tty = attach_params("app-web", true);
        assert!(tty.stdin && tty.stdout && tty.tty && !tty.stderr);
        assert_eq!(tty.container.as_deref(), Some("app-web"));
        let piped = attach_params("app-worker", false);
        assert!(piped.stdin && piped.stdout && piped.stderr && !piped.tty);
        assert_eq!(piped.container.as_deref(), Some("app-worker"));
    }
}
