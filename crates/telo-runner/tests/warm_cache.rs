//! Warm pods' kernel caches (`RUNNER_WARM_POOL_MODULES`) on the Kubernetes
//! backend, black-box against kube-sim and fake-telo: a session claimed
//! from a warm pod finds the configured modules' controllers installed and
//! built (no `⬇` progress line for them), a cold start and a pod without a
//! warm-up do the work, two sessions never see each other's cache, and a
//! failed warm-up offers its pod with a cold cache.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Runner;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::sse::SseStream;

const IMAGE: &str = "telorun/node:0-slim";

/// An HTTP API's manifest, as http-hello: an `Http.Server` and a
/// `Run.Value` of the kernel image's modules; it prints its cache and
/// loads one controller of its own (no warm-up knows it).
fn http_app_body() -> Value {
    let manifest = "kind: Telo.Application\n\
        metadata: { name: hello }\n\
        imports:\n  Http: \"/opt/telo/modules/http-server\"\n  Run: \"/opt/telo/modules/run\"\n\
        fakeTelo:\n  stdout: [\"app up\"]\n  printEnv: [TELO_CACHE_DIR]\n  \
        controllers: [{ purl: \"telo:local/js#SessionOwn\", coldMs: 5 }]\n\
        ---\nkind: Http.Server\nmetadata: { name: server }\n\
        ---\nkind: Run.Value\nmetadata: { name: hello }\nvalue: {}\n";
    json!({
        "bundle": {
            "entryRelativePath": "telo.yaml",
            "files": [{ "relativePath": "telo.yaml", "contents": manifest }],
        },
        "env": {},
        "ports": [],
        "config": { "image": IMAGE, "pullPolicy": "missing" },
        "inspect": false,
    })
}

const NPM: &str = "⬇ npm:@telorun/http-server@0.28.0#http-server-api npm-install…";
const VALUE: &str = "⬇ telo:local/js#Value source-build…";
const OWN: &str = "⬇ telo:local/js#SessionOwn source-build…";

async fn metrics(base: &str) -> String {
    runner_core::http_client::client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(metrics: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = format!("{name}{{pool=\"{IMAGE}\",{labels}}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until the runner's pool has `ready` pods ready to claim.
async fn until_ready(base: &str, ready: u64) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = metrics(base).await;
        if metric(&metrics, "telo_runner_warm_pods", "state=\"ready\"") == Some(ready) {
            return metrics;
        }
        assert!(
            Instant::now() < deadline,
            "never {ready} warm pods ready:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the HTTP app to its end: whether it started warm, and its output.
async fn run_app(runner: &Runner) -> (bool, String) {
    let client = runner_core::http_client::client();
    let response = client
        .post(format!("{}/v1/sessions", runner.base))
        .json(&http_app_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", runner.base), &[]).await;
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 0}),
        "{frames:?}"
    );
    let warm = frames.iter().any(|f| {
        f.event.as_deref() == Some("progress") && f.json()["message"] == "Starting on a warm pod"
    });
    (warm, runner.full_output(&id).await)
}

fn cache_dir_of(output: &str) -> String {
    output
        .lines()
        .find_map(|line| line.trim().strip_prefix("TELO_CACHE_DIR="))
        .unwrap_or_else(|| panic!("no TELO_CACHE_DIR line in {output:?}"))
        .to_owned()
}

/// Claimed warm pods: the configured modules' controllers are in the
/// cache (no progress line for them), the session's own controller is not
/// (no session left it there), and each session has a cache of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_warm_pod_starts_with_its_kernel_cache_warm_and_its_own() {
    let pool = format!("{IMAGE}=2");
    let runner =
        Runner::start_kube(common::cluster(), &[("RUNNER_WARM_POOL", pool.as_str())]).await;
    let metrics = until_ready(&runner.base, 2).await;
    assert_eq!(
        metric(
            &metrics,
            "telo_runner_warm_pool_warm_ups_total",
            "outcome=\"warm\""
        ),
        Some(2),
        "{metrics}"
    );

    let (warm, first) = run_app(&runner).await;
    assert!(warm, "{first:?}");
    assert!(first.contains("app up"), "{first:?}");
    assert!(!first.contains(NPM) && !first.contains(VALUE), "{first:?}");
    assert!(first.contains(OWN), "{first:?}");

    let (warm, second) = run_app(&runner).await;
    assert!(warm, "{second:?}");
    assert!(
        !second.contains(NPM) && !second.contains(VALUE),
        "{second:?}"
    );
    // The first session's build is not in the second's cache.
    assert!(second.contains(OWN), "{second:?}");
    assert_ne!(cache_dir_of(&first), cache_dir_of(&second));
    runner.stop().await;
}

/// A cold start, and a warm pod without a warm-up (`none`), load every
/// controller themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_and_a_pod_without_a_warm_up_do_the_work() {
    let cold = Runner::start_kube(common::cluster(), &[]).await;
    let (warm, output) = run_app(&cold).await;
    assert!(!warm);
    assert!(
        output.contains(NPM) && output.contains(VALUE) && output.contains(OWN),
        "{output:?}"
    );
    cold.stop().await;

    let pool = format!("{IMAGE}=1");
    let runner = Runner::start_kube(
        common::cluster(),
        &[
            ("RUNNER_WARM_POOL", pool.as_str()),
            ("RUNNER_WARM_POOL_MODULES", "none"),
        ],
    )
    .await;
    until_ready(&runner.base, 1).await;
    let (warm, output) = run_app(&runner).await;
    assert!(warm, "{output:?}");
    assert!(
        output.contains(NPM) && output.contains(VALUE) && output.contains(OWN),
        "{output:?}"
    );
    runner.stop().await;
}

/// A warm-up that fails (a module the kernel image does not ship) does not
/// hold the pool up: its pods are offered with a cold cache, counted and
/// logged as such, and a session on one does the loading itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_warm_up_offers_its_pod_with_a_cold_cache() {
    let pool = format!("{IMAGE}=1");
    let runner = Runner::start_kube(
        common::cluster(),
        &[
            ("RUNNER_WARM_POOL", pool.as_str()),
            ("RUNNER_WARM_POOL_MODULES", "http-server,run,no-such-module"),
        ],
    )
    .await;
    let metrics = until_ready(&runner.base, 1).await;
    assert_eq!(
        metric(
            &metrics,
            "telo_runner_warm_pool_warm_ups_total",
            "outcome=\"cold\""
        ),
        Some(1),
        "{metrics}"
    );
    let (warm, output) = run_app(&runner).await;
    assert!(warm, "{output:?}");
    // The real kernel's install and run both stop at the missing module:
    // the session loads everything itself.
    assert!(output.contains(NPM) && output.contains(VALUE), "{output:?}");
    runner.stop().await;
}
