//! The simulated Ingress controller: it owns IngressClasses whose
//! `spec.controller` is [`CONTROLLER_NAME`] and writes
//! `status.loadBalancer.ingress` on every Ingress of those classes (or with
//! no class, when its class is the default). Switched off, it writes
//! nothing — an Ingress stays "unprogrammed".

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Switch;
use crate::kinds;
use crate::meta;
use crate::storage::registry::Registry;

pub const CONTROLLER_NAME: &str = "kube-sim.dev/ingress-controller";
/// The address written into the load-balancer status.
pub const LOAD_BALANCER_IP: &str = "127.0.0.1";
/// Coalesces bursts of changes into one reconcile.
const DEBOUNCE: Duration = Duration::from_millis(20);

/// Whether the Ingress belongs to one of our classes.
pub fn claims(ingress: &Value, classes: &[Value]) -> bool {
    let ours = |c: &Value| meta::path_str(c, "spec.controller") == Some(CONTROLLER_NAME);
    let named = meta::path_str(ingress, "spec.ingressClassName").or_else(|| {
        meta::metadata(ingress)
            .and_then(|m| m.get("annotations"))
            .and_then(|a| a.get("kubernetes.io/ingress.class"))
            .and_then(Value::as_str)
    });
    match named {
        Some(class) => classes.iter().any(|c| meta::name(c) == class && ours(c)),
        None => classes.iter().any(|c| {
            ours(c)
                && meta::metadata(c)
                    .and_then(|m| m.get("annotations"))
                    .and_then(|a| a.get("ingressclass.kubernetes.io/is-default-class"))
                    .and_then(Value::as_str)
                    == Some("true")
        }),
    }
}

pub async fn run(registry: Arc<Registry>, switch: Arc<Switch>, shutdown: CancellationToken) {
    let store = registry.store.clone();
    let ingresses = kinds::id("ingresses");
    let classes = kinds::id("ingressclasses");
    let mut ing_changes = store.subscribe(ingresses);
    let mut class_changes = store.subscribe(classes);
    loop {
        if switch.is_on() {
            let (class_objs, _) = store.snapshot(classes, None);
            let class_values: Vec<Value> = class_objs.iter().map(|c| c.value.clone()).collect();
            let (ings, _) = store.snapshot(ingresses, None);
            for ing in ings {
                let has_status = meta::path(&ing.value, "status.loadBalancer.ingress")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty());
                if has_status || !claims(&ing.value, &class_values) {
                    continue;
                }
                registry.mutate(ingresses, ing.namespace(), ing.name(), |v| {
                    *meta::path_mut(v, "status.loadBalancer") =
                        json!({"ingress": [{"ip": LOAD_BALANCER_IP}]});
                    true
                });
            }
        }
        tokio::select! {
            r = ing_changes.changed() => if r.is_err() { return },
            r = class_changes.changed() => if r.is_err() { return },
            _ = switch.changed() => {}
            _ = shutdown.cancelled() => return,
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_and_default_classes_are_claimed() {
        let ours = json!({"metadata": {"name": "sim", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
                          "spec": {"controller": CONTROLLER_NAME}});
        let theirs =
            json!({"metadata": {"name": "nginx"}, "spec": {"controller": "k8s.io/ingress-nginx"}});
        let classes = vec![ours, theirs];
        assert!(claims(
            &json!({"spec": {"ingressClassName": "sim"}}),
            &classes
        ));
        assert!(!claims(
            &json!({"spec": {"ingressClassName": "nginx"}}),
            &classes
        ));
        assert!(claims(&json!({"spec": {}}), &classes));
    }
}
