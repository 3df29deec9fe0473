//! CORS as the editor relies on it. Hand-written rather than tower-http's
//! `CorsLayer` because clients observe details that layer does differently: a
//! preflight answers `204` with an empty body and a malformed preflight is a
//! `400`.
//!
//! Since runner-core 0.15 a narrowed `RUNNER_CORS_ORIGINS` is enforced here
//! too, not only by browsers: a request whose `Origin` is not in the list is
//! refused with `403 origin_not_allowed` before any route sees it. Requests
//! without `Origin` (curl, the terminal client, kubelet probes) pass; the
//! terminal socket's handshake (and only it) is left to the socket's own
//! check (close 4403); a preflight from a foreign origin gets the same 403.

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
        CorsOrigins::List(_) => {
            let origin = origin?;
            let text = origin.to_str().ok()?;
            origins.lists(text).then(|| origin.clone())
        }
    }
}

/// SSE and WebSocket routes match origins literally: `*` inside a list is just
/// a string that no browser sends. A request without `Origin` is not a
/// browser page's (the terminal client, curl) and passes, as it does on
/// every other route: refusing it closed `telo-runner run`, `attach` and
/// `logs` with 4403 under a narrowed list, and kept out no page.
pub fn stream_allows_origin(origins: &CorsOrigins, origin: Option<&str>) -> bool {
    match (origins, origin) {
        (CorsOrigins::Any, _) | (CorsOrigins::List(_), None) => true,
        (CorsOrigins::List(_), Some(origin)) => origins.lists(origin),
    }
}

pub async fn cors(
    State(origins): State<Arc<CorsOrigins>>,
    request: Request,
    next: Next,
) -> Response {
    // A session's own traffic, on its way to the replica that serves it:
    // the session's app answers for its origins, not the API.
    if request
        .extensions()
        .get::<crate::edge::ElsewhereSession>()
        .is_some()
    {
        return next.run(request).await;
    }
    let origin = request.headers().get(header::ORIGIN).cloned();
    let preflight_request = request.method() == Method::OPTIONS;
    // A page of a foreign origin is refused at its preflight too: a
    // browser would not send the actual request after a preflight without
    // `Access-Control-Allow-Origin`, but saying so plainly costs nothing and
    // leaves a probing page no route to learn from.
    if let (CorsOrigins::List(list), Some(origin)) = (origins.as_ref(), origin.as_ref())
        && (preflight_request || !is_io_handshake(&request))
        && !origin.to_str().is_ok_and(|text| origins.lists(text))
    {
        return origin_not_allowed(list, origin);
    }
    if preflight_request {
        return preflight(&origins, request.headers(), origin.as_ref());
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

/// The terminal socket's handshake: a `GET` of `/v1/sessions/{id}/io` with
/// `Upgrade: websocket` and `Connection: upgrade`. Only it is left to its
/// own origin check (a 4403 close a browser can read); any other request
/// that merely carries an `Upgrade` header is checked here like the rest,
/// or a page could add the header to a `POST` and pass.
fn is_io_handshake(request: &Request) -> bool {
    let headers = request.headers();
    let upgrade = headers
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let connection = headers.get_all(header::CONNECTION).iter().any(|value| {
        value
            .as_bytes()
            .split(|b| *b == b',')
            .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
    });
    request.method() == Method::GET && upgrade && connection && is_io_path(request.uri().path())
}

/// `/v1/sessions/{id}/io`, with exactly one non-empty id segment.
fn is_io_path(path: &str) -> bool {
    path.strip_prefix("/v1/sessions/")
        .and_then(|rest| rest.strip_suffix("/io"))
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
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
    super::ApiError::new(super::ErrorCode::OriginNotAllowed, message).into_response()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::empty()).unwrap_or_default()
    }

    const UPGRADE: &[(&str, &str)] = &[
        ("upgrade", "websocket"),
        ("connection", "keep-alive, Upgrade"),
    ];

    #[test]
    fn only_the_io_handshake_skips_the_origin_check() {
        assert!(is_io_handshake(&request(
            Method::GET,
            "/v1/sessions/abc/io?app=x",
            UPGRADE
        )));
        assert!(!is_io_handshake(&request(
            Method::POST,
            "/v1/sessions",
            UPGRADE
        )));
        assert!(!is_io_handshake(&request(
            Method::POST,
            "/v1/sessions/abc/io",
            UPGRADE
        )));
        assert!(!is_io_handshake(&request(
            Method::GET,
            "/v1/sessions/abc/events",
            UPGRADE
        )));
        assert!(!is_io_handshake(&request(
            Method::GET,
            "/v1/sessions/a/b/io",
            UPGRADE
        )));
        assert!(!is_io_handshake(&request(
            Method::GET,
            "/v1/sessions//io",
            UPGRADE
        )));
        assert!(!is_io_handshake(&request(
            Method::GET,
            "/v1/sessions/abc/io",
            &[("upgrade", "websocket")]
        )));
    }
}
