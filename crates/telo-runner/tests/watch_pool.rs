//! Watch pools (`RUNNER_WARM_POOL_WATCH`) on the Kubernetes backend,
//! black-box against kube-sim: a one-app watch session starts on the pooled
//! pod (the same pod, its files and edits reaching the app), other shapes
//! start cold and say why, two claims of one pod never both win, a
//! restarted runner adopts a claimed session by its pod's own name, and a
//! claimed session suspends and resumes with its files.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::watch::*;
use common::{Backend, Runner, RunnerProcess};
use kube_sim::KubeSim;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::sse::{SseFrame, SseStream};
use test_support::ws;

const IMAGE: &str = "telorun/node:0-slim";
const WARM: &str = "Starting on a warm pod";

fn pool_of(size: usize) -> String {
    format!("{IMAGE}={size}")
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

/// Waits until the runner at `base` has `ready` pooled watch pods.
async fn until_ready(base: &str, ready: u64) {
    until_pool_ready(base, &format!("watch:{IMAGE}"), ready).await;
}

/// Waits until the runner at `base` has `ready` pods in pool `pool` (its
/// metrics label).
async fn until_pool_ready(base: &str, pool: &str, ready: u64) {
    let line = format!("telo_runner_warm_pods{{pool=\"{pool}\",state=\"ready\"}} {ready}");
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = metrics(base).await;
        if metrics.lines().any(|l| l == line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never {ready} watch pods ready:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// The idle pooled pods: (name, uid).
async fn idle_pods(sim: &KubeSim) -> Vec<(String, String)> {
    let mut pods: Vec<(String, String)> = sim_list(sim)
        .await
        .iter()
        .filter(|pod| pod["metadata"]["labels"]["telo.run/warm"] == "idle")
        .map(|pod| {
            (
                pod["metadata"]["name"].as_str().unwrap().to_owned(),
                pod["metadata"]["uid"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    pods.sort();
    pods
}

/// The session's pod (its session id label), whatever its name.
async fn pod_of(sim: &KubeSim, id: &str) -> Option<Value> {
    sim_list(sim)
        .await
        .into_iter()
        .find(|pod| pod["metadata"]["labels"]["telo.run/session-id"] == id)
}

fn containers(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

fn progress_messages(frames: &[SseFrame]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("progress"))
        .map(|f| f.json()["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Reads events until `running`: the progress messages on the way.
async fn progress_until_running(events: &mut SseStream) -> Vec<String> {
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    progress_messages(&frames)
}

fn pooled_vars(pool: &str) -> Vec<(&'static str, String)> {
    vec![
        ("RUNNER_WATCH_SESSIONS", "true".to_owned()),
        ("RUNNER_WARM_POOL_WATCH", pool.to_owned()),
    ]
}

fn vars_ref<'a>(vars: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    vars.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_app_watch_session_starts_on_the_pooled_pod_and_edits_reach_its_app() {
    let vars = pooled_vars(&pool_of(1));
    let runner = Runner::start_kube(common::cluster(), &vars_ref(&vars)).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    let idle = idle_pods(sim).await;
    assert_eq!(idle.len(), 1, "{idle:?}");

    let mut body = watch_body(json!({"stdout": ["generation one"], "printEnv": ["GREETING"]}));
    body["env"] = json!({"GREETING": "it's $HOME"});
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let progress = progress_until_running(&mut events).await;
    assert!(progress.contains(&WARM.to_owned()), "{progress:?}");
    let started = run_event(&mut events, "app", "started", 1).await;
    assert_eq!(started["trigger"], "initial");
    let mut socket = runner.io(&id, "?app=app").await;
    ws::read_until_output(&mut socket, "GREETING=it's $HOME").await;

    // The very pod that idled, now the session's: its containers as built,
    // the session's labels on, the pool's off; no `telo-watch-<id>`.
    let pod = pod_of(sim, &id).await.expect("the session's pod");
    assert_eq!(pod["metadata"]["name"], idle[0].0);
    assert_eq!(pod["metadata"]["uid"], idle[0].1);
    assert_eq!(containers(&pod), ["workspace", "app"]);
    assert_eq!(pod["metadata"]["labels"]["telo.run/mode"], "watch");
    assert!(pod["metadata"]["labels"].get("telo.run/warm").is_none());
    assert!(pod["spec"]["activeDeadlineSeconds"].as_i64().unwrap() > 0);
    assert!(
        sim.get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
            .is_none()
    );

    // An edit through the workspace API: the kernel's own watch reloads it.
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [
            {"path": "telo.yaml", "content": manifest(json!({"stdout": ["generation two"]}))},
            {"path": "notes.txt", "content": "hello"},
        ]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let second = run_event(&mut events, "app", "started", 2).await;
    assert_eq!(second["trigger"], "watch");
    ws::read_until_output(&mut socket, "generation two").await;
    // The launch file never shows in the tree.
    let (_, tree) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace"),
        None,
    )
    .await;
    let paths: Vec<&str> = tree["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["notes.txt", "telo-workspace.yaml", "telo.yaml"]);

    // A manual reload.
    let (status, reloaded) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/reload"),
        None,
    )
    .await;
    assert_eq!(
        (status, reloaded),
        (StatusCode::ACCEPTED, json!({"reloaded": ["app"]}))
    );
    let third = run_event(&mut events, "app", "started", 3).await;
    assert_eq!(third["trigger"], "manual");

    // The pool refills; the claimed pod goes with its session.
    until_ready(&runner.base, 1).await;
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    assert!(
        sim.wait_for_deletion("pods", "telo-sessions", &idle[0].0, WAIT)
            .await
            .is_ok()
    );
    let metrics = metrics(&runner.base).await;
    assert!(
        metrics.contains(&format!(
            "telo_runner_warm_pool_starts_total{{pool=\"watch:{IMAGE}\",start=\"warm\"}} 1"
        )),
        "{metrics}"
    );
    runner.stop().await;
}

/// Two apps, or an app on streams: a cold `telo-watch-<id>` pod, the
/// client told why, the pooled pod left idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_shapes_start_cold_and_say_why() {
    let vars = pooled_vars(&pool_of(1));
    let runner = Runner::start_kube(common::cluster(), &vars_ref(&vars)).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    let idle = idle_pods(sim).await;

    let mut two = watch_body(json!({"stdout": ["two apps"]}));
    two["apps"] = json!([
        {"name": "web", "entryRelativePath": "telo.yaml"},
        {"name": "api", "entryRelativePath": "telo.yaml"},
    ]);
    let mut streams = watch_body(json!({"stdout": ["streams"]}));
    streams["apps"] =
        json!([{"name": "worker", "entryRelativePath": "telo.yaml", "io": "streams"}]);
    for (body, reason, first) in [
        (two, "2 apps", vec!["workspace", "app-web", "app-api"]),
        (
            streams,
            "an app on streams",
            vec!["workspace", "app-worker"],
        ),
    ] {
        let id = runner.create_body(body).await;
        let mut events = runner.events(&id, &[]).await;
        let progress = progress_until_running(&mut events).await;
        let told = format!("No warm pod for this session's shape ({reason}); starting one");
        assert!(progress.contains(&told), "{progress:?}");
        assert!(!progress.contains(&WARM.to_owned()), "{progress:?}");
        let pod = sim
            .get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
            .expect("a cold watch pod");
        assert_eq!(containers(&pod), first);
        runner.delete(&format!("/v1/sessions/{id}")).await;
    }
    assert_eq!(idle_pods(sim).await, idle, "the pooled pod is still idle");
    runner.stop().await;
}

/// An agent session: cold, and said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_session_starts_cold_and_says_why() {
    let catalog = json!({
        "helper": {
            "image": "acme/agent:1",
            "port": test_support::free_port(),
            "command": ["/bin/sh", "-c", "exec sleep 600"],
        },
    })
    .to_string();
    let pool = pool_of(1);
    let vars = [
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WARM_POOL_WATCH", pool.as_str()),
        ("RUNNER_APPS", catalog.as_str()),
    ];
    let sim = common::cluster().image("acme/agent:*", kube_sim::ImageBehaviour::Host);
    let runner = Runner::start_kube(sim, &vars).await;
    until_ready(&runner.base, 1).await;
    let mut body = watch_body(json!({"stdout": ["with an agent"]}));
    body["agent"] = json!("helper");
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| {
            f.event.as_deref() == Some("progress")
                && f.json()["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("No warm pod"))
        })
        .await;
    assert_eq!(
        frames.last().unwrap().json()["message"],
        "No warm pod for this session's shape (an agent); starting one"
    );
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// Two runners over one namespace, one pooled watch pod, two sessions at
/// once: exactly one claims it, the other starts cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_racing_for_one_pooled_watch_pod_never_both_get_it() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .unwrap();
    let vars = pooled_vars(&pool_of(1));
    let vars = vars_ref(&vars);
    let a = RunnerProcess::spawn(Backend::Kubernetes, dirs.0.path(), Some(&sim), &vars).await;
    until_ready(&a.base, 1).await;
    let b = RunnerProcess::spawn(Backend::Kubernetes, dirs.1.path(), Some(&sim), &vars).await;
    until_ready(&b.base, 1).await;
    assert_eq!(idle_pods(&sim).await.len(), 1, "the second found it full");
    sim.faults().hold("create", "pods");
    let client = runner_core::http_client::client();
    let create = |base: String| {
        let client = client.clone();
        async move {
            let (status, created) = request_at(
                &client,
                &base,
                reqwest::Method::POST,
                "/v1/sessions",
                Some(watch_body(json!({"stdout": ["racing"]}))),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{created}");
            created["sessionId"].as_str().unwrap().to_owned()
        }
    };
    let (first, second) = tokio::join!(create(a.base.clone()), create(b.base.clone()));
    let warm_of = |base: String, id: String| async move {
        let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
        let frames = events
            .events_until(|f| {
                f.event.as_deref() == Some("progress")
                    && matches!(
                        f.json()["message"].as_str(),
                        Some(WARM | "No warm pod is ready; starting one")
                    )
            })
            .await;
        frames.last().unwrap().json()["message"] == WARM
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

/// A runner killed while a session runs on a claimed pooled pod: the next
/// one adopts it by the pod's own name (not `telo-watch-<id>`), as it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_runner_adopts_a_session_on_a_claimed_pooled_pod() {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .unwrap();
    let vars = pooled_vars(&pool_of(1));
    let vars = vars_ref(&vars);
    let client = runner_core::http_client::client();
    let mut first = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    until_ready(&first.base, 1).await;
    let idle = idle_pods(&sim).await;
    let (status, created) = request_at(
        &client,
        &first.base,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(watch_body(json!({"stdout": ["before the crash"]}))),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", first.base), &[]).await;
    assert!(
        progress_until_running(&mut events)
            .await
            .contains(&WARM.to_owned())
    );
    run_event(&mut events, "app", "started", 1).await;
    let (status, _) = request_at(
        &client,
        &first.base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "kept.txt", "content": "written before the crash"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    drop(events);
    first.child.kill().unwrap();
    first.child.wait().unwrap();

    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    ready(&second.base).await;
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", second.base), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    // The same pod, adopted, not replaced.
    let pod = pod_of(&sim, &id).await.expect("the session's pod");
    assert_eq!(pod["metadata"]["name"], idle[0].0);
    assert_eq!(pod["metadata"]["uid"], idle[0].1);
    let mut socket = ws::connect(
        &format!(
            "{}/v1/sessions/{id}/io?app=app",
            second.base.replacen("http", "ws", 1)
        ),
        None,
    )
    .await;
    ws::read_until_output(&mut socket, "before the crash").await;
    let (status, _) = request_at(
        &client,
        &second.base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "telo.yaml", "content": manifest(json!({"stdout": ["after the crash"]}))}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    run_event(&mut events, "app", "started", 1).await;
    ws::read_until_output(&mut socket, "after the crash").await;
    let (_, file) = request_at(
        &client,
        &second.base,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=kept.txt"),
        None,
    )
    .await;
    assert_eq!(file["content"], "written before the crash");
    let (status, _) = request_at(
        &client,
        &second.base,
        reqwest::Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(
        sim.wait_for_deletion("pods", "telo-sessions", &idle[0].0, WAIT)
            .await
            .is_ok(),
        "stopped by its own name"
    );
    drop(second);
    sim.shutdown().await;
}

/// A claimed session nobody watches suspends (its pooled pod taken down by
/// its name) and resumes with its files, on the pool's next pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_session_suspends_and_resumes_with_its_files() {
    let pool = pool_of(1);
    let vars = [
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_IDLE_SECONDS", "1"),
        ("RUNNER_WARM_POOL_WATCH", pool.as_str()),
    ];
    let runner = Runner::start_kube(common::cluster(), &vars).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    let idle = idle_pods(sim).await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["suspend me"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    assert!(
        progress_until_running(&mut events)
            .await
            .contains(&WARM.to_owned())
    );
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
    until_status(&runner, &id, "suspended").await;
    assert!(
        sim.wait_for_deletion("pods", "telo-sessions", &idle[0].0, WAIT)
            .await
            .is_ok(),
        "the claimed pod is taken down by its name"
    );
    // The pool has a new pod by now; the resume claims it.
    until_ready(&runner.base, 1).await;
    let next = idle_pods(sim).await;
    let mut events = runner.events(&id, &[]).await;
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(
        progress_until_running(&mut events)
            .await
            .contains(&WARM.to_owned())
    );
    // The write reloaded the app once (generation 2); the resume starts
    // the next.
    let resumed = run_event(&mut events, "app", "started", 3).await;
    assert_eq!(resumed["trigger"], "resume");
    let pod = pod_of(sim, &id).await.expect("the resumed pod");
    assert_eq!(pod["metadata"]["name"], next[0].0);
    let (_, file) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=kept.txt"),
        None,
    )
    .await;
    assert_eq!(file["content"], "still here");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// An app set change on a claimed session recreates its pod: two apps on a
/// cold `telo-watch-<id>` pod (said why), the files kept, the pooled pod
/// taken down by its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_set_change_moves_a_claimed_session_to_a_cold_pod() {
    let vars = pooled_vars(&pool_of(1));
    let runner = Runner::start_kube(common::cluster(), &vars_ref(&vars)).await;
    let sim = runner.sim.as_ref().unwrap();
    until_ready(&runner.base, 1).await;
    let idle = idle_pods(sim).await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["the app"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    assert!(
        progress_until_running(&mut events)
            .await
            .contains(&WARM.to_owned())
    );
    run_event(&mut events, "app", "started", 1).await;
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "api/telo.yaml", "content": manifest(json!({"stdout": ["the api"]}))}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = request(
        &runner,
        reqwest::Method::PUT,
        &format!("/v1/sessions/{id}/apps"),
        Some(json!({"apps": [
            {"name": "app", "entryRelativePath": "telo.yaml"},
            {"name": "api", "entryRelativePath": "api/telo.yaml"},
        ]})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let api = run_event(&mut events, "api", "started", 1).await;
    assert_eq!(api["trigger"], "resume");
    let mut socket = runner.io(&id, "?app=api").await;
    ws::read_until_output(&mut socket, "the api").await;
    assert!(
        sim.wait_for_deletion("pods", "telo-sessions", &idle[0].0, WAIT)
            .await
            .is_ok()
    );
    let pod = sim
        .get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
        .expect("a cold pod for two apps");
    assert_eq!(containers(&pod), ["workspace", "app-app", "app-api"]);
    let (_, file) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=api/telo.yaml"),
        None,
    )
    .await;
    assert!(file["content"].as_str().unwrap().contains("the api"));
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// A quota with room for the pool only: the refill stops at it, and a
/// two-app watch session (a cold pod) gets its pod in the place of an idle
/// pooled pod, which gives way — a watch pool's, or a run pool's.
#[rstest::rstest]
#[case::watch_pool("RUNNER_WARM_POOL_WATCH")]
#[case::run_pool("RUNNER_WARM_POOL")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_quota_gives_a_cold_watch_session_a_pooled_pods_place(#[case] var: &str) {
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
    let vars = [("RUNNER_WATCH_SESSIONS", "true"), (var, pool.as_str())];
    let log = dir.path().join("runner.log");
    let runner =
        RunnerProcess::spawn_logging_to(Backend::Kubernetes, dir.path(), Some(&sim), &vars, &log)
            .await;
    let metric = if var == "RUNNER_WARM_POOL" {
        IMAGE.to_owned()
    } else {
        format!("watch:{IMAGE}")
    };
    until_pool_ready(&runner.base, &metric, 2).await;
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + WAIT;
    while !logged().contains(
        "the session namespace's quota is full: the warm pool holds fewer pods than its size",
    ) {
        assert!(Instant::now() < deadline, "no quota line:\n{}", logged());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut two = watch_body(json!({"stdout": ["in a pooled pod's place"]}));
    two["apps"] = json!([
        {"name": "web", "entryRelativePath": "telo.yaml"},
        {"name": "api", "entryRelativePath": "telo.yaml"},
    ]);
    let client = runner_core::http_client::client();
    let (status, created) = request_at(
        &client,
        &runner.base,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(two),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    until_status_at(&client, &runner.base, &id, "running").await;
    assert!(
        logged()
            .contains("the session namespace's quota is full: a warm pod gives way to a session"),
        "{}",
        logged()
    );
    assert!(
        sim.get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
            .is_some()
    );
    drop(runner);
    sim.shutdown().await;
}
