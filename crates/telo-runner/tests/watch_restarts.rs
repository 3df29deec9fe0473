//! Watch sessions across runner restarts, black-box: a graceful restart
//! and a SIGKILL at every step of the editor's workflow leave each session
//! to the next runner with its files and app set, on both backends.

mod common;

use common::watch::*;
use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::sse::SseStream;
use test_support::ws::{self};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_session_survives_a_runner_restart_with_its_files() {
    let runner = Runner::start_with(WATCH).await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["before"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "kept.txt", "content": "still here"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    drop(events);
    // A graceful stop of the runner suspends the session for the next one.
    let work_dir = runner.work_dir.path().to_owned();
    let Runner {
        service,
        work_dir: dir,
        ..
    } = runner;
    service.unwrap().stop().await.expect("clean shutdown");

    let next = Runner::start_with(&[
        ("RUNNER_WATCH_SESSIONS", "true"),
        (
            "RUNNER_LOCAL_WORK_DIR",
            &work_dir.join("sessions").to_string_lossy(),
        ),
    ])
    .await;
    let snapshot = until_status(&next, &id, "suspended").await;
    assert_eq!(snapshot["mode"], "watch");
    let (status, _) = request(
        &next,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let mut events = next.events(&id, &[]).await;
    let resumed = run_event(&mut events, "app", "started", 1).await;
    assert_eq!(resumed["trigger"], "resume");
    let (_, file) = request(
        &next,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=kept.txt"),
        None,
    )
    .await;
    assert_eq!(file["content"], "still here");
    next.delete(&format!("/v1/sessions/{id}")).await;
    next.stop().await;
    drop(dir);
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_mid_session_lists_it_suspended_and_resumes_it_with_its_files(
    #[case] backend: Backend,
) {
    use common::RunnerProcess;
    let dir = tempfile::tempdir().unwrap();
    // The cluster outlives every runner process (Kubernetes only).
    let sim = common::cluster_for(backend).await;
    let client = runner_core::http_client::client();
    let send = |base: String, method: reqwest::Method, path: String, body: Option<Value>| {
        let client = client.clone();
        async move { request_at(&client, &base, method, &path, body).await }
    };
    let mut first = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), WATCH).await;
    let (status, created) = send(
        first.base.clone(),
        reqwest::Method::POST,
        "/v1/sessions".into(),
        Some(watch_body(json!({"stdout": ["before the crash"]}))),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", first.base), &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    let (status, _) = send(
        first.base.clone(),
        reqwest::Method::POST,
        format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "kept.txt", "content": "written before the crash"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    drop(events);
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");

    let second = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), WATCH).await;
    // Kept sessions are listed once the runner is ready.
    ready(&second.base).await;
    let (status, snapshot) = send(
        second.base.clone(),
        reqwest::Method::GET,
        format!("/v1/sessions/{id}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{snapshot}");
    let mut events = match backend {
        // Its processes died with the runner: listed suspended, resumed
        // from its files.
        Backend::Local => {
            assert_eq!(snapshot["status"], json!({"kind": "suspended"}));
            let (status, _) = send(
                second.base.clone(),
                reqwest::Method::POST,
                format!("/v1/sessions/{id}/resume"),
                None,
            )
            .await;
            assert_eq!(status, StatusCode::ACCEPTED);
            let mut events =
                SseStream::connect(&format!("{}/v1/sessions/{id}/events", second.base), &[]).await;
            run_event(&mut events, "app", "started", 1).await;
            events
        }
        // Its pod outlived the runner: adopted as it runs, its output so
        // far kept, edits reloading it as before.
        Backend::Kubernetes => {
            let mut events =
                SseStream::connect(&format!("{}/v1/sessions/{id}/events", second.base), &[]).await;
            events
                .events_until(|f| {
                    f.event.as_deref() == Some("status") && f.json()["status"]["kind"] == "running"
                })
                .await;
            let mut socket = ws::connect(
                &format!(
                    "{}/v1/sessions/{id}/io?app=app",
                    second.base.replacen("http", "ws", 1)
                ),
                None,
            )
            .await;
            ws::read_until_output(&mut socket, "before the crash").await;
            let (status, _) = send(
                second.base.clone(),
                reqwest::Method::POST,
                format!("/v1/sessions/{id}/workspace"),
                Some(json!({"write": [{"path": "telo.yaml", "content": manifest(json!({"stdout": ["after the crash"]}))}]})),
            )
            .await;
            assert_eq!(status, StatusCode::OK);
            let started = run_event(&mut events, "app", "started", 1).await;
            assert_eq!(started["trigger"], "watch");
            ws::read_until_output(&mut socket, "after the crash").await;
            events
        }
    };
    let (_, file) = send(
        second.base.clone(),
        reqwest::Method::GET,
        format!("/v1/sessions/{id}/workspace/file?path=kept.txt"),
        None,
    )
    .await;
    assert_eq!(file["content"], "written before the crash");
    // Stopped, it is gone for good: a third runner does not list it.
    let (status, _) = send(
        second.base.clone(),
        reqwest::Method::DELETE,
        format!("/v1/sessions/{id}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    drop(second);
    let third = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), WATCH).await;
    ready(&third.base).await;
    let (status, _) = send(
        third.base.clone(),
        reqwest::Method::GET,
        format!("/v1/sessions/{id}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Where in an editor's workflow the runner is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The session runs its first generation.
    Started,
    /// The session went idle and was suspended.
    Suspended,
    /// It was resumed and runs again.
    Resumed,
    /// Its app set was changed to two apps.
    AppsChanged,
}

/// A runner SIGKILLed at any step of the workflow: the next runner has the
/// session with its files — suspended when nothing of it ran on (local
/// processes die with the runner; a suspended session has no pod), adopted
/// running otherwise (a Kubernetes pod outlives the runner) — and the
/// workflow goes on from there.
#[rstest]
#[case::local_started(Backend::Local, Step::Started)]
#[case::local_suspended(Backend::Local, Step::Suspended)]
#[case::local_resumed(Backend::Local, Step::Resumed)]
#[case::local_apps_changed(Backend::Local, Step::AppsChanged)]
#[case::kubernetes_started(Backend::Kubernetes, Step::Started)]
#[case::kubernetes_suspended(Backend::Kubernetes, Step::Suspended)]
#[case::kubernetes_resumed(Backend::Kubernetes, Step::Resumed)]
#[case::kubernetes_apps_changed(Backend::Kubernetes, Step::AppsChanged)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_at_any_step_leaves_the_session_to_the_next_one(
    #[case] backend: Backend,
    #[case] step: Step,
) {
    use common::RunnerProcess;
    let dir = tempfile::tempdir().unwrap();
    let client = runner_core::http_client::client();
    let sim = common::cluster_for(backend).await;
    let idle: &[(&str, &str)] = &[
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_IDLE_SECONDS", "1"),
    ];
    let mut first = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), idle).await;
    let base = first.base.clone();
    let (status, created) = request_at(
        &client,
        &base,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(watch_body(json!({"stdout": ["first runner"]}))),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let events_url = format!("{base}/v1/sessions/{id}/events");
    let mut events = SseStream::connect(&events_url, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    let (status, _) = request_at(
        &client,
        &base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [
            {"path": "kept.txt", "content": "kept across the crash"},
            {"path": "api/telo.yaml", "content": manifest(json!({"stdout": ["the api"]}))},
        ]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let mut apps = vec!["app"];
    if step != Step::Started {
        drop(events);
        until_status_at(&client, &base, &id, "suspended").await;
        events = SseStream::connect(&events_url, &[]).await;
    }
    if matches!(step, Step::Resumed | Step::AppsChanged) {
        let (status, _) = request_at(
            &client,
            &base,
            reqwest::Method::POST,
            &format!("/v1/sessions/{id}/resume"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        until_status_at(&client, &base, &id, "running").await;
    }
    if step == Step::AppsChanged {
        let (status, _) = request_at(
            &client,
            &base,
            reqwest::Method::PUT,
            &format!("/v1/sessions/{id}/apps"),
            Some(json!({"apps": [
                {"name": "app", "entryRelativePath": "telo.yaml"},
                {"name": "api", "entryRelativePath": "api/telo.yaml"},
            ]})),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        run_event(&mut events, "api", "started", 1).await;
        apps.push("api");
    }
    drop(events);
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");

    let second = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), WATCH).await;
    ready(&second.base).await;
    let base = second.base.clone();
    let adopted = backend == Backend::Kubernetes && step != Step::Suspended;
    let snapshot = if adopted {
        until_status_at(&client, &base, &id, "running").await
    } else {
        let snapshot = until_status_at(&client, &base, &id, "suspended").await;
        let (status, _) = request_at(
            &client,
            &base,
            reqwest::Method::POST,
            &format!("/v1/sessions/{id}/resume"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        until_status_at(&client, &base, &id, "running").await;
        snapshot
    };
    let names: Vec<&str> = snapshot["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, apps, "{snapshot}");
    let (status, file) = request_at(
        &client,
        &base,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=kept.txt"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{file}");
    assert_eq!(file["content"], "kept across the crash");
    // The workflow goes on: an edit reloads the app.
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    let (status, _) = request_at(
        &client,
        &base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "telo.yaml", "content": manifest(json!({"stdout": ["second runner"]}))}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let mut socket = ws::connect(
        &format!(
            "{}/v1/sessions/{id}/io?app=app",
            base.replacen("http", "ws", 1)
        ),
        None,
    )
    .await;
    ws::read_until_output(&mut socket, "second runner").await;
    let (status, _) = request_at(
        &client,
        &base,
        reqwest::Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
}

/// The API serves while a booting runner lists what earlier runners left.
/// A watch session a client creates meanwhile is this runner's own, even
/// when the listing sees its record before its first checkpoint (the
/// interleaving is held in place here): it is neither dropped as a session
/// that was never checkpointed nor taken over as a leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_created_while_the_runner_recovers_is_not_taken_for_a_leftover() {
    use common::RunnerProcess;
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .expect("kube-sim starts");
    // The recovery's listing, and the new session's first checkpoint.
    sim.faults().hold("list", "secrets");
    sim.faults().hold("patch", "secrets");
    let runner = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), WATCH).await;
    tokio::time::timeout(WAIT, sim.faults().wait_held(1))
        .await
        .expect("the recovery lists the kept sessions");
    let client = runner_core::http_client::client();
    let (status, created) = request_at(
        &client,
        &runner.base,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(watch_body(json!({"stdout": ["created during recovery"]}))),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", runner.base), &[]).await;
    tokio::time::timeout(WAIT, sim.faults().wait_held(2))
        .await
        .expect("the session stores its first checkpoint");

    // The listing goes on and sees a record without a checkpoint.
    sim.faults().release_matching(Some("list"), Some("secrets"));
    ready(&runner.base).await;
    sim.faults().release();
    run_event(&mut events, "app", "started", 1).await;
    let secret = format!("telo-watch-{id}");
    sim.wait_for_value(
        "secrets",
        "telo-sessions",
        &secret,
        |s| s["data"].get("workspace.json.gz").is_some(),
        WAIT,
    )
    .await
    .expect("its record is kept, with the first checkpoint");
    let snapshot = until_status_at(&client, &runner.base, &id, "running").await;
    assert_eq!(snapshot["apps"][0]["generation"], 1, "{snapshot}");
    let (status, _) = request_at(
        &client,
        &runner.base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "telo.yaml", "content": manifest(json!({"stdout": ["edited"]}))}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let started = run_event(&mut events, "app", "started", 2).await;
    assert_eq!(started["trigger"], "watch");
    drop(runner);
    sim.shutdown().await;
}
