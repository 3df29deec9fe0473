//! The session's byte channel (contract §5): output frames carry a 4-byte
//! sequence number, stdin goes back as binary frames, resizes as JSON text.

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::api::RunnerApi;

pub type IoSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Shown where the runner could not replay everything we missed.
pub const GAP_NOTICE: &[u8] =
    b"\r\n\x1b[2m[stream reconnected \xe2\x80\x94 earlier output truncated]\x1b[0m\r\n";

/// The runner closes with this when it goes away (a restart) while the
/// session lives on.
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// The session ended and its output is drained.
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_SESSION_NOT_FOUND: u16 = 4404;
/// The session ended and the runner holds no output of it to replay.
pub const CLOSE_NOTHING_TO_REPLAY: u16 = 4410;

/// Close codes after which reconnecting cannot help: the editor's list, plus
/// 4401 (a missing or wrong token stays wrong).
pub fn is_final_close(code: u16) -> bool {
    matches!(code, 1000 | 1001 | 1005 | 4401 | 4403 | 4404 | 4410)
}

/// The payload of an output frame that is new after `last_seq`, with its seq;
/// `None` for runt frames and for chunks already shown before a reconnect.
pub fn new_output(frame: &[u8], last_seq: u32) -> Option<(u32, &[u8])> {
    let header: [u8; 4] = frame.get(..4)?.try_into().ok()?;
    let seq = u32::from_be_bytes(header);
    (seq > last_seq).then(|| (seq, &frame[4..]))
}

pub fn resize_frame(cols: u16, rows: u16) -> Message {
    Message::text(format!(
        r#"{{"type":"resize","cols":{cols},"rows":{rows}}}"#
    ))
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
        let frame = [0, 0, 1, 2, b'h', b'i'];
        assert_eq!(new_output(&frame, 0), Some((258, &b"hi"[..])));
        assert_eq!(new_output(&frame, 258), None);
        assert_eq!(new_output(&[0, 1], 0), None);
    }

    #[test]
    fn only_abnormal_closes_are_retried() {
        for code in [1000, 4401, 4403, 4404, 4410] {
            assert!(is_final_close(code));
        }
        assert!(!is_final_close(1006));
        assert!(!is_final_close(1011));
    }
}
