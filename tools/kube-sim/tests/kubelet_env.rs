//! What a container is given to run with: its environment from literal
//! values, pod fields, ConfigMaps and Secrets, the kubelet's refusal while a
//! referenced key is missing, and a stored pod the kubelet cannot read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::*;

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn waiting(p: &Pod) -> Option<(String, String)> {
    let w = p.status.as_ref()?.container_statuses.as_ref()?[0]
        .state
        .as_ref()?
        .waiting
        .as_ref()?;
    Some((w.reason.clone()?, w.message.clone().unwrap_or_default()))
}

fn seed_sources(sim: &kube_sim::KubeSim) {
    sim.seed_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings"},
        "data": {"mode": "fast"},
    }))
    .unwrap();
    sim.seed_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds"},
        // "s3cret"
        "data": {"token": "czNjcmV0"},
    }))
    .unwrap();
}

fn shell_pod(name: &str, script: &str, env: Value, env_from: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "telorun/node:24",
                "command": ["sh", "-c", script], "env": env, "envFrom": env_from}],
        }
    })
}

#[tokio::test]
async fn env_comes_from_values_pod_fields_configmaps_and_secrets() {
    let sim = sim().await;
    seed_sources(&sim);
    let env = json!([
        {"name": "GREETING", "value": "hello"},
        {"name": "SAY", "value": "$(GREETING) world"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": true}}},
    ]);
    let env_from = json!([{"prefix": "CM_", "configMapRef": {"name": "settings"}}]);
    let script = r#"echo "$SAY|$POD|$APP|$MODE|$TOKEN|$CM_mode|${OPT-unset}|$IP""#;
    sim.seed_value(shell_pod("envpod", script, env, env_from))
        .unwrap();
    sim.wait_for::<Pod>("default", "envpod", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let logs = pods.logs("envpod", &LogParams::default()).await.unwrap();
    let (fixed, ip) = logs.trim_end().rsplit_once('|').unwrap();
    assert_eq!(fixed, "hello world|envpod|demo|fast|s3cret|fast|unset");
    assert!(is_pod_ip(&sim, ip), "{logs}");
}

#[tokio::test]
async fn a_missing_secret_key_holds_the_container_until_the_key_exists() {
    let sim = sim().await;
    seed_sources(&sim);
    let env = json!([
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "later"}}},
    ]);
    sim.seed_value(shell_pod("keyless", "echo \"$KEY\"", env, json!([])))
        .unwrap();
    let held = sim
        .wait_for::<Pod>(
            "default",
            "keyless",
            |p| waiting(p).is_some_and(|(r, _)| r == "CreateContainerConfigError"),
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(
        waiting(&held).unwrap().1,
        "couldn't find key later in Secret default/creds"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(sim.client(), "default");
    secrets
        .patch(
            "creds",
            &PatchParams::default(),
            // "now"
            &Patch::Merge(json!({"data": {"later": "bm93"}})),
        )
        .await
        .unwrap();
    sim.wait_for::<Pod>("default", "keyless", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let logs = pods.logs("keyless", &LogParams::default()).await.unwrap();
    assert_eq!(logs, "now\n");
}

/// A Secret that does not exist yet holds the container, as a kubelet
/// does, with its message; once it exists the container starts and gets
/// the value as stored — a value read from a Secret is never expanded.
#[tokio::test]
async fn a_missing_secret_holds_the_container_until_it_exists() {
    let sim = sim().await;
    let env = json!([
        {"name": "HOME", "value": "/home/x"},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "later", "key": "k"}}},
        {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "never", "key": "k", "optional": true}}},
    ]);
    sim.seed_value(shell_pod(
        "secretless",
        "echo \"$KEY|${GONE-unset}\"",
        env,
        json!([]),
    ))
    .unwrap();
    let held = sim
        .wait_for::<Pod>(
            "default",
            "secretless",
            |p| waiting(p).is_some_and(|(r, _)| r == "CreateContainerConfigError"),
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(waiting(&held).unwrap().1, "secret \"later\" not found");
    assert_eq!(phase(&held), "Pending");
    sim.seed_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "later"},
        // "pa$$ $(HOME)"
        "data": {"k": "cGEkJCAkKEhPTUUp"},
    }))
    .unwrap();
    sim.wait_for::<Pod>("default", "secretless", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let logs = pods
        .logs("secretless", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(logs, "pa$$ $(HOME)|unset\n");
}

#[tokio::test]
async fn a_stored_pod_the_kubelet_cannot_read_fails_with_the_reason() {
    let sim = sim().await;
    // The apiserver's checks do not look at `command`'s type; the kubelet,
    // reading the pod as a Pod, cannot take a string for a list.
    let mut pod = shell_pod("unreadable", "true", json!([]), json!([]));
    pod["spec"]["containers"][0]["command"] = json!("true");
    sim.seed_value(pod).unwrap();
    let failed = sim
        .wait_for_value(
            "pods",
            "default",
            "unreadable",
            |p| p.pointer("/status/phase") == Some(&json!("Failed")),
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(failed["status"]["reason"], "InvalidPodSpec");
    let message = failed["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the kubelet could not read the pod spec: "),
        "{message}"
    );
}

#[tokio::test]
async fn command_and_args_see_the_containers_declared_variables_expanded() {
    let sim = sim().await;
    let env = json!([
        {"name": "GREETING", "value": "hello"},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]);
    // `$(GREETING)` and `$(IP)` are the kubelet's to expand; `$$(GREETING)`
    // is an escaped reference, `$(HOST)` names nothing the container
    // declares (kube-sim's own process variable) and stays as written.
    let mut pod = shell_pod("argpod", "echo \"$0|$1|$2|$3\"", env, json!([]));
    pod["spec"]["containers"][0]["args"] =
        json!(["$(GREETING)", "$$(GREETING)", "$(HOST)", "$(IP)"]);
    sim.seed_value(pod).unwrap();
    sim.wait_for::<Pod>("default", "argpod", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let logs = pods.logs("argpod", &LogParams::default()).await.unwrap();
    let (fixed, ip) = logs.trim_end().rsplit_once('|').unwrap();
    assert_eq!(fixed, "hello|$(GREETING)|$(HOST)");
    assert!(is_pod_ip(&sim, ip), "{logs}");
}
