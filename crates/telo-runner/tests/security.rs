//! Security properties, black-box: the runner's own environment never reaches
//! a workload, the bundle URL admits only its own token, session pods are
//! hardened as stored by the apiserver, and with a token file every route but
//! discovery and the probes refuses an anonymous caller.
//!
//! Already covered elsewhere (not repeated here): the bundle URL is single
//! use (`kube.rs::stopping_deletes_the_pod_and_the_bundle_url_is_single_use`),
//! expires (`runner-k8s` `bundle_store::a_bundle_expires_after_the_staging_ttl`,
//! on a paused clock), and a wrong token is refused in the store
//! (`bundle_store::the_route_404s_without_the_right_token_and_keeps_the_bundle`);
//! the tokens gate on a hand-written route list and the socket's 4401
//! (`auth.rs`).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Backend, Runner, RunnerProcess};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube_sim::{ImageBehaviour, KubeSim};
use reqwest::{Method, StatusCode};
use rstest::rstest;
use serde_json::{Value, json};
use test_support::bundle::start_body;

const NS: &str = "telo-sessions";
const TOKEN: &str = "tok-3b9d2c71e0";
/// A value no workload may ever see.
const SECRET: &str = "runner-secret-7d1f0a";

/// The runner's own environment: its settings plus secrets an operator might
/// have in a runner's pod or shell.
fn runner_env(dir: &std::path::Path) -> Vec<(String, String)> {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    std::fs::write(dir.join("not-a-kubeconfig"), "nothing").unwrap();
    vec![
        (
            "RUNNER_AUTH_TOKENS_FILE".into(),
            tokens.to_string_lossy().into(),
        ),
        ("AWS_SECRET_ACCESS_KEY".into(), SECRET.into()),
        ("DATABASE_PASSWORD".into(), SECRET.into()),
        ("GITHUB_TOKEN".into(), SECRET.into()),
        ("RUNNER_DISPLAY_NAME".into(), "display-7d1f0a".into()),
        ("PORT".into(), "8061".into()),
    ]
}

/// Names whose values the workload prints.
const PRINTED: &[&str] = &[
    "RUNNER_SELF_URL",
    "KUBECONFIG",
    "RUNNER_AUTH_TOKENS_FILE",
    "RUNNER_BACKEND",
    "RUNNER_LOCAL_TELO",
    "RUNNER_DISPLAY_NAME",
    "AWS_SECRET_ACCESS_KEY",
    "DATABASE_PASSWORD",
    "GITHUB_TOKEN",
    "PORT",
];

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn no_runner_environment_variable_reaches_a_workload(#[case] backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster_for(backend).await;
    let mut vars = runner_env(dir.path());
    if backend == Backend::Local {
        // The local runner has no use for one, but may have one in its shell.
        vars.push((
            "KUBECONFIG".into(),
            dir.path().join("not-a-kubeconfig").to_string_lossy().into(),
        ));
    }
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let runner = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), &vars).await;
    let base = runner.base.clone();
    let client = runner_core::http_client::client();
    let created: Value = client
        .post(format!("{base}/v1/sessions"))
        .bearer_auth(TOKEN)
        // Kept running until the pod was read: a finished session's pod is
        // deleted soon after, and reading it then would race the runner.
        .json(&start_body(
            json!({"printEnv": PRINTED, "echo": true, "exitCode": 0}),
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut socket = test_support::ws::connect(
        &format!(
            "{}/v1/sessions/{id}/io?lastSeq=0&access_token={TOKEN}",
            base.replacen("http", "ws", 1)
        ),
        None,
    )
    .await;
    let last = format!("\n{}=", PRINTED[PRINTED.len() - 1]);
    let mut frames = test_support::ws::read_until_output(&mut socket, &last).await;
    let stored = match &sim {
        Some(sim) => Some(stored_pod(sim, &id).await),
        None => None,
    };
    test_support::ws::send_stdin(&mut socket, b"exit\r").await;
    frames.extend(test_support::ws::read_until_close(&mut socket).await);
    let output = String::from_utf8_lossy(&test_support::ws::output_of(&frames)).into_owned();
    for name in PRINTED {
        assert!(
            output.contains(&format!("{name}=<unset>")),
            "{name} reached the workload: {output}"
        );
    }
    assert!(!output.contains(SECRET), "{output}");
    if let (Some(sim), Some(pod)) = (&sim, stored) {
        // Nor is any of it written into the pod, where `kubectl get pod`
        // would show it.
        let stored = serde_json::to_string(&pod).unwrap();
        assert!(!stored.contains(SECRET));
        assert!(!stored.contains(TOKEN));
        assert!(!stored.contains("display-7d1f0a"));
        sim.wait_for_deletion(
            "pods",
            NS,
            &format!("telo-run-{id}"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    drop(runner);
    if let Some(sim) = sim {
        sim.shutdown().await;
    }
}

/// The session's pod as the apiserver stores it, once it is created.
async fn stored_pod(sim: &KubeSim, id: &str) -> Pod {
    sim.wait_for::<Pod>(NS, &format!("telo-run-{id}"), |_| true, test_support::WAIT)
        .await
        .unwrap()
}

/// The bundle URL of the session's stored pod.
async fn bundle_url(sim: &KubeSim, id: &str) -> String {
    let pod = stored_pod(sim, id).await;
    let script = pod.spec.unwrap().init_containers.unwrap()[0]
        .args
        .clone()
        .unwrap()[0]
        .clone();
    script
        .split('"')
        .find(|part| part.starts_with("http://"))
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn the_bundle_url_serves_only_its_own_token_and_only_while_it_is_needed() {
    // The image pull is slow, so the bundle is still staged when probed.
    let runner = Runner::start_kube(
        common::cluster().pull_delay(Duration::from_millis(1500)),
        &[],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner
        .create(json!({"stdout": ["fetched"], "exitCode": 0}))
        .await;
    let other = runner.create(json!({"exitCode": 0})).await;
    let url = bundle_url(sim, &id).await;
    let (path, token) = url.split_once("?token=").unwrap();
    assert_eq!(token.len(), 48, "{url}");
    let mut flipped = token.to_owned();
    let last = if token.ends_with('0') { "1" } else { "0" };
    flipped.replace_range(47.., last);
    let other_path = path.replace(&id, &other);
    for probe in [
        path.to_owned(),
        format!("{path}?token="),
        format!("{path}?token={flipped}"),
        format!("{path}?token={}", &token[..47]),
        format!("{path}?token={token}0"),
        format!("{path}?token={}", token.to_uppercase()),
        format!("{other_path}?token={token}"),
    ] {
        let response = runner.client.get(&probe).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{probe}");
    }
    // The wrong guesses cost the pod nothing: it still gets its bundle.
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 0})
    );
    assert!(runner.full_output(&id).await.contains("fetched"));
    // Once the pod has it, the URL is dead (single use) …
    let response = runner.client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    // … and a session stopped before its pod fetched it revokes it too.
    let stopped = runner.create(json!({"exitCode": 0})).await;
    let stopped_url = bundle_url(sim, &stopped).await;
    let (status, _) = runner.delete(&format!("/v1/sessions/{stopped}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    runner.wait_terminal(&stopped).await;
    let response = runner.client.get(&stopped_url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    runner.wait_terminal(&other).await;
    runner.stop().await;
}

/// An operator's catalog key: it must reach the operator's program and no
/// object anyone with `get pods` in the session namespace can read.
const OPERATOR_KEY: &str = "operator-key-4f2a9c";
/// An operator value with what Kubernetes would expand in a literal `value`.
const OPERATOR_DOLLARS: &str = "pa$$word $(HOME) $5";
/// A client's value of an app session.
const CLIENT_VALUE: &str = "client-value-81c3e7";

/// An app session's environment — the entry's `env`, its workload token and
/// the client's values — is in no pod the apiserver stores (`get pods`
/// would show it), only in a Secret the pod refers to; the workload still
/// gets every value byte for byte, and the Secret goes with the session.
#[tokio::test]
async fn an_app_sessions_env_is_in_no_stored_pod_yet_reaches_its_workload() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("keyed.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: keyed }\nfakeTelo:\n  printEnv: [API_KEY, SALT, APP_TOKEN, MODE]\n  echo: true\n",
    )
    .unwrap();
    let catalog = json!({"keyed": {
        "image": "acme/keyed:1",
        "tokenEnv": "APP_TOKEN",
        "env": {"API_KEY": OPERATOR_KEY, "SALT": OPERATOR_DOLLARS},
    }})
    .to_string();
    let runner = Runner::start_kube(
        common::cluster().image("acme/keyed:*", ImageBehaviour::FakeTeloEntry(manifest)),
        &[("RUNNER_APPS", catalog.as_str())],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    let (status, created) = runner
        .post(
            "/v1/apps/keyed/sessions",
            &json!({"env": {"MODE": CLIENT_VALUE}, "ports": [{"port": 8080, "protocol": "tcp"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let token = frames.last().unwrap().json()["status"]["endpoints"][0]["token"]
        .as_str()
        .unwrap()
        .to_owned();

    // Read while the session runs: a finished session's pod is deleted.
    let mut socket = runner.io(&id, "?lastSeq=0").await;
    let mut frames = test_support::ws::read_until_output(&mut socket, "\nMODE=").await;
    let pod = sim
        .get_value("pods", NS, &format!("telo-run-{id}"))
        .expect("the app pod");
    let stored = pod.to_string();
    for value in [OPERATOR_KEY, "pa$$", &token, CLIENT_VALUE] {
        assert!(
            !stored.contains(value),
            "{value} is in the stored pod: {stored}"
        );
    }
    let secrets = common::env_secrets_of(&pod);
    assert_eq!(secrets.len(), 1, "{stored}");
    assert!(sim.get_value("secrets", NS, &secrets[0]).is_some());

    test_support::ws::send_stdin(&mut socket, b"exit\r").await;
    frames.extend(test_support::ws::read_until_close(&mut socket).await);
    let output = String::from_utf8_lossy(&test_support::ws::output_of(&frames)).into_owned();
    for (name, value) in [
        ("API_KEY", OPERATOR_KEY),
        ("SALT", OPERATOR_DOLLARS),
        ("APP_TOKEN", token.as_str()),
        ("MODE", CLIENT_VALUE),
    ] {
        let line = format!("{name}={value}");
        assert!(
            output.lines().any(|l| l.trim_end_matches('\r') == line),
            "{line}: {output}"
        );
    }
    // The session ended by itself: its Secret goes with its pod.
    runner.wait_terminal(&id).await;
    sim.wait_for_deletion("secrets", NS, &secrets[0], test_support::WAIT)
        .await
        .expect("the session's env Secret is deleted with it");
    runner.stop().await;
}

fn assert_hardened_container(container: &Container, read_only_root: bool) {
    let name = &container.name;
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false), "{name}");
    let capabilities = security.capabilities.as_ref().unwrap();
    assert_eq!(capabilities.drop, Some(vec!["ALL".to_owned()]), "{name}");
    assert_eq!(capabilities.add, None, "{name}");
    assert_ne!(security.privileged, Some(true), "{name}");
    if read_only_root {
        assert_eq!(security.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(security.run_as_non_root, Some(true), "{name}");
    }
}

#[tokio::test]
async fn session_pods_are_stored_hardened() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("agent.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: agent }\nfakeTelo:\n  echo: true\n",
    )
    .unwrap();
    let catalog = json!({"agent": {"image": "acme/agent:1"}}).to_string();
    let runner = Runner::start_kube(
        common::cluster().image("acme/agent:*", ImageBehaviour::FakeTeloEntry(manifest)),
        &[("RUNNER_APPS", catalog.as_str())],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    let run = runner.create(json!({"echo": true})).await;
    let (status, created) = runner
        .post("/v1/apps/agent/sessions", &json!({"env": {}}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let app = created["sessionId"].as_str().unwrap().to_owned();

    // A run pod: non-root, read-only root, no token, no capabilities,
    // RuntimeDefault seccomp, in every container.
    let pod = stored_pod(sim, &run).await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_ne!(spec.host_network, Some(true));
    assert_ne!(spec.host_pid, Some(true));
    assert_ne!(spec.host_ipc, Some(true));
    let pod_security = spec.security_context.as_ref().unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_ne!(pod_security.run_as_user, Some(0));
    assert_eq!(
        pod_security.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    assert_eq!(containers.len(), 2);
    for container in containers {
        assert_hardened_container(container, true);
    }
    for volume in spec.volumes.iter().flatten() {
        assert!(volume.host_path.is_none(), "{}", volume.name);
    }

    // An app pod runs its image's own user, but is otherwise as fenced.
    let pod = stored_pod(sim, &app).await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(
        spec.security_context
            .as_ref()
            .unwrap()
            .seccomp_profile
            .as_ref()
            .unwrap()
            .type_,
        "RuntimeDefault"
    );
    for container in &spec.containers {
        assert_hardened_container(container, false);
    }
    for id in [&run, &app] {
        let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    runner.stop().await;
}

/// With a token file, every route of the router refuses an anonymous caller,
/// except discovery (`/v1/health`, `/v1/capabilities`) and the cluster's
/// probes and scraper (`/livez`, `/readyz`, `/metrics`). Driven by `ROUTES`,
/// so a route added later is covered without touching this test.
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn with_a_token_file_only_discovery_and_probes_answer_anonymously(#[case] backend: Backend) {
    const OPEN: &[&str] = &[
        "/livez",
        "/readyz",
        "/metrics",
        "/v1/health",
        "/v1/capabilities",
        // The edge's token check: its credential is the session's own token.
        "/internal/sessions/{id}/access",
    ];
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let runner = Runner::start_on(
        backend,
        &[("RUNNER_AUTH_TOKENS_FILE", tokens.to_str().unwrap())],
    )
    .await;
    // Serving comes before being ready (a boot adopts what a previous
    // runner left): `/readyz` is asserted open once there is nothing left
    // to wait for, not raced against the boot.
    common::watch::ready(&runner.url("")).await;
    let created: Value = runner
        .client
        .post(runner.url("/v1/sessions"))
        .bearer_auth(TOKEN)
        .json(&start_body(json!({"echo": true})))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let start = start_body(json!({"exitCode": 0}));

    let mut checked = 0;
    for route in runner_core::http::ROUTES {
        let path = route.path.replace("{id}", &id).replace("{name}", "demo");
        for method in route.methods {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            let mut variants = vec![
                path.clone(),
                format!("{path}?access_token=wrong"),
                format!("{path}/"),
            ];
            if path.starts_with("/v1/") {
                variants.push(path.replacen("/v1/", "/v1//", 1));
                variants.push(path.replacen("/v1/", "//v1/", 1));
                variants.push(path.replacen("/v1/", "/v1/health/../", 1));
                variants.push(path.replacen("/v1/", "/%76%31/", 1));
            }
            for (index, target) in variants.iter().enumerate() {
                let mut request = runner.client.request(method.clone(), runner.url(target));
                if method == Method::POST {
                    request = request.json(&start);
                }
                let response = request.send().await.unwrap();
                let status = response.status();
                let what = format!("{method} {target}");
                if index == 0 && OPEN.contains(&route.path) {
                    assert!(status.is_success(), "{what} stays open: {status}");
                } else if index == 0 {
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
                } else if !OPEN.contains(&route.path) {
                    // A spelling of a gated route is refused or unknown,
                    // never served.
                    assert!(
                        status == StatusCode::UNAUTHORIZED || status == StatusCode::NOT_FOUND,
                        "{what}: {status}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 40, "{checked}");
    // An anonymous caller did not stop the session either.
    let (status, session) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{session}");
    let session: Value = runner
        .client
        .get(runner.url(&format!("/v1/sessions/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(session["status"]["kind"], json!("stopped"), "{session}");
    let response = runner
        .client
        .delete(runner.url(&format!("/v1/sessions/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    runner.stop().await;
}
