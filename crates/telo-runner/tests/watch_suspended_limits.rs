//! Suspended watch sessions are someone's kept work: never evicted to admit
//! another session, bounded on their own, on both backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::watch::*;
use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::json;
use test_support::WAIT;
use test_support::sse::SseFrame;

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_sessions_at_the_limit_never_evict_a_suspended_session(#[case] backend: Backend) {
    let runner = Runner::start_on(
        backend,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WATCH_IDLE_SECONDS", "1"),
            ("RUNNER_MAX_SESSIONS", "2"),
        ],
    )
    .await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["editing"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "kept.txt", "content": "my work"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    drop(events);
    until_status(&runner, &id, "suspended").await;
    // Another tenant's batch sessions, one after another, at the limit.
    for _ in 0..3 {
        let batch = runner.create(json!({"stdout": ["batch"]})).await;
        runner.wait_terminal(&batch).await;
    }
    let snapshot = status_of(&runner, &id).await;
    assert_eq!(
        snapshot["status"],
        json!({"kind": "suspended"}),
        "{snapshot}"
    );
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until_status(&runner, &id, "running").await;
    let (status, file) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=kept.txt"),
        None,
    )
    .await;
    assert_eq!(
        (status, &file["content"]),
        (StatusCode::OK, &json!("my work")),
        "{file}"
    );
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// At `RUNNER_WATCH_MAX_SUSPENDED` an idle session keeps running, and its
/// clients are told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_suspended_bound_an_idle_session_keeps_running_and_says_so() {
    let runner = Runner::start_with(&[
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_IDLE_SECONDS", "1"),
        ("RUNNER_WATCH_MAX_SUSPENDED", "1"),
    ])
    .await;
    let first = runner
        .create_body(watch_body(json!({"stdout": ["first"]})))
        .await;
    let mut events = runner.events(&first, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    drop(events);
    until_status(&runner, &first, "suspended").await;

    let second = runner
        .create_body(watch_body(json!({"stdout": ["second"]})))
        .await;
    let mut events = runner.events(&second, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    // Watched, it is not idle: each look at its events is followed by more
    // than the idle time without one.
    drop(events);
    let notice = |f: &SseFrame| {
        f.event.as_deref() == Some("progress")
            && f.json()["message"]
                == "this idle session keeps running: the runner already keeps 1 suspended sessions (RUNNER_WATCH_MAX_SUSPENDED)"
    };
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let mut replay = runner.events(&second, &[]).await;
        let mut seen = Vec::new();
        // The replay comes at once; a quiet moment ends it.
        while let Ok(Some(frame)) =
            tokio::time::timeout(std::time::Duration::from_millis(300), replay.next_frame()).await
        {
            seen.push(frame);
        }
        if seen.iter().any(notice) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never told: {seen:?}");
    }
    let snapshot = status_of(&runner, &second).await;
    assert_eq!(snapshot["status"]["kind"], "running", "{snapshot}");
    runner.delete(&format!("/v1/sessions/{second}")).await;
    runner.delete(&format!("/v1/sessions/{first}")).await;
    runner.stop().await;
}

/// A DELETE that races a resume on Kubernetes: the session's checkpoint
/// Secret goes with it, so no later runner brings the deleted session back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_a_resume_leaves_no_checkpoint_behind() {
    let runner = Runner::start_on(
        Backend::Kubernetes,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WATCH_IDLE_SECONDS", "1"),
        ],
    )
    .await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["editing"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    drop(events);
    until_status(&runner, &id, "suspended").await;
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    until_status(&runner, &id, "stopped").await;
    let sim = runner.sim.as_ref().unwrap();
    let secret = format!("telo-watch-{id}");
    let deadline = std::time::Instant::now() + WAIT;
    while sim.get_value("secrets", "telo-sessions", &secret).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the deleted session's checkpoint Secret stays"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    runner.stop().await;
}
