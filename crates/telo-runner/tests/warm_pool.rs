//! Warm pools (`RUNNER_WARM_POOL`) on the Kubernetes backend, black-box
//! against kube-sim: a run session of a pooled image starts on a claimed
//! warm pod and says so, the pool refills, an empty pool falls back to a
//! cold start, a pod that stops while idle is replaced, a restarted runner
//! takes over its pool, two runners after one pod never both get it, and a
//! full quota shrinks the pool, not the sessions.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Backend, Runner, RunnerProcess};
use kube_sim::KubeSim;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::sse::{SseFrame, SseStream};

const IMAGE: &str = "telorun/node:0-slim";

fn pool_of(size: usize) -> String {
    format!("{IMAGE}={size}")
}

/// The runner's metric line for its pool's `state` pods, as a number.
fn warm_pods(metrics: &str, state: &str) -> Option<u64> {
    let prefix = format!("telo_runner_warm_pods{{pool=\"{IMAGE}\",state=\"{state}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until the runner at `base` has `ready` warm pods ready to claim.
async fn until_ready(base: &str, ready: u64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = metrics(base).await;
        if warm_pods(&metrics, "ready") == Some(ready) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never {ready} warm pods ready:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The names of the idle warm pods the cluster holds.
async fn idle_pods(sim: &KubeSim) -> Vec<String> {
    let list = sim_list(sim).await;
    let mut names: Vec<String> = list
        .iter()
        .filter(|pod| pod["metadata"]["labels"]["telo.run/warm"] == "idle")
        .map(|pod| pod["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

async fn sim_list(sim: &KubeSim) -> Vec<Value> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(sim.client(), "telo-sessions");
    pods.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|pod| serde_json::to_value(pod).unwrap())
        .collect()
}

/// The session's pod (its session id label), whatever its name.
async fn pod_of(sim: &KubeSim, id: &str) -> Option<Value> {
    sim_list(sim)
        .await
        .into_iter()
        .find(|pod| pod["metadata"]["labels"]["telo.run/session-id"] == id)
}

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

async fn create(base: &str, body: &Value) -> String {
    let client = runner_core::http_client::client();
    let response = client
        .post(format!("{base}/v1/sessions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.unwrap();
    created["sessionId"].as_str().unwrap().to_owned()
}

fn progress_messages(frames: &[SseFrame]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("progress"))
        .map(|f| f.json()["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Runs a session to its end on the runner at `base`: its events.
async fn run_to_end(base: &str, body: &Value) -> (String, Vec<SseFrame>) {
    let id = create(base, body).await;
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    (id, events.events_until_end().await)
}

fn body(line: &str, code: i64) -> Value {
    test_support::bundle::start_body(json!({"stdout": [line], "exitCode": code}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_session_starts_on_a_warm_pod_and_the_pool_refills() {
    let pool = pool_of(2);
    let runner =
        Runner::start_kube(common::cluster(), &[("RUNNER_WARM_POOL", pool.as_str())]).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 2).await;
    let before = idle_pods(sim).await;
    assert_eq!(before.len(), 2, "{before:?}");

    let (id, frames) = run_to_end(&runner.base, &body("hello from a warm pod", 4)).await;
    let progress = progress_messages(&frames);
    assert!(
        progress.contains(&"Starting on a warm pod".to_owned()),
        "{progress:?}"
    );
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 4})
    );
    // Exactly the kernel's output: nothing of the wait (the go-ahead typed
    // into the terminal is not echoed), nothing twice.
    let output = runner.full_output(&id).await;
    assert_eq!(output, "hello from a warm pod\r\n");

    // The pool is whole again, with a new pod in the claimed one's place;
    // the claimed pod was the session's and went with it.
    until_ready(&runner.base, 2).await;
    let after = idle_pods(sim).await;
    assert_eq!(after.len(), 2, "{after:?}");
    let claimed: Vec<&String> = before.iter().filter(|n| !after.contains(n)).collect();
    assert_eq!(
        claimed.len(),
        1,
        "one pod was claimed: {before:?} → {after:?}"
    );
    let gone = sim
        .wait_for_deletion("pods", "telo-sessions", claimed[0], WAIT)
        .await;
    assert!(gone.is_ok(), "the claimed pod is never the pool's again");
    let metrics = metrics(&runner.base).await;
    assert!(
        metrics.contains(&format!(
            "telo_runner_warm_pool_starts_total{{pool=\"{IMAGE}\",start=\"warm\"}} 1"
        )),
        "{metrics}"
    );
    runner.stop().await;
}

/// With no pod ready (the refill held back here), a session starts cold and
/// says so; a claimed pod carries the session's record and deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_falls_back_to_a_cold_start() {
    let pool = pool_of(1);
    let runner =
        Runner::start_kube(common::cluster(), &[("RUNNER_WARM_POOL", pool.as_str())]).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    sim.faults().hold("create", "pods");

    // Held open (it echoes until told to exit), so its pod can be read.
    let warm = create(
        &runner.base,
        &test_support::bundle::start_body(json!({"stdout": ["warm"], "echo": true})),
    )
    .await;
    let mut warm_events =
        SseStream::connect(&format!("{}/v1/sessions/{warm}/events", runner.base), &[]).await;
    let frames = warm_events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    assert!(progress_messages(&frames).contains(&"Starting on a warm pod".to_owned()));
    let pod = pod_of(sim, &warm).await.unwrap();
    assert!(
        pod["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("telo-warm-")
    );
    assert!(pod["metadata"]["labels"].get("telo.run/warm").is_none());
    assert_eq!(pod["metadata"]["annotations"]["telo.run/kind"], "run");
    assert!(pod["spec"]["activeDeadlineSeconds"].as_i64().unwrap() >= 3600);

    let cold = create(&runner.base, &body("cold", 0)).await;
    let mut cold_events =
        SseStream::connect(&format!("{}/v1/sessions/{cold}/events", runner.base), &[]).await;
    let frames = cold_events
        .events_until(|f| {
            f.event.as_deref() == Some("progress")
                && f.json()["message"] == "No warm pod is ready: starting a new pod"
        })
        .await;
    assert!(!progress_messages(&frames).contains(&"Starting on a warm pod".to_owned()));
    sim.faults().release();
    let rest = cold_events.events_until_end().await;
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 0})
    );
    runner.delete(&format!("/v1/sessions/{warm}")).await;
    warm_events.events_until_end().await;
    runner.stop().await;
}

/// A warm pod that stops while idle (here its workspace service is handed
/// a launch file with no claim behind it, and so ends) is deleted and
/// replaced; it is never claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_that_stops_while_idle_is_replaced() {
    let pool = pool_of(1);
    let runner =
        Runner::start_kube(common::cluster(), &[("RUNNER_WARM_POOL", pool.as_str())]).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    let idle = idle_pods(sim).await;
    let pod = sim_list(sim)
        .await
        .into_iter()
        .find(|pod| pod["metadata"]["name"] == idle[0].as_str())
        .unwrap();
    let token = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
        .find(|e| e["name"] == "RUNNER_WORKSPACE_TOKEN")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_owned();
    let ip: std::net::IpAddr = pod["status"]["podIP"].as_str().unwrap().parse().unwrap();
    let workspace = runner_workspace_service::client::WorkspaceClient::new(
        runner_core::http_client::client(),
        std::net::SocketAddr::new(ip, 8099),
        token,
    );
    workspace
        .apply(&runner_api::watch::WorkspaceChangeSet {
            write: vec![runner_api::watch::WorkspaceWrite {
                path: ".telo-launch".to_owned(),
                content: "exit 3\n".to_owned(),
                encoding: None,
            }],
            delete: Vec::new(),
        })
        .await
        .unwrap();
    sim.wait_for_deletion("pods", "telo-sessions", &idle[0], WAIT)
        .await
        .unwrap();
    until_ready(&runner.base, 1).await;
    let now = idle_pods(sim).await;
    assert_eq!(now.len(), 1);
    assert_ne!(now, idle, "a new pod in the stopped one's place");
    let (_, frames) = run_to_end(&runner.base, &body("on the new pod", 0)).await;
    assert!(progress_messages(&frames).contains(&"Starting on a warm pod".to_owned()));
    runner.stop().await;
}

/// While a session starts on a new pod, the pool does not refill: the pod
/// that replaces a claimed one is created only once the cold session's pod
/// runs (a session someone waits for comes first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_refills_only_once_cold_starts_have_their_pods() {
    let pool = pool_of(1);
    // Long enough a sandbox that the warm claim below comes while the
    // cold pod is still starting.
    let latency = kube_sim::Latency {
        sandbox: Duration::from_secs(2),
        ..Default::default()
    };
    let runner = Runner::start_kube(
        common::cluster().latency(latency),
        &[("RUNNER_WARM_POOL", pool.as_str())],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    let before = idle_pods(sim).await;

    // `always` never starts warm: a new pod, whose start is under way once
    // it exists.
    let mut cold_body = body("cold", 0);
    cold_body["config"]["pullPolicy"] = json!("always");
    let cold = create(&runner.base, &cold_body).await;
    let cold_pod = format!("telo-run-{cold}");
    sim.wait_for::<k8s_openapi::api::core::v1::Pod>("telo-sessions", &cold_pod, |_| true, WAIT)
        .await
        .unwrap();
    let (_, frames) = run_to_end(&runner.base, &body("warm", 0)).await;
    assert!(progress_messages(&frames).contains(&"Starting on a warm pod".to_owned()));

    until_ready(&runner.base, 1).await;
    let timeline = sim.pod_timeline();
    let refill = timeline
        .iter()
        .find(|pod| pod.name.starts_with("telo-warm-") && !before.contains(&pod.name))
        .expect("a new warm pod");
    let cold = timeline.iter().find(|pod| pod.name == cold_pod).unwrap();
    assert!(
        refill.created_us.unwrap() >= cold.running_us.unwrap(),
        "the refill waited for the cold pod: {refill:?} {cold:?}"
    );
    runner.stop().await;
}

/// The most warm pods that were ever starting (created, not running yet)
/// at once, by kube-sim's timeline. A pod counts as starting until the
/// runner found it ready, which is later than it ran: what the runner holds
/// to is at least as strict as what this sees.
fn most_starting_at_once(timeline: &[kube_sim::PodTimeline]) -> usize {
    let warm: Vec<&kube_sim::PodTimeline> = timeline
        .iter()
        .filter(|pod| pod.name.starts_with("telo-warm-"))
        .collect();
    warm.iter()
        .filter_map(|pod| pod.created_us)
        .map(|at| {
            warm.iter()
                .filter(|pod| {
                    pod.created_us.is_some_and(|created| created <= at)
                        && pod.running_us.is_none_or(|running| running > at)
                        && pod.deleted_us.is_none_or(|deleted| deleted > at)
                })
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// A pool fills, and refills after claims, at most `RUNNER_WARM_POOL_SURGE`
/// pods at a time: the next pod is created only once one of those starting
/// is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_never_has_more_than_its_surge_starting() {
    let pool = pool_of(4);
    // A sandbox that takes a while, so pods created together would be
    // starting together.
    let latency = kube_sim::Latency {
        sandbox: Duration::from_millis(300),
        ..Default::default()
    };
    let runner = Runner::start_kube(
        common::cluster().latency(latency),
        &[
            ("RUNNER_WARM_POOL", pool.as_str()),
            ("RUNNER_WARM_POOL_SURGE", "2"),
        ],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 4).await;
    let filled = sim.pod_timeline();
    let most = most_starting_at_once(&filled);
    assert!(most <= 2, "filling: {most} starting at once: {filled:#?}");

    // Three claims drain most of the pool; its refill is paced too.
    for _ in 0..3 {
        let (_, frames) = run_to_end(&runner.base, &body("warm", 0)).await;
        assert!(progress_messages(&frames).contains(&"Starting on a warm pod".to_owned()));
    }
    until_ready(&runner.base, 4).await;
    let refilled = sim.pod_timeline();
    let warm_pods = refilled
        .iter()
        .filter(|pod| pod.name.starts_with("telo-warm-"))
        .count();
    assert_eq!(warm_pods, 7, "four, then three in the claimed ones' place");
    let most = most_starting_at_once(&refilled);
    assert!(
        most <= 2,
        "refilling: {most} starting at once: {refilled:#?}"
    );
    runner.stop().await;
}

/// A burst larger than the pool: the pool serves what it holds, the rest
/// start cold, and the refill creates nothing until every start of the
/// burst — claims and cold starts — has its pod and is running (here all
/// are held at their terminal attach until the test lets them go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_served_from_the_pool_before_the_refill_starts() {
    let pool = pool_of(2);
    let runner =
        Runner::start_kube(common::cluster(), &[("RUNNER_WARM_POOL", pool.as_str())]).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 2).await;
    let before = idle_pods(sim).await;
    sim.faults().hold("get", "pods/attach");

    let warm = [
        create(&runner.base, &body("warm", 0)).await,
        create(&runner.base, &body("warm", 0)).await,
    ];
    for name in &before {
        sim.wait_for::<k8s_openapi::api::core::v1::Pod>(
            "telo-sessions",
            name,
            |pod| {
                pod.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|labels| labels.contains_key("telo.run/session-id"))
            },
            WAIT,
        )
        .await
        .unwrap();
    }
    let cold = create(&runner.base, &body("cold", 0)).await;
    // All three are in flight: the two claimed pods and the new one are
    // running, each start waiting for its attach.
    tokio::time::timeout(WAIT, sim.faults().wait_held(3))
        .await
        .expect("three attaches held");
    let released_us = kube_sim::timeline::now_us();
    sim.faults().release();

    let mut ids = warm.to_vec();
    ids.push(cold.clone());
    for id in &ids {
        let mut events =
            SseStream::connect(&format!("{}/v1/sessions/{id}/events", runner.base), &[]).await;
        let frames = events.events_until_end().await;
        let warm_start = progress_messages(&frames).contains(&"Starting on a warm pod".to_owned());
        assert_eq!(warm_start, *id != cold, "{id}: {frames:?}");
    }
    until_ready(&runner.base, 2).await;
    let timeline = sim.pod_timeline();
    let refills: Vec<&kube_sim::PodTimeline> = timeline
        .iter()
        .filter(|pod| pod.name.starts_with("telo-warm-") && !before.contains(&pod.name))
        .collect();
    assert_eq!(refills.len(), 2, "{timeline:#?}");
    for refill in refills {
        assert!(
            refill.created_us.unwrap() > released_us,
            "a refill pod was created while the burst's starts were in flight: {refill:?}"
        );
    }
    runner.stop().await;
}

/// A runner killed and started again takes over the pool as it stands: the
/// same pods, no new ones, no leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_runner_takes_over_its_pool() {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .unwrap();
    let pool = pool_of(2);
    let vars = [("RUNNER_WARM_POOL", pool.as_str())];
    let mut first = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    until_ready(&first.base, 2).await;
    let pods = idle_pods(&sim).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();

    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    until_ready(&second.base, 2).await;
    assert_eq!(idle_pods(&sim).await, pods, "the same pods, none added");
    let (id, frames) = run_to_end(&second.base, &body("after the restart", 0)).await;
    assert!(progress_messages(&frames).contains(&"Starting on a warm pod".to_owned()));
    assert!(frames.last().unwrap().json()["status"] == json!({"kind": "exited", "code": 0}));
    let _ = id;
    drop(second);
    sim.shutdown().await;
}

/// Two runners over one namespace, one idle pod, two sessions at once:
/// the apiserver's conditional write lets exactly one claim it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_racing_for_one_warm_pod_never_both_get_it() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .unwrap();
    let pool = pool_of(1);
    let vars = [("RUNNER_WARM_POOL", pool.as_str())];
    let a = RunnerProcess::spawn(Backend::Kubernetes, dirs.0.path(), Some(&sim), &vars).await;
    until_ready(&a.base, 1).await;
    let b = RunnerProcess::spawn(Backend::Kubernetes, dirs.1.path(), Some(&sim), &vars).await;
    until_ready(&b.base, 1).await;
    assert_eq!(
        idle_pods(&sim).await.len(),
        1,
        "the second runner found the pool full"
    );
    // Neither refills until both claimed.
    sim.faults().hold("create", "pods");
    let racing = body("racing", 0);
    let (first, second) = tokio::join!(create(&a.base, &racing), create(&b.base, &racing));
    let warm_of = |base: String, id: String| async move {
        let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
        let frames = events
            .events_until(|f| {
                f.event.as_deref() == Some("progress")
                    && matches!(
                        f.json()["message"].as_str(),
                        Some("Starting on a warm pod" | "No warm pod is ready: starting a new pod")
                    )
            })
            .await;
        frames.last().unwrap().json()["message"] == "Starting on a warm pod"
    };
    let (a_warm, b_warm) = tokio::join!(
        warm_of(a.base.clone(), first.clone()),
        warm_of(b.base.clone(), second.clone())
    );
    assert!(a_warm ^ b_warm, "exactly one won: {a_warm} {b_warm}");
    sim.faults().release();
    drop((a, b));
    sim.shutdown().await;
}

/// A quota with room for the pool only: the refill stops at it (said once
/// in the log), and a session that needs a new pod gets one in the place of
/// an idle warm pod, which gives way (also said).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_quota_shrinks_the_pool_and_sessions_still_start_cold() {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .unwrap();
    sim.seed_value(json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "sessions", "namespace": "telo-sessions"},
        "spec": {"hard": {"pods": "2"}},
    }))
    .unwrap();
    let pool = pool_of(3);
    let log = dir.path().join("runner.log");
    let runner = RunnerProcess::spawn_logging_to(
        Backend::Kubernetes,
        dir.path(),
        Some(&sim),
        &[("RUNNER_WARM_POOL", pool.as_str())],
        &log,
    )
    .await;
    until_ready(&runner.base, 2).await;
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + WAIT;
    while !logged().contains(
        "the session namespace's quota is full: the warm pool holds fewer pods than its size",
    ) {
        assert!(Instant::now() < deadline, "no quota line:\n{}", logged());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // `always` never starts warm: it needs a new pod, and the quota is full.
    let mut cold = body("cold, in a warm pod's place", 0);
    cold["config"]["pullPolicy"] = json!("always");
    let (_, frames) = run_to_end(&runner.base, &cold).await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 0}),
        "{frames:?}"
    );
    assert!(
        logged()
            .contains("the session namespace's quota is full: a warm pod gives way to a session"),
        "{}",
        logged()
    );
    drop(runner);
    sim.shutdown().await;
}

/// A bundle that starts cold starts cold with a pool too: one larger than
/// a warm pod's workspace takes (10,050 files) is sent to a new pod, decided
/// before any pod is claimed, and the pool keeps its pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_too_large_for_a_warm_pod_starts_cold_and_claims_none() {
    let pool = pool_of(1);
    let runner =
        Runner::start_kube(common::cluster(), &[("RUNNER_WARM_POOL", pool.as_str())]).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    let before = idle_pods(sim).await;
    let mut body = body("hello from a large bundle", 0);
    let files = body["bundle"]["files"].as_array_mut().unwrap();
    for index in 0..10_049 {
        files.push(json!({"relativePath": format!("lib/f{index}.txt"), "contents": ""}));
    }
    let (id, frames) = run_to_end(&runner.base, &body).await;
    let progress = progress_messages(&frames);
    assert!(
        progress.contains(
            &"The bundle has 10050 files, more than a warm pod takes (10000): starting a new pod"
                .to_owned()
        ),
        "{progress:?}"
    );
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 0})
    );
    assert!(
        runner
            .full_output(&id)
            .await
            .contains("hello from a large bundle")
    );
    assert_eq!(idle_pods(sim).await, before, "the warm pod was claimed");
    runner.stop().await;
}
