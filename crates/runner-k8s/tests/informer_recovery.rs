//! Every shared informer recovers from an apiserver failure the same way,
//! against kube-sim: the failure makes it unready with a client-safe reason,
//! and once the apiserver answers again it is ready without any object having
//! to change (a quiet cluster). Pods and both routing kinds run the one
//! informer, so one helper drives them all.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::core::ApiResource;
use kube_sim::KubeSim;
use kube_sim::faults::{FailRule, FaultCommand};
use rstest::rstest;
use runner_core::metrics::Counter;
use runner_k8s::cluster::informer::Health;
use runner_k8s::pod::informer::PodInformer;
use runner_k8s::routing::gateway::http_route_resource;
use runner_k8s::routing::informer::RouteInformer;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound on waiting for a change that should come within a backoff.
const WAIT: Duration = Duration::from_secs(15);
const NAMESPACE: &str = "telo-sessions";
const MANAGED_BY: &str = "telo-k8s-runner";
const REFUSAL: &str = "the Kubernetes API rejected the request (InternalError, HTTP 500)";

/// One running shared informer: what it says about its health, how often it
/// restarted, and the task to join once `stop` fires.
struct Running {
    health: watch::Receiver<Health>,
    restarts: Counter,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    fn spawn(sim: &KubeSim, resource: &str) -> Self {
        let client = sim.client();
        let restarts = Counter::default();
        let stop = CancellationToken::new();
        let route = |api_resource: ApiResource| {
            let api = Api::namespaced_with(client.clone(), NAMESPACE, &api_resource);
            let (informer, task) = RouteInformer::spawn(
                api,
                api_resource,
                MANAGED_BY,
                restarts.clone(),
                stop.clone(),
            );
            (informer.health(), task)
        };
        let (health, task) = match resource {
            "pods" => {
                let (informer, task) = PodInformer::spawn(
                    client.clone(),
                    NAMESPACE,
                    MANAGED_BY,
                    restarts.clone(),
                    stop.clone(),
                );
                (informer.health(), task)
            }
            "ingresses" => route(ApiResource::erase::<Ingress>(&())),
            "httproutes" => route(http_route_resource("v1")),
            other => panic!("no shared informer follows {other}"),
        };
        Self {
            health,
            restarts,
            stop,
            task,
        }
    }

    /// Waits (bounded) until the informer's readiness reason satisfies `want`,
    /// and returns it.
    async fn reason_until(
        &mut self,
        what: &str,
        want: impl Fn(Option<&str>) -> bool,
    ) -> Option<String> {
        let waited = tokio::time::timeout(
            WAIT,
            self.health
                .wait_for(|health| want(health.not_ready_reason().as_deref())),
        )
        .await
        .map(|health| health.unwrap().not_ready_reason());
        match waited {
            Ok(reason) => reason,
            Err(_) => panic!(
                "timed out waiting for {what}; last {:?}",
                *self.health.borrow()
            ),
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

#[rstest]
#[case::pods("pods", "the pod watch")]
#[case::ingresses("ingresses", "the route watch")]
#[case::httproutes("httproutes", "the route watch")]
#[tokio::test]
async fn a_failed_informer_is_unready_until_the_apiserver_answers_again(
    #[case] resource: &str,
    #[case] readyz_name: &str,
) {
    let sim = KubeSim::builder()
        .namespace(NAMESPACE)
        .gateway_api(true)
        .start()
        .await
        .unwrap();
    let mut running = Running::spawn(&sim, resource);
    running
        .reason_until("the first list", |reason| reason.is_none())
        .await;

    // Every request about the kind fails, and the open watch is cut: the
    // informer cannot resume or list again.
    sim.faults().apply(FaultCommand::FailNext(FailRule {
        verb: None,
        resource: Some(resource.to_owned()),
        count: 100_000,
        code: 500,
        message: Some("kube-sim injected: etcd audit-id 5f1c0de1".to_owned()),
    }));
    sim.faults().drop_watches();
    let failing = running
        .reason_until("the informer to fail", |reason| reason.is_some())
        .await;
    assert_eq!(
        failing,
        Some(format!("{readyz_name} is failing: {REFUSAL}"))
    );
    assert!(running.restarts.get() >= 1);

    // Nothing changes in the cluster; the next fresh list alone clears it.
    sim.faults().clear();
    running
        .reason_until("the informer to recover", |reason| reason.is_none())
        .await;
    assert!(running.health.borrow().synced);
    running.stop().await;
    sim.shutdown().await;
}
