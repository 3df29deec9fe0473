//! App-set changes of one watch session are taken one at a time and spend
//! the session's reload budget, on both backends: concurrent `PUT /apps`
//! calls leave exactly one app set running and listed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::watch::*;
use common::{Backend, Runner};
use k8s_openapi::api::core::v1::Pod;
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};

/// A directory name no other test's kernels carry on their command line.
fn marker() -> String {
    format!("apps-{}", runner_core::ids::new_session_id())
}

/// The kernels of this test's session: processes whose command line names
/// the marker directory (the local backend runs them on this machine).
fn local_kernels(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            std::fs::read_link(entry.path().join("exe")).is_ok_and(|exe| exe.ends_with("fake-telo"))
        })
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains("--watch") && cmdline.contains(marker))
        .collect()
}

fn app_set(request: usize, dir: &str) -> Value {
    let apps: Vec<Value> = (0..4)
        .map(|app| json!({"name": format!("r{request}a{app}"), "entryRelativePath": format!("{dir}/telo.yaml")}))
        .collect();
    json!({ "apps": apps })
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_app_set_changes_leave_exactly_one_set_running(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, WATCH).await;
    let dir = marker();
    let mut body = watch_body(json!({"stdout": ["serving"]}));
    let manifest = body["bundle"]["files"][0]["contents"].clone();
    body["bundle"] = json!({
        "entryRelativePath": format!("{dir}/telo.yaml"),
        "files": [{"relativePath": format!("{dir}/telo.yaml"), "contents": manifest}],
    });
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;

    let changes = (0..12).map(|request| {
        let runner = &runner;
        let path = format!("/v1/sessions/{id}/apps");
        let set = app_set(request, &dir);
        async move {
            request_at(
                &runner.client,
                &runner.base,
                reqwest::Method::PUT,
                &path,
                Some(set),
            )
            .await
        }
    });
    let answers = futures_util::future::join_all(changes).await;
    for (status, answer) in &answers {
        assert_eq!(*status, StatusCode::ACCEPTED, "{answer}");
    }
    // The last change to run is the one listed, whole.
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    let listed: Vec<String> = snapshot["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|app| app["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed.len(), 4, "{snapshot}");
    let request = &listed[0][..listed[0].find('a').unwrap()];
    assert!(
        listed.iter().all(|name| name.starts_with(request)),
        "apps of several changes listed: {listed:?}"
    );
    let mut waiting: Vec<&String> = listed.iter().collect();
    tokio::time::timeout(
        test_support::WAIT,
        events.events_until(|f| {
            if f.event.as_deref() == Some("run") && f.json()["phase"] == "started" {
                waiting.retain(|app| f.json()["app"] != app.as_str());
            }
            waiting.is_empty()
        }),
    )
    .await
    .expect("every listed app starts");
    match backend {
        Backend::Local => {
            let kernels = local_kernels(&dir);
            assert_eq!(kernels.len(), 4, "{kernels:#?}");
        }
        Backend::Kubernetes => {
            let sim = runner.sim.as_ref().unwrap();
            let pod = sim
                .get::<Pod>("telo-sessions", &format!("telo-watch-{id}"))
                .expect("the session's pod");
            let apps: Vec<String> = pod
                .spec
                .unwrap()
                .containers
                .into_iter()
                .map(|c| c.name)
                .filter(|name| name.starts_with("app-"))
                .collect();
            assert_eq!(apps.len(), 4, "{apps:?}");
        }
    }
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// `PUT /apps` restarts every kernel of the session, so it spends the
/// reload budget: past it, 429 and nothing restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_set_changes_spend_the_reload_budget() {
    let runner = Runner::start_on(
        Backend::Local,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WATCH_RELOAD_LIMIT", "2"),
        ],
    )
    .await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["serving"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    let path = format!("/v1/sessions/{id}/apps");
    let set = json!({"apps": [{"name": "app", "entryRelativePath": "telo.yaml"}]});
    for _ in 0..2 {
        let (status, answer) =
            request(&runner, reqwest::Method::PUT, &path, Some(set.clone())).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    let (status, answer) = request(&runner, reqwest::Method::PUT, &path, Some(set)).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::TOO_MANY_REQUESTS,
            json!({
                "error": "reload_rate_limited",
                "message": "more than 2 reloads, workspace writes and app set changes in the last minute",
            })
        )
    );
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}
