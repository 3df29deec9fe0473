//! The boot sweep of env Secrets against kube-sim: what a dead runner left
//! unowned is tied to its pod or deleted; everything else is left alone.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube_sim::{ImageBehaviour, KubeSim};
use runner_k8s::pod::env_secret::{EnvSecrets, PodEnvSecret};
use serde_json::{Value, json};

const NS: &str = "telo-sessions";
const MANAGED_BY: &str = "telo-k8s-runner";
const WAIT: Duration = Duration::from_secs(15);

/// An env Secret as the runner stores it for pod `pod` of session `id`.
fn env_secret(id: &str, pod: &str, name: &str) -> Secret {
    let mut secret = PodEnvSecret::named(name);
    secret.refer("session", "API_KEY", "operator-key");
    secret.manifest(MANAGED_BY, id, pod)
}

/// A pod that reads its env from `secret` (or from nothing).
fn pod(name: &str, secret: Option<&str>) -> Pod {
    let env = match secret {
        Some(secret) => {
            json!([{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": "session.0"}}}])
        }
        None => json!([{"name": "API_KEY", "value": "plain"}]),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "session", "image": "idle:1", "env": env}]},
    }))
    .unwrap()
}

fn owner_uid(secret: &Value) -> &Value {
    &secret["metadata"]["ownerReferences"][0]["uid"]
}

#[tokio::test]
async fn unowned_secrets_are_tied_to_the_pod_that_reads_them_or_deleted() {
    let sim = KubeSim::builder()
        .namespace(NS)
        .image("idle:*", ImageBehaviour::Virtual)
        .start()
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(sim.client(), NS);
    let pods: Api<Pod> = Api::namespaced(sim.client(), NS);
    let create = async |secret: Secret| {
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    };

    // Its pod reads it: tied to that pod.
    let reader = "telo-run-aaaaaaaaaaaa-env-00000001";
    let live = pods
        .create(
            &PostParams::default(),
            &pod("telo-run-aaaaaaaaaaaa", Some(reader)),
        )
        .await
        .unwrap();
    create(env_secret("aaaaaaaaaaaa", "telo-run-aaaaaaaaaaaa", reader)).await;
    // Its pod never came: deleted.
    let orphan = "telo-run-bbbbbbbbbbbb-env-00000002";
    create(env_secret("bbbbbbbbbbbb", "telo-run-bbbbbbbbbbbb", orphan)).await;
    // A pod of that name reads another Secret (a later pod of a watch
    // session): deleted.
    let stale = "telo-watch-cccccccccccc-env-00000003";
    pods.create(
        &PostParams::default(),
        &pod("telo-watch-cccccccccccc", None),
    )
    .await
    .unwrap();
    create(env_secret("cccccccccccc", "telo-watch-cccccccccccc", stale)).await;
    // A session this runner is starting: left alone.
    let starting = "telo-run-dddddddddddd-env-00000004";
    create(env_secret(
        "dddddddddddd",
        "telo-run-dddddddddddd",
        starting,
    ))
    .await;
    // Another runner's: left alone.
    let foreign = "telo-run-eeeeeeeeeeee-env-00000005";
    let mut theirs = env_secret("eeeeeeeeeeee", "telo-run-eeeeeeeeeeee", foreign);
    theirs.metadata.labels.as_mut().unwrap().insert(
        "app.kubernetes.io/managed-by".into(),
        "another-runner".into(),
    );
    create(theirs).await;
    // Not an env Secret at all (an operator's own): left alone.
    let operators: Secret = serde_json::from_value(json!({
        "metadata": {"name": "regcred", "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
        "data": {"k": "dg=="},
    }))
    .unwrap();
    create(operators).await;

    let sweep = EnvSecrets::new(secrets.clone(), pods.clone(), MANAGED_BY.to_owned());
    let held: runner_core::HeldSessions = Arc::new(|id: &str| id == "dddddddddddd");
    sweep.sweep(&held).await;

    let tied = sim.get_value("secrets", NS, reader).unwrap();
    assert_eq!(owner_uid(&tied), &json!(live.metadata.uid.clone().unwrap()));
    for gone in [orphan, stale] {
        assert!(sim.get_value("secrets", NS, gone).is_none(), "{gone}");
    }
    for kept in [starting, foreign, "regcred"] {
        let secret = sim.get_value("secrets", NS, kept).unwrap();
        assert!(owner_uid(&secret).is_null(), "{secret}");
    }

    // A second sweep changes nothing, and the tied Secret goes with its pod.
    sweep.sweep(&held).await;
    assert!(sim.get_value("secrets", NS, reader).is_some());
    pods.delete(
        "telo-run-aaaaaaaaaaaa",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    sim.wait_for_deletion("secrets", NS, reader, WAIT)
        .await
        .unwrap();
    sim.shutdown().await;
}
