//! The session Ingress (docs/contract.md §9.11): one object per session with
//! a rule per tcp port, programmed once a controller writes its load-balancer
//! status.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule,
    IngressServiceBackend, IngressSpec, IngressTLS, ServiceBackendPort,
};
use kube::core::DynamicObject;
use serde_json::Value;

use super::endpoints::host_for;
use super::health::Verdict;
use super::meta::SessionObjects;
use super::service::service_name;

/// What the operator configured for session Ingresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressSettings {
    /// `ingressClassName`; `None` leaves it to the cluster's default class.
    pub class: Option<String>,
    /// The `kubernetes.io/tls` Secret presented for every session host.
    pub tls_secret: Option<String>,
    /// Annotations every session Ingress carries, `{sessionId}` replaced by
    /// the session's id.
    pub annotations: BTreeMap<String, String>,
}

/// What an annotation value says where the session's id goes.
pub const SESSION_ID_PLACEHOLDER: &str = "{sessionId}";

/// `telo-run-<sessionId>`, like the pod and the Service.
pub fn ingress_name(session_id: &str) -> String {
    service_name(session_id)
}

/// The session Ingress, or `None` when no tcp port is declared: an Ingress
/// without rules is invalid, and there is nothing to route.
pub fn build_session_ingress(
    objects: &SessionObjects,
    settings: &IngressSettings,
    base_domain: &str,
    tcp_ports: &[u16],
) -> Option<Ingress> {
    if tcp_ports.is_empty() {
        return None;
    }
    let hosts: Vec<String> = tcp_ports
        .iter()
        .map(|port| host_for(base_domain, &objects.session_id, *port))
        .collect();
    let rules = tcp_ports
        .iter()
        .zip(&hosts)
        .map(|(port, host)| IngressRule {
            host: Some(host.clone()),
            http: Some(HTTPIngressRuleValue {
                paths: vec![HTTPIngressPath {
                    path: Some("/".to_owned()),
                    path_type: "Prefix".to_owned(),
                    backend: IngressBackend {
                        service: Some(IngressServiceBackend {
                            name: service_name(&objects.session_id),
                            port: Some(ServiceBackendPort {
                                number: Some(i32::from(*port)),
                                name: None,
                            }),
                        }),
                        resource: None,
                    },
                }],
            }),
        })
        .collect();
    let tls = settings.tls_secret.as_ref().map(|secret| {
        vec![IngressTLS {
            hosts: Some(hosts.clone()),
            secret_name: Some(secret.clone()),
        }]
    });
    let mut metadata = objects.metadata(ingress_name(&objects.session_id));
    if !settings.annotations.is_empty() {
        metadata.annotations = Some(
            settings
                .annotations
                .iter()
                .map(|(key, value)| {
                    (
                        key.clone(),
                        value.replace(SESSION_ID_PLACEHOLDER, &objects.session_id),
                    )
                })
                .collect(),
        );
    }
    Some(Ingress {
        metadata,
        spec: Some(IngressSpec {
            ingress_class_name: settings.class.clone(),
            tls,
            rules: Some(rules),
            default_backend: None,
        }),
        status: None,
    })
}

/// An Ingress is programmed once a controller published an address for it.
/// Ingress has no way to refuse, so it is never `Refused`: an Ingress nobody
/// claims just stays pending until the ready timeout says so.
pub fn ingress_verdict(object: &DynamicObject) -> Verdict {
    let addresses = object
        .data
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array);
    if addresses.is_some_and(|addresses| !addresses.is_empty()) {
        Verdict::Programmed
    } else {
        Verdict::Pending
    }
}

/// Why an Ingress may stay unprogrammed: no controller claims its class.
pub fn unclaimed_reason(class: Option<&str>, namespace: &str) -> String {
    let class = match class {
        Some(class) => format!(" for class '{class}'"),
        None => " (no ingressClassName configured)".to_owned(),
    };
    format!(
        "no ingress controller claimed the session Ingress{class}. Check that an Ingress \
         controller is installed and watching namespace '{namespace}'."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::labels::SESSION_ID_LABEL;
    use crate::routing::meta::pod_owner_reference;
    use serde_json::json;

    fn object(status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "telo-run-abc"}, "status": status,
        }))
        .unwrap()
    }

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

    fn settings(class: Option<&str>, tls_secret: Option<&str>) -> IngressSettings {
        IngressSettings {
            class: class.map(str::to_owned),
            tls_secret: tls_secret.map(str::to_owned),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn one_ingress_with_a_rule_per_tcp_port() {
        let ingress = build_session_ingress(
            &objects(),
            &settings(Some("nginx"), None),
            "telo.run",
            &[8080, 9090],
        )
        .unwrap();
        insta::assert_yaml_snapshot!(ingress);
    }

    #[test]
    fn the_origin_certificate_covers_every_session_host() {
        let ingress = build_session_ingress(
            &objects(),
            &settings(None, Some("telo-origin-tls")),
            "telo.run",
            &[8080, 9090],
        )
        .unwrap();
        insta::assert_yaml_snapshot!(ingress);
        let spec = ingress.spec.unwrap();
        assert_eq!(spec.ingress_class_name, None);
        assert_eq!(
            spec.tls,
            Some(vec![IngressTLS {
                hosts: Some(vec![
                    "8080-abc234defghi.telo.run".into(),
                    "9090-abc234defghi.telo.run".into()
                ]),
                secret_name: Some("telo-origin-tls".into()),
            }])
        );
    }

    #[test]
    fn no_tcp_port_means_no_ingress_not_even_for_tls() {
        assert_eq!(
            build_session_ingress(&objects(), &settings(None, Some("tls")), "telo.run", &[]),
            None
        );
    }

    #[test]
    fn the_ingress_is_owned_by_the_pod_and_labelled_with_the_session() {
        let ingress =
            build_session_ingress(&objects(), &settings(None, None), "telo.run", &[8080]).unwrap();
        assert_eq!(ingress.metadata.labels.unwrap()[SESSION_ID_LABEL], SESSION);
        let owner = &ingress.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Pod", "telo-run-abc234defghi")
        );
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn an_ingress_is_programmed_once_it_has_an_address() {
        assert_eq!(ingress_verdict(&object(json!({}))), Verdict::Pending);
        assert_eq!(
            ingress_verdict(&object(json!({"loadBalancer": {}}))),
            Verdict::Pending
        );
        assert_eq!(
            ingress_verdict(&object(json!({"loadBalancer": {"ingress": []}}))),
            Verdict::Pending
        );
        assert_eq!(
            ingress_verdict(&object(
                json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}})
            )),
            Verdict::Programmed
        );
    }

    #[test]
    fn the_unclaimed_reason_names_the_class_or_its_absence() {
        assert_eq!(
            unclaimed_reason(Some("nginx"), "telo-sessions"),
            "no ingress controller claimed the session Ingress for class 'nginx'. Check that an \
             Ingress controller is installed and watching namespace 'telo-sessions'."
        );
        assert_eq!(
            unclaimed_reason(None, "telo-sessions"),
            "no ingress controller claimed the session Ingress (no ingressClassName configured). \
             Check that an Ingress controller is installed and watching namespace 'telo-sessions'."
        );
    }
}
