//! The gate in front of `/v1`: on with `RUNNER_AUTH_TOKENS_FILE`,
//! `RUNNER_OIDC_ISSUER` or `RUNNER_ANONYMOUS`. It turns a request into a
//! [`Principal`] — a static token's, a verified JWT's, or in anonymous mode
//! the client address's — takes a token from its `requestsPerMinute`
//! bucket, and hands the principal to the routes as a [`Viewer`]. A refusal
//! is a `401` naming why (and an audit line), or a `429 rate_limited`.
//!
//! Browsers cannot put headers on a WebSocket or an `EventSource`, so those
//! two routes also take the token as `?access_token=`. A refused WebSocket is
//! still upgraded and then closed with 4401: a refused upgrade shows up in a
//! browser only as 1006, which clients retry forever.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocketUpgrade};
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::{ApiError, ErrorCode};
use crate::audit::{AuditAction, AuditLog, AuditRecord, Outcome};
use crate::identity::{BearerVerifier, Principal, PrincipalSource, Viewer};
use crate::tenancy::Tenancy;

/// Who may use the runner and under which limits: the JWT verifier, the
/// tiers and the audit log (the static tokens are in `ServerOptions`).
#[derive(Clone)]
pub struct Access {
    pub jwt: Option<Arc<dyn BearerVerifier>>,
    pub tenancy: Tenancy,
    pub audit: Arc<AuditLog>,
}

impl Default for Access {
    fn default() -> Self {
        Self {
            jwt: None,
            tenancy: Tenancy::unlimited(),
            audit: Arc::new(AuditLog::off()),
        }
    }
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("jwt", &self.jwt.is_some())
            .field("anonymous", &self.tenancy.is_anonymous())
            .field("audit", &self.audit)
            .finish()
    }
}

/// The viewer of a request: the principal the gate put there, else
/// everyone (a runner without authentication).
impl<S: Send + Sync> FromRequestParts<S> for Viewer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(viewer_of(&parts.extensions))
    }
}

/// The viewer the gate recorded in a request's extensions.
pub(crate) fn viewer_of(extensions: &axum::http::Extensions) -> Viewer {
    extensions
        .get::<Principal>()
        .cloned()
        .map_or(Viewer::Everyone, Viewer::Principal)
}

/// The client address the server recorded for a request (the peer, or the
/// client a trusted proxy forwards for).
pub fn client_address(parts_extensions: &axum::http::Extensions) -> Option<IpAddr> {
    parts_extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip().to_canonical())
}

/// Close code of a WebSocket refused for a missing or wrong token.
pub use runner_api::io::CLOSE_UNAUTHORIZED;
/// Query parameter carrying the token where headers cannot be set.
pub const ACCESS_TOKEN_PARAM: &str = "access_token";
/// Routes anyone may call even with auth on: discovery, so a client can learn
/// that it needs a token.
const OPEN_V1_PATHS: &[&str] = &["/v1/health", CAPABILITIES_PATH];
const CAPABILITIES_PATH: &str = "/v1/capabilities";

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

/// Whether the gate runs at all: some form of identity is configured.
pub fn gate_is_on(state: &AppState) -> bool {
    state.options.auth_tokens.is_some()
        || state.access.jwt.is_some()
        || state.access.tenancy.is_anonymous()
}

pub async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    // A session's own traffic, on its way to the replica that serves it:
    // the owner's edge checks the session's access, not the API's tokens.
    if request
        .extensions()
        .get::<crate::edge::ElsewhereSession>()
        .is_some()
    {
        return next.run(request).await;
    }
    let path = request.uri().path();
    if !requires_token(path) {
        // Discovery is open, but tells a client that shows who it is its
        // own limits.
        if path == CAPABILITIES_PATH {
            let address = client_address(request.extensions());
            let presented = presented_token(&request);
            if (presented.is_some() || state.access.tenancy.is_anonymous())
                && let Ok(principal) = identify(&state, presented, address).await
            {
                request.extensions_mut().insert(principal);
            }
        }
        return next.run(request).await;
    }
    let address = client_address(request.extensions());
    let presented = presented_token(&request);
    let principal = match identify(&state, presented, address).await {
        Ok(principal) => principal,
        Err(reason) => {
            state.registry.metrics().access_refused("unauthorized");
            state.access.audit.record(
                AuditRecord::new(AuditAction::AuthRefused, Outcome::Refused)
                    .from_address(address)
                    .reason(reason.clone()),
            );
            if is_io_socket(request.uri().path()) {
                return refuse_socket(request).await;
            }
            return unauthorized(&reason);
        }
    };
    // A peer's forwarded call was charged by the replica the client
    // reached; charging it again here would halve the client's budget.
    let forwarded = request
        .extensions()
        .get::<super::peer::FromPeer>()
        .is_some();
    if !forwarded && let Err(refusal) = state.access.tenancy.take_request(&principal) {
        state.registry.metrics().access_refused("rate_limited");
        state.access.audit.record(
            AuditRecord::new(AuditAction::RateLimited, Outcome::Refused)
                .by(Some(&principal))
                .from_address(address)
                .reason(refusal.to_string()),
        );
        return ApiError::from(refusal).into_response();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The bearer token a request presents: its `Authorization` header, or
/// `?access_token=` on the stream routes.
fn presented_token(request: &Request) -> Option<String> {
    let from_query = if accepts_query_token(request.uri().path()) {
        query_token(request.uri().query())
    } else {
        None
    };
    bearer_token(request.headers())
        .map(str::to_owned)
        .or(from_query)
}

/// The principal of a request, or why it has none.
async fn identify(
    state: &AppState,
    presented: Option<String>,
    address: Option<IpAddr>,
) -> Result<Principal, String> {
    let tenancy = &state.access.tenancy;
    if tenancy.is_anonymous() {
        let address = address.ok_or_else(|| "the request has no client address".to_owned())?;
        return Ok(Principal::anonymous(address));
    }
    let Some(presented) = presented else {
        return Err("no bearer token was presented".into());
    };
    let mut jwt_refusal = None;
    if let Some(jwt) = &state.access.jwt
        && jwt.recognizes(&presented)
    {
        match jwt.verify(&presented).await {
            Ok(verified) => {
                let admin = tenancy.is_admin_group(&verified.groups);
                return Ok(Principal {
                    subject: format!("oidc:{}", verified.subject),
                    tenant: verified.tenant,
                    groups: verified.groups,
                    admin,
                    source: PrincipalSource::Oidc,
                });
            }
            // A static token may have a JWT's shape: the file decides.
            Err(reason) => jwt_refusal = Some(reason),
        }
    }
    let identity = state
        .options
        .auth_tokens
        .as_ref()
        .and_then(|tokens| tokens.identify(&presented))
        .ok_or_else(|| {
            jwt_refusal
                .unwrap_or_else(|| "the bearer token is not one this runner accepts".to_owned())
        })?;
    Ok(Principal {
        subject: format!("token:{}", identity.name),
        tenant: identity.tenant.clone(),
        groups: identity.groups.clone(),
        admin: identity.admin || tenancy.is_admin_group(&identity.groups),
        source: PrincipalSource::StaticToken,
    })
}

fn unauthorized(reason: &str) -> Response {
    let mut response = ApiError::new(
        ErrorCode::Unauthorized,
        format!("this runner requires `Authorization: Bearer <token>`: {reason}"),
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
        return unauthorized("no bearer token was presented");
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
