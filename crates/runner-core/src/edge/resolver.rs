//! What the edge asks of the sessions: where one may be reached, and what
//! guards its ports.

use super::{EdgeRefusal, SessionHost};
use crate::reach::Reach;

/// Where a request for a session host goes: `port` of the session's own
/// workload, dialed at `reach`.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub reach: Reach,
    pub port: u16,
}

/// What keeps a session in use while a request or connection to it is
/// open through the edge.
pub type Hold = Box<dyn std::any::Any + Send + Sync>;

/// Where the edge may send a session's traffic: only the session's own
/// workload and a port it published.
#[async_trait::async_trait]
pub trait EdgeResolver: Send + Sync + 'static {
    async fn resolve(&self, host: &SessionHost) -> Result<Upstream, EdgeRefusal>;

    /// What [`Self::resolve`] gives when it can tell at once, without
    /// waiting (a running session), with the session's [`Self::hold`];
    /// `None` sends the edge to `resolve`.
    fn resolve_now(
        &self,
        _host: &SessionHost,
    ) -> Option<Result<(Upstream, Option<Hold>), EdgeRefusal>> {
        None
    }

    /// Whether this runner serves the session's traffic itself; `false`
    /// when another replica holds it (its traffic is forwarded there).
    fn serves_here(&self, _host: &SessionHost) -> bool {
        true
    }

    /// Something to keep while a request or upgraded connection to the
    /// session is open through the edge: the session counts as in use (not
    /// idle) for as long as it is held.
    fn hold(&self, _host: &SessionHost) -> Option<Hold> {
        None
    }

    /// Whether a workload token of the session guards `host.port` (then
    /// the port asks for access even on a public edge); `UnknownSession`
    /// or `Ended` for a session that is not there to guard anything.
    fn token_guarded(&self, _host: &SessionHost) -> Result<bool, EdgeRefusal> {
        Ok(false)
    }

    /// Whether `token` is a workload token that opens `host.port`.
    fn token_admits(&self, _host: &SessionHost, _token: &str) -> bool {
        false
    }

    /// Whether the session still lists share link `link_id` (a revoked
    /// link's passes and cookies open nothing).
    fn link_live(&self, _host: &SessionHost, _link_id: &str) -> bool {
        false
    }
}
