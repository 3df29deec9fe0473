//! The session Service (docs/contract.md §9.10): the stable in-cluster name
//! both routing layers send traffic to, selecting the pod by its session id.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use runner_core::types::{PortMapping, PortProtocol};

use super::meta::SessionObjects;
use crate::pod::labels::SESSION_ID_LABEL;
use crate::pod::session_record::pod_name;

/// `telo-run-<sessionId>`. A Service name must be a DNS-1035 label — it has to
/// start with a letter — and session ids may start with a digit, so the id is
/// never used bare; the fixed `telo-run-` prefix makes every id valid.
pub fn service_name(session_id: &str) -> String {
    pod_name(session_id)
}

/// `p<port>`: at most 6 characters, well inside the 15 an IANA service name
/// may have, and unique per port number. Two declarations of one port number
/// (tcp and udp) would share a name, which is why [`build_session_service`]
/// names them by protocol too when both exist.
pub fn port_name(port: u16) -> String {
    format!("p{port}")
}

/// The Service in front of the session pod, carrying every declared port,
/// udp included (the routing layers only ever point at its tcp ports).
pub fn build_session_service(objects: &SessionObjects, ports: &[PortMapping]) -> Service {
    let service_ports = ports
        .iter()
        .map(|mapping| {
            let both_protocols = ports
                .iter()
                .any(|other| other.port == mapping.port && other.protocol != mapping.protocol);
            let name = match (both_protocols, mapping.protocol) {
                (true, PortProtocol::Udp) => format!("{}u", port_name(mapping.port)),
                _ => port_name(mapping.port),
            };
            ServicePort {
                name: Some(name),
                port: i32::from(mapping.port),
                target_port: Some(IntOrString::Int(i32::from(mapping.port))),
                protocol: Some(
                    match mapping.protocol {
                        PortProtocol::Tcp => "TCP",
                        PortProtocol::Udp => "UDP",
                    }
                    .to_owned(),
                ),
                ..ServicePort::default()
            }
        })
        .collect();
    Service {
        metadata: objects.metadata(service_name(&objects.session_id)),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                SESSION_ID_LABEL.to_owned(),
                objects.session_id.clone(),
            )])),
            ports: Some(service_ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Carries what the apiserver allocated into a replacement: `clusterIP` is
/// immutable, so a replace that sent it empty would be refused.
pub fn keep_allocated_fields(live: &Service, replacement: &mut Service) {
    let (Some(live), Some(spec)) = (live.spec.as_ref(), replacement.spec.as_mut()) else {
        return;
    };
    spec.cluster_ip = live.cluster_ip.clone();
    spec.cluster_ips = live.cluster_ips.clone();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::meta::pod_owner_reference;

    fn objects(session_id: &str) -> SessionObjects {
        SessionObjects {
            namespace: "telo-sessions".into(),
            managed_by: "telo-k8s-runner".into(),
            session_id: session_id.into(),
            owner: pod_owner_reference(
                &pod_name(session_id),
                "3f1c5e4a-0000-4000-8000-000000000001",
            ),
        }
    }

    fn port(port: u16, protocol: PortProtocol) -> PortMapping {
        PortMapping { port, protocol }
    }

    #[test]
    fn the_session_service_carries_every_port_and_selects_the_pod() {
        let service = build_session_service(
            &objects("abc234defghi"),
            &[
                port(8080, PortProtocol::Tcp),
                port(9090, PortProtocol::Tcp),
                port(5353, PortProtocol::Udp),
            ],
        );
        insta::assert_yaml_snapshot!(service);
    }

    #[test]
    fn a_session_id_starting_with_a_digit_still_makes_a_dns_1035_name() {
        let name = service_name("2bc234defghi");
        assert_eq!(name, "telo-run-2bc234defghi");
        assert!(name.starts_with(|c: char| c.is_ascii_lowercase()));
        assert!(name.len() <= 63);
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }

    #[test]
    fn port_names_fit_the_fifteen_character_limit_and_stay_unique() {
        assert_eq!(port_name(65535), "p65535");
        let service = build_session_service(
            &objects("abc234defghi"),
            &[port(53, PortProtocol::Tcp), port(53, PortProtocol::Udp)],
        );
        let names: Vec<String> = service
            .spec
            .unwrap()
            .ports
            .unwrap()
            .into_iter()
            .map(|p| p.name.unwrap())
            .collect();
        assert_eq!(names, ["p53", "p53u"]);
        assert!(names.iter().all(|n| n.len() <= 15));
    }

    #[test]
    fn the_service_has_the_session_label_so_session_selectors_find_it() {
        let service = build_session_service(&objects("abc"), &[port(8080, PortProtocol::Tcp)]);
        let labels = service.metadata.labels.unwrap();
        assert_eq!(labels[SESSION_ID_LABEL], "abc");
        assert_eq!(
            labels[crate::pod::labels::MANAGED_BY_LABEL],
            "telo-k8s-runner"
        );
    }

    #[test]
    fn a_replacement_keeps_the_allocated_cluster_ip() {
        let mut live = build_session_service(&objects("abc"), &[port(8080, PortProtocol::Tcp)]);
        if let Some(spec) = live.spec.as_mut() {
            spec.cluster_ip = Some("10.96.0.12".into());
            spec.cluster_ips = Some(vec!["10.96.0.12".into()]);
        }
        let mut replacement =
            build_session_service(&objects("abc"), &[port(8080, PortProtocol::Tcp)]);
        keep_allocated_fields(&live, &mut replacement);
        let spec = replacement.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.12"));
        assert_eq!(spec.cluster_ips, Some(vec!["10.96.0.12".to_owned()]));
    }
}
