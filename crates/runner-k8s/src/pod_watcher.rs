//! One watch over every session pod, shared by all sessions.
//!
//! The reference opened a field-selector watch per pod, so apiserver load grew
//! with the number of sessions. Here a single `kube::runtime::watcher` follows
//! the pods carrying our managed-by label and hands each session the latest
//! state of its own pod through a `watch` channel. The watcher's re-list after a
//! gap (expired resourceVersion, dropped connection) doubles as the reconcile:
//! a pod missing from the fresh list is reported gone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use runner_core::metrics::Counter;
use runner_core::sync::lock;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::api_error::watcher_reason;
use crate::pod_spec::SESSION_ID_LABEL;
use crate::watch_loop::follow;

/// What a session knows about its pod.
#[derive(Debug, Clone)]
pub enum PodState {
    /// Not seen yet (just created, or the watch has not caught up).
    Unknown,
    Present(Arc<Pod>),
    /// Deleted, or absent from a fresh list.
    Gone,
}

#[derive(Default)]
struct Shared {
    /// Latest pod per session id, as last listed or watched.
    pods: HashMap<String, Arc<Pod>>,
    subscribers: HashMap<String, watch::Sender<PodState>>,
    /// Session ids seen during a re-list in progress.
    relisting: Option<HashSet<String>>,
    /// Why the watch last failed, client-safe; cleared by the next event.
    read_error: Option<String>,
}

pub struct PodWatcher {
    shared: Mutex<Shared>,
    synced: watch::Sender<bool>,
    restarts: Counter,
}

fn session_id_of(pod: &Pod) -> Option<String> {
    pod.metadata.labels.as_ref()?.get(SESSION_ID_LABEL).cloned()
}

impl PodWatcher {
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
        let watcher = Arc::new(Self {
            shared: Mutex::new(Shared::default()),
            synced: watch::Sender::new(false),
            restarts,
        });
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let config = watcher::Config::default()
            .labels(&format!("app.kubernetes.io/managed-by={managed_by}"));
        let task = {
            let watcher = watcher.clone();
            let restarts = watcher.restarts.clone();
            tokio::spawn(async move {
                let start = || {
                    watcher::watcher(api.clone(), config.clone())
                        .default_backoff()
                        .boxed()
                };
                follow(
                    "pods",
                    start,
                    restarts,
                    stop,
                    |event| watcher.apply(event),
                    |err| lock(&watcher.shared).read_error = Some(watcher_reason(err)),
                )
                .await;
            })
        };
        (watcher, task)
    }

    fn apply(&self, event: Event<Pod>) {
        let mut shared = lock(&self.shared);
        shared.read_error = None;
        match event {
            Event::Apply(pod) | Event::InitApply(pod) => {
                let Some(id) = session_id_of(&pod) else {
                    return;
                };
                if let Some(seen) = shared.relisting.as_mut() {
                    seen.insert(id.clone());
                }
                let pod = Arc::new(slim(pod));
                shared.pods.insert(id.clone(), pod.clone());
                if let Some(tx) = shared.subscribers.get(&id) {
                    tx.send_replace(PodState::Present(pod));
                }
            }
            Event::Delete(pod) => {
                let Some(id) = session_id_of(&pod) else {
                    return;
                };
                shared.pods.remove(&id);
                if let Some(tx) = shared.subscribers.get(&id) {
                    tx.send_replace(PodState::Gone);
                }
            }
            Event::Init => {
                shared.relisting = Some(HashSet::new());
            }
            Event::InitDone => {
                let seen = shared.relisting.take().unwrap_or_default();
                let vanished: Vec<String> = shared
                    .pods
                    .keys()
                    .filter(|id| !seen.contains(*id))
                    .cloned()
                    .collect();
                for id in vanished {
                    debug!(session_id = %id, "pod absent from the fresh list");
                    shared.pods.remove(&id);
                    if let Some(tx) = shared.subscribers.get(&id) {
                        tx.send_replace(PodState::Gone);
                    }
                }
                // Subscribed sessions whose pod was never listed at all.
                for (id, tx) in &shared.subscribers {
                    if !seen.contains(id) && matches!(*tx.borrow(), PodState::Present(_)) {
                        tx.send_replace(PodState::Gone);
                    }
                }
                drop(shared);
                self.synced.send_replace(true);
            }
        }
    }

    /// Follow one session's pod. Register before creating the pod, so no
    /// event about it can be missed.
    pub fn subscribe(&self, session_id: &str) -> watch::Receiver<PodState> {
        let mut shared = lock(&self.shared);
        let initial = match shared.pods.get(session_id) {
            Some(pod) => PodState::Present(pod.clone()),
            None => PodState::Unknown,
        };
        shared
            .subscribers
            .entry(session_id.to_owned())
            .or_insert_with(|| watch::Sender::new(initial))
            .subscribe()
    }

    pub fn unsubscribe(&self, session_id: &str) {
        lock(&self.shared).subscribers.remove(session_id);
    }

    /// Every session pod currently known (adoption at boot).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        lock(&self.shared).pods.values().cloned().collect()
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once the first full list has been applied.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|synced| *synced).await;
    }

    /// How often the watch had to be re-established.
    pub fn restarts(&self) -> u64 {
        self.restarts.get()
    }

    /// Why the runner cannot rely on this watch now (`/readyz`), if it cannot.
    pub fn not_ready_reason(&self) -> Option<String> {
        let read_error = lock(&self.shared).read_error.clone();
        match (self.is_synced(), read_error) {
            (false, Some(err)) => Some(format!(
                "the pod watch cannot list session pods (apiserver unreachable or refusing): {err}"
            )),
            (false, None) => Some("the pod watch has not completed its first list".to_owned()),
            (true, Some(err)) => Some(format!("the pod watch is failing: {err}")),
            (true, None) => None,
        }
    }
}

/// What the sessions read of a pod is its metadata and status; the spec (the
/// largest part, and the same for every session) and the field-manager
/// bookkeeping are dropped so each live session holds a few KiB, not tens.
fn slim(mut pod: Pod) -> Pod {
    pod.spec = None;
    pod.metadata.managed_fields = None;
    pod
}
