//! Hostile input against everything the runner parses from a client,
//! through the real router: request bodies, resume ids, session ids in paths.
//! Properties, not examples: nothing panics, nothing hangs, every refusal is
//! a 4xx with a message, and nothing the runner accepts breaks an invariant
//! the backends rely on.
//!
//! Case counts are kept small for CI; `PROPTEST_CASES=200000 cargo test
//! --release -p runner-core --test hostile_requests` is the long run.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use bytes::Bytes;
use proptest::prelude::*;
use runner_core::apps::{AppCatalog, AppEntry};
use runner_core::backend::{
    Backend, BackendCapabilities, BackendSession, ProbeConfig, StartError, StartSpec, StartStage,
};
use runner_core::bundle_path::normalize_bundle_path;
use runner_core::http::{AppState, ServerOptions, router};
use runner_core::registry::{RegistryLimits, SessionRegistry, SessionSink};
use runner_core::types::{AvailabilityReport, PullPolicy, SessionConfig};
use runner_core::validate::{MAX_ENV_ENTRIES, MAX_PORTS};
use serde_json::{Map, Value, json};
use support::{
    KEYS, check_accepted_path, config, hostile_path, json_value, leaf, nasty_number, nasty_string,
};
use tower::ServiceExt;

/// Longest any single request may take before it counts as a hang.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
const MAX_BODY_BYTES: usize = 64 * 1024;

// ---------------------------------------------------------------------------
// Request body generators

/// `value` half the time, something hostile otherwise (including a wrapping
/// one-element array, which the validator coerces).
fn or_hostile(value: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Value> {
    let value = value.boxed();
    prop_oneof![
        4 => value.clone(),
        1 => value.prop_map(|v| json!([v])),
        2 => leaf(),
        1 => json_value(),
    ]
    .boxed()
}

fn string_value(s: impl Strategy<Value = String> + 'static) -> BoxedStrategy<Value> {
    s.prop_map(Value::String).boxed()
}

fn path_string() -> BoxedStrategy<String> {
    prop_oneof![
        2 => hostile_path(),
        1 => Just("telo.yaml".to_owned()),
        1 => nasty_string(),
    ]
    .boxed()
}

fn env_object() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => prop::collection::vec((nasty_string(), or_hostile(string_value(nasty_string()))), 0..6)
            .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        1 => (MAX_ENV_ENTRIES - 1..MAX_ENV_ENTRIES + 2).prop_map(|n| {
            Value::Object((0..n).map(|i| (format!("K{i}"), json!("v"))).collect())
        }),
    ]
    .boxed()
}

fn port_mapping() -> BoxedStrategy<Value> {
    (
        or_hostile(prop_oneof![
            (1u32..=65535).prop_map(Value::from),
            nasty_number(),
            string_value(nasty_string()),
        ]),
        or_hostile(string_value(
            prop::sample::select(&["tcp", "udp", "TCP", "sctp"][..]).prop_map(str::to_owned),
        )),
    )
        .prop_map(|(port, protocol)| json!({"port": port, "protocol": protocol}))
        .boxed()
}

fn ports_value() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => prop::collection::vec(or_hostile(port_mapping()), 0..5).prop_map(Value::Array),
        1 => (MAX_PORTS - 1..MAX_PORTS + 2).prop_map(|n| {
            Value::Array((0..n).map(|i| json!({"port": i + 1, "protocol": "tcp"})).collect())
        }),
        1 => leaf(),
    ]
    .boxed()
}

fn session_config() -> BoxedStrategy<Value> {
    (
        or_hostile(string_value(prop_oneof![
            Just("img:1".to_owned()),
            nasty_string()
        ])),
        or_hostile(string_value(prop_oneof![
            prop::sample::select(PullPolicy::ALL.to_vec()).prop_map(str::to_owned),
            nasty_string(),
        ])),
        prop::option::of(or_hostile(string_value(nasty_string()))),
    )
        .prop_map(|(image, pull_policy, registry_url)| {
            let mut config = json!({"image": image, "pullPolicy": pull_policy});
            if let Some(url) = registry_url {
                config["registryUrl"] = url;
            }
            config
        })
        .boxed()
}

fn bundle_file() -> BoxedStrategy<Value> {
    (
        or_hostile(string_value(path_string())),
        or_hostile(string_value(nasty_string())),
    )
        .prop_map(|(path, contents)| json!({"relativePath": path, "contents": contents}))
        .boxed()
}

/// A start body close enough to valid that most fields pass, with hostile
/// values where the validator and the routes have to decide; then, sometimes,
/// one field dropped or replaced by arbitrary JSON.
fn start_body() -> BoxedStrategy<Value> {
    let bundle = (
        or_hostile(string_value(path_string())),
        or_hostile(prop::collection::vec(or_hostile(bundle_file()), 0..4).prop_map(Value::Array)),
    )
        .prop_map(|(entry, files)| json!({"entryRelativePath": entry, "files": files}));
    (
        or_hostile(bundle),
        or_hostile(env_object()),
        prop::option::of(ports_value()),
        or_hostile(session_config()),
        prop::option::of(or_hostile(any::<bool>().prop_map(Value::Bool))),
        prop::option::of((prop::sample::select(KEYS), prop::option::of(json_value()))),
    )
        .prop_map(|(bundle, env, ports, config, inspect, tamper)| {
            let mut body = Map::new();
            body.insert("bundle".into(), bundle);
            body.insert("env".into(), env);
            if let Some(ports) = ports {
                body.insert("ports".into(), ports);
            }
            body.insert("config".into(), config);
            if let Some(inspect) = inspect {
                body.insert("inspect".into(), inspect);
            }
            match tamper {
                Some((key, Some(value))) => {
                    body.insert(key.to_owned(), value);
                }
                Some((key, None)) => {
                    body.remove(key);
                }
                None => {}
            }
            Value::Object(body)
        })
        .boxed()
}

// ---------------------------------------------------------------------------
// The router, in-process

/// Records what it was asked to start and starts nothing: the session goes
/// `failed` at once, so it is terminal and evictable.
#[derive(Default)]
struct RecordingBackend {
    started: Mutex<Vec<StartSpec>>,
}

#[async_trait]
impl Backend for RecordingBackend {
    fn capabilities(&self) -> BackendCapabilities {
        BackendCapabilities {
            display_name: "recording".into(),
            description: "hostile-input test".into(),
            config_schema: json!({}),
            features: runner_core::backend::BackendFeatures {
                io: vec![runner_core::watch_types::IoMode::Tty],
                ports: false,
            },
            default_config: SessionConfig {
                image: "img".into(),
                pull_policy: PullPolicy::Missing,
                registry_url: None,
            },
        }
    }
    async fn probe(&self, _config: &ProbeConfig) -> AvailabilityReport {
        AvailabilityReport::Ready
    }
    async fn start(
        &self,
        spec: StartSpec,
        _sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        self.started.lock().unwrap().push(spec);
        Err(StartError::new(
            StartStage::Start,
            "nothing is started here",
        ))
    }
}

struct Harness {
    backend: Arc<RecordingBackend>,
    registry: SessionRegistry,
    router: Router,
}

fn harness() -> Harness {
    let backend = Arc::new(RecordingBackend::default());
    let registry = SessionRegistry::new(
        backend.clone(),
        RegistryLimits {
            max_sessions: 4,
            exit_ttl: Duration::from_secs(60),
            replay_buffer_bytes: 64 * 1024,
            watch: Default::default(),
        },
    );
    let demo = AppEntry {
        image: "demo:1".into(),
        env: vec![("SECRET".into(), "operator".into())],
        pull_policy: PullPolicy::Missing,
        title: None,
        description: None,
        command: None,
        accept_env: None,
        token_env: None,
        port: None,
    };
    let options = ServerOptions {
        version: "test".into(),
        cors: runner_core::config::CorsOrigins::Any,
        terms: None,
        apps: AppCatalog::from_entries(vec![("demo".into(), demo)]),
        default_registry_url: Some("https://registry.example".into()),
        max_body_bytes: MAX_BODY_BYTES,
        body_timeout: Duration::from_secs(30),
        sse_heartbeat: Duration::from_secs(3600),
        auth_tokens: None,
        io_frames: Default::default(),
        subscribers: Default::default(),
    };
    let router = router(
        AppState {
            registry: registry.clone(),
            options: Arc::new(options),
            going_away: Default::default(),
            sockets: Default::default(),
            subscribers: Default::default(),
            idempotency: Default::default(),
            access: Default::default(),
        },
        Router::new(),
    );
    Harness {
        backend,
        registry,
        router,
    }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    RUNTIME.with(|runtime| runtime.block_on(future))
}

/// Sends one request; a response that takes longer than the deadline is a
/// hang and fails the case.
async fn send(router: &Router, request: Request<Body>) -> (StatusCode, Bytes) {
    let exchange = async {
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, body)
    };
    tokio::time::timeout(REQUEST_DEADLINE, exchange)
        .await
        .expect("the runner answered within the deadline")
}

fn post(uri: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut request = Request::post(uri);
    if let Some(content_type) = content_type {
        request = request.header(header::CONTENT_TYPE, content_type);
    }
    request.body(body.into()).unwrap()
}

/// Every refusal is a 4xx carrying `{ "error", "message" }`; nothing is a 5xx.
fn check_answer(status: StatusCode, body: &[u8]) -> Result<Option<Value>, TestCaseError> {
    prop_assert!(
        status == StatusCode::CREATED || status == StatusCode::OK || status.is_client_error(),
        "status {status}, body {}",
        String::from_utf8_lossy(body)
    );
    let answer: Value = serde_json::from_slice(body)
        .map_err(|err| TestCaseError::fail(format!("{status} with a non-JSON body: {err}")))?;
    if status.is_client_error() {
        prop_assert!(answer["error"].is_string(), "no error code: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        prop_assert!(!message.is_empty(), "no message: {answer}");
        return Ok(None);
    }
    Ok(Some(answer))
}

/// What the backend was handed for the session just created: waits (on the
/// runtime, never a sleep) for the background start to run.
async fn started_spec(harness: &Harness, session_id: &str) -> StartSpec {
    for _ in 0..1000 {
        if let Some(spec) = harness
            .backend
            .started
            .lock()
            .unwrap()
            .iter()
            .find(|spec| spec.session_id == session_id)
        {
            return spec.clone();
        }
        tokio::task::yield_now().await;
    }
    panic!("session {session_id} was created but never started");
}

/// The invariants every backend relies on for an admitted session.
fn check_spec(spec: &StartSpec, app: bool) -> Result<(), TestCaseError> {
    if !app {
        check_accepted_path(&spec.entry_relative_path)?;
        for file in &spec.bundle.files {
            let normalized = normalize_bundle_path(&file.relative_path)
                .map_err(|err| TestCaseError::fail(format!("admitted bad file path: {err}")))?;
            check_accepted_path(&normalized)?;
        }
        prop_assert!(!spec.config.image.is_empty());
    }
    // The operator's TELO_REGISTRY_URL and app env come on top of the client's.
    prop_assert!(spec.env.len() <= MAX_ENV_ENTRIES + 2);
    for (name, value) in &spec.env {
        prop_assert!(!name.is_empty(), "empty env name");
        prop_assert!(!name.contains(['=', '\0']), "env name {name:?}");
        prop_assert!(!value.contains('\0'), "env value {value:?}");
    }
    prop_assert!(spec.ports.len() <= MAX_PORTS);
    prop_assert!(spec.ports.iter().all(|p| p.port >= 1));
    Ok(())
}

async fn create_session(
    harness: &Harness,
    body: &Value,
) -> Result<Option<(String, StartSpec)>, TestCaseError> {
    let request = post(
        "/v1/sessions",
        Some("application/json"),
        serde_json::to_vec(body).unwrap(),
    );
    let (status, answer) = send(&harness.router, request).await;
    let Some(created) = check_answer(status, &answer)? else {
        return Ok(None);
    };
    prop_assert_eq!(status, StatusCode::CREATED);
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let spec = started_spec(harness, &id).await;
    check_spec(&spec, false)?;
    Ok(Some((id, spec)))
}

// ---------------------------------------------------------------------------
// Request bodies through the router

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn start_bodies_are_created_or_refused_with_a_4xx(body in start_body()) {
        block_on(async {
            let harness = harness();
            create_session(&harness, &body).await?;
            Ok::<(), TestCaseError>(())
        })?;
    }

    #[test]
    fn arbitrary_json_start_bodies_are_refused_with_a_4xx(body in json_value()) {
        block_on(async {
            let harness = harness();
            create_session(&harness, &body).await?;
            Ok::<(), TestCaseError>(())
        })?;
    }

    #[test]
    fn arbitrary_bytes_are_refused_with_a_4xx(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..512),
            json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
            (0usize..1000, prop::sample::select(&["[", "{\"a\":", "[{\"bundle\":"][..]))
                .prop_map(|(n, open)| open.repeat(n).into_bytes()),
        ],
        content_type in prop::option::of(prop_oneof![
            3 => Just("application/json".to_owned()),
            1 => Just("application/vnd.telo+json; charset=utf-8".to_owned()),
            1 => Just("text/plain".to_owned()),
            1 => "[ -~]{0,40}",
        ]),
        route in prop::sample::select(&["/v1/sessions", "/v1/probe", "/v1/apps/demo/sessions", "/v1/apps/nope/sessions"][..]),
    ) {
        block_on(async {
            let harness = harness();
            let request = post(route, content_type.as_deref(), bytes);
            let (status, answer) = send(&harness.router, request).await;
            if let Some(created) = check_answer(status, &answer)?
                && let Some(id) = created["sessionId"].as_str()
            {
                let spec = started_spec(&harness, id).await;
                check_spec(&spec, spec.app.is_some())?;
            }
            Ok::<(), TestCaseError>(())
        })?;
    }

    #[test]
    fn app_session_and_probe_bodies_are_handled_or_refused_with_a_4xx(
        body in prop_oneof![
            json_value(),
            (prop::option::of(env_object()), prop::option::of(ports_value()), prop::option::of(leaf()))
                .prop_map(|(env, ports, inspect)| {
                    let mut body = Map::new();
                    if let Some(env) = env { body.insert("env".into(), env); }
                    if let Some(ports) = ports { body.insert("ports".into(), ports); }
                    if let Some(inspect) = inspect { body.insert("inspect".into(), inspect); }
                    Value::Object(body)
                }),
            session_config().prop_map(|config| json!({"config": config})),
        ],
        name in prop_oneof![Just("demo".to_owned()), "[a-z%.]{0,8}", "[a-z]{95,105}"],
    ) {
        block_on(async {
            let harness = harness();
            let bytes = serde_json::to_vec(&body).unwrap();
            let uri = format!("/v1/apps/{name}/sessions");
            if let Ok(request) = Request::post(uri).header(header::CONTENT_TYPE, "application/json").body(Body::from(bytes.clone())) {
                let (status, answer) = send(&harness.router, request).await;
                if let Some(created) = check_answer(status, &answer)? {
                    let spec = started_spec(&harness, created["sessionId"].as_str().unwrap()).await;
                    check_spec(&spec, true)?;
                    // Operator env is never overridden by the client.
                    prop_assert!(spec.env.contains(&("SECRET".to_owned(), "operator".to_owned())));
                }
            }
            let (status, answer) = send(&harness.router, post("/v1/probe", Some("application/json"), bytes)).await;
            check_answer(status, &answer)?;
            Ok::<(), TestCaseError>(())
        })?;
    }

    /// `Last-Event-ID` and `?lastEventId` of any shape resume or fall back;
    /// the stream of a finished session always ends.
    #[test]
    fn sse_resume_ids_never_break_the_stream(
        header_id in prop::option::of(prop_oneof![nasty_string(), "[0-9]{1,30}", "-?[0-9]{0,25}[a-z ]{0,3}"]),
        query in prop::option::of(prop_oneof![
            nasty_string().prop_map(|id| format!("lastEventId={}", percent_encode(&id))),
            "[0-9]{1,30}".prop_map(|id| format!("lastEventId={id}")),
            // Raw: repeated keys, stray `%`, `&` and `=`, bytes that are not UTF-8.
            "(lastEventId|lastSeq|x|%|%ff|%2|=|&|[0-9]{1,3}|-| |\\+){0,12}",
        ]),
    ) {
        block_on(async {
            let harness = harness();
            let body = json!({
                "bundle": {"entryRelativePath": "telo.yaml", "files": []},
                "env": {},
                "config": {"image": "img", "pullPolicy": "missing"},
            });
            let (id, _) = create_session(&harness, &body).await?.unwrap();
            let session = harness.registry.get(&id).unwrap();
            for _ in 0..1000 {
                if session.is_terminal() { break; }
                tokio::task::yield_now().await;
            }
            prop_assert!(session.is_terminal());
            let mut uri = format!("/v1/sessions/{id}/events");
            if let Some(query) = &query {
                uri.push('?');
                uri.push_str(query);
            }
            let Ok(uri) = uri.parse::<axum::http::Uri>() else {
                return Ok(());
            };
            let mut request = Request::get(uri);
            if let Some(header_id) = &header_id
                && let Ok(value) = header::HeaderValue::from_str(header_id)
            {
                request = request.header("last-event-id", value);
            }
            let (status, stream) = send(&harness.router, request.body(Body::empty()).unwrap()).await;
            // An unreadable resume point falls back to the next source (docs/contract.md §4.3):
            // the stream is never refused for it.
            prop_assert_eq!(status, StatusCode::OK);
            let text = String::from_utf8(stream.to_vec()).unwrap();
            prop_assert!(text.is_empty() || text.ends_with("\n\n"), "{text:?}");
            Ok::<(), TestCaseError>(())
        })?;
    }

    /// Any session id in a path is a 404 (or 400), never a panic or a 5xx.
    #[test]
    fn arbitrary_session_ids_are_not_found(id in nasty_string(), method in prop::sample::select(&["GET", "DELETE"][..])) {
        block_on(async {
            let harness = harness();
            for suffix in ["", "/events", "/io"] {
                let uri = format!("/v1/sessions/{}{suffix}", percent_encode(&id));
                let Ok(request) = Request::builder().method(method).uri(uri).body(Body::empty()) else {
                    continue;
                };
                let (status, answer) = send(&harness.router, request).await;
                if suffix == "/io" {
                    // Not an upgrade request: a bare 404, as for any unknown session.
                    prop_assert_eq!(status, StatusCode::NOT_FOUND);
                } else if method == "DELETE" && suffix.is_empty() && status == StatusCode::NO_CONTENT {
                    // Deleting an unknown session is a no-op.
                } else {
                    prop_assert!(status.is_client_error(), "{method} {suffix}: {status}");
                    check_answer(status, &answer)?;
                }
            }
            Ok::<(), TestCaseError>(())
        })?;
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn deeply_nested_json_is_a_400_not_a_stack_overflow() {
    block_on(async {
        let harness = harness();
        for open in ["[", "{\"a\":"] {
            let body = open.repeat(10_000);
            let (status, answer) = send(
                &harness.router,
                post("/v1/sessions", Some("application/json"), body),
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(
                serde_json::from_slice::<Value>(&answer).unwrap()["error"],
                "invalid_json"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// Regressions found by the properties above

/// `%aa` decodes to no UTF-8 string; axum's own rejection was a plain-text
/// 400 that a client expecting the JSON envelope could not read.
#[test]
fn a_path_parameter_that_is_not_utf8_is_a_json_400() {
    block_on(async {
        let harness = harness();
        for (method, uri) in [
            ("POST", "/v1/apps/%aa/sessions"),
            ("GET", "/v1/sessions/%aa"),
            ("DELETE", "/v1/sessions/%ff%fe"),
            ("GET", "/v1/sessions/%aa/events"),
        ] {
            let request = Request::builder()
                .method(method)
                .uri(uri)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{}"))
                .unwrap();
            let (status, answer) = send(&harness.router, request).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}");
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(answer["error"], "invalid_url", "{method} {uri}");
            let message = answer["message"].as_str().unwrap();
            assert!(!message.is_empty(), "{method} {uri}: {answer}");
        }
    });
}

/// A repeated `lastEventId` made the typed query extractor refuse the whole
/// stream with a plain-text 400; the reference reads the first value.
#[test]
fn a_repeated_or_garbled_last_event_id_query_does_not_refuse_the_stream() {
    block_on(async {
        let harness = harness();
        let body = json!({
            "bundle": {"entryRelativePath": "telo.yaml", "files": []},
            "env": {},
            "config": {"image": "img", "pullPolicy": "missing"},
        });
        let (id, _) = create_session(&harness, &body).await.unwrap().unwrap();
        let session = harness.registry.get(&id).unwrap();
        while !session.is_terminal() {
            tokio::task::yield_now().await;
        }
        let everything = send(
            &harness.router,
            Request::get(format!("/v1/sessions/{id}/events"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(everything.0, StatusCode::OK);
        for query in ["lastEventId=1&lastEventId=0", "lastEventId=1&lastEventId"] {
            let (status, stream) = send(
                &harness.router,
                Request::get(format!("/v1/sessions/{id}/events?{query}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{query}");
            // Resumed after event 1: everything but the first event.
            assert!(everything.1.ends_with(&stream) && stream.len() < everything.1.len());
        }
        let (status, stream) = send(
            &harness.router,
            Request::get(format!("/v1/sessions/{id}/events?lastEventId=%ff&x"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(stream, everything.1);
    });
}

/// `config.registryUrl` becomes the workload's `TELO_REGISTRY_URL`, but
/// only env values were checked for NUL: `"registryUrl": ["\u0000"]` was
/// admitted and reached the backend as an environment value no process can
/// hold.
#[test]
fn a_registry_url_with_nul_is_refused_like_an_env_value() {
    block_on(async {
        let harness = harness();
        for url in [json!("\0"), json!(["https://r.example/\0"])] {
            let body = json!({
                "bundle": {"entryRelativePath": "telo.yaml", "files": []},
                "env": {},
                "config": {"image": "img", "pullPolicy": "missing", "registryUrl": url},
            });
            let request = post(
                "/v1/sessions",
                Some("application/json"),
                serde_json::to_vec(&body).unwrap(),
            );
            let (status, answer) = send(&harness.router, request).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(
                serde_json::from_slice::<Value>(&answer).unwrap(),
                json!({
                    "error": "invalid_request",
                    "message": "body/config/registryUrl must not contain NUL",
                })
            );
        }
        assert!(harness.backend.started.lock().unwrap().is_empty());
    });
}
