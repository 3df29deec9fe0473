//! The object store: every object of every kind, one global
//! `resourceVersion` counter (like etcd's revision), and per-kind event
//! history that watches replay from (the apiserver's watch cache).
//!
//! All writes happen inside [`Store::write`], one transaction under one lock,
//! so admission checks that read other objects (quota, namespace lifecycle)
//! see a consistent state. Watchers are woken after the lock is released.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::watch;

use crate::kinds::{self, ResourceId};
use crate::meta;
use crate::timeline::{PodTimeline, Timeline};

/// How many events per kind the watch cache keeps by default; a watch that
/// resumes from an older `resourceVersion` gets `410 Expired`.
pub const DEFAULT_HISTORY_PER_KIND: usize = 20_000;

/// A stored object: its JSON value and that value pre-serialized, so a list
/// or a watch event is written without re-encoding the object per client.
#[derive(Debug)]
pub struct Obj {
    pub value: Value,
    pub json: Bytes,
    pub rv: u64,
}

pub type ObjRef = Arc<Obj>;

impl Obj {
    fn new(mut value: Value, rv: u64) -> ObjRef {
        meta::metadata_mut(&mut value)
            .insert("resourceVersion".into(), Value::String(rv.to_string()));
        let json = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Arc::new(Obj { value, json, rv })
    }

    pub fn name(&self) -> &str {
        meta::name(&self.value)
    }

    pub fn namespace(&self) -> &str {
        meta::namespace(&self.value)
    }

    pub fn uid(&self) -> &str {
        meta::uid(&self.value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// One change, as the watch cache keeps it: the new state and the previous
/// one (selector-filtered watches need both to turn an object that stops
/// matching into a `DELETED`).
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventKind,
    pub obj: ObjRef,
    pub prev: Option<ObjRef>,
}

type Key = (String, String);

#[derive(Default)]
struct Table {
    objects: BTreeMap<Key, ObjRef>,
    history: VecDeque<Arc<Event>>,
    /// Highest resourceVersion of an event that fell out of `history`.
    compacted_through: u64,
}

struct Inner {
    rv: u64,
    tables: Vec<Table>,
    timeline: Timeline,
}

/// A `resourceVersion` older than the kept history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

pub struct Store {
    inner: Mutex<Inner>,
    notifiers: Vec<watch::Sender<u64>>,
    any: watch::Sender<u64>,
    history_limit: usize,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let n = kinds::RESOURCES.len();
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                tables: (0..n).map(|_| Table::default()).collect(),
                timeline: Timeline::default(),
            }),
            notifiers: (0..n).map(|_| watch::channel(0).0).collect(),
            any: watch::channel(0).0,
            history_limit: history_limit.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (each write
        // is applied whole or not at all), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` as one transaction; watchers of every kind it wrote are
    /// woken afterwards.
    pub fn write<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> R) -> R {
        let mut guard = self.lock();
        let mut txn = Txn {
            inner: &mut guard,
            touched: Vec::new(),
            history_limit: self.history_limit,
        };
        let out = f(&mut txn);
        let touched = std::mem::take(&mut txn.touched);
        let rv = guard.rv;
        drop(guard);
        let wrote = !touched.is_empty();
        for res in touched {
            self.notifiers[res.0].send_replace(rv);
        }
        if wrote {
            self.any.send_replace(rv);
        }
        out
    }

    /// Read-only access under the lock.
    pub fn read<R>(&self, f: impl FnOnce(&Txn<'_>) -> R) -> R {
        let mut guard = self.lock();
        let txn = Txn {
            inner: &mut guard,
            touched: Vec::new(),
            history_limit: self.history_limit,
        };
        f(&txn)
    }

    pub fn get(&self, res: ResourceId, ns: &str, name: &str) -> Option<ObjRef> {
        self.read(|t| t.get(res, ns, name))
    }

    /// A receiver that changes whenever anything is written.
    pub fn subscribe_all(&self) -> watch::Receiver<u64> {
        self.any.subscribe()
    }

    /// A receiver that changes whenever `res` is written.
    pub fn subscribe(&self, res: ResourceId) -> watch::Receiver<u64> {
        self.notifiers[res.0].subscribe()
    }

    /// Events of `res` with `rv > since`, oldest first.
    pub fn events_since(&self, res: ResourceId, since: u64) -> Result<Vec<Arc<Event>>, TooOld> {
        let guard = self.lock();
        let table = &guard.tables[res.0];
        if since < table.compacted_through {
            return Err(TooOld {
                requested: since,
                oldest: table.compacted_through,
            });
        }
        let start = table.history.partition_point(|e| e.rv <= since);
        Ok(table.history.range(start..).cloned().collect())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// [`Store::events_since`] plus the global resourceVersion at that
    /// instant: every event of `res` up to it is in the returned batch, so a
    /// bookmark may carry it.
    pub fn events_since_with_rv(
        &self,
        res: ResourceId,
        since: u64,
    ) -> Result<(Vec<Arc<Event>>, u64), TooOld> {
        let guard = self.lock();
        let table = &guard.tables[res.0];
        if since < table.compacted_through {
            return Err(TooOld {
                requested: since,
                oldest: table.compacted_through,
            });
        }
        let start = table.history.partition_point(|e| e.rv <= since);
        Ok((table.history.range(start..).cloned().collect(), guard.rv))
    }

    /// Every remembered pod's moments (see [`Timeline`]).
    pub fn pod_timeline(&self) -> Vec<PodTimeline> {
        self.lock().timeline.snapshot()
    }

    /// A consistent snapshot: the objects of `res` (optionally one
    /// namespace) and the resourceVersion they are current at.
    pub fn snapshot(&self, res: ResourceId, ns: Option<&str>) -> (Vec<ObjRef>, u64) {
        self.read(|t| (t.list(res, ns), t.current_rv()))
    }
}

/// A transaction over the store (see [`Store::write`]).
pub struct Txn<'a> {
    inner: &'a mut Inner,
    touched: Vec<ResourceId>,
    history_limit: usize,
}

impl Txn<'_> {
    pub fn current_rv(&self) -> u64 {
        self.inner.rv
    }

    pub fn get(&self, res: ResourceId, ns: &str, name: &str) -> Option<ObjRef> {
        self.inner.tables[res.0]
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of `res`, in one namespace or all, sorted by namespace/name.
    pub fn list(&self, res: ResourceId, ns: Option<&str>) -> Vec<ObjRef> {
        let objects = &self.inner.tables[res.0].objects;
        match ns {
            None => objects.values().cloned().collect(),
            Some(ns) => objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, o)| o.clone())
                .collect(),
        }
    }

    pub fn count(&self, res: ResourceId) -> usize {
        self.inner.tables[res.0].objects.len()
    }

    fn record(&mut self, res: ResourceId, kind: EventKind, obj: ObjRef, prev: Option<ObjRef>) {
        if res == kinds::pods() {
            let current = (kind != EventKind::Deleted).then_some(&obj.value);
            self.inner
                .timeline
                .observe(obj.uid(), prev.as_ref().map(|p| &p.value), current);
        }
        let limit = self.history_limit;
        let table = &mut self.inner.tables[res.0];
        table.history.push_back(Arc::new(Event {
            rv: obj.rv,
            kind,
            obj,
            prev,
        }));
        while table.history.len() > limit {
            if let Some(old) = table.history.pop_front() {
                table.compacted_through = old.rv;
            }
        }
        if !self.touched.contains(&res) {
            self.touched.push(res);
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.inner.rv += 1;
        self.inner.rv
    }

    /// Stores a new object (the caller checked it does not exist).
    pub fn insert(&mut self, res: ResourceId, value: Value) -> ObjRef {
        let rv = self.next_rv();
        let obj = Obj::new(value, rv);
        let key = (obj.namespace().to_string(), obj.name().to_string());
        self.inner.tables[res.0].objects.insert(key, obj.clone());
        self.record(res, EventKind::Added, obj.clone(), None);
        obj
    }

    /// Replaces an existing object (the caller checked preconditions).
    pub fn replace(&mut self, res: ResourceId, value: Value) -> ObjRef {
        let rv = self.next_rv();
        let obj = Obj::new(value, rv);
        let key = (obj.namespace().to_string(), obj.name().to_string());
        let prev = self.inner.tables[res.0].objects.insert(key, obj.clone());
        self.record(res, EventKind::Modified, obj.clone(), prev);
        obj
    }

    /// Removes an object; the `DELETED` event carries the deletion's
    /// resourceVersion, as etcd's delete revision does.
    pub fn remove(&mut self, res: ResourceId, ns: &str, name: &str) -> Option<ObjRef> {
        let prev = self.inner.tables[res.0]
            .objects
            .remove(&(ns.to_string(), name.to_string()))?;
        let rv = self.next_rv();
        let obj = Obj::new(prev.value.clone(), rv);
        self.record(res, EventKind::Deleted, obj.clone(), Some(prev));
        Some(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}})
    }

    #[test]
    fn every_write_gets_a_new_resource_version() {
        let store = Store::new(10);
        let res = kinds::id("configmaps");
        let a = store.write(|t| t.insert(res, cm("a")));
        let b = store.write(|t| t.replace(res, cm("a")));
        assert!(b.rv > a.rv);
        assert_eq!(
            meta::meta_str(&b.value, "resourceVersion"),
            Some(b.rv.to_string().as_str())
        );
        let gone = store
            .write(|t| t.remove(res, "default", "a"))
            .expect("existed");
        assert!(gone.rv > b.rv);
        let events = store.events_since(res, a.rv).expect("kept");
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].kind, EventKind::Deleted);
    }

    #[test]
    fn history_beyond_the_limit_is_too_old() {
        let store = Store::new(2);
        let res = kinds::id("configmaps");
        let first = store.write(|t| t.insert(res, cm("a")));
        for _ in 0..3 {
            store.write(|t| t.replace(res, cm("a")));
        }
        assert!(store.events_since(res, first.rv).is_err());
        assert_eq!(
            store.events_since(res, store.current_rv()).map(|e| e.len()),
            Ok(0)
        );
    }

    #[test]
    fn namespaced_lists_stay_in_their_namespace() {
        let store = Store::new(10);
        let res = kinds::id("configmaps");
        store.write(|t| {
            t.insert(res, cm("a"));
            let mut other = cm("b");
            other["metadata"]["namespace"] = json!("defaults");
            t.insert(res, other);
        });
        let names: Vec<String> = store.read(|t| {
            t.list(res, Some("default"))
                .iter()
                .map(|o| o.name().to_string())
                .collect()
        });
        assert_eq!(names, vec!["a"]);
    }
}
