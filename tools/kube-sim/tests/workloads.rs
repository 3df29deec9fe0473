//! Deployments and ReplicaSets: the controllers make and replace pods as
//! kube-controller-manager does, readiness probes decide when a pod counts
//! as available, and a rolling update keeps `maxUnavailable` and
//! `maxSurge`. Pods that mount a service account token reach the apiserver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube_sim::kubelet::images::ImageBehaviour;
use kube_sim::{KubeSim, PodNetwork};
use serde_json::{Value, json};
use support::*;

const NS: &str = "telo-runner";

/// Pods of their own address, so that every replica listens on one port.
async fn cluster() -> KubeSim {
    builder()
        .pod_network(PodNetwork::Isolated)
        .image("web:*", ImageBehaviour::Host)
        .start()
        .await
        .expect("kube-sim starts with an isolated pod network (run as root)")
}

/// A Deployment of `replicas` web servers on port 8080, ready once they
/// answer there.
fn deployment(replicas: i32, strategy: Value, listen: bool) -> Value {
    let script = if listen {
        // A plain TCP server: `http.server`'s own looks its address up in
        // DNS first, which a pod without a resolver waits on.
        "exec python3 -c 'import http.server, os, socketserver; \
         socketserver.TCPServer((os.environ[\"HOST\"], 8080), \
         http.server.SimpleHTTPRequestHandler).serve_forever()'"
    } else {
        "exec sleep 3600"
    };
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": replicas,
            "strategy": strategy,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "web", "image": "web:1",
                        "command": ["sh", "-c", script],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": "http"},
                                           "periodSeconds": 1, "failureThreshold": 1},
                    }],
                },
            },
        },
    })
}

/// Changes the Deployment's pod template: a new revision to roll out.
async fn new_revision(sim: &KubeSim) {
    Api::<Deployment>::namespaced(sim.client(), NS)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"annotations": {"revision": "2"}}}}}),
            ),
        )
        .await
        .unwrap();
}

fn rolling(surge: Value, unavailable: Value) -> Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
}

async fn rolled_out(sim: &KubeSim, replicas: i32) -> Deployment {
    let rolled = sim
        .wait_for::<Deployment>(
            NS,
            "web",
            |d| {
                let status = d.status.clone().unwrap_or_default();
                status.observed_generation == d.metadata.generation
                    && status.updated_replicas == Some(replicas)
                    && status.replicas == Some(replicas)
                    && status.available_replicas == Some(replicas)
            },
            WAIT,
        )
        .await;
    match rolled {
        Ok(d) => d,
        Err(err) => panic!(
            "the deployment did not roll out ({err}):\n{}",
            state(sim).await
        ),
    }
}

/// The Deployment, its ReplicaSets and pods as the apiserver has them.
async fn state(sim: &KubeSim) -> String {
    let deployment: Option<Deployment> = sim.get(NS, "web");
    let mut out = format!("{:?}\n", deployment.and_then(|d| d.status));
    let sets = Api::<ReplicaSet>::namespaced(sim.client(), NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for set in sets {
        out.push_str(&format!(
            "{:?}: spec {:?}, status {:?}\n",
            set.metadata.name,
            set.spec.and_then(|s| s.replicas),
            set.status
        ));
    }
    let pods = Api::<Pod>::namespaced(sim.client(), NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for pod in pods {
        out.push_str(&format!(
            "{:?}: ready {}, deleting {:?}, ip {:?}, containers {:?}\n",
            pod.metadata.name,
            is_ready(&pod),
            pod.metadata.deletion_timestamp,
            pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            pod.status
                .as_ref()
                .and_then(|s| s.container_statuses.clone()),
        ));
    }
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(sim.client(), NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for event in events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
    {
        out.push_str(&format!(
            "event {:?} {:?}: {:?} x{:?}\n",
            event.involved_object.name, event.reason, event.message, event.count
        ));
    }
    out
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn a_deployment_runs_its_replicas_and_counts_them_ready_by_their_probe() {
    let sim = cluster().await;
    sim.seed_value(deployment(3, rolling(json!(1), json!(0)), true))
        .unwrap();
    let rolled = rolled_out(&sim, 3).await;
    let conditions = rolled.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True"),
        "{conditions:?}"
    );
    let sets: Api<ReplicaSet> = Api::namespaced(sim.client(), NS);
    let sets = sets.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(sets.len(), 1);
    let set = &sets[0];
    let hash = set.metadata.labels.as_ref().unwrap()["pod-template-hash"].clone();
    assert_eq!(set.metadata.name.as_deref(), Some(&*format!("web-{hash}")));
    assert_eq!(
        set.metadata.owner_references.as_ref().unwrap()[0].kind,
        "Deployment"
    );
    let pods: Api<Pod> = Api::namespaced(sim.client(), NS);
    let pods = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(pods.len(), 3);
    let mut ips = Vec::new();
    for pod in &pods {
        assert!(is_ready(pod));
        assert!(
            pod.metadata
                .name
                .as_ref()
                .unwrap()
                .starts_with(&format!("web-{hash}-"))
        );
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()["pod-template-hash"],
            hash
        );
        ips.push(pod.status.as_ref().unwrap().pod_ip.clone().unwrap());
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "each replica has an address of its own");
    // A pod deleted from under the ReplicaSet is replaced.
    let victim = pods[0].metadata.name.clone().unwrap();
    Api::<Pod>::namespaced(sim.client(), NS)
        .delete(&victim, &Default::default())
        .await
        .unwrap();
    sim.wait_for_deletion("pods", NS, &victim, WAIT)
        .await
        .unwrap();
    rolled_out(&sim, 3).await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_container_whose_probe_fails_is_never_ready_and_says_why() {
    let sim = cluster().await;
    sim.seed_value(deployment(1, rolling(json!(1), json!(0)), false))
        .unwrap();
    let events: Api<Event> = Api::namespaced(sim.client(), NS);
    let message = tokio::time::timeout(WAIT, async {
        loop {
            let listed = events.list(&ListParams::default()).await.unwrap().items;
            if let Some(event) = listed
                .iter()
                .find(|e| e.reason.as_deref() == Some("Unhealthy"))
            {
                return event.message.clone().unwrap();
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("an Unhealthy event");
    assert!(message.starts_with("Readiness probe failed: "), "{message}");
    let pods = Api::<Pod>::namespaced(sim.client(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(pods.len(), 1);
    assert!(!is_ready(&pods[0]));
    let running = pods[0]
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .running
        .is_some();
    assert!(running, "running, only not ready");
    let deployment: Deployment = sim.get(NS, "web").unwrap();
    let status = deployment.status.unwrap();
    assert_eq!(status.available_replicas, None);
    assert_eq!(status.unavailable_replicas, Some(1));
    sim.shutdown().await;
}

/// What a watch of the namespace's pods saw at its worst moment.
#[derive(Default)]
struct Extremes {
    fewest_ready: Option<usize>,
    most_pods: usize,
}

#[tokio::test]
async fn a_rolling_update_keeps_its_replicas_ready_and_within_the_surge() {
    let sim = cluster().await;
    sim.seed_value(deployment(3, rolling(json!(1), json!(0)), true))
        .unwrap();
    rolled_out(&sim, 3).await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), NS);
    let extremes = Arc::new(Mutex::new(Extremes::default()));
    let watching = {
        let extremes = extremes.clone();
        let mut seen: HashMap<String, Pod> = HashMap::new();
        let stream = watcher(pods.clone(), watcher::Config::default());
        tokio::spawn(async move {
            let mut listed = false;
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(event)) = stream.next().await {
                match event {
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                        seen.insert(pod.metadata.name.clone().unwrap(), pod);
                    }
                    watcher::Event::Delete(pod) => {
                        seen.remove(pod.metadata.name.as_ref().unwrap());
                    }
                    watcher::Event::Init => {}
                    watcher::Event::InitDone => listed = true,
                }
                if !listed {
                    continue;
                }
                let serving: Vec<&Pod> = seen
                    .values()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .collect();
                let ready = serving.iter().filter(|p| is_ready(p)).count();
                let mut e = extremes.lock().unwrap();
                e.fewest_ready = Some(e.fewest_ready.map_or(ready, |f| f.min(ready)));
                e.most_pods = e.most_pods.max(serving.len());
            }
        })
    };
    let before: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    new_revision(&sim).await;
    // Rolled out once the new template's three pods are what is left.
    let replaced = tokio::time::timeout(WAIT, async {
        loop {
            let rolled = rolled_out(&sim, 3).await;
            let listed = pods.list(&ListParams::default()).await.unwrap().items;
            if rolled.status.unwrap().observed_generation == Some(2)
                && listed.len() == 3
                && listed
                    .iter()
                    .all(|p| !before.contains(p.metadata.name.as_ref().unwrap()))
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    if replaced.is_err() {
        panic!("not every old pod was replaced:\n{}", state(&sim).await);
    }
    watching.abort();
    let _ = watching.await;
    let (fewest_ready, most_pods) = {
        let extremes = extremes.lock().unwrap();
        (extremes.fewest_ready, extremes.most_pods)
    };
    assert_eq!(fewest_ready, Some(3), "maxUnavailable 0");
    assert_eq!(most_pods, 4, "maxSurge 1");
    let sets: Api<ReplicaSet> = Api::namespaced(sim.client(), NS);
    let sets = sets.list(&ListParams::default()).await.unwrap().items;
    let mut revisions: Vec<(String, i32)> = sets
        .iter()
        .map(|s| {
            (
                s.metadata.annotations.as_ref().unwrap()["deployment.kubernetes.io/revision"]
                    .clone(),
                s.spec.as_ref().unwrap().replicas.unwrap(),
            )
        })
        .collect();
    revisions.sort();
    assert_eq!(revisions, [("1".to_owned(), 0), ("2".to_owned(), 3)]);
    sim.shutdown().await;
}

#[tokio::test]
async fn recreate_stops_every_old_pod_before_a_new_one_starts() {
    let sim = cluster().await;
    sim.seed_value(deployment(2, json!({"type": "Recreate"}), true))
        .unwrap();
    rolled_out(&sim, 2).await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), NS);
    let old: Vec<Pod> = pods.list(&ListParams::default()).await.unwrap().items;
    new_revision(&sim).await;
    for pod in &old {
        sim.wait_for_deletion("pods", NS, pod.metadata.name.as_ref().unwrap(), WAIT)
            .await
            .unwrap();
    }
    rolled_out(&sim, 2).await;
    let new: Vec<Pod> = pods.list(&ListParams::default()).await.unwrap().items;
    let last_old_end = old
        .iter()
        .map(|p| p.metadata.creation_timestamp.clone().unwrap().0)
        .max()
        .unwrap();
    for pod in &new {
        assert!(pod.metadata.creation_timestamp.clone().unwrap().0 > last_old_end);
        assert!(!old.iter().any(|o| o.metadata.name == pod.metadata.name));
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn a_pod_with_a_service_account_token_reaches_the_apiserver_and_others_do_not() {
    let sim = cluster().await;
    let script = "curl -sS -o /dev/null -w '%{http_code}' -k \
                  -H \"Authorization: Bearer $(sed -n 's/^ *token: //p' \"$KUBECONFIG\")\" \
                  \"$(sed -n 's/^ *server: //p' \"$KUBECONFIG\")/api/v1/namespaces/telo-runner/pods\"; \
                  echo; echo \"kubeconfig=${KUBECONFIG:-none}\"";
    for (name, automount) in [("with-token", true), ("without-token", false)] {
        sim.seed_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": automount,
                     "containers": [{"name": "c", "image": "web:1", "command": ["sh", "-c", script]}]},
        }))
        .unwrap();
    }
    let with = logs_when_done(&sim, "with-token").await;
    assert!(with.starts_with("200\n"), "{with}");
    let without = logs_when_done(&sim, "without-token").await;
    assert!(without.contains("kubeconfig=none"), "{without}");
    sim.shutdown().await;
}

async fn logs_when_done(sim: &KubeSim, name: &str) -> String {
    sim.wait_for::<Pod>(
        NS,
        name,
        |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"),
        WAIT,
    )
    .await
    .unwrap();
    Api::<Pod>::namespaced(sim.client(), NS)
        .logs(name, &Default::default())
        .await
        .unwrap()
}
