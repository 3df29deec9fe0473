//! Bearer-token authentication: every request — API, watch, attach, logs,
//! discovery, health and the `/_sim` admin routes — must carry the token
//! this simulator wrote into its kubeconfig.
//!
//! The simulator listens on the loopback every local session shares, and
//! its kubelet runs pods as host processes: an open API lets any local
//! workload read the runner's Secrets and run a script on the host by
//! creating a pod. A real apiserver with anonymous access off answers
//! such a request `401 Unauthorized`, and so does kube-sim.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use subtle::ConstantTimeEq as _;

use super::ApiContext;
use crate::errors::ApiError;

/// Bytes of randomness in a token: as much as a service-account token's
/// signature carries, far beyond guessing over a socket.
const TOKEN_BYTES: usize = 32;

/// The bearer token of one simulator instance.
#[derive(Clone)]
pub struct BearerToken(Arc<str>);

impl BearerToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn random() -> Self {
        let bytes: [u8; TOKEN_BYTES] = rand::random();
        Self(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(bytes)
                .into(),
        )
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `value`, an `Authorization` header, presents this token. The
    /// comparison takes the same time wherever the first wrong byte is, so
    /// a local process cannot learn the token a byte at a time.
    pub fn admits(&self, value: &[u8]) -> bool {
        let Some(presented) = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
        else {
            return false;
        };
        presented.ct_eq(self.0.as_bytes()).into()
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// The middleware in front of every route.
pub async fn require_bearer(
    State(ctx): State<Arc<ApiContext>>,
    req: Request,
    next: Next,
) -> Response {
    let admitted = req
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|value| ctx.token.admits(value.as_bytes()));
    if !admitted {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_is_admitted() {
        let token = BearerToken::random();
        let header = format!("Bearer {}", token.as_str());
        assert!(token.admits(header.as_bytes()));
        assert!(token.admits(format!("bearer {}", token.as_str()).as_bytes()));
        assert!(!token.admits(token.as_str().as_bytes()), "no scheme");
        assert!(!token.admits(b"Bearer "), "empty");
        assert!(
            !token.admits(&header.as_bytes()[..header.len() - 1]),
            "prefix"
        );
        assert!(!token.admits(format!("{header}x").as_bytes()), "longer");
        assert!(!token.admits(format!("Basic {}", token.as_str()).as_bytes()));
    }

    #[test]
    fn each_simulator_gets_its_own_token() {
        let a = BearerToken::random();
        let b = BearerToken::random();
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.as_str().len(), 43, "32 bytes, base64url without padding");
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let token = BearerToken::random();
        assert!(!format!("{token:?}").contains(token.as_str()));
    }
}
