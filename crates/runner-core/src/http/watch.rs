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
use runner_api::watch::{AppsChanged, Reloaded, Resumed, RunTrigger, SessionMode};

use super::body::read_json_body;
use super::error::{ApiError, ErrorCode};
use super::{AppState, PathParam, trimmed_query};
use crate::admission;
use crate::audit::AuditAction;
use crate::backend_session::WatchWorkload;
use crate::identity::Viewer;
use crate::session::Session;

const NO_LIVE_WORKSPACE: &str = "session has no live workspace";
const NO_LIVE_WORKLOAD: &str = "session has no live workload";

/// The session, if it is a watch session (`404`, `409 not_a_watch_session`).
fn watch_session(state: &AppState, viewer: &Viewer, id: &str) -> Result<Arc<Session>, ApiError> {
    let session = super::visible_session(state, viewer, id)?;
    if session.mode() != SessionMode::Watch {
        return Err(ApiError::new(
            ErrorCode::NotAWatchSession,
            "this surface exists only on a watch session",
        ));
    }
    Ok(session)
}

fn not_running(message: &'static str) -> ApiError {
    ApiError::new(ErrorCode::NotRunning, message)
}

fn live_workload(
    session: &Session,
    message: &'static str,
) -> Result<Arc<dyn WatchWorkload>, ApiError> {
    session.watch_workload().ok_or_else(|| not_running(message))
}

fn invalid_path(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidPath, message)
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
            ErrorCode::ReloadRateLimited,
            format!("more than {limit} {what} in the last minute"),
        ))
    }
}

pub async fn tree(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
) -> Result<Response, ApiError> {
    let session = watch_session(&state, &viewer, &id)?;
    let workload = live_workload(&session, NO_LIVE_WORKSPACE)?;
    let tree = workload.tree().await?;
    Ok(Json(tree).into_response())
}

pub async fn read_file(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
    uri: Uri,
) -> Result<Response, ApiError> {
    let session = watch_session(&state, &viewer, &id)?;
    let workload = live_workload(&session, NO_LIVE_WORKSPACE)?;
    let path = trimmed_query(&uri, "path").ok_or_else(|| invalid_path("?path= is required"))?;
    let path = workspace_path(&path)?;
    let file = workload.read_file(&path).await?;
    Ok(Json(file).into_response())
}

pub async fn apply(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let changes = validate_change_set(body)?;
    let session = watch_session(&state, &viewer, &id)?;
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
    let applied = workload.apply(changes).await?;
    Ok(Json(applied).into_response())
}

pub async fn reload(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
    uri: Uri,
) -> Result<Response, ApiError> {
    let session = watch_session(&state, &viewer, &id)?;
    let workload = live_workload(&session, NO_LIVE_WORKLOAD)?;
    spend_budget(&state, &session, "reloads")?;
    let apps = session.app_names();
    let targets = match trimmed_query(&uri, "app") {
        Some(app) if apps.contains(&app) => vec![app],
        Some(app) => {
            return Err(ApiError::new(
                ErrorCode::UnknownApp,
                format!("session runs no app named '{app}'"),
            ));
        }
        None => apps,
    };
    session.attribute_next_run(Some(&targets), RunTrigger::Manual);
    for app in &targets {
        workload.reload(app).await?;
    }
    Ok((StatusCode::ACCEPTED, Json(Reloaded { reloaded: targets })).into_response())
}

pub async fn set_apps(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let apps = validate_set_apps(body)?;
    let session = watch_session(&state, &viewer, &id)?;
    live_workload(&session, NO_LIVE_WORKLOAD)?;
    let agent = session
        .watch_state()
        .and_then(|watch| watch.spec.agent.clone());
    let backend = state.registry.backend();
    let apps =
        admission::admit_app_set(&super::routes::offer(&state, backend), apps, agent.as_ref())?;
    // An app-set change restarts every kernel of the session: it spends the
    // reload budget as a reload does (a refused request spends nothing).
    spend_budget(
        &state,
        &session,
        "reloads, workspace writes and app set changes",
    )?;
    let changed = state.registry.set_apps(&session, apps).await;
    super::audit_session(
        &state,
        AuditAction::SessionApps,
        &viewer,
        &session,
        changed.as_ref().err().map(ToString::to_string),
    );
    let names = changed?;
    Ok((StatusCode::ACCEPTED, Json(AppsChanged { apps: names })).into_response())
}

pub async fn resume(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
) -> Result<Response, ApiError> {
    // Another principal's session is refused as an unknown id is.
    let Ok(session) = super::visible_session(&state, &viewer, &id) else {
        return Err(crate::registry::ResumeError::NotSuspended(id).into());
    };
    let principal = viewer.principal();
    let limits = principal
        .filter(|_| state.access.tenancy.has_tiers())
        .map(|principal| state.access.tenancy.limits_of(principal).1);
    let resumed = state.registry.resume_for(&id, limits.as_ref()).await;
    if matches!(resumed, Err(crate::registry::ResumeError::QuotaExceeded(_))) {
        state.registry.metrics().access_refused("quota_exceeded");
    }
    super::audit_session(
        &state,
        AuditAction::SessionResume,
        &viewer,
        &session,
        resumed.as_ref().err().map(ToString::to_string),
    );
    resumed?;
    Ok((StatusCode::ACCEPTED, Json(Resumed { session_id: id })).into_response())
}
