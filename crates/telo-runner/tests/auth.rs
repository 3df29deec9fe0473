//! Optional bearer-token authentication (`RUNNER_AUTH_TOKENS_FILE`), black-box
//! over real sockets on the local backend.
#![allow(clippy::unwrap_used)]

mod common;

use common::Runner;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use test_support::ws::{self, IoFrame};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const TOKEN: &str = "s3cret-token";

/// A runner whose token file holds `TOKEN` among comments, plus a one-app
/// catalog so the app route can be exercised.
async fn runner_with_auth(dir: &std::path::Path) -> Runner {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("# ci\n\nother-token\n  {TOKEN}  \n")).unwrap();
    let manifest = dir.join("demo.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: demo }\nfakeTelo:\n  exitCode: 0\n",
    )
    .unwrap();
    let fake = test_support::fake_telo::fake_telo_path();
    let apps = json!({"demo": {
        "image": "acme/demo:1",
        "command": [fake.to_string_lossy(), "run", manifest.to_string_lossy()],
    }})
    .to_string();
    Runner::start_with(&[
        ("RUNNER_AUTH_TOKENS_FILE", tokens.to_str().unwrap()),
        ("RUNNER_APPS", apps.as_str()),
    ])
    .await
}

async fn send(
    runner: &Runner,
    method: Method,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> reqwest::Response {
    let mut request = runner.client.request(method, runner.url(path));
    if let Some(body) = body {
        request = request.json(body);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

async fn assert_unauthorized(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
    assert_eq!(
        response.headers().get("www-authenticate").unwrap(),
        "Bearer",
        "{what}"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized", "{what}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}"
    );
}

#[tokio::test]
async fn every_gated_route_refuses_a_missing_or_wrong_token_and_serves_a_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with_auth(dir.path()).await;
    let start = test_support::bundle::start_body(json!({"exitCode": 0}));
    let created = send(
        &runner,
        Method::POST,
        "/v1/sessions",
        Some(&start),
        Some(TOKEN),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let id = created.json::<Value>().await.unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let probe = json!({"config": {"image": "telorun/node:0-slim", "pullPolicy": "missing"}});
    let gated: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, "/v1/openapi.json".into(), None),
        (Method::POST, "/v1/probe".into(), Some(probe)),
        (Method::GET, "/v1/sessions".into(), None),
        (Method::POST, "/v1/sessions".into(), Some(start.clone())),
        (
            Method::POST,
            "/v1/apps/demo/sessions".into(),
            Some(json!({})),
        ),
        (Method::GET, format!("/v1/sessions/{id}"), None),
        (Method::GET, format!("/v1/sessions/{id}/events"), None),
        (Method::GET, format!("/v1/sessions/{id}/io"), None),
        (Method::DELETE, format!("/v1/sessions/{id}"), None),
    ];
    for (method, path, body) in &gated {
        let what = format!("{method} {path}");
        let missing = send(&runner, method.clone(), path, body.as_ref(), None).await;
        assert_unauthorized(missing, &format!("{what} without a token")).await;
        let wrong = send(&runner, method.clone(), path, body.as_ref(), Some("s3cret")).await;
        assert_unauthorized(wrong, &format!("{what} with a wrong token")).await;
        if path.ends_with("/io") {
            // A plain GET is not an upgrade; the socket is tested below.
            continue;
        }
        let right = send(&runner, method.clone(), path, body.as_ref(), Some(TOKEN)).await;
        assert!(
            right.status().is_success(),
            "{what} with the token: {}",
            right.status()
        );
    }
    runner.stop().await;
}

#[tokio::test]
async fn discovery_probes_and_preflights_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with_auth(dir.path()).await;
    for path in ["/v1/health", "/v1/capabilities", "/livez", "/readyz"] {
        let mut response = send(&runner, Method::GET, path, None, None).await;
        // Readiness comes once boot-time recovery is done (a 503 until
        // then, never a 401): it is waited for, without a token.
        let deadline = std::time::Instant::now() + test_support::WAIT;
        while path == "/readyz"
            && response.status() == StatusCode::SERVICE_UNAVAILABLE
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            response = send(&runner, Method::GET, path, None, None).await;
        }
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
    }
    let (_, caps) = runner.get("/v1/capabilities").await;
    assert_eq!(caps["features"]["auth"], json!({"type": "bearer"}));
    let preflight = runner
        .client
        .request(Method::OPTIONS, runner.url("/v1/sessions"))
        .header("origin", "https://editor.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        preflight
            .headers()
            .get("access-control-allow-headers")
            .unwrap(),
        "authorization, content-type"
    );
    runner.stop().await;
}

#[tokio::test]
async fn without_a_token_file_nothing_is_gated_or_advertised() {
    let runner = Runner::start().await;
    let (status, _) = runner.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);
    let (_, caps) = runner.get("/v1/capabilities").await;
    assert!(caps["features"].get("auth").is_none(), "{caps}");
    runner.stop().await;
}

#[tokio::test]
async fn the_socket_closes_4401_without_a_token_and_serves_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with_auth(dir.path()).await;
    let start = test_support::bundle::start_body(json!({"echo": true}));
    let created = send(
        &runner,
        Method::POST,
        "/v1/sessions",
        Some(&start),
        Some(TOKEN),
    )
    .await;
    let id = created.json::<Value>().await.unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();

    for query in ["", "?access_token=wrong"] {
        let mut refused = runner.io(&id, query).await;
        assert_eq!(
            ws::next_frame(&mut refused).await.unwrap(),
            IoFrame::Close {
                code: 4401,
                reason: "unauthorized".into()
            },
            "query {query:?}"
        );
    }

    let mut by_query = runner
        .io(&id, &format!("?lastSeq=0&access_token={TOKEN}"))
        .await;
    assert_eq!(
        ws::next_frame(&mut by_query).await.unwrap(),
        IoFrame::Text(json!({"type": "seq", "seq": 0, "app": "app", "io": "tty"}))
    );

    let mut request = runner
        .ws_url(&format!("/v1/sessions/{id}/io"))
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let (by_header, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let mut by_header = ws::Socket::wrap(by_header, Default::default());
    assert_eq!(
        ws::next_frame(&mut by_header).await.unwrap(),
        IoFrame::Text(json!({"type": "seq", "seq": 0, "app": "app", "io": "tty"}))
    );
    send(
        &runner,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
        Some(TOKEN),
    )
    .await;
    runner.stop().await;
}

#[tokio::test]
async fn the_event_stream_takes_the_token_from_the_query() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with_auth(dir.path()).await;
    let start = test_support::bundle::start_body(json!({"exitCode": 0}));
    let created = send(
        &runner,
        Method::POST,
        "/v1/sessions",
        Some(&start),
        Some(TOKEN),
    )
    .await;
    let id = created.json::<Value>().await.unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let refused = runner.events_query(&id, "access_token=wrong", &[]).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let mut events = runner
        .events_query(&id, &format!("access_token={TOKEN}"), &[])
        .await;
    assert_eq!(events.status, StatusCode::OK);
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().and_then(|f| f.status_kind()).as_deref(),
        Some("exited")
    );
    runner.stop().await;
}
