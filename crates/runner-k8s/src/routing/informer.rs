//! One informer over every session routing object (Ingresses or HTTPRoutes,
//! whichever layer was resolved), shared by all sessions.
//!
//! The reference polled each route of each session every two seconds; here a
//! single [`Informer`] over the objects labelled with our managed-by value
//! hands each session the current state of its own objects, keyed by the
//! session-id label — the same cache the pod informer is. The apiserver load of
//! route health therefore does not grow with the number of sessions.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Api;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use runner_core::metrics::Counter;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::informer::{Informer, KeyObjects, Kind, Subscriber};
use crate::pod::labels::SESSION_ID_LABEL;
use crate::pod::session_record::managed_by_selector;

/// A session's routing objects by name, as last listed or watched.
pub type SessionRouteObjects = Arc<BTreeMap<String, Arc<DynamicObject>>>;

/// The shared route informer: each session follows the objects labelled with
/// its id.
pub type RouteInformer = Informer<DynamicObject, watch::Sender<SessionRouteObjects>>;

fn session_id_of(object: &DynamicObject) -> Option<String> {
    object
        .metadata
        .labels
        .as_ref()?
        .get(SESSION_ID_LABEL)
        .cloned()
}

const ROUTES: Kind<DynamicObject> = Kind {
    what: "routes",
    readyz_name: "the route watch",
    listing: "session routes",
    key: session_id_of,
    slim: |object| object.metadata.managed_fields = None,
};

impl Subscriber<DynamicObject> for watch::Sender<SessionRouteObjects> {
    fn update(&mut self, objects: &KeyObjects<DynamicObject>) {
        self.send_replace(objects.clone());
    }
}

impl RouteInformer {
    /// Watch the objects of `api` (of kind `resource`) labelled with
    /// `managed_by` until `stop`; `restarts` counts re-established watches.
    pub fn spawn(
        api: Api<DynamicObject>,
        resource: ApiResource,
        managed_by: &str,
        restarts: Counter,
        stop: CancellationToken,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let config = watcher::Config::default().labels(&managed_by_selector(managed_by));
        Self::start_dynamic(api, resource, config, ROUTES, restarts, stop)
    }

    /// Follow one session's routing objects until the subscription drops.
    /// Subscribe before publishing, so no status written in between is missed.
    pub fn subscribe(self: &Arc<Self>, session_id: &str) -> RouteSubscription {
        let objects = self.with_subscriber(session_id, |current, slot| {
            slot.or_insert_with(|| watch::Sender::new(current.clone()))
                .subscribe()
        });
        RouteSubscription {
            objects,
            informer: self.clone(),
            session_id: session_id.to_owned(),
        }
    }
}

/// One session's view of the shared route informer; unsubscribes on drop.
pub struct RouteSubscription {
    pub objects: watch::Receiver<SessionRouteObjects>,
    informer: Arc<RouteInformer>,
    session_id: String,
}

impl RouteSubscription {
    pub fn read_error(&self) -> Option<String> {
        self.informer.read_error()
    }
}

impl Drop for RouteSubscription {
    fn drop(&mut self) {
        self.informer.drop_subscriber(&self.session_id);
    }
}
