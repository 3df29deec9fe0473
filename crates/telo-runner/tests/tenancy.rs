//! Principals, ownership, quotas, rate limits and the audit log, black-box
//! over real sockets: a session belongs to the principal that created it
//! and is an unknown id to every other one (on every route), an admin sees
//! and stops all, a tenant's tier bounds what it may hold and how fast it
//! may ask, and each of those steps is one audit line.
#![allow(clippy::unwrap_used)]

mod common;

use common::watch::{WATCH, watch_body};
use common::{Backend, Runner};
use reqwest::{Method, StatusCode};
use rstest::rstest;
use serde_json::{Value, json};
use test_support::bundle::start_body;
use test_support::ws::{self, IoFrame};

const ALICE: &str = "alice-token";
const BOB: &str = "bob-token";
const ROOT: &str = "root-token";

/// A token file of three principals: alice and bob of two tenants, and an
/// admin.
fn token_file(dir: &std::path::Path) -> String {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!(
            "{ALICE} name=alice tenant=acme\n{BOB} name=bob tenant=globex\n{ROOT} name=ops groups=telo-admins\n"
        ),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

async fn send(
    runner: &Runner,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = runner.client.request(method, runner.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, json)
}

async fn create(runner: &Runner, token: &str, body: &Value) -> (StatusCode, Value) {
    let (status, _, created) = send(
        runner,
        Method::POST,
        "/v1/sessions",
        Some(token),
        Some(body),
    )
    .await;
    (status, created)
}

async fn listed(runner: &Runner, token: &str) -> Vec<String> {
    let (status, _, list) = send(runner, Method::GET, "/v1/sessions", Some(token), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_owned())
        .collect()
}

/// What `route` answers `token` about session `id`, with the session id
/// replaced so that answers about two ids compare.
async fn answer(
    runner: &Runner,
    route: &(Method, &str, Option<Value>),
    id: &str,
    token: &str,
) -> (StatusCode, String) {
    let (method, path, body) = route;
    let (status, _, json) = send(
        runner,
        method.clone(),
        &path.replace("{id}", id),
        Some(token),
        body.as_ref(),
    )
    .await;
    (status, json.to_string().replace(id, "<id>"))
}

/// The first frame a terminal socket gets: for an unknown id, its close.
async fn io_close(runner: &Runner, id: &str, token: &str) -> IoFrame {
    let mut socket = ws::connect(
        &runner.ws_url(&format!("/v1/sessions/{id}/io?access_token={token}")),
        None,
    )
    .await;
    ws::next_frame(&mut socket).await.unwrap()
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principals_session_is_an_unknown_id_on_every_route(#[case] backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let audit = dir.path().join("audit.log");
    let mut vars = vec![
        ("RUNNER_AUTH_TOKENS_FILE", tokens.as_str()),
        ("RUNNER_AUDIT_LOG", audit.to_str().unwrap()),
    ];
    vars.extend_from_slice(WATCH);
    let runner = Runner::start_on(backend, &vars).await;

    let (status, created) = create(
        &runner,
        ALICE,
        &watch_body(json!({"stdout": ["up"], "echo": true})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    // An id no session has, of the same shape.
    let unknown = "zzzzzzzzzzzz";
    assert_ne!(id, unknown);

    let routes: Vec<(Method, &str, Option<Value>)> = vec![
        (Method::GET, "/v1/sessions/{id}", None),
        (Method::GET, "/v1/sessions/{id}/events", None),
        (Method::GET, "/v1/sessions/{id}/workspace", None),
        (
            Method::GET,
            "/v1/sessions/{id}/workspace/file?path=telo.yaml",
            None,
        ),
        (
            Method::POST,
            "/v1/sessions/{id}/workspace",
            Some(json!({"write": [{"path": "x.txt", "content": "bob was here"}]})),
        ),
        (Method::POST, "/v1/sessions/{id}/reload", None),
        (
            Method::PUT,
            "/v1/sessions/{id}/apps",
            Some(json!({"apps": [{"name": "app", "entry": "telo.yaml"}]})),
        ),
        (Method::POST, "/v1/sessions/{id}/resume", None),
        (Method::DELETE, "/v1/sessions/{id}", None),
    ];
    for route in &routes {
        let foreign = answer(&runner, route, &id, BOB).await;
        let missing = answer(&runner, route, unknown, BOB).await;
        assert_eq!(foreign, missing, "{} {}", route.0, route.1);
    }
    assert_eq!(
        io_close(&runner, &id, BOB).await,
        io_close(&runner, unknown, BOB).await
    );
    assert!(!listed(&runner, BOB).await.contains(&id));

    // Bob's DELETE left it running, untouched: its owner still sees it
    // live, with no file of bob's.
    assert_eq!(listed(&runner, ALICE).await, std::slice::from_ref(&id));
    let (status, _, session) = send(
        &runner,
        Method::GET,
        &format!("/v1/sessions/{id}"),
        Some(ALICE),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !session["status"]["kind"].as_str().unwrap().ends_with("ped"),
        "{session}"
    );
    let (status, _, file) = send(
        &runner,
        Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=x.txt"),
        Some(ALICE),
        None,
    )
    .await;
    assert_ne!(status, StatusCode::OK, "{file}");

    // The admin sees every session and may stop it.
    assert!(listed(&runner, ROOT).await.contains(&id));
    let (status, _, _) = send(
        &runner,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        Some(ROOT),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let lines = audit_lines(&audit);
    let created_line = lines
        .iter()
        .find(|line| line["event"] == "session.create")
        .unwrap();
    assert_eq!(created_line["outcome"], "allowed");
    assert_eq!(created_line["principal"], "token:alice");
    assert_eq!(created_line["tenant"], "acme");
    assert_eq!(created_line["session"], id.as_str());
    let stops: Vec<&Value> = lines
        .iter()
        .filter(|line| line["event"] == "session.stop")
        .collect();
    assert_eq!(
        stops.len(),
        1,
        "bob's refused DELETE stopped nothing: {lines:?}"
    );
    assert_eq!(stops[0]["principal"], "token:ops");
    assert_eq!(stops[0]["admin"], true);
    assert_eq!(stops[0]["owner"], "token:alice");
    assert_eq!(stops[0]["outcome"], "allowed");
    let text = std::fs::read_to_string(&audit).unwrap();
    for secret in [ALICE, BOB, ROOT] {
        assert!(!text.contains(secret), "the audit log shows a token");
    }
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_session_quota_holds_under_a_concurrent_burst(#[case] backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let tiers = dir.path().join("tiers.yaml");
    std::fs::write(
        &tiers,
        "tiers:\n  default: { sessions: 3 }\n  small: { sessions: 1 }\ntenants:\n  globex: small\n",
    )
    .unwrap();
    let runner = Runner::start_on(
        backend,
        &[
            ("RUNNER_AUTH_TOKENS_FILE", tokens.as_str()),
            ("RUNNER_TIERS_FILE", tiers.to_str().unwrap()),
        ],
    )
    .await;
    let body = start_body(json!({"stdout": ["up"], "echo": true}));
    let burst: Vec<_> = (0..10).map(|_| create(&runner, ALICE, &body)).collect();
    let answers = futures_util::future::join_all(burst).await;
    let created = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::CREATED)
        .count();
    assert_eq!(created, 3, "{answers:?}");
    let (status, refused) = answers
        .iter()
        .find(|(status, _)| *status != StatusCode::CREATED)
        .unwrap();
    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused["error"], "quota_exceeded");
    assert_eq!(refused["quota"], "sessions");
    assert_eq!(refused["limit"], 3);
    assert_eq!(refused["used"], 3);

    // Another tenant counts its own sessions, in its own tier: exactly at
    // its limit of one, then one over.
    let (status, first) = create(&runner, BOB, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, over) = create(&runner, BOB, &body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{over}");
    assert_eq!(
        (over["limit"].clone(), over["used"].clone()),
        (json!(1), json!(1))
    );

    // Stopping one makes room again.
    let id = first["sessionId"].as_str().unwrap();
    let (status, _, _) = send(
        &runner,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        Some(BOB),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, again) = create(&runner, BOB, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");

    // The capabilities tell a principal its tier and use.
    let (status, _, capabilities) =
        send(&runner, Method::GET, "/v1/capabilities", Some(BOB), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(capabilities["limits"]["tier"], "small");
    assert_eq!(capabilities["limits"]["tenant"], "globex");
    assert_eq!(capabilities["limits"]["limits"]["sessions"], 1);
    assert_eq!(capabilities["limits"]["used"]["sessions"], 1);
    let (_, _, anonymous) = send(&runner, Method::GET, "/v1/capabilities", None, None).await;
    assert!(anonymous.get("limits").is_none(), "{anonymous}");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_past_its_rate_gets_429_with_retry_after_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let tiers = dir.path().join("tiers.json");
    std::fs::write(
        &tiers,
        r#"{"tiers": {"default": {"requestsPerMinute": 5, "startsPerMinute": 1}}}"#,
    )
    .unwrap();
    let audit = dir.path().join("audit.log");
    let runner = Runner::start_with(&[
        ("RUNNER_AUTH_TOKENS_FILE", tokens.as_str()),
        ("RUNNER_TIERS_FILE", tiers.to_str().unwrap()),
        ("RUNNER_AUDIT_LOG", audit.to_str().unwrap()),
    ])
    .await;
    for _ in 0..5 {
        let (status, _, body) = send(&runner, Method::GET, "/v1/sessions", Some(ALICE), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, headers, refused) =
        send(&runner, Method::GET, "/v1/sessions", Some(ALICE), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused["error"], "rate_limited");
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    // Bob's bucket is his own; his second start in a minute is refused.
    let body = start_body(json!({"stdout": ["up"], "exitAfterMs": 0}));
    let (status, created) = create(&runner, BOB, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, refused) = create(&runner, BOB, &body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert_eq!(refused["error"], "rate_limited");

    let (_, metrics) = runner.get("/metrics").await;
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(
        metrics.contains("telo_runner_access_refusals_total{reason=\"rate_limited\"} 2"),
        "{metrics}"
    );
    let lines = audit_lines(&audit);
    let limited = lines
        .iter()
        .find(|line| line["event"] == "request.rate_limited")
        .unwrap();
    assert_eq!(limited["principal"], "token:alice");
    assert_eq!(limited["outcome"], "refused");
    assert_eq!(limited["address"], "127.0.0.1");
    let refused_start = lines
        .iter()
        .find(|line| line["event"] == "session.create" && line["outcome"] == "refused")
        .unwrap();
    assert_eq!(refused_start["principal"], "token:bob");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_token_is_refused_with_a_reason_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let audit = dir.path().join("audit.log");
    let runner = Runner::start_with(&[
        ("RUNNER_AUTH_TOKENS_FILE", tokens.as_str()),
        ("RUNNER_AUDIT_LOG", audit.to_str().unwrap()),
    ])
    .await;
    let (status, _, refused) =
        send(&runner, Method::GET, "/v1/sessions", Some("guess"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused["message"],
        "this runner requires `Authorization: Bearer <token>`: the bearer token is not one this runner accepts"
    );
    let lines = audit_lines(&audit);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["event"], "auth.refused");
    assert_eq!(lines[0]["address"], "127.0.0.1");
    assert!(!std::fs::read_to_string(&audit).unwrap().contains("guess"));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_clients_own_their_sessions_by_address_in_the_anonymous_tier() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = dir.path().join("tiers.yaml");
    std::fs::write(&tiers, "tiers:\n  anonymous: { sessions: 1 }\n").unwrap();
    let runner = Runner::start_with(&[
        ("RUNNER_ANONYMOUS", "1"),
        ("RUNNER_TIERS_FILE", tiers.to_str().unwrap()),
    ])
    .await;
    let (_, capabilities) = runner.get("/v1/capabilities").await;
    assert!(
        capabilities["features"].get("auth").is_none(),
        "{capabilities}"
    );
    assert_eq!(capabilities["limits"]["tier"], "anonymous");
    assert_eq!(capabilities["limits"]["principal"], "address:127.0.0.1");
    let body = start_body(json!({"stdout": ["up"], "echo": true}));
    let (status, created) = runner.post("/v1/sessions", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, refused) = runner.post("/v1/sessions", &body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert_eq!(refused["quota"], "sessions");
    let (status, listed) = runner.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1);
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiers_file_change_applies_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let tiers = dir.path().join("tiers.yaml");
    std::fs::write(&tiers, "tiers:\n  default: { sessions: 0 }\n").unwrap();
    let runner = Runner::start_with(&[
        ("RUNNER_AUTH_TOKENS_FILE", tokens.as_str()),
        ("RUNNER_TIERS_FILE", tiers.to_str().unwrap()),
    ])
    .await;
    let body = start_body(json!({"stdout": ["up"], "exitAfterMs": 0}));
    let (status, _) = create(&runner, ALICE, &body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    std::fs::write(&tiers, "tiers:\n  default: { sessions: 5 }\n").unwrap();
    // Read again within its poll period (10 s): wait for the new limit.
    let deadline = std::time::Instant::now() + test_support::WAIT;
    loop {
        let (_, _, capabilities) =
            send(&runner, Method::GET, "/v1/capabilities", Some(ALICE), None).await;
        if capabilities["limits"]["limits"]["sessions"] == 5 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{capabilities}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (status, created) = create(&runner, ALICE, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    runner.stop().await;
}

/// A test issuer: an Ed25519 key, published as a JWKS file.
struct Issuer {
    key: jsonwebtoken::EncodingKey,
    jwks: std::path::PathBuf,
}

const ISSUER: &str = "https://id.example.test";
const AUDIENCE: &str = "telo-runner";

impl Issuer {
    fn new(dir: &std::path::Path) -> Self {
        use base64::Engine as _;
        use ring::signature::{Ed25519KeyPair, KeyPair as _};
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        let jwks = dir.join("jwks.json");
        std::fs::write(
            &jwks,
            json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": "k1", "x": x}]})
                .to_string(),
        )
        .unwrap();
        Self {
            key: jsonwebtoken::EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwks,
        }
    }

    /// A token for `subject` of `org`, in `groups`, valid from `from` to
    /// `until` seconds from now.
    fn token(&self, subject: &str, org: &str, groups: &[&str], from: i64, until: i64) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some("k1".into());
        jsonwebtoken::encode(
            &header,
            &json!({
                "iss": ISSUER, "aud": AUDIENCE, "sub": subject, "org": org, "groups": groups,
                "iat": now + from, "nbf": now + from, "exp": now + until,
            }),
            &self.key,
        )
        .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_principals_own_their_sessions_and_bad_tokens_get_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    let runner = Runner::start_with(&[
        ("RUNNER_OIDC_ISSUER", ISSUER),
        ("RUNNER_OIDC_AUDIENCE", AUDIENCE),
        ("RUNNER_OIDC_JWKS_FILE", issuer.jwks.to_str().unwrap()),
        ("RUNNER_OIDC_TENANT_CLAIM", "org"),
    ])
    .await;
    let (_, capabilities) = runner.get("/v1/capabilities").await;
    assert_eq!(capabilities["features"]["auth"], json!({"type": "bearer"}));

    let carol = issuer.token("carol", "acme", &[], 0, 600);
    let dave = issuer.token("dave", "acme", &["dev"], 0, 600);
    let admin = issuer.token("erin", "ops", &["telo-admins"], 0, 600);
    let (status, created) = create(
        &runner,
        &carol,
        &start_body(json!({"stdout": ["up"], "echo": true})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    // A colleague of the same tenant is another principal.
    assert_eq!(listed(&runner, &carol).await, std::slice::from_ref(&id));
    assert!(listed(&runner, &dave).await.is_empty());
    assert_eq!(listed(&runner, &admin).await, std::slice::from_ref(&id));
    let (_, _, capabilities) =
        send(&runner, Method::GET, "/v1/capabilities", Some(&carol), None).await;
    assert_eq!(capabilities["limits"]["principal"], "oidc:carol");
    assert_eq!(capabilities["limits"]["tenant"], "acme");
    assert_eq!(capabilities["limits"]["used"]["sessions"], 1);

    let cases = [
        (
            issuer.token("carol", "acme", &[], -3600, -600),
            "the token expired at",
        ),
        (
            issuer.token("carol", "acme", &[], 600, 1200),
            "the token is not valid before",
        ),
        (
            "not.a.jwt".to_owned(),
            "the token's header is not a JSON object",
        ),
    ];
    for (token, reason) in cases {
        let (status, headers, refused) =
            send(&runner, Method::GET, "/v1/sessions", Some(&token), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
        assert_eq!(headers["www-authenticate"], "Bearer");
        let message = refused["message"].as_str().unwrap();
        assert!(message.contains(reason), "{message}");
    }
    runner.stop().await;
}

/// A webhook receiver on loopback: every delivery's headers and body.
struct Receiver {
    url: String,
    deliveries: tokio::sync::mpsc::UnboundedReceiver<(reqwest::header::HeaderMap, bytes::Bytes)>,
    server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Self {
        let (tx, deliveries) = tokio::sync::mpsc::unbounded_channel();
        let app = axum::Router::new().route(
            "/hooks",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: bytes::Bytes| {
                let tx = tx.clone();
                async move {
                    let mut copied = reqwest::header::HeaderMap::new();
                    for (name, value) in &headers {
                        copied.insert(
                            reqwest::header::HeaderName::from_bytes(name.as_str().as_bytes())
                                .unwrap(),
                            reqwest::header::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                        );
                    }
                    let _ = tx.send((copied, body));
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url,
            deliveries,
            server,
        }
    }

    async fn next(&mut self, secret: &[u8]) -> Value {
        let (headers, body) = tokio::time::timeout(test_support::WAIT, self.deliveries.recv())
            .await
            .expect("a delivery in time")
            .unwrap();
        assert_eq!(
            headers["content-type"], "application/cloudevents+json",
            "{headers:?}"
        );
        assert!(runner_core::webhooks::verify(
            secret,
            headers["webhook-timestamp"].to_str().unwrap(),
            headers["webhook-signature"].to_str().unwrap(),
            &body,
        ));
        serde_json::from_slice(&body).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_lifecycle_reaches_the_webhook_signed_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let secret_file = dir.path().join("webhook-secret");
    std::fs::write(&secret_file, "hook-secret\n").unwrap();
    let mut receiver = Receiver::start().await;
    let runner = Runner::start_with(&[
        ("RUNNER_AUTH_TOKENS_FILE", tokens.as_str()),
        ("RUNNER_WEBHOOK_URL", receiver.url.as_str()),
        ("RUNNER_WEBHOOK_SECRET_FILE", secret_file.to_str().unwrap()),
    ])
    .await;
    let (status, created) = create(
        &runner,
        ALICE,
        &start_body(json!({"stdout": ["done"], "exitCode": 3, "exitAfterMs": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap();
    let mut kinds = Vec::new();
    loop {
        let event = receiver.next(b"hook-secret").await;
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["source"], "telo-runner");
        assert_eq!(event["subject"], id);
        assert_eq!(event["data"]["sessionId"], id);
        assert_eq!(event["data"]["mode"], "run");
        assert_eq!(event["data"]["tenant"], "acme");
        assert_eq!(event["data"]["principal"], "token:alice");
        let kind = event["type"].as_str().unwrap().to_owned();
        if kind.ends_with(".ended") {
            assert_eq!(event["data"]["status"], "exited");
            assert_eq!(event["data"]["exitCode"], 3);
        }
        kinds.push(kind);
        if kinds.last().unwrap().ends_with(".ended") {
            break;
        }
    }
    assert_eq!(
        kinds,
        [
            "dev.telo.runner.session.created",
            "dev.telo.runner.session.running",
            "dev.telo.runner.session.ended"
        ]
    );
    // Counted once the receiver answered; wait for the third.
    let deadline = std::time::Instant::now() + test_support::WAIT;
    loop {
        let (_, metrics) = runner.get("/metrics").await;
        if metrics
            .as_str()
            .unwrap()
            .contains("telo_runner_webhook_deliveries_total{outcome=\"delivered\"} 3")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    runner.stop().await;
    receiver.server.abort();
    let _ = receiver.server.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_watch_session_still_belongs_to_its_principal_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let mut vars = vec![("RUNNER_AUTH_TOKENS_FILE", tokens.as_str())];
    vars.extend_from_slice(WATCH);
    let runner = Runner::start_with(&vars).await;
    let (status, created) = create(
        &runner,
        ALICE,
        &watch_body(json!({"stdout": ["up"], "echo": true})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    // Up, so the graceful stop checkpoints it for the next runner.
    let mut events = runner
        .events(&id, &[("authorization", &format!("Bearer {ALICE}"))])
        .await;
    common::watch::run_event(&mut events, "app", "started", 1).await;
    drop(events);
    let work_dir = runner.work_dir.path().join("sessions");
    let Runner {
        service,
        work_dir: kept,
        ..
    } = runner;
    service.unwrap().stop().await.expect("clean shutdown");

    let work_dir = work_dir.to_string_lossy().into_owned();
    vars.push(("RUNNER_LOCAL_WORK_DIR", work_dir.as_str()));
    let next = Runner::start_with(&vars).await;
    let deadline = std::time::Instant::now() + test_support::WAIT;
    while !listed(&next, ALICE).await.contains(&id) {
        assert!(std::time::Instant::now() < deadline, "never listed again");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!listed(&next, BOB).await.contains(&id));
    let (status, _, _) = send(
        &next,
        Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        Some(BOB),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    next.stop().await;
    drop(kept);
}
