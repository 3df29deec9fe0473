//! The session's byte channel (docs/contract.md §5): output frames carry a 4-byte
//! sequence number (and, in the tagged wire, a stream byte), stdin goes back
//! as binary frames, resizes as JSON text.

use futures_util::{SinkExt, StreamExt};
use runner_api::io::{FrameFormat, resize_message, split_output_frame};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::api::RunnerApi;

pub type IoSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Shown where the runner could not replay everything we missed.
pub const GAP_NOTICE: &[u8] =
    b"\r\n\x1b[2m[stream reconnected \xe2\x80\x94 earlier output truncated]\x1b[0m\r\n";

pub use runner_api::io::{CLOSE_GOING_AWAY, is_final_close};

/// The payload of an output frame that is new after `last_seq`, with its seq;
/// `None` for runt frames and for chunks already shown before a reconnect.
pub fn new_output(format: FrameFormat, frame: &[u8], last_seq: u32) -> Option<(u32, &[u8])> {
    split_output_frame(format, frame)
        .filter(|frame| frame.seq > last_seq)
        .map(|frame| (frame.seq, frame.payload))
}

pub fn resize_frame(cols: u16, rows: u16) -> Message {
    Message::text(resize_message(cols, rows))
}

pub async fn connect(
    api: &RunnerApi,
    id: &str,
    last_seq: u32,
) -> Result<IoSocket, tokio_tungstenite::tungstenite::Error> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = api.ws_url(&format!("/v1/sessions/{id}/io?lastSeq={last_seq}"));
    let mut request = url.into_client_request()?;
    if let Some(token) = api.token()
        && let Ok(value) = format!("Bearer {token}").parse()
    {
        request.headers_mut().insert("authorization", value);
    }
    let (socket, _) = tokio_tungstenite::connect_async(request).await?;
    Ok(socket)
}

pub async fn send(socket: &mut Option<IoSocket>, message: Message) {
    if let Some(open) = socket.as_mut() {
        // A failed send shows up as a dropped read next, which reconnects.
        let _ = open.send(message).await;
    }
}

/// Reads the next frame, `None` when the socket is closed or failed.
pub async fn next(
    socket: &mut Option<IoSocket>,
) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
    match socket.as_mut() {
        Some(open) => open.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_frames_lose_their_seq_and_repeats_are_dropped() {
        let legacy = [0, 0, 1, 2, b'h', b'i'];
        assert_eq!(
            new_output(FrameFormat::Legacy, &legacy, 0),
            Some((258, &b"hi"[..]))
        );
        assert_eq!(new_output(FrameFormat::Legacy, &legacy, 258), None);
        assert_eq!(new_output(FrameFormat::Legacy, &[0, 1], 0), None);
        let tagged = [0, 0, 1, 2, 0, b'h', b'i'];
        assert_eq!(
            new_output(FrameFormat::Tagged, &tagged, 0),
            Some((258, &b"hi"[..]))
        );
        assert_eq!(new_output(FrameFormat::Tagged, &[0, 0, 0, 1], 0), None);
    }
}
