//! ResourceQuota: admission of new objects against `status.hard`/`used`
//! (with the apiserver's 403 message shapes) and the quota controller's
//! usage accounting, run synchronously inside the write that changes usage.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::kinds::{self, ResourceInfo};
use crate::meta;
use crate::storage::quantity::Quantity;
use crate::storage::store::Txn;

/// Resources that, when quota'd, every container must declare.
const COMPUTE: &[&str] = &[
    "cpu",
    "memory",
    "requests.cpu",
    "requests.memory",
    "limits.cpu",
    "limits.memory",
];

fn quotas_in(txn: &Txn<'_>, ns: &str) -> Vec<Value> {
    txn.list(kinds::id("resourcequotas"), Some(ns))
        .iter()
        .map(|q| q.value.clone())
        .collect()
}

fn hard_of(quota: &Value) -> BTreeMap<String, Quantity> {
    quota
        .pointer("/spec/hard")
        .and_then(Value::as_object)
        .map(|h| {
            h.iter()
                .filter_map(|(k, v)| {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        _ => return None,
                    };
                    Quantity::parse(&text).map(|q| (k.clone(), q))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn is_terminal(pod: &Value) -> bool {
    matches!(
        meta::path_str(pod, "status.phase"),
        Some("Succeeded") | Some("Failed")
    )
}

fn container_quantity(c: &Value, section: &str, res: &str) -> Option<Quantity> {
    c.pointer(&format!("/resources/{section}/{res}"))
        .and_then(Value::as_str)
        .and_then(Quantity::parse)
}

/// What one pod counts against a quota (`PodUsageFunc`): the larger of the
/// containers' sum and any single init container.
pub fn pod_usage(pod: &Value) -> BTreeMap<String, Quantity> {
    let mut usage = BTreeMap::new();
    usage.insert("pods".to_string(), Quantity::from_count(1));
    usage.insert("count/pods".to_string(), Quantity::from_count(1));
    let list = |g: &str| {
        pod.pointer(&format!("/spec/{g}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let containers = list("containers");
    let inits = list("initContainers");
    for (key, section, res) in [
        ("requests.cpu", "requests", "cpu"),
        ("requests.memory", "requests", "memory"),
        ("limits.cpu", "limits", "cpu"),
        ("limits.memory", "limits", "memory"),
    ] {
        let sum = containers
            .iter()
            .filter_map(|c| container_quantity(c, section, res))
            .fold(None::<Quantity>, |acc, q| {
                Some(acc.map_or(q, |a| a.plus(q)))
            });
        let init_max = inits
            .iter()
            .filter_map(|c| container_quantity(c, section, res))
            .max_by_key(|q| q.milli);
        let total = match (sum, init_max) {
            (Some(s), Some(i)) => Some(if i.milli > s.milli { i } else { s }),
            (s, i) => s.or(i),
        };
        if let Some(q) = total {
            usage.insert(key.to_string(), q);
            if section == "requests" {
                usage.insert(res.to_string(), q);
            }
        }
    }
    usage
}

fn pretty(map: &BTreeMap<String, Quantity>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", v.canonical()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Usage of every quota'd resource in a namespace, from the stored objects.
fn namespace_usage(txn: &Txn<'_>, ns: &str) -> BTreeMap<String, Quantity> {
    let mut used: BTreeMap<String, Quantity> = BTreeMap::new();
    let mut add = |k: &str, q: Quantity| {
        let e = used.entry(k.to_string()).or_default();
        *e = e.plus(q);
    };
    for pod in txn.list(kinds::pods(), Some(ns)) {
        if is_terminal(&pod.value) {
            continue;
        }
        for (k, q) in pod_usage(&pod.value) {
            add(&k, q);
        }
    }
    for (plural, key) in [
        ("services", "services"),
        ("configmaps", "configmaps"),
        ("secrets", "secrets"),
        ("resourcequotas", "resourcequotas"),
    ] {
        let n = txn.list(kinds::id(plural), Some(ns)).len() as i128;
        add(key, Quantity::from_count(n));
        add(&format!("count/{plural}"), Quantity::from_count(n));
    }
    used
}

/// Recomputes `status.hard`/`status.used` of every quota in `ns`.
pub fn recompute(txn: &mut Txn<'_>, ns: &str) {
    let quotas = quotas_in(txn, ns);
    if quotas.is_empty() {
        return;
    }
    let usage = namespace_usage(txn, ns);
    for q in quotas {
        let hard = hard_of(&q);
        let hard_json: serde_json::Map<String, Value> = q
            .pointer("/spec/hard")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let used_json: serde_json::Map<String, Value> = hard
            .keys()
            .map(|k| {
                let mut u = usage.get(k).copied().unwrap_or_default();
                if let Some(h) = hard.get(k) {
                    u.binary = h.binary;
                }
                (k.clone(), json!(u.canonical()))
            })
            .collect();
        let status = json!({"hard": hard_json, "used": used_json});
        if q.get("status") != Some(&status) {
            let mut updated = q.clone();
            if let Some(o) = updated.as_object_mut() {
                o.insert("status".into(), status);
            }
            txn.replace(kinds::id("resourcequotas"), updated);
        }
    }
}

/// Quota admission for a new pod: missing compute declarations first
/// (`failed quota: …: must specify …`), then limits (`exceeded quota: …`).
pub fn admit_pod(txn: &Txn<'_>, pod: &Value) -> Result<(), ApiError> {
    let ns = meta::namespace(pod);
    let quotas = quotas_in(txn, ns);
    if quotas.is_empty() {
        return Ok(());
    }
    let gr = kinds::pods().info().group_resource();
    let name = meta::name(pod);
    let requested = pod_usage(pod);
    let usage = namespace_usage(txn, ns);
    for q in &quotas {
        let qname = meta::name(q);
        let hard = hard_of(q);
        let required: Vec<&str> = COMPUTE
            .iter()
            .copied()
            .filter(|r| hard.contains_key(*r))
            .collect();
        if !required.is_empty() {
            let mut missing: Vec<&str> = Vec::new();
            for group in ["containers", "initContainers"] {
                for c in pod
                    .pointer(&format!("/spec/{group}"))
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    for r in &required {
                        let (section, res) = match *r {
                            "cpu" | "requests.cpu" => ("requests", "cpu"),
                            "memory" | "requests.memory" => ("requests", "memory"),
                            "limits.cpu" => ("limits", "cpu"),
                            _ => ("limits", "memory"),
                        };
                        if container_quantity(c, section, res).is_none() && !missing.contains(r) {
                            missing.push(r);
                        }
                    }
                }
            }
            if !missing.is_empty() {
                missing.sort_unstable();
                return Err(ApiError::forbidden(
                    gr,
                    name,
                    &format!("failed quota: {qname}: must specify {}", missing.join(",")),
                ));
            }
        }
        let mut exceeded = Vec::new();
        for (k, h) in &hard {
            if let Some(req) = requested.get(k) {
                let used = usage.get(k).copied().unwrap_or_default();
                if used.milli + req.milli > h.milli {
                    exceeded.push(k.clone());
                }
            }
        }
        if !exceeded.is_empty() {
            let pick = |m: &BTreeMap<String, Quantity>| -> BTreeMap<String, Quantity> {
                exceeded
                    .iter()
                    .map(|k| {
                        let mut v = m.get(k).copied().unwrap_or_default();
                        if let Some(h) = hard.get(k) {
                            v.binary = h.binary;
                        }
                        (k.clone(), v)
                    })
                    .collect()
            };
            return Err(ApiError::forbidden(
                gr,
                name,
                &format!(
                    "exceeded quota: {qname}, requested: {}, used: {}, limited: {}",
                    pretty(&pick(&requested)),
                    pretty(&pick(&usage)),
                    pretty(&pick(&hard))
                ),
            ));
        }
    }
    Ok(())
}

/// Object-count quota (`services`, `configmaps`, `count/<resource>`).
pub fn admit_object_count(txn: &Txn<'_>, info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if !info.namespaced {
        return Ok(());
    }
    let ns = meta::namespace(obj);
    let quotas = quotas_in(txn, ns);
    if quotas.is_empty() {
        return Ok(());
    }
    let keys = [info.plural.to_string(), format!("count/{}", info.plural)];
    let usage = namespace_usage(txn, ns);
    for q in &quotas {
        let hard = hard_of(q);
        for key in &keys {
            if let Some(h) = hard.get(key) {
                let used = usage.get(key).copied().unwrap_or_default();
                if used.milli + 1000 > h.milli {
                    return Err(ApiError::forbidden(
                        info.group_resource(),
                        meta::name(obj),
                        &format!(
                            "exceeded quota: {}, requested: {key}=1, used: {key}={}, limited: {key}={}",
                            meta::name(q),
                            used.canonical(),
                            h.canonical()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_usage_takes_the_larger_of_containers_and_init_containers() {
        let pod = json!({"spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "2"}}}],
            "containers": [{"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}},
                           {"name": "b", "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}]}});
        let u = pod_usage(&pod);
        assert_eq!(u["limits.cpu"].canonical(), "2");
        assert_eq!(u["limits.memory"].canonical(), "512Mi");
        assert_eq!(u["pods"].canonical(), "1");
    }
}
