//! The `error` codes the runner writes on the wire, with the HTTP status
//! each is answered with. Clients branch on these strings: a variant's
//! [`ErrorCode::as_str`] never changes.
//!
//! The codes of the request rules shared with clients (an app set's
//! `invalid_app_name`, a telo version's `telo_version_unavailable`, ...)
//! come with their typed refusals from `runner_api` and are not repeated
//! here.

use axum::http::StatusCode;

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $code:literal => $status:ident,)*) => {
        /// A runner-authored wire error code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears in `error`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The status a response carrying this code has.
            pub const fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

error_codes! {
    /// No session of that id.
    NotFound = "not_found" => NOT_FOUND,
    /// No share link of that id on the session.
    LinkNotFound = "link_not_found" => NOT_FOUND,
    /// Share links need the session edge (`RUNNER_PREVIEW_BASE_URL`).
    EdgeDisabled = "edge_disabled" => CONFLICT,
    /// A share link for a port the session does not publish.
    PortNotPublished = "port_not_published" => BAD_REQUEST,
    /// The session holds as many share links as it may.
    TooManyLinks = "too_many_links" => CONFLICT,
    /// A share link change could not be kept where the session outlives
    /// the runner; nothing changed.
    LinksNotKept = "links_not_kept" => SERVICE_UNAVAILABLE,
    /// The body or query broke a request rule.
    InvalidRequest = "invalid_request" => BAD_REQUEST,
    InvalidJson = "invalid_json" => BAD_REQUEST,
    EmptyJsonBody = "empty_json_body" => BAD_REQUEST,
    PayloadTooLarge = "payload_too_large" => PAYLOAD_TOO_LARGE,
    RequestTimeout = "request_timeout" => REQUEST_TIMEOUT,
    UnsupportedMediaType = "unsupported_media_type" => UNSUPPORTED_MEDIA_TYPE,
    InvalidUrl = "invalid_url" => BAD_REQUEST,
    InternalError = "internal_error" => INTERNAL_SERVER_ERROR,
    /// The current terms were not accepted.
    TermsRequired = "terms_required" => PRECONDITION_REQUIRED,
    Unauthorized = "unauthorized" => UNAUTHORIZED,
    OriginNotAllowed = "origin_not_allowed" => FORBIDDEN,
    TooManyConnections = "too_many_connections" => SERVICE_UNAVAILABLE,
    TooManyConnectionsFromClient = "too_many_connections_from_client" => TOO_MANY_REQUESTS,
    TooManySubscribers = "too_many_subscribers" => TOO_MANY_REQUESTS,
    InvalidBundle = "invalid_bundle" => BAD_REQUEST,
    InvalidConfig = "invalid_config" => BAD_REQUEST,
    WatchDisabled = "watch_disabled" => BAD_REQUEST,
    AgentRequiresWatch = "agent_requires_watch" => BAD_REQUEST,
    UnknownAgent = "unknown_agent" => BAD_REQUEST,
    AgentPortUndeclared = "agent_port_undeclared" => BAD_REQUEST,
    IoUnsupported = "io_unsupported" => BAD_REQUEST,
    PortConflict = "port_conflict" => BAD_REQUEST,
    TooManySessions = "too_many_sessions" => CONFLICT,
    /// The principal's tenant is at a quota of its tier.
    QuotaExceeded = "quota_exceeded" => TOO_MANY_REQUESTS,
    /// The principal (or address) is past its tier's rate.
    RateLimited = "rate_limited" => TOO_MANY_REQUESTS,
    TooManyWatchSessions = "too_many_watch_sessions" => CONFLICT,
    /// No catalog app, or no app of the session, of that name.
    UnknownApp = "unknown_app" => NOT_FOUND,
    StopFailed = "stop_failed" => INTERNAL_SERVER_ERROR,
    NotAWatchSession = "not_a_watch_session" => CONFLICT,
    NotRunning = "not_running" => CONFLICT,
    ReloadRateLimited = "reload_rate_limited" => TOO_MANY_REQUESTS,
    SetAppsFailed = "set_apps_failed" => INTERNAL_SERVER_ERROR,
    NotSuspended = "not_suspended" => NOT_FOUND,
    NoCheckpoint = "no_checkpoint" => CONFLICT,
    /// A workspace path broke the bundle path rules or met a symbolic link.
    InvalidPath = "invalid_path" => BAD_REQUEST,
    NotAFile = "not_a_file" => BAD_REQUEST,
    InvalidEncoding = "invalid_encoding" => BAD_REQUEST,
    FileNotFound = "file_not_found" => NOT_FOUND,
    PathConflict = "path_conflict" => CONFLICT,
    WorkspaceTooLarge = "workspace_too_large" => PAYLOAD_TOO_LARGE,
    WorkspaceIoFailed = "workspace_io_failed" => INTERNAL_SERVER_ERROR,
    /// The workspace could not be reached or did not answer.
    WorkspaceFailed = "workspace_failed" => INTERNAL_SERVER_ERROR,
    /// An `Idempotency-Key` header that is no key.
    InvalidIdempotencyKey = "invalid_idempotency_key" => BAD_REQUEST,
    /// An `Idempotency-Key` already used with another request.
    IdempotencyKeyReused = "idempotency_key_reused" => UNPROCESSABLE_ENTITY,
    /// The first request with this `Idempotency-Key` is still being answered.
    IdempotencyKeyInFlight = "idempotency_key_in_flight" => CONFLICT,
    /// The replica that owns the session could not be reached; retry.
    ReplicaUnavailable = "replica_unavailable" => SERVICE_UNAVAILABLE,
    /// The session is being taken over from a replica that lapsed; retry.
    SessionMoving = "session_moving" => SERVICE_UNAVAILABLE,
    /// This replica may not change its sessions now (it has not renewed
    /// its lease); retry.
    ReplicaFenced = "replica_fenced" => SERVICE_UNAVAILABLE,
    /// The runner is shutting down and takes no new session; retry (another
    /// replica, or the next runner, takes it).
    ShuttingDown = "shutting_down" => SERVICE_UNAVAILABLE,
}

impl ErrorCode {
    /// Whether a client should simply ask again shortly: these answers
    /// carry `Retry-After: 1`.
    pub fn is_retry_soon(self) -> bool {
        matches!(
            self,
            Self::ReplicaUnavailable
                | Self::SessionMoving
                | Self::ReplicaFenced
                | Self::ShuttingDown
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// The strings clients already branch on, with their statuses: a
    /// renamed variant must not change what goes on the wire.
    const WIRE: &[(&str, u16)] = &[
        ("not_found", 404),
        ("link_not_found", 404),
        ("edge_disabled", 409),
        ("port_not_published", 400),
        ("too_many_links", 409),
        ("links_not_kept", 503),
        ("invalid_request", 400),
        ("invalid_json", 400),
        ("empty_json_body", 400),
        ("payload_too_large", 413),
        ("request_timeout", 408),
        ("unsupported_media_type", 415),
        ("invalid_url", 400),
        ("internal_error", 500),
        ("terms_required", 428),
        ("unauthorized", 401),
        ("origin_not_allowed", 403),
        ("too_many_connections", 503),
        ("too_many_connections_from_client", 429),
        ("too_many_subscribers", 429),
        ("invalid_bundle", 400),
        ("invalid_config", 400),
        ("watch_disabled", 400),
        ("agent_requires_watch", 400),
        ("unknown_agent", 400),
        ("agent_port_undeclared", 400),
        ("io_unsupported", 400),
        ("port_conflict", 400),
        ("too_many_sessions", 409),
        ("quota_exceeded", 429),
        ("rate_limited", 429),
        ("too_many_watch_sessions", 409),
        ("unknown_app", 404),
        ("stop_failed", 500),
        ("not_a_watch_session", 409),
        ("not_running", 409),
        ("reload_rate_limited", 429),
        ("set_apps_failed", 500),
        ("not_suspended", 404),
        ("no_checkpoint", 409),
        ("invalid_path", 400),
        ("not_a_file", 400),
        ("invalid_encoding", 400),
        ("file_not_found", 404),
        ("path_conflict", 409),
        ("workspace_too_large", 413),
        ("workspace_io_failed", 500),
        ("workspace_failed", 500),
        ("invalid_idempotency_key", 400),
        ("idempotency_key_reused", 422),
        ("idempotency_key_in_flight", 409),
        ("replica_unavailable", 503),
        ("session_moving", 503),
        ("replica_fenced", 503),
        ("shutting_down", 503),
    ];

    #[test]
    fn every_code_is_unique_and_is_todays_string_and_status() {
        let strings: HashSet<&str> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
        assert_eq!(strings.len(), ErrorCode::ALL.len(), "a code is repeated");
        let ours: Vec<(&str, u16)> = ErrorCode::ALL
            .iter()
            .map(|code| (code.as_str(), code.status().as_u16()))
            .collect();
        assert_eq!(ours, WIRE);
    }
}
