//! One watch over the Kubernetes Events of the session namespace, feeding each
//! session's `progress` stream with what the scheduler and kubelet say about
//! its pod ("Pulling image …", "FailedScheduling: …").
//!
//! Events carry no labels of ours, so they are matched to sessions by the name
//! of the pod they are about.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Event as KubeEvent;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::pod_spec::pod_name;
use crate::watch_loop::follow;

use runner_core::sync::lock;

/// How many unread events a session may have queued; more are dropped (they
/// are progress hints, never state).
const PER_SESSION_QUEUE: usize = 64;

/// Which of the pod's containers an Event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    Main,
}

impl ContainerKind {
    /// From the Event's `involvedObject.fieldPath`
    /// (`spec.initContainers{bundle-fetch}`, `spec.containers{session}`).
    pub fn of_field_path(field_path: &str) -> Option<Self> {
        if field_path.starts_with("spec.initContainers") {
            Some(ContainerKind::Init)
        } else if field_path.starts_with("spec.containers") {
            Some(ContainerKind::Main)
        } else {
            None
        }
    }
}

/// What a session is told about one Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// `Normal` or `Warning`.
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// The container it is about (`None`: the pod).
    pub container: Option<ContainerKind>,
}

#[derive(Default)]
struct Shared {
    /// Pod name → the session listening for its events.
    subscribers: HashMap<String, Subscriber>,
}

struct Subscriber {
    tx: mpsc::Sender<PodEvent>,
    /// Event uid and count already delivered, so a re-list does not repeat them.
    delivered: HashSet<(String, i32)>,
}

pub struct EventWatcher {
    shared: Mutex<Shared>,
}

impl EventWatcher {
    pub fn spawn(
        client: Client,
        namespace: &str,
        restarts: runner_core::metrics::Counter,
        stop: CancellationToken,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let watcher = Arc::new(Self {
            shared: Mutex::new(Shared::default()),
        });
        let api: Api<KubeEvent> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().fields("involvedObject.kind=Pod");
        let task = {
            let watcher = watcher.clone();
            tokio::spawn(async move {
                let start = || {
                    watcher::watcher(api.clone(), config.clone())
                        .default_backoff()
                        .boxed()
                };
                follow(
                    "events",
                    start,
                    restarts,
                    stop,
                    |event| {
                        if let Event::Apply(event) | Event::InitApply(event) = event {
                            watcher.deliver(&event);
                        }
                    },
                    |_| {},
                )
                .await;
            })
        };
        (watcher, task)
    }

    fn deliver(&self, event: &KubeEvent) {
        let Some(pod) = event.involved_object.name.as_deref() else {
            return;
        };
        let mut shared = lock(&self.shared);
        let Some(subscriber) = shared.subscribers.get_mut(pod) else {
            return;
        };
        let key = (
            event.metadata.uid.clone().unwrap_or_default(),
            event.count.unwrap_or(1),
        );
        if !subscriber.delivered.insert(key) {
            return;
        }
        let _ = subscriber.tx.try_send(PodEvent {
            kind: event.type_.clone().unwrap_or_default(),
            reason: event.reason.clone().unwrap_or_default(),
            message: event.message.clone().unwrap_or_default(),
            container: event
                .involved_object
                .field_path
                .as_deref()
                .and_then(ContainerKind::of_field_path),
        });
    }

    /// Events about the session's pod from now on.
    pub fn subscribe(&self, session_id: &str) -> mpsc::Receiver<PodEvent> {
        let (tx, rx) = mpsc::channel(PER_SESSION_QUEUE);
        lock(&self.shared).subscribers.insert(
            pod_name(session_id),
            Subscriber {
                tx,
                delivered: HashSet::new(),
            },
        );
        rx
    }

    pub fn unsubscribe(&self, session_id: &str) {
        lock(&self.shared).subscribers.remove(&pod_name(session_id));
    }
}
