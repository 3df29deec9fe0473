//! One informer over every session pod, shared by all sessions.
//!
//! The reference opened a field-selector watch per pod, so apiserver load grew
//! with the number of sessions. Here a single [`Informer`] follows the pods
//! carrying our managed-by label and hands each session the latest state of
//! its own pod through a `watch` channel. The informer's re-list after a gap
//! (expired resourceVersion, dropped connection) doubles as the reconcile: a
//! pod missing from the fresh list is reported gone.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use runner_core::metrics::Counter;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::informer::{Informer, KeyObjects, Kind, Subscriber};
use crate::pod::labels::{IDLE, POOL_LABEL, SESSION_ID_LABEL, STATE_LABEL};
use crate::pod::session_record::managed_by_selector;

/// What a session knows about its pod.
#[derive(Debug, Clone)]
pub enum PodState {
    /// Not seen yet (just created, or the informer has not caught up).
    Unknown,
    Present(Arc<Pod>),
    /// Deleted, or absent from a fresh list.
    Gone,
}

/// The shared pod informer: each session follows the pod labelled with its id,
/// each warm pool its idle pods.
pub type PodInformer = Informer<Pod, PodSubscriber>;

/// The idle warm pods of one pool, by name.
pub type KeyedPods = KeyObjects<Pod>;

/// Who follows a key of the pod informer.
pub enum PodSubscriber {
    /// A session: its one pod.
    Session(watch::Sender<PodState>),
    /// A warm pool: its idle pods.
    Pool(watch::Sender<KeyedPods>),
}

pub(crate) fn session_id_of(pod: &Pod) -> Option<String> {
    pod.metadata.labels.as_ref()?.get(SESSION_ID_LABEL).cloned()
}

/// A session's pod by its id; an idle warm pod by its pool (a key no
/// session id can be: ids have no `:`).
fn pod_key(pod: &Pod) -> Option<String> {
    session_id_of(pod).or_else(|| {
        let labels = pod.metadata.labels.as_ref()?;
        (labels.get(STATE_LABEL).map(String::as_str) == Some(IDLE))
            .then(|| {
                labels
                    .get(POOL_LABEL)
                    .map(|pool| pool_subscription_key(pool))
            })
            .flatten()
    })
}

fn pool_subscription_key(pool: &str) -> String {
    format!("warm:{pool}")
}

const PODS: Kind<Pod> = Kind {
    what: "pods",
    readyz_name: "the pod watch",
    listing: "session pods",
    key: pod_key,
    slim,
};

impl Subscriber<Pod> for PodSubscriber {
    fn update(&mut self, objects: &KeyObjects<Pod>) {
        match self {
            PodSubscriber::Session(session) => session.update(objects),
            PodSubscriber::Pool(pool) => {
                pool.send_replace(objects.clone());
            }
        }
    }
}

impl Subscriber<Pod> for watch::Sender<PodState> {
    fn update(&mut self, objects: &KeyObjects<Pod>) {
        match objects.values().next() {
            Some(pod) => {
                self.send_replace(PodState::Present(pod.clone()));
            }
            // A pod not seen yet stays unknown: a fresh list taken before it
            // was created says nothing about it.
            None => {
                self.send_if_modified(|state| {
                    let was_present = matches!(state, PodState::Present(_));
                    if was_present {
                        *state = PodState::Gone;
                    }
                    was_present
                });
            }
        }
    }
}

impl PodInformer {
    /// Start watching pods labelled `app.kubernetes.io/managed-by=<managed_by>`
    /// in `namespace` until `stop` fires; `restarts` counts re-established
    /// watches.
    pub fn spawn(
        client: Client,
        namespace: &str,
        managed_by: &str,
        restarts: Counter,
        stop: CancellationToken,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().labels(&managed_by_selector(managed_by));
        Self::start(api, config, PODS, restarts, stop)
    }

    /// Follow one session's pod. Register before creating the pod, so no
    /// event about it can be missed.
    pub fn subscribe(&self, session_id: &str) -> watch::Receiver<PodState> {
        self.with_subscriber(session_id, |pods, slot| {
            let initial = match pods.values().next() {
                Some(pod) => PodState::Present(pod.clone()),
                None => PodState::Unknown,
            };
            match slot.or_insert_with(|| PodSubscriber::Session(watch::Sender::new(initial))) {
                PodSubscriber::Session(sender) => sender.subscribe(),
                // Session ids and pool keys never share a key.
                PodSubscriber::Pool(_) => watch::Sender::new(PodState::Unknown).subscribe(),
            }
        })
    }

    /// Follow the idle pods of warm pool `pool` (its [`POOL_LABEL`] value).
    pub fn subscribe_pool(&self, pool: &str) -> watch::Receiver<KeyedPods> {
        self.with_subscriber(&pool_subscription_key(pool), |pods, slot| {
            match slot.or_insert_with(|| PodSubscriber::Pool(watch::Sender::new(pods.clone()))) {
                PodSubscriber::Pool(sender) => sender.subscribe(),
                PodSubscriber::Session(_) => watch::Sender::new(pods.clone()).subscribe(),
            }
        })
    }

    pub fn unsubscribe(&self, session_id: &str) {
        self.drop_subscriber(session_id);
    }

    /// Every session pod currently known (adoption at boot).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.objects()
    }
}

/// What the sessions read of a pod is its metadata and status; the spec (the
/// largest part, and the same for every session) and the field-manager
/// bookkeeping are dropped so each live session holds a few KiB, not tens.
fn slim(pod: &mut Pod) {
    pod.spec = None;
    pod.metadata.managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use kube::core::ObjectMeta;
    use kube::runtime::watcher::Event;

    fn pod(session_id: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("telo-run-{session_id}")),
                namespace: Some("sessions".into()),
                labels: Some([(SESSION_ID_LABEL.to_owned(), session_id.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            ..Pod::default()
        }
    }

    fn relist(pods: &PodInformer, listed: &[Pod]) {
        pods.apply(Event::Init);
        for pod in listed {
            pods.apply(Event::InitApply(pod.clone()));
        }
        pods.apply(Event::InitDone);
    }

    #[test]
    fn a_pod_absent_from_a_fresh_list_is_gone_and_one_not_created_yet_stays_unknown() {
        let pods = PodInformer::new(PODS, (), Counter::default());
        let listed = pods.subscribe("listed");
        let coming = pods.subscribe("coming");
        relist(&pods, &[pod("listed")]);
        let PodState::Present(present) = listed.borrow().clone() else {
            panic!("the listed pod is present");
        };
        assert!(present.spec.is_none(), "kept without its spec");
        assert!(matches!(*coming.borrow(), PodState::Unknown));
        assert_eq!(pods.pods().len(), 1);

        relist(&pods, &[]);
        assert!(matches!(*listed.borrow(), PodState::Gone));
        assert!(matches!(*coming.borrow(), PodState::Unknown));
        assert!(pods.pods().is_empty());

        pods.apply(Event::Apply(pod("coming")));
        assert!(matches!(*coming.borrow(), PodState::Present(_)));
        pods.apply(Event::Delete(pod("coming")));
        assert!(matches!(*coming.borrow(), PodState::Gone));
    }

    #[test]
    fn the_pod_watch_says_why_it_cannot_be_relied_on() {
        let pods = PodInformer::new(PODS, (), Counter::default());
        pods.failed(&crate::cluster::informer::tests::refused());
        assert_eq!(
            pods.not_ready_reason().as_deref(),
            Some(
                "the pod watch cannot list session pods (apiserver unreachable or refusing): \
                 the Kubernetes API rejected the request (InternalError, HTTP 500)"
            )
        );
    }
}
