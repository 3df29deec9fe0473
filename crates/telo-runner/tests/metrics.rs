//! The operations surface, black-box: `/metrics` moves with what sessions do,
//! `/readyz` names what keeps the runner from serving.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::json;
use test_support::ws;

/// One scrape: sample (`name{labels}`) → value.
struct Scrape(HashMap<String, f64>);

impl Scrape {
    fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .filter_map(|line| {
                let (sample, value) = line.rsplit_once(' ')?;
                Some((sample.to_owned(), value.parse().ok()?))
            })
            .collect();
        Self(samples)
    }

    fn value(&self, sample: &str) -> f64 {
        self.0.get(sample).copied().unwrap_or(0.0)
    }

    fn has(&self, sample: &str) -> bool {
        self.0.contains_key(sample)
    }
}

async fn scrape(runner: &Runner) -> Scrape {
    let response = runner
        .client
        .get(runner.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    Scrape::parse(&response.text().await.unwrap())
}

/// Scrape until `holds` (metrics settle asynchronously: a stream is counted
/// out when its connection task ends), failing after the shared wait.
async fn scrape_until(runner: &Runner, what: &str, holds: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let scraped = scrape(runner).await;
        if holds(&scraped) {
            return scraped;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw {what}; last scrape: {:?}",
            scraped.0
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const SSE: &str = r#"telo_runner_subscribers{transport="sse"}"#;
const WS: &str = r#"telo_runner_subscribers{transport="websocket"}"#;

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn metrics_follow_starts_states_bytes_and_subscribers(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let before = scrape(&runner).await;
    assert_eq!(
        before.value(r#"telo_runner_sessions{state="running"}"#),
        0.0
    );
    assert_eq!(before.value(SSE), 0.0);
    assert_eq!(before.value(WS), 0.0);

    let finished = runner
        .create(json!({"stdout": ["hello"], "exitCode": 0}))
        .await;
    let mut events = runner.events(&finished, &[]).await;
    let frames = events.events_until_end().await;
    let finished_ran = frames
        .iter()
        .any(|f| f.status_kind().as_deref() == Some("running"));
    drop(events);

    let live = runner
        .create(json!({"stdout": ["ready"], "echo": true}))
        .await;
    let mut events = runner.events(&live, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let mut socket = runner.io(&live, "?lastSeq=0").await;
    ws::read_until_output(&mut socket, "ready").await;

    let scraped = scrape_until(&runner, "one SSE and one WebSocket subscriber", |s| {
        s.value(SSE) == 1.0 && s.value(WS) == 1.0
    })
    .await;
    assert_eq!(
        scraped.value(r#"telo_runner_session_starts_total{kind="run"}"#),
        2.0
    );
    assert_eq!(
        scraped.value(r#"telo_runner_sessions{state="running"}"#),
        1.0
    );
    assert_eq!(
        scraped.value(r#"telo_runner_sessions{state="exited"}"#),
        1.0
    );
    assert_eq!(
        scraped.value(r#"telo_runner_sessions{state="starting"}"#),
        0.0
    );
    assert!(
        scraped.value(r#"telo_runner_output_bytes_total{destination="replay_buffer"}"#)
            >= ("hello".len() + "ready".len()) as f64
    );
    assert!(
        scraped.value(r#"telo_runner_output_bytes_total{destination="websocket"}"#)
            >= "ready".len() as f64
    );
    let reached_running = 1.0 + f64::from(u8::from(finished_ran));
    assert_eq!(
        scraped.value("telo_runner_session_start_duration_seconds_count"),
        reached_running
    );
    assert!(scraped.value("telo_runner_session_start_duration_seconds_sum") > 0.0);
    if backend == Backend::Kubernetes {
        assert!(
            scraped.value(r#"telo_runner_apiserver_requests_total{verb="create",resource="pods"}"#)
                >= 2.0,
            "{:?}",
            scraped.0
        );
        assert!(
            scraped.value(r#"telo_runner_apiserver_requests_total{verb="watch",resource="pods"}"#)
                >= 1.0
        );
        assert!(scraped.has(r#"telo_runner_watch_restarts_total{watch="pods"}"#));
    }

    drop(socket);
    drop(events);
    scrape_until(&runner, "the subscribers gone", |s| {
        s.value(SSE) == 0.0 && s.value(WS) == 0.0
    })
    .await;

    let (status, _) = runner.delete(&format!("/v1/sessions/{live}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    scrape_until(&runner, "the live session stopped", |s| {
        s.value(r#"telo_runner_sessions{state="stopped"}"#) == 1.0
            && s.value(r#"telo_runner_sessions{state="running"}"#) == 0.0
    })
    .await;
    runner.stop().await;
}

#[tokio::test]
async fn the_local_backend_is_ready_once_adoption_and_the_kernel_check_are_done() {
    let runner = Runner::start().await;
    runner.service.as_ref().unwrap().recovered().await;
    // Adopted; the kernel's boot self-check may still run, and is then the
    // one thing readiness waits for.
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let (status, body) = runner.get("/readyz").await;
        if status == StatusCode::OK {
            assert_eq!(body, json!({"ready": true}));
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(
            body,
            json!({"ready": false, "waiting": ["the Telo CLI self-check"]})
        );
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (status, _) = runner.get("/livez").await;
    assert_eq!(status, StatusCode::OK);
    runner.stop().await;
}

#[tokio::test]
async fn a_runner_whose_apiserver_is_unreachable_stays_unready_and_says_why() {
    // A kubeconfig naming an address nothing listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let sim = common::cluster().start().await.unwrap();
    std::fs::write(
        &kubeconfig,
        sim.kubeconfig_yaml()
            .replace(&sim.url(), &format!("http://{closed}")),
    )
    .unwrap();
    sim.shutdown().await;
    let path = kubeconfig.to_string_lossy().into_owned();
    let runner = Runner::start_on(Backend::Kubernetes, &[("KUBECONFIG", path.as_str())]).await;

    // Wait until the pod watch has failed at least once, so the reason names
    // the apiserver rather than a list still in flight.
    scrape_until(&runner, "a pod watch failure", |s| {
        s.value(r#"telo_runner_watch_restarts_total{watch="pods"}"#) >= 1.0
    })
    .await;
    let (status, body) = runner.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["ready"], json!(false));
    let waiting: Vec<&str> = body["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    assert!(
        waiting.iter().any(|w| w.starts_with(
            "the pod watch cannot list session pods (apiserver unreachable or refusing)"
        )),
        "{body}"
    );
    let (status, _) = runner.get("/livez").await;
    assert_eq!(status, StatusCode::OK);
    runner.stop().await;
}

#[tokio::test]
async fn a_kube_sim_runner_becomes_ready() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    runner.service.as_ref().unwrap().recovered().await;
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let (status, body) = runner.get("/readyz").await;
        if status == StatusCode::OK {
            assert_eq!(body, json!({"ready": true}));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runner.stop().await;
}

#[tokio::test]
async fn a_failed_app_start_is_counted_by_kind_and_stage() {
    let apps = json!({"broken": {"image": "x", "command": ["/nonexistent/telo"]}}).to_string();
    let runner = Runner::start_with(&[("RUNNER_APPS", apps.as_str())]).await;
    let (status, created) = runner.post("/v1/apps/broken/sessions", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap();
    let terminal = runner.wait_terminal(id).await;
    assert_eq!(terminal["kind"], json!("failed"), "{terminal}");
    let stage = terminal["message"]
        .as_str()
        .unwrap()
        .split_once(':')
        .unwrap()
        .0
        .to_owned();

    let scraped = scrape(&runner).await;
    assert_eq!(
        scraped.value(r#"telo_runner_session_starts_total{kind="app"}"#),
        1.0
    );
    assert_eq!(
        scraped.value(&format!(
            r#"telo_runner_session_start_failures_total{{stage="{stage}"}}"#
        )),
        1.0,
        "{:?}",
        scraped.0
    );
    assert_eq!(
        scraped.value(r#"telo_runner_sessions{state="failed"}"#),
        1.0
    );
    assert_eq!(
        scraped.value("telo_runner_session_start_duration_seconds_count"),
        0.0
    );
    runner.stop().await;
}
