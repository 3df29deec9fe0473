//! The `/v1` HTTP surface: routes, SSE, WebSocket, CORS.

mod body;
mod cors;
mod error;
mod routes;
mod sse;
mod ws;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::routing::{get, post};

pub use cors::{allow_origin, stream_allows_origin};
pub use error::ApiError;

use crate::apps::AppCatalog;
use crate::config::CorsOrigins;
use crate::registry::SessionRegistry;
use crate::types::RunnerTerms;

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
    /// Interval of the SSE heartbeat comment.
    pub sse_heartbeat: std::time::Duration,
}

#[derive(Clone)]
pub struct AppState {
    pub registry: SessionRegistry,
    pub options: Arc<ServerOptions>,
}

/// The `/v1` router plus any backend routes (`extra`), with CORS and the
/// not-found answer applied to all of them.
pub fn router(state: AppState, extra: Router) -> Router {
    let cors_origins = Arc::new(state.options.cors.clone());
    let v1 = Router::new()
        .route("/livez", get(routes::livez))
        .route("/readyz", get(routes::readyz))
        .route("/v1/health", get(routes::health))
        .route("/v1/capabilities", get(routes::capabilities))
        .route("/v1/probe", post(routes::probe))
        .route(
            "/v1/sessions",
            post(routes::create_session).get(routes::list_sessions),
        )
        .route("/v1/apps/{name}/sessions", post(routes::create_app_session))
        .route(
            "/v1/sessions/{id}",
            get(routes::get_session).delete(routes::delete_session),
        )
        .route("/v1/sessions/{id}/events", get(sse::events))
        .route("/v1/sessions/{id}/io", get(ws::io))
        .with_state(state);
    v1.merge(extra)
        .fallback(|request: Request| async move {
            ApiError::RouteNotFound {
                method: request.method().to_string(),
                uri: request.uri().to_string(),
            }
        })
        .layer(axum::middleware::from_fn_with_state(
            cors_origins,
            cors::cors,
        ))
}

/// Path parameters longer than this never match a route.
const MAX_PARAM_LENGTH: usize = 100;

fn check_param(method: &str, uri: &axum::http::Uri, value: &str) -> Result<(), ApiError> {
    if value.len() > MAX_PARAM_LENGTH {
        return Err(ApiError::RouteNotFound {
            method: method.to_owned(),
            uri: uri.to_string(),
        });
    }
    Ok(())
}
