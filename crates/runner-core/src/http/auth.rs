//! The bearer-token gate in front of `/v1` (on only with
//! `RUNNER_AUTH_TOKENS_FILE`).
//!
//! Browsers cannot put headers on a WebSocket or an `EventSource`, so those
//! two routes also take the token as `?access_token=`. A refused WebSocket is
//! still upgraded and then closed with 4401: a refused upgrade shows up in a
//! browser only as 1006, which clients retry forever.

use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorCode};
use crate::auth::AuthTokens;

/// Close code of a WebSocket refused for a missing or wrong token.
pub use runner_api::io::CLOSE_UNAUTHORIZED;
/// Query parameter carrying the token where headers cannot be set.
pub const ACCESS_TOKEN_PARAM: &str = "access_token";
/// Routes anyone may call even with auth on: discovery, so a client can learn
/// that it needs a token.
const OPEN_V1_PATHS: &[&str] = &["/v1/health", "/v1/capabilities"];

/// Which requests need a token. Only `/v1` is gated: `/livez`, `/readyz` and
/// `/metrics` are for the cluster's probes and scrapers, and backend routes
/// such as `/internal/bundles/...` carry their own single-use tokens.
pub fn requires_token(path: &str) -> bool {
    path.starts_with("/v1/") && !OPEN_V1_PATHS.contains(&path)
}

/// The event stream and the IO socket, which also accept `?access_token=`.
fn accepts_query_token(path: &str) -> bool {
    path.starts_with("/v1/sessions/") && (path.ends_with("/events") || path.ends_with("/io"))
}

fn is_io_socket(path: &str) -> bool {
    path.starts_with("/v1/sessions/") && path.ends_with("/io")
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

/// The decoded `access_token` query parameter, if present.
pub fn query_token(query: Option<&str>) -> Option<String> {
    let query = query?;
    query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (name == ACCESS_TOKEN_PARAM).then(|| percent_decode(value))
    })
}

/// `application/x-www-form-urlencoded` decoding of one value; invalid escapes
/// are kept literally (the token then simply does not match).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => out.push(b' '),
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        index += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub async fn require_token(
    State(tokens): State<Arc<AuthTokens>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if !requires_token(path) {
        return next.run(request).await;
    }
    let from_query = if accepts_query_token(path) {
        query_token(request.uri().query())
    } else {
        None
    };
    let presented = bearer_token(request.headers())
        .map(str::to_owned)
        .or(from_query);
    if presented.is_some_and(|token| tokens.accepts(&token)) {
        return next.run(request).await;
    }
    if is_io_socket(path) {
        return refuse_socket(request).await;
    }
    unauthorized()
}

fn unauthorized() -> Response {
    let mut response = ApiError::new(
        ErrorCode::Unauthorized,
        "this runner requires `Authorization: Bearer <token>` (a missing or unknown token)",
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Upgrade, then close with 4401; a plain GET gets the JSON 401.
async fn refuse_socket(request: Request) -> Response {
    let (mut parts, _body) = request.into_parts();
    let Ok(upgrade) = WebSocketUpgrade::from_request_parts(&mut parts, &()).await else {
        return unauthorized();
    };
    upgrade
        .on_upgrade(|mut socket| async move {
            let _ = socket
                .send(Message::Close(Some(CloseFrame {
                    code: CLOSE_UNAUTHORIZED,
                    reason: Utf8Bytes::from_static(ErrorCode::Unauthorized.as_str()),
                })))
                .await;
        })
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_v1_routes_other_than_discovery_need_a_token() {
        for open in [
            "/v1/health",
            "/v1/capabilities",
            "/livez",
            "/readyz",
            "/metrics",
            "/internal/bundles/abc",
        ] {
            assert!(!requires_token(open), "{open}");
        }
        for gated in [
            "/v1/sessions",
            "/v1/sessions/abc/io",
            "/v1/probe",
            "/v1/openapi.json",
            "/v1/health/",
        ] {
            assert!(requires_token(gated), "{gated}");
        }
    }

    #[test]
    fn the_query_token_is_only_taken_by_the_stream_routes() {
        assert!(accepts_query_token("/v1/sessions/abc/events"));
        assert!(accepts_query_token("/v1/sessions/abc/io"));
        assert!(!accepts_query_token("/v1/sessions/abc"));
        assert!(!accepts_query_token("/v1/sessions"));
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), None);
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  t0k "),
        );
        assert_eq!(bearer_token(&headers), Some("t0k"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dTpw"),
        );
        assert_eq!(bearer_token(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_token(&headers), None);
    }

    #[test]
    fn the_access_token_parameter_is_percent_decoded() {
        assert_eq!(
            query_token(Some("lastSeq=3&access_token=a%2Bb%3D")),
            Some("a+b=".into())
        );
        assert_eq!(query_token(Some("access_token=x+y")), Some("x y".into()));
        assert_eq!(
            query_token(Some("access_token=%zz%4")),
            Some("%zz%4".into())
        );
        assert_eq!(query_token(Some("lastSeq=3")), None);
        assert_eq!(query_token(None), None);
    }
}
