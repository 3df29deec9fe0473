//! Kubernetes-specific behaviour, end to end against kube-sim: failures that
//! must be reported fast and honestly, apiserver load, cleanup, app pods.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Backend, Runner};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::Api;
use kube::api::DeleteParams;
use kube_sim::{Denial, ImageBehaviour};
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::bundle::start_body;
use test_support::ws;

const NS: &str = "telo-sessions";

fn pod_name(id: &str) -> String {
    format!("telo-run-{id}")
}

async fn running(runner: &Runner, id: &str) {
    let mut events = runner.events(id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
}

fn failure_message(status: &Value) -> &str {
    assert_eq!(status["kind"], json!("failed"), "{status}");
    status["message"].as_str().unwrap()
}

#[tokio::test]
async fn an_unpullable_image_fails_fast_with_the_pull_error() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let mut body = start_body(json!({"exitCode": 0}));
    body["config"]["image"] = json!("registry.example/missing:1");
    let started = tokio::time::Instant::now();
    let id = runner.create_body(body).await;
    let status = runner.wait_terminal(&id).await;
    let message = failure_message(&status);
    assert!(
        message
            .starts_with("start: pod failed to start: container \"session\" waiting: ErrImagePull"),
        "{message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "reported long before the start deadline"
    );
    let sim = runner.sim.as_ref().unwrap();
    sim.wait_for_deletion("pods", NS, &pod_name(&id), Duration::from_secs(10))
        .await
        .expect("the failed pod is deleted");
    runner.stop().await;
}

#[tokio::test]
async fn a_full_quota_is_not_blamed_on_rbac() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "telo-k8s-runner-sessions", "namespace": NS},
        "spec": {"hard": {"pods": "0"}},
    }))
    .unwrap();
    sim.seed(&quota).unwrap();
    let id = runner.create(json!({"exitCode": 0})).await;
    let status = runner.wait_terminal(&id).await;
    let message = failure_message(&status);
    assert_eq!(
        message,
        "create: could not create the session pod: the session namespace's resource quota is exhausted (Forbidden, HTTP 403)"
    );
    assert!(
        !message.contains("telo-k8s-runner-sessions"),
        "the admission text never leaks"
    );
    runner.stop().await;
}

#[tokio::test]
async fn an_rbac_denial_names_the_operator_and_hides_the_service_account() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    runner.sim.as_ref().unwrap().deny(Denial {
        verb: "create".into(),
        resource: "pods".into(),
        namespace: None,
        user: None,
    });
    let id = runner.create(json!({"exitCode": 0})).await;
    let status = runner.wait_terminal(&id).await;
    let message = failure_message(&status);
    assert_eq!(
        message,
        "create: could not create the session pod: the runner is not permitted to do this (Forbidden, HTTP 403). The cluster operator must check the runner's RBAC."
    );
    assert!(!message.contains("system:serviceaccount"));
    runner.stop().await;
}

#[tokio::test]
async fn an_unreachable_apiserver_is_reported_as_unreachable() {
    // A kubeconfig naming an address nothing listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let sim = common::cluster().start().await.unwrap();
    std::fs::write(
        &kubeconfig,
        sim.kubeconfig_yaml()
            .replace(&sim.url(), &format!("http://{closed}")),
    )
    .unwrap();
    sim.shutdown().await;
    let path = kubeconfig.to_string_lossy().into_owned();
    let runner = Runner::start_on(Backend::Kubernetes, &[("KUBECONFIG", path.as_str())]).await;
    let id = runner.create(json!({"exitCode": 0})).await;
    let status = runner.wait_terminal(&id).await;
    assert_eq!(
        failure_message(&status),
        "create: could not create the session pod: the Kubernetes API could not be reached"
    );
    let (_, probe) = runner
        .post(
            "/v1/probe",
            &json!({"config": {"image": "x", "pullPolicy": "missing"}}),
        )
        .await;
    assert_eq!(
        probe,
        json!({"status": "unavailable", "message": "Kubernetes API server not reachable from the runner.", "remediation": "Check the runner's in-cluster ServiceAccount and RBAC."})
    );
    runner.stop().await;
}

#[tokio::test]
async fn a_pod_that_never_runs_hits_the_start_deadline() {
    let runner = Runner::start_kube(
        common::cluster().pull_delay(Duration::from_secs(30)),
        &[("RUNNER_START_DEADLINE_SECONDS", "1")],
    )
    .await;
    let id = runner.create(json!({"exitCode": 0})).await;
    let status = runner.wait_terminal(&id).await;
    assert_eq!(
        failure_message(&status),
        "start: pod failed to start: pod did not reach Running within the start deadline"
    );
    runner.stop().await;
}

#[tokio::test]
async fn a_failing_init_container_is_named_in_the_failure() {
    // The init container fetches the bundle from a runner URL nobody serves.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let self_url = format!("http://{closed}");
    let runner = Runner::start_on(
        Backend::Kubernetes,
        &[("RUNNER_SELF_URL", self_url.as_str())],
    )
    .await;
    let id = runner.create(json!({"exitCode": 0})).await;
    let status = runner.wait_terminal(&id).await;
    let message = failure_message(&status);
    assert!(
        message.starts_with("start: pod failed to start: init container \"body-fetch\" failed"),
        "{message}"
    );
    runner.stop().await;
}

#[tokio::test]
async fn a_pod_deleted_behind_the_runners_back_fails_the_session() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let id = runner.create(json!({"echo": true})).await;
    running(&runner, &id).await;
    let pods: Api<Pod> = Api::namespaced(runner.sim.as_ref().unwrap().client(), NS);
    pods.delete(&pod_name(&id), &DeleteParams::default())
        .await
        .unwrap();
    let status = runner.wait_terminal(&id).await;
    assert_eq!(
        failure_message(&status),
        "the session pod was deleted outside the runner"
    );
    runner.stop().await;
}

#[tokio::test]
async fn a_dropped_watch_loses_no_status() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let id = runner
        .create(json!({"stdout": ["ready"], "echo": true, "exitCode": 4}))
        .await;
    let mut socket = runner.io(&id, "").await;
    ws::read_until_output(&mut socket, "ready").await;
    runner.sim.as_ref().unwrap().faults().drop_watches();
    ws::send_stdin(&mut socket, b"exit\n").await;
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 4})
    );
    runner.stop().await;
}

#[tokio::test]
async fn watches_stay_constant_whatever_the_number_of_sessions() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(runner.create(json!({"echo": true})).await);
    }
    for id in &ids {
        running(&runner, id).await;
    }
    let stats = sim.stats();
    let open: i64 = stats.watches.values().sum();
    assert!(open <= 4, "watches by resource: {:?}", stats.watches);
    assert_eq!(
        stats.watches.get("pods").copied().unwrap_or(0),
        1,
        "{:?}",
        stats.watches
    );
    runner.stop().await;
}

#[tokio::test]
async fn stopping_deletes_the_pod_and_the_bundle_url_is_single_use() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create(json!({"echo": true})).await;
    running(&runner, &id).await;
    let pod: Pod = sim.get(NS, &pod_name(&id)).expect("pod exists");
    let script = pod.spec.unwrap().init_containers.unwrap()[0]
        .args
        .clone()
        .unwrap()[0]
        .clone();
    let url = script
        .split('"')
        .find(|part| part.starts_with("http://"))
        .expect("bundle url in the init script")
        .to_owned();
    let response = runner.client.get(&url).send().await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "already fetched once by the pod"
    );

    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(runner.wait_terminal(&id).await, json!({"kind": "stopped"}));
    sim.wait_for_deletion("pods", NS, &pod_name(&id), Duration::from_secs(10))
        .await
        .expect("pod deleted");
    runner.stop().await;
}

#[tokio::test]
async fn a_finished_pod_is_cleaned_up() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let id = runner.create(json!({"exitCode": 0})).await;
    assert_eq!(runner.wait_terminal(&id).await["kind"], json!("exited"));
    runner
        .sim
        .as_ref()
        .unwrap()
        .wait_for_deletion("pods", NS, &pod_name(&id), Duration::from_secs(10))
        .await
        .expect("finished pod deleted");
    runner.stop().await;
}

#[tokio::test]
async fn an_app_session_runs_the_catalog_image_with_operator_env() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("agent.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: agent }\nfakeTelo:\n  printEnv: [API_KEY, MODE]\n  exitCode: 0\n",
    )
    .unwrap();
    let catalog =
        json!({"agent": {"image": "acme/agent:1", "env": {"API_KEY": "operator"}}}).to_string();
    let runner = Runner::start_kube(
        common::cluster().image("acme/agent:*", ImageBehaviour::FakeTeloEntry(manifest)),
        &[("RUNNER_APPS", catalog.as_str())],
    )
    .await;
    let (status, created) = runner
        .post(
            "/v1/apps/agent/sessions",
            &json!({"env": {"API_KEY": "client", "MODE": "x"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = created["sessionId"].as_str().unwrap();
    assert_eq!(
        runner.wait_terminal(id).await,
        json!({"kind": "exited", "code": 0})
    );
    let output = runner.full_output(id).await;
    assert!(output.contains("API_KEY=operator"), "{output}");
    assert!(output.contains("MODE=x"), "{output}");
    runner.stop().await;
}

#[tokio::test]
async fn a_missing_session_namespace_is_reported_by_the_probe() {
    let runner = Runner::start_on(
        Backend::Kubernetes,
        &[("RUNNER_SESSION_NAMESPACE", "nowhere")],
    )
    .await;
    let (_, probe) = runner
        .post(
            "/v1/probe",
            &json!({"config": {"image": "x", "pullPolicy": "missing"}}),
        )
        .await;
    assert_eq!(
        probe,
        json!({"status": "unavailable", "message": "Session namespace 'nowhere' does not exist.", "remediation": "Install the runner's Helm chart, which provisions the 'nowhere' namespace."})
    );
    runner.stop().await;
}

#[tokio::test]
async fn env_values_reach_the_workload_verbatim() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let mut body = start_body(json!({"printEnv": ["SECRET"], "exitCode": 0}));
    body["env"] = json!({"SECRET": "pa$$word $(HOME) $"});
    let id = runner.create_body(body).await;
    runner.wait_terminal(&id).await;
    let output = runner.full_output(&id).await;
    assert!(output.contains("SECRET=pa$$word $(HOME) $"), "{output}");
    runner.stop().await;
}

#[tokio::test]
async fn the_charts_compute_quota_admits_a_session_pod() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "telo-k8s-runner-sessions", "namespace": NS},
        "spec": {"hard": {"pods": "32", "limits.cpu": "16", "limits.memory": "16Gi", "requests.cpu": "16", "requests.memory": "16Gi"}},
    }))
    .unwrap();
    runner.sim.as_ref().unwrap().seed(&quota).unwrap();
    let id = runner
        .create(json!({"stdout": ["admitted"], "exitCode": 0}))
        .await;
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 0})
    );
    runner.stop().await;
}

#[tokio::test]
async fn a_session_costs_a_fixed_handful_of_api_requests() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create(json!({"exitCode": 0})).await;
    runner.wait_terminal(&id).await;
    sim.wait_for_deletion("pods", NS, &pod_name(&id), Duration::from_secs(10))
        .await
        .unwrap();
    let requests = sim.stats().requests;
    let count = |verb: &str, resource: &str| {
        requests
            .get(verb)
            .and_then(|by| by.get(resource))
            .copied()
            .unwrap_or(0)
    };
    // One pod created, one terminal attached, the log read at most twice
    // (once the attach is open, for what was written before it, and once it
    // ended having carried nothing: output written before the runtime
    // hooked the stream up is in the log only) plus, for a workload that
    // printed nothing, the early reads that look for a first line (one per
    // offset in `EARLY_READS_AFTER` at most), the pod deleted once
    // finished.
    assert_eq!(count("create", "pods"), 1, "{requests:?}");
    assert_eq!(
        count("get", "pods/attach") + count("create", "pods/attach"),
        1,
        "{requests:?}"
    );
    let early_reads = runner_k8s::terminal::EARLY_READS_AFTER.len() as u64;
    assert!(count("get", "pods/log") <= 2 + early_reads, "{requests:?}");
    assert_eq!(count("delete", "pods"), 1, "{requests:?}");
    eprintln!("api requests for one session: {requests:?}");
    runner.stop().await;
}
