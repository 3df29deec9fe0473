//! The garbage collector: dependents go when every owner they name is gone
//! (Background), `orphan` strips owner references, `foregroundDeletion`
//! removes dependents before the owner.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::kinds::{self, ResourceId};
use crate::meta;
use crate::storage::registry::{DeleteOptions, Propagation, Registry};
use crate::storage::store::{EventKind, Store};

type ObjKey = (ResourceId, String, String);

pub struct GarbageCollector {
    registry: Arc<Registry>,
    store: Arc<Store>,
    /// Owner uid → dependents naming it.
    dependents: HashMap<String, HashSet<ObjKey>>,
}

fn owner_refs(obj: &Value) -> Vec<Value> {
    meta::metadata(obj)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

impl GarbageCollector {
    pub fn new(registry: Arc<Registry>) -> Self {
        Self {
            store: registry.store.clone(),
            registry,
            dependents: HashMap::new(),
        }
    }

    /// Whether an owner reference points at a live object with that uid.
    fn owner_exists(&self, dependent_ns: &str, owner: &Value) -> bool {
        let api_version = owner
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = owner.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = owner.get("name").and_then(Value::as_str).unwrap_or("");
        let uid = owner.get("uid").and_then(Value::as_str).unwrap_or("");
        let Some(res) = kinds::find_kind(api_version, kind) else {
            // An owner of a kind this server does not know cannot be
            // verified; the real GC keeps such dependents too.
            return true;
        };
        let ns = if res.info().namespaced {
            dependent_ns
        } else {
            ""
        };
        self.store
            .get(res, ns, name)
            .is_some_and(|o| o.uid() == uid)
    }

    fn check_dependent(&self, key: &ObjKey) {
        let (res, ns, name) = key;
        let Some(obj) = self.store.get(*res, ns, name) else {
            return;
        };
        let owners = owner_refs(&obj.value);
        if owners.is_empty() || meta::deletion_timestamp(&obj.value).is_some() {
            return;
        }
        if owners.iter().any(|o| self.owner_exists(ns, o)) {
            return;
        }
        let _ = self.registry.delete(
            *res,
            ns,
            name,
            &DeleteOptions {
                propagation: Some(Propagation::Background),
                ..DeleteOptions::default()
            },
        );
    }

    fn index(&mut self, res: ResourceId, obj: &Value) {
        let key = (
            res,
            meta::namespace(obj).to_string(),
            meta::name(obj).to_string(),
        );
        for o in owner_refs(obj) {
            if let Some(uid) = o.get("uid").and_then(Value::as_str) {
                self.dependents
                    .entry(uid.to_string())
                    .or_default()
                    .insert(key.clone());
            }
        }
    }

    fn dependents_of(&self, uid: &str) -> Vec<ObjKey> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn handle_finalizers(&mut self, res: ResourceId, obj: &Value) {
        if meta::deletion_timestamp(obj).is_none() {
            return;
        }
        let fins = meta::finalizers(obj);
        let uid = meta::uid(obj).to_string();
        let (ns, name) = (
            meta::namespace(obj).to_string(),
            meta::name(obj).to_string(),
        );
        if fins.iter().any(|f| f == "orphan") {
            for (dres, dns, dname) in self.dependents_of(&uid) {
                self.registry.mutate(dres, &dns, &dname, |d| {
                    let refs: Vec<Value> = owner_refs(d)
                        .into_iter()
                        .filter(|o| o.get("uid").and_then(Value::as_str) != Some(uid.as_str()))
                        .collect();
                    let m = meta::metadata_mut(d);
                    if refs.is_empty() {
                        m.remove("ownerReferences");
                    } else {
                        m.insert("ownerReferences".into(), Value::Array(refs));
                    }
                    true
                });
            }
            self.dependents.remove(&uid);
            self.registry.remove_finalizer(res, &ns, &name, "orphan");
        }
        if fins.iter().any(|f| f == "foregroundDeletion") {
            let live: Vec<ObjKey> = self
                .dependents_of(&uid)
                .into_iter()
                .filter(|(r, n, nm)| self.store.get(*r, n, nm).is_some())
                .collect();
            for (dres, dns, dname) in &live {
                let _ = self
                    .registry
                    .delete(*dres, dns, dname, &DeleteOptions::default());
            }
            if live.is_empty() {
                self.registry
                    .remove_finalizer(res, &ns, &name, "foregroundDeletion");
            }
        }
    }

    fn full_scan(&mut self) -> Vec<u64> {
        self.dependents.clear();
        let mut cursors = Vec::new();
        let mut to_check = Vec::new();
        for res in kinds::all() {
            let (objs, rv) = self.store.snapshot(res, None);
            for o in &objs {
                self.index(res, &o.value);
                if !owner_refs(&o.value).is_empty() {
                    to_check.push((res, o.namespace().to_string(), o.name().to_string()));
                }
            }
            cursors.push(rv);
        }
        for k in to_check {
            self.check_dependent(&k);
        }
        cursors
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut any = self.store.subscribe_all();
        let mut cursors = self.full_scan();
        loop {
            let mut rescan = false;
            for res in kinds::all() {
                let events = match self.store.events_since(res, cursors[res.0]) {
                    Ok(e) => e,
                    Err(_) => {
                        rescan = true;
                        break;
                    }
                };
                for ev in events {
                    cursors[res.0] = ev.rv;
                    match ev.kind {
                        EventKind::Deleted => {
                            let uid = ev.obj.uid().to_string();
                            for dep in self.dependents_of(&uid) {
                                self.check_dependent(&dep);
                            }
                            // The owner may come back only with a new uid.
                            self.dependents.remove(&uid);
                            // Also drop from owners' indexes lazily.
                            // Owners whose dependents are now all gone are finished
                            // foreground deletions.
                            for o in owner_refs(&ev.obj.value) {
                                if let Some(owner_uid) = o.get("uid").and_then(Value::as_str)
                                    && let Some(set) = self.dependents.get_mut(owner_uid)
                                {
                                    set.remove(&(
                                        res,
                                        ev.obj.namespace().to_string(),
                                        ev.obj.name().to_string(),
                                    ));
                                    let owner = o.clone();
                                    if let Some(ores) = kinds::find_kind(
                                        owner
                                            .get("apiVersion")
                                            .and_then(Value::as_str)
                                            .unwrap_or(""),
                                        owner.get("kind").and_then(Value::as_str).unwrap_or(""),
                                    ) {
                                        let ons = if ores.info().namespaced {
                                            ev.obj.namespace().to_string()
                                        } else {
                                            String::new()
                                        };
                                        let oname = owner
                                            .get("name")
                                            .and_then(Value::as_str)
                                            .unwrap_or("")
                                            .to_string();
                                        if let Some(live) = self.store.get(ores, &ons, &oname) {
                                            let v = live.value.clone();
                                            self.handle_finalizers(ores, &v);
                                        }
                                    }
                                }
                            }
                        }
                        _ => {
                            let v = ev.obj.value.clone();
                            self.index(res, &v);
                            // Added or updated alike: an owner reference a
                            // patch adds later, naming an owner already gone,
                            // is collected as the real collector does.
                            if !owner_refs(&v).is_empty() {
                                let key = (
                                    res,
                                    ev.obj.namespace().to_string(),
                                    ev.obj.name().to_string(),
                                );
                                self.check_dependent(&key);
                            }
                            self.handle_finalizers(res, &v);
                        }
                    }
                }
            }
            if rescan {
                cursors = self.full_scan();
            }
            tokio::select! {
                changed = any.changed() => if changed.is_err() { return },
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
