//! The simulated kube-apiserver: HTTP routing, authorization, fault
//! injection and request accounting in front of the registry.

pub mod attach;
pub mod authn;
pub mod authz;
pub mod discovery;
pub mod handlers;
pub mod logs;
pub mod openapi;
pub mod protobuf;
pub mod request;
pub mod table;
pub mod tls;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::errors::ApiError;
use crate::faults::{FaultCommand, Faults};
use crate::kubelet::Kubelet;
use crate::stats::StatsCollector;
use crate::storage::registry::Registry;
use crate::storage::store::Store;
use authz::{Attributes, Authorizer, Denial};

/// Everything a request handler can reach.
pub struct ApiContext {
    pub registry: Arc<Registry>,
    pub store: Arc<Store>,
    pub faults: Arc<Faults>,
    pub stats: Arc<StatsCollector>,
    pub authz: Arc<Authorizer>,
    pub kubelet: Arc<Kubelet>,
    pub gateway_api: bool,
    pub server_address: String,
    pub bookmark_interval: Duration,
    /// The longest an attach waits, after its upgrade was answered, before
    /// the container's stream is hooked up to it (see `attach`).
    pub attach_delay: Duration,
    /// What every request must present (`Authorization: Bearer …`).
    pub token: authn::BearerToken,
    pub shutdown: CancellationToken,
}

pub fn router(ctx: Arc<ApiContext>) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/version/", get(version))
        .route("/healthz", get(ok_text))
        .route("/livez", get(ok_text))
        .route("/readyz", get(ok_text))
        .route("/api", get(core_versions))
        .route("/api/", get(core_versions))
        .route("/apis", get(group_list))
        .route("/apis/", get(group_list))
        .route("/openapi/v2", get(openapi::v2))
        .route("/openapi/v3", get(openapi::v3_index))
        .route("/openapi/v3/{*path}", get(openapi::v3_document))
        .route("/_sim/stats", get(sim_stats))
        .route("/_sim/timeline", get(sim_timeline))
        .route(
            "/_sim/faults",
            get(sim_faults_get)
                .post(sim_faults_post)
                .delete(sim_faults_clear),
        )
        .route(
            "/_sim/rbac",
            get(sim_rbac_get).post(sim_rbac_post).delete(sim_rbac_clear),
        )
        .fallback(dispatch)
        // Outermost, so no route — health, discovery, the `/_sim` admin
        // routes, watches, upgrades — answers before the token is checked.
        .layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            authn::require_bearer,
        ))
        .with_state(ctx)
}

pub fn json_response(code: StatusCode, body: &Value) -> Response {
    bytes_response(code, body.to_string().into())
}

pub fn bytes_response(code: StatusCode, body: bytes::Bytes) -> Response {
    let mut resp = (code, Body::from(body)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

async fn version() -> Response {
    json_response(StatusCode::OK, &discovery::version())
}

async fn ok_text() -> &'static str {
    "ok"
}

async fn core_versions(State(ctx): State<Arc<ApiContext>>) -> Response {
    json_response(
        StatusCode::OK,
        &discovery::core_versions(&ctx.server_address),
    )
}

async fn group_list(State(ctx): State<Arc<ApiContext>>) -> Response {
    json_response(StatusCode::OK, &discovery::group_list(ctx.gateway_api))
}

async fn sim_stats(State(ctx): State<Arc<ApiContext>>) -> Response {
    let mut s = ctx.stats.snapshot();
    s.processes = ctx.kubelet.process_count();
    s.pods = ctx.store.read(|t| t.count(crate::kinds::pods()));
    json_response(StatusCode::OK, &json!(s))
}

async fn sim_timeline(State(ctx): State<Arc<ApiContext>>) -> Response {
    json_response(StatusCode::OK, &json!({ "pods": ctx.store.pod_timeline() }))
}

async fn sim_faults_get(State(ctx): State<Arc<ApiContext>>) -> Response {
    json_response(StatusCode::OK, &json!(ctx.faults.state()))
}

async fn sim_faults_post(State(ctx): State<Arc<ApiContext>>, body: bytes::Bytes) -> Response {
    match serde_json::from_slice::<FaultCommand>(&body) {
        Ok(cmd) => {
            ctx.faults.apply(cmd);
            json_response(StatusCode::OK, &json!(ctx.faults.state()))
        }
        Err(e) => ApiError::bad_request(format!("invalid fault command: {e}")).into_response(),
    }
}

async fn sim_faults_clear(State(ctx): State<Arc<ApiContext>>) -> Response {
    ctx.faults.clear();
    json_response(StatusCode::OK, &json!(ctx.faults.state()))
}

async fn sim_rbac_get(State(ctx): State<Arc<ApiContext>>) -> Response {
    json_response(StatusCode::OK, &json!(ctx.authz.denials()))
}

async fn sim_rbac_post(State(ctx): State<Arc<ApiContext>>, body: bytes::Bytes) -> Response {
    match serde_json::from_slice::<Denial>(&body) {
        Ok(d) => {
            ctx.authz.deny(d);
            json_response(StatusCode::OK, &json!(ctx.authz.denials()))
        }
        Err(e) => ApiError::bad_request(format!("invalid denial: {e}")).into_response(),
    }
}

async fn sim_rbac_clear(State(ctx): State<Arc<ApiContext>>) -> Response {
    ctx.authz.clear();
    json_response(StatusCode::OK, &json!([]))
}

/// Every `/api/...` and `/apis/...` request other than the root discovery
/// documents.
async fn dispatch(State(ctx): State<Arc<ApiContext>>, req: Request) -> Response {
    let latency = ctx.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // Group-version discovery documents.
    match segs.as_slice() {
        ["api", v] => {
            return match discovery::resource_list("", v, ctx.gateway_api) {
                Some(doc) => json_response(StatusCode::OK, &doc),
                None => ApiError::path_not_found().into_response(),
            };
        }
        ["apis", g] => {
            return match discovery::group(g, ctx.gateway_api) {
                Some(doc) => json_response(StatusCode::OK, &doc),
                None => ApiError::path_not_found().into_response(),
            };
        }
        ["apis", g, v] => {
            return match discovery::resource_list(g, v, ctx.gateway_api) {
                Some(doc) => json_response(StatusCode::OK, &doc),
                None => ApiError::path_not_found().into_response(),
            };
        }
        _ => {}
    }
    let target = match request::parse_path(&path, ctx.gateway_api) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let query = request::Query::from_uri(req.uri());
    let method = req.method().clone();
    let verb = request::verb(&method, &target, &query);
    let resource_label = target.resource_label();
    ctx.stats.count_request(verb, &resource_label);
    let info = target.res.info();
    if let Err(e) = ctx.authz.authorize(&Attributes {
        verb,
        group: info.group,
        resource: info.plural,
        subresource: target.subresource.as_deref(),
        namespace: target.namespace.as_deref(),
        name: target.name.as_deref(),
    }) {
        return e.into_response();
    }
    ctx.faults.pass_holds(verb, &resource_label).await;
    if let Some(err) = ctx.faults.take_failure(verb, &resource_label) {
        return err.into_response();
    }
    if method == Method::HEAD {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    handlers::handle(ctx, target, query, verb, req).await
}
