//! The session edge: with `RUNNER_PREVIEW_BASE_URL` set, a request whose
//! host is `<port>-<sessionId>.<base host>[:<base port>]` is forwarded to
//! that session's port, and anything else is the API's.
//!
//! [`PreviewBase::session_host`] tells the two apart (a malformed host under
//! the base is refused with 421, never forwarded); [`Edge::forward`] is a
//! reverse proxy over HTTP/1.1 (a kept client connection's own upstream
//! connections, polled on its task by [`Linked`], or else one pooled
//! client): bodies streamed both ways, upgrades (WebSocket) spliced,
//! hop-by-hop headers dropped, `X-Forwarded-*` added, ambiguous framing
//! refused, and each session bounded in what it may hold open. It sends a request only to the address
//! an [`EdgeResolver`] gives for the session and port, whatever the
//! request's target says.

mod access;
mod admit;
mod body;
mod config;
mod connector;
mod forward;
mod headers;
mod host;
mod link;
mod refusal;
mod resolver;

pub use access::{
    ACCESS_PARAM, AccessPolicy, COOKIE_TTL, Pass, PassKind, PreviewAccess, Signer, unix_now,
};
pub(crate) use body::RequestBody;
pub use config::{
    EDGE_SETTINGS, EdgeSettings, RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS,
    RUNNER_EDGE_IDLE_TIMEOUT_SECONDS, RUNNER_EDGE_MAX_CONNECTIONS_PER_SESSION,
    RUNNER_EDGE_RESPONSE_TIMEOUT_SECONDS, RUNNER_PREVIEW_ACCESS, RUNNER_PREVIEW_BASE_URL,
    RUNNER_PREVIEW_GRANT_TTL_SECONDS, RUNNER_PREVIEW_SIGNING_KEY_FILE,
    RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS, load_edge,
};
pub use forward::{Edge, EdgeConfig};
pub(crate) use forward::{
    X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, await_response, classify, joined, splice,
};
pub use headers::request_host;
pub(crate) use headers::{check_framing, strip_hop_by_hop, switched_head, upgrade_protocol};
pub use host::{PreviewBase, Scheme, SessionHost};
pub use link::{EdgeLink, Linked};
pub use refusal::{EdgeRefusal, prefers_html, refusal_response};
pub use resolver::{EdgeResolver, Hold, Upstream};

/// Marks a request for a session host that another replica serves: it goes
/// through the API router, whose replica layer forwards it to the owner,
/// untouched by the API's own CORS and bearer gate (the owner's edge checks
/// the session's access).
#[derive(Debug, Clone)]
pub(crate) struct ElsewhereSession(pub(crate) SessionHost);

impl PreviewBase {
    /// Which session host `request` is for: [`Self::session_host`] of its
    /// absolute-form authority or `Host` header; `Ok(None)` without either.
    pub fn route<B>(&self, request: &http::Request<B>) -> Result<Option<SessionHost>, EdgeRefusal> {
        match request_host(request) {
            Some(host) => self.session_host(&host),
            None => Ok(None),
        }
    }
}

/// The port label of a session's kernel inspection (`9230-<id>.<host>`),
/// as the reference runner names it: served through the edge when the
/// session runs with `inspect` and no app of it publishes that port.
pub const INSPECT_PORT: u16 = 9230;

/// What a session needs of the edge to report its URLs: where session
/// hosts live and who may pass.
#[derive(Debug, Clone)]
pub struct Preview {
    pub base: PreviewBase,
    pub policy: AccessPolicy,
}

impl Preview {
    /// The URL of `session_id`'s `port` as reported to those who may see
    /// the session: with a grant when the port asks for access (`guarded`:
    /// a workload token guards it).
    pub fn reported_url(&self, session_id: &str, port: u16, guarded: bool) -> String {
        let url = self.base.session_url(session_id, port);
        if self.policy.access == PreviewAccess::Public && !guarded {
            return url;
        }
        let grant = self.policy.grant(session_id, port, unix_now());
        access::with_access(&url, &grant)
    }

    /// A share link's URL: `id`, for `session_id`'s `port`, until
    /// `expires_at` (unix seconds).
    pub fn link_url(&self, id: &str, session_id: &str, port: u16, expires_at: u64) -> String {
        let pass = Pass {
            kind: PassKind::Link { id: id.to_owned() },
            session_id: session_id.to_owned(),
            port,
            expires_at,
        };
        access::with_access(
            &self.base.session_url(session_id, port),
            &self.policy.signer.sign(&pass),
        )
    }
}
