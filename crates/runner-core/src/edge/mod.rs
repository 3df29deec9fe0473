//! The session edge: with `RUNNER_PREVIEW_BASE_URL` set, a request whose
//! host is `<port>-<sessionId>.<base host>[:<base port>]` is forwarded to
//! that session's port, and anything else is the API's.
//!
//! [`PreviewBase::session_host`] tells the two apart (a malformed host under
//! the base is refused with 421, never forwarded); [`Edge::forward`] is a
//! reverse proxy over one pooled HTTP/1.1 client: bodies streamed both ways,
//! upgrades (WebSocket) spliced, hop-by-hop headers dropped,
//! `X-Forwarded-*` added, ambiguous framing refused, and each session
//! bounded in what it may hold open. It sends a request only to the address
//! an [`EdgeResolver`] gives for the session and port, whatever the
//! request's target says.

mod config;
mod forward;
mod headers;
mod host;
mod refusal;

pub use config::{
    EDGE_SETTINGS, RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS, RUNNER_EDGE_IDLE_TIMEOUT_SECONDS,
    RUNNER_EDGE_MAX_CONNECTIONS_PER_SESSION, RUNNER_EDGE_RESPONSE_TIMEOUT_SECONDS,
    RUNNER_PREVIEW_BASE_URL, RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS, load_edge,
};
pub use forward::{Edge, EdgeConfig, EdgeResolver};
pub use headers::request_host;
pub use host::{PreviewBase, Scheme, SessionHost};
pub use refusal::{EdgeRefusal, prefers_html, refusal_response};

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
