//! The kubelet simulator: real processes, pod status as a kubelet reports
//! it, init containers, image pulls, deadlines, deletion, logs, attach.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{Api, AttachParams, DeleteParams, ListParams, LogParams, PostParams, TerminalSize};
use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

async fn run_app(sim: &kube_sim::KubeSim, name: &str, script: &str, tty: bool) -> Api<Pod> {
    let cm: ConfigMap = serde_json::from_value(app_configmap(name, script)).unwrap();
    Api::<ConfigMap>::namespaced(sim.client(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod: Pod = serde_json::from_value(pod_with_app(name, name, tty)).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods
}

#[tokio::test]
async fn a_fake_telo_pod_runs_and_succeeds_with_kubelet_status() {
    let sim = sim().await;
    run_app(
        &sim,
        "ok",
        "  stdout: [\"hi\"]\n  exitAfterMs: 300\n",
        false,
    )
    .await;
    let running = sim
        .wait_for::<Pod>("default", "ok", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let st = running.status.unwrap();
    assert!(is_pod_ip(&sim, st.pod_ip.as_deref().unwrap()));
    assert!(st.start_time.is_some());
    let cs = &st.container_statuses.unwrap()[0];
    assert!(cs.state.as_ref().unwrap().running.is_some());
    assert!(cs.ready);
    let conds: Vec<(String, String)> = st
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    assert!(
        conds.contains(&("Ready".into(), "True".into())),
        "{conds:?}"
    );
    let done = sim
        .wait_for::<Pod>("default", "ok", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
    let term = done.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (0, Some("Completed"))
    );
}

#[tokio::test]
async fn a_nonzero_exit_fails_the_pod_with_a_terminated_state() {
    let sim = sim().await;
    run_app(&sim, "bad", "  exitCode: 3\n", false).await;
    let done = sim
        .wait_for::<Pod>("default", "bad", |p| phase(p) == "Failed", WAIT)
        .await
        .unwrap();
    let st = done.status.unwrap();
    let term = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((term.exit_code, term.reason.as_deref()), (3, Some("Error")));
    let ready = st
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason.as_deref(), Some("PodCompleted"));
}

fn bundle_tgz(entry: &str, manifest: &str) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_size(manifest.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, entry, manifest.as_bytes())
        .unwrap();
    let raw = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

/// Serves `body` at `/internal/bundles/x`; everything else is 404.
async fn bundle_server(body: Vec<u8>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/internal/bundles/x",
        axum::routing::get(move || {
            let body = body.clone();
            async move { body }
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), task)
}

fn session_pod(name: &str, bundle_url: &str, entry: &str) -> Pod {
    let script =
        format!("set -e; wget -qO /tmp/body.tgz \"{bundle_url}\"; tar xzf /tmp/body.tgz -C /app");
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "telo-k8s-runner", "telo.run/session-id": "abc"}},
        "spec": {
            "restartPolicy": "Never", "activeDeadlineSeconds": 3600, "automountServiceAccountToken": false,
            "initContainers": [{"name": "body-fetch", "image": "busybox:stable", "command": ["sh", "-c"], "args": [script],
                "volumeMounts": [{"name": "app", "mountPath": "/app"}, {"name": "tmp", "mountPath": "/tmp"}]}],
            "containers": [{"name": "session", "image": "telorun/node:24-slim", "workingDir": "/work",
                "command": ["telo", "run", format!("/app/{entry}")], "stdin": true, "tty": true,
                "env": [{"name": "FOO", "value": "bar"}],
                "volumeMounts": [{"name": "app", "mountPath": "/app"}, {"name": "work", "mountPath": "/work"},
                                 {"name": "tmp", "mountPath": "/tmp"}]}],
            "volumes": [{"name": "app", "emptyDir": {}}, {"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
        }
    })).unwrap()
}

#[tokio::test]
async fn the_init_container_fetches_and_unpacks_the_bundle_for_the_session() {
    let sim = sim().await;
    let manifest = "kind: Telo.Application\nmetadata: {name: demo}\nfakeTelo:\n  stdout: [\"from the bundle\"]\n  printEnv: [\"FOO\"]\n";
    let (url, server) = bundle_server(bundle_tgz("app/telo.yaml", manifest)).await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "telo-sessions");
    pods.create(
        &PostParams::default(),
        &session_pod(
            "telo-run-abc",
            &format!("{url}/internal/bundles/x"),
            "app/telo.yaml",
        ),
    )
    .await
    .unwrap();
    let done = sim
        .wait_for::<Pod>(
            "telo-sessions",
            "telo-run-abc",
            |p| phase(p) == "Succeeded",
            WAIT,
        )
        .await
        .unwrap();
    let st = done.status.unwrap();
    let init = &st.init_container_statuses.unwrap()[0];
    assert_eq!(
        init.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        0
    );
    let logs = pods
        .logs(
            "telo-run-abc",
            &LogParams {
                container: Some("session".into()),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert!(logs.contains("from the bundle"), "{logs:?}");
    assert!(logs.contains("FOO=bar"), "{logs:?}");
    server.abort();
}

#[tokio::test]
async fn a_failing_bundle_download_fails_the_init_container_like_busybox() {
    let sim = sim().await;
    let (url, server) = bundle_server(Vec::new()).await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "telo-sessions");
    pods.create(
        &PostParams::default(),
        &session_pod(
            "telo-run-gone",
            &format!("{url}/internal/bundles/missing"),
            "telo.yaml",
        ),
    )
    .await
    .unwrap();
    let done = sim
        .wait_for::<Pod>(
            "telo-sessions",
            "telo-run-gone",
            |p| phase(p) == "Failed",
            WAIT,
        )
        .await
        .unwrap();
    let st = done.status.unwrap();
    let init = st.init_container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((init.exit_code, init.reason.as_deref()), (1, Some("Error")));
    let main = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(main.reason.as_deref(), Some("PodInitializing"));
    let logs = pods
        .logs(
            "telo-run-gone",
            &LogParams {
                container: Some("body-fetch".into()),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        logs,
        "wget: server returned error: HTTP/1.1 404 Not Found\n"
    );
    server.abort();
}

#[tokio::test]
async fn an_unknown_image_fails_to_pull_like_a_real_registry() {
    let sim = sim().await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "nope"}, "spec": {"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "ghcr.io/acme/nope:1"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let waiting = |p: &Pod, reason: &str| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            == Some(reason)
    };
    let p = sim
        .wait_for::<Pod>("default", "nope", |p| waiting(p, "ErrImagePull"), WAIT)
        .await
        .unwrap();
    assert_eq!(phase(&p), "Pending");
    let msg = p.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert_eq!(
        msg,
        "rpc error: code = NotFound desc = failed to pull and unpack image \"ghcr.io/acme/nope:1\": failed to resolve reference \"ghcr.io/acme/nope:1\": ghcr.io/acme/nope:1: not found"
    );
    sim.wait_for::<Pod>("default", "nope", |p| waiting(p, "ImagePullBackOff"), WAIT)
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(sim.client(), "default");
    let list = events
        .list(&ListParams::default().fields("involvedObject.name=nope,reason=Failed"))
        .await
        .unwrap();
    let messages: Vec<String> = list.items.into_iter().filter_map(|e| e.message).collect();
    assert!(
        messages.contains(&"Error: ErrImagePull".to_string()),
        "{messages:?}"
    );
}

#[tokio::test]
async fn with_published_images_an_unpublished_tag_fails_to_pull_and_a_published_one_runs() {
    let sim = builder()
        .published_image("telorun/node:0.96.*")
        .start()
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    for (name, image) in [
        ("published", "telorun/node:0.96.0-slim"),
        ("unpublished", "telorun/node:0.99.0-slim"),
    ] {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": image,
            "command": ["sh", "-c", "exit 0"]}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let waiting_reason = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
    };
    let failed = sim
        .wait_for::<Pod>(
            "default",
            "unpublished",
            |p| waiting_reason(p).as_deref() == Some("ImagePullBackOff"),
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(phase(&failed), "Pending");
    let message = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert!(
        message.contains(
            "rpc error: code = NotFound desc = failed to pull and unpack image \"docker.io/telorun/node:0.99.0-slim\""
        ),
        "{message}"
    );
    let events: Api<Event> = Api::namespaced(sim.client(), "default");
    let list = events
        .list(&ListParams::default().fields("involvedObject.name=unpublished,reason=Failed"))
        .await
        .unwrap();
    let messages: Vec<String> = list.items.into_iter().filter_map(|e| e.message).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("Failed to pull image \"telorun/node:0.99.0-slim\"")),
        "{messages:?}"
    );
    sim.wait_for::<Pod>("default", "published", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_bad_published_image_glob_stops_the_start() {
    assert!(builder().published_image("[").start().await.is_err());
}

#[tokio::test]
async fn active_deadline_fails_the_pod_with_deadline_exceeded() {
    let sim = sim().await;
    let cm: ConfigMap = serde_json::from_value(app_configmap("slow", "  listen: [0]\n")).unwrap();
    Api::<ConfigMap>::namespaced(sim.client(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let mut pod = pod_with_app("slow", "slow", false);
    pod["spec"]["activeDeadlineSeconds"] = json!(1);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(1);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    Api::<Pod>::namespaced(sim.client(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let failed = sim
        .wait_for::<Pod>(
            "default",
            "slow",
            |p| {
                phase(p) == "Failed"
                    && p.status
                        .as_ref()
                        .and_then(|s| s.container_statuses.as_ref())
                        .is_some_and(|c| {
                            c[0].state.as_ref().is_some_and(|s| s.terminated.is_some())
                        })
            },
            WAIT,
        )
        .await
        .unwrap();
    let st = failed.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    let term = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(term.exit_code, 143, "killed by SIGTERM");
    assert_eq!(sim.stats().processes, 0);
}

#[tokio::test]
async fn deleting_a_pod_kills_its_process() {
    let sim = sim().await;
    let port = test_support::free_port();
    let pods = run_app(&sim, "srv", &format!("  listen: [{port}]\n"), false).await;
    let running = sim
        .wait_for::<Pod>("default", "srv", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let ip = running.status.unwrap().pod_ip.unwrap();
    let mut connected = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect((ip.as_str(), port))
            .await
            .is_ok()
        {
            connected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(connected, "fake-telo listens on the pod IP");
    assert_eq!(sim.stats().processes, 1);
    pods.delete("srv", &DeleteParams::default()).await.unwrap();
    sim.wait_for_deletion("pods", "default", "srv", WAIT)
        .await
        .unwrap();
    assert_eq!(sim.stats().processes, 0);
    assert!(
        tokio::net::TcpStream::connect((ip.as_str(), port))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn two_pods_may_listen_on_the_same_port() {
    let sim = sim().await;
    let port = test_support::free_port();
    let script = format!("  listen: [{port}]\n");
    run_app(&sim, "a", &script, false).await;
    let cm: ConfigMap = serde_json::from_value(app_configmap("b", &script)).unwrap();
    Api::<ConfigMap>::namespaced(sim.client(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(pod_with_app("b", "b", false)).unwrap();
    Api::<Pod>::namespaced(sim.client(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    for name in ["a", "b"] {
        let p = sim
            .wait_for::<Pod>("default", name, |p| phase(p) == "Running", WAIT)
            .await
            .unwrap();
        let ip = p.status.unwrap().pod_ip.unwrap();
        let mut body = String::new();
        for _ in 0..200 {
            if let Ok(mut s) = tokio::net::TcpStream::connect((ip.as_str(), port)).await {
                s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
                s.read_to_string(&mut body).await.unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(body.ends_with(&format!("ok {port}")), "{name}: {body:?}");
    }
}

#[tokio::test]
async fn attach_relays_stdin_and_stdout_with_kube_rs() {
    let sim = sim().await;
    let pods = run_app(&sim, "echo", "  echo: true\n", false).await;
    sim.wait_for::<Pod>("default", "echo", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let mut attached = pods
        .attach(
            "echo",
            &AttachParams::default()
                .container("session")
                .stdin(true)
                .stdout(true)
                .stderr(false),
        )
        .await
        .unwrap();
    let mut stdin = attached.stdin().unwrap();
    let mut stdout = attached.stdout().unwrap();
    stdin.write_all(b"ping\n").await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(WAIT, stdout.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..n], b"ping\n");
    stdin.write_all(b"exit\n").await.unwrap();
    let status = tokio::time::timeout(WAIT, attached.take_status().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    sim.wait_for::<Pod>("default", "echo", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_tty_attach_resizes_the_terminal() {
    let sim = sim().await;
    let pods = run_app(&sim, "tty", "  printSize: true\n  echo: true\n", true).await;
    sim.wait_for::<Pod>("default", "tty", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let mut attached = pods
        .attach("tty", &AttachParams::interactive_tty().container("session"))
        .await
        .unwrap();
    let mut resize = attached.terminal_size().unwrap();
    let mut stdout = attached.stdout().unwrap();
    resize
        .send(TerminalSize {
            width: 120,
            height: 40,
        })
        .await
        .unwrap();
    let mut seen = String::new();
    let mut buf = vec![0u8; 256];
    while !seen.contains("size 120x40") {
        let n = tokio::time::timeout(WAIT, stdout.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "stream ended: {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // A PTY turns "\n" into "\r\n", and the log keeps the raw bytes.
    let logs = pods.logs("tty", &LogParams::default()).await.unwrap();
    assert!(logs.contains("size 120x40\r\n"), "{logs:?}");
}

#[tokio::test]
async fn logs_follow_until_the_container_exits() {
    let sim = sim().await;
    let pods = run_app(&sim, "lines", "  lineEveryMs: 50\n  lines: 5\n", false).await;
    sim.wait_for::<Pod>("default", "lines", |p| phase(p) != "Pending", WAIT)
        .await
        .unwrap();
    let mut stream = pods
        .log_stream(
            "lines",
            &LogParams {
                follow: true,
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    let mut all = Vec::new();
    let mut buf = vec![0u8; 1024];
    loop {
        let n = tokio::time::timeout(
            WAIT,
            futures_util::AsyncReadExt::read(&mut stream, &mut buf),
        )
        .await
        .unwrap()
        .unwrap();
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(all).unwrap();
    assert_eq!(
        text.lines().filter(|l| l.starts_with("line ")).count(),
        5,
        "{text}"
    );
}

#[tokio::test]
async fn logs_of_a_container_that_has_not_started_are_a_400() {
    let sim = sim().await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "w"}, "spec": {"containers": [{"name": "c", "image": "nope:1"}]}})).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    sim.wait_for::<Pod>(
        "default",
        "w",
        |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some()
        },
        WAIT,
    )
    .await
    .unwrap();
    let kube::Error::Api(status) = pods.logs("w", &LogParams::default()).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(status.code, 400);
    assert!(
        status
            .message
            .starts_with("container \"c\" in pod \"w\" is waiting to start:"),
        "{}",
        status.message
    );
}

/// Whether `ip:port` answers as a fake-telo `listen` port does (`ok
/// <port>`) within `within`. A connection alone proves nothing: once the
/// pods' bridge is gone, a pod IP routes to the host's default gateway,
/// and on some networks that accepts any TCP connection.
async fn answers_as_the_app(ip: &str, port: u16, within: Duration) -> bool {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(String::from_utf8_lossy(&answer).ends_with(&format!("ok {port}")))
    };
    matches!(tokio::time::timeout(within, exchange).await, Ok(Some(true)))
}

#[tokio::test]
async fn dropping_the_simulator_kills_every_process() {
    let sim = sim().await;
    let port = test_support::free_port();
    run_app(&sim, "held", &format!("  listen: [{port}]\n"), false).await;
    let p = sim
        .wait_for::<Pod>("default", "held", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let ip = p.status.unwrap().pod_ip.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !answers_as_the_app(&ip, port, WAIT).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the app never answered"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    drop(sim);
    // Bounded by time, not by attempts: on a loaded machine the kill may
    // take longer than a fixed number of refused connections. A live
    // process on the bridge answers at once, so an answer missing for a
    // second is down too (the pod's veth may be gone before the bridge,
    // leaving a connection neither answered nor refused).
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut down = false;
    while tokio::time::Instant::now() < deadline {
        if !answers_as_the_app(&ip, port, Duration::from_secs(1)).await {
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(down, "the process outlived the simulator");
    let _ = futures_util::stream::empty::<()>().next().await;
}

#[tokio::test]
async fn attach_speaks_the_v4_channel_protocol() {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let sim = sim().await;
    run_app(
        &sim,
        "v4",
        "  echo: true\n  stderr: [\"err line\"]\n",
        false,
    )
    .await;
    sim.wait_for::<Pod>("default", "v4", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let url = format!(
        "wss://{}/api/v1/namespaces/default/pods/v4/attach?container=session&stdin=true&stdout=true&stderr=true",
        sim.addr()
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", sim.authorization().parse().unwrap());
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, resp) = tokio_tungstenite::client_async(req, sim.connect_tls().await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "v4.channel.k8s.io"
    );
    let first = ws.next().await.unwrap().unwrap();
    assert_eq!(first, Message::binary(vec![1u8]), "the announcing frame");
    ws.send(Message::binary(b"\x00hello\n".to_vec()))
        .await
        .unwrap();
    // The start-up stderr line may arrive live (channel 2) if the attach beat
    // the process's first write; stdout and stderr are separate pipes with no
    // order between them.
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if frame == Message::binary(b"\x01hello\n".to_vec()) {
            break;
        }
        assert_eq!(
            frame,
            Message::binary(b"\x02err line\n".to_vec()),
            "only the stderr line may come first"
        );
    }
    ws.send(Message::binary(b"\x00exit\n".to_vec()))
        .await
        .unwrap();
    let mut status = None;
    while let Some(Ok(msg)) = tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
        if let Message::Binary(b) = &msg
            && b.first() == Some(&3)
        {
            status = Some(serde_json::from_slice::<serde_json::Value>(&b[1..]).unwrap());
        }
    }
    assert_eq!(status.unwrap()["status"], "Success");
}

#[tokio::test]
async fn attach_to_a_missing_container_is_a_400() {
    let sim = sim().await;
    run_app(&sim, "one", "  echo: true\n", false).await;
    let (code, body) = get(
        &sim,
        "/api/v1/namespaces/default/pods/one/attach?container=nope&stdout=true",
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(body["message"], "container nope is not valid for pod one");
}

/// The frames of a raw attach to pod `name` with `query` that sends `sent`
/// (`(channel, payload)`), until the server closes: `(channel, payload)`,
/// the announcing frame included.
async fn raw_attach(
    sim: &kube_sim::KubeSim,
    name: &str,
    query: &str,
    sent: &[(u8, &[u8])],
) -> Vec<(u8, Vec<u8>)> {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!(
        "wss://{}/api/v1/namespaces/default/pods/{name}/attach?container=session&{query}",
        sim.addr()
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", sim.authorization().parse().unwrap());
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::client_async(req, sim.connect_tls().await.unwrap())
        .await
        .unwrap();
    for (channel, payload) in sent {
        let mut frame = vec![*channel];
        frame.extend_from_slice(payload);
        ws.send(Message::binary(frame)).await.unwrap();
    }
    let mut frames = Vec::new();
    while let Some(Ok(msg)) = tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
        if let Message::Binary(b) = msg
            && let Some((&channel, payload)) = b.split_first()
        {
            frames.push((channel, payload.to_vec()));
        }
    }
    frames
}

#[tokio::test]
async fn stderr_apart_from_a_tty_container_is_refused_after_the_upgrade() {
    let sim = sim().await;
    run_app(&sim, "tty", "  echo: true\n", true).await;
    sim.wait_for::<Pod>("default", "tty", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let frames = raw_attach(
        &sim,
        "tty",
        "stdin=true&stdout=true&stderr=true&tty=false",
        &[],
    )
    .await;
    let (channel, status) = frames.last().expect("a final status");
    assert_eq!(*channel, 3);
    let status: serde_json::Value = serde_json::from_slice(status).unwrap();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["code"], 500);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .ends_with("tty and stderr cannot both be true"),
        "{status}"
    );
    assert!(frames.iter().all(|(channel, _)| *channel != 2));
}

#[tokio::test]
async fn a_tty_asked_of_a_container_without_one_attaches_stdout_only() {
    let sim = sim().await;
    run_app(&sim, "piped", "  echo: true\n", false).await;
    sim.wait_for::<Pod>("default", "piped", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    // Stdin echoed, then "exit" ends the container: the attach shows the
    // echo on stdout (no PTY: no "\r\n") and ends with success.
    let frames = raw_attach(
        &sim,
        "piped",
        "stdin=true&stdout=true&stderr=true&tty=true",
        &[
            (4, &br#"{"Width":100,"Height":30}"#[..]),
            (0, &b"ping\n"[..]),
            (0, &b"exit\n"[..]),
        ],
    )
    .await;
    let stdout: Vec<u8> = frames
        .iter()
        .filter(|(channel, _)| *channel == 1)
        .flat_map(|(_, payload)| payload.clone())
        .collect();
    assert!(
        String::from_utf8_lossy(&stdout).contains("ping\n"),
        "{frames:?}"
    );
    assert!(
        frames.iter().all(|(channel, _)| *channel != 2),
        "{frames:?}"
    );
    let (channel, status) = frames.last().unwrap();
    assert_eq!(*channel, 3);
    assert!(String::from_utf8_lossy(status).contains("Success"));
}

/// A deadline set on a pod that already runs (a warm pod claimed for a
/// session) ends it once the pod has been active that long, as the kubelet
/// re-reads `activeDeadlineSeconds` on every update.
#[tokio::test]
async fn a_deadline_set_while_the_pod_runs_ends_it_counted_from_its_start() {
    let sim = sim().await;
    let cm: ConfigMap = serde_json::from_value(app_configmap("late", "  listen: [0]\n")).unwrap();
    Api::<ConfigMap>::namespaced(sim.client(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let mut pod = pod_with_app("late", "late", false);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(1);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    sim.wait_for::<Pod>("default", "late", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    pods.patch(
        "late",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 1}})),
    )
    .await
    .unwrap();
    let failed = sim
        .wait_for::<Pod>("default", "late", |p| phase(p) == "Failed", WAIT)
        .await
        .unwrap();
    assert_eq!(
        failed.status.unwrap().reason.as_deref(),
        Some("DeadlineExceeded")
    );
    // Raising a deadline is refused, as the apiserver refuses it.
    let raised = pods
        .patch(
            "late",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 5}})),
        )
        .await
        .unwrap_err();
    assert!(
        raised
            .to_string()
            .contains("must be less than or equal to previous value"),
        "{raised}"
    );
}

/// With a latency profile the binding, the sandbox and each container's
/// start take their time, so a start is as slow as a cluster's.
#[tokio::test]
async fn a_latency_profile_delays_binding_sandbox_and_container_start() {
    let latency = kube_sim::Latency {
        schedule: Duration::from_millis(150),
        sandbox: Duration::from_millis(200),
        container_start: Duration::from_millis(100),
    };
    let sim = builder().latency(latency).start().await.unwrap();
    run_app(&sim, "slowstart", "  listen: [0]\n", false).await;
    sim.wait_for::<Pod>("default", "slowstart", |p| phase(p) == "Running", WAIT)
        .await
        .unwrap();
    let timeline = sim
        .pod_timeline()
        .into_iter()
        .find(|t| t.name == "slowstart")
        .unwrap();
    let created = timeline.created_us.unwrap();
    let scheduled = timeline.scheduled_us.unwrap();
    let running = timeline.running_us.unwrap();
    assert!(scheduled - created >= 150_000, "{timeline:?}");
    assert!(running - scheduled >= 300_000, "{timeline:?}");
}

/// Containers of one pod that start at the same moment each have their
/// start reported: the pod's status is written in the order its changes
/// were made, so no container's `running` state is overwritten by an older
/// picture of the pod (which left a pod `ContainersNotReady` for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_container_of_pods_started_at_once_is_reported_running() {
    let sim = sim().await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let names: Vec<String> = (0..60).map(|i| format!("many-{i}")).collect();
    for name in &names {
        let containers: Vec<serde_json::Value> = (0..4)
            .map(|c| {
                json!({"name": format!("c{c}"), "image": "telorun/node:24",
                    "command": ["sh", "-c", "exec sleep 600"]})
            })
            .collect();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": containers}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for name in &names {
        let all_running = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|statuses| {
                    statuses.len() == 4
                        && statuses
                            .iter()
                            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                })
        };
        let waited = sim
            .wait_for::<Pod>("default", name, all_running, WAIT)
            .await;
        assert!(
            waited.is_ok(),
            "{name}: {:?}",
            pods.get(name).await.unwrap().status
        );
    }
}
