//! The routes of a watch session (docs/contract.md §7.3): its workspace tree,
//! one file, a change set, a manual reload, a new app set, and resume.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use runner_api::bundle_path::normalize_bundle_path;
use runner_api::validate::{validate_change_set, validate_set_apps};
use runner_api::watch::{AppsChanged, Reloaded, Resumed, RunTrigger, SessionMode, resolve_apps};

use super::body::read_json_body;
use super::error::ApiError;
use super::{AppState, PathParam, trimmed_query};
use crate::registry::{ResumeError, SetAppsError};
use crate::session::Session;
use crate::workload::{WatchWorkload, WorkspaceFailure};

const NO_LIVE_WORKSPACE: &str = "session has no live workspace";
const NO_LIVE_WORKLOAD: &str = "session has no live workload";

/// The session, if it is a watch session (`404`, `409 not_a_watch_session`).
fn watch_session(state: &AppState, id: &str) -> Result<Arc<Session>, ApiError> {
    let session = state
        .registry
        .get(id)
        .ok_or_else(|| ApiError::session_not_found(id))?;
    if session.mode() != SessionMode::Watch {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_a_watch_session",
            "this surface exists only on a watch session",
        ));
    }
    Ok(session)
}

fn not_running(message: &'static str) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "not_running", message)
}

fn live_workload(
    session: &Session,
    message: &'static str,
) -> Result<Arc<dyn WatchWorkload>, ApiError> {
    session.watch_workload().ok_or_else(|| not_running(message))
}

fn workspace_error(failure: WorkspaceFailure) -> ApiError {
    let status = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    ApiError::new(status, failure.code, failure.message)
}

fn invalid_path(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_path", message)
}

/// A workspace path: the bundle path rules, and — beyond them, which
/// normalize a leading `/` away — no absolute path, so a client never
/// believes it wrote `/etc/passwd`.
fn workspace_path(path: &str) -> Result<String, ApiError> {
    let invalid = || invalid_path(format!("invalid bundle relativePath '{path}'"));
    if path.starts_with('/') {
        return Err(invalid());
    }
    normalize_bundle_path(path).map_err(|_| invalid())
}

/// One slot of the session's reload budget, or `429` naming `what`.
fn spend_budget(state: &AppState, session: &Session, what: &str) -> Result<(), ApiError> {
    let limit = state.registry.limits().watch.reload_limit;
    let admitted = session
        .reload_budget()
        .is_some_and(|budget| budget.admit(limit));
    if admitted {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "reload_rate_limited",
            format!("more than {limit} {what} in the last minute"),
        ))
    }
}

pub async fn tree(
    State(state): State<AppState>,
    PathParam(id): PathParam,
) -> Result<Response, ApiError> {
    let session = watch_session(&state, &id)?;
    let workload = live_workload(&session, NO_LIVE_WORKSPACE)?;
    let tree = workload.tree().await.map_err(workspace_error)?;
    Ok(Json(tree).into_response())
}

pub async fn read_file(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    uri: Uri,
) -> Result<Response, ApiError> {
    let session = watch_session(&state, &id)?;
    let workload = live_workload(&session, NO_LIVE_WORKSPACE)?;
    let path = trimmed_query(&uri, "path").ok_or_else(|| invalid_path("?path= is required"))?;
    let path = workspace_path(&path)?;
    let file = workload.read_file(&path).await.map_err(workspace_error)?;
    Ok(Json(file).into_response())
}

pub async fn apply(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let changes = validate_change_set(body)
        .map_err(|err| ApiError::bad_request("invalid_request", err.message))?;
    let session = watch_session(&state, &id)?;
    spend_budget(&state, &session, "workspace writes")?;
    let workload = live_workload(&session, NO_LIVE_WORKSPACE)?;
    let paths = changes
        .write
        .iter()
        .map(|write| write.path.as_str())
        .chain(changes.delete.iter().map(String::as_str));
    for path in paths {
        workspace_path(path)?;
    }
    let applied = workload.apply(changes).await.map_err(workspace_error)?;
    Ok(Json(applied).into_response())
}

pub async fn reload(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    uri: Uri,
) -> Result<Response, ApiError> {
    let session = watch_session(&state, &id)?;
    let workload = live_workload(&session, NO_LIVE_WORKLOAD)?;
    spend_budget(&state, &session, "reloads")?;
    let apps = session.app_names();
    let targets = match trimmed_query(&uri, "app") {
        Some(app) if apps.contains(&app) => vec![app],
        Some(app) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_app",
                format!("session runs no app named '{app}'"),
            ));
        }
        None => apps,
    };
    session.attribute_next_run(Some(&targets), RunTrigger::Manual);
    for app in &targets {
        workload.reload(app).await.map_err(workspace_error)?;
    }
    Ok((StatusCode::ACCEPTED, Json(Reloaded { reloaded: targets })).into_response())
}

pub async fn set_apps(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let apps = validate_set_apps(body)
        .map_err(|err| ApiError::bad_request("invalid_request", err.message))?;
    let session = watch_session(&state, &id)?;
    live_workload(&session, NO_LIVE_WORKLOAD)?;
    let apps = resolve_apps(Some(apps), || {
        unreachable!("PUT /apps always names its apps")
    })
    .map_err(|refusal| ApiError::bad_request(refusal.code, refusal.message))?;
    // The session's agent keeps its port: a new app set that declares it
    // is refused (the manifest won the clash when the session began; an
    // agent already running is not dropped under a client's feet).
    let agent = session
        .watch_state()
        .and_then(|watch| watch.spec.agent.clone());
    if let Some(agent) = agent
        && let Some(owner) = super::routes::tcp_owner(&apps, agent.port)
    {
        return Err(ApiError::bad_request(
            "port_conflict",
            format!(
                "app '{owner}' declares tcp port {}, which this session's co-resident agent '{}' listens on",
                agent.port, agent.name
            ),
        ));
    }
    let mut apps = apps;
    let versions = super::telo::check_versions(
        state.registry.backend().as_ref(),
        None,
        true,
        &apps,
        SessionMode::Watch,
    )
    .map_err(ApiError::Telo)?;
    super::telo::pin_versions(&mut apps, versions.as_deref());
    super::routes::check_io(&state, &apps, true)?;
    // An app-set change restarts every kernel of the session: it spends the
    // reload budget as a reload does (a refused request spends nothing).
    spend_budget(
        &state,
        &session,
        "reloads, workspace writes and app set changes",
    )?;
    match state.registry.set_apps(&session, apps).await {
        Ok(names) => Ok((StatusCode::ACCEPTED, Json(AppsChanged { apps: names })).into_response()),
        Err(SetAppsError::NotRunning) => Err(not_running(NO_LIVE_WORKLOAD)),
        Err(SetAppsError::Failed(message)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "set_apps_failed",
            message,
        )),
    }
}

pub async fn resume(
    State(state): State<AppState>,
    PathParam(id): PathParam,
) -> Result<Response, ApiError> {
    match state.registry.resume(&id).await {
        Ok(()) => Ok((StatusCode::ACCEPTED, Json(Resumed { session_id: id })).into_response()),
        Err(err @ ResumeError::NotSuspended(_)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_suspended",
            err.to_string(),
        )),
        Err(err @ ResumeError::NoCheckpoint) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_checkpoint",
            err.to_string(),
        )),
    }
}
