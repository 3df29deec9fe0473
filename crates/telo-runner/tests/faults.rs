//! Apiserver faults on the Kubernetes backend, end to end against kube-sim:
//! dropped watches, an apiserver restart, 500s on create/delete/attach, slow
//! requests and an outage. The runner must keep every status transition, tell
//! the client only client-safe text, leave no pod behind and recover without
//! a restart. And the runner's own fault: killed while a session starts.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Backend, Runner, RunnerProcess};
use k8s_openapi::api::core::v1::Pod;
use kube_sim::faults::FailRule;
use kube_sim::{FaultCommand, KubeSim};
use reqwest::StatusCode;
use serde_json::{Value, json};
use telo_runner::server::RunningService;
use test_support::sse::SseStream;
use test_support::ws;

/// What an injected apiserver failure says: everything a client must never
/// see (the apiserver's Status message, the runner's ServiceAccount, an audit
/// id).
const LEAKY_MESSAGE: &str = "kube-sim injected: User \"system:serviceaccount:telo-runner:telo-k8s-runner\" audit-id 5f1c0de1";

fn fail(verb: Option<&str>, resource: &str, count: u32, code: u16) -> FaultCommand {
    FaultCommand::FailNext(FailRule {
        verb: verb.map(str::to_owned),
        resource: Some(resource.to_owned()),
        count,
        code,
        message: Some(LEAKY_MESSAGE.to_owned()),
    })
}

/// Fails when `text` carries anything of the apiserver's own words.
fn assert_client_safe(text: &str) {
    for needle in [
        "kube-sim",
        "injected",
        "system:serviceaccount",
        "audit",
        "5f1c0de1",
    ] {
        assert!(!text.contains(needle), "{needle:?} leaked into {text:?}");
    }
}

/// Every event of the session from the start until its end (it must end).
async fn all_events(runner: &Runner, id: &str) -> Vec<test_support::sse::SseFrame> {
    let mut events = runner.events(id, &[]).await;
    events.events_until_end().await
}

/// The session's status history, and everything the client was told.
async fn history(runner: &Runner, id: &str) -> (Vec<Value>, String) {
    let frames = all_events(runner, id).await;
    let statuses = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("status"))
        .map(|f| f.json()["status"].clone())
        .collect();
    let told = frames
        .iter()
        .filter_map(|f| f.data.clone())
        .collect::<Vec<_>>()
        .join("\n");
    (statuses, told)
}

fn kinds(statuses: &[Value]) -> Vec<&str> {
    statuses
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect()
}

async fn running(runner: &Runner, id: &str) {
    let mut events = runner.events(id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
}

/// Waits (bounded) until kube-sim holds no pod and runs no process.
async fn no_pod_left(sim: &KubeSim) {
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let stats = sim.stats();
        if stats.pods == 0 && stats.processes == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pods left behind: {} pods, {} processes",
            stats.pods,
            stats.processes
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `/readyz` (no event exists for it) until it answers `want`.
async fn readyz_becomes(runner: &Runner, want: StatusCode) -> Value {
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let (status, body) = runner.get("/readyz").await;
        if status == want {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz never answered {want}; last {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn watches_dropped_over_and_over_lose_no_transition() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let scenario = async {
        let timed = runner
            .create(json!({"stdout": ["a"], "exitAfterMs": 300, "exitCode": 3}))
            .await;
        let batch = runner.create(json!({"stdout": ["b"], "exitCode": 5})).await;
        let stopped = runner.create(json!({"stdout": ["c"], "echo": true})).await;
        let typed = runner
            .create(json!({"stdout": ["d"], "echo": true, "exitCode": 9}))
            .await;
        running(&runner, &stopped).await;
        let (status, _) = runner.delete(&format!("/v1/sessions/{stopped}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let mut socket = runner.io(&typed, "").await;
        ws::read_until_output(&mut socket, "d").await;
        ws::send_stdin(&mut socket, b"exit\n").await;
        let mut outcomes = Vec::new();
        for id in [&timed, &batch, &stopped, &typed] {
            let (statuses, _) = history(&runner, id).await;
            outcomes.push(statuses);
        }
        outcomes
    };
    // Every watch is cut every 20 ms for as long as the sessions live.
    let outcomes = tokio::select! {
        outcomes = scenario => outcomes,
        () = async {
            loop {
                sim.faults().drop_watches();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } => unreachable!(),
    };
    assert!(sim.faults().state().watch_drops > 3);
    let expected = [
        json!({"kind": "exited", "code": 3}),
        json!({"kind": "exited", "code": 5}),
        json!({"kind": "stopped"}),
        json!({"kind": "exited", "code": 9}),
    ];
    for (statuses, end) in outcomes.iter().zip(expected) {
        assert_eq!(
            kinds(statuses),
            ["starting", "running", end["kind"].as_str().unwrap()],
            "{statuses:?}"
        );
        assert_eq!(statuses.last().unwrap(), &end);
    }
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn an_apiserver_restart_mid_session_loses_neither_output_nor_input() {
    let runner = Runner::start_kube(
        common::cluster().pull_delay(Duration::from_millis(300)),
        &[],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    // Prints `line <i> <millis>` every 40 ms, 50 times, and echoes stdin.
    let id = runner
        .create(json!({"echo": true, "lineEveryMs": 40, "lines": 50, "exitCode": 2}))
        .await;
    // Once while the pod is still being pulled…
    sim.faults().restart();
    let mut socket = runner.io(&id, "").await;
    ws::read_until_output(&mut socket, "line 5 ").await;
    // …and once while it prints, with a client attached: the lines written
    // while the terminal was re-attached come from the log.
    sim.faults().restart();
    ws::read_until_output(&mut socket, "line 50 ").await;
    assert_eq!(sim.faults().state().restarts, 2);
    ws::send_stdin(&mut socket, b"typed after the restart\n").await;
    ws::read_until_output(&mut socket, "typed after the restart").await;
    ws::send_stdin(&mut socket, b"exit\n").await;
    let (statuses, _) = history(&runner, &id).await;
    assert_eq!(kinds(&statuses), ["starting", "running", "exited"]);
    assert_eq!(statuses[2], json!({"kind": "exited", "code": 2}));
    let output = runner.full_output(&id).await;
    for line in 1..=50 {
        assert_eq!(
            output.matches(&format!("line {line} ")).count(),
            1,
            "line {line} exactly once: {output:?}"
        );
    }
    assert_eq!(
        output.matches("typed after the restart").count(),
        2,
        "the terminal's echo and the workload's, once each: {output:?}"
    );
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn a_500_on_pod_create_fails_the_start_safely_and_leaves_no_pod() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    sim.faults().apply(fail(Some("create"), "pods", 1, 500));
    let id = runner.create(json!({"exitCode": 0})).await;
    let (statuses, told) = history(&runner, &id).await;
    assert_eq!(kinds(&statuses), ["starting", "failed"]);
    assert_eq!(
        statuses[1]["message"],
        json!(
            "create: could not create the session pod: the Kubernetes API rejected the request (InternalError, HTTP 500)"
        )
    );
    assert_client_safe(&told);
    let (_, listed) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_client_safe(&listed.to_string());
    assert_eq!(sim.stats().pods, 0, "nothing was created");
    // The next start is not affected.
    let next = runner.create(json!({"exitCode": 0})).await;
    assert_eq!(
        runner.wait_terminal(&next).await,
        json!({"kind": "exited", "code": 0})
    );
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn a_500_on_delete_during_stop_is_retried_and_the_pod_goes() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create(json!({"echo": true})).await;
    running(&runner, &id).await;
    sim.faults().apply(fail(Some("delete"), "pods", 1, 500));
    let (status, body) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(runner.wait_terminal(&id).await, json!({"kind": "stopped"}));
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn a_delete_refused_for_good_is_reported_honestly_and_a_retry_cleans_up() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create(json!({"echo": true})).await;
    running(&runner, &id).await;
    sim.faults().apply(fail(Some("delete"), "pods", 1000, 500));
    let (status, body) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"], json!("stop_failed"));
    assert_eq!(
        body["message"],
        json!(
            "could not delete the session pod: the Kubernetes API rejected the request (InternalError, HTTP 500)"
        )
    );
    assert_client_safe(&body.to_string());
    // Honest: the session still runs, and says so.
    let (_, session) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(session["status"]["kind"], json!("running"), "{session}");
    assert_eq!(sim.stats().pods, 1);
    // Once the apiserver accepts deletes again, the client's retry works.
    sim.faults().clear();
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(runner.wait_terminal(&id).await, json!({"kind": "stopped"}));
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn a_500_on_deleting_a_finished_pod_does_not_leak_it() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    sim.faults().apply(fail(Some("delete"), "pods", 2, 500));
    let id = runner
        .create(json!({"stdout": ["done"], "exitCode": 0}))
        .await;
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 0})
    );
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn a_500_on_attach_keeps_the_session_running_with_its_output() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    sim.faults().apply(fail(None, "pods/attach", 1, 500));
    let id = runner
        .create(json!({"stdout": ["hello"], "echo": true, "exitCode": 4}))
        .await;
    let mut socket = runner.io(&id, "?lastSeq=0").await;
    let frames = ws::read_until_output(&mut socket, "hello").await;
    assert_client_safe(&String::from_utf8_lossy(&ws::output_of(&frames)));
    ws::send_stdin(&mut socket, b"still interactive\n").await;
    ws::read_until_output(&mut socket, "still interactive").await;
    ws::send_stdin(&mut socket, b"exit\n").await;
    let (statuses, told) = history(&runner, &id).await;
    assert_eq!(kinds(&statuses), ["starting", "running", "exited"]);
    assert_eq!(statuses[2], json!({"kind": "exited", "code": 4}));
    assert_client_safe(&told);
    assert_client_safe(&runner.full_output(&id).await);
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn a_slow_apiserver_still_starts_and_finishes_sessions() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    sim.faults().set_latency(Duration::from_millis(1000));
    let batch = runner
        .create(json!({"stdout": ["slow but sure"], "exitCode": 2}))
        .await;
    let live = runner
        .create(json!({"stdout": ["live"], "echo": true}))
        .await;
    let mut socket = runner.io(&live, "").await;
    ws::read_until_output(&mut socket, "live").await;
    ws::send_stdin(&mut socket, b"over a slow link\n").await;
    ws::read_until_output(&mut socket, "over a slow link").await;
    let (status, _) = runner.delete(&format!("/v1/sessions/{live}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (statuses, _) = history(&runner, &batch).await;
    assert_eq!(
        statuses,
        [
            json!({"kind": "starting"}),
            statuses[1].clone(),
            json!({"kind": "exited", "code": 2})
        ]
    );
    assert_eq!(statuses[1]["kind"], json!("running"));
    assert!(
        runner.full_output(&batch).await.contains("slow but sure"),
        "output kept"
    );
    assert_eq!(
        runner.wait_terminal(&live).await,
        json!({"kind": "stopped"})
    );
    no_pod_left(sim).await;
    sim.faults().clear();
    runner.stop().await;
}

/// A DELETE during an apiserver outage is answered without waiting the
/// outage out; the pod is deleted once the apiserver is back, and `stopped`
/// follows.
#[tokio::test]
async fn a_delete_during_an_outage_is_answered_at_once_and_finished_after_it() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create(json!({"echo": true})).await;
    running(&runner, &id).await;
    sim.faults().unavailable_for(Duration::from_secs(6));
    let (status, body) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    // Answered while the apiserver still refused the deletion.
    let pod: Pod = sim.get("telo-sessions", &format!("telo-run-{id}")).unwrap();
    assert!(
        pod.metadata.deletion_timestamp.is_none(),
        "the DELETE waited for the outage to end"
    );
    assert_eq!(runner.wait_terminal(&id).await, json!({"kind": "stopped"}));
    no_pod_left(sim).await;
    runner.stop().await;
}

#[tokio::test]
async fn an_apiserver_outage_is_survived_without_a_runner_restart() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    readyz_becomes(&runner, StatusCode::OK).await;
    let live = runner
        .create(json!({"stdout": ["live"], "echo": true}))
        .await;
    let ending = runner
        .create(json!({"stdout": ["ending"], "exitAfterMs": 1000, "exitCode": 6}))
        .await;
    running(&runner, &live).await;
    running(&runner, &ending).await;

    // Two seconds of 503s with every stream cut. Requests made meanwhile are
    // retried (the apiserver's Retry-After), so a session created during the
    // outage starts once it is over.
    sim.faults().unavailable_for(Duration::from_secs(2));
    let during = runner
        .create(json!({"stdout": ["created during the outage"], "exitCode": 0}))
        .await;
    let (statuses, told) = history(&runner, &during).await;
    assert_eq!(
        kinds(&statuses),
        ["starting", "running", "exited"],
        "{told}"
    );
    assert!(
        runner
            .full_output(&during)
            .await
            .contains("created during the outage")
    );
    // The session that ended during the outage is reported with its code.
    let (statuses, told) = history(&runner, &ending).await;
    assert_eq!(kinds(&statuses), ["starting", "running", "exited"]);
    assert_eq!(statuses[2], json!({"kind": "exited", "code": 6}));
    assert_client_safe(&told);
    assert!(runner.full_output(&ending).await.contains("ending"));
    // The live one still has its terminal.
    let mut socket = runner.io(&live, "").await;
    ws::send_stdin(&mut socket, b"after the outage\n").await;
    ws::read_until_output(&mut socket, "after the outage").await;

    // A period in which the apiserver refuses everything about pods (500s
    // are not retried): the runner turns unready and says so safely, starts
    // fail safely, and it all comes back once the refusals stop.
    sim.faults().apply(fail(None, "pods", 100_000, 500));
    sim.faults().drop_watches();
    let unready = readyz_becomes(&runner, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_client_safe(&unready.to_string());
    let refused = runner.create(json!({"exitCode": 0})).await;
    let (statuses, told) = history(&runner, &refused).await;
    assert_eq!(kinds(&statuses), ["starting", "failed"]);
    assert_eq!(
        statuses[1]["message"],
        json!(
            "create: could not create the session pod: the Kubernetes API rejected the request (InternalError, HTTP 500)"
        )
    );
    assert_client_safe(&told);
    sim.faults().clear();
    readyz_becomes(&runner, StatusCode::OK).await;
    let after = runner
        .create(json!({"stdout": ["after the refusals"], "exitCode": 0}))
        .await;
    assert_eq!(
        runner.wait_terminal(&after).await,
        json!({"kind": "exited", "code": 0})
    );
    assert!(
        runner
            .full_output(&after)
            .await
            .contains("after the refusals")
    );
    let (status, _) = runner.delete(&format!("/v1/sessions/{live}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        runner.wait_terminal(&live).await,
        json!({"kind": "stopped"})
    );
    no_pod_left(sim).await;
    runner.stop().await;
}

/// A runner killed while a session's pod is still `Pending` (its bundle
/// fetched, its image still pulling): the next runner adopts the pod and the
/// session reaches `running` with its output and its terminal.
#[tokio::test]
async fn a_runner_killed_while_a_session_starts_is_replaced_and_the_session_runs() {
    const PULL: Duration = Duration::from_millis(1500);
    let sim = common::cluster()
        .pull_delay(PULL)
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let first = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &[]).await;
    let created: Value = runner_core::http_client::client()
        .post(format!("{}/v1/sessions", first.base))
        .json(&test_support::bundle::start_body(
            json!({"stdout": ["adopted while starting"], "echo": true, "exitCode": 5}),
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let name = format!("telo-run-{id}");
    // The init container has fetched the bundle; the kernel image is pulling.
    let pod = sim
        .wait_for::<Pod>(
            "telo-sessions",
            &name,
            |pod| {
                pod.status
                    .as_ref()
                    .and_then(|s| s.init_container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.state.as_ref())
                    .is_some_and(|s| s.terminated.is_some())
            },
            test_support::WAIT,
        )
        .await
        .unwrap();
    drop(first); // SIGKILL
    assert_eq!(
        pod.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "killed while starting"
    );

    // Pods reach the runner at the node's address.
    let listener = tokio::net::TcpListener::bind((sim.node_ip(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let env: HashMap<String, String> = [
        ("RUNNER_BACKEND", "kubernetes".to_owned()),
        ("KUBECONFIG", kubeconfig.to_string_lossy().into_owned()),
        ("RUNNER_SELF_URL", format!("http://{addr}")),
        ("RUNNER_BASE_IMAGE_CATALOG_ENABLED", "false".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let second = RunningService::start_on(&env, listener).await.unwrap();
    tokio::time::timeout(test_support::WAIT, second.recovered())
        .await
        .expect("adoption finishes");
    let base = second.base_url();
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
    ws::read_until_output(&mut socket, "adopted while starting").await;
    ws::send_stdin(&mut socket, b"typed to the adopted session\n").await;
    ws::read_until_output(&mut socket, "typed to the adopted session").await;
    ws::send_stdin(&mut socket, b"exit\n").await;
    let rest = events.events_until_end().await;
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 5})
    );
    sim.wait_for_deletion("pods", "telo-sessions", &name, test_support::WAIT)
        .await
        .unwrap();
    second.stop().await.unwrap();
    sim.shutdown().await;
}

/// Each shared watch (pods, routing objects) recovers the same way: after a
/// failure the runner is unready, and once the apiserver answers again it is
/// ready without any object having to change (a quiet cluster).
#[rstest::rstest]
#[case::pods("pods")]
#[case::ingresses("ingresses")]
#[tokio::test]
async fn a_failed_watch_recovers_readiness_on_a_quiet_cluster(#[case] resource: &str) {
    let runner = Runner::start_kube(
        common::cluster().ingress_class("nginx", false),
        &[
            ("SESSION_ROUTING_BASE_DOMAIN", "sessions.example.test"),
            ("SESSION_ROUTING_MODE", "ingress"),
            ("SESSION_INGRESS_CLASS", "nginx"),
        ],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    readyz_becomes(&runner, StatusCode::OK).await;
    sim.faults().apply(fail(None, resource, 100_000, 500));
    sim.faults().drop_watches();
    let unready = readyz_becomes(&runner, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_client_safe(&unready.to_string());
    sim.faults().clear();
    readyz_becomes(&runner, StatusCode::OK).await;
    runner.stop().await;
}
