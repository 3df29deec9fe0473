//! One watch over every session routing object (Ingresses or HTTPRoutes,
//! whichever layer was resolved), shared by all sessions.
//!
//! The reference polled each route of each session every two seconds; here a
//! single `kube::runtime::watcher` over the objects labelled with our
//! managed-by value hands each session the current state of its own objects,
//! keyed by the session-id label — the same shape as the pod watcher. The
//! apiserver load of route health therefore does not grow with the number of
//! sessions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use kube::Api;
use kube::core::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use runner_core::metrics::Counter;
use runner_core::sync::lock;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api_error::watcher_reason;
use crate::pod_spec::{SESSION_ID_LABEL, managed_by_selector};
use crate::watch_loop::follow;

/// A session's routing objects by name, as last listed or watched.
pub type SessionRouteObjects = Arc<BTreeMap<String, Arc<DynamicObject>>>;

#[derive(Default)]
struct Shared {
    objects: HashMap<String, BTreeMap<String, Arc<DynamicObject>>>,
    subscribers: HashMap<String, watch::Sender<SessionRouteObjects>>,
    /// (session id, object name) seen during a re-list in progress.
    relisting: Option<HashSet<(String, String)>>,
    /// Why the watch last failed, client-safe; cleared by the next event.
    read_error: Option<String>,
}

pub struct RouteWatcher {
    shared: Mutex<Shared>,
    /// Set once the first full list has been applied.
    synced: AtomicBool,
}

fn key_of(object: &DynamicObject) -> Option<(String, String)> {
    let session_id = object.metadata.labels.as_ref()?.get(SESSION_ID_LABEL)?;
    let name = object.metadata.name.as_ref()?;
    Some((session_id.clone(), name.clone()))
}

impl Shared {
    fn publish(&self, session_id: &str) {
        if let Some(tx) = self.subscribers.get(session_id) {
            let objects = self.objects.get(session_id).cloned().unwrap_or_default();
            tx.send_replace(Arc::new(objects));
        }
    }
}

impl RouteWatcher {
    /// Watch the objects of `api` labelled with `managed_by` until `stop`;
    /// `restarts` counts re-established watches.
    pub fn spawn(
        api: Api<DynamicObject>,
        managed_by: &str,
        restarts: Counter,
        stop: CancellationToken,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let watcher = Arc::new(Self {
            shared: Mutex::new(Shared::default()),
            synced: AtomicBool::new(false),
        });
        let config = watcher::Config::default().labels(&managed_by_selector(managed_by));
        let task = {
            let watcher = watcher.clone();
            tokio::spawn(async move {
                let start = || {
                    watcher::watcher(api.clone(), config.clone())
                        .default_backoff()
                        .boxed()
                };
                follow(
                    "routes",
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

    fn apply(&self, event: Event<DynamicObject>) {
        let mut shared = lock(&self.shared);
        shared.read_error = None;
        match event {
            Event::Apply(object) | Event::InitApply(object) => {
                let Some((session_id, name)) = key_of(&object) else {
                    return;
                };
                if let Some(seen) = shared.relisting.as_mut() {
                    seen.insert((session_id.clone(), name.clone()));
                }
                shared
                    .objects
                    .entry(session_id.clone())
                    .or_default()
                    .insert(name, Arc::new(object));
                shared.publish(&session_id);
            }
            Event::Delete(object) => {
                let Some((session_id, name)) = key_of(&object) else {
                    return;
                };
                if let Some(objects) = shared.objects.get_mut(&session_id) {
                    objects.remove(&name);
                    if objects.is_empty() {
                        shared.objects.remove(&session_id);
                    }
                }
                shared.publish(&session_id);
            }
            Event::Init => shared.relisting = Some(HashSet::new()),
            Event::InitDone => {
                let seen = shared.relisting.take().unwrap_or_default();
                let mut touched = Vec::new();
                for (session_id, objects) in shared.objects.iter_mut() {
                    let before = objects.len();
                    objects.retain(|name, _| seen.contains(&(session_id.clone(), name.clone())));
                    if objects.len() != before {
                        touched.push(session_id.clone());
                    }
                }
                shared.objects.retain(|_, objects| !objects.is_empty());
                for session_id in touched {
                    shared.publish(&session_id);
                }
                self.synced.store(true, Ordering::Release);
            }
        }
    }

    /// Follow one session's routing objects until the subscription drops.
    /// Subscribe before publishing, so no status written in between is missed.
    pub fn subscribe(self: &Arc<Self>, session_id: &str) -> RouteSubscription {
        let mut shared = lock(&self.shared);
        let current = Arc::new(shared.objects.get(session_id).cloned().unwrap_or_default());
        let objects = shared
            .subscribers
            .entry(session_id.to_owned())
            .or_insert_with(|| watch::Sender::new(current))
            .subscribe();
        RouteSubscription {
            objects,
            watcher: self.clone(),
            session_id: session_id.to_owned(),
        }
    }

    /// Why reading route status last failed, if the watch is failing now.
    pub fn read_error(&self) -> Option<String> {
        lock(&self.shared).read_error.clone()
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Why the runner cannot rely on this watch now (`/readyz`), if it cannot.
    pub fn not_ready_reason(&self) -> Option<String> {
        match (self.is_synced(), self.read_error()) {
            (_, Some(err)) => Some(format!("the route watch is failing: {err}")),
            (false, None) => Some("the route watch has not completed its first list".to_owned()),
            (true, None) => None,
        }
    }
}

/// One session's view of the shared route watch; unsubscribes on drop.
pub struct RouteSubscription {
    pub objects: watch::Receiver<SessionRouteObjects>,
    watcher: Arc<RouteWatcher>,
    session_id: String,
}

impl RouteSubscription {
    pub fn read_error(&self) -> Option<String> {
        self.watcher.read_error()
    }
}

impl Drop for RouteSubscription {
    fn drop(&mut self) {
        lock(&self.watcher.shared)
            .subscribers
            .remove(&self.session_id);
    }
}
