//! The JSON routes of `/v1`.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use runner_api::io::FrameFormat;
use runner_api::types::{
    ConfigSurface, RunBundle, RunnerCapabilities, SessionConfig, SessionCreated,
};
use runner_api::validate::{validate_app_session, validate_probe, validate_start_session};
use serde_json::{Value, json};

use super::body::{off_the_runtime_when, read_json_body};

/// Bundles with more files than this are checked on the blocking pool.
const LARGE_BUNDLE_FILES: usize = 256;
use super::error::{ApiError, ErrorCode};
use super::idempotency::{self, Claim, Fingerprint};
use super::{ACCEPTED_TERMS_HEADER, AppState, PathParam, ServerOptions};
use crate::admission::{self, Admitted, Offer};
use crate::audit::{AuditAction, AuditRecord, Outcome};
use crate::backend::{Backend, ProbeConfig, StartSpec, WatchSpec};
use crate::identity::Viewer;
use crate::metrics::METRICS_CONTENT_TYPE;
use crate::registry::{AdmissionError, Claimant, SessionKind};
use crate::session::EdgeAccess;
use runner_api::telo::SUPERSEDED_BY_TELO;

pub async fn health(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "ok": true, "version": state.options.version }))
}

/// The process is alive and serving.
pub async fn livez() -> Json<Value> {
    Json(json!({ "ok": true }))
}

/// Ready for traffic: sessions left by a previous runner have been adopted,
/// and the backend can serve (for a cluster: the apiserver answers and the
/// shared informers are synced). A 503 names every unmet condition.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let mut waiting = state.registry.backend().readiness().waiting;
    if !state.registry.is_recovered() {
        waiting.push("adoption of sessions from a previous runner".to_owned());
    }
    if waiting.is_empty() {
        Json(json!({ "ready": true })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "ready": false, "waiting": waiting })),
        )
            .into_response()
    }
}

/// Prometheus metrics (OpenMetrics text).
pub async fn metrics(State(state): State<AppState>) -> Response {
    match state.registry.encode_metrics() {
        Ok(text) => (
            [(axum::http::header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// With a principal (a valid token presented, or anonymous mode) the answer
/// adds `limits`: its tier, the tier's limits and what its tenant uses now.
pub async fn capabilities(State(state): State<AppState>, viewer: Viewer) -> Json<Value> {
    let mut answer = json!(runner_capabilities(&state));
    if let Some(principal) = viewer.principal() {
        let tenancy = &state.access.tenancy;
        let (tier, limits) = tenancy.limits_of(principal);
        answer["limits"] = json!({
            "principal": principal.subject,
            "tenant": principal.tenant,
            "tier": tier,
            "admin": principal.admin,
            "limits": limits,
            "used": state.registry.usage(&principal.tenant),
        });
    }
    Json(answer)
}

fn runner_capabilities(state: &AppState) -> RunnerCapabilities {
    let backend = state.registry.backend().capabilities();
    let mut features = match json!(backend.features) {
        Value::Object(features) => features,
        _ => serde_json::Map::new(),
    };
    if state.options.auth_tokens.is_some() || state.access.jwt.is_some() {
        features.insert("auth".into(), json!({ "type": "bearer" }));
    }
    // The 0.8 wire announced a terminal with `true`; a list of io modes is
    // what tells a client the frames are tagged.
    if state.options.io_frames == FrameFormat::Legacy {
        features.insert("io".into(), json!(true));
    }
    features.insert("watch".into(), json!(state.registry.offers_watch()));
    let agents = state.registry.offered_agents();
    if !agents.is_empty() {
        features.insert("agents".into(), json!(agents));
    }
    let telo_versions = state.registry.backend().telo_versions().is_some();
    let mut schema = backend.config_schema;
    if telo_versions {
        features.insert("teloVersions".into(), json!(true));
        crate::capabilities::supersede_by_telo(&mut schema);
    }
    RunnerCapabilities {
        display_name: backend.display_name,
        description: backend.description,
        config: Some(ConfigSurface {
            schema,
            superseded_by_telo: telo_versions.then(|| {
                SUPERSEDED_BY_TELO
                    .iter()
                    .map(|key| (*key).to_owned())
                    .collect()
            }),
        }),
        features,
        terms: state.options.terms.clone(),
        apps: state.options.apps.descriptors(),
    }
}

pub async fn probe(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let (image, pull_policy) = validate_probe(body)?;
    let report = state
        .registry
        .backend()
        .probe(&ProbeConfig { image, pull_policy })
        .await;
    Ok(Json(report).into_response())
}

pub async fn create_session(
    State(state): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = idempotency::key_of(&headers)?;
    let body = read_json_body(&headers, body, &state.options).await?;
    // Checking every path of a big bundle is CPU work the runtime must not do.
    let large = body
        .as_ref()
        .and_then(|body| body["bundle"]["files"].as_array())
        .is_some_and(|files| files.len() > LARGE_BUNDLE_FILES);
    let keyed = key.is_some();
    let (request, fingerprint) = off_the_runtime_when(large, move || {
        let fingerprint = keyed.then(|| Fingerprint::of("POST /v1/sessions", body.as_ref()));
        validate_start_session(body).map(|request| (request, fingerprint))
    })
    .await?;
    check_terms(&state.options, &headers)?;
    let pending = match claim_key(&state, &viewer, &headers, key, fingerprint)? {
        Some(Claim::Replay(created)) => return Ok(replayed(created)),
        Some(Claim::Fresh(pending)) => Some(pending),
        None => None,
    };
    let claimant = claimant(&state, &viewer)?;
    let (request, entry) = off_the_runtime_when(large, move || {
        admission::bundle_entry(&request.bundle).map(|entry| (request, entry))
    })
    .await?;
    let backend = state.registry.backend();
    let admitted = admission::admit_session(&offer(&state, backend), request, entry)?;
    let created = match admitted {
        Admitted::Watch(plan) => {
            let notice = plan.agent_notice;
            let owner = claimant.owner.clone();
            let created =
                state
                    .registry
                    .create_watch(&claimant, plan.bundle, |session_id, created_at| WatchSpec {
                        session_id: session_id.to_owned(),
                        created_at: created_at.to_owned(),
                        apps: plan.apps,
                        env: plan.env,
                        config: plan.config,
                        agent: plan.agent,
                        agent_launch: None,
                        owner,
                    });
            let created = audited(&state, &viewer, created)?;
            if let (Some(notice), Some(session)) = (notice, state.registry.get(&created.session_id))
            {
                session.emit(runner_api::types::RunEvent::Progress {
                    app: None,
                    phase: runner_api::types::RunPhase::Provision,
                    message: notice,
                    done: None,
                });
            }
            created
        }
        Admitted::Run(plan) => audited(
            &state,
            &viewer,
            state.registry.create_named(
                &claimant,
                &plan.name,
                &plan.ports.clone(),
                plan.telo.clone().as_deref(),
                |session_id, created_at| StartSpec {
                    session_id: session_id.to_owned(),
                    created_at: created_at.to_owned(),
                    bundle: plan.bundle,
                    entry_relative_path: plan.entry_relative_path,
                    env: plan.env,
                    ports: plan.ports,
                    config: plan.config,
                    app: None,
                    inspect: plan.inspect,
                    telo: plan.telo,
                    owner: None,
                },
            ),
        )?,
    };
    if let Some(pending) = pending {
        pending.created(&created);
    }
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// Claims the request's `Idempotency-Key`, if it has one, for the bearer
/// token that sent it.
fn claim_key(
    state: &AppState,
    viewer: &Viewer,
    headers: &HeaderMap,
    key: Option<String>,
    fingerprint: Option<Fingerprint>,
) -> Result<Option<Claim>, ApiError> {
    // Keys belong to the principal (a refreshed JWT is the same one), else
    // to the bearer token.
    let scope = viewer
        .principal()
        .map(|principal| principal.subject.as_str())
        .or_else(|| super::auth::bearer_token(headers));
    match (key, fingerprint) {
        (Some(key), Some(fingerprint)) => {
            state.idempotency.claim(scope, key, fingerprint).map(Some)
        }
        _ => Ok(None),
    }
}

/// The answer a key already gave: the same `201` and body.
fn replayed(created: SessionCreated) -> Response {
    (
        StatusCode::CREATED,
        [(idempotency::REPLAYED_HEADER, "true")],
        Json(created),
    )
        .into_response()
}

/// What this runner offers a session request, read now.
pub(super) fn offer<'a>(state: &'a AppState, backend: &'a Arc<dyn Backend>) -> Offer<'a> {
    let capabilities = backend.capabilities();
    let io_modes = capabilities
        .features
        .io
        .iter()
        .map(|mode| mode.as_str().to_owned())
        .collect();
    Offer {
        backend,
        default_config: capabilities.default_config,
        io_modes,
        watch: state.registry.offers_watch(),
        catalog: &state.options.apps,
        backend_runs_agents: backend
            .watch_sessions()
            .is_some_and(|watch| watch.offers_agents()),
        offered_agents: state.registry.offered_agents(),
        live_watch_sessions: state.registry.live_watch_sessions(),
        max_watch_sessions: state.registry.limits().watch.max_sessions,
        default_registry_url: state.options.default_registry_url.clone(),
    }
}

pub async fn create_app_session(
    State(state): State<AppState>,
    PathParam(name): PathParam,
    viewer: Viewer,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = idempotency::key_of(&headers)?;
    let body = read_json_body(&headers, body, &state.options).await?;
    let fingerprint = key
        .is_some()
        .then(|| Fingerprint::of(&format!("POST /v1/apps/{name}/sessions"), body.as_ref()));
    let request = validate_app_session(body)?;
    // The catalog is public already, so an unknown name is answered before
    // the terms gate.
    let plan = admission::admit_app_session(
        &state.options.apps,
        state.options.default_registry_url.clone(),
        &name,
        request,
    )?;
    check_terms(&state.options, &headers)?;
    let pending = match claim_key(&state, &viewer, &headers, key, fingerprint)? {
        Some(Claim::Replay(created)) => return Ok(replayed(created)),
        Some(Claim::Fresh(pending)) => Some(pending),
        None => None,
    };
    let claimant = claimant(&state, &viewer)?;
    let created =
        state
            .registry
            .create_for(&claimant, SessionKind::App, |session_id, created_at| {
                StartSpec {
                    session_id: session_id.to_owned(),
                    created_at: created_at.to_owned(),
                    bundle: RunBundle {
                        entry_relative_path: "telo.yaml".into(),
                        files: Vec::new(),
                    },
                    entry_relative_path: "telo.yaml".into(),
                    env: plan.env,
                    ports: plan.ports,
                    config: SessionConfig {
                        image: plan.launch.image.clone(),
                        pull_policy: plan.launch.pull_policy,
                        registry_url: None,
                    },
                    app: Some(plan.launch),
                    inspect: plan.inspect,
                    telo: None,
                    owner: None,
                }
            });
    let created = audited(&state, &viewer, created)?;
    if let Some(pending) = pending {
        pending.created(&created);
    }
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

pub async fn list_sessions(State(state): State<AppState>, viewer: Viewer) -> Json<Value> {
    let sessions: Vec<_> = state
        .registry
        .sessions()
        .iter()
        .filter(|s| viewer.may_see(s.owner()))
        .map(|s| s.snapshot())
        .collect();
    Json(json!({ "sessions": sessions }))
}

pub async fn get_session(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
) -> Result<Response, ApiError> {
    let session = super::visible_session(&state, &viewer, &id)?;
    Ok(Json(session.snapshot()).into_response())
}

/// Idempotent: an unknown id — and another principal's session, which is
/// left untouched — is a `204` too.
pub async fn delete_session(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    viewer: Viewer,
) -> Result<Response, ApiError> {
    let Ok(session) = super::visible_session(&state, &viewer, &id) else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let live = !session.is_terminal();
    let stopped = state.registry.stop(&id).await;
    if live {
        super::audit_session(
            &state,
            AuditAction::SessionStop,
            &viewer,
            &session,
            stopped.as_ref().err().map(|err| err.message.clone()),
        );
    }
    stopped?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Who a creation is for: the viewer's owner and, with a tiers file, its
/// tier's limits; a start token is taken from its `startsPerMinute`
/// bucket first.
fn claimant(state: &AppState, viewer: &Viewer) -> Result<Claimant, ApiError> {
    let Some(principal) = viewer.principal() else {
        return Ok(Claimant::default());
    };
    let tenancy = &state.access.tenancy;
    if let Err(refusal) = tenancy.take_start(principal) {
        state.registry.metrics().access_refused("rate_limited");
        audit_create(state, viewer, Err(&refusal.to_string()));
        return Err(refusal.into());
    }
    let limits = tenancy.has_tiers().then(|| tenancy.limits_of(principal).1);
    Ok(Claimant::new(Some(principal.owner()), limits))
}

/// The audit line of a creation: the session made, or why not.
fn audit_create(state: &AppState, viewer: &Viewer, outcome: Result<&str, &str>) {
    if !state.access.audit.is_on() {
        return;
    }
    let record = match outcome {
        Ok(id) => AuditRecord::new(AuditAction::SessionCreate, Outcome::Allowed).session(id),
        Err(reason) => {
            AuditRecord::new(AuditAction::SessionCreate, Outcome::Refused).reason(reason)
        }
    };
    state.access.audit.record(record.by(viewer.principal()));
}

/// Audits a creation's admission.
fn audited(
    state: &AppState,
    viewer: &Viewer,
    created: Result<SessionCreated, AdmissionError>,
) -> Result<SessionCreated, ApiError> {
    match &created {
        Ok(created) => audit_create(state, viewer, Ok(&created.session_id)),
        Err(refused) => {
            if matches!(refused, AdmissionError::QuotaExceeded(_)) {
                state.registry.metrics().access_refused("quota_exceeded");
            }
            audit_create(state, viewer, Err(&refused.to_string()))
        }
    }
    Ok(created?)
}

/// Sessions are only created by a client that accepted the current terms.
fn check_terms(options: &ServerOptions, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(terms) = &options.terms else {
        return Ok(());
    };
    let accepted = headers
        .get(ACCEPTED_TERMS_HEADER)
        .map(|v| v.as_bytes() == terms.version.as_bytes())
        .unwrap_or(false);
    if accepted {
        Ok(())
    } else {
        Err(ApiError::TermsRequired(terms.clone()))
    }
}

/// The edge's check of a request to a session's published ports: an
/// ingress controller's external authentication calls it with the
/// request's headers (README, "Workload tokens at the edge"). `204` when the
/// request may pass (the session has no workload token, or the request's
/// `Authorization: Bearer` is one of its tokens), else `401`. Outside `/v1`
/// and not gated by `RUNNER_AUTH_TOKENS_FILE`: the session's token is the
/// credential here, and the answer says nothing but yes or no — an unknown
/// id, a finished session and a refused token get the very same `401`, so
/// the check cannot be used to learn which session ids exist.
pub async fn edge_access(
    State(state): State<AppState>,
    PathParam(id): PathParam,
    headers: HeaderMap,
) -> Response {
    let port = requested_port(&id, &headers);
    let access = state
        .registry
        .get(&id)
        .filter(|session| !session.is_terminal())
        .map(|session| session.edge_access(super::auth::bearer_token(&headers), port));
    match access {
        Some(EdgeAccess::Open | EdgeAccess::Granted) => StatusCode::NO_CONTENT.into_response(),
        Some(EdgeAccess::Denied) | None => edge_refusal(),
    }
}

/// The session port a checked request is for, read from the host it was
/// sent to (`<port>-<session id>.<domain>`) as the edge passes it on:
/// `X-Original-URL` (ingress-nginx: an absolute URL), else
/// `X-Forwarded-Host`. `None` — every token of the session applies — when
/// that is in any way unclear: a header sent twice or holding a list (the
/// client's own value may be first), an `X-Original-URL` that is not an
/// absolute http(s) URL (never a fall-back to the other header, which the
/// client may have set), the two headers naming different hosts, or a host
/// that is not one of this session's.
fn requested_port(id: &str, headers: &HeaderMap) -> Option<u16> {
    let single = |name: &str| -> Result<Option<&str>, ()> {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(());
        }
        let text = value.to_str().map_err(|_| ())?.trim();
        if text.is_empty() || text.contains(',') {
            return Err(());
        }
        Ok(Some(text))
    };
    let original_url = single("x-original-url").ok()?;
    let forwarded_host = single("x-forwarded-host").ok()?;
    let from_url = match original_url {
        Some(url) => Some(host_of_url(url)?),
        None => None,
    };
    let from_forwarded = forwarded_host.map(strip_port);
    let host = match (from_url, from_forwarded) {
        (Some(url), Some(forwarded)) if !url.eq_ignore_ascii_case(forwarded) => return None,
        (Some(host), _) | (None, Some(host)) => host,
        (None, None) => return None,
    };
    let label = host.split('.').next()?;
    let (port, session) = label.split_once('-')?;
    let port: u16 = port.parse().ok()?;
    // `08080-<id>` is not the host the session's route names.
    (session == id && port != 0 && label.starts_with(&format!("{port}-"))).then_some(port)
}

/// The host (without a port) of an absolute `http(s)://` URL.
fn host_of_url(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some(strip_port(authority))
}

/// `host[:port]` without the port.
fn strip_port(authority: &str) -> &str {
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

fn edge_refusal() -> Response {
    let mut response = ApiError::new(
        ErrorCode::Unauthorized,
        "a workload token of this session is required",
    )
    .into_response();
    response.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer realm=\"telo session\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, axum::http::HeaderValue::from_static(value));
        }
        headers
    }

    #[rstest::rstest]
    #[case(&[("x-original-url", "https://7070-abc234defghi.run.example.com/ws?x=1")], Some(7070))]
    #[case(&[("x-original-url", "http://7070-abc234defghi.run.example.com:80")], Some(7070))]
    #[case(&[("x-forwarded-host", "8080-abc234defghi.run.example.com")], Some(8080))]
    #[case(&[("x-forwarded-host", "8080-abc234defghi.run.example.com:443")], Some(8080))]
    #[case(
        &[
            ("x-original-url", "https://7070-abc234defghi.run.example.com/"),
            ("x-forwarded-host", "7070-abc234defghi.run.example.com"),
        ],
        Some(7070)
    )]
    // Another session's host, or none: no port is taken from it.
    #[case(&[("x-forwarded-host", "8080-zzzzzzzzzzzz.run.example.com")], None)]
    #[case(&[], None)]
    // A URL without a scheme is not read, and not replaced by the other header.
    #[case(
        &[
            ("x-original-url", "7070-abc234defghi.run.example.com/ws"),
            ("x-forwarded-host", "8080-abc234defghi.run.example.com"),
        ],
        None
    )]
    #[case(&[("x-original-url", "/ws"), ("x-forwarded-host", "8080-abc234defghi.run.example.com")], None)]
    #[case(&[("x-original-url", "ftp://8080-abc234defghi.run.example.com/")], None)]
    // A list, or a header sent twice: the client's value may be the first.
    #[case(&[("x-forwarded-host", "8080-abc234defghi.run.example.com, 7070-abc234defghi.run.example.com")], None)]
    #[case(
        &[
            ("x-forwarded-host", "8080-abc234defghi.run.example.com"),
            ("x-forwarded-host", "7070-abc234defghi.run.example.com"),
        ],
        None
    )]
    #[case(
        &[
            ("x-original-url", "https://8080-abc234defghi.run.example.com/"),
            ("x-original-url", "https://7070-abc234defghi.run.example.com/"),
        ],
        None
    )]
    // The two headers disagree.
    #[case(
        &[
            ("x-original-url", "https://8080-abc234defghi.run.example.com/"),
            ("x-forwarded-host", "7070-abc234defghi.run.example.com"),
        ],
        None
    )]
    #[case(&[("x-forwarded-host", "08080-abc234defghi.run.example.com")], None)]
    #[case(&[("x-original-url", "https://evil@8080-abc234defghi.run.example.com/")], None)]
    fn the_checked_port_is_read_only_when_the_headers_are_unambiguous(
        #[case] pairs: &[(&'static str, &'static str)],
        #[case] port: Option<u16>,
    ) {
        assert_eq!(requested_port("abc234defghi", &headers(pairs)), port);
    }
}
