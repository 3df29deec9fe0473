//! The simulated Gateway API controller: it owns GatewayClasses whose
//! `spec.controllerName` is [`CONTROLLER_NAME`], programs their Gateways,
//! and sets `Accepted`/`ResolvedRefs` on each HTTPRoute parent it owns —
//! refusing routes no listener admits with `NotAllowedByListeners`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::Switch;
use crate::kinds;
use crate::meta;
use crate::storage::registry::Registry;
use crate::storage::selectors::LabelSelector;
use crate::storage::store::Store;

pub const CONTROLLER_NAME: &str = "kube-sim.dev/gateway-controller";
const GROUP: &str = "gateway.networking.k8s.io";
const DEBOUNCE: Duration = Duration::from_millis(20);

fn cond(
    ty: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: i64,
    previous: Option<&Value>,
) -> Value {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
        })
        .filter(|c| c.get("status").and_then(Value::as_str) == Some(status))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(meta::now_timestamp()));
    json!({"type": ty, "status": status, "reason": reason, "message": message,
           "observedGeneration": generation, "lastTransitionTime": since})
}

fn generation(obj: &Value) -> i64 {
    meta::metadata(obj)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

/// The verdict for one parent reference of a route.
#[derive(Debug, Clone, PartialEq)]
pub struct ParentVerdict {
    pub accepted: Result<(), (String, String)>,
    pub resolved: Result<(), (String, String)>,
}

/// Does `listener` admit an HTTPRoute from namespace `route_ns` (labels
/// `ns_labels`) with `hostnames`?
fn listener_admits(
    listener: &Value,
    gw_ns: &str,
    route_ns: &str,
    ns_labels: &Map<String, Value>,
    hostnames: &[String],
) -> bool {
    let protocol = listener
        .get("protocol")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kinds = listener
        .pointer("/allowedRoutes/kinds")
        .and_then(Value::as_array);
    let kind_ok = match kinds {
        Some(ks) if !ks.is_empty() => ks
            .iter()
            .any(|k| k.get("kind").and_then(Value::as_str) == Some("HTTPRoute")),
        _ => protocol == "HTTP" || protocol == "HTTPS",
    };
    if !kind_ok {
        return false;
    }
    let from = listener
        .pointer("/allowedRoutes/namespaces/from")
        .and_then(Value::as_str)
        .unwrap_or("Same");
    let ns_ok = match from {
        "All" => true,
        "Same" => gw_ns == route_ns,
        "Selector" => listener
            .pointer("/allowedRoutes/namespaces/selector/matchLabels")
            .and_then(Value::as_object)
            .map(|ml| {
                let sel = LabelSelector::from_match_labels(ml);
                sel.matches(&json!({"metadata": {"labels": ns_labels}}))
            })
            .unwrap_or(false),
        _ => false,
    };
    if !ns_ok {
        return false;
    }
    match listener.get("hostname").and_then(Value::as_str) {
        None => true,
        Some(lh) => hostnames.is_empty() || hostnames.iter().any(|h| hostname_matches(lh, h)),
    }
}

fn hostname_matches(listener: &str, route: &str) -> bool {
    if listener == route {
        return true;
    }
    match listener.strip_prefix("*.") {
        Some(suffix) => route.ends_with(&format!(".{suffix}")),
        None => route
            .strip_prefix("*.")
            .is_some_and(|s| listener.ends_with(&format!(".{s}"))),
    }
}

/// Judges one parent reference of `route` against `gateway`.
pub fn judge(
    route: &Value,
    parent: &Value,
    gateway: &Value,
    ns_labels: &Map<String, Value>,
    service_exists: &dyn Fn(&str, &str) -> bool,
) -> ParentVerdict {
    let route_ns = meta::namespace(route);
    let gw_ns = meta::namespace(gateway);
    let hostnames: Vec<String> = meta::path(route, "spec.hostnames")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|h| h.as_str().map(str::to_string))
        .collect();
    let listeners: Vec<Value> = meta::path(gateway, "spec.listeners")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let section = parent.get("sectionName").and_then(Value::as_str);
    let candidates: Vec<&Value> = listeners
        .iter()
        .filter(|l| section.is_none_or(|s| l.get("name").and_then(Value::as_str) == Some(s)))
        .collect();
    let accepted = if candidates.is_empty() {
        Err((
            "NoMatchingParent".to_string(),
            format!(
                "No listener named {:?} on Gateway {gw_ns}/{}",
                section.unwrap_or(""),
                meta::name(gateway)
            ),
        ))
    } else if candidates
        .iter()
        .any(|l| listener_admits(l, gw_ns, route_ns, ns_labels, &hostnames))
    {
        Ok(())
    } else {
        let hostname_only = candidates.iter().any(|l| {
            let mut relaxed = (*l).clone();
            if let Some(o) = relaxed.as_object_mut() {
                o.remove("hostname");
            }
            listener_admits(&relaxed, gw_ns, route_ns, ns_labels, &hostnames)
        });
        if hostname_only {
            Err((
                "NoMatchingListenerHostname".to_string(),
                "No matching listener hostname".to_string(),
            ))
        } else {
            Err((
                "NotAllowedByListeners".to_string(),
                "No listeners included by this parent ref allowed this attachment.".to_string(),
            ))
        }
    };
    let mut resolved = Ok(());
    for rule in meta::path(route, "spec.rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for b in rule
            .get("backendRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let kind = b.get("kind").and_then(Value::as_str).unwrap_or("Service");
            let group = b.get("group").and_then(Value::as_str).unwrap_or("");
            let name = b.get("name").and_then(Value::as_str).unwrap_or("");
            let ns = b
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or(route_ns);
            if kind != "Service" || !group.is_empty() {
                resolved = Err((
                    "InvalidKind".to_string(),
                    format!("Unsupported backend kind {group}/{kind}"),
                ));
            } else if ns != route_ns {
                resolved = Err((
                    "RefNotPermitted".to_string(),
                    format!(
                        "Backend ref to Service {ns}/{name} not permitted by any ReferenceGrant"
                    ),
                ));
            } else if !service_exists(ns, name) {
                resolved = Err((
                    "BackendNotFound".to_string(),
                    format!("Service {ns}/{name} not found"),
                ));
            }
        }
    }
    ParentVerdict { accepted, resolved }
}

fn ours(store: &Store, gateway: &Value) -> bool {
    let class = meta::path_str(gateway, "spec.gatewayClassName").unwrap_or("");
    store
        .get(kinds::id("gatewayclasses"), "", class)
        .is_some_and(|c| meta::path_str(&c.value, "spec.controllerName") == Some(CONTROLLER_NAME))
}

fn reconcile(registry: &Registry) {
    let store = &registry.store;
    let classes = kinds::id("gatewayclasses");
    let gateways = kinds::id("gateways");
    let routes = kinds::id("httproutes");
    let namespaces = kinds::id("namespaces");
    for c in store.snapshot(classes, None).0 {
        if meta::path_str(&c.value, "spec.controllerName") != Some(CONTROLLER_NAME) {
            continue;
        }
        let generation_now = generation(&c.value);
        registry.mutate(classes, "", c.name(), |v| {
            let prev = meta::path(v, "status.conditions").cloned();
            let conds = json!([cond(
                "Accepted",
                true,
                "Accepted",
                "Handled by kube-sim",
                generation_now,
                prev.as_ref()
            )]);
            *meta::path_mut(v, "status.conditions") = conds;
            true
        });
    }
    let (route_objs, _) = store.snapshot(routes, None);
    for gw in store.snapshot(gateways, None).0 {
        if !ours(store, &gw.value) {
            continue;
        }
        let generation_now = generation(&gw.value);
        let listeners: Vec<Value> = meta::path(&gw.value, "spec.listeners")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let attached = |listener: &str| {
            route_objs
                .iter()
                .filter(|r| {
                    meta::path(&r.value, "spec.parentRefs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .any(|p| {
                            p.get("name").and_then(Value::as_str) == Some(gw.name())
                                && p.get("namespace")
                                    .and_then(Value::as_str)
                                    .unwrap_or(r.namespace())
                                    == gw.namespace()
                                && p.get("sectionName")
                                    .and_then(Value::as_str)
                                    .is_none_or(|s| s == listener)
                        })
                })
                .count()
        };
        let listener_status: Vec<Value> = listeners
            .iter()
            .map(|l| {
                let name = l.get("name").and_then(Value::as_str).unwrap_or("");
                json!({"name": name, "attachedRoutes": attached(name),
                       "supportedKinds": [{"group": GROUP, "kind": "HTTPRoute"}],
                       "conditions": [cond("Accepted", true, "Accepted", "", generation_now, None),
                                      cond("Programmed", true, "Programmed", "", generation_now, None),
                                      cond("ResolvedRefs", true, "ResolvedRefs", "", generation_now, None)]})
            })
            .collect();
        registry.mutate(gateways, gw.namespace(), gw.name(), |v| {
            let prev = meta::path(v, "status.conditions").cloned();
            let status = json!({
                "addresses": [{"type": "IPAddress", "value": "127.0.0.1"}],
                "conditions": [cond("Accepted", true, "Accepted", "", generation_now, prev.as_ref()),
                               cond("Programmed", true, "Programmed", "", generation_now, prev.as_ref())],
                "listeners": listener_status,
            });
            // Keep transition times stable for unchanged listener conditions.
            if v.get("status").map(|s| strip_times(s.clone())) == Some(strip_times(status.clone())) {
                return false;
            }
            if let Some(o) = v.as_object_mut() {
                o.insert("status".into(), status);
            }
            true
        });
    }
    for r in route_objs {
        let route_ns = r.namespace().to_string();
        let ns_labels = store
            .get(namespaces, "", &route_ns)
            .and_then(|n| meta::labels(&n.value).cloned())
            .unwrap_or_default();
        let generation_now = generation(&r.value);
        let mut parents_status = Vec::new();
        for p in meta::path(&r.value, "spec.parentRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let kind = p.get("kind").and_then(Value::as_str).unwrap_or("Gateway");
            let group = p.get("group").and_then(Value::as_str).unwrap_or(GROUP);
            if kind != "Gateway" || group != GROUP {
                continue;
            }
            let gw_ns = p
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or(&route_ns);
            let gw_name = p.get("name").and_then(Value::as_str).unwrap_or("");
            let Some(gw) = store.get(gateways, gw_ns, gw_name) else {
                continue;
            };
            if !ours(store, &gw.value) {
                continue;
            }
            let exists =
                |ns: &str, name: &str| store.get(kinds::id("services"), ns, name).is_some();
            let verdict = judge(&r.value, p, &gw.value, &ns_labels, &exists);
            let prev_conds = meta::path(&r.value, "status.parents")
                .and_then(Value::as_array)
                .and_then(|ps| ps.iter().find(|x| x.get("parentRef") == Some(p)))
                .and_then(|x| x.get("conditions"))
                .cloned();
            let accepted = match &verdict.accepted {
                Ok(()) => cond(
                    "Accepted",
                    true,
                    "Accepted",
                    "Route is accepted",
                    generation_now,
                    prev_conds.as_ref(),
                ),
                Err((reason, msg)) => cond(
                    "Accepted",
                    false,
                    reason,
                    msg,
                    generation_now,
                    prev_conds.as_ref(),
                ),
            };
            let resolved = match &verdict.resolved {
                Ok(()) => cond(
                    "ResolvedRefs",
                    true,
                    "ResolvedRefs",
                    "Resolved all the Object references for the Route",
                    generation_now,
                    prev_conds.as_ref(),
                ),
                Err((reason, msg)) => cond(
                    "ResolvedRefs",
                    false,
                    reason,
                    msg,
                    generation_now,
                    prev_conds.as_ref(),
                ),
            };
            parents_status.push(json!({"parentRef": p, "controllerName": CONTROLLER_NAME, "conditions": [accepted, resolved]}));
        }
        if parents_status.is_empty() {
            continue;
        }
        registry.mutate(routes, &route_ns, r.name(), |v| {
            // Parents owned by other controllers are kept.
            let mut parents: Vec<Value> = meta::path(v, "status.parents")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|x| {
                    x.get("controllerName").and_then(Value::as_str) != Some(CONTROLLER_NAME)
                })
                .cloned()
                .collect();
            parents.extend(parents_status.iter().cloned());
            let new = json!(parents);
            if meta::path(v, "status.parents") == Some(&new) {
                return false;
            }
            *meta::path_mut(v, "status.parents") = new;
            true
        });
    }
}

fn strip_times(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.remove("lastTransitionTime");
            for (_, x) in m.iter_mut() {
                *x = strip_times(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = strip_times(x.take());
            }
        }
        _ => {}
    }
    v
}

pub async fn run(registry: Arc<Registry>, switch: Arc<Switch>, shutdown: CancellationToken) {
    let store = registry.store.clone();
    let mut subs: Vec<_> = [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "services",
        "namespaces",
    ]
    .iter()
    .map(|p| store.subscribe(kinds::id(p)))
    .collect();
    loop {
        if switch.is_on() {
            reconcile(&registry);
        }
        let any_change =
            futures_util::future::select_all(subs.iter_mut().map(|s| Box::pin(s.changed())));
        tokio::select! {
            (r, _, _) = any_change => if r.is_err() { return },
            _ = switch.changed() => {}
            _ = shutdown.cancelled() => return,
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(listener: Value) -> Value {
        json!({"metadata": {"name": "gw", "namespace": "infra"}, "spec": {"gatewayClassName": "sim", "listeners": [listener]}})
    }

    fn route(ns: &str) -> Value {
        json!({"metadata": {"name": "r", "namespace": ns}, "spec": {"hostnames": ["8080-abc.example.com"],
               "rules": [{"backendRefs": [{"name": "svc", "port": 8080}]}]}})
    }

    #[test]
    fn same_namespace_listeners_refuse_other_namespaces() {
        let gw = gateway(
            json!({"name": "http", "protocol": "HTTP", "port": 80, "allowedRoutes": {"namespaces": {"from": "Same"}}}),
        );
        let v = judge(
            &route("telo-sessions"),
            &json!({"name": "gw", "namespace": "infra"}),
            &gw,
            &Map::new(),
            &|_, _| true,
        );
        assert_eq!(
            v.accepted,
            Err((
                "NotAllowedByListeners".into(),
                "No listeners included by this parent ref allowed this attachment.".into()
            ))
        );
    }

    #[test]
    fn all_namespace_listeners_accept_and_resolve() {
        let gw = gateway(
            json!({"name": "http", "protocol": "HTTP", "port": 80, "hostname": "*.example.com",
                                "allowedRoutes": {"namespaces": {"from": "All"}}}),
        );
        let v = judge(
            &route("telo-sessions"),
            &json!({"name": "gw", "namespace": "infra"}),
            &gw,
            &Map::new(),
            &|_, _| true,
        );
        assert_eq!(v.accepted, Ok(()));
        assert_eq!(v.resolved, Ok(()));
        let v = judge(
            &route("telo-sessions"),
            &json!({"name": "gw", "namespace": "infra"}),
            &gw,
            &Map::new(),
            &|_, _| false,
        );
        assert!(matches!(v.resolved, Err((ref r, _)) if r == "BackendNotFound"));
    }
}
