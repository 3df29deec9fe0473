//! The JSON routes of `/v1`.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use runner_api::bundle_path::normalize_bundle_path;
use runner_api::io::FrameFormat;
use runner_api::types::{ConfigSurface, RunBundle, RunnerCapabilities, SessionConfig};
use runner_api::validate::{validate_app_session, validate_probe, validate_start_session};
use serde_json::{Value, json};

use super::body::{off_the_runtime_when, read_json_body};

/// Bundles with more files than this are checked on the blocking pool.
const LARGE_BUNDLE_FILES: usize = 256;
use super::error::ApiError;
use super::{ACCEPTED_TERMS_HEADER, AppState, PathParam, ServerOptions};
use crate::backend::{AppLaunch, ProbeConfig, StartSpec, WatchSpec};
use crate::metrics::METRICS_CONTENT_TYPE;
use crate::registry::AdmissionError;
use crate::session::EdgeAccess;
use runner_api::telo::{SUPERSEDED_BY_TELO, superseded_config_message};
use runner_api::watch::{AppSpec, DEFAULT_APP_NAME, IoMode, SessionMode, resolve_apps};

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

pub async fn capabilities(State(state): State<AppState>) -> Json<RunnerCapabilities> {
    let backend = state.registry.backend().capabilities();
    let mut features = match backend.features {
        Value::Object(features) => features,
        _ => serde_json::Map::new(),
    };
    if state.options.auth_tokens.is_some() {
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
    let telo_versions = state.registry.backend().offers_telo_versions();
    let mut schema = backend.config_schema;
    if telo_versions {
        features.insert("teloVersions".into(), json!(true));
        crate::capabilities::supersede_by_telo(&mut schema);
    }
    Json(RunnerCapabilities {
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
    })
}

pub async fn probe(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let (image, pull_policy) = validate_probe(body).map_err(validation_error)?;
    let report = state
        .registry
        .backend()
        .probe(&ProbeConfig { image, pull_policy })
        .await;
    Ok(Json(report).into_response())
}

pub async fn create_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    // Checking every path of a big bundle is CPU work the runtime must not do.
    let large = body
        .as_ref()
        .and_then(|body| body["bundle"]["files"].as_array())
        .is_some_and(|files| files.len() > LARGE_BUNDLE_FILES);
    let request = off_the_runtime_when(large, move || {
        validate_start_session(body).map_err(validation_error)
    })
    .await?;
    check_terms(&state.options, &headers)?;
    let (request, entry) = off_the_runtime_when(large, move || {
        let entry = normalize_bundle_path(&request.bundle.entry_relative_path)
            .map_err(|err| ApiError::bad_request("invalid_bundle", err.to_string()))?;
        for file in &request.bundle.files {
            normalize_bundle_path(&file.relative_path)
                .map_err(|err| ApiError::bad_request("invalid_bundle", err.to_string()))?;
        }
        Ok((request, entry))
    })
    .await?;
    let backend = state.registry.backend();
    let versions = {
        let default_app;
        let sent: &[AppSpec] = match &request.apps {
            Some(apps) => apps,
            None => {
                default_app = [default_app_spec(entry.clone(), Vec::new())];
                &default_app
            }
        };
        super::telo::check_versions(
            backend.as_ref(),
            request.telo.as_deref(),
            request.apps.is_some(),
            sent,
            request.mode,
        )
        .map_err(ApiError::Telo)?
    };
    let defaults = backend.capabilities().default_config;
    let config = match &versions {
        // The version says what runs: the keys it supersedes are refused,
        // and the backend picks the image.
        Some(_) => {
            if let Some(key) = request.config.sent_among(&SUPERSEDED_BY_TELO).first() {
                return Err(ApiError::bad_request(
                    "invalid_config",
                    superseded_config_message(key),
                ));
            }
            request.config.clone().resolve(&defaults)
        }
        None => {
            let config = request.config.clone().resolve(&defaults);
            backend
                .validate_config(&config)
                .map_err(|err| ApiError::bad_request("invalid_config", err.to_string()))?;
            config
        }
    };
    let watch = request.mode == SessionMode::Watch;
    if watch && !state.registry.offers_watch() {
        return Err(ApiError::bad_request(
            "watch_disabled",
            "this runner does not offer watch sessions (see /v1/capabilities)",
        ));
    }
    let agent_port = match &request.agent {
        Some(agent) => Some(check_agent(&state, agent, watch)?),
        None => None,
    };
    let watch_limit = state.registry.limits().watch.max_sessions;
    if watch && state.registry.live_watch_sessions() >= watch_limit {
        return Err(watch_admission_error(watch_limit));
    }
    let default_ports = request.ports.clone();
    let default_entry = entry.clone();
    let mut apps = resolve_apps(request.apps.clone(), || {
        default_app_spec(default_entry, default_ports)
    })
    .map_err(|refusal| ApiError::bad_request(refusal.code, refusal.message))?;
    super::telo::pin_versions(&mut apps, versions.as_deref());
    check_io(&state, &apps, watch)?;
    // The manifest wins a port clash: the agent is dropped, and the
    // session says why once it exists.
    let mut agent_notice = None;
    let agent = match (&request.agent, agent_port) {
        (Some(name), Some(port)) => match tcp_owner(&apps, port) {
            Some(owner) => {
                agent_notice = Some(format!(
                    "co-resident agent '{name}' was not started: it listens on tcp port {port}, which app '{owner}' declares"
                ));
                None
            }
            None => Some(crate::backend::AgentRef {
                name: name.clone(),
                port,
                token: state
                    .options
                    .apps
                    .get(name)
                    .and_then(|entry| entry.token_env.as_ref())
                    .map(|_| crate::ids::new_workload_token()),
            }),
        },
        _ => None,
    };
    let registry_url = config
        .registry_url
        .as_deref()
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned);
    let env = with_registry_url(
        request.env,
        registry_url.or_else(|| state.options.default_registry_url.clone()),
    );
    if watch {
        let created = state
            .registry
            .create_watch(request.bundle, |session_id, created_at| WatchSpec {
                session_id: session_id.to_owned(),
                created_at: created_at.to_owned(),
                apps,
                env,
                config,
                agent,
                agent_launch: None,
            })
            .map_err(admission_error)?;
        if let (Some(notice), Some(session)) =
            (agent_notice, state.registry.get(&created.session_id))
        {
            session.emit(runner_api::types::RunEvent::Progress {
                app: None,
                phase: runner_api::types::RunPhase::Provision,
                message: notice,
                done: None,
            });
        }
        return Ok((StatusCode::CREATED, Json(created)).into_response());
    }
    // A run session runs its first app (the bundle's entry when none are
    // named), under that app's name.
    let first = apps.into_iter().next();
    let (entry, ports, name, telo) = match first {
        Some(app) => (app.entry_relative_path, app.ports, app.name, app.telo),
        None => (entry, request.ports, DEFAULT_APP_NAME.to_owned(), None),
    };
    let created = state
        .registry
        .create_named(
            &name,
            &ports.clone(),
            telo.clone().as_deref(),
            |session_id, created_at| StartSpec {
                session_id: session_id.to_owned(),
                created_at: created_at.to_owned(),
                bundle: request.bundle,
                entry_relative_path: entry,
                env,
                ports,
                config,
                app: None,
                inspect: request.inspect,
                telo,
            },
        )
        .map_err(admission_error)?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// The one app of a request without `apps`: the bundle's entry, the
/// request's ports, under the default name.
fn default_app_spec(entry: String, ports: Vec<runner_api::types::PortMapping>) -> AppSpec {
    AppSpec {
        name: DEFAULT_APP_NAME.to_owned(),
        entry_relative_path: entry,
        ports,
        io: IoMode::Tty,
        telo: None,
    }
}

/// `agent` on a session request: only a watch session has one, and only a
/// catalog entry that declares the port it listens on can be one. Returns
/// that port.
fn check_agent(state: &AppState, agent: &str, watch: bool) -> Result<u16, ApiError> {
    if !watch {
        return Err(ApiError::bad_request(
            "agent_requires_watch",
            "`agent` requires `mode: \"watch\"` \u{2014} nothing would observe the agent's writes",
        ));
    }
    let offered = state.registry.offered_agents();
    let entry = state
        .options
        .apps
        .get(agent)
        .filter(|_| state.registry.backend().offers_agents());
    let Some(entry) = entry else {
        let mut message = format!("agent '{agent}' is not offered by this runner");
        if !offered.is_empty() {
            message.push_str(" \u{2014} offered: ");
            message.push_str(&offered.join(", "));
        }
        return Err(ApiError::bad_request("unknown_agent", message));
    };
    entry.port.ok_or_else(|| {
        ApiError::bad_request(
            "agent_port_undeclared",
            format!(
                "agent '{agent}' declares no port, so this runner cannot route it \u{2014} set RUNNER_APPS.{agent}.port to the port its image listens on"
            ),
        )
    })
}

/// The app declaring tcp `port`, if one does.
pub(super) fn tcp_owner(apps: &[AppSpec], port: u16) -> Option<&str> {
    apps.iter()
        .find(|app| {
            app.ports.iter().any(|mapping| {
                mapping.port == port && mapping.protocol == runner_api::types::PortProtocol::Tcp
            })
        })
        .map(|app| app.name.as_str())
}

/// An app whose `io` the backend does not offer is refused before anything
/// starts. A run session is always on a terminal: `streams` is offered to
/// watch sessions only.
pub(super) fn check_io(state: &AppState, apps: &[AppSpec], watch: bool) -> Result<(), ApiError> {
    let features = state.registry.backend().capabilities().features;
    let offered: Vec<&str> = features["io"]
        .as_array()
        .map(|modes| modes.iter().filter_map(Value::as_str).collect())
        .unwrap_or_else(|| vec!["tty"]);
    if let Some(app) = apps.iter().find(|app| !offered.contains(&app.io.as_str())) {
        return Err(ApiError::bad_request(
            "io_unsupported",
            format!(
                "app '{}' asks for io '{}', which this runner does not offer; it offers: {}",
                app.name,
                app.io.as_str(),
                offered.join(", ")
            ),
        ));
    }
    match apps.iter().find(|app| !watch && app.io != IoMode::Tty) {
        None => Ok(()),
        Some(app) => Err(ApiError::bad_request(
            "io_unsupported",
            format!(
                "app '{}' asks for io '{}', which this runner offers to watch sessions only (`mode: \"watch\"`); a run session runs on a terminal (io 'tty')",
                app.name,
                app.io.as_str(),
            ),
        )),
    }
}

fn watch_admission_error(max: usize) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "too_many_watch_sessions",
        format!("runner is at its configured max of {max} concurrent watch sessions"),
    )
}

pub async fn create_app_session(
    State(state): State<AppState>,
    PathParam(name): PathParam,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_json_body(&headers, body, &state.options).await?;
    let request = validate_app_session(body).map_err(validation_error)?;
    // The catalog is public already, so an unknown name is answered before
    // the terms gate.
    let Some(app) = state.options.apps.get(&name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_app",
            state.options.apps.unknown_app_message(&name),
        ));
    };
    if let Some(message) = app.refused_client_env(&name, &request.env) {
        return Err(ApiError::bad_request("invalid_request", message));
    }
    check_terms(&state.options, &headers)?;
    let token = app
        .token_env
        .as_ref()
        .map(|_| crate::ids::new_workload_token());
    let merged = app.merge_env(&request.env);
    let merged = match &token {
        Some(token) => app.with_token(merged, token),
        None => merged,
    };
    let env = with_registry_url(merged, state.options.default_registry_url.clone());
    let launch = AppLaunch {
        name: name.clone(),
        image: app.image.clone(),
        pull_policy: app.pull_policy,
        command: app.command.clone(),
        token,
    };
    let created = state
        .registry
        .create(|session_id, created_at| StartSpec {
            session_id: session_id.to_owned(),
            created_at: created_at.to_owned(),
            bundle: RunBundle {
                entry_relative_path: "telo.yaml".into(),
                files: Vec::new(),
            },
            entry_relative_path: "telo.yaml".into(),
            env,
            ports: request.ports,
            config: SessionConfig {
                image: launch.image.clone(),
                pull_policy: launch.pull_policy,
                registry_url: None,
            },
            app: Some(launch),
            inspect: request.inspect,
            telo: None,
        })
        .map_err(admission_error)?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

pub async fn list_sessions(State(state): State<AppState>) -> Json<Value> {
    let sessions: Vec<_> = state
        .registry
        .sessions()
        .iter()
        .map(|s| s.snapshot())
        .collect();
    Json(json!({ "sessions": sessions }))
}

pub async fn get_session(
    State(state): State<AppState>,
    PathParam(id): PathParam,
) -> Result<Response, ApiError> {
    let session = state
        .registry
        .get(&id)
        .ok_or_else(|| ApiError::session_not_found(&id))?;
    Ok(Json(session.snapshot()).into_response())
}

pub async fn delete_session(
    State(state): State<AppState>,
    PathParam(id): PathParam,
) -> Result<Response, ApiError> {
    state.registry.stop(&id).await.map_err(|err| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "stop_failed",
            err.message,
        )
    })?;
    Ok(StatusCode::NO_CONTENT.into_response())
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

/// `TELO_REGISTRY_URL` reaches the workload unless the request env names it
/// (even as an empty string).
fn with_registry_url(mut env: Vec<(String, String)>, url: Option<String>) -> Vec<(String, String)> {
    if let Some(url) = url
        && !env.iter().any(|(key, _)| key == "TELO_REGISTRY_URL")
    {
        env.push(("TELO_REGISTRY_URL".into(), url));
    }
    env
}

fn validation_error(err: runner_api::validate::ValidationError) -> ApiError {
    ApiError::bad_request("invalid_request", err.message)
}

fn admission_error(err: AdmissionError) -> ApiError {
    match err {
        AdmissionError::TooManyWatchSessions { max } => watch_admission_error(max),
        AdmissionError::TooManySessions { .. } => {
            ApiError::new(StatusCode::CONFLICT, "too_many_sessions", err.to_string())
        }
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
        StatusCode::UNAUTHORIZED,
        "unauthorized",
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

    #[test]
    fn the_registry_url_is_added_only_when_the_env_does_not_name_it() {
        let env = with_registry_url(vec![], Some("https://r".into()));
        assert_eq!(env, vec![("TELO_REGISTRY_URL".into(), "https://r".into())]);
        let env = with_registry_url(
            vec![("TELO_REGISTRY_URL".into(), String::new())],
            Some("https://r".into()),
        );
        assert_eq!(env, vec![("TELO_REGISTRY_URL".into(), String::new())]);
        assert!(with_registry_url(vec![], None).is_empty());
    }
}
