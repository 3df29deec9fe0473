//! The write path every client request and every simulated controller goes
//! through: defaulting, validation, admission (namespace lifecycle, service
//! accounts, ResourceQuota), optimistic concurrency, status subresources,
//! graceful deletion and finalizers — each in one store transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use super::decode;
use super::defaults;
use super::patch::{self, PatchKind};
use super::store::{ObjRef, Store, Txn};
use super::validation;
use crate::errors::{ApiError, FieldError};
use crate::kinds::{self, ResourceId, ResourceInfo};
use crate::meta;
use crate::storage::quota;

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    Orphan,
    #[default]
    Background,
    Foreground,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

/// What a delete did.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// Removed from the store.
    Gone(ObjRef),
    /// Marked for deletion (grace period or finalizers pending).
    Pending(ObjRef),
}

pub struct Registry {
    pub store: Arc<Store>,
    cluster_ip_seq: AtomicU32,
}

const FINALIZER_ORPHAN: &str = "orphan";
const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

impl Registry {
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            cluster_ip_seq: AtomicU32::new(10),
        }
    }

    fn next_cluster_ip(&self) -> String {
        let n = self.cluster_ip_seq.fetch_add(1, Ordering::Relaxed);
        format!("10.96.{}.{}", (n / 250) % 250, n % 250 + 1)
    }

    pub fn get(&self, res: ResourceId, ns: &str, name: &str) -> Result<ObjRef, ApiError> {
        self.store
            .get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(res.info().group_resource(), name))
    }

    /// POST: create an object in `path_ns` (or cluster-scoped).
    pub fn create(
        &self,
        res: ResourceId,
        path_ns: &str,
        body: Value,
        dry_run: bool,
    ) -> Result<ObjRef, ApiError> {
        let info = res.info();
        let mut obj = normalize_body(info, body)?;
        decode::decode(info, &mut obj).map_err(|e| decode_error(info, &e))?;
        check_body_namespace(info, &mut obj, path_ns)?;
        if meta::meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        self.store
            .write(|txn| self.create_in_txn(txn, res, obj, dry_run))
    }

    /// The part of a create that runs inside the store transaction: the
    /// body is already decoded and in its namespace.
    fn create_in_txn(
        &self,
        txn: &mut Txn<'_>,
        res: ResourceId,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<ObjRef, ApiError> {
        let info = res.info();
        let mut next_ip = || self.next_cluster_ip();
        admit_namespace_lifecycle(txn, info, &obj)?;
        admit_service_account(txn, info, &obj)?;
        if meta::name(&obj).is_empty()
            && let Some(prefix) = meta::meta_str(&obj, "generateName").map(str::to_string)
        {
            let generated = meta::generate_name(&prefix);
            meta::metadata_mut(&mut obj).insert("name".into(), json!(generated));
        }
        stamp_new_metadata(info, &mut obj);
        defaults::apply_on_create(info.kind, info.has_status(), &mut obj, &mut next_ip);
        if info.kind == "Lease" {
            drop_disabled_lease_fields(None, &mut obj);
        }
        validate(info, &obj)?;
        if info.kind == "Pod" {
            quota::admit_pod(txn, &obj)?;
        } else {
            quota::admit_object_count(txn, info, &obj)?;
        }
        let name = meta::name(&obj).to_string();
        let ns = meta::namespace(&obj).to_string();
        if txn.get(res, &ns, &name).is_some() {
            return Err(ApiError::already_exists(info.group_resource(), &name));
        }
        if dry_run {
            return Ok(std::sync::Arc::new(super::store::Obj {
                json: bytes::Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()),
                value: obj,
                rv: 0,
            }));
        }
        let created = txn.insert(res, obj);
        after_write(txn, res, &created);
        Ok(created)
    }

    /// PUT: replace an object (or its status). For kinds whose strategy
    /// allows create on update, a PUT of a missing object creates it; the
    /// flag says whether it did (the answer is then `201`).
    pub fn update(
        &self,
        res: ResourceId,
        ns: &str,
        name: &str,
        body: Value,
        target: Target,
        dry_run: bool,
    ) -> Result<(ObjRef, bool), ApiError> {
        let info = res.info();
        let mut new = normalize_body(info, body)?;
        decode::decode(info, &mut new).map_err(|e| decode_error(info, &e))?;
        check_body_namespace(info, &mut new, ns)?;
        let body_name = meta::name(&new).to_string();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        self.store.write(|txn| {
            let Some(old) = txn.get(res, ns, name) else {
                if target == Target::Main && creates_on_update(info) {
                    // The stored object's version is what a precondition
                    // compares with; there is none, so the body's is moot.
                    meta::metadata_mut(&mut new).remove("resourceVersion");
                    return self
                        .create_in_txn(txn, res, new, dry_run)
                        .map(|o| (o, true));
                }
                return Err(ApiError::not_found(info.group_resource(), name));
            };
            let body_rv = meta::meta_str(&new, "resourceVersion")
                .unwrap_or("")
                .to_string();
            if body_rv.is_empty() {
                if info.is_custom() {
                    return Err(ApiError::invalid(
                        info.group,
                        info.kind,
                        name,
                        &[FieldError::invalid(
                            "metadata.resourceVersion",
                            json!("0x0"),
                            "must be specified for an update",
                        )
                        .with_raw_value("0x0")],
                    ));
                }
            } else if body_rv != old.rv.to_string() {
                return Err(ApiError::conflict(
                    info.group_resource(),
                    name,
                    ApiError::CONFLICT_MODIFIED,
                ));
            }
            self.update_in_txn(txn, res, &old, new, target, dry_run)
                .map(|o| (o, false))
        })
    }

    /// PATCH: apply a patch to the live object, then update it.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        res: ResourceId,
        ns: &str,
        name: &str,
        kind: PatchKind,
        body: &[u8],
        target: Target,
        dry_run: bool,
    ) -> Result<ObjRef, ApiError> {
        let info = res.info();
        if kind == PatchKind::Strategic && info.is_custom() {
            return Err(ApiError::unsupported_media_type(
                "application/strategic-merge-patch+json",
            ));
        }
        let patch_value = patch::parse_body(kind, body)?;
        let existing = self.store.get(res, ns, name);
        if existing.is_none() && kind == PatchKind::Apply && target == Target::Main {
            // Server-side apply creates what does not exist yet.
            let mut obj = patch_value;
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
            meta::metadata_mut(&mut obj).insert("name".into(), json!(name));
            return self.create(res, ns, obj, dry_run);
        }
        self.store.write(|txn| {
            let old = txn
                .get(res, ns, name)
                .ok_or_else(|| ApiError::not_found(info.group_resource(), name))?;
            let mut patched = patch::apply(kind, &old.value, &patch_value)?;
            decode::decode(info, &mut patched).map_err(|e| patch_decode_error(&patched, &e))?;
            let patched_rv = meta::meta_str(&patched, "resourceVersion").unwrap_or("");
            if !patched_rv.is_empty() && patched_rv != old.rv.to_string() {
                return Err(ApiError::conflict(
                    info.group_resource(),
                    name,
                    ApiError::CONFLICT_MODIFIED,
                ));
            }
            if meta::name(&patched) != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    meta::name(&patched)
                )));
            }
            self.update_in_txn(txn, res, &old, patched, target, dry_run)
        })
    }

    fn update_in_txn(
        &self,
        txn: &mut Txn<'_>,
        res: ResourceId,
        old: &ObjRef,
        mut new: Value,
        target: Target,
        dry_run: bool,
    ) -> Result<ObjRef, ApiError> {
        let info = res.info();
        let name = old.name().to_string();
        if target == Target::Status {
            let status = new.get("status").cloned();
            new = old.value.clone();
            if let Some(o) = new.as_object_mut() {
                match status {
                    Some(s) => {
                        o.insert("status".into(), s);
                    }
                    None => {
                        o.remove("status");
                    }
                }
            }
        } else if info.has_status()
            && let Some(o) = new.as_object_mut()
        {
            match old.value.get("status") {
                Some(s) => {
                    o.insert("status".into(), s.clone());
                }
                None => {
                    o.remove("status");
                }
            }
        }
        let mut errs = carry_system_metadata(info, &old.value, &mut new);
        match info.kind {
            "Pod" if target == Target::Main => {
                errs.extend(validation::validate_pod_update(&old.value, &new))
            }
            "Service" => errs.extend(carry_cluster_ip(&old.value, &mut new)),
            "Secret" => defaults::fold_secret_string_data(&mut new),
            "Lease" => drop_disabled_lease_fields(Some(&old.value), &mut new),
            "Namespace" => {
                if let (Some(o), Some(spec)) = (new.as_object_mut(), old.value.get("spec")) {
                    o.insert("spec".into(), spec.clone());
                }
            }
            _ => {}
        }
        if !errs.is_empty() {
            return Err(ApiError::invalid(info.group, info.kind, &name, &errs));
        }
        validate(info, &new)?;
        // A write that changes nothing does not bump resourceVersion.
        let mut old_cmp = old.value.clone();
        meta::metadata_mut(&mut old_cmp).remove("resourceVersion");
        meta::metadata_mut(&mut new).remove("resourceVersion");
        if old_cmp == new {
            return Ok(old.clone());
        }
        if dry_run {
            return Ok(Arc::new(super::store::Obj {
                json: bytes::Bytes::from(serde_json::to_vec(&new).unwrap_or_default()),
                value: new,
                rv: old.rv,
            }));
        }
        // The last finalizer of an object being deleted: it goes now.
        if meta::deletion_timestamp(&new).is_some() && meta::finalizers(&new).is_empty() {
            let removable = info.kind != "Pod" || meta::path_str(&new, "spec.nodeName").is_none();
            if removable {
                let ns = meta::namespace(&new).to_string();
                txn.replace(res, new);
                let gone = txn
                    .remove(res, &ns, &name)
                    .ok_or_else(|| ApiError::not_found(info.group_resource(), &name))?;
                after_write(txn, res, &gone);
                return Ok(gone);
            }
        }
        let written = txn.replace(res, new);
        after_write(txn, res, &written);
        Ok(written)
    }

    /// DELETE one object.
    pub fn delete(
        &self,
        res: ResourceId,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        self.store
            .write(|txn| delete_in_txn(txn, res, ns, name, opts))
    }

    /// Controller-side read-modify-write of the live object, without
    /// validation or RBAC (kubelet status, controller status). `f` returns
    /// false to leave the object untouched.
    pub fn mutate(
        &self,
        res: ResourceId,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value) -> bool,
    ) -> Option<ObjRef> {
        self.store.write(|txn| {
            let old = txn.get(res, ns, name)?;
            let mut value = old.value.clone();
            if !f(&mut value) || value == old.value {
                return Some(old);
            }
            let written = txn.replace(res, value);
            after_write(txn, res, &written);
            Some(written)
        })
    }

    /// Drops one finalizer; an object being deleted goes when its last
    /// finalizer does.
    pub fn remove_finalizer(&self, res: ResourceId, ns: &str, name: &str, finalizer: &str) {
        self.store.write(|txn| {
            let Some(old) = txn.get(res, ns, name) else {
                return;
            };
            let mut value = old.value.clone();
            let mut fins = meta::finalizers(&value);
            let before = fins.len();
            fins.retain(|f| f != finalizer);
            if fins.len() == before {
                return;
            }
            let m = meta::metadata_mut(&mut value);
            if fins.is_empty() {
                m.remove("finalizers");
            } else {
                m.insert("finalizers".into(), json!(fins));
            }
            let deleting = meta::deletion_timestamp(&value).is_some();
            let written = txn.replace(res, value);
            if deleting && fins.is_empty() {
                if let Some(gone) = txn.remove(res, ns, name) {
                    after_write(txn, res, &gone);
                }
            } else {
                after_write(txn, res, &written);
            }
        });
    }

    /// Removes an object now (the kubelet's final delete after a graceful
    /// termination, the garbage collector). `uid` guards against removing a
    /// newer object of the same name.
    pub fn remove_now(&self, res: ResourceId, ns: &str, name: &str, uid: &str) -> Option<ObjRef> {
        self.store.write(|txn| {
            let live = txn.get(res, ns, name)?;
            if !uid.is_empty() && live.uid() != uid {
                return None;
            }
            let gone = txn.remove(res, ns, name)?;
            after_write(txn, res, &gone);
            Some(gone)
        })
    }
}

pub fn delete_in_txn(
    txn: &mut Txn<'_>,
    res: ResourceId,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Deleted, ApiError> {
    let info = res.info();
    let gr = info.group_resource();
    let old = txn
        .get(res, ns, name)
        .ok_or_else(|| ApiError::not_found(gr, name))?;
    if let Some(uid) = &opts.precondition_uid
        && uid != old.uid()
    {
        return Err(ApiError::conflict(
            gr,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old.uid()
            ),
        ));
    }
    if let Some(rv) = &opts.precondition_rv
        && *rv != old.rv.to_string()
    {
        return Err(ApiError::conflict(
            gr,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                old.rv
            ),
        ));
    }
    if opts.dry_run {
        return Ok(Deleted::Pending(old));
    }
    let is_pod = info.kind == "Pod";
    let scheduled = meta::path_str(&old.value, "spec.nodeName").is_some_and(|n| !n.is_empty());
    let phase = meta::path_str(&old.value, "status.phase").unwrap_or("");
    let terminal = phase == "Succeeded" || phase == "Failed";
    let mut grace = if is_pod && scheduled && !terminal {
        opts.grace_period_seconds.unwrap_or_else(|| {
            meta::path(&old.value, "spec.terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30)
        })
    } else {
        0
    };
    grace = grace.max(0);

    if meta::deletion_timestamp(&old.value).is_some() {
        // Already being deleted: only a shorter grace period changes anything.
        let current = meta::metadata(&old.value)
            .and_then(|m| m.get("deletionGracePeriodSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if is_pod && grace < current {
            if grace == 0 && meta::finalizers(&old.value).is_empty() {
                let gone = txn
                    .remove(res, ns, name)
                    .ok_or_else(|| ApiError::not_found(gr, name))?;
                after_write(txn, res, &gone);
                return Ok(Deleted::Gone(gone));
            }
            let mut value = old.value.clone();
            mark_deleting(&mut value, grace);
            let written = txn.replace(res, value);
            return Ok(Deleted::Pending(written));
        }
        return Ok(Deleted::Pending(old));
    }

    let mut finalizers = meta::finalizers(&old.value);
    match opts.propagation {
        Some(Propagation::Orphan) => push_unique(&mut finalizers, FINALIZER_ORPHAN),
        Some(Propagation::Foreground) => push_unique(&mut finalizers, FINALIZER_FOREGROUND),
        _ => {}
    }
    let is_namespace = info.kind == "Namespace";
    if grace > 0 || !finalizers.is_empty() || is_namespace {
        let mut value = old.value.clone();
        mark_deleting(&mut value, grace);
        if !finalizers.is_empty() {
            meta::metadata_mut(&mut value).insert("finalizers".into(), json!(finalizers));
        }
        if is_namespace {
            *meta::path_mut(&mut value, "status.phase") = json!("Terminating");
        }
        let written = txn.replace(res, value);
        after_write(txn, res, &written);
        return Ok(Deleted::Pending(written));
    }
    let gone = txn
        .remove(res, ns, name)
        .ok_or_else(|| ApiError::not_found(gr, name))?;
    after_write(txn, res, &gone);
    Ok(Deleted::Gone(gone))
}

fn push_unique(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|f| f == item) {
        list.push(item.to_string());
    }
}

fn mark_deleting(value: &mut Value, grace: i64) {
    let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(grace);
    let m = meta::metadata_mut(value);
    m.insert(
        "deletionTimestamp".into(),
        json!(meta::format_timestamp(at)),
    );
    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
}

/// Side effects every write triggers inside its transaction: quota usage,
/// the service-account controller's defaults for a new namespace.
fn after_write(txn: &mut Txn<'_>, res: ResourceId, obj: &ObjRef) {
    let info = res.info();
    if info.kind == "Namespace" && txn.get(res, "", obj.name()).is_some() {
        ensure_namespace_defaults(txn, obj.name());
    }
    if matches!(
        info.plural,
        "pods" | "services" | "configmaps" | "secrets" | "resourcequotas"
    ) {
        quota::recompute(txn, obj.namespace());
    }
}

/// What the service-account and root-CA controllers create in every
/// namespace: the `default` ServiceAccount and `kube-root-ca.crt`.
fn ensure_namespace_defaults(txn: &mut Txn<'_>, ns: &str) {
    let sa = kinds::id("serviceaccounts");
    if txn.get(sa, ns, "default").is_none() {
        let mut obj = json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns}});
        stamp_new_metadata(sa.info(), &mut obj);
        txn.insert(sa, obj);
    }
    let cm = kinds::id("configmaps");
    if txn.get(cm, ns, "kube-root-ca.crt").is_none() {
        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
            "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nkube-sim serves plain HTTP; this bundle is a placeholder\n-----END CERTIFICATE-----\n"}});
        stamp_new_metadata(cm.info(), &mut obj);
        txn.insert(cm, obj);
    }
}

/// Fills `kind`/`apiVersion` from the endpoint when absent (the decoder's
/// defaulting) and refuses a body of another kind.
fn normalize_body(info: &ResourceInfo, body: Value) -> Result<Value, ApiError> {
    let Value::Object(mut map) = body else {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be of type map)",
        ));
    };
    let version = match map.get("apiVersion").and_then(Value::as_str) {
        Some(av) => {
            let (g, v) = av.split_once('/').unwrap_or(("", av));
            if g != info.group || !info.versions.contains(&v) {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({})",
                    info.api_version(info.storage_version())
                )));
            }
            v.to_string()
        }
        None => info.storage_version().to_string(),
    };
    match map.get("kind").and_then(Value::as_str) {
        Some(k) if k != info.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                info.kind
            )));
        }
        _ => {}
    }
    // Stored objects carry the storage version; responses convert back.
    let _ = version;
    map.insert(
        "apiVersion".into(),
        json!(info.api_version(info.storage_version())),
    );
    map.insert("kind".into(), json!(info.kind));
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), json!({}));
    }
    Ok(Value::Object(map))
}

fn check_body_namespace(
    info: &ResourceInfo,
    obj: &mut Value,
    path_ns: &str,
) -> Result<(), ApiError> {
    let m = meta::metadata_mut(obj);
    if info.namespaced {
        match m.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != path_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                m.insert("namespace".into(), json!(path_ns));
            }
        }
    } else {
        m.remove("namespace");
    }
    Ok(())
}

fn stamp_new_metadata(info: &ResourceInfo, obj: &mut Value) {
    let m = meta::metadata_mut(obj);
    m.insert("uid".into(), json!(meta::new_uid()));
    m.insert("creationTimestamp".into(), json!(meta::now_timestamp()));
    m.remove("deletionTimestamp");
    m.remove("deletionGracePeriodSeconds");
    m.remove("selfLink");
    m.remove("managedFields");
    if info.tracks_generation {
        m.insert("generation".into(), json!(1));
    } else {
        m.remove("generation");
    }
}

/// Keeps what a client may not change (uid, creation time, deletion state)
/// and bumps `generation` when the spec changed.
fn carry_system_metadata(info: &ResourceInfo, old: &Value, new: &mut Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let old_meta = meta::metadata(old).cloned().unwrap_or_default();
    let new_uid = meta::meta_str(new, "uid").unwrap_or("").to_string();
    if !new_uid.is_empty() && new_uid != meta::uid(old) {
        errs.push(FieldError::invalid(
            "metadata.uid",
            json!(new_uid),
            "field is immutable",
        ));
    }
    let old_finalizers = meta::finalizers(old);
    let new_finalizers = meta::finalizers(new);
    if meta::deletion_timestamp(old).is_some()
        && new_finalizers.iter().any(|f| !old_finalizers.contains(f))
    {
        errs.push(FieldError::forbidden(
            "metadata.finalizers",
            "no new finalizers can be added if the object is being deleted",
        ));
    }
    let spec_changed = {
        let strip = |v: &Value| {
            let mut v = v.clone();
            if let Some(o) = v.as_object_mut() {
                o.remove("metadata");
                o.remove("status");
            }
            v
        };
        strip(old) != strip(new)
    };
    let m = meta::metadata_mut(new);
    for key in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        match old_meta.get(key) {
            Some(v) => {
                m.insert(key.into(), v.clone());
            }
            None => {
                m.remove(key);
            }
        }
    }
    m.remove("selfLink");
    m.remove("managedFields");
    if info.tracks_generation {
        let current_gen = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        m.insert(
            "generation".into(),
            json!(if spec_changed {
                current_gen + 1
            } else {
                current_gen
            }),
        );
    }
    errs
}

/// Updates keep the allocated cluster IP; changing it is refused.
fn carry_cluster_ip(old: &Value, new: &mut Value) -> Vec<FieldError> {
    let old_ip = meta::path_str(old, "spec.clusterIP")
        .unwrap_or("")
        .to_string();
    let old_ips = meta::path(old, "spec.clusterIPs").cloned();
    let new_ip = meta::path_str(new, "spec.clusterIP")
        .unwrap_or("")
        .to_string();
    if new_ip.is_empty() {
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("clusterIP".into(), json!(old_ip));
            if let Some(ips) = old_ips {
                spec.insert("clusterIPs".into(), ips);
            }
        }
        return Vec::new();
    }
    if new_ip != old_ip {
        return vec![FieldError::invalid(
            "spec.clusterIPs[0]",
            json!(new_ip),
            "may not change once set",
        )];
    }
    if meta::path(new, "spec.clusterIPs").is_none()
        && let (Some(spec), Some(ips)) =
            (new.get_mut("spec").and_then(Value::as_object_mut), old_ips)
    {
        spec.insert("clusterIPs".into(), ips);
    }
    Vec::new()
}

fn validate(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    let mut errs = validation::validate_object_meta(info, obj);
    errs.extend(validation::validate_spec(info, obj));
    if errs.is_empty() {
        Ok(())
    } else {
        let name = meta::name(obj);
        Err(ApiError::invalid(info.group, info.kind, name, &errs))
    }
}

/// NamespaceLifecycle admission: no content in a missing or terminating
/// namespace.
fn admit_namespace_lifecycle(
    txn: &Txn<'_>,
    info: &ResourceInfo,
    obj: &Value,
) -> Result<(), ApiError> {
    if !info.namespaced {
        return Ok(());
    }
    let ns = meta::namespace(obj);
    let namespaces = kinds::id("namespaces");
    match txn.get(namespaces, "", ns) {
        None => Err(ApiError::not_found(namespaces.info().group_resource(), ns)),
        Some(n) if meta::deletion_timestamp(&n.value).is_some() => {
            let mut err = ApiError::forbidden(
                info.group_resource(),
                meta::name(obj),
                &format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            );
            if let Some(d) = err.details.as_deref_mut().and_then(Value::as_object_mut) {
                d.insert(
                    "causes".into(),
                    json!([{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]),
                );
            }
            Err(err)
        }
        Some(_) => Ok(()),
    }
}

/// ServiceAccount admission: a pod's service account must exist.
fn admit_service_account(txn: &Txn<'_>, info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if info.kind != "Pod" {
        return Ok(());
    }
    let ns = meta::namespace(obj);
    let sa = meta::path_str(obj, "spec.serviceAccountName")
        .or_else(|| meta::path_str(obj, "spec.serviceAccount"))
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    if txn.get(kinds::id("serviceaccounts"), ns, sa).is_none() {
        return Err(ApiError::forbidden(
            info.group_resource(),
            meta::name(obj),
            &format!(
                "error looking up service account {ns}/{sa}: serviceaccount \"{sa}\" not found"
            ),
        ));
    }
    Ok(())
}

/// The create handler's answer to a body the typed decoder refuses.
fn decode_error(info: &ResourceInfo, why: &str) -> ApiError {
    let version = info.storage_version();
    ApiError::bad_request(format!(
        "{kind} in version {version:?} cannot be handled as a {kind}: {why}",
        kind = info.kind
    ))
}

/// The patch handler's answer when the patched object does not decode: a
/// `422` on the field `patch`, showing the patched document.
fn patch_decode_error(patched: &Value, why: &str) -> ApiError {
    ApiError::invalid(
        "",
        "",
        "",
        &[FieldError::invalid(
            "patch",
            json!(patched.to_string()),
            why,
        )],
    )
}

/// `AllowCreateOnUpdate`: kinds a PUT may create.
pub fn creates_on_update(info: &ResourceInfo) -> bool {
    info.kind == "Lease"
}

/// The lease strategy without the `CoordinatedLeaderElection` gate (off by
/// default in v1.33): `strategy` and `preferredHolder` are dropped unless
/// the stored object already has them.
fn drop_disabled_lease_fields(old: Option<&Value>, new: &mut Value) {
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for field in ["strategy", "preferredHolder"] {
        if old
            .and_then(|o| o.pointer(&format!("/spec/{field}")))
            .is_none()
        {
            spec.remove(field);
        }
    }
}

/// Whether a DELETE answers with the deleted object (`ReturnDeletedObject`)
/// rather than a `Status`.
pub fn returns_deleted_object(info: &ResourceInfo) -> bool {
    matches!(
        info.kind,
        "Pod" | "Service" | "ServiceAccount" | "Namespace" | "Node"
    ) || info.is_custom()
}

/// Creates the cluster's initial objects (namespaces, the node).
pub fn bootstrap(registry: &Registry, namespaces: &[&str]) {
    for ns in namespaces {
        let _ = registry.create(
            kinds::id("namespaces"),
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            false,
        );
    }
    let _ = registry.create(
        kinds::id("nodes"),
        "",
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": defaults::NODE_NAME, "labels": {
                "kubernetes.io/hostname": defaults::NODE_NAME, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH, "node-role.kubernetes.io/control-plane": ""}},
            "spec": {}}),
        false,
    );
    let node = kinds::id("nodes");
    registry.mutate(node, "", defaults::NODE_NAME, |n| {
        *meta::path_mut(n, "status") = json!({
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": defaults::NODE_NAME}],
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "5000", "ephemeral-storage": "1Ti"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "5000", "ephemeral-storage": "1Ti"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": meta::now_timestamp(),
                "lastTransitionTime": meta::now_timestamp()}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-kube-sim", "containerRuntimeVersion": "kube-sim://local-processes",
                "operatingSystem": "linux", "architecture": std::env::consts::ARCH}
        });
        true
    });
}
