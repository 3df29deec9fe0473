//! The `/v1` HTTP surface: routes, SSE, WebSocket, CORS.

pub mod auth;
mod body;
mod cors;
mod error;
mod error_code;
pub mod idempotency;
mod links;
pub mod openapi;
mod peer;
mod peer_marks;
mod peer_socket;
mod routes;
mod sse;
pub mod subscribers;
mod watch;
mod ws;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::routing::{MethodRouter, delete, get, post, put};

pub use cors::{allow_origin, stream_allows_origin};
pub use error::{ApiError, ErrorCode};
use runner_api::io::FrameFormat;
use runner_api::types::RunnerTerms;

use crate::apps::AppCatalog;
use crate::auth::AuthTokens;
use crate::config::{CorsOrigins, SubscriberLimits};
use crate::registry::SessionRegistry;

/// Header carrying the version of the terms the user accepted.
pub const ACCEPTED_TERMS_HEADER: &str = "x-telo-accepted-terms";

/// Everything the routes need besides the registry.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Reported by `/v1/health`.
    pub version: String,
    pub cors: CorsOrigins,
    /// Resolved once, so the advertised and the enforced version never drift.
    pub terms: Option<RunnerTerms>,
    pub apps: AppCatalog,
    /// The runner's own `TELO_REGISTRY_URL`, passed to workloads.
    pub default_registry_url: Option<String>,
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive.
    pub body_timeout: std::time::Duration,
    /// Interval of the SSE heartbeat comment.
    pub sse_heartbeat: std::time::Duration,
    /// Bearer tokens `/v1` requires (`RUNNER_AUTH_TOKENS_FILE`); `None` = open.
    pub auth_tokens: Option<AuthTokens>,
    /// The layout of `/io` output frames (`RUNNER_IO_FRAMES`).
    pub io_frames: FrameFormat,
    /// Event streams and terminal sockets per session and per client.
    pub subscribers: SubscriberLimits,
}

#[derive(Clone)]
pub struct AppState {
    pub registry: SessionRegistry,
    pub options: Arc<ServerOptions>,
    /// Fired when the service is about to exit with sessions that live on
    /// (a successor adopts them): open streams end so their clients
    /// reconnect — a WebSocket with close code 1001 "going away", an event
    /// stream by ending — instead of being cut without a word.
    pub going_away: tokio_util::sync::CancellationToken,
    /// Every open terminal socket, so shutdown can let each send its close
    /// frame before the process exits.
    pub sockets: tokio_util::task::TaskTracker,
    /// The event streams and terminal sockets open now, counted against
    /// [`ServerOptions::subscribers`].
    pub subscribers: subscribers::SubscriberCounts,
    /// The `Idempotency-Key`s of session creations.
    pub idempotency: idempotency::IdempotencyKeys,
    /// Identities beyond static tokens, tiers, and the audit log.
    pub access: auth::Access,
}

/// When an open stream of one session must end for its client to reconnect
/// elsewhere: the whole service is going away, or this replica let go of
/// the session (another replica serves it now).
#[derive(Clone)]
pub(crate) struct Leaving {
    service: tokio_util::sync::CancellationToken,
    session: tokio_util::sync::CancellationToken,
}

impl Leaving {
    pub(crate) fn of(state: &AppState, session: &crate::session::Session) -> Self {
        Self {
            service: state.going_away.clone(),
            session: session.moved.clone(),
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.service.is_cancelled() || self.session.is_cancelled()
    }

    pub(crate) async fn cancelled(&self) {
        tokio::select! {
            () = self.service.cancelled() => {}
            () = self.session.cancelled() => {}
        }
    }
}

/// One route of the core router and the methods it answers.
pub struct ApiRoute {
    /// In axum's syntax, which is also OpenAPI's (`/v1/sessions/{id}`).
    pub path: &'static str,
    pub methods: &'static [&'static str],
    handler: fn() -> MethodRouter<AppState>,
}

/// Every route of the core router. The router is built from this list and the
/// OpenAPI document is generated from it, so a route added here without
/// documentation fails the OpenAPI tests.
pub static ROUTES: &[ApiRoute] = &[
    ApiRoute {
        path: "/livez",
        methods: &["GET"],
        handler: || get(routes::livez),
    },
    ApiRoute {
        path: "/readyz",
        methods: &["GET"],
        handler: || get(routes::readyz),
    },
    ApiRoute {
        path: "/metrics",
        methods: &["GET"],
        handler: || get(routes::metrics),
    },
    ApiRoute {
        path: "/internal/sessions/{id}/access",
        methods: &["GET"],
        handler: || get(routes::edge_access),
    },
    ApiRoute {
        path: "/v1/health",
        methods: &["GET"],
        handler: || get(routes::health),
    },
    ApiRoute {
        path: "/v1/capabilities",
        methods: &["GET"],
        handler: || get(routes::capabilities),
    },
    ApiRoute {
        path: "/v1/openapi.json",
        methods: &["GET"],
        handler: || get(openapi::openapi_json),
    },
    ApiRoute {
        path: "/v1/probe",
        methods: &["POST"],
        handler: || post(routes::probe),
    },
    ApiRoute {
        path: "/v1/sessions",
        methods: &["POST", "GET"],
        handler: || post(routes::create_session).get(routes::list_sessions),
    },
    ApiRoute {
        path: "/v1/apps/{name}/sessions",
        methods: &["POST"],
        handler: || post(routes::create_app_session),
    },
    ApiRoute {
        path: "/v1/sessions/{id}",
        methods: &["GET", "DELETE"],
        handler: || get(routes::get_session).delete(routes::delete_session),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/events",
        methods: &["GET"],
        handler: || get(sse::events),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/io",
        methods: &["GET"],
        handler: || get(ws::io),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/workspace",
        methods: &["GET", "POST"],
        handler: || get(watch::tree).post(watch::apply),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/workspace/file",
        methods: &["GET"],
        handler: || get(watch::read_file),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/reload",
        methods: &["POST"],
        handler: || post(watch::reload),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/apps",
        methods: &["PUT"],
        handler: || put(watch::set_apps),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/resume",
        methods: &["POST"],
        handler: || post(watch::resume),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/links",
        methods: &["POST", "GET"],
        handler: || post(links::create).get(links::list),
    },
    ApiRoute {
        path: "/v1/sessions/{id}/links/{link_id}",
        methods: &["DELETE"],
        handler: || delete(links::revoke),
    },
];

/// The `/v1` router plus any backend routes (`extra`), with CORS, the optional
/// bearer-token gate and the not-found answer applied to all of them; when
/// the backend runs replicas, a request for a session another replica holds
/// is served for it ([`peer`]).
pub fn router(state: AppState, extra: Router) -> Router {
    let cors_origins = Arc::new(state.options.cors.clone());
    let gate = auth::gate_is_on(&state).then(|| state.clone());
    let peers = state.registry.backend().replicas().map(|replicas| {
        Arc::new(peer::Peers::new(
            replicas,
            state.registry.clone(),
            state.going_away.clone(),
            state.sockets.clone(),
        ))
    });
    let v1 = ROUTES
        .iter()
        .fold(Router::new(), |v1, route| {
            v1.route(route.path, (route.handler)())
        })
        .with_state(state);
    // A known path with a method it does not answer is an unknown route too,
    // as in the reference (axum's own answer is a bodiless 405).
    let not_found = |request: Request| async move {
        ApiError::RouteNotFound {
            method: request.method().to_string(),
            uri: request.uri().to_string(),
        }
    };
    let mut app = v1
        .merge(extra)
        .fallback(not_found)
        .method_not_allowed_fallback(not_found);
    // Inside the gate: a request without a valid token causes no traffic
    // to a peer.
    if let Some(peers) = &peers {
        app = app.layer(axum::middleware::from_fn_with_state(
            peers.clone(),
            peer::serve_for_owner,
        ));
    }
    // Inside CORS, so a preflight is answered before the gate sees it.
    if let Some(state) = gate {
        app = app.layer(axum::middleware::from_fn_with_state(
            state,
            auth::require_token,
        ));
    }
    // Outside the gate, which then sees the client a peer forwards for.
    if let Some(peers) = peers {
        app = app.layer(axum::middleware::from_fn_with_state(
            peers,
            peer::identify_peer,
        ));
    }
    app.layer(axum::middleware::from_fn_with_state(
        cors_origins,
        cors::cors,
    ))
}

/// Session `id` as `viewer` may see it: another principal's session is
/// answered exactly as an unknown id is.
pub(crate) fn visible_session(
    state: &AppState,
    viewer: &crate::identity::Viewer,
    id: &str,
) -> Result<Arc<crate::session::Session>, ApiError> {
    state
        .registry
        .get(id)
        .filter(|session| viewer.may_see(session.owner()))
        .ok_or_else(|| ApiError::session_not_found(id))
}

/// One audit line about an action on `session` (`refused`: why it failed).
pub(crate) fn audit_session(
    state: &AppState,
    action: crate::audit::AuditAction,
    viewer: &crate::identity::Viewer,
    session: &crate::session::Session,
    failed: Option<String>,
) {
    use crate::audit::{AuditRecord, Outcome};
    if !state.access.audit.is_on() {
        return;
    }
    let principal = viewer.principal();
    let outcome = if failed.is_some() {
        Outcome::Failed
    } else {
        Outcome::Allowed
    };
    let mut record = AuditRecord::new(action, outcome)
        .by(principal)
        .session(session.id())
        .owned_by(principal, session.owner());
    if let Some(reason) = failed {
        record = record.reason(reason);
    }
    state.access.audit.record(record);
}

/// Path parameters longer than this never match a route.
pub const MAX_PARAM_LENGTH: usize = 100;

/// A path parameter such as a session id or an app name. axum refuses a
/// `%`-escape that does not decode to UTF-8 (`/v1/sessions/%ff`) with a
/// plain-text 400; this answers with the JSON envelope every other runner
/// error has, so a client can always read the message. One longer than
/// [`MAX_PARAM_LENGTH`] matches no route (404), as in the reference.
pub(crate) struct PathParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(value) = Path::<String>::from_request_parts(parts, state).await?;
        if value.len() > MAX_PARAM_LENGTH {
            return Err(ApiError::RouteNotFound {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
            });
        }
        Ok(Self(value))
    }
}

/// [`query_value`] trimmed, with an empty value counted as absent (how the
/// reference reads `?app=` and `?path=`).
pub(crate) fn trimmed_query(uri: &axum::http::Uri, key: &str) -> Option<String> {
    query_value(uri, key)
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// The first `key=` value of the query string, like the reference's parser
/// hands it to `parseInt` (a repeated key becomes an array whose string
/// form starts with the first value). A query string a typed extractor would
/// refuse counts as no value: resume points fall back, never fail a stream.
pub(crate) fn query_value(uri: &axum::http::Uri, key: &str) -> Option<String> {
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri).ok()?;
    pairs
        .into_iter()
        .find(|(name, _)| name == key)
        .map(|(_, value)| value)
}
