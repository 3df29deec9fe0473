//! CORS as the editor relies on it. Hand-written rather than tower-http's
//! `CorsLayer` because clients observe details that layer does differently: a
//! preflight answers `204` with an empty body and a malformed preflight is a
//! `400`.
//!
//! Since runner-core 0.15 a narrowed `RUNNER_CORS_ORIGINS` is enforced here
//! too, not only by browsers: a request whose `Origin` is not in the list is
//! refused with `403 origin_not_allowed` before any route sees it. Requests
//! without `Origin` (curl, the terminal client, kubelet probes) pass;
//! WebSocket upgrades are left to the socket's own check (close 4403); a
//! preflight is answered as before (a browser's actual request is what gets
//! the 403).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::CorsOrigins;

const ALLOWED_METHODS: &str = "GET, POST, PUT, DELETE, OPTIONS";

/// The `Access-Control-Allow-Origin` value for JSON routes, if any. A list that
/// contains `*` acts as a wildcard here (but not for SSE and WebSocket).
pub fn allow_origin(origins: &CorsOrigins, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    match origins {
        CorsOrigins::Any => Some(HeaderValue::from_static("*")),
        CorsOrigins::List(list) if list.iter().any(|o| o == "*") => {
            Some(HeaderValue::from_static("*"))
        }
        CorsOrigins::List(list) => {
            let origin = origin?;
            let text = origin.to_str().ok()?;
            list.iter().any(|o| o == text).then(|| origin.clone())
        }
    }
}

/// SSE and WebSocket routes match origins literally: `*` inside a list is just
/// a string that no browser sends.
pub fn stream_allows_origin(origins: &CorsOrigins, origin: Option<&str>) -> bool {
    match origins {
        CorsOrigins::Any => true,
        CorsOrigins::List(list) => origin.is_some_and(|o| list.iter().any(|allowed| allowed == o)),
    }
}

pub async fn cors(
    State(origins): State<Arc<CorsOrigins>>,
    request: Request,
    next: Next,
) -> Response {
    let origin = request.headers().get(header::ORIGIN).cloned();
    if request.method() == Method::OPTIONS {
        return preflight(&origins, request.headers(), origin.as_ref());
    }
    if let (CorsOrigins::List(list), Some(origin)) = (origins.as_ref(), origin.as_ref())
        && !is_websocket_upgrade(request.headers())
        && !list
            .iter()
            .any(|allowed| allowed.as_bytes() == origin.as_bytes())
    {
        return origin_not_allowed(list, origin);
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    // The event stream makes its own, stricter CORS decision.
    let is_event_stream = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if is_event_stream || headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        return response;
    }
    if let Some(allowed) = allow_origin(&origins, origin.as_ref()) {
        let wildcard = allowed == "*";
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        if wildcard {
            return response;
        }
    }
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    response
}

/// `upgrade: websocket`, in any case.
fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// The 403 for a browser origin the runner does not serve; the list is
/// named so an operator reading a client's error knows what to change.
fn origin_not_allowed(list: &[String], origin: &HeaderValue) -> Response {
    let origin = String::from_utf8_lossy(origin.as_bytes());
    let mut message = format!("origin '{origin}' is not allowed by this runner");
    if !list.is_empty() {
        message.push_str(" \u{2014} it serves ");
        message.push_str(&list.join(", "));
    }
    super::ApiError::new(StatusCode::FORBIDDEN, "origin_not_allowed", message).into_response()
}

fn preflight(origins: &CorsOrigins, request: &HeaderMap, origin: Option<&HeaderValue>) -> Response {
    if origin.is_none() || !request.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "Invalid Preflight Request",
        )
            .into_response();
    }
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    let headers = response.headers_mut();
    let allowed = allow_origin(origins, origin);
    let wildcard = allowed.as_ref().is_some_and(|v| v == "*");
    if let Some(allowed) = allowed {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    }
    if !wildcard {
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(ALLOWED_METHODS),
    );
    if let Some(requested) = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, requested.clone());
        headers.append(
            header::VARY,
            HeaderValue::from_static("Access-Control-Request-Headers"),
        );
    }
    response
}
