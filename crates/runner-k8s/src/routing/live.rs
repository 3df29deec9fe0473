//! Ports an app's kernel resolves while a watch session runs, published
//! live: the session's Service and Ingress or HTTPRoute are replaced with
//! the new port set (the pod stays), as the reference runner does.

use std::sync::{Arc, Mutex};

use runner_core::backend_session::PortRouter;
use runner_core::sync::lock;
use runner_core::tasks::OwnedTasks;
use runner_core::types::{PortMapping, RunnerEndpoint};
use tokio_util::sync::CancellationToken;

use super::SessionRouter;
use super::endpoints::endpoints_for;

/// One watch pod's routes, republished whenever its apps' ports change.
pub struct LivePorts {
    router: Arc<SessionRouter>,
    session_id: String,
    pod_name: String,
    pod_uid: String,
    /// Published beside the apps' ports (the session's agent).
    fixed: Vec<PortMapping>,
    tasks: OwnedTasks,
    /// The pod's teardown: nothing is published for a pod going away.
    teardown: CancellationToken,
    /// The newest port set asked for; each publish takes the newest, one at
    /// a time, so an older set never lands after a newer one.
    latest: Arc<Mutex<Vec<PortMapping>>>,
    publishing: Arc<tokio::sync::Mutex<()>>,
}

impl LivePorts {
    pub fn new(
        router: Arc<SessionRouter>,
        session_id: &str,
        pod_name: &str,
        pod_uid: &str,
        fixed: Vec<PortMapping>,
        tasks: OwnedTasks,
        teardown: CancellationToken,
    ) -> Self {
        Self {
            router,
            session_id: session_id.to_owned(),
            pod_name: pod_name.to_owned(),
            pod_uid: pod_uid.to_owned(),
            fixed,
            tasks,
            teardown,
            latest: Arc::default(),
            publishing: Arc::default(),
        }
    }
}

impl PortRouter for LivePorts {
    fn ports_changed(&self, added: &[PortMapping], all: &[PortMapping]) -> Vec<RunnerEndpoint> {
        let mut wanted = all.to_vec();
        for port in &self.fixed {
            if !wanted.contains(port) {
                wanted.push(*port);
            }
        }
        *lock(&self.latest) = wanted;
        let (router, latest, publishing, teardown) = (
            self.router.clone(),
            self.latest.clone(),
            self.publishing.clone(),
            self.teardown.clone(),
        );
        let (session_id, pod_name, pod_uid) = (
            self.session_id.clone(),
            self.pod_name.clone(),
            self.pod_uid.clone(),
        );
        self.tasks.spawn(async move {
            let _turn = publishing.lock().await;
            let ports = lock(&latest).clone();
            tokio::select! {
                () = teardown.cancelled() => {}
                _ = router.publish_session(&session_id, &ports, &pod_name, &pod_uid) => {}
            }
        });
        endpoints_for(Some(self.router.base_domain()), &self.session_id, added)
    }
}
