//! Helpers of the watch-session suites: request bodies, plain requests,
//! and waits on a session's status or `run` events.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::sse::SseStream;

use super::Runner;

pub const WATCH: &[(&str, &str)] = &[("RUNNER_WATCH_SESSIONS", "true")];

pub fn manifest(fake_telo: Value) -> String {
    format!("kind: Telo.Application\nmetadata: {{ name: test }}\nfakeTelo: {fake_telo}\n")
}

pub fn watch_body(fake_telo: Value) -> Value {
    let mut body = test_support::bundle::start_body(fake_telo);
    body["mode"] = json!("watch");
    body
}

pub async fn request(
    runner: &Runner,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    request_at(&runner.client, &runner.base, method, path, body).await
}

/// A request to the runner at `base`: its status and its JSON (or text).
pub async fn request_at(
    client: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client.request(method, format!("{base}{path}"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Waits until the runner at `base` is ready: it has listed the sessions it
/// kept.
pub async fn ready(base: &str) {
    let client = runner_core::http_client::client();
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = client.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status() == StatusCode::OK) {
            return;
        }
        assert!(Instant::now() < deadline, "the runner never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads events until a `run` event for `app` with `phase` and
/// `generation`; returns it.
pub async fn run_event(events: &mut SseStream, app: &str, phase: &str, generation: u64) -> Value {
    let frames = events
        .events_until(|f| {
            f.event.as_deref() == Some("run")
                && f.json()["app"] == app
                && f.json()["phase"] == phase
                && f.json()["generation"] == generation
        })
        .await;
    frames.last().expect("the run event").json()
}

pub async fn status_of(runner: &Runner, id: &str) -> Value {
    runner.get(&format!("/v1/sessions/{id}")).await.1
}

/// Polls the session until its status is `kind` (no stream is open, so it
/// can go idle).
pub async fn until_status(runner: &Runner, id: &str, kind: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let snapshot = status_of(runner, id).await;
        if snapshot["status"]["kind"] == kind {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "never {kind}: {snapshot}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the runner at `base` until session `id` has status `kind`.
pub async fn until_status_at(client: &reqwest::Client, base: &str, id: &str, kind: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, snapshot) = request_at(
            client,
            base,
            reqwest::Method::GET,
            &format!("/v1/sessions/{id}"),
            None,
        )
        .await;
        if snapshot["status"]["kind"] == kind {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "never {kind}: {snapshot}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
