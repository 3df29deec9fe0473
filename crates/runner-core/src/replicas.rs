//! Several runner replicas serving one installation: which replica owns a
//! session, how a peer is reached, and the secret peers prove themselves
//! with. A backend that runs replicas (Kubernetes, with
//! `RUNNER_PEER_TOKEN_FILE`) implements [`Replicas`]; the HTTP layer uses it
//! to serve a request for a session another replica owns.

use std::fmt;
use std::sync::Arc;

/// The header a replica's call to a peer carries: the installation's peer
/// secret. A request with it is never forwarded again.
pub const PEER_TOKEN_HEADER: &str = "x-telo-runner-peer";

/// Another replica of this installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its `RUNNER_REPLICA_ID`.
    pub id: String,
    /// Its `RUNNER_REPLICA_URL`: `http://<pod IP>:<port>`.
    pub url: String,
}

/// Who serves a session now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No record names an owner: a session created a moment ago (its pod or
    /// record still on its way), or none at all.
    Here,
    /// The record names this replica: a session it holds, or one it has
    /// just claimed and is still adopting (not yet in its registry), for
    /// which a request is answered 503 with `Retry-After`.
    Recorded,
    /// A live peer: requests for the session are forwarded to it.
    Peer(Peer),
    /// A replica whose Lease has lapsed: its sessions are being taken over,
    /// so a request is answered 503 with `Retry-After` until a survivor
    /// holds the session.
    Moving {
        /// The replica the session was recorded with.
        from: String,
    },
}

/// The installation's shared secret for replica-to-replica calls.
#[derive(Clone)]
pub struct PeerToken(Arc<str>);

impl PeerToken {
    pub fn new(token: impl Into<Arc<str>>) -> Self {
        Self(token.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token (compared in constant time).
    pub fn matches(&self, presented: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        bool::from(self.0.as_bytes().ct_eq(presented))
    }
}

impl fmt::Debug for PeerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerToken(…)")
    }
}

/// What the core asks of a backend that runs several replicas.
pub trait Replicas: Send + Sync {
    /// This replica's id (`RUNNER_REPLICA_ID`), reported on every session
    /// it owns as `replica`.
    fn replica_id(&self) -> &str;

    /// Who owns `session_id` by the shared record (its pod or watch
    /// record); [`Owner::Here`] for a session no record names,
    /// [`Owner::Recorded`] for one it names this replica for.
    fn owner(&self, session_id: &str) -> Owner;

    /// The peers whose Leases are current.
    fn peers(&self) -> Vec<Peer>;

    /// [`Replicas::peers`] with any replica that started a moment ago,
    /// asked of the source of truth rather than of what this replica has
    /// seen so far (before saying that no replica holds a session).
    fn peers_now(&self) -> futures_util::future::BoxFuture<'_, Vec<Peer>> {
        Box::pin(std::future::ready(self.peers()))
    }

    /// The secret peers' calls carry.
    fn peer_token(&self) -> &PeerToken;

    /// Whether this replica may act as the owner of its sessions: false
    /// once it has gone too long without renewing its Lease (a peer may be
    /// about to take them over), true again once it renews.
    fn may_act(&self) -> bool;

    /// Counts up whenever the core should look again at what it holds:
    /// a peer's Lease lapsed (its sessions are to be taken over), or
    /// [`Replicas::may_act`] changed. `None`: nothing ever changes.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// The live sessions other replicas own, which count against the
    /// installation's limits (`RUNNER_MAX_SESSIONS`, the watch-session
    /// limit) beside this replica's own.
    fn elsewhere(&self) -> Elsewhere {
        Elsewhere::default()
    }
}

/// Live sessions owned by other replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Elsewhere {
    /// Every live session (watch sessions included).
    pub sessions: usize,
    /// Live watch sessions.
    pub watch_sessions: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_token_matches_only_itself() {
        let token = PeerToken::new("s3cret");
        assert!(token.matches(b"s3cret"));
        assert!(!token.matches(b"s3cre"));
        assert!(!token.matches(b"s3cret!"));
        assert!(!token.matches(b"S3cret"));
        assert_eq!(format!("{token:?}"), "PeerToken(…)");
    }
}
