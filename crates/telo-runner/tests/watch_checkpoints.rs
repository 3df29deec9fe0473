//! Watch-session workspaces that cannot be checkpointed, on Kubernetes: the
//! session's clients are told, failures are not retried at every supervisor
//! round, and a runner restart takes the live pod over with its newest files
//! instead of deleting it and resuming an older checkpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::RunnerProcess;
use common::watch::*;
use common::{Backend, Runner};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use test_support::WAIT;
use test_support::sse::{SseFrame, SseStream};

/// `len` characters of pseudo-random text over 64 symbols: about six bits of
/// entropy per byte, so gzip keeps roughly three quarters of it.
fn incompressible(len: usize, mut seed: u64) -> String {
    const SYMBOLS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            SYMBOLS[(seed % 64) as usize] as char
        })
        .collect()
}

/// Fills the session's workspace with about 2 MB of text no checkpoint in
/// a Secret can hold, in writes the default body limit admits.
async fn fill_beyond_a_checkpoint(client: &reqwest::Client, base: &str, id: &str) {
    for part in 0..4u64 {
        let (status, body) = request_at(
            client,
            base,
            reqwest::Method::POST,
            &format!("/v1/sessions/{id}/workspace"),
            Some(json!({"write": [{
                "path": format!("data/part-{part}.txt"),
                "content": incompressible(500 * 1024, part + 1),
            }]})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

fn checkpoint_notice(frame: &SseFrame) -> bool {
    frame.event.as_deref() == Some("progress")
        && frame.json()["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("the workspace could not be checkpointed"))
}

async fn notice(events: &mut SseStream) -> Value {
    tokio::time::timeout(WAIT, events.events_until(checkpoint_notice))
        .await
        .expect("the clients are told the workspace cannot be checkpointed")
        .last()
        .unwrap()
        .json()
}

fn metric(metrics: &str, line_start: &str) -> u64 {
    metrics
        .lines()
        .find(|line| line.starts_with(line_start))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// A workspace too large to checkpoint is tried again once per checkpoint
/// period, backing off, and never at every supervisor round (which made a
/// runner with a few such sessions spend its cores re-reading them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_that_cannot_be_checkpointed_is_told_and_retried_with_backoff() {
    let period = Duration::from_secs(1);
    let runner = Runner::start_kube(
        common::cluster(),
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WORKSPACE_CHECKPOINT_SECONDS", "1"),
        ],
    )
    .await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["serving"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    fill_beyond_a_checkpoint(&runner.client, &runner.base, &id).await;
    let told = notice(&mut events).await;
    let message = told["message"].as_str().unwrap();
    assert!(
        message.contains("a checkpoint in the cluster holds at most 1048576 bytes together"),
        "{message}"
    );
    // The failures from here: the first retry waits a period, the next two.
    let failed = "telo_runner_workspace_checkpoints_total{outcome=\"failed\"}";
    let count = || async {
        let (_, metrics) = runner.get("/metrics").await;
        metric(metrics.as_str().unwrap_or_default(), failed)
    };
    let first = count().await;
    assert!(first >= 1);
    let since = Instant::now();
    let deadline = since + WAIT;
    while count().await < first + 2 {
        assert!(Instant::now() < deadline, "no retries");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        since.elapsed() >= period * 2,
        "two retries within {:?} of a failure: not backed off",
        since.elapsed()
    );
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// The record and the files share the session's Secret: a record made large
/// by the session's environment leaves less room for the files, and the
/// refusal says so instead of every checkpoint failing at the apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_size_check_counts_the_record_beside_the_files() {
    let runner = Runner::start_kube(common::cluster(), WATCH).await;
    let mut body = watch_body(json!({"stdout": ["serving"]}));
    let env: serde_json::Map<String, Value> = (0..7)
        .map(|i| {
            (
                format!("BIG_{i}"),
                json!(incompressible(120 * 1024, 50 + i)),
            )
        })
        .collect();
    body["env"] = Value::Object(env);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "big.txt", "content": incompressible(300 * 1024, 9)}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let told = notice(&mut events).await;
    let message = told["message"].as_str().unwrap();
    assert!(message.contains("and the session's record"), "{message}");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// A routine restart of a runner whose watch session grew past what a
/// checkpoint holds: the successor takes the live pod over, its newest
/// files with it, instead of deleting it and resuming the last checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_takes_over_a_pod_whose_workspace_cannot_be_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .expect("kube-sim starts");
    let client = runner_core::http_client::client();
    let mut first = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), WATCH).await;
    let (status, created) = request_at(
        &client,
        &first.base,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(watch_body(json!({"stdout": ["serving"]}))),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", first.base), &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    fill_beyond_a_checkpoint(&client, &first.base, &id).await;
    let (status, _) = request_at(
        &client,
        &first.base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "newest.txt", "content": "written last"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    notice(&mut events).await;
    drop(events);
    let pod = format!("telo-watch-{id}");
    let uid = |sim: &kube_sim::KubeSim| {
        sim.get_value("pods", "telo-sessions", &pod)
            .map(|p| p["metadata"]["uid"].clone())
    };
    let before = uid(&sim).expect("the watch pod");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    first.child.wait().expect("reaped");

    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), WATCH).await;
    ready(&second.base).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, snapshot) = request_at(
            &client,
            &second.base,
            reqwest::Method::GET,
            &format!("/v1/sessions/{id}"),
            None,
        )
        .await;
        if snapshot["status"]["kind"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "not taken over: {snapshot}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(uid(&sim), Some(before), "the live pod was replaced");
    let (status, file) = request_at(
        &client,
        &second.base,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=newest.txt"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{file}");
    assert_eq!(file["content"], "written last");
    request_at(
        &client,
        &second.base,
        reqwest::Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
    )
    .await;
}
