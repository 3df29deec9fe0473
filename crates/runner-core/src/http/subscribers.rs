//! How many event streams and terminal sockets one session and one client
//! may hold. Every subscriber holds a connection for as long as it lives;
//! without a cap one client could open streams until the service's
//! connection limit was reached, and then nobody else's request would be
//! served.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Uri};
use sha2::{Digest, Sha256};

use super::error::{ApiError, ErrorCode};
use crate::config::SubscriberLimits;
use crate::sync::lock;

/// Who a subscriber belongs to: the bearer token it presented (kept as a
/// digest), else the address it connects from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientKey {
    Token([u8; 32]),
    Address(IpAddr),
}

impl ClientKey {
    /// The key of a request: its token (`Authorization: Bearer`, or
    /// `?access_token=` where a browser cannot set headers) when it
    /// presents one, else the client address the server recorded (the peer,
    /// or the client a trusted proxy forwards for). `None`
    /// when neither is known (a request not served from a socket).
    pub fn of(headers: &HeaderMap, uri: &Uri, peer: Option<SocketAddr>) -> Option<Self> {
        let token = super::auth::bearer_token(headers)
            .map(str::to_owned)
            .or_else(|| super::auth::query_token(uri.query()))
            .filter(|token| !token.is_empty());
        match token {
            Some(token) => Some(ClientKey::Token(Sha256::digest(token.as_bytes()).into())),
            None => peer.map(|peer| ClientKey::Address(peer.ip())),
        }
    }

    /// The key of a request from its parts.
    pub fn of_parts(parts: &Parts) -> Option<Self> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| *peer);
        Self::of(&parts.headers, &parts.uri, peer)
    }
}

#[derive(Debug, Default)]
struct Counts {
    sessions: HashMap<String, usize>,
    clients: HashMap<ClientKey, usize>,
}

/// The subscribers open now, by session and by client.
#[derive(Debug, Clone, Default)]
pub struct SubscriberCounts(Arc<Mutex<Counts>>);

/// Why a subscriber was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscriberRefusal {
    #[error(
        "session '{session}' has its limit of {limit} subscribers open (event streams and terminal sockets; RUNNER_MAX_SUBSCRIBERS_PER_SESSION)"
    )]
    Session { session: String, limit: usize },
    #[error(
        "this client holds its limit of {limit} subscribers open across sessions (event streams and terminal sockets; RUNNER_MAX_SUBSCRIBERS_PER_CLIENT)"
    )]
    Client { limit: usize },
}

impl From<SubscriberRefusal> for ApiError {
    fn from(refusal: SubscriberRefusal) -> Self {
        ApiError::new(ErrorCode::TooManySubscribers, refusal.to_string())
    }
}

impl SubscriberCounts {
    /// A place for one more subscriber of `session` from `client`, held
    /// until the returned slot is dropped; refused past either cap.
    pub fn admit(
        &self,
        limits: SubscriberLimits,
        session: &str,
        client: Option<ClientKey>,
    ) -> Result<SubscriberSlot, SubscriberRefusal> {
        let mut counts = lock(&self.0);
        let on_session = counts.sessions.get(session).copied().unwrap_or(0);
        if on_session >= limits.per_session {
            return Err(SubscriberRefusal::Session {
                session: session.to_owned(),
                limit: limits.per_session,
            });
        }
        if let Some(client) = &client
            && counts.clients.get(client).copied().unwrap_or(0) >= limits.per_client
        {
            return Err(SubscriberRefusal::Client {
                limit: limits.per_client,
            });
        }
        *counts.sessions.entry(session.to_owned()).or_default() += 1;
        if let Some(client) = &client {
            *counts.clients.entry(client.clone()).or_default() += 1;
        }
        Ok(SubscriberSlot {
            counts: self.clone(),
            session: session.to_owned(),
            client,
        })
    }
}

/// One admitted subscriber; dropping it gives its place back.
#[derive(Debug)]
pub struct SubscriberSlot {
    counts: SubscriberCounts,
    session: String,
    client: Option<ClientKey>,
}

impl Drop for SubscriberSlot {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts.0);
        // Entries at zero are removed, so the maps hold only live keys.
        if let Some(count) = counts.sessions.get_mut(&self.session) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.sessions.remove(&self.session);
            }
        }
        if let Some(client) = &self.client
            && let Some(count) = counts.clients.get_mut(client)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.clients.remove(client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SubscriberLimits = SubscriberLimits {
        per_session: 2,
        per_client: 3,
    };

    fn address(last: u8) -> Option<ClientKey> {
        Some(ClientKey::Address(IpAddr::from([10, 0, 0, last])))
    }

    #[test]
    fn a_session_past_its_cap_is_refused_until_a_subscriber_leaves() {
        let counts = SubscriberCounts::default();
        let first = counts.admit(LIMITS, "s1", address(1)).unwrap();
        let _second = counts.admit(LIMITS, "s1", address(2)).unwrap();
        assert_eq!(
            counts.admit(LIMITS, "s1", address(3)).unwrap_err(),
            SubscriberRefusal::Session {
                session: "s1".into(),
                limit: 2
            }
        );
        drop(first);
        assert!(counts.admit(LIMITS, "s1", address(3)).is_ok());
    }

    #[test]
    fn a_client_past_its_cap_is_refused_on_any_session() {
        let counts = SubscriberCounts::default();
        let held: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|session| counts.admit(LIMITS, session, address(1)).unwrap())
            .collect();
        assert_eq!(
            counts.admit(LIMITS, "d", address(1)).unwrap_err(),
            SubscriberRefusal::Client { limit: 3 }
        );
        assert!(counts.admit(LIMITS, "d", address(2)).is_ok());
        drop(held);
        // Keys at zero are gone, so the map never outgrows who is connected.
        assert!(lock(&counts.0).clients.is_empty());
        assert!(lock(&counts.0).sessions.is_empty());
    }

    #[test]
    fn a_token_is_the_client_wherever_it_connects_from() {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::AUTHORIZATION,
            axum::http::HeaderValue::from_static("Bearer t0k"),
        );
        let uri: Uri = "/v1/sessions/s/events".parse().unwrap_or_default();
        let from_one = ClientKey::of(&headers, &uri, Some(SocketAddr::from(([10, 0, 0, 1], 1))));
        let query: Uri = "/v1/sessions/s/io?access_token=t0k"
            .parse()
            .unwrap_or_default();
        let from_two = ClientKey::of(
            &HeaderMap::new(),
            &query,
            Some(SocketAddr::from(([10, 0, 0, 2], 2))),
        );
        assert_eq!(from_one, from_two);
        assert!(matches!(from_one, Some(ClientKey::Token(_))));
        assert_eq!(ClientKey::of(&HeaderMap::new(), &uri, None), None);
    }
}
