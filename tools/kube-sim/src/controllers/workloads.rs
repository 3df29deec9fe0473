//! The Deployment and ReplicaSet controllers, as kube-controller-manager
//! runs them: a Deployment owns one ReplicaSet per pod template (named by
//! the template's hash), a ReplicaSet keeps its count of pods, and a
//! rolling update moves pods from the old ReplicaSets to the new one within
//! `maxSurge` and `maxUnavailable`, counting a pod available once the
//! kubelet reports it Ready (its readiness probe passed). `Recreate` scales
//! the old ReplicaSets to zero and waits for their pods to be gone first.
//!
//! Pods are created through the registry as any client's would be
//! (admission, quota, the service account check); one that cannot be is
//! reported on its ReplicaSet's `ReplicaFailure` condition.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash as _, Hasher as _};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::kinds;
use crate::meta;
use crate::storage::registry::{DeleteOptions, Registry};
use crate::storage::store::ObjRef;

/// The label a Deployment's ReplicaSets and their pods carry.
pub const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// Coalesces bursts of changes into one pass.
const DEBOUNCE: Duration = Duration::from_millis(20);
/// Pods one ReplicaSet creates in one pass (the controller's slow start
/// is not modelled, its bound is).
const BURST: usize = 500;

pub async fn run(registry: Arc<Registry>, shutdown: CancellationToken) {
    let store = registry.store.clone();
    let mut deployments = store.subscribe(kinds::id("deployments"));
    let mut replica_sets = store.subscribe(kinds::id("replicasets"));
    let mut pods = store.subscribe(kinds::pods());
    loop {
        reconcile(&registry);
        tokio::select! {
            r = deployments.changed() => if r.is_err() { return },
            r = replica_sets.changed() => if r.is_err() { return },
            r = pods.changed() => if r.is_err() { return },
            () = shutdown.cancelled() => return,
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

/// One pass: every ReplicaSet's pods and status, then every Deployment's
/// ReplicaSets and status.
pub fn reconcile(registry: &Registry) {
    let (sets, _) = registry.store.snapshot(kinds::id("replicasets"), None);
    let (deployments, _) = registry.store.snapshot(kinds::id("deployments"), None);
    if sets.is_empty() && deployments.is_empty() {
        return;
    }
    let (pods, _) = registry.store.snapshot(kinds::pods(), None);
    let mut owned: HashMap<String, Vec<ObjRef>> = HashMap::new();
    for pod in pods {
        if let Some(owner) = controller_uid(&pod.value) {
            owned.entry(owner).or_default().push(pod);
        }
    }
    let mut sets_now = Vec::new();
    for set in &sets {
        let pods = owned.remove(set.uid()).unwrap_or_default();
        sets_now.push(sync_replica_set(registry, set, &pods));
    }
    for deployment in &deployments {
        let mine: Vec<&SetView> = sets_now
            .iter()
            .filter(|s| s.owner.as_deref() == Some(deployment.uid()))
            .collect();
        sync_deployment(registry, deployment, &mine);
    }
}

/// The uid of `obj`'s controlling owner.
fn controller_uid(obj: &Value) -> Option<String> {
    meta::metadata(obj)?
        .get("ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|r| r.get("uid"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn is_active(pod: &Value) -> bool {
    meta::deletion_timestamp(pod).is_none()
        && !matches!(
            meta::path_str(pod, "status.phase"),
            Some("Succeeded" | "Failed")
        )
}

fn is_ready(pod: &Value) -> bool {
    meta::path(pod, "status.conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

fn int_at(obj: &Value, dotted: &str) -> i64 {
    meta::path(obj, dotted).and_then(Value::as_i64).unwrap_or(0)
}

/// A ReplicaSet as this pass left it.
struct SetView {
    namespace: String,
    name: String,
    owner: Option<String>,
    hash: Option<String>,
    revision: i64,
    created: String,
    spec: i64,
    /// Active pods, ready pods (available: `minReadySeconds` is 0), and
    /// every pod including those terminating.
    replicas: i64,
    ready: i64,
    all_pods: usize,
}

fn sync_replica_set(registry: &Registry, set: &ObjRef, pods: &[ObjRef]) -> SetView {
    let value = &set.value;
    let (ns, name) = (set.namespace(), set.name());
    let desired = int_at(value, "spec.replicas").max(0);
    let mut active: Vec<&ObjRef> = pods.iter().filter(|p| is_active(&p.value)).collect();
    let deleting = meta::deletion_timestamp(value).is_some();
    let mut failure = None;
    let count = i64::try_from(active.len()).unwrap_or(i64::MAX);
    if !deleting && count < desired {
        let missing = usize::try_from(desired - count).unwrap_or(0).min(BURST);
        for _ in 0..missing {
            match registry.create(kinds::pods(), ns, pod_for(value), false) {
                Ok(_) => {}
                Err(err) => {
                    failure = Some(err.message.clone());
                    break;
                }
            }
        }
    } else if !deleting && count > desired {
        // The ones doing least first: not scheduled or pending, then not
        // ready, then the newest.
        active.sort_by_key(|p| {
            let pending = meta::path_str(&p.value, "status.phase") != Some("Running");
            let ready = is_ready(&p.value);
            let created = meta::meta_str(&p.value, "creationTimestamp")
                .unwrap_or("")
                .to_owned();
            (!pending, ready, std::cmp::Reverse(created))
        });
        let extra = usize::try_from(count - desired).unwrap_or(0);
        for pod in active.drain(..extra) {
            let _ = registry.delete(kinds::pods(), ns, pod.name(), &DeleteOptions::default());
        }
    }
    let replicas = i64::try_from(active.len()).unwrap_or(i64::MAX);
    let ready =
        i64::try_from(active.iter().filter(|p| is_ready(&p.value)).count()).unwrap_or(i64::MAX);
    let generation = meta::metadata(value)
        .and_then(|m| m.get("generation"))
        .cloned()
        .unwrap_or(json!(1));
    let labels = meta::path(value, "spec.selector.matchLabels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let fully_labeled = active
        .iter()
        .filter(|p| {
            let have = meta::labels(&p.value);
            labels
                .iter()
                .all(|(k, v)| have.and_then(|l| l.get(k)) == Some(v))
        })
        .count();
    registry.mutate(kinds::id("replicasets"), ns, name, |v| {
        if meta::uid(v) != set.uid() {
            return false;
        }
        let mut status = json!({
            "replicas": replicas,
            "fullyLabeledReplicas": fully_labeled,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": generation,
        });
        if let Some(message) = &failure {
            status["conditions"] = json!([{
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": message,
                "lastTransitionTime": meta::now_timestamp(),
            }]);
        } else if let Some(previous) = meta::path(v, "status.conditions") {
            // A failure stays reported until a pass creates what it must.
            if count >= desired {
                status["conditions"] = json!([]);
            } else {
                status["conditions"] = previous.clone();
            }
        }
        if status["conditions"] == json!([]) {
            status.as_object_mut().map(|s| s.remove("conditions"));
        }
        *meta::path_mut(v, "status") = status;
        true
    });
    SetView {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        owner: controller_uid(value),
        hash: meta::labels(value)
            .and_then(|l| l.get(TEMPLATE_HASH_LABEL))
            .and_then(Value::as_str)
            .map(str::to_owned),
        revision: meta::metadata(value)
            .and_then(|m| m.get("annotations"))
            .and_then(|a| a.get(REVISION_ANNOTATION))
            .and_then(Value::as_str)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0),
        created: meta::meta_str(value, "creationTimestamp")
            .unwrap_or("")
            .to_owned(),
        spec: desired,
        replicas,
        ready,
        all_pods: pods.len(),
    }
}

/// A pod of `set`'s template, owned by it.
fn pod_for(set: &Value) -> Value {
    let template = meta::path(set, "spec.template")
        .cloned()
        .unwrap_or(json!({}));
    let mut metadata = template
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    metadata.remove("name");
    metadata.insert(
        "generateName".into(),
        json!(format!("{}-", meta::name(set))),
    );
    metadata.insert("namespace".into(), json!(meta::namespace(set)));
    metadata.insert(
        "ownerReferences".into(),
        json!([owner_reference("ReplicaSet", set)]),
    );
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
    })
}

fn owner_reference(kind: &str, owner: &Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": meta::name(owner),
        "uid": meta::uid(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// The pod template's hash, as the controller names a template's
/// ReplicaSet with: stable for one template, in the alphabet Kubernetes
/// uses for generated names.
pub fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    template.to_string().hash(&mut hasher);
    let mut n = hasher.finish();
    let mut out = String::new();
    for _ in 0..10 {
        let index = usize::try_from(n % ALPHABET.len() as u64).unwrap_or(0);
        out.push(char::from(ALPHABET[index]));
        n /= ALPHABET.len() as u64;
    }
    out
}

/// An `intOrString` of a rolling update: a count, or a percentage of
/// `total` rounded up (`maxSurge`) or down (`maxUnavailable`).
fn scaled(value: Option<&Value>, total: i64, round_up: bool) -> i64 {
    match value {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0).max(0),
        Some(Value::String(s)) => {
            let percent: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let scaled = total * percent;
            if round_up {
                (scaled + 99) / 100
            } else {
                scaled / 100
            }
        }
        _ => 0,
    }
}

fn sync_deployment(registry: &Registry, deployment: &ObjRef, sets: &[&SetView]) {
    let value = &deployment.value;
    if meta::deletion_timestamp(value).is_some() {
        return;
    }
    let ns = deployment.namespace();
    let desired = int_at(value, "spec.replicas").max(0);
    let template = meta::path(value, "spec.template")
        .cloned()
        .unwrap_or(json!({}));
    let hash = template_hash(&template);
    let mut new = sets
        .iter()
        .find(|s| s.hash.as_deref() == Some(&hash))
        .copied();
    let mut olds: Vec<&SetView> = sets
        .iter()
        .filter(|s| s.hash.as_deref() != Some(&hash))
        .copied()
        .collect();
    olds.sort_by(|a, b| a.created.cmp(&b.created));
    let recreate = meta::path_str(value, "spec.strategy.type") == Some("Recreate");
    let created;
    if new.is_none() {
        let revision = sets.iter().map(|s| s.revision).max().unwrap_or(0) + 1;
        let initial = if recreate || !sets.is_empty() {
            0
        } else {
            desired
        };
        let Some(set) = create_set(registry, value, &template, &hash, revision, initial) else {
            return;
        };
        created = set;
        new = Some(&created);
    }
    let Some(new) = new else { return };
    let mut scale: BTreeMap<String, i64> = BTreeMap::new();
    if recreate {
        if olds.iter().any(|s| s.spec > 0) {
            for old in &olds {
                scale.insert(old.name.clone(), 0);
            }
        } else if olds.iter().all(|s| s.all_pods == 0) {
            scale.insert(new.name.clone(), desired);
        }
    } else {
        let rolling = meta::path(value, "spec.strategy.rollingUpdate");
        let surge = scaled(rolling.and_then(|r| r.get("maxSurge")), desired, true);
        let mut unavailable = scaled(
            rolling.and_then(|r| r.get("maxUnavailable")),
            desired,
            false,
        );
        if surge == 0 && unavailable == 0 {
            unavailable = 1;
        }
        let all_spec: i64 = sets.iter().map(|s| s.spec).sum();
        // Up: the new set grows while the total stays within the surge.
        let mut new_spec = new.spec;
        if new_spec > desired {
            new_spec = desired;
        } else if new_spec < desired {
            let room = (desired + surge - all_spec).max(0);
            new_spec = (new_spec + room).min(desired);
        }
        scale.insert(new.name.clone(), new_spec);
        // Down: old pods go while enough stay available.
        let min_available = desired - unavailable;
        let new_unavailable = (new_spec - new.ready).max(0);
        let all_after_up = all_spec - new.spec + new_spec;
        let mut budget = all_after_up - min_available - new_unavailable;
        // Old pods that are not available go first, then the oldest sets'.
        for old in &olds {
            let unhealthy = (old.spec - old.ready).max(0);
            let take = unhealthy.min(budget.max(0));
            if take > 0 {
                scale.insert(old.name.clone(), old.spec - take);
                budget -= take;
            }
        }
        let available: i64 = sets.iter().map(|s| s.ready).sum();
        let mut down = available - min_available - new_unavailable;
        for old in &olds {
            let now = scale.get(&old.name).copied().unwrap_or(old.spec);
            let take = now.min(down.max(0));
            if take > 0 {
                scale.insert(old.name.clone(), now - take);
                down -= take;
            }
        }
    }
    for (name, replicas) in &scale {
        registry.mutate(kinds::id("replicasets"), ns, name, |v| {
            if int_at(v, "spec.replicas") == *replicas {
                return false;
            }
            *meta::path_mut(v, "spec.replicas") = json!(replicas);
            true
        });
    }
    prune_history(registry, value, &olds, &scale);
    let replicas: i64 = sets.iter().map(|s| s.replicas).sum();
    let ready: i64 = sets.iter().map(|s| s.ready).sum();
    let updated = new.replicas;
    let generation = meta::metadata(value)
        .and_then(|m| m.get("generation"))
        .cloned()
        .unwrap_or(json!(1));
    let complete =
        updated == desired && replicas == desired && ready == desired && new.spec == desired;
    let rolling = meta::path(value, "spec.strategy.rollingUpdate");
    let min_available = if recreate {
        desired
    } else {
        desired
            - scaled(
                rolling.and_then(|r| r.get("maxUnavailable")),
                desired,
                false,
            )
    };
    registry.mutate(kinds::id("deployments"), ns, deployment.name(), |v| {
        if meta::uid(v) != deployment.uid() {
            return false;
        }
        let previous = meta::path(v, "status.conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let available = ready >= min_available;
        let conditions = vec![
            condition(
                &previous,
                "Available",
                available,
                if available {
                    "MinimumReplicasAvailable"
                } else {
                    "MinimumReplicasUnavailable"
                },
                if available {
                    "Deployment has minimum availability."
                } else {
                    "Deployment does not have minimum availability."
                },
            ),
            condition(
                &previous,
                "Progressing",
                true,
                if complete {
                    "NewReplicaSetAvailable"
                } else {
                    "ReplicaSetUpdated"
                },
                &if complete {
                    format!("ReplicaSet \"{}\" has successfully progressed.", new.name)
                } else {
                    format!("ReplicaSet \"{}\" is progressing.", new.name)
                },
            ),
        ];
        let mut status = Map::new();
        status.insert("observedGeneration".into(), generation.clone());
        status.insert("replicas".into(), json!(replicas));
        status.insert("updatedReplicas".into(), json!(updated));
        status.insert("readyReplicas".into(), json!(ready));
        status.insert("availableReplicas".into(), json!(ready));
        let missing = (desired - ready).max(0);
        if missing > 0 {
            status.insert("unavailableReplicas".into(), json!(missing));
        }
        status.insert("conditions".into(), Value::Array(conditions));
        for key in [
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
        ] {
            if status.get(key) == Some(&json!(0)) {
                status.remove(key);
            }
        }
        *meta::path_mut(v, "status") = Value::Object(status);
        true
    });
}

/// A condition of `kind`, keeping its transition time while its status
/// does not change.
fn condition(previous: &[Value], kind: &str, on: bool, reason: &str, message: &str) -> Value {
    let status = if on { "True" } else { "False" };
    let now = meta::now_timestamp();
    let kept = previous
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind));
    let transition = match kept {
        Some(c) if c.get("status").and_then(Value::as_str) == Some(status) => {
            c.get("lastTransitionTime").cloned().unwrap_or(json!(now))
        }
        _ => json!(now),
    };
    let update = match kept {
        Some(c)
            if c.get("status").and_then(Value::as_str) == Some(status)
                && c.get("reason").and_then(Value::as_str) == Some(reason) =>
        {
            c.get("lastUpdateTime").cloned().unwrap_or(json!(now))
        }
        _ => json!(now),
    };
    json!({
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "lastUpdateTime": update,
    })
}

fn create_set(
    registry: &Registry,
    deployment: &Value,
    template: &Value,
    hash: &str,
    revision: i64,
    replicas: i64,
) -> Option<SetView> {
    let mut template = template.clone();
    let mut labels = meta::path(&template, "metadata.labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    labels.insert(TEMPLATE_HASH_LABEL.into(), json!(hash));
    *meta::path_mut(&mut template, "metadata.labels") = Value::Object(labels);
    let mut selector = meta::path(deployment, "spec.selector")
        .cloned()
        .unwrap_or(json!({}));
    *meta::path_mut(&mut selector, &format!("matchLabels.{TEMPLATE_HASH_LABEL}")) = json!(hash);
    let labels = meta::path(&template, "metadata.labels")
        .cloned()
        .unwrap_or(json!({}));
    let name = format!("{}-{hash}", meta::name(deployment));
    let body = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": meta::namespace(deployment),
            "labels": labels,
            "annotations": {REVISION_ANNOTATION: revision.to_string()},
            "ownerReferences": [owner_reference("Deployment", deployment)],
        },
        "spec": {"replicas": replicas, "selector": selector, "template": template},
    });
    let set = registry
        .create(
            kinds::id("replicasets"),
            meta::namespace(deployment),
            body,
            false,
        )
        .ok()?;
    Some(SetView {
        namespace: set.namespace().to_owned(),
        name: set.name().to_owned(),
        owner: controller_uid(&set.value),
        hash: Some(hash.to_owned()),
        revision,
        created: meta::meta_str(&set.value, "creationTimestamp")
            .unwrap_or("")
            .to_owned(),
        spec: replicas,
        replicas: 0,
        ready: 0,
        all_pods: 0,
    })
}

/// Old ReplicaSets past `revisionHistoryLimit` that hold no pods go.
fn prune_history(
    registry: &Registry,
    deployment: &Value,
    olds: &[&SetView],
    scale: &BTreeMap<String, i64>,
) {
    let limit = usize::try_from(int_at(deployment, "spec.revisionHistoryLimit")).unwrap_or(10);
    let idle: Vec<&&SetView> = olds
        .iter()
        .filter(|s| scale.get(&s.name).copied().unwrap_or(s.spec) == 0 && s.all_pods == 0)
        .collect();
    if idle.len() <= limit {
        return;
    }
    for set in &idle[..idle.len() - limit] {
        let _ = registry.delete(
            kinds::id("replicasets"),
            &set.namespace,
            &set.name,
            &DeleteOptions::default(),
        );
    }
}
