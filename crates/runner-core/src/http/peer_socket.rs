//! A client's terminal socket served through another replica: relayed
//! message by message, not as raw bytes, so that the relaying replica can
//! end it as the owner would when it goes away — with a close frame,
//! 1001 "going away", at a message boundary — instead of cutting the
//! connection. The same close goes out when the owner's side ends without
//! one (the owner was killed), so the client reconnects and resumes.
//!
//! Pings and pongs are answered on each side by the WebSocket layer and
//! not passed on: each hop keeps its own connection alive.

use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use runner_api::io::CLOSE_GOING_AWAY;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_util::sync::CancellationToken;

/// How long a relay waits for the client to answer its close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

fn going_away() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(CLOSE_GOING_AWAY),
        reason: "going away".into(),
    }))
}

/// Relays the upgraded `client` (this replica served its upgrade) to the
/// upgraded `upstream` (the owner's answer) until either ends, or until
/// `leaving` fires: then the client is sent 1001 and the owner's side is
/// closed.
pub(crate) async fn relay<A, B>(client: A, upstream: B, leaving: CancellationToken)
where
    A: AsyncRead + AsyncWrite + Unpin + Send,
    B: AsyncRead + AsyncWrite + Unpin + Send,
{
    let client = WebSocketStream::from_raw_socket(client, Role::Server, None).await;
    let upstream = WebSocketStream::from_raw_socket(upstream, Role::Client, None).await;
    let (mut to_client, mut from_client) = client.split();
    let (mut to_owner, mut from_owner) = upstream.split();
    // Once a close frame has gone to the client: until it answers (or the
    // wait is over).
    let mut closing: Option<tokio::time::Instant> = None;
    let mut owner_open = true;
    loop {
        let close_wait = async {
            match closing {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = leaving.cancelled(), if closing.is_none() => {
                let _ = to_client.send(going_away()).await;
                closing = Some(tokio::time::Instant::now() + CLOSE_WAIT);
                if owner_open {
                    let _ = to_owner.close().await;
                    owner_open = false;
                }
            }
            message = from_owner.next(), if owner_open => match message {
                Some(Ok(Message::Close(frame))) => {
                    owner_open = false;
                    if closing.is_none() {
                        let _ = to_client.send(Message::Close(frame)).await;
                        closing = Some(tokio::time::Instant::now() + CLOSE_WAIT);
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(message)) => {
                    if closing.is_none() && to_client.send(message).await.is_err() {
                        break;
                    }
                }
                // The owner's side ended without a close frame: the client
                // is told to reconnect, as the owner would have told it.
                None | Some(Err(_)) => {
                    owner_open = false;
                    if closing.is_none() {
                        let _ = to_client.send(going_away()).await;
                        closing = Some(tokio::time::Instant::now() + CLOSE_WAIT);
                    }
                }
            },
            message = from_client.next() => match message {
                Some(Ok(Message::Close(frame))) => {
                    if closing.is_some() {
                        // The answer to this relay's close.
                        break;
                    }
                    if owner_open {
                        let _ = to_owner.send(Message::Close(frame)).await;
                    }
                    closing = Some(tokio::time::Instant::now() + CLOSE_WAIT);
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(message)) => {
                    if owner_open && closing.is_none() && to_owner.send(message).await.is_err() {
                        owner_open = false;
                    }
                }
                None | Some(Err(_)) => break,
            },
            () = close_wait => break,
        }
    }
    if owner_open {
        let _ = to_owner.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    async fn pair(
        role: Role,
    ) -> (
        tokio::io::DuplexStream,
        WebSocketStream<tokio::io::DuplexStream>,
    ) {
        let (near, far) = duplex(64 * 1024);
        let far = WebSocketStream::from_raw_socket(far, role, None).await;
        (near, far)
    }

    #[tokio::test]
    async fn messages_pass_both_ways_and_leaving_sends_going_away() {
        // The client's end speaks as a client; the owner's as a server.
        let (client_io, mut client) = pair(Role::Client).await;
        let (owner_io, mut owner) = pair(Role::Server).await;
        let leaving = CancellationToken::new();
        let relaying = tokio::spawn(relay(client_io, owner_io, leaving.clone()));
        owner.send(Message::binary(vec![1, 2, 3])).await.unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::binary(vec![1, 2, 3])
        );
        client.send(Message::text("typed")).await.unwrap();
        assert_eq!(owner.next().await.unwrap().unwrap(), Message::text("typed"));
        leaving.cancel();
        match client.next().await.unwrap().unwrap() {
            Message::Close(Some(frame)) => {
                assert_eq!(u16::from(frame.code), 1001);
                assert_eq!(frame.reason, "going away");
            }
            other => panic!("{other:?}"),
        }
        // The client answers the close; the relay ends.
        while client.next().await.is_some() {}
        relaying.await.unwrap();
    }

    #[tokio::test]
    async fn an_owner_cut_off_without_a_close_frame_is_a_going_away_for_the_client() {
        let (client_io, mut client) = pair(Role::Client).await;
        let (owner_io, owner) = pair(Role::Server).await;
        let relaying = tokio::spawn(relay(client_io, owner_io, CancellationToken::new()));
        drop(owner);
        match client.next().await.unwrap().unwrap() {
            Message::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 1001),
            other => panic!("{other:?}"),
        }
        while client.next().await.is_some() {}
        relaying.await.unwrap();
    }

    #[tokio::test]
    async fn the_owners_close_frame_reaches_the_client_as_it_was() {
        let (client_io, mut client) = pair(Role::Client).await;
        let (owner_io, mut owner) = pair(Role::Server).await;
        let relaying = tokio::spawn(relay(client_io, owner_io, CancellationToken::new()));
        owner
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::from(4410),
                reason: "session ended".into(),
            })))
            .await
            .unwrap();
        match client.next().await.unwrap().unwrap() {
            Message::Close(Some(frame)) => {
                assert_eq!(u16::from(frame.code), 4410);
                assert_eq!(frame.reason, "session ended");
            }
            other => panic!("{other:?}"),
        }
        while client.next().await.is_some() {}
        relaying.await.unwrap();
    }
}
