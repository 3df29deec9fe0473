//! `/v1/sessions/{id}/links`: share links, each opening one port of the
//! session through the edge to whoever holds its URL until it expires or
//! is revoked. Only those who may see the session may list, make or revoke
//! its links; a URL is shown to them and to no log.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use runner_api::validate::validate_new_link;
use serde::Serialize;

use super::body::read_json_body;
use super::error::{ApiError, ErrorCode};
use super::{AppState, PathParam};
use crate::audit::AuditAction;
use crate::edge::unix_now;
use crate::identity::Viewer;
use crate::session::links::{MAX_LINKS, ShareLink};

/// A link as the API shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkView {
    pub link_id: String,
    pub port: u16,
    pub url: String,
    pub expires_at: String,
    pub created_at: String,
}

impl From<ShareLink> for LinkView {
    fn from(link: ShareLink) -> Self {
        Self {
            link_id: link.id,
            port: link.port,
            url: link.url,
            expires_at: iso_of_unix(link.expires_at),
            created_at: link.created_at,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct LinkList {
    pub links: Vec<LinkView>,
}

fn iso_of_unix(seconds: u64) -> String {
    let at = i64::try_from(seconds)
        .ok()
        .and_then(|seconds| time::OffsetDateTime::from_unix_timestamp(seconds).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    crate::time::iso(at)
}

pub async fn create(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let wanted = validate_new_link(body)?;
    let session = super::visible_session(&state, &viewer, &id)?;
    let Some(preview) = state.registry.preview() else {
        return Err(ApiError::new(
            ErrorCode::EdgeDisabled,
            "share links need the session edge, which is off (RUNNER_PREVIEW_BASE_URL is unset)",
        ));
    };
    if session.is_terminal() {
        return Err(ApiError::new(
            ErrorCode::NotRunning,
            format!("session {id} has ended"),
        ));
    }
    if !session.publishes_tcp(wanted.port) {
        return Err(ApiError::new(
            ErrorCode::PortNotPublished,
            format!("session {id} does not publish tcp port {}", wanted.port),
        ));
    }
    let now = unix_now();
    let expires_at = now.saturating_add(wanted.ttl_seconds);
    let link_id = crate::ids::new_link_id();
    let link = ShareLink {
        url: preview.link_url(&link_id, &id, wanted.port, expires_at),
        id: link_id,
        port: wanted.port,
        expires_at,
        created_at: crate::time::iso_now(),
    };
    // A refused create is audited with its reason.
    let refuse = |code: ErrorCode, message: String| {
        super::audit_session(
            &state,
            AuditAction::LinkCreate,
            &viewer,
            &session,
            Some(message.clone()),
        );
        ApiError::new(code, message)
    };
    let too_many = || format!("session {id} already has {MAX_LINKS} share links; revoke one first");
    // Kept first, then made: a link the next runner would not know is
    // never handed out.
    let _change = session.links.change().await;
    let kept = session
        .links
        .with_added(&link, now)
        .map_err(|_| refuse(ErrorCode::TooManyLinks, too_many()))?;
    if let Err(reason) = keep_links(&state, &session, &kept).await {
        return Err(refuse(
            ErrorCode::LinksNotKept,
            format!("could not keep the new share link of session {id}: {reason}"),
        ));
    }
    // Room was made under the change lock; only a clock gone back could
    // take it.
    session
        .links
        .add(link.clone(), now)
        .map_err(|_| refuse(ErrorCode::TooManyLinks, too_many()))?;
    super::audit_session(&state, AuditAction::LinkCreate, &viewer, &session, None);
    Ok((StatusCode::CREATED, Json(LinkView::from(link))).into_response())
}

pub async fn list(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
) -> Result<Response, ApiError> {
    let session = super::visible_session(&state, &viewer, &id)?;
    let links = session
        .links
        .list(unix_now())
        .into_iter()
        .map(LinkView::from)
        .collect();
    Ok(Json(LinkList { links }).into_response())
}

pub async fn revoke(
    State(state): State<AppState>,
    params: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    viewer: Viewer,
) -> Result<Response, ApiError> {
    // A malformed escape gets the JSON envelope, as with every other route.
    let Path((id, link_id)) = params?;
    let session = super::visible_session(&state, &viewer, &id)?;
    // Kept first, then made: a revoked link never comes back with the next
    // runner.
    let _change = session.links.change().await;
    let Some(kept) = session.links.without(&link_id, unix_now()) else {
        return Err(ApiError::new(
            ErrorCode::LinkNotFound,
            format!("session {id} has no share link {link_id}"),
        ));
    };
    if let Err(reason) = keep_links(&state, &session, &kept).await {
        return Err(ApiError::new(
            ErrorCode::LinksNotKept,
            format!(
                "could not revoke share link {link_id} of session {id}: {reason}; it still opens"
            ),
        ));
    }
    session.links.revoke(&link_id);
    super::audit_session(&state, AuditAction::LinkRevoke, &viewer, &session, None);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Has the backend keep `links` as `session`'s whole list.
async fn keep_links(
    state: &AppState,
    session: &crate::session::Session,
    links: &[crate::session::links::KeptLink],
) -> Result<(), String> {
    state
        .registry
        .backend()
        .keep_links(&session.id, session.mode(), links)
        .await
}
