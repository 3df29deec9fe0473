//! The runner image and session pods in real containers (a container
//! engine and the images `scripts/image.sh` builds; `.ci/run` provides
//! both). The runner image serves as uid 1000 on a read-only root, and as
//! the Kubernetes backend on the host network it runs a session on kube-sim
//! end to end.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Instant;

use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::containers::{Container, Image, engine};
use test_support::sse::SseStream;

/// Polls `url` until it answers 200 (the container is up), failing with the
/// container's log when it does not within [`WAIT`].
async fn until_ok(url: &str, container: &Container) -> Value {
    let client = runner_core::http_client::client();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(response) = client.get(url).send().await
            && response.status() == StatusCode::OK
        {
            return response.json().await.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{url} never answered; the container said:\n{}",
            container.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The runner image run as the chart runs it: uid 1000, read-only root,
/// no capabilities, no privilege escalation, a writable /tmp only.
fn hardened_runner(client: &str, port: u16, extra: &[&str]) -> Container {
    let image = Image::Runner.reference();
    let port_env = format!("PORT={port}");
    let mut args = vec![
        "--user",
        "1000:1000",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--tmpfs",
        "/tmp",
        "--network",
        "host",
        "-e",
        &port_env,
    ];
    args.extend_from_slice(extra);
    args.push(&image);
    Container::start(client, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_image_serves_as_uid_1000_on_a_read_only_root() {
    let client = engine(&[Image::Runner]);
    let port = test_support::free_port();
    // The local backend, so nothing but the image itself is needed.
    let runner = hardened_runner(&client, port, &["-e", "RUNNER_BACKEND=local"]);
    let health = until_ok(&format!("http://127.0.0.1:{port}/v1/health"), &runner).await;
    assert_eq!(health["ok"], true, "{health}");
    let top = test_support::containers::run(&client, &["top", &runner.id, "-o", "uid,args"]);
    let processes = String::from_utf8_lossy(&top.stdout);
    assert!(
        processes
            .lines()
            .skip(1)
            .all(|line| line.trim_start().starts_with("1000 ")),
        "{processes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_image_runs_a_session_on_kube_sim_as_the_kubernetes_backend() {
    let client = engine(&[Image::Runner]);
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .expect("kube-sim starts");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    // Readable by the image's user.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let port = test_support::free_port();
    let mount = format!("{}:/etc/telo-runner/kubeconfig:ro", kubeconfig.display());
    let self_url = format!("RUNNER_SELF_URL=http://127.0.0.1:{port}");
    let runner = hardened_runner(
        &client,
        port,
        &[
            "-v",
            &mount,
            "-e",
            "KUBECONFIG=/etc/telo-runner/kubeconfig",
            "-e",
            &self_url,
            "-e",
            "RUNNER_BASE_IMAGE_CATALOG_ENABLED=false",
            "-e",
            "RUNNER_IMAGE=telorun/node:0-slim",
        ],
    );
    let base = format!("http://127.0.0.1:{port}");
    until_ok(&format!("{base}/readyz"), &runner).await;

    let http = runner_core::http_client::client();
    let created: Value = http
        .post(format!("{base}/v1/sessions"))
        .json(&test_support::bundle::start_body(
            json!({"stdout": ["hello from the runner image"], "exitCode": 3}),
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().expect("a session").to_owned();
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 3}),
        "{frames:?}\n{}",
        runner.logs()
    );
    let socket = format!("{}/v1/sessions/{id}/io", base.replacen("http", "ws", 1));
    let mut socket = test_support::ws::connect(&socket, None).await;
    test_support::ws::read_until_output(&mut socket, "hello from the runner image").await;
    drop(runner);
    sim.shutdown().await;
}
