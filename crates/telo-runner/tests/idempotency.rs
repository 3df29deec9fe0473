//! `Idempotency-Key` on session creation, at both doors: a retried POST
//! with the same key and body gets the session it already made (the same
//! `201` body, marked `Idempotent-Replayed`) and no second session; the
//! same key with another body is `422 idempotency_key_reused`; a key is
//! its token's, and a malformed one is `400`.
#![allow(clippy::unwrap_used)]

mod common;

use common::Runner;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::bundle::start_body;

async fn post(
    runner: &Runner,
    path: &str,
    key: &str,
    token: Option<&str>,
    body: &Value,
) -> (StatusCode, Option<String>, Value) {
    let mut request = runner_core::http_client::client()
        .post(format!("{}{path}", runner.base))
        .header("idempotency-key", key)
        .json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|value| value.to_str().unwrap().to_owned());
    (status, replayed, response.json().await.unwrap())
}

async fn session_count(runner: &Runner) -> usize {
    let (status, listed) = runner.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);
    listed["sessions"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_retried_bundle_session_gets_its_session_and_another_body_is_refused() {
    let runner = Runner::start_with(&[]).await;
    let body = start_body(json!({"stdout": ["once"], "exitCode": 0}));
    let (status, replayed, first) = post(&runner, "/v1/sessions", "retry-1", None, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(replayed, None);
    // The same request again, its keys in another order.
    let reordered = Value::Object(
        body.as_object()
            .unwrap()
            .iter()
            .rev()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
    );
    assert_ne!(
        serde_json::to_string(&reordered).unwrap(),
        serde_json::to_string(&body).unwrap()
    );
    let (status, replayed, again) =
        post(&runner, "/v1/sessions", "retry-1", None, &reordered).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(again, first);
    assert_eq!(session_count(&runner).await, 1);

    let other = start_body(json!({"stdout": ["twice"], "exitCode": 0}));
    let (status, _, refused) = post(&runner, "/v1/sessions", "retry-1", None, &other).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        refused,
        json!({
            "error": "idempotency_key_reused",
            "message": "Idempotency-Key 'retry-1' was already used with a different request",
        })
    );
    // Another key is another session.
    let (status, _, second) = post(&runner, "/v1/sessions", "retry-2", None, &other).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(second["sessionId"], first["sessionId"]);
    assert_eq!(session_count(&runner).await, 2);

    let (status, _, malformed) = post(&runner, "/v1/sessions", "two words", None, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(malformed["error"], "invalid_idempotency_key");
    runner.stop().await;
}

#[tokio::test]
async fn a_refused_request_leaves_its_key_free_and_keys_are_each_tokens_own() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "token-a\ntoken-b\n").unwrap();
    let runner = Runner::start_with(&[("RUNNER_AUTH_TOKENS_FILE", tokens.to_str().unwrap())]).await;
    let body = start_body(json!({"exitCode": 0}));
    // Refused (no token): nothing is remembered under the key.
    let (status, _, _) = post(&runner, "/v1/sessions", "k", None, &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, replayed, a) = post(&runner, "/v1/sessions", "k", Some("token-a"), &body).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, None));
    // The same key from another token is that token's own.
    let (status, replayed, b) = post(&runner, "/v1/sessions", "k", Some("token-b"), &body).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, None));
    assert_ne!(a["sessionId"], b["sessionId"]);
    let (status, replayed, again) =
        post(&runner, "/v1/sessions", "k", Some("token-a"), &body).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (StatusCode::CREATED, Some("true"))
    );
    assert_eq!(again, a);
    runner.stop().await;
}

#[tokio::test]
async fn a_retried_app_session_gets_its_session() {
    let fake = test_support::fake_telo::fake_telo_path();
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("app.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: app }\nfakeTelo:\n  exitCode: 0\n",
    )
    .unwrap();
    let catalog = json!({
        "greeter": {
            "image": "acme/greeter:1",
            "command": [fake.to_string_lossy(), "run", manifest.to_string_lossy()],
        },
    })
    .to_string();
    let runner = Runner::start_with(&[("RUNNER_APPS", catalog.as_str())]).await;
    let path = "/v1/apps/greeter/sessions";
    let body = json!({"env": {"MODE": "dev"}});
    let (status, replayed, first) = post(&runner, path, "app-1", None, &body).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, None));
    let (status, replayed, again) = post(&runner, path, "app-1", None, &body).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (StatusCode::CREATED, Some("true"))
    );
    assert_eq!(again, first);
    // The key names a request to this door: the bundle door's same key is
    // another request.
    let (status, _, refused) = post(
        &runner,
        "/v1/sessions",
        "app-1",
        None,
        &start_body(json!({"exitCode": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused["error"], "idempotency_key_reused");
    let (status, _, refused) = post(
        &runner,
        path,
        "app-1",
        None,
        &json!({"env": {"MODE": "prod"}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused["error"], "idempotency_key_reused");
    assert_eq!(session_count(&runner).await, 1);
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_of_one_key_make_one_session() {
    let runner = Runner::start_with(&[]).await;
    let body = start_body(json!({"stdout": ["once"], "echo": true}));
    let tries = (0..20).map(|_| post(&runner, "/v1/sessions", "burst-1", None, &body));
    let answers = futures_util::future::join_all(tries).await;
    let mut created = std::collections::HashSet::new();
    for (status, _, answer) in &answers {
        match *status {
            StatusCode::CREATED => {
                created.insert(answer["sessionId"].as_str().unwrap().to_owned());
            }
            StatusCode::CONFLICT => assert_eq!(answer["error"], "idempotency_key_in_flight"),
            other => panic!("{other}: {answer}"),
        }
    }
    assert_eq!(created.len(), 1, "{answers:?}");
    // A retry after the burst gets that same session.
    let (status, replayed, again) = post(&runner, "/v1/sessions", "burst-1", None, &body).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(replayed.as_deref(), Some("true"));
    assert!(created.contains(again["sessionId"].as_str().unwrap()));
    assert_eq!(session_count(&runner).await, 1);
    runner.stop().await;
}
