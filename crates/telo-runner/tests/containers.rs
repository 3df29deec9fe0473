//! The runner image and session pods in real containers (a container
//! engine and the images `scripts/image.sh` builds; `.ci/run` provides
//! both). The runner image serves as uid 1000 on a read-only root, and as
//! the Kubernetes backend on the host network it runs a session on kube-sim
//! end to end.
//!
//! Session pods run the stand-in kernel image (fake-telo as `telo`, built by
//! `scripts/image.sh fake-kernel`) wherever the test is about the runner; the
//! tests that run the real kernel's image are `#[ignore]`d real-kernel tests
//! (`TELO_REAL_KERNEL_DIR`, then `scripts/image.sh session`).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Instant;

use common::Runner;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::containers::{Container, Image, TestImage, engine, image_modules_dir};
use test_support::real_kernel::{KERNEL_WAIT, example_bundle_in_image, example_files_with_modules};
use test_support::sse::SseStream;
use test_support::ws;

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
    // The local backend, so nothing but the image itself is needed; on the
    // runner's own network, since a process without capabilities cannot
    // make a namespace per session (the image is the Kubernetes runner's).
    let runner = hardened_runner(
        &client,
        port,
        &[
            "-e",
            "RUNNER_BACKEND=local",
            "-e",
            "RUNNER_LOCAL_NETWORK=host",
        ],
    );
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

// --- session pods as real containers (kube-sim's docker runtime) ---------------

/// A runner (in this process) on a kube-sim whose pods are real containers:
/// the init container is busybox fetching the bundle from this runner over
/// the host network, the kernel image `kernel`.
async fn runner_on_containers(kernel: Image, vars: &[(&str, &str)]) -> Runner {
    let sim = common::cluster().runtime(kube_sim::Runtime::Docker);
    let session = kernel.reference();
    let init = Image::Init.reference();
    let mut all = vec![
        ("RUNNER_IMAGE", session.as_str()),
        ("RUNNER_INIT_IMAGE", init.as_str()),
    ];
    all.extend_from_slice(vars);
    Runner::start_kube(sim, &all).await
}

fn run_body(bundle: Value) -> Value {
    json!({"bundle": bundle, "env": {}, "ports": [], "inspect": false})
}

/// Runs a session to its end; its terminal status and its output.
async fn run_to_end(runner: &Runner, body: Value) -> (Value, String) {
    let id = runner.create_body(body).await;
    let status = tokio::time::timeout(KERNEL_WAIT, runner.wait_terminal(&id))
        .await
        .expect("the session ends");
    (status, runner.full_output(&id).await)
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_session_runs_the_real_kernel_image_in_hardened_containers() {
    engine(&[Image::Session, Image::Init]);
    let runner = runner_on_containers(Image::Session, &[]).await;
    let bundle = example_bundle_in_image("hello-world", &image_modules_dir());
    let (status, output) = run_to_end(&runner, run_body(bundle)).await;
    assert!(output.contains("Hello from Telo!"), "{output}");
    assert_eq!(status, json!({"kind": "exited", "code": 0}), "{output}");
    runner.stop().await;
}

/// The run pod's hardening, observed from inside by a kernel image whose
/// `telo` is a probe: the user, the read-only root, the writable work
/// volume, no capabilities, no privilege escalation, a seccomp filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_pods_hardening_holds_inside_the_container() {
    let client = engine(&[Image::Base, Image::Init]);
    let tag = format!(
        "telo-runner-test/probe:{}",
        runner_core::ids::new_session_id()
    );
    let probe = TestImage::build(
        &client,
        &tag,
        &format!(
            "FROM {}\nCOPY telo /usr/local/bin/telo\nUSER 1000:1000\n",
            Image::Base.reference()
        ),
        &[(
            "telo",
            "#!/bin/sh\n\
             echo \"probe id: $(id)\"\n\
             if touch /probe 2>/dev/null; then echo 'probe root: writable'; else echo 'probe root: read-only'; fi\n\
             if touch /work/probe 2>/dev/null; then echo 'probe work: writable'; else echo 'probe work: not writable'; fi\n\
             if chown 0:0 /work/probe 2>/dev/null; then echo 'probe chown: allowed'; else echo 'probe chown: refused'; fi\n\
             echo \"probe bundle: $(ls /app)\"\n\
             grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status | sed 's/^/probe /'\n",
            true,
        )],
    );
    let runner = runner_on_containers(Image::FakeKernel, &[]).await;
    let mut body = test_support::bundle::start_body(json!({}));
    body["config"] = json!({"image": probe.tag, "pullPolicy": "never"});
    let (status, output) = run_to_end(&runner, body).await;
    assert_eq!(status, json!({"kind": "exited", "code": 0}), "{output}");
    for line in [
        "probe id: uid=1000 gid=1000 groups=1000",
        "probe root: read-only",
        "probe work: writable",
        "probe chown: refused",
        "probe bundle: telo.yaml",
        "probe CapEff:\t0000000000000000",
        "probe NoNewPrivs:\t1",
        "probe Seccomp:\t2",
    ] {
        assert!(output.contains(line), "{line:?} missing from:\n{output}");
    }
    runner.stop().await;
}

/// A workload over its memory limit is OOM-killed by the engine, and the
/// session fails saying so, with the limit. The workload is a kernel image
/// whose `telo` keeps everything it reads from /dev/zero (`tail` holds the
/// whole of a line that never ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_its_memory_limit_fails_as_oom_killed() {
    let client = engine(&[Image::Base, Image::Init]);
    let tag = format!(
        "telo-runner-test/hungry:{}",
        runner_core::ids::new_session_id()
    );
    let hungry = TestImage::build(
        &client,
        &tag,
        &format!(
            "FROM {}\nCOPY telo /usr/local/bin/telo\nUSER 1000:1000\n",
            Image::Base.reference()
        ),
        &[(
            "telo",
            "#!/bin/sh\necho eating\nexec tail /dev/zero\n",
            true,
        )],
    );
    let runner = runner_on_containers(Image::FakeKernel, &[("RUNNER_MAX_MEMORY", "200Mi")]).await;
    let mut body = test_support::bundle::start_body(json!({}));
    body["config"] = json!({"image": hungry.tag, "pullPolicy": "never"});
    let (status, output) = run_to_end(&runner, body).await;
    assert_eq!(
        status,
        json!({"kind": "failed", "message": "container \"session\" failed: OOMKilled (exit code 137): it used more memory than its limit of 200Mi and was killed"}),
        "{output}"
    );
    runner.stop().await;
}

/// An app session runs its catalog image with the image's own entrypoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_session_runs_its_catalog_image_in_a_container() {
    let client = engine(&[Image::FakeKernel]);
    let tag = format!(
        "telo-runner-test/hello-app:{}",
        runner_core::ids::new_session_id()
    );
    let manifest = "kind: Telo.Application\nmetadata: { name: hello }\nfakeTelo:\n  stdout: [\"Hello from a catalog app\"]\n";
    let app = TestImage::build(
        &client,
        &tag,
        &format!(
            "FROM {}\nCOPY telo.yaml /opt/app/telo.yaml\nCMD [\"telo\", \"run\", \"/opt/app/telo.yaml\"]\n",
            Image::FakeKernel.reference()
        ),
        &[("telo.yaml", manifest, false)],
    );
    let catalog = json!({"hello": {"image": app.tag, "pullPolicy": "never"}}).to_string();
    let runner =
        runner_on_containers(Image::FakeKernel, &[("RUNNER_APPS", catalog.as_str())]).await;
    let (status, created) = runner.post("/v1/apps/hello/sessions", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let status = tokio::time::timeout(KERNEL_WAIT, runner.wait_terminal(&id))
        .await
        .expect("the session ends");
    let output = runner.full_output(&id).await;
    assert!(output.contains("Hello from a catalog app"), "{output}");
    assert_eq!(status, json!({"kind": "exited", "code": 0}), "{output}");
    runner.stop().await;
}

/// A one-file bundle: `telo.yaml` as given.
fn manifest_bundle(manifest: &str) -> Value {
    json!({
        "entryRelativePath": "telo.yaml",
        "files": [{"relativePath": "telo.yaml", "contents": manifest}],
    })
}

/// A manifest the stand-in kernel runs: it prints `line` and exits 0.
fn fake_manifest(line: &str) -> String {
    format!(
        "kind: Telo.Application\nmetadata: {{ name: hello }}\nfakeTelo:\n  stdout: [{line:?}]\n"
    )
}

/// The hello-world example rendered for the real kernel's image, with its
/// greeting replaced by `line`.
fn real_manifest(line: &str) -> String {
    example_files_with_modules("hello-world", &image_modules_dir())
        .into_iter()
        .find(|(path, _)| path == "telo.yaml")
        .expect("the example's manifest")
        .1
        .replace("Hello from Telo!", line)
}

/// A watch session's pod in containers: the workspace service (the runner
/// image) and the app (`kernel`'s image) share the workspace volume as
/// uid 1000 on read-only roots; an edit reloads the app in place.
async fn watch_pod_shares_its_workspace(kernel: Image, manifest: fn(&str) -> String) {
    engine(&[kernel, Image::Runner]);
    let workspace_image = Image::Runner.reference();
    let runner = runner_on_containers(
        kernel,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WORKSPACE_IMAGE", workspace_image.as_str()),
        ],
    )
    .await;
    let mut body = run_body(manifest_bundle(&manifest("Hello from a container")));
    body["mode"] = json!("watch");
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let run = |phase: &'static str, generation: u64| {
        move |f: &test_support::sse::SseFrame| {
            f.event.as_deref() == Some("run")
                && f.json()["phase"] == phase
                && f.json()["generation"] == generation
        }
    };
    tokio::time::timeout(KERNEL_WAIT, events.events_until(run("started", 1)))
        .await
        .expect("generation 1 starts");
    let mut socket = runner.io(&id, "?app=app").await;
    ws::read_until_output_within(&mut socket, "Hello from a container", KERNEL_WAIT).await;
    let edited = manifest("Hello again, edited in a container");
    let (status, _) = runner
        .post(
            &format!("/v1/sessions/{id}/workspace"),
            &json!({"write": [{"path": "telo.yaml", "content": edited}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::timeout(KERNEL_WAIT, events.events_until(run("started", 2)))
        .await
        .expect("generation 2 starts");
    ws::read_until_output_within(
        &mut socket,
        "Hello again, edited in a container",
        KERNEL_WAIT,
    )
    .await;
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_session_pod_shares_its_workspace_across_hardened_containers() {
    watch_pod_shares_its_workspace(Image::FakeKernel, fake_manifest).await;
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_session_pod_reloads_the_real_kernel_in_hardened_containers() {
    watch_pod_shares_its_workspace(Image::Session, real_manifest).await;
}

/// A warm pool in real containers: the pool's pod waits, hardened, on
/// `kernel`'s image with the runner image's workspace service beside it; a
/// session claims it, gets its bundle through that service, and the kernel
/// runs it as it would on a new pod.
async fn warm_pod_runs_a_session(kernel: Image, manifest: fn(&str) -> String) {
    engine(&[kernel, Image::Runner]);
    let session_image = kernel.reference();
    let pool = format!("{session_image}=1");
    let workspace_image = Image::Runner.reference();
    let runner = runner_on_containers(
        kernel,
        &[
            ("RUNNER_WARM_POOL", pool.as_str()),
            ("RUNNER_WORKSPACE_IMAGE", workspace_image.as_str()),
        ],
    )
    .await;
    let deadline = Instant::now() + KERNEL_WAIT;
    let ready_line = format!("telo_runner_warm_pods{{pool=\"{session_image}\",state=\"ready\"}} 1");
    loop {
        let (_, metrics) = runner.get("/metrics").await;
        let metrics = metrics.as_str().unwrap_or_default().to_owned();
        if metrics.contains(&ready_line) {
            break;
        }
        assert!(Instant::now() < deadline, "no warm pod ready:\n{metrics}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let mut body = run_body(manifest_bundle(&manifest("Hello from a warm pod")));
    body["config"] = json!({"image": session_image, "pullPolicy": "missing"});
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = tokio::time::timeout(KERNEL_WAIT, events.events_until_end())
        .await
        .expect("the session ends");
    assert!(
        frames.iter().any(|f| f.event.as_deref() == Some("progress")
            && f.json()["message"] == "Starting on a warm pod"),
        "{frames:?}"
    );
    let output = runner.full_output(&id).await;
    assert!(output.contains("Hello from a warm pod"), "{output}");
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 0}),
        "{output}"
    );
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_runs_a_session_in_hardened_containers() {
    warm_pod_runs_a_session(Image::FakeKernel, fake_manifest).await;
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_runs_the_real_kernel_in_hardened_containers() {
    warm_pod_runs_a_session(Image::Session, real_manifest).await;
}
