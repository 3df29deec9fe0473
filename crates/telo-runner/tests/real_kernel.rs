//! The example applications on the real Telo kernel, through both
//! backends: local processes, and pods on kube-sim whose kernel image runs
//! the real CLI.
//!
//! Every test here is `#[ignore]`d: it runs only where a kernel is given
//! (`TELO_REAL_KERNEL_DIR` naming a Telo CLI layout, and
//! `cargo nextest run --run-ignored all`, which `.ci/run` does when the
//! variable is set). Asked to run without one, each fails saying so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::free_port;
use test_support::real_kernel::{KERNEL_WAIT, example_bundle, self_contained_bundle, telo_path};
use test_support::ws;

async fn real_runner(backend: Backend, vars: &[(&str, &str)]) -> Runner {
    let kernel = telo_path();
    match backend {
        Backend::Local => {
            let kernel = kernel.to_string_lossy().into_owned();
            let mut all = vec![("RUNNER_LOCAL_TELO", kernel.as_str())];
            all.extend_from_slice(vars);
            Runner::start_on(Backend::Local, &all).await
        }
        Backend::Kubernetes => {
            Runner::start_kube_with_kernel(common::cluster(), kernel, vars).await
        }
    }
}

fn body(example: &str, env: Value, ports: Value, inspect: bool) -> Value {
    json!({
        "bundle": example_bundle(example),
        "env": env,
        "ports": ports,
        "config": { "image": "telorun/node:0-slim", "pullPolicy": "missing" },
        "inspect": inspect,
    })
}

/// Runs `example` to its end; returns its terminal status and its output.
async fn run_to_end(runner: &Runner, body: Value) -> (Value, String) {
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let status = tokio::time::timeout(KERNEL_WAIT, events.events_until_end())
        .await
        .expect("the session ends")
        .last()
        .expect("events")
        .json()["status"]
        .clone();
    (status, runner.full_output(&id).await)
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_examples_print_and_exit_with_the_kernels_code(#[case] backend: Backend) {
    let runner = real_runner(backend, &[]).await;
    let example = |name: &str| example_bundle(name);
    let cases = [
        (
            "hello-world",
            example("hello-world"),
            json!({}),
            "Hello from Telo!",
            0,
        ),
        (
            "env-greeting",
            example("env-greeting"),
            json!({"GREETING_NAME": "Ada", "GREETING_COUNT": "3"}),
            "Hello, Ada (count=3)",
            0,
        ),
        (
            "env-greeting",
            example("env-greeting"),
            json!({}),
            "environment variable GREETING_NAME is not set",
            1,
        ),
        (
            "javascript",
            example("javascript"),
            json!({}),
            "Result is: 84",
            0,
        ),
        (
            "fail-exit",
            example("fail-exit"),
            json!({}),
            "deliberate failure from fail-exit",
            1,
        ),
        (
            "self-contained",
            self_contained_bundle(),
            json!({}),
            "Hello from a self-contained Telo bundle!",
            0,
        ),
    ];
    for (label, bundle, env, expected, code) in cases {
        let mut request = body("hello-world", env, json!([]), false);
        request["bundle"] = bundle;
        let (status, output) = run_to_end(&runner, request).await;
        assert!(output.contains(expected), "{label}: {output}");
        assert_eq!(
            status,
            json!({"kind": "exited", "code": code}),
            "{label}: {output}"
        );
        assert!(!output.contains("[no-egress]"), "{label}: {output}");
    }
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_echo_answers_what_is_typed(#[case] backend: Backend) {
    let runner = real_runner(backend, &[]).await;
    let id = runner
        .create_body(body("stdin-echo", json!({}), json!([]), false))
        .await;
    let mut socket = runner.io(&id, "").await;
    tokio::time::timeout(
        KERNEL_WAIT,
        ws::read_until_output_within(&mut socket, "Name: ", KERNEL_WAIT),
    )
    .await
    .expect("the prompt");
    ws::send_stdin(&mut socket, b"World\r").await;
    let status = tokio::time::timeout(KERNEL_WAIT, runner.wait_terminal(&id))
        .await
        .expect("the session ends");
    let output = runner.full_output(&id).await;
    assert!(output.contains("Hello, World!"), "{output}");
    assert_eq!(status, json!({"kind": "exited", "code": 0}), "{output}");
    runner.stop().await;
}

/// Where a session's port is served: loopback locally, the pod IP on kube-sim.
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_hello_is_reachable_answers_and_stops_gracefully(#[case] backend: Backend) {
    // Asked as a browser would: through the session edge (a local session
    // listens in a network namespace of its own, a pod on its pod IP).
    let runner = real_runner(
        backend,
        &[("RUNNER_PREVIEW_BASE_URL", "http://preview.test")],
    )
    .await;
    let port = free_port();
    let id = runner
        .create_body(body(
            "http-hello",
            json!({"PORT": port.to_string()}),
            json!([{"port": port, "protocol": "tcp"}]),
            false,
        ))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let before_reachable = tokio::time::timeout(
        KERNEL_WAIT,
        events.events_until(|f| {
            f.event.as_deref() == Some("reachability") && f.json()["state"] == "reachable"
        }),
    )
    .await
    .expect("the port becomes reachable");
    let statuses: Vec<String> = before_reachable
        .iter()
        .filter_map(|f| f.status_kind())
        .collect();
    assert_eq!(statuses, ["starting", "running"]);

    let running = before_reachable
        .iter()
        .find(|f| f.status_kind().as_deref() == Some("running"))
        .unwrap()
        .json();
    let host = format!("{port}-{id}.preview.test");
    assert_eq!(
        running["status"]["endpoints"][0]["url"],
        format!("http://{host}")
    );
    let response = runner
        .client
        .get(runner.url("/v1/hello?name=World"))
        .header("host", &host)
        .send()
        .await
        .expect("GET the app through the edge");
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer, json!({"greeting": "Hello World!!", "nice": "WOW"}));

    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let rest = tokio::time::timeout(KERNEL_WAIT, events.events_until_end())
        .await
        .expect("the session ends");
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    let output = runner.full_output(&id).await;
    assert!(
        output.contains("Stopped listening"),
        "the kernel's teardown ran before `stopped`: {output}"
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_inspect_running_follows_kernel_started_and_the_held_app_stays_running(
    #[case] backend: Backend,
) {
    let runner = real_runner(backend, &[]).await;
    let id = runner
        .create_body(body("hello-world", json!({}), json!([]), true))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = tokio::time::timeout(
        KERNEL_WAIT,
        events.events_until(|f| f.status_kind().as_deref() == Some("running")),
    )
    .await
    .expect("running");
    let started_at = frames.iter().position(|f| {
        f.event.as_deref() == Some("debug") && f.json()["frame"]["event"] == "Kernel.Started"
    });
    assert!(
        started_at.is_some_and(|at| at < frames.len() - 1),
        "running comes after the kernel's Kernel.Started: {:?}",
        frames.iter().map(|f| f.json()).collect::<Vec<_>>()
    );
    // CLI 0.81 holds the finished app open under --inspect and says nothing
    // more: the session stays running until it is stopped.
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let rest = tokio::time::timeout(KERNEL_WAIT, events.events_until_end())
        .await
        .expect("the session ends");
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    assert!(runner.full_output(&id).await.contains("Hello from Telo!"));
    runner.stop().await;
}

/// A watch session on the real kernel (`telo run --watch --inspect`): the
/// first generation's output and `run` event come from the kernel itself,
/// and an edit through the workspace makes it reload in place — the next
/// generation's `run` events and its new output — without a new session.
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_session_reloads_in_place_on_an_edit(#[case] backend: Backend) {
    let runner = real_runner(backend, &[("RUNNER_WATCH_SESSIONS", "true")]).await;
    let mut request = body("hello-world", json!({}), json!([]), true);
    request["mode"] = json!("watch");
    let entry = request["bundle"]["files"][0]["contents"]
        .as_str()
        .unwrap()
        .to_owned();
    let id = runner.create_body(request).await;
    let mut events = runner.events(&id, &[]).await;
    let run = |phase: &'static str, generation: u64| {
        move |f: &test_support::sse::SseFrame| {
            f.event.as_deref() == Some("run")
                && f.json()["phase"] == phase
                && f.json()["generation"] == generation
        }
    };
    let started = tokio::time::timeout(KERNEL_WAIT, events.events_until(run("started", 1)))
        .await
        .expect("generation 1 starts");
    assert_eq!(started.last().unwrap().json()["trigger"], "initial");
    let mut socket = runner.io(&id, "?app=app").await;
    tokio::time::timeout(
        KERNEL_WAIT,
        ws::read_until_output_within(&mut socket, "Hello from Telo!", KERNEL_WAIT),
    )
    .await
    .expect("the first generation's output");

    let edited = entry.replace("Hello from Telo!", "Hello again, edited");
    let (status, applied) = runner
        .post(
            &format!("/v1/sessions/{id}/workspace"),
            &json!({"write": [{"path": "telo.yaml", "content": edited}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    let reloaded = tokio::time::timeout(KERNEL_WAIT, events.events_until(run("started", 2)))
        .await
        .expect("the edit starts generation 2");
    assert!(
        reloaded.iter().any(|f| f.event.as_deref() == Some("run")
            && f.json()["phase"] == "completed"
            && f.json()["generation"] == 1
            && f.json()["code"] == 0),
        "generation 1 completed before 2 started: {:?}",
        reloaded.iter().map(|f| f.json()).collect::<Vec<_>>()
    );
    assert_eq!(reloaded.last().unwrap().json()["trigger"], "watch");
    tokio::time::timeout(
        KERNEL_WAIT,
        ws::read_until_output_within(&mut socket, "Hello again, edited", KERNEL_WAIT),
    )
    .await
    .expect("the second generation's output");
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    runner.stop().await;
}

/// The real kernel (0.81) names no version on its debug stream; a local
/// runner reports the release its CLI printed for `--version`, and, given a
/// directory of kernels, runs each request's release: the real one for
/// 0.81.0, fake-telo for 0.96.0.
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_runner_reports_and_chooses_the_real_kernels_release() {
    async fn started(runner: &Runner, body: Value) -> (String, Value) {
        let id = runner.create_body(body).await;
        let mut events = runner.events(&id, &[]).await;
        let frames = tokio::time::timeout(
            KERNEL_WAIT,
            events.events_until(|f| {
                f.event.as_deref() == Some("run") && f.json()["phase"] == "started"
            }),
        )
        .await
        .expect("a generation starts");
        (id, frames.last().unwrap().json())
    }
    /// A session held open under `--inspect` is stopped, then read whole.
    async fn stopped_output(runner: &Runner, id: &str) -> String {
        let response = runner
            .client
            .delete(runner.url(&format!("/v1/sessions/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        runner.wait_terminal(id).await;
        runner.full_output(id).await
    }
    // No version named: what `telo --version` said.
    let runner = real_runner(Backend::Local, &[]).await;
    let (_, run) = started(&runner, body("hello-world", json!({}), json!([]), true)).await;
    assert_eq!(run["telo"], "0.81.0", "{run}");
    runner.stop().await;

    let versions = tempfile::tempdir().unwrap();
    let fixture = telo_path().parent().unwrap().parent().unwrap().to_owned();
    std::os::unix::fs::symlink(&fixture, versions.path().join("0.81.0")).unwrap();
    let fake_bin = versions.path().join("0.96.0").join("bin");
    std::fs::create_dir_all(&fake_bin).unwrap();
    std::os::unix::fs::symlink(
        test_support::fake_telo::fake_telo_path(),
        fake_bin.join("telo"),
    )
    .unwrap();
    let dir = versions.path().to_string_lossy().into_owned();
    let runner = Runner::start_on(
        Backend::Local,
        &[("RUNNER_LOCAL_TELO_VERSIONS", dir.as_str())],
    )
    .await;
    let mut request = body("hello-world", json!({}), json!([]), true);
    request.as_object_mut().unwrap().remove("config");
    request["telo"] = json!("0.81.0");
    let (id, run) = started(&runner, request).await;
    assert_eq!(run["telo"], "0.81.0", "{run}");
    let output = stopped_output(&runner, &id).await;
    assert!(output.contains("Hello from Telo!"), "{output}");

    let mut request =
        test_support::bundle::start_body(json!({"stdout": ["fake kernel"], "echo": true}));
    request.as_object_mut().unwrap().remove("config");
    request["inspect"] = json!(true);
    request["telo"] = json!("0.96.0");
    let (id, run) = started(&runner, request).await;
    assert_eq!(run["telo"], "0.96.0", "{run}");
    let output = stopped_output(&runner, &id).await;
    assert!(output.contains("fake kernel"), "{output}");
    runner.stop().await;
}

/// On Kubernetes a named release runs its image (`telorun/node:0.81.0-slim`,
/// here the real kernel) and `run started` names it: the 0.81 kernel's
/// `Kernel.Starting` carries no version, so the runner reports the release
/// it launched.
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_runner_runs_and_reports_the_named_release() {
    let runner = real_runner(Backend::Kubernetes, &[]).await;
    let mut request = body("hello-world", json!({}), json!([]), true);
    request.as_object_mut().unwrap().remove("config");
    request["telo"] = json!("0.81.0");
    let id = runner.create_body(request).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = tokio::time::timeout(
        KERNEL_WAIT,
        events
            .events_until(|f| f.event.as_deref() == Some("run") && f.json()["phase"] == "started"),
    )
    .await
    .expect("a generation starts");
    assert_eq!(frames.last().unwrap().json()["telo"], "0.81.0");
    let sim = runner.sim.as_ref().unwrap();
    let pod = sim
        .get_value("pods", "telo-sessions", &format!("telo-run-{id}"))
        .unwrap();
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "telorun/node:0.81.0-slim"
    );
    let response = runner
        .client
        .delete(runner.url(&format!("/v1/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    runner.wait_terminal(&id).await;
    let output = runner.full_output(&id).await;
    assert!(output.contains("Hello from Telo!"), "{output}");
    runner.stop().await;
}

/// A warm pod's kernel cache, warmed by its `warm-up` init container with
/// the default modules, leaves http-hello's kernel nothing to install or
/// build: no resolution line, no `progress` for one, and it answers.
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_hello_on_a_warm_pod_finds_its_controllers_in_the_warmed_cache() {
    let runner = real_runner(
        Backend::Kubernetes,
        &[("RUNNER_WARM_POOL", "telorun/node:0-slim=1")],
    )
    .await;
    runner.until_warm_pods_ready("telorun/node:0-slim", 1).await;
    let port = free_port();
    let id = runner
        .create_body(body(
            "http-hello",
            json!({"PORT": port.to_string()}),
            json!([{"port": port, "protocol": "tcp"}]),
            false,
        ))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let before_reachable = tokio::time::timeout(
        KERNEL_WAIT,
        events.events_until(|f| {
            f.event.as_deref() == Some("reachability") && f.json()["state"] == "reachable"
        }),
    )
    .await
    .expect("the port becomes reachable");
    let progress: Vec<String> = before_reachable
        .iter()
        .filter(|f| f.event.as_deref() == Some("progress"))
        .map(|f| f.json()["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        progress.iter().any(|m| m == "Starting on a warm pod"),
        "{progress:?}"
    );
    assert!(
        !progress.iter().any(|m| m.starts_with("Resolving")),
        "{progress:?}"
    );
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let _ = tokio::time::timeout(KERNEL_WAIT, events.events_until_end()).await;
    let output = runner.full_output(&id).await;
    assert!(!output.contains('⬇'), "{output}");
    assert!(output.contains("Listening"), "{output}");
    runner.stop().await;
}
