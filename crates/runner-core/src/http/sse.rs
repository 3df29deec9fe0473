//! `GET /v1/sessions/:id/events`: replay from the client's last event id, then
//! live events, ending after the terminal status.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::stream;
use tokio::time::{Instant, Interval, interval_at};

use super::error::ApiError;
use super::{AppState, PathParam, query_value, stream_allows_origin};
use crate::metrics::{SubscriberGuard, Transport};
use crate::registry::{Batch, Cursor, EventFrame};

const GAP_FRAME: &[u8] = b"event: gap\ndata: {\"reason\":\"buffer_evicted\"}\n\n";
const HEARTBEAT_FRAME: &[u8] = b": heartbeat\n\n";

pub async fn events(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = state
        .registry
        .get(&id)
        .ok_or_else(|| ApiError::session_not_found(&id))?;
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
    let ended = write_batch(&mut initial, &first) || session.is_terminal();

    let stream = EventStream {
        cursor,
        heartbeat: heartbeat(state.options.sse_heartbeat),
        initial: Some(initial.freeze()),
        ended,
        going_away: state.going_away.clone(),
        _subscriber: state.registry.metrics().subscriber(Transport::Sse),
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
    going_away: tokio_util::sync::CancellationToken,
    /// Counted as a subscriber for as long as the body stream lives.
    _subscriber: SubscriberGuard,
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
        out.put_slice(format!("id: {id}\nevent: {}\ndata: ", frame.name).as_bytes());
        out.put_slice(&frame.data);
        out.put_slice(b"\n\n");
        if frame.terminal {
            return true;
        }
    }
    false
}

/// `parseInt(value, 10)` accepted only when finite and non-negative; anything
/// else falls through to the next source of a resume point.
pub fn parse_resume_id(raw: &str) -> Option<u64> {
    // JavaScript's whitespace, not Rust's: `parseInt` skips U+FEFF but not
    // U+0085.
    let trimmed = raw.trim_start_matches(crate::config::is_js_whitespace);
    let (negative, digits) = match trimmed.as_bytes().first() {
        Some(b'-') => (true, &trimmed[1..]),
        Some(b'+') => (false, &trimmed[1..]),
        _ => (false, trimmed),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    let value: u64 = digits[..end].parse().unwrap_or(u64::MAX);
    if negative && value != 0 {
        return None;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_ids_parse_like_parse_int() {
        assert_eq!(parse_resume_id("12"), Some(12));
        assert_eq!(parse_resume_id("  7abc"), Some(7));
        assert_eq!(parse_resume_id("0"), Some(0));
        assert_eq!(parse_resume_id("-0"), Some(0));
        assert_eq!(parse_resume_id("-3"), None);
        assert_eq!(parse_resume_id("abc"), None);
        assert_eq!(parse_resume_id(""), None);
        assert_eq!(parse_resume_id("99999999999999999999999"), Some(u64::MAX));
    }

    /// Found by `resume_ids_follow_parse_int`: a `?lastEventId=%C2%855`
    /// resumed from 5 (Rust trims U+0085, `parseInt` does not), and
    /// `%EF%BB%BF5` replayed everything (`parseInt` trims U+FEFF).
    #[test]
    fn resume_ids_skip_javascript_whitespace_only() {
        assert_eq!(parse_resume_id("\u{85}5"), None);
        assert_eq!(parse_resume_id("\u{FEFF}5"), Some(5));
        assert_eq!(parse_resume_id("\u{3000}\u{A0}-0x"), Some(0));
    }

    /// `parseInt(raw, 10)`, then "finite and non-negative", written
    /// independently of the implementation.
    fn parse_int_model(raw: &str) -> Option<u64> {
        const JS_WHITESPACE: &str = "\u{9}\u{A}\u{B}\u{C}\u{D} \u{A0}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200A}\u{2028}\u{2029}\u{202F}\u{205F}\u{3000}\u{FEFF}";
        let rest: String = raw
            .chars()
            .skip_while(|c| JS_WHITESPACE.contains(*c))
            .collect();
        let (sign, rest) = match rest.chars().next() {
            Some(c @ ('-' | '+')) => (c, rest[1..].to_owned()),
            _ => ('+', rest),
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            return None;
        }
        let value = digits.parse::<u64>().unwrap_or(u64::MAX);
        (sign == '+' || value == 0).then_some(value)
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(4096)
        ))]

        #[test]
        fn resume_ids_follow_parse_int(
            raw in "[ \t\u{85}\u{A0}\u{FEFF}\u{3000}\u{2028}]{0,3}[-+]{0,2}[0-9]{0,25}[a-z.e,\u{FF10}-\u{FF19}]{0,3}|\\PC*",
        ) {
            proptest::prop_assert_eq!(parse_resume_id(&raw), parse_int_model(&raw));
        }
    }
}
