//! Several replicas against kube-sim: a session is claimed by exactly one
//! survivor, never from a live peer, and a replica cut off from the
//! apiserver stops acting before any peer could claim its sessions.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use kube_sim::KubeSim;
use runner_core::metrics::{Counter, Metrics};
use runner_core::replicas::{Owner, Replicas};
use runner_core::tasks::OwnedTasks;
use runner_k8s::config::{PeerTokenText, ReplicationConfig};
use runner_k8s::pod::informer::PodInformer;
use runner_k8s::replica::{Claim, KubeReplicas};
use serde_json::json;
use test_support::relay::Relay;

const WAIT: Duration = Duration::from_secs(15);
const NAMESPACE: &str = "telo-sessions";
const MANAGED_BY: &str = "telo-k8s-runner";
const LEASE: Duration = Duration::from_secs(3);

struct Replica {
    replicas: Arc<KubeReplicas>,
    tasks: OwnedTasks,
}

impl Replica {
    async fn start(client: kube::Client, id: &str) -> Replica {
        Self::start_with_lease(client, id, LEASE).await
    }

    async fn start_with_lease(client: kube::Client, id: &str, lease: Duration) -> Replica {
        let tasks = OwnedTasks::new();
        let (pods, pod_task) = PodInformer::spawn(
            client.clone(),
            NAMESPACE,
            MANAGED_BY,
            Counter::default(),
            tasks.stopping(),
        );
        tasks.adopt(pod_task);
        let replicas = KubeReplicas::spawn(
            &ReplicationConfig {
                id: id.to_owned(),
                url: format!("http://{id}.invalid:8062"),
                token: PeerTokenText("x".repeat(32)),
                lease_duration: lease,
            },
            &client,
            "default",
            NAMESPACE,
            true,
            MANAGED_BY,
            pods.clone(),
            &Metrics::new(),
            &tasks,
        );
        pods.wait_synced().await;
        replicas.wait_synced().await;
        let replica = Replica { replicas, tasks };
        replica
            .until("was ready", |r| r.not_ready_reason().is_none())
            .await;
        replica
    }

    async fn until(&self, what: &str, condition: impl Fn(&KubeReplicas) -> bool) {
        tokio::time::timeout(WAIT, async {
            while !condition(&self.replicas) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{} never {what}", self.replicas.id()));
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.tasks.stop();
    }
}

async fn sim() -> KubeSim {
    KubeSim::builder()
        .namespace(NAMESPACE)
        .start()
        .await
        .unwrap()
}

/// A session pod (no container runs: the simulator has no fake-telo)
/// that names `owner`.
async fn session_pod(sim: &KubeSim, session_id: &str, owner: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(sim.client(), NAMESPACE);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": format!("telo-run-{session_id}"),
            "labels": {
                "app.kubernetes.io/managed-by": MANAGED_BY,
                "telo.run/session-id": session_id,
            },
            "annotations": {"telo.run/replica": owner},
        },
        "spec": {"containers": [{"name": "session", "image": "telorun/node:0-slim"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap()
}

fn owner_of(pod: &Pod) -> String {
    pod.metadata.annotations.as_ref().unwrap()["telo.run/replica"].clone()
}

#[tokio::test]
async fn two_survivors_racing_for_a_session_leave_exactly_one_owner() {
    let sim = sim().await;
    let a = Replica::start(sim.client(), "replica-a").await;
    let b = Replica::start(sim.client(), "replica-b").await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), NAMESPACE);
    for round in 0..20 {
        // Named by a replica that holds no Lease: anyone's to claim.
        let pod = session_pod(&sim, &format!("race{round:02}"), "replica-gone").await;
        let (claim_a, claim_b) = tokio::join!(
            a.replicas.claim(&pods, &pod.metadata),
            b.replicas.claim(&pods, &pod.metadata),
        );
        let winners = [&claim_a, &claim_b]
            .iter()
            .filter(|claim| ***claim == Claim::Mine)
            .count();
        assert_eq!(winners, 1, "round {round}: {claim_a:?} {claim_b:?}");
        let stored = pods
            .get(pod.metadata.name.as_deref().unwrap())
            .await
            .unwrap();
        let winner = if claim_a == Claim::Mine {
            "replica-a"
        } else {
            "replica-b"
        };
        assert_eq!(owner_of(&stored), winner);
    }
    drop((a, b));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_live_peer_keeps_its_sessions_and_requests_go_to_it() {
    let sim = sim().await;
    let a = Replica::start(sim.client(), "replica-a").await;
    let b = Replica::start(sim.client(), "replica-b").await;
    a.until("saw its peer", |r| r.peers().len() == 1).await;
    let pod = session_pod(&sim, "peerowned01", "replica-b").await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), NAMESPACE);
    assert_eq!(a.replicas.claim(&pods, &pod.metadata).await, Claim::Theirs);
    assert_eq!(b.replicas.claim(&pods, &pod.metadata).await, Claim::Mine);
    a.until("saw the pod", |r| r.owner("peerowned01") != Owner::Here)
        .await;
    match a.replicas.owner("peerowned01") {
        Owner::Peer(peer) => {
            assert_eq!(peer.id, "replica-b");
            assert_eq!(peer.url, "http://replica-b.invalid:8062");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(b.replicas.owner("peerowned01"), Owner::Recorded);
    drop((a, b));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_replica_cut_off_from_the_apiserver_stops_acting_before_a_peer_may_claim() {
    let sim = sim().await;
    let relay = Relay::start(sim.addr().ip(), vec![sim.addr()]).await;
    let cut_off = Replica::start(sim.client_via(relay.addr()), "replica-a").await;
    let peer = Replica::start(sim.client(), "replica-b").await;
    cut_off.until("renewed its Lease", |r| r.may_act()).await;
    peer.until("saw its peer alive", |r| r.peers().len() == 1)
        .await;
    let pod = session_pod(&sim, "fenced0001", "replica-a").await;
    peer.until("saw the pod", |r| r.owner("fenced0001") != Owner::Here)
        .await;

    relay.cut();
    let pods: Api<Pod> = Api::namespaced(sim.client(), NAMESPACE);
    // Until the cut-off replica has stopped acting, its peer must not be
    // able to claim: it is still alive as far as anyone can tell.
    loop {
        if !cut_off.replicas.may_act() {
            break;
        }
        assert_eq!(
            peer.replicas.claim(&pods, &pod.metadata).await,
            Claim::Theirs,
            "claimed while the owner could still act"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Then the Lease lapses and the peer takes the session.
    peer.until("saw the Lease lapse", |r| {
        matches!(r.owner("fenced0001"), Owner::Moving { .. })
    })
    .await;
    assert_eq!(peer.replicas.claim(&pods, &pod.metadata).await, Claim::Mine);
    assert_eq!(
        owner_of(&pods.get("telo-run-fenced0001").await.unwrap()),
        "replica-b"
    );

    // Reconnected, the first replica renews and may act again, but the
    // session stays with its new owner.
    relay.restore();
    cut_off.until("renewed again", |r| r.may_act()).await;
    cut_off
        .until(
            "saw the new owner",
            |r| matches!(r.owner("fenced0001"), Owner::Peer(ref p) if p.id == "replica-b"),
        )
        .await;
    drop((cut_off, peer));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_replica_whose_renewals_answer_later_than_their_period_keeps_acting() {
    use k8s_openapi::api::coordination::v1::Lease;
    let sim = sim().await;
    // A longer Lease than the other tests', so that the margins below are
    // a third of a second rather than a tenth.
    let lease = Duration::from_secs(10);
    let replica = Replica::start_with_lease(sim.client(), "replica-slow", lease).await;
    replica.until("renewed its Lease", |r| r.may_act()).await;
    let renew_time = || {
        sim.get::<Lease>("default", "telo-runner-replica-replica-slow")
            .and_then(|lease| lease.spec?.renew_time)
            .map(|t| t.0)
    };
    // Every answer takes longer than the period between renewals (a third
    // of the Lease), yet each lands before the last one's four fifths are
    // up, so the replica never has to stop acting.
    sim.faults().set_latency(lease * 11 / 30);
    let mut renewals = vec![renew_time()];
    tokio::time::timeout(lease * 2, async {
        while renewals.len() < 4 {
            assert!(
                replica.replicas.may_act(),
                "stopped acting though every renewal landed in time"
            );
            let now = renew_time();
            if renewals.last() != Some(&now) {
                renewals.push(now);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the Lease was renewed under the latency");
    sim.faults().clear();
    drop(replica);
    sim.shutdown().await;
}
