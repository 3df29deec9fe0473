//! `GET /v1/sessions/:id/events`: replay from the client's last event id, then
//! live events, ending after the terminal status.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::stream;
use runner_api::sse::{GAP_FRAME, HEARTBEAT_FRAME, parse_resume_id, put_event};
use tokio::time::{Instant, Interval, interval_at};

use super::error::ApiError;
use super::subscribers::{ClientKey, SubscriberSlot};
use super::{AppState, PathParam, query_value, stream_allows_origin};
use crate::metrics::{SubscriberGuard, Transport};
use crate::session::{Batch, Cursor, EventFrame};

pub async fn events(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: crate::identity::Viewer,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = super::visible_session(&state, &viewer, &id)?;
    let client = ClientKey::of(
        &headers,
        &uri,
        peer.map(|Extension(ConnectInfo(peer))| peer),
    );
    let slot = state
        .subscribers
        .admit(state.options.subscribers, &id, client)?;
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_resume_id)
        .or_else(|| {
            query_value(&uri, "lastEventId")
                .as_deref()
                .and_then(parse_resume_id)
        })
        .unwrap_or(0);

    let mut cursor = session.subscribe_events(last_event_id);
    let first = cursor.try_next();
    let mut initial = BytesMut::new();
    let mut ended = write_batch(&mut initial, &first);
    if !ended && session.is_terminal() {
        // It ended after that read: its status and the events recorded
        // with it are there now, and go out before the stream ends.
        write_batch(&mut initial, &cursor.try_next());
        ended = true;
    }

    let stream = EventStream {
        cursor,
        heartbeat: heartbeat(state.options.sse_heartbeat),
        initial: Some(initial.freeze()),
        ended,
        going_away: super::Leaving::of(&state, &session),
        _subscriber: state.registry.metrics().subscriber(Transport::Sse),
        _subscribed: session.subscriber(),
        _slot: slot,
    };
    let body = Body::from_stream(stream::unfold(stream, EventStream::step));

    let mut response = body.into_response();
    let response_headers = response.headers_mut();
    response_headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response_headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    response_headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    response_headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    // Set here because the stream carries its own CORS decision: a literal `*`
    // inside an origin list is not a wildcard for it.
    let origin = headers.get(header::ORIGIN);
    let origin_text = origin.and_then(|o| o.to_str().ok());
    if stream_allows_origin(&state.options.cors, origin_text) {
        let value = match &state.options.cors {
            crate::config::CorsOrigins::Any => Some(HeaderValue::from_static("*")),
            crate::config::CorsOrigins::List(_) => origin.cloned(),
        };
        if let Some(value) = value {
            response_headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        }
    }
    response_headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    Ok(response)
}

/// First tick one interval after connect, then every interval.
fn heartbeat(every: Duration) -> Interval {
    let mut interval = interval_at(Instant::now() + every, every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

struct EventStream {
    cursor: Cursor<EventFrame>,
    heartbeat: Interval,
    initial: Option<Bytes>,
    ended: bool,
    /// The service is going away: the stream ends so the client reconnects
    /// (to a successor that adopted the session).
    going_away: super::Leaving,
    /// Counted as a subscriber for as long as the body stream lives.
    _subscriber: SubscriberGuard,
    /// And as a subscriber of the session (idle suspension).
    _subscribed: crate::session::SubscriberGuard,
    /// Its place under the subscriber caps, given back when it ends.
    _slot: SubscriberSlot,
}

impl EventStream {
    async fn step(mut self) -> Option<(Result<Bytes, std::io::Error>, Self)> {
        if let Some(initial) = self.initial.take() {
            return Some((Ok(initial), self));
        }
        if self.ended {
            return None;
        }
        tokio::select! {
            // What is already recorded goes out before the stream ends.
            biased;
            batch = self.cursor.next() => {
                let mut out = BytesMut::new();
                self.ended = write_batch(&mut out, &batch);
                Some((Ok(out.freeze()), self))
            }
            _ = self.heartbeat.tick() => Some((Ok(Bytes::from_static(HEARTBEAT_FRAME)), self)),
            () = self.going_away.cancelled() => None,
        }
    }
}

/// Append the SSE frames of a batch; returns whether it held the terminal status.
fn write_batch(out: &mut BytesMut, batch: &Batch<EventFrame>) -> bool {
    if batch.gap {
        out.put_slice(GAP_FRAME);
    }
    for (id, frame) in &batch.entries {
        put_event(out, *id, frame.name, &frame.data);
        if frame.terminal {
            return true;
        }
    }
    false
}
