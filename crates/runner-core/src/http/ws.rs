//! `GET /v1/sessions/:id/io`: the terminal byte channel over WebSocket.
//!
//! Every rejection about the session or the origin happens after the
//! handshake, with a 44xx close code a browser can read; a refused upgrade
//! would only show as 1006, which clients treat as a network blip and retry
//! forever. The one exception is the subscriber cap: a socket past it is
//! answered `429` instead of being upgraded, since upgrading it would hold
//! the very connection the cap exists to keep free.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use runner_api::io::{
    CLOSE_FORBIDDEN_ORIGIN, CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_NOTHING_TO_REPLAY,
    CLOSE_SESSION_NOT_FOUND, ChannelLabel, FrameFormat, GAP_MESSAGE, output_frame, parse_resize,
    resize_unsupported_message, seq_message,
};
use runner_api::watch::IoMode;
use tokio::time::{Instant, sleep_until};

use super::error::ApiError;
use super::subscribers::ClientKey;
use super::{AppState, query_value, stream_allows_origin, trimmed_query};
use crate::metrics::{Metrics, Transport};
use crate::session::{AppResolution, Batch, OutputChunk, Session};

/// What a client sends is keystrokes, pastes and resizes; tungstenite's
/// default 128 KiB read buffer, zero-filled before the first read, made every
/// open terminal cost 128 KiB of resident memory. Larger frames still arrive
/// whole, over more reads.
const CLIENT_READ_BUFFER_BYTES: usize = 8 * 1024;

/// Resizes within this window collapse into the last one.
pub const RESIZE_THROTTLE: Duration = Duration::from_millis(50);
/// How long the terminal close waits for output still queued to a client.
pub const DRAIN_TIMEOUT: Duration = Duration::from_millis(2_000);
/// A client whose socket accepts nothing for this long is dropped: its
/// connection task must not live on for as long as its TCP connection does.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Replies queued for the writer; past this a client's extra refusals are
/// dropped.
const REPLY_QUEUE: usize = 8;

pub async fn io(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    // An id that is not UTF-8 names no session: it gets the 4404 close like
    // any unknown id, after the handshake, instead of a plain-text 400.
    let id = id.map(|Path(id)| id).unwrap_or_default();
    let (mut parts, _body) = request.into_parts();
    let viewer = super::auth::viewer_of(&parts.extensions);
    // Another principal's session is an unknown id here too (4404).
    let visible = {
        let state = state.clone();
        let viewer = viewer.clone();
        move |id: &str| {
            state
                .registry
                .get(id)
                .filter(|session| viewer.may_see(session.owner()))
        }
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &state).await {
        Ok(upgrade) => upgrade,
        Err(_) => {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::NOT_FOUND;
            return response;
        }
    };
    // Counted before the upgrade, so a refusal is a 429 a client can read
    // rather than one more socket held open to be closed. An unknown id is
    // not counted: it gets its 4404 after the handshake, as before.
    let slot = match visible(&id) {
        None => None,
        Some(_) => match state.subscribers.admit(
            state.options.subscribers,
            &id,
            ClientKey::of_parts(&parts),
        ) {
            Ok(slot) => Some(slot),
            Err(refusal) => return ApiError::from(refusal).into_response(),
        },
    };
    let origin = parts
        .headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let last_seq = query_value(&parts.uri, "lastSeq")
        .as_deref()
        .and_then(runner_api::sse::parse_resume_id)
        .unwrap_or(0);
    let app = trimmed_query(&parts.uri, "app");
    let format = state.options.io_frames;
    upgrade
        .read_buffer_size(CLIENT_READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            let _open = state.sockets.token();
            let _slot = slot;
            if !stream_allows_origin(&state.options.cors, origin.as_deref()) {
                close_with(socket, CLOSE_FORBIDDEN_ORIGIN, "forbidden_origin").await;
                return;
            }
            let Some(session) = visible(&id) else {
                close_with(socket, CLOSE_SESSION_NOT_FOUND, "session not found").await;
                return;
            };
            let (app, io) = match session.resolve_app(app.as_deref()) {
                Ok(resolved) => resolved,
                Err(refusal) => {
                    let reason = match refusal {
                        AppResolution::Unknown => {
                            format!("session runs no app named '{}'", app.unwrap_or_default())
                        }
                        AppResolution::Ambiguous(count) => {
                            format!("session runs {count} apps \u{2014} ?app= is required")
                        }
                    };
                    close_with_text(socket, CLOSE_SESSION_NOT_FOUND, reason).await;
                    return;
                }
            };
            let metrics = state.registry.metrics().clone();
            let _subscriber = metrics.subscriber(Transport::WebSocket);
            // An open terminal is a subscriber (idle suspension).
            let _subscribed = session.subscriber();
            let channel = Channel { app, io, format };
            let leaving = super::Leaving::of(&state, &session);
            serve(socket, session, channel, last_seq, &metrics, &leaving).await;
        })
        .into_response()
}

async fn close_with(socket: WebSocket, code: u16, reason: &'static str) {
    close_with_text(socket, code, reason.to_owned()).await;
}

async fn close_with_text(mut socket: WebSocket, code: u16, reason: String) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: Utf8Bytes::from(reason),
        })))
        .await;
}

/// The app a socket is bound to and how its frames are laid out.
struct Channel {
    app: String,
    io: IoMode,
    format: FrameFormat,
}

async fn serve(
    socket: WebSocket,
    session: Arc<Session>,
    channel: Channel,
    last_seq: u64,
    metrics: &Metrics,
    going_away: &super::Leaving,
) {
    let format = channel.format;
    let mut cursor = session.subscribe_app_output(&channel.app, last_seq);
    let mut events = session.watch_events();
    events.borrow_and_update();
    // Resuming from a frame of the runner that handed the session over, its
    // place is known once the history is rebuilt up to it (or given up
    // on), which a finished session must not be closed before. Anything
    // else is greeted at once, whether or not there is output yet.
    let first = cursor.settled().await;
    let terminal_at_connect = session.is_terminal();
    if terminal_at_connect && first.entries.is_empty() && !first.gap {
        close_with(
            socket,
            CLOSE_NOTHING_TO_REPLAY,
            "session terminal, nothing to replay",
        )
        .await;
        return;
    }

    let (mut tx, mut rx) = socket.split();
    let label = (format == FrameFormat::Tagged).then_some(ChannelLabel {
        app: &channel.app,
        io: channel.io,
    });
    let seq_frame = seq_message(last_seq, label);
    let greeting = async {
        tx.send(Message::Text(seq_frame.into())).await?;
        send_batch(&mut tx, first, format, metrics).await
    };
    if !matches!(
        tokio::time::timeout(WRITE_TIMEOUT, greeting).await,
        Ok(Ok(()))
    ) {
        return;
    }

    // Reading (stdin, resizes, the session's end) and writing (output) run
    // side by side: a client that stops reading blocks only the writer, so
    // its input still flows and the session's end is still seen.
    let ended = tokio_util::sync::CancellationToken::new();
    // Text the reader answers a client with (a refused resize), sent by the
    // writer, which owns the socket's sending half.
    let (replies, mut reply_rx) = tokio::sync::mpsc::channel::<String>(REPLY_QUEUE);
    let writer = async {
        loop {
            let batch = tokio::select! {
                batch = cursor.next() => batch,
                Some(reply) = reply_rx.recv() => {
                    let sent = tokio::time::timeout(WRITE_TIMEOUT, tx.send(Message::Text(reply.into()))).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        return;
                    }
                    continue;
                }
                () = ended.cancelled() => break,
            };
            let send = send_batch(&mut tx, batch, format, metrics);
            tokio::pin!(send);
            let sent = tokio::select! {
                sent = tokio::time::timeout(WRITE_TIMEOUT, &mut send) => matches!(sent, Ok(Ok(()))),
                // Ended while a send is stuck: it gets the drain's time.
                () = ended.cancelled() => matches!(tokio::time::timeout(DRAIN_TIMEOUT, &mut send).await, Ok(Ok(()))),
            };
            if !sent {
                // Dead or hostile: it has accepted nothing for a long time.
                return;
            }
        }
        // The session ended (or the service is going away): flush what is
        // left, then close.
        let drain = async {
            let rest = cursor.try_next();
            if send_batch(&mut tx, rest, format, metrics).await.is_err() {
                return;
            }
            let _ = tx.flush().await;
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
        let close = if session.is_terminal() {
            CloseFrame {
                code: CLOSE_NORMAL,
                reason: Utf8Bytes::from_static("session terminal"),
            }
        } else {
            CloseFrame {
                code: CLOSE_GOING_AWAY,
                reason: Utf8Bytes::from_static("going away"),
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, tx.send(Message::Close(Some(close)))).await;
    };
    let reader = async {
        let mut pending_resize: Option<(u16, u16)> = None;
        let mut resize_deadline: Option<Instant> = None;
        if terminal_at_connect || going_away.is_cancelled() {
            return true;
        }
        loop {
            tokio::select! {
                message = rx.next() => match message {
                    Some(Ok(Message::Binary(bytes))) => session.write_app_stdin(&channel.app, bytes),
                    Some(Ok(Message::Text(text))) => {
                        if let Some(size) = parse_resize(text.as_str()) {
                            if channel.io != IoMode::Tty {
                                // Only a terminal has a size; the socket stays open.
                                // A client flooding them loses replies, never the socket.
                                let _ = replies.try_send(resize_unsupported_message(channel.io));
                                continue;
                            }
                            pending_resize = Some(size);
                            resize_deadline.get_or_insert_with(|| Instant::now() + RESIZE_THROTTLE);
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return false,
                    Some(Ok(_)) => {}
                },
                changed = events.changed() => {
                    if changed.is_err() || session.is_terminal() {
                        return true;
                    }
                }
                () = going_away.cancelled() => return true,
                () = async { if let Some(at) = resize_deadline { sleep_until(at).await } else { std::future::pending().await } } => {
                    resize_deadline = None;
                    if let Some((cols, rows)) = pending_resize.take() {
                        session.resize_app(&channel.app, cols, rows);
                    }
                }
            }
        }
    };
    tokio::pin!(writer);
    tokio::select! {
        session_ended = reader => {
            if session_ended {
                ended.cancel();
                writer.await;
            }
        }
        () = &mut writer => {}
    }
}

async fn send_batch<S>(
    tx: &mut S,
    batch: Batch<OutputChunk>,
    format: FrameFormat,
    metrics: &Metrics,
) -> Result<(), axum::Error>
where
    S: SinkExt<Message, Error = axum::Error> + Unpin,
{
    if batch.gap {
        tx.feed(Message::Text(Utf8Bytes::from_static(GAP_MESSAGE)))
            .await?;
    }
    let mut bytes = 0;
    for (seq, chunk) in batch.entries {
        tx.feed(Message::Binary(output_frame(
            format,
            seq,
            chunk.tag,
            &chunk.bytes,
        )))
        .await?;
        bytes += chunk.bytes.len();
    }
    tx.flush().await?;
    metrics.output_sent_to_websocket(bytes);
    Ok(())
}
