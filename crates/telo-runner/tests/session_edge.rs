//! The session edge (`RUNNER_PREVIEW_BASE_URL`): the runner itself serves
//! each session port at `<port>-<sessionId>.<base host>`, on both backends;
//! `running` endpoints carry that URL; anything that is not such a host is
//! the API, and a request never goes anywhere but a published port of a
//! running session.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};

const BASE: &str = "http://preview.test";

async fn via_host(runner: &Runner, host: &str) -> (StatusCode, String) {
    let response = runner
        .client
        .get(runner.url("/hello?x=1"))
        .header("host", host)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

fn error_of(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap()["error"].clone()
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_port_is_served_at_its_session_host_and_nothing_else_is(
    #[case] backend: Backend,
) {
    let runner = Runner::start_on(backend, &[("RUNNER_PREVIEW_BASE_URL", BASE)]).await;
    let port = test_support::free_port();
    let mut body = test_support::bundle::start_body(json!({"listen": [port], "echo": true}));
    body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let running = frames.last().unwrap().json();
    let endpoint = &running["status"]["endpoints"][0];
    assert_eq!(endpoint["port"], port);
    assert_eq!(endpoint["url"], format!("http://{port}-{id}.preview.test"));

    // The session's own port, through the edge (the app may take a moment
    // to listen after `running`: wait for it, bounded).
    let host = format!("{port}-{id}.preview.test");
    let deadline = std::time::Instant::now() + test_support::WAIT;
    let answer = loop {
        let answer = via_host(&runner, &host).await;
        if answer.0 != StatusCode::BAD_GATEWAY {
            break answer;
        }
        assert!(std::time::Instant::now() < deadline, "{answer:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(answer, (StatusCode::OK, format!("ok {port}")));
    // Mixed case and a trailing dot name the same host.
    let upper = format!("{port}-{id}.PREVIEW.test.");
    assert_eq!(via_host(&runner, &upper).await.0, StatusCode::OK);

    // A port it does not publish, an unknown session: refused, named.
    let other = if port == 65535 { port - 1 } else { port + 1 };
    let (status, body) = via_host(&runner, &format!("{other}-{id}.preview.test")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body), "port_not_published");
    let (status, body) = via_host(&runner, &format!("{port}-zzzzzzzzzzzz.preview.test")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body), "unknown_session");
    // Malformed under the base: 421, never forwarded.
    for hostile in [
        format!("0{port}-{id}.preview.test"),
        format!("{port}-{id}.x.preview.test"),
        format!("{port}-{id}.preview.test:6443"),
    ] {
        let (status, body) = via_host(&runner, &hostile).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{hostile}: {body}");
    }
    // Not under the base: the API's, which has no `/hello`.
    let (status, body) = via_host(&runner, &format!("{port}-{id}.evil.test")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!body.contains("ok "), "{body}");

    // Ended: 410.
    runner.delete(&format!("/v1/sessions/{id}")).await;
    events.events_until_end().await;
    let (status, body) = via_host(&runner, &host).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    runner.stop().await;
}

#[tokio::test]
async fn the_preview_base_beside_a_routing_mode_that_publishes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster().start().await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_telo-runner"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("RUNNER_BACKEND", "kubernetes")
        .env("KUBECONFIG", &kubeconfig)
        .env("RUNNER_SELF_URL", "http://127.0.0.1:1")
        .env("RUNNER_PREVIEW_BASE_URL", BASE)
        .env("SESSION_ROUTING_MODE", "ingress")
        .env("SESSION_ROUTING_BASE_DOMAIN", "apps.example.com")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("RUNNER_PREVIEW_BASE_URL is set but so is SESSION_ROUTING_MODE=ingress"),
        "{stderr}"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_suspended_sessions_port_wakes_it() {
    let runner = Runner::start_with(&[
        ("RUNNER_PREVIEW_BASE_URL", BASE),
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_IDLE_SECONDS", "1"),
    ])
    .await;
    let port = test_support::free_port();
    let id = runner
        .create_body(common::watch::watch_body(
            json!({"listen": [port], "stdout": ["up"]}),
        ))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.event.as_deref() == Some("endpoints"))
        .await;
    assert_eq!(
        frames.last().unwrap().json()["added"][0]["url"],
        format!("http://{port}-{id}.preview.test")
    );
    drop(events);
    common::watch::until_status(&runner, &id, "suspended").await;

    // A plain request, no resume call: held while the session comes back,
    // then answered by its app.
    let host = format!("{port}-{id}.preview.test");
    let (status, body) = via_host(&runner, &host).await;
    assert_eq!((status, body), (StatusCode::OK, format!("ok {port}")));
    // It ran again: a second generation of its app (it may be suspended
    // again by now, one idle second later).
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(snapshot["apps"][0]["generation"], 2, "{snapshot}");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}
