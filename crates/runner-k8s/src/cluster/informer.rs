//! The shared informer every session-facing cache is built on: one
//! `kube::runtime::watcher` per kind (pods, Events, routing objects) whose
//! objects are kept in a reflector store and handed out per session.
//!
//! Each kind only says how an object maps to the key its readers subscribe
//! by (the session id, or the pod name an Event is about) and what a
//! subscriber does with its key's objects. Everything else is done here, once:
//!
//! - the reflector [`Writer`] buffers a re-list (`Init` … `InitDone`) and
//!   swaps it in whole, so a reader never sees half of a fresh list, and an
//!   object absent from it is simply gone from the store;
//! - a per-key index over the store tells each subscriber when its objects
//!   change, including when they vanish because a fresh list left them out;
//! - re-listing after an error ([`follow`]) and the readiness `/readyz`
//!   reports: not ready until the first list is in, and while the last
//!   attempt failed, with the client-safe reason of that failure.
//!
//! Keeping this in one place is what stops the informers from drifting apart
//! in how they recover.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use runner_core::metrics::Counter;
use runner_core::sync::lock;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cluster::api_error::watcher_reason;
use crate::cluster::informer_loop::follow;

/// One key's objects by name, as last listed or watched. Shared, so handing
/// the same state to a subscriber costs a reference count, not a copy.
pub type KeyObjects<K> = Arc<BTreeMap<String, Arc<K>>>;

/// What a kind's subscriber does when its key's objects change.
pub trait Subscriber<K>: Send + 'static {
    /// `objects` is everything the key has now; empty once they are deleted
    /// or a fresh list no longer has them. Also called for every subscriber
    /// after each fresh list, changed or not, so whoever reads the informer's
    /// health looks again once it has recovered.
    fn update(&mut self, objects: &KeyObjects<K>);
}

/// How one kind is watched and named.
pub struct Kind<K> {
    /// The informer's label in logs and in the restart metric (`pods`).
    pub what: &'static str,
    /// The informer as `/readyz` names it (`the pod watch`).
    pub readyz_name: &'static str,
    /// What its list is of (`session pods`).
    pub listing: &'static str,
    /// The key subscribers follow an object by; `None` leaves the object in
    /// the store but out of every key.
    pub key: fn(&K) -> Option<String>,
    /// Applied to every object before it is stored: drop what no reader
    /// needs, so the cache stays small.
    pub slim: fn(&mut K),
}

/// Whether the informer can be relied on, as `/readyz` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    readyz_name: &'static str,
    listing: &'static str,
    /// The first full list has been applied.
    pub synced: bool,
    /// Why the informer last failed, client-safe; cleared once it delivers
    /// again after a fresh list.
    pub error: Option<String>,
}

impl Health {
    /// Why the runner cannot rely on this informer now, if it cannot.
    pub fn not_ready_reason(&self) -> Option<String> {
        let Self {
            readyz_name: name,
            listing,
            ..
        } = self;
        match (self.synced, &self.error) {
            (false, Some(err)) => Some(format!(
                "{name} cannot list {listing} (apiserver unreachable or refusing): {err}"
            )),
            (false, None) => Some(format!("{name} has not completed its first list")),
            (true, Some(err)) => Some(format!("{name} is failing: {err}")),
            (true, None) => None,
        }
    }
}

struct Inner<K: Resource + Clone + 'static, S>
where
    K::DynamicType: Eq + Hash + Clone,
{
    writer: Writer<K>,
    /// The store's objects grouped by key.
    by_key: HashMap<String, KeyObjects<K>>,
    /// Object name → its key, to find what to remove when an object is
    /// deleted or relabelled.
    key_of_name: HashMap<String, String>,
    subscribers: HashMap<String, S>,
}

/// The shared cache of one kind; see the module documentation.
pub struct Informer<K: Resource + Clone + 'static, S>
where
    K::DynamicType: Eq + Hash + Clone,
{
    kind: Kind<K>,
    dyntype: K::DynamicType,
    store: Store<K>,
    inner: Mutex<Inner<K, S>>,
    health: watch::Sender<Health>,
    restarts: Counter,
}

fn name_of<K: Resource>(object: &K) -> Option<String> {
    object.meta().name.clone()
}

impl<K, S> Informer<K, S>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync + Default,
    S: Subscriber<K>,
{
    /// Follow `api` with `config` until `stop` fires; `restarts` counts
    /// re-established watches. The task is the caller's to join or abort.
    pub fn start(
        api: Api<K>,
        config: watcher::Config,
        kind: Kind<K>,
        restarts: Counter,
        stop: CancellationToken,
    ) -> (Arc<Self>, JoinHandle<()>) {
        Self::start_dynamic(api, K::DynamicType::default(), config, kind, restarts, stop)
    }
}

impl<K, S> Informer<K, S>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
    S: Subscriber<K>,
{
    /// Follow `api` (objects of `dyntype`) with `config` until `stop` fires;
    /// `restarts` counts re-established watches. The task is the caller's to
    /// join or abort.
    pub fn start_dynamic(
        api: Api<K>,
        dyntype: K::DynamicType,
        config: watcher::Config,
        kind: Kind<K>,
        restarts: Counter,
        stop: CancellationToken,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let cache = Arc::new(Self::new(kind, dyntype, restarts.clone()));
        let task = {
            let cache = cache.clone();
            tokio::spawn(async move {
                let start = || {
                    watcher::watcher(api.clone(), config.clone())
                        .default_backoff()
                        .boxed()
                };
                follow(
                    cache.kind.what,
                    start,
                    restarts,
                    stop,
                    |event| cache.apply(event),
                    |err| cache.failed(err),
                )
                .await;
            })
        };
        (cache, task)
    }

    /// A cache no watch stream feeds yet; [`Self::start_dynamic`] spawns the one
    /// that does.
    pub(crate) fn new(kind: Kind<K>, dyntype: K::DynamicType, restarts: Counter) -> Self {
        let writer = Writer::new(dyntype.clone());
        Self {
            health: watch::Sender::new(Health {
                readyz_name: kind.readyz_name,
                listing: kind.listing,
                synced: false,
                error: None,
            }),
            kind,
            dyntype,
            store: writer.as_reader(),
            inner: Mutex::new(Inner {
                writer,
                by_key: HashMap::new(),
                key_of_name: HashMap::new(),
                subscribers: HashMap::new(),
            }),
            restarts,
        }
    }

    pub(crate) fn apply(&self, event: Event<K>) {
        let event = event.modify(self.kind.slim);
        let mut inner = lock(&self.inner);
        inner.writer.apply_watcher_event(&event);
        match &event {
            // A list in progress is buffered by the writer; subscribers are
            // told once it is complete.
            Event::Init | Event::InitApply(_) => return,
            Event::Apply(object) => self.applied(&mut inner, object),
            Event::Delete(object) => self.deleted(&mut inner, object),
            Event::InitDone => self.relisted(&mut inner),
        }
        drop(inner);
        let relisted = matches!(event, Event::InitDone);
        self.health.send_if_modified(|health| {
            let before = (health.synced, health.error.is_some());
            health.synced |= relisted;
            health.error = None;
            before != (health.synced, false)
        });
    }

    pub(crate) fn failed(&self, err: &watcher::Error) {
        let reason = watcher_reason(err);
        self.health.send_if_modified(|health| {
            let changed = health.error.as_ref() != Some(&reason);
            health.error = Some(reason);
            changed
        });
    }

    fn applied(&self, inner: &mut Inner<K, S>, object: &K) {
        let Some(name) = name_of(object) else {
            return;
        };
        let key = (self.kind.key)(object);
        if let Some(old) = inner.key_of_name.get(&name).cloned()
            && Some(&old) != key.as_ref()
        {
            inner.remove(&old, &name);
        }
        let Some(key) = key else {
            inner.key_of_name.remove(&name);
            return;
        };
        // The store's own copy, so the index costs references, not objects.
        let Some(stored) = self
            .store
            .get(&ObjectRef::from_obj_with(object, self.dyntype.clone()))
        else {
            return;
        };
        inner.key_of_name.insert(name.clone(), key.clone());
        let objects = inner.by_key.entry(key.clone()).or_default();
        Arc::make_mut(objects).insert(name, stored);
        inner.publish(&key);
    }

    fn deleted(&self, inner: &mut Inner<K, S>, object: &K) {
        let Some(name) = name_of(object) else {
            return;
        };
        if let Some(key) = inner.key_of_name.remove(&name) {
            inner.remove(&key, &name);
        }
    }

    /// The writer has swapped a fresh list in: rebuild the index from it and
    /// tell every subscriber what its key has now, so one whose objects the
    /// list no longer has learns they are gone.
    fn relisted(&self, inner: &mut Inner<K, S>) {
        let mut by_key: HashMap<String, BTreeMap<String, Arc<K>>> = HashMap::new();
        let mut key_of_name = HashMap::new();
        for object in self.store.state() {
            let (Some(key), Some(name)) = ((self.kind.key)(&object), name_of(&*object)) else {
                continue;
            };
            key_of_name.insert(name.clone(), key.clone());
            by_key.entry(key).or_default().insert(name, object);
        }
        for key in inner.by_key.keys() {
            if !by_key.contains_key(key) {
                debug!(watch = self.kind.what, key = %key, "absent from the fresh list");
            }
        }
        inner.by_key = by_key
            .into_iter()
            .map(|(key, objects)| (key, Arc::new(objects)))
            .collect();
        inner.key_of_name = key_of_name;
        let Inner {
            by_key,
            subscribers,
            ..
        } = inner;
        let empty = KeyObjects::<K>::default();
        for (key, subscriber) in subscribers.iter_mut() {
            subscriber.update(by_key.get(key).unwrap_or(&empty));
        }
    }

    /// Under the lock, hand `attach` the key's current objects and its
    /// subscriber slot, so no change can fall between reading the state and
    /// registering for what follows.
    pub fn with_subscriber<R>(
        &self,
        key: &str,
        attach: impl FnOnce(&KeyObjects<K>, Entry<'_, String, S>) -> R,
    ) -> R {
        let mut inner = lock(&self.inner);
        let Inner {
            by_key,
            subscribers,
            ..
        } = &mut *inner;
        let objects = by_key.get(key).cloned().unwrap_or_default();
        attach(&objects, subscribers.entry(key.to_owned()))
    }

    pub fn drop_subscriber(&self, key: &str) {
        lock(&self.inner).subscribers.remove(key);
    }

    /// The objects of one key now (a session's pod), without copying the
    /// rest.
    pub fn objects_of(&self, key: &str) -> Vec<Arc<K>> {
        lock(&self.inner)
            .by_key
            .get(key)
            .map(|objects| objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every object that has a key (adoption at boot).
    pub fn objects(&self) -> Vec<Arc<K>> {
        lock(&self.inner)
            .by_key
            .values()
            .flat_map(|objects| objects.values().cloned())
            .collect()
    }

    pub fn is_synced(&self) -> bool {
        self.health.borrow().synced
    }

    /// Resolves once the first full list has been applied.
    pub async fn wait_synced(&self) {
        let mut health = self.health.subscribe();
        let _ = health.wait_for(|health| health.synced).await;
    }

    /// Follows the informer's health: what `/readyz` would say, as it changes.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.health.subscribe()
    }

    /// Why the last attempt to watch failed, if the informer is failing now.
    pub fn read_error(&self) -> Option<String> {
        self.health.borrow().error.clone()
    }

    /// Why the runner cannot rely on this informer now (`/readyz`), if it cannot.
    pub fn not_ready_reason(&self) -> Option<String> {
        self.health.borrow().not_ready_reason()
    }

    /// How often the informer had to be re-established.
    pub fn restarts(&self) -> u64 {
        self.restarts.get()
    }
}

impl<K, S> Inner<K, S>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
    S: Subscriber<K>,
{
    fn remove(&mut self, key: &str, name: &str) {
        if let Some(objects) = self.by_key.get_mut(key) {
            Arc::make_mut(objects).remove(name);
            if objects.is_empty() {
                self.by_key.remove(key);
            }
        }
        self.publish(key);
    }

    fn publish(&mut self, key: &str) {
        if let Some(subscriber) = self.subscribers.get_mut(key) {
            match self.by_key.get(key) {
                Some(objects) => subscriber.update(objects),
                None => subscriber.update(&KeyObjects::default()),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::{ObjectMeta, Status};

    /// A watch error as the apiserver's refusal of the list would raise it.
    pub(crate) fn refused() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(Status {
            code: 500,
            reason: "InternalError".into(),
            message: "etcd is gone".into(),
            ..Status::default()
        })))
    }

    fn object(name: &str, key: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("sessions".into()),
                resource_version: Some(version.into()),
                labels: Some([("key".to_owned(), key.to_owned())].into()),
                managed_fields: Some(Vec::new()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn key_of(object: &ConfigMap) -> Option<String> {
        object.metadata.labels.as_ref()?.get("key").cloned()
    }

    impl Subscriber<ConfigMap> for watch::Sender<Vec<String>> {
        fn update(&mut self, objects: &KeyObjects<ConfigMap>) {
            self.send_replace(objects.keys().cloned().collect());
        }
    }

    type Cache = Informer<ConfigMap, watch::Sender<Vec<String>>>;

    fn cache() -> Cache {
        Cache::new(
            Kind {
                what: "configmaps",
                readyz_name: "the config watch",
                listing: "session configs",
                key: key_of,
                slim: |object| object.metadata.managed_fields = None,
            },
            (),
            Counter::default(),
        )
    }

    fn subscribe_to(cache: &Cache, key: &str) -> watch::Receiver<Vec<String>> {
        cache.with_subscriber(key, |objects, slot| {
            slot.or_insert_with(|| watch::Sender::new(objects.keys().cloned().collect()))
                .subscribe()
        })
    }

    fn list(cache: &Cache, objects: &[ConfigMap]) {
        cache.apply(Event::Init);
        for object in objects {
            cache.apply(Event::InitApply(object.clone()));
        }
        cache.apply(Event::InitDone);
    }

    #[test]
    fn a_fresh_list_is_told_whole_and_drops_what_it_no_longer_has() {
        let cache = cache();
        let one = subscribe_to(&cache, "one");
        let two = subscribe_to(&cache, "two");
        list(&cache, &[object("a", "one", "1"), object("b", "one", "1")]);
        assert_eq!(*one.borrow(), ["a", "b"]);
        assert!(two.borrow().is_empty());

        cache.apply(Event::Init);
        cache.apply(Event::InitApply(object("c", "two", "2")));
        // Half a list changes nothing anyone sees.
        assert_eq!(*one.borrow(), ["a", "b"]);
        assert!(two.borrow().is_empty());
        cache.apply(Event::InitDone);
        assert!(one.borrow().is_empty(), "absent from the fresh list");
        assert_eq!(*two.borrow(), ["c"]);
        assert_eq!(cache.objects().len(), 1);
        assert!(
            cache
                .objects()
                .iter()
                .all(|object| object.metadata.managed_fields.is_none()),
            "stored slim"
        );
    }

    #[test]
    fn watched_changes_reach_only_their_key_and_follow_a_relabel() {
        let cache = cache();
        list(&cache, &[]);
        let mut one = subscribe_to(&cache, "one");
        let mut two = subscribe_to(&cache, "two");
        cache.apply(Event::Apply(object("a", "one", "1")));
        assert!(one.has_changed().unwrap());
        assert!(!two.has_changed().unwrap());
        assert_eq!(*one.borrow_and_update(), ["a"]);

        cache.apply(Event::Apply(object("a", "two", "2")));
        assert!(one.borrow_and_update().is_empty());
        assert_eq!(*two.borrow_and_update(), ["a"]);

        cache.apply(Event::Delete(object("a", "two", "3")));
        assert!(two.borrow_and_update().is_empty());
        assert!(cache.objects().is_empty());

        cache.drop_subscriber("two");
        cache.apply(Event::Apply(object("b", "two", "4")));
        assert!(
            two.has_changed().is_err(),
            "an unsubscribed key hears nothing"
        );
        // A new subscriber starts from what is known.
        assert_eq!(*subscribe_to(&cache, "two").borrow(), ["b"]);
    }

    #[test]
    fn readiness_waits_for_the_first_list_and_clears_once_a_fresh_list_is_in() {
        let cache = cache();
        assert!(!cache.is_synced());
        assert_eq!(
            cache.not_ready_reason().as_deref(),
            Some("the config watch has not completed its first list")
        );
        cache.failed(&refused());
        let refusal = "the Kubernetes API rejected the request (InternalError, HTTP 500)";
        assert_eq!(
            cache.not_ready_reason(),
            Some(format!(
                "the config watch cannot list session configs (apiserver unreachable or refusing): {refusal}"
            ))
        );
        list(&cache, &[]);
        assert!(cache.is_synced());
        assert_eq!(cache.not_ready_reason(), None);

        cache.failed(&refused());
        assert_eq!(cache.read_error().as_deref(), Some(refusal));
        assert_eq!(
            cache.not_ready_reason(),
            Some(format!("the config watch is failing: {refusal}"))
        );
        // Starting over is not yet being sound again.
        cache.apply(Event::Init);
        assert!(cache.not_ready_reason().is_some());
        cache.apply(Event::InitDone);
        assert_eq!(cache.not_ready_reason(), None);
        assert_eq!(cache.read_error(), None);
    }
}
