//! An app session's environment on Kubernetes lives in a Secret of its pod,
//! never in the pod spec: black-box against kube-sim, the Secret is there
//! while the pod is, survives a runner restart (killed at any point of the
//! start, too), and is gone however the session ends — stopped, exited,
//! failed to start, refused at pod creation, its pod deleted by someone
//! else. A Secret missing when the container starts, or one the runner may
//! not create, fails the start saying so; no warm pod shows catalog env.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Backend, Runner, RunnerProcess};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kube_sim::{ImageBehaviour, KubeSimBuilder};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};

const NS: &str = "telo-sessions";
const OPERATOR_KEY: &str = "operator-key-9e41b2";

/// A catalog whose `keyed` app holds an operator key and stays up (it
/// echoes), and whose `unpullable` app's image cannot be pulled.
fn catalog() -> String {
    json!({
        "keyed": {"image": "acme/keyed:1", "env": {"API_KEY": OPERATOR_KEY}},
        "unpullable": {"image": "acme/gone:1", "env": {"API_KEY": OPERATOR_KEY}},
    })
    .to_string()
}

/// kube-sim with the catalog's images: `keyed` prints its key and echoes.
fn cluster(dir: &std::path::Path) -> KubeSimBuilder {
    let manifest = dir.join("keyed.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: keyed }\nfakeTelo:\n  printEnv: [API_KEY]\n  echo: true\n",
    )
    .unwrap();
    common::cluster()
        .image("acme/keyed:*", ImageBehaviour::FakeTeloEntry(manifest))
        .image(
            "acme/gone:*",
            ImageBehaviour::PullError("manifest unknown".into()),
        )
}

async fn start_app(runner: &Runner, app: &str) -> String {
    let (status, created) = runner
        .post(&format!("/v1/apps/{app}/sessions"), &json!({"env": {}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["sessionId"].as_str().unwrap().to_owned()
}

/// The session's pod as stored, once it exists.
async fn stored_pod(sim: &kube_sim::KubeSim, id: &str) -> Value {
    sim.wait_for_value(
        "pods",
        NS,
        &format!("telo-run-{id}"),
        |_| true,
        test_support::WAIT,
    )
    .await
    .unwrap()
}

/// Every Secret in the session namespace.
async fn secrets(sim: &kube_sim::KubeSim) -> Vec<String> {
    let api: Api<Secret> = Api::namespaced(sim.client(), NS);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|secret| secret.metadata.name)
        .collect()
}

/// Polls until the session namespace holds no Secret.
async fn until_no_secret(sim: &kube_sim::KubeSim) {
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let left = secrets(sim).await;
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Secrets left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Debug, Clone, Copy)]
enum Ending {
    /// `DELETE /v1/sessions/:id`.
    Stopped,
    /// The workload exits by itself.
    Exited,
    /// Someone deletes the pod with `kubectl delete pod`.
    PodDeletedOutside,
}

#[rstest]
#[case::stopped(Ending::Stopped)]
#[case::exited(Ending::Exited)]
#[case::pod_deleted_outside(Ending::PodDeletedOutside)]
#[tokio::test]
async fn an_app_sessions_env_secret_goes_with_the_session(#[case] ending: Ending) {
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog();
    let runner = Runner::start_kube(cluster(dir.path()), &[("RUNNER_APPS", &catalog)]).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = start_app(&runner, "keyed").await;
    let mut socket = runner.io(&id, "?lastSeq=0").await;
    test_support::ws::read_until_output(&mut socket, &format!("API_KEY={OPERATOR_KEY}")).await;
    let pod = stored_pod(sim, &id).await;
    assert!(!pod.to_string().contains(OPERATOR_KEY), "{pod}");
    let named = common::env_secrets_of(&pod);
    assert_eq!(named.len(), 1, "{pod}");
    assert_eq!(secrets(sim).await, named);

    let expected = match ending {
        Ending::Stopped => {
            let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
            assert_eq!(status, StatusCode::NO_CONTENT);
            json!({"kind": "stopped"})
        }
        Ending::Exited => {
            test_support::ws::send_stdin(&mut socket, b"exit\r").await;
            json!({"kind": "exited", "code": 0})
        }
        Ending::PodDeletedOutside => {
            let pods: Api<Pod> = Api::namespaced(sim.client(), NS);
            pods.delete(&format!("telo-run-{id}"), &DeleteParams::default())
                .await
                .unwrap();
            json!({"kind": "failed", "message": "the session pod was deleted outside the runner"})
        }
    };
    assert_eq!(runner.wait_terminal(&id).await, expected);
    until_no_secret(sim).await;
    runner.stop().await;
}

/// A start that fails (the image cannot be pulled) and a pod the apiserver
/// refuses once the Secret exists leave no Secret behind.
#[tokio::test]
async fn a_failed_start_and_a_refused_pod_leave_no_env_secret() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog();
    let runner = Runner::start_kube(cluster(dir.path()), &[("RUNNER_APPS", &catalog)]).await;
    let sim = runner.sim.as_ref().unwrap();

    let id = start_app(&runner, "unpullable").await;
    let status = runner.wait_terminal(&id).await;
    assert_eq!(status["kind"], "failed", "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("ErrImagePull"),
        "{status}"
    );
    until_no_secret(sim).await;

    sim.faults().fail_next("create", "pods", 1, 500);
    let id = start_app(&runner, "keyed").await;
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "failed", "message": "create: could not create the session pod: the Kubernetes API rejected the request (InternalError, HTTP 500)"})
    );
    until_no_secret(sim).await;

    // The next session starts as usual.
    let id = start_app(&runner, "keyed").await;
    let mut socket = runner.io(&id, "?lastSeq=0").await;
    test_support::ws::read_until_output(&mut socket, &format!("API_KEY={OPERATOR_KEY}")).await;
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    runner.wait_terminal(&id).await;
    until_no_secret(sim).await;
    runner.stop().await;
}

/// A Secret deleted (by someone else) before the container starts leaves
/// the container waiting on `CreateContainerConfigError`, as a kubelet
/// does; the session fails saying its environment is missing, not that
/// the pod "did not reach Running".
#[tokio::test]
async fn an_env_secret_deleted_before_the_container_starts_fails_the_start_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog();
    // The pull is slow (generous under load), so the Secret can go before
    // the container starts.
    let runner = Runner::start_kube(
        cluster(dir.path()).pull_delay(Duration::from_secs(3)),
        &[("RUNNER_APPS", &catalog)],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    let id = start_app(&runner, "keyed").await;
    let pod = stored_pod(sim, &id).await;
    let secret = common::env_secrets_of(&pod).pop().expect("an env Secret");
    // Once it is tied to its pod: the runner is done with it.
    sim.wait_for_value(
        "secrets",
        NS,
        &secret,
        |s| s["metadata"]["ownerReferences"].is_array(),
        test_support::WAIT,
    )
    .await
    .unwrap();
    let api: Api<Secret> = Api::namespaced(sim.client(), NS);
    api.delete(&secret, &DeleteParams::default()).await.unwrap();
    let status = runner.wait_terminal(&id).await;
    assert_eq!(
        status,
        json!({"kind": "failed", "message": format!(
            "start: pod failed to start: container \"session\" could not be given its environment: its Secret \"{secret}\" was deleted or changed outside the runner (CreateContainerConfigError: secret \"{secret}\" not found)"
        )})
    );
    sim.wait_for_deletion("pods", NS, &format!("telo-run-{id}"), test_support::WAIT)
        .await
        .unwrap();
    runner.stop().await;
}

/// A runner killed while an app session runs leaves the pod and its Secret
/// to its successor, which adopts the session; the Secret goes when the
/// session ends.
#[tokio::test]
async fn an_adopted_app_session_keeps_its_env_secret_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let sim = cluster(dir.path()).start().await.unwrap();
    let catalog = catalog();
    let vars = [("RUNNER_APPS", catalog.as_str())];
    let first = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    let client = runner_core::http_client::client();
    let created: Value = client
        .post(format!("{}/v1/apps/keyed/sessions", first.base))
        .json(&json!({"env": {}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut socket = test_support::ws::connect(
        &format!("{}/v1/sessions/{id}/io?lastSeq=0", first.ws_base()),
        None,
    )
    .await;
    test_support::ws::read_until_output(&mut socket, &format!("API_KEY={OPERATOR_KEY}")).await;
    drop(socket);
    let named = common::env_secrets_of(&stored_pod(&sim, &id).await);
    assert_eq!(named.len(), 1);
    drop(first); // SIGKILL

    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    common::watch::ready(&second.base).await;
    let mut socket = test_support::ws::connect(
        &format!("{}/v1/sessions/{id}/io?lastSeq=0", second.ws_base()),
        None,
    )
    .await;
    test_support::ws::read_until_output(&mut socket, &format!("API_KEY={OPERATOR_KEY}")).await;
    test_support::ws::send_stdin(&mut socket, b"still here\r").await;
    test_support::ws::read_until_output(&mut socket, "still here").await;
    assert_eq!(secrets(&sim).await, named);

    let response = client
        .delete(format!("{}/v1/sessions/{id}", second.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    test_support::ws::read_until_close(&mut socket).await;
    until_no_secret(&sim).await;
    drop(second);
    sim.shutdown().await;
}

/// Starts an app session on a runner process that is killed while the
/// apiserver holds its request `verb` on `resource` — between the Secret
/// and the pod, or between the pod and the tie — and that request is then
/// refused. Returns the session id.
async fn kill_a_runner_mid_create(
    sim: &kube_sim::KubeSim,
    dir: &std::path::Path,
    vars: &[(&str, &str)],
    verb: &str,
    resource: &str,
) -> String {
    sim.faults().hold(verb, resource);
    let first = RunnerProcess::spawn(Backend::Kubernetes, dir, Some(sim), vars).await;
    let created: Value = runner_core::http_client::client()
        .post(format!("{}/v1/apps/keyed/sessions", first.base))
        .json(&json!({"env": {}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    tokio::time::timeout(test_support::WAIT, sim.faults().wait_held(1))
        .await
        .unwrap_or_else(|_| panic!("the runner never reached {verb} {resource}"));
    drop(first); // SIGKILL
    // Whatever the dead runner's request would still do, it fails.
    sim.faults().fail_next(verb, resource, 1, 500);
    sim.faults().release();
    id
}

/// A runner killed after it stored a session's env Secret and before its
/// pod existed leaves a Secret no pod will ever own: the next runner's
/// boot sweep deletes it.
#[tokio::test]
async fn a_secret_left_without_its_pod_by_a_killed_runner_is_swept_at_boot() {
    let dir = tempfile::tempdir().unwrap();
    let sim = cluster(dir.path()).start().await.unwrap();
    let catalog = catalog();
    let vars = [("RUNNER_APPS", catalog.as_str())];
    let id = kill_a_runner_mid_create(&sim, dir.path(), &vars, "create", "pods").await;
    assert_eq!(secrets(&sim).await.len(), 1);
    assert!(
        sim.get_value("pods", NS, &format!("telo-run-{id}"))
            .is_none()
    );

    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    common::watch::ready(&second.base).await;
    until_no_secret(&sim).await;
    drop(second);
    sim.shutdown().await;
}

/// A runner killed after it created the pod and before it tied the Secret
/// to it: the next runner adopts the session and ties the Secret to its
/// pod, so the session runs on and the Secret still goes with it.
#[tokio::test]
async fn a_secret_left_untied_by_a_killed_runner_is_tied_to_its_pod_at_boot() {
    let dir = tempfile::tempdir().unwrap();
    let sim = cluster(dir.path()).start().await.unwrap();
    let catalog = catalog();
    let vars = [("RUNNER_APPS", catalog.as_str())];
    let id = kill_a_runner_mid_create(&sim, dir.path(), &vars, "patch", "secrets").await;
    let pod = stored_pod(&sim, &id).await;
    let named = common::env_secrets_of(&pod);
    assert_eq!(secrets(&sim).await, named);
    let unowned = sim.get_value("secrets", NS, &named[0]).unwrap();
    assert!(
        unowned["metadata"]["ownerReferences"].is_null(),
        "{unowned}"
    );

    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), &vars).await;
    common::watch::ready(&second.base).await;
    let tied = sim.get_value("secrets", NS, &named[0]).unwrap();
    assert_eq!(
        tied["metadata"]["ownerReferences"][0]["uid"], pod["metadata"]["uid"],
        "{tied}"
    );
    let mut socket = test_support::ws::connect(
        &format!("{}/v1/sessions/{id}/io?lastSeq=0", second.ws_base()),
        None,
    )
    .await;
    test_support::ws::read_until_output(&mut socket, &format!("API_KEY={OPERATOR_KEY}")).await;
    test_support::ws::send_stdin(&mut socket, b"exit\r").await;
    test_support::ws::read_until_close(&mut socket).await;
    until_no_secret(&sim).await;
    drop(second);
    sim.shutdown().await;
}

/// Warm pods never carry catalog env: an app session always starts cold,
/// even when its image is a pooled kernel image, and a run session claimed
/// onto a warm pod gets its env through the launch file in the pod's
/// volume, so neither the spec nor an annotation of any pod in the
/// namespace shows a value of either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_warm_pod_shows_a_catalog_value_or_a_sessions_env() {
    const IMAGE: &str = "telorun/node:0-slim";
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("pooled.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: pooled }\nfakeTelo:\n  printEnv: [API_KEY]\n  echo: true\n",
    )
    .unwrap();
    // The app's image is the pool's: its own entrypoint runs the app, and
    // commands (the warm pod's waiting shell, `telo run`) run as given.
    let catalog = json!({"pooled": {"image": IMAGE, "env": {"API_KEY": OPERATOR_KEY}}}).to_string();
    let pool = format!("{IMAGE}=1");
    let runner = Runner::start_kube(
        common::cluster().image(IMAGE, ImageBehaviour::FakeTeloEntry(manifest)),
        &[("RUNNER_APPS", &catalog), ("RUNNER_WARM_POOL", &pool)],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), NS);
    let idle = async || -> Vec<String> {
        pods.list(&ListParams::default().labels("telo.run/warm=idle"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|pod| pod.metadata.name)
            .collect()
    };
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    let warm = loop {
        if let [one] = idle().await.as_slice() {
            break one.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no warm pod ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Running is not yet offered: the runner checks the pod first.
    runner.until_warm_pods_ready(IMAGE, 1).await;

    let app = start_app(&runner, "pooled").await;
    let mut app_socket = runner.io(&app, "?lastSeq=0").await;
    test_support::ws::read_until_output(&mut app_socket, &format!("API_KEY={OPERATOR_KEY}")).await;
    // Cold, on a pod of its own: the warm pod is still idle.
    assert!(stored_pod(sim, &app).await["metadata"]["name"] == format!("telo-run-{app}"));
    assert_eq!(idle().await, std::slice::from_ref(&warm));

    let mut body =
        test_support::bundle::start_body(json!({"printEnv": ["RUN_VALUE"], "echo": true}));
    body["env"] = json!({"RUN_VALUE": "run-value-5d7e1f"});
    let run = runner.create_body(body).await;
    let mut run_socket = runner.io(&run, "?lastSeq=0").await;
    test_support::ws::read_until_output(&mut run_socket, "RUN_VALUE=run-value-5d7e1f").await;
    let claimed = pods.get(&warm).await.unwrap();
    assert_eq!(
        claimed.metadata.labels.as_ref().unwrap()["telo.run/session-id"],
        run,
        "the run session took the warm pod"
    );

    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        let stored = serde_json::to_string(&pod).unwrap();
        assert!(!stored.contains(OPERATOR_KEY), "{stored}");
        assert!(!stored.contains("run-value-5d7e1f"), "{stored}");
    }
    for id in [&app, &run] {
        let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        runner.wait_terminal(id).await;
    }
    runner.stop().await;
}

/// A runner the cluster does not let create Secrets (a chart without a
/// catalog, a catalog set through `runner.extraEnv`) fails an app start
/// saying who must fix what, and creates no pod that would show the env.
#[tokio::test]
async fn a_runner_not_allowed_to_create_secrets_fails_the_start_and_creates_no_pod() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog();
    let runner = Runner::start_kube(cluster(dir.path()), &[("RUNNER_APPS", &catalog)]).await;
    let sim = runner.sim.as_ref().unwrap();
    sim.deny(kube_sim::Denial {
        verb: "create".into(),
        resource: "secrets".into(),
        namespace: Some(NS.into()),
        user: None,
    });
    let id = start_app(&runner, "keyed").await;
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "failed", "message": "create: could not store the session's environment: the runner is not permitted to do this (Forbidden, HTTP 403). The cluster operator must check the runner's RBAC."})
    );
    assert!(
        sim.get_value("pods", NS, &format!("telo-run-{id}"))
            .is_none()
    );
    runner.stop().await;
}
