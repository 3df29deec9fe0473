//! Sessions survive a runner restart: a runner process killed mid-session is
//! replaced by a new one that adopts the live pods with their output.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube_sim::KubeSim;
use serde_json::json;
use telo_runner::server::RunningService;
use test_support::fake_telo::fake_telo_path;
use test_support::sse::SseStream;
use test_support::ws::{self, IoFrame};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_telo-runner");

/// A port free on `host` now.
fn free_port_on(host: std::net::IpAddr) -> u16 {
    std::net::TcpListener::bind((host, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A runner process against `sim`, on its own port.
async fn spawn_runner(
    kubeconfig: &std::path::Path,
    extra: &[(&str, &str)],
) -> (ChildGuard, String) {
    // Pods reach the runner at the node's address.
    let host = common::node_address(kubeconfig).await;
    let port = free_port_on(host);
    let base = format!("http://{host}:{port}");
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", &format!("{host}:{port}")])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUNNER_BACKEND", "kubernetes")
        .env("KUBECONFIG", kubeconfig)
        .env("RUNNER_SELF_URL", &base)
        .env("RUNNER_BASE_IMAGE_CATALOG_ENABLED", "false")
        .env("RUNNER_IMAGE", "telorun/node:0-slim")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (key, value) in extra {
        command.env(key, value);
    }
    let mut child = ChildGuard(command.spawn().unwrap());
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    wait_ready(&base).await;
    (child, base)
}

/// Poll `/readyz` until the runner has adopted what it found.
async fn wait_ready(base: &str) {
    let client = runner_core::http_client::client();
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let ready = client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "runner never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn in_process_runner(kubeconfig: &std::path::Path, extra: &[(&str, &str)]) -> RunningService {
    let host = common::node_address(kubeconfig).await;
    let listener = tokio::net::TcpListener::bind((host, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert("RUNNER_BACKEND".into(), "kubernetes".into());
    env.insert(
        "KUBECONFIG".into(),
        kubeconfig.to_string_lossy().into_owned(),
    );
    env.insert("RUNNER_SELF_URL".into(), format!("http://{addr}"));
    env.insert("RUNNER_BASE_IMAGE_CATALOG_ENABLED".into(), "false".into());
    for (key, value) in extra {
        env.insert((*key).into(), (*value).into());
    }
    let service = RunningService::start_on(&env, listener).await.unwrap();
    tokio::time::timeout(test_support::WAIT, service.recovered())
        .await
        .expect("adoption finishes");
    service
}

async fn sim_with_kubeconfig() -> (KubeSim, tempfile::TempDir, std::path::PathBuf) {
    let sim = KubeSim::builder()
        .namespace("telo-sessions")
        .fake_telo(fake_telo_path())
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    (sim, dir, kubeconfig)
}

async fn create(base: &str, fake_telo: serde_json::Value) -> String {
    let created: serde_json::Value = runner_core::http_client::client()
        .post(format!("{base}/v1/sessions"))
        .json(&test_support::bundle::start_body(fake_telo))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["sessionId"].as_str().unwrap().to_owned()
}

fn kill(child: &ChildGuard) {
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
}

#[tokio::test]
async fn a_killed_runner_is_replaced_without_losing_the_session_or_its_output() {
    let (sim, _dir, kubeconfig) = sim_with_kubeconfig().await;
    let (mut first, base) = spawn_runner(&kubeconfig, &[]).await;
    let id = create(
        &base,
        json!({"stdout": ["before the restart"], "echo": true, "exitCode": 7}),
    )
    .await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    let frames = ws::read_until_output(&mut socket, "before the restart").await;
    let old_seq = ws::last_seq(&frames).unwrap();
    ws::send_stdin(&mut socket, b"typed before\n").await;
    ws::read_until_output(&mut socket, "typed before").await;

    kill(&first);
    let _ = first.0.wait();

    let second = in_process_runner(&kubeconfig, &[]).await;
    let base = second.base_url();
    let ws_base = base.replacen("http", "ws", 1);

    // The session is back, running, with everything it printed.
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let mut fresh = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
    ws::read_until_output(&mut fresh, "typed before").await;

    // A client resuming from before the restart is told it may have missed
    // something, and gets the history again.
    let mut resumed = ws::connect(
        &format!("{ws_base}/v1/sessions/{id}/io?lastSeq={old_seq}"),
        None,
    )
    .await;
    assert_eq!(
        ws::next_frame(&mut resumed).await.unwrap(),
        IoFrame::Text(json!({"type": "seq", "seq": old_seq, "app": "app", "io": "tty"}))
    );
    assert_eq!(
        ws::next_frame(&mut resumed).await.unwrap(),
        IoFrame::Text(json!({"type": "gap", "reason": "buffer_evicted"}))
    );
    ws::read_until_output(&mut resumed, "before the restart").await;

    // Still interactive, and it ends normally.
    ws::send_stdin(&mut fresh, b"typed after\n").await;
    ws::read_until_output(&mut fresh, "typed after").await;
    ws::send_stdin(&mut fresh, b"exit\n").await;
    let rest = events.events_until_end().await;
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 7})
    );

    second.stop().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn finished_pods_are_cleaned_and_the_reap_policy_deletes_live_ones() {
    let (sim, _dir, kubeconfig) = sim_with_kubeconfig().await;
    let (first, base) = spawn_runner(&kubeconfig, &[]).await;
    let live = create(&base, json!({"echo": true})).await;
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{live}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    kill(&first);
    drop(first);

    let second = in_process_runner(&kubeconfig, &[("RUNNER_ORPHAN_POLICY", "reap")]).await;
    sim.wait_for_deletion(
        "pods",
        "telo-sessions",
        &format!("telo-run-{live}"),
        Duration::from_secs(15),
    )
    .await
    .expect("reaped");
    let response = runner_core::http_client::client()
        .get(format!("{}/v1/sessions/{live}", second.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::NOT_FOUND);
    assert!(
        sim.get::<Pod>("telo-sessions", &format!("telo-run-{live}"))
            .is_none()
    );
    second.stop().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn two_restarts_in_a_row_keep_the_session() {
    let (sim, _dir, kubeconfig) = sim_with_kubeconfig().await;
    let (first, base) = spawn_runner(&kubeconfig, &[]).await;
    let id = create(&base, json!({"stdout": ["generation zero"], "echo": true})).await;
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    kill(&first);
    drop(first);
    // Killed again right after it adopted the session.
    let (second, base) = spawn_runner(&kubeconfig, &[]).await;
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    kill(&second);
    drop(second);

    let third = in_process_runner(&kubeconfig, &[]).await;
    let base = third.base_url();
    let mut socket = ws::connect(
        &format!(
            "{}/v1/sessions/{id}/io?lastSeq=0",
            base.replacen("http", "ws", 1)
        ),
        None,
    )
    .await;
    let frames = ws::read_until_output(&mut socket, "generation zero").await;
    // Third generation: sequence numbers continue past both earlier ones.
    let first_seq = frames
        .iter()
        .find_map(|f| match f {
            IoFrame::Output { seq, .. } => Some(*seq),
            _ => None,
        })
        .unwrap();
    assert!(first_seq > 2 * (1 << 24), "{first_seq}");
    let pod: Pod = sim.get("telo-sessions", &format!("telo-run-{id}")).unwrap();
    assert_eq!(
        pod.metadata.annotations.unwrap()["telo.run/generation"],
        "2"
    );
    third.stop().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_failing_adoption_patch_never_deletes_the_live_session() {
    let (sim, _dir, kubeconfig) = sim_with_kubeconfig().await;
    let (first, base) = spawn_runner(&kubeconfig, &[]).await;
    let id = create(&base, json!({"stdout": ["still here"], "echo": true})).await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    ws::read_until_output(&mut socket, "still here").await;
    kill(&first);
    drop(first);

    // One transient failure, then a lasting refusal of the adoption's patch:
    // neither is a reason to delete a pod whose session is alive.
    for count in [1, 100] {
        sim.faults().apply(kube_sim::FaultCommand::FailNext(
            kube_sim::faults::FailRule {
                verb: Some("patch".to_owned()),
                resource: Some("pods".to_owned()),
                count,
                code: 500,
                message: None,
            },
        ));
        let (runner, base) = spawn_runner(&kubeconfig, &[]).await;
        let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
        events
            .events_until(|f| f.status_kind().as_deref() == Some("running"))
            .await;
        let ws_base = base.replacen("http", "ws", 1);
        let mut fresh =
            ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
        ws::read_until_output(&mut fresh, "still here").await;
        let left: u32 = sim
            .faults()
            .state()
            .fail
            .iter()
            .map(|rule| rule.count)
            .sum();
        assert!(left < count, "the adoption's patch was refused");
        sim.faults().clear();
        // Killed, so the next runner adopts the session again.
        kill(&runner);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn an_adopted_session_whose_log_cannot_be_read_tells_clients_of_a_gap() {
    let (sim, _dir, kubeconfig) = sim_with_kubeconfig().await;
    let (first, base) = spawn_runner(&kubeconfig, &[]).await;
    let id = create(&base, json!({"stdout": ["before"], "echo": true})).await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    ws::read_until_output(&mut socket, "before").await;
    kill(&first);
    drop(first);

    sim.faults().apply(kube_sim::FaultCommand::FailNext(
        kube_sim::faults::FailRule {
            verb: Some("get".to_owned()),
            resource: Some("pods/log".to_owned()),
            count: 1_000,
            code: 500,
            message: None,
        },
    ));
    let (_second, base) = spawn_runner(&kubeconfig, &[]).await;
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut fresh = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
    let mut told_of_gap = false;
    while let Some(frame) = ws::next_frame(&mut fresh).await {
        if frame == IoFrame::Text(json!({"type": "gap", "reason": "buffer_evicted"})) {
            told_of_gap = true;
            break;
        }
    }
    assert!(told_of_gap, "a client is told the history is missing");
    sim.faults().clear();
    // Still live.
    ws::send_stdin(&mut fresh, b"after\n").await;
    ws::read_until_output(&mut fresh, "after").await;
    sim.shutdown().await;
}

fn terminate(child: &ChildGuard) {
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

/// Waits (off the runtime) for the runner process to exit; panics past the
/// bound.
async fn wait_exit(mut child: ChildGuard) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + test_support::WAIT;
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the runner did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
}

/// A graceful restart (SIGTERM, as on every `helm upgrade`) with the adopt
/// policy leaves live pods to the next runner: clients are told the runner
/// is going away (WebSocket close 1001, the event stream ends without a
/// terminal status), so they reconnect, and the successor serves the same
/// session with its output.
#[tokio::test]
async fn a_graceful_restart_leaves_live_sessions_to_the_successor() {
    let (sim, _dir, kubeconfig) = sim_with_kubeconfig().await;
    let (first, base) = spawn_runner(&kubeconfig, &[]).await;
    let id = create(
        &base,
        json!({"stdout": ["before the restart"], "echo": true, "exitCode": 4}),
    )
    .await;
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    ws::read_until_output(&mut socket, "before the restart").await;

    terminate(&first);
    let frames = ws::read_until_close(&mut socket).await;
    assert_eq!(
        frames.last(),
        Some(&IoFrame::Close {
            code: 1001,
            reason: "going away".into()
        })
    );
    let rest = events.events_until_end().await;
    assert!(
        rest.iter().all(|f| f.status_kind().is_none()),
        "a status after SIGTERM: {:?}",
        rest.iter().map(|f| f.json()).collect::<Vec<_>>()
    );
    assert!(wait_exit(first).await.success());
    let pod: Pod = sim.get("telo-sessions", &format!("telo-run-{id}")).unwrap();
    assert!(
        pod.metadata.deletion_timestamp.is_none(),
        "the pod is being deleted"
    );

    let second = in_process_runner(&kubeconfig, &[]).await;
    let base = second.base_url();
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut fresh = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
    ws::read_until_output(&mut fresh, "before the restart").await;
    ws::send_stdin(&mut fresh, b"exit\n").await;
    let rest = events.events_until_end().await;
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 4})
    );
    second.stop().await.unwrap();
    sim.shutdown().await;
}

/// A session that finished while no runner was up is adopted as finished:
/// its exit code and its output, and its pod is cleaned up.
#[tokio::test]
async fn a_session_that_finished_between_runners_is_adopted_with_its_exit_and_log() {
    let (sim, _dir, kubeconfig) = sim_with_kubeconfig().await;
    let (first, base) = spawn_runner(&kubeconfig, &[]).await;
    let id = create(
        &base,
        // Long enough for the runner to be gone first, even on a loaded host;
        // the first runner, once going away, records nothing either way.
        json!({"stdout": ["the last words"], "exitAfterMs": 4000, "exitCode": 3}),
    )
    .await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    ws::read_until_output(&mut socket, "the last words").await;
    terminate(&first);
    ws::read_until_close(&mut socket).await;
    assert!(wait_exit(first).await.success());

    // With no runner up, the workload exits.
    let name = format!("telo-run-{id}");
    sim.wait_for::<Pod>(
        "telo-sessions",
        &name,
        |pod| {
            pod.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|phase| phase == "Failed")
        },
        test_support::WAIT,
    )
    .await
    .unwrap();

    let second = in_process_runner(&kubeconfig, &[]).await;
    let base = second.base_url();
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 3})
    );
    let ws_base = base.replacen("http", "ws", 1);
    let mut replay = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
    let output = ws::output_of(&ws::read_until_close(&mut replay).await);
    assert!(
        String::from_utf8_lossy(&output).contains("the last words"),
        "{}",
        String::from_utf8_lossy(&output)
    );
    sim.wait_for_deletion("pods", "telo-sessions", &name, test_support::WAIT)
        .await
        .expect("the finished pod is cleaned up");
    second.stop().await.unwrap();
    sim.shutdown().await;
}

/// Ownership is recorded on the session's pod: after a restart, the owner
/// still sees its session and another principal does not.
#[tokio::test]
async fn an_adopted_session_still_belongs_to_its_principal() {
    let (sim, dir, kubeconfig) = sim_with_kubeconfig().await;
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "alice-token name=alice tenant=acme\nbob-token name=bob\n",
    )
    .unwrap();
    let vars = [("RUNNER_AUTH_TOKENS_FILE", tokens.to_str().unwrap())];
    let client = runner_core::http_client::client();
    let first = in_process_runner(&kubeconfig, &vars).await;
    let base = first.base_url();
    let mut ids = Vec::new();
    for line in ["one", "two"] {
        let body = test_support::bundle::start_body(json!({"stdout": [line], "echo": true}));
        let created: serde_json::Value = client
            .post(format!("{base}/v1/sessions"))
            .bearer_auth("alice-token")
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(created["sessionId"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let mut events = SseStream::connect(
            &format!("{base}/v1/sessions/{id}/events"),
            &[("authorization", "Bearer alice-token")],
        )
        .await;
        events
            .events_until(|f| f.status_kind().as_deref() == Some("running"))
            .await;
    }
    // A warm pod keeps its own name: the session's pod is found by label.
    let pods = kube::Api::<Pod>::namespaced(sim.client(), "telo-sessions")
        .list(&kube::api::ListParams::default().labels(&format!("telo.run/session-id={}", ids[0])))
        .await
        .unwrap();
    let pod = pods.items.into_iter().next().unwrap();
    assert_eq!(
        pod.metadata.annotations.unwrap()["telo.run/owner"],
        r#"{"subject":"token:alice","tenant":"acme"}"#
    );
    first.stop().await.unwrap();

    let second = in_process_runner(&kubeconfig, &vars).await;
    let base = second.base_url();
    for id in &ids {
        let status = |token: &'static str| {
            let request = client
                .get(format!("{base}/v1/sessions/{id}"))
                .bearer_auth(token);
            async move { request.send().await.unwrap().status() }
        };
        assert_eq!(status("alice-token").await, reqwest::StatusCode::OK, "{id}");
        assert_eq!(
            status("bob-token").await,
            reqwest::StatusCode::NOT_FOUND,
            "{id}"
        );
    }
    second.stop().await.unwrap();
    sim.shutdown().await;
}
