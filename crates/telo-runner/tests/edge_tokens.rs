//! Workload tokens at the edge, black-box on the Kubernetes backend: every
//! session Ingress carries the operator's annotations (an ingress
//! controller's external-auth URL), and the runner answers that check —
//! `204` for a request presenting the session's token or to a session
//! without one, `401` otherwise — also after a restart, for a session the
//! next runner adopted.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, RunnerProcess};
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::sse::SseStream;

const DOMAIN: &str = "sessions.example.com";
const AUTH_URL: &str = "nginx.ingress.kubernetes.io/auth-url";

/// Two catalog entries on one image (its entrypoint listens on 8080), one
/// with a workload token.
fn catalog() -> String {
    json!({
        "tokened": {"image": "acme/tokened:1", "tokenEnv": "APP_TOKEN"},
        "open": {"image": "acme/tokened:1"},
    })
    .to_string()
}

/// Creates an app session of `app` publishing port 8080 and returns its id
/// and the token its `running` endpoints carry.
async fn app_session(runner: &RunnerProcess, app: &str) -> (String, Option<String>) {
    let client = runner_core::http_client::client();
    let created: Value = client
        .post(format!("{}/v1/apps/{app}/sessions", runner.base))
        .json(&json!({"ports": [{"port": 8080, "protocol": "tcp"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().expect("created").to_owned();
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", runner.base), &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let running = frames.last().unwrap().json();
    let token = running["status"]["endpoints"][0]["token"]
        .as_str()
        .map(str::to_owned);
    (id, token)
}

/// What the edge check answers for session `id` with `bearer` presented.
async fn edge_check(runner: &RunnerProcess, id: &str, bearer: Option<&str>) -> StatusCode {
    let client = runner_core::http_client::client();
    let mut request = client.get(format!("{}/internal/sessions/{id}/access", runner.base));
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    if status == StatusCode::UNAUTHORIZED {
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer realm=\"telo session\""
        );
    }
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_checks_a_sessions_token_through_the_ingress_annotation_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("app.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: tokened }\nfakeTelo:\n  listen: [8080]\n",
    )
    .unwrap();
    let sim = common::cluster()
        .ingress_class("nginx", false)
        .image(
            "acme/tokened:*",
            kube_sim::ImageBehaviour::FakeTeloEntry(manifest.clone()),
        )
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .expect("kube-sim starts");
    let catalog = catalog();
    let annotations = json!({
        AUTH_URL: "http://telo-runner.telo-runner.svc:8062/internal/sessions/{sessionId}/access",
        "example.com/session": "{sessionId}",
    })
    .to_string();
    let vars = [
        ("SESSION_ROUTING_BASE_DOMAIN", DOMAIN),
        ("SESSION_ROUTING_MODE", "ingress"),
        ("SESSION_INGRESS_CLASS", "nginx"),
        ("SESSION_INGRESS_ANNOTATIONS", annotations.as_str()),
        ("RUNNER_APPS", catalog.as_str()),
    ];
    let mut first = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    let (id, token) = app_session(&first, "tokened").await;
    let token = token.expect("the endpoint carries the token");
    let (open, no_token) = app_session(&first, "open").await;
    assert_eq!(no_token, None);

    let ingress = sim
        .get_value("ingresses", "telo-sessions", &format!("telo-run-{id}"))
        .expect("the session's Ingress");
    assert_eq!(
        ingress["metadata"]["annotations"],
        json!({
            AUTH_URL: format!("http://telo-runner.telo-runner.svc:8062/internal/sessions/{id}/access"),
            "example.com/session": id,
        })
    );

    assert_eq!(
        edge_check(&first, &id, None).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        edge_check(&first, &id, Some("not-the-token")).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        edge_check(&first, &id, Some(&token)).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        edge_check(&first, &open, None).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        edge_check(&first, "nosuchsession", Some(&token)).await,
        StatusCode::UNAUTHORIZED
    );

    // The next runner adopts the pod: it never saw the token, only the
    // digest its record keeps, and checks it all the same.
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");
    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    common::watch::ready(&second.base).await;
    common::watch::until_status_at(
        &runner_core::http_client::client(),
        &second.base,
        &id,
        "running",
    )
    .await;
    assert_eq!(
        edge_check(&second, &id, Some(&token)).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        edge_check(&second, &id, Some("not-the-token")).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        edge_check(&second, &open, None).await,
        StatusCode::NO_CONTENT
    );
    drop(second);
    sim.shutdown().await;
}
