//! Session HTTPRoutes (docs/contract.md §9.12): one per tcp port, attached to
//! the configured Gateway, programmed when a controller accepts a parent.
//!
//! Our own small serde types rather than the `gateway-api` crate, which lags
//! kube releases; only the fields the runner writes are modelled.

use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::endpoints::host_for;
use super::health::Verdict;
use super::meta::SessionObjects;
use super::mode::GATEWAY_API_GROUP;
use super::service::service_name;
use crate::config::GatewayParent;

pub const HTTP_ROUTE_KIND: &str = "HTTPRoute";
pub const HTTP_ROUTE_PLURAL: &str = "httproutes";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    pub parent_refs: Vec<ParentReference>,
    pub hostnames: Vec<String>,
    pub rules: Vec<HttpRouteRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    pub group: String,
    pub kind: String,
    pub name: String,
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    pub matches: Vec<HttpRouteMatch>,
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRouteMatch {
    pub path: PathMatch,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathMatch {
    #[serde(rename = "type")]
    pub match_type: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendRef {
    pub name: String,
    pub port: u16,
}

/// HTTPRoute at the Gateway API version resolved at boot (`v1`, else
/// `v1beta1`): a route posted at a version the cluster does not serve is a 404.
pub fn http_route_resource(api_version: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GATEWAY_API_GROUP, api_version, HTTP_ROUTE_KIND),
        HTTP_ROUTE_PLURAL,
    )
}

/// `telo-run-<sessionId>-<port>`.
pub fn route_name(session_id: &str, port: u16) -> String {
    format!("{}-{port}", service_name(session_id))
}

/// The HTTPRoute of one tcp port: one hostname, one rule, one backend.
pub fn build_http_route(
    objects: &SessionObjects,
    parent: &GatewayParent,
    api_version: &str,
    base_domain: &str,
    port: u16,
) -> DynamicObject {
    let spec = HttpRouteSpec {
        parent_refs: vec![ParentReference {
            group: GATEWAY_API_GROUP.to_owned(),
            kind: "Gateway".to_owned(),
            name: parent.name.clone(),
            namespace: parent.namespace.clone(),
            section_name: parent.section_name.clone(),
        }],
        hostnames: vec![host_for(base_domain, &objects.session_id, port)],
        rules: vec![HttpRouteRule {
            matches: vec![HttpRouteMatch {
                path: PathMatch {
                    match_type: "PathPrefix".to_owned(),
                    value: "/".to_owned(),
                },
            }],
            backend_refs: vec![BackendRef {
                name: service_name(&objects.session_id),
                port,
            }],
        }],
    };
    let name = route_name(&objects.session_id, port);
    let mut route = DynamicObject::new(&name, &http_route_resource(api_version));
    route.metadata = objects.metadata(name);
    route.data = json!({ "spec": spec });
    route
}

/// What the controllers said about a route. One accepting parent with
/// resolvable backends is enough; otherwise the first refusal is the reason.
/// Conditions written for an older generation of the route describe a spec
/// that no longer exists (a replaced route keeps its old status until a
/// controller catches up), so they count as no answer yet.
pub fn http_route_verdict(route: &DynamicObject) -> Verdict {
    let generation = route.metadata.generation;
    let parents = route
        .data
        .pointer("/status/parents")
        .and_then(Value::as_array);
    let mut refusal: Option<String> = None;
    for parent in parents.into_iter().flatten() {
        let condition = |kind: &str| {
            parent
                .get("conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
                .filter(|c| is_current(c, generation))
        };
        let status = |c: &Value| c.get("status").and_then(Value::as_str).map(str::to_owned);
        let accepted = condition("Accepted");
        let resolved = condition("ResolvedRefs");
        if let Some(c) = accepted.filter(|c| status(c).as_deref() == Some("False")) {
            refusal.get_or_insert_with(|| refusal_text(c));
            continue;
        }
        if let Some(c) = resolved.filter(|c| status(c).as_deref() == Some("False")) {
            refusal.get_or_insert_with(|| refusal_text(c));
            continue;
        }
        if accepted.is_some_and(|c| status(c).as_deref() == Some("True")) {
            return Verdict::Programmed;
        }
    }
    refusal.map_or(Verdict::Pending, Verdict::Refused)
}

fn is_current(condition: &Value, generation: Option<i64>) -> bool {
    let observed = condition.get("observedGeneration").and_then(Value::as_i64);
    match (observed, generation) {
        (Some(observed), Some(generation)) => observed >= generation,
        _ => true,
    }
}

/// `<reason>: <message>`, as the controller put it.
fn refusal_text(condition: &Value) -> String {
    let reason = condition
        .get("reason")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .unwrap_or("rejected");
    match condition
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
    {
        Some(message) => format!("{reason}: {message}"),
        None => reason.to_owned(),
    }
}

/// Why a route may stay unprogrammed: no controller owns the Gateway, or none
/// of its listeners admits the session namespace.
pub fn unclaimed_reason(parent: &GatewayParent, namespace: &str) -> String {
    let listener = parent
        .section_name
        .as_ref()
        .map(|section| format!(" (listener '{section}')"))
        .unwrap_or_default();
    format!(
        "no controller claimed the session HTTPRoute for Gateway '{}/{}'{listener}. Check the \
         Gateway exists, is programmed, and that a listener admits routes from namespace \
         '{namespace}' (spec.listeners[].allowedRoutes.namespaces).",
        parent.namespace, parent.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::meta::pod_owner_reference;
    use rstest::rstest;

    const SESSION: &str = "abc234defghi";

    fn objects() -> SessionObjects {
        SessionObjects {
            namespace: "telo-sessions".into(),
            managed_by: "telo-k8s-runner".into(),
            session_id: SESSION.into(),
            owner: pod_owner_reference(
                "telo-run-abc234defghi",
                "3f1c5e4a-0000-4000-8000-000000000001",
            ),
        }
    }

    fn parent(section: Option<&str>) -> GatewayParent {
        GatewayParent {
            name: "public".into(),
            namespace: "gateway-system".into(),
            section_name: section.map(str::to_owned),
        }
    }

    fn route_with(generation: i64, parents: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "telo-run-abc-8080", "generation": generation},
            "spec": {}, "status": {"parents": parents},
        }))
        .unwrap()
    }

    fn parent_status(accepted: (&str, &str, &str), resolved: (&str, &str, &str)) -> Value {
        let condition = |kind: &str, (status, reason, message): (&str, &str, &str)| {
            json!({"type": kind, "status": status, "reason": reason, "message": message,
                   "observedGeneration": 1})
        };
        json!({"parentRef": {"name": "public"}, "controllerName": "example.com/gw",
               "conditions": [condition("Accepted", accepted), condition("ResolvedRefs", resolved)]})
    }

    const ACCEPTED: (&str, &str, &str) = ("True", "Accepted", "Route is accepted");
    const RESOLVED: (&str, &str, &str) = ("True", "ResolvedRefs", "");

    #[test]
    fn a_route_per_port_attached_to_the_gateway_listener() {
        let route = build_http_route(&objects(), &parent(Some("https")), "v1", "telo.run", 8080);
        insta::assert_yaml_snapshot!(route);
    }

    #[test]
    fn the_route_is_published_at_the_resolved_version() {
        let route = build_http_route(&objects(), &parent(None), "v1beta1", "telo.run", 9090);
        assert_eq!(
            route.types.unwrap().api_version,
            "gateway.networking.k8s.io/v1beta1"
        );
        assert_eq!(
            route.metadata.name.as_deref(),
            Some("telo-run-abc234defghi-9090")
        );
        assert_eq!(
            route.data["spec"]["parentRefs"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public",
                    "namespace": "gateway-system"}])
        );
        assert_eq!(
            route.data["spec"]["hostnames"],
            json!(["9090-abc234defghi.telo.run"])
        );
        assert_eq!(
            route.data["spec"]["rules"][0]["backendRefs"],
            json!([{"name": "telo-run-abc234defghi", "port": 9090}])
        );
    }

    #[rstest]
    #[case::no_status(json!(null), Verdict::Pending)]
    #[case::no_parents(json!([]), Verdict::Pending)]
    #[case::accepted_and_resolved(json!([parent_status(ACCEPTED, RESOLVED)]), Verdict::Programmed)]
    #[case::not_admitted(
        json!([parent_status(("False", "NotAllowedByListeners", "no listener admits routes from this namespace"), RESOLVED)]),
        Verdict::Refused("NotAllowedByListeners: no listener admits routes from this namespace".into())
    )]
    #[case::backend_missing(
        json!([parent_status(ACCEPTED, ("False", "BackendNotFound", ""))]),
        Verdict::Refused("BackendNotFound".into())
    )]
    #[case::reasonless_refusal(
        json!([parent_status(("False", "", ""), RESOLVED)]),
        Verdict::Refused("rejected".into())
    )]
    #[case::one_accepting_parent_wins(
        json!([parent_status(("False", "NotAllowedByListeners", "no"), RESOLVED), parent_status(ACCEPTED, RESOLVED)]),
        Verdict::Programmed
    )]
    fn controllers_decide_the_route_verdict(#[case] parents: Value, #[case] expected: Verdict) {
        assert_eq!(http_route_verdict(&route_with(1, parents)), expected);
    }

    #[test]
    fn conditions_for_an_older_generation_are_no_answer_yet() {
        let stale = route_with(2, json!([parent_status(ACCEPTED, RESOLVED)]));
        assert_eq!(http_route_verdict(&stale), Verdict::Pending);
    }

    #[test]
    fn the_unclaimed_reason_names_the_gateway_and_the_listener() {
        assert_eq!(
            unclaimed_reason(&parent(Some("https")), "telo-sessions"),
            "no controller claimed the session HTTPRoute for Gateway 'gateway-system/public' \
             (listener 'https'). Check the Gateway exists, is programmed, and that a listener \
             admits routes from namespace 'telo-sessions' \
             (spec.listeners[].allowedRoutes.namespaces)."
        );
        assert!(
            unclaimed_reason(&parent(None), "telo-sessions")
                .starts_with("no controller claimed the session HTTPRoute for Gateway 'gateway-system/public'. Check")
        );
    }
}
