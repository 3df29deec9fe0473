//! Telo versions on the Kubernetes backend (0.17), black-box over real
//! sockets against kube-sim with a closed registry: a named release runs its
//! own image under the operator's pull policy, a release the registry lacks
//! fails the start within seconds naming it, and what the runner cannot run
//! is refused before a session exists.

mod common;

use std::time::Duration;

use common::Runner;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::sse::SseStream;

/// The tags this cluster's registry holds: the kernel releases the tests
/// name, and the images every session pod needs anyway.
const PUBLISHED: &[&str] = &[
    "telorun/node:0.96.0-slim",
    "telorun/node:0.97.1-slim",
    "telorun/node:0-slim",
    "busybox:*",
    "telo-runner:*",
    "registry.lab/telo:dev",
];

/// How long a start that cannot pull its image may take to fail: the
/// kubelet's first `ErrImagePull`, not the two-minute start deadline.
const FAILS_FAST: Duration = Duration::from_secs(10);

async fn runner(vars: &[(&str, &str)]) -> Runner {
    let sim = PUBLISHED
        .iter()
        .fold(common::cluster(), |sim, glob| sim.published_image(glob));
    Runner::start_kube(sim, vars).await
}

/// A run session of the default app on telo `version`, inspected so the
/// kernel's debug stream reports its generation, kept running (echoing its
/// input) until it is stopped.
fn run_body(version: &str) -> Value {
    let mut body = test_support::bundle::start_body(
        json!({"debugEvents": ["Kernel.Starting", "Kernel.Started"], "echo": true}),
    );
    body.as_object_mut().expect("an object").remove("config");
    body["telo"] = json!(version);
    body["inspect"] = json!(true);
    body
}

fn watch_body(apps: Value) -> Value {
    let mut body = test_support::bundle::start_body(json!({}));
    body.as_object_mut().expect("an object").remove("config");
    body["mode"] = json!("watch");
    body["bundle"]["files"]
        .as_array_mut()
        .expect("files")
        .push(json!({
            "relativePath": "api/telo.yaml",
            "contents": "kind: Telo.Application\nmetadata: { name: api }\nfakeTelo: {}\n",
        }));
    body["apps"] = apps;
    body
}

/// The container named `name` of pod `pod` as the cluster stores it.
fn container(runner: &Runner, pod: &str, name: &str) -> Value {
    let sim = runner.sim.as_ref().expect("a Kubernetes runner");
    let pod = sim
        .get_value("pods", "telo-sessions", pod)
        .unwrap_or_else(|| panic!("pod {pod} exists"));
    pod["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("container {name} in {pod}"))
        .clone()
}

async fn run_started(events: &mut SseStream, app: &str) -> Value {
    let frames = tokio::time::timeout(
        WAIT,
        events.events_until(|f| {
            f.event.as_deref() == Some("run")
                && f.json()["app"] == app
                && f.json()["phase"] == "started"
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("app {app} never started"));
    frames.last().expect("the run event").json()
}

/// The `failed` status of a session whose start cannot succeed, which must
/// come within [`FAILS_FAST`].
async fn failed_fast(runner: &Runner, id: &str) -> String {
    let mut events = runner.events(id, &[]).await;
    let frames = tokio::time::timeout(
        FAILS_FAST,
        events.events_until(|f| matches!(f.status_kind().as_deref(), Some("failed" | "running"))),
    )
    .await
    .expect("the start fails within seconds, not at the start deadline");
    let status = frames.last().expect("a status").json()["status"].clone();
    assert_eq!(status["kind"], "failed", "{status}");
    status["message"].as_str().expect("a message").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_offer_telo_versions_and_deprecate_the_keys_they_supersede() {
    let runner = runner(&[]).await;
    let (status, capabilities) = runner.get("/v1/capabilities").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(capabilities["features"]["teloVersions"], json!(true));
    assert_eq!(
        capabilities["config"]["supersededByTelo"],
        json!(["image", "pullPolicy"])
    );
    let schema = &capabilities["config"]["schema"];
    assert_eq!(schema["properties"]["image"]["deprecated"], json!(true));
    assert_eq!(
        schema["properties"]["pullPolicy"]["deprecated"],
        json!(true)
    );
    assert_eq!(schema["required"], json!([]));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_session_on_a_published_release_runs_its_image_under_the_operator_policy() {
    let runner = runner(&[("RUNNER_PULL_POLICY", "always")]).await;
    let id = runner.create_body(run_body("0.96.0")).await;
    let mut events = runner.events(&id, &[]).await;
    let started = run_started(&mut events, "app").await;
    assert_eq!(started["telo"], "0.96.0", "{started}");
    let session = container(&runner, &format!("telo-run-{id}"), "session");
    assert_eq!(session["image"], "telorun/node:0.96.0-slim");
    assert_eq!(session["imagePullPolicy"], "Always");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_registry_lacks_fails_the_start_within_seconds_naming_it() {
    let runner = runner(&[]).await;
    let id = runner.create_body(run_body("0.99.0")).await;
    let message = failed_fast(&runner, &id).await;
    assert!(message.contains("telo 0.99.0"), "{message}");
    assert!(message.contains("telorun/node:0.99.0-slim"), "{message}");
    assert!(message.contains("ErrImagePull"), "{message}");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreleased_build_is_refused_unless_the_operator_names_its_image() {
    let runner = runner(&[]).await;
    let (status, refused) = runner
        .post("/v1/sessions", &run_body("0.97.0+unreleased"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["error"], "telo_version_unavailable");
    assert_eq!(refused["app"], "app");
    assert_eq!(refused["version"], "0.97.0+unreleased");
    assert_eq!(
        refused["reason"],
        "0.97.0+unreleased is an unreleased build, which has no published image. Pin a \
         released telo version for this workspace, or have the runner's operator set \
         RUNNER_TELO_UNRELEASED_IMAGE to a kernel image built from that same tree"
    );
    runner.stop().await;

    let runner = runner_with_unreleased().await;
    let id = runner.create_body(run_body("0.97.0+unreleased")).await;
    let mut events = runner.events(&id, &[]).await;
    let started = run_started(&mut events, "app").await;
    assert_eq!(started["telo"], "0.97.0+unreleased", "{started}");
    let session = container(&runner, &format!("telo-run-{id}"), "session");
    assert_eq!(session["image"], "registry.lab/telo:dev");
    assert_eq!(session["imagePullPolicy"], "IfNotPresent");
    runner.stop().await;
}

async fn runner_with_unreleased() -> Runner {
    let sim = PUBLISHED
        .iter()
        .fold(common::cluster(), |sim, glob| sim.published_image(glob))
        .image("registry.lab/telo:*", kube_sim::ImageBehaviour::FakeTelo);
    Runner::start_kube(
        sim,
        &[("RUNNER_TELO_UNRELEASED_IMAGE", "registry.lab/telo:dev")],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_beside_a_version_is_refused_as_invalid_config() {
    let runner = runner(&[]).await;
    let mut body = run_body("0.96.0");
    body["config"] = json!({"image": "telorun/node:0.96.0-slim"});
    let (status, refused) = runner.post("/v1/sessions", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(
        refused,
        json!({
            "error": "invalid_config",
            "message": "`config.image` and an application's `telo` version both say what runs; send one. `config.image` is deprecated \u{2014} name the telo version instead.",
        })
    );
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_session_runs_each_app_on_its_own_release() {
    let runner = runner(&[("RUNNER_WATCH_SESSIONS", "true")]).await;
    let id = runner
        .create_body(watch_body(json!([
            {"name": "web", "entryRelativePath": "telo.yaml", "telo": "0.96.0"},
            {"name": "api", "entryRelativePath": "api/telo.yaml", "telo": "0.97.1"},
        ])))
        .await;
    let mut events = runner.events(&id, &[]).await;
    // The two apps start in either order.
    let mut started: Vec<Value> = Vec::new();
    tokio::time::timeout(
        WAIT,
        events.events_until(|f| {
            if f.event.as_deref() == Some("run") && f.json()["phase"] == "started" {
                started.push(f.json());
            }
            started.len() == 2
        }),
    )
    .await
    .expect("both apps start");
    let telo_of = |app: &str| {
        started
            .iter()
            .find(|run| run["app"] == app)
            .map(|run| run["telo"].clone())
    };
    assert_eq!(telo_of("web"), Some(json!("0.96.0")), "{started:?}");
    assert_eq!(telo_of("api"), Some(json!("0.97.1")), "{started:?}");
    let pod = format!("telo-watch-{id}");
    for (name, image) in [
        ("app-web", "telorun/node:0.96.0-slim"),
        ("app-api", "telorun/node:0.97.1-slim"),
    ] {
        let app = container(&runner, &pod, name);
        assert_eq!(app["image"], image);
        assert_eq!(app["imagePullPolicy"], "IfNotPresent");
    }
    // The workspace container is the runner's own image, whatever the apps run.
    let workspace = container(&runner, &pod, "workspace");
    assert!(
        workspace["image"]
            .as_str()
            .is_some_and(|image| image.starts_with("telo-runner:")),
        "{workspace}"
    );
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_session_on_a_release_the_registry_lacks_fails_within_seconds_naming_it() {
    let runner = runner(&[("RUNNER_WATCH_SESSIONS", "true")]).await;
    let id = runner
        .create_body(watch_body(json!([
            {"name": "web", "entryRelativePath": "telo.yaml", "telo": "0.96.0"},
            {"name": "api", "entryRelativePath": "api/telo.yaml", "telo": "0.99.0"},
        ])))
        .await;
    let message = failed_fast(&runner, &id).await;
    assert!(message.contains("telo 0.99.0"), "{message}");
    assert!(message.contains("telorun/node:0.99.0-slim"), "{message}");
    assert!(message.contains("app-api"), "{message}");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_session_below_the_supervisable_floor_is_refused() {
    let runner = runner(&[("RUNNER_WATCH_SESSIONS", "true")]).await;
    let (status, refused) = runner
        .post(
            "/v1/sessions",
            &watch_body(json!([
                {"name": "web", "entryRelativePath": "telo.yaml", "telo": "0.81.0"},
            ])),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["error"], "telo_version_unavailable");
    assert_eq!(refused["app"], "web");
    assert_eq!(refused["version"], "0.81.0");
    assert_eq!(
        refused["reason"],
        "telo 0.81.0 is older than 0.95.0, the oldest release a runner is verified to supervise (watch mode, the debug stream and the workspace marker)"
    );
    runner.stop().await;
}
