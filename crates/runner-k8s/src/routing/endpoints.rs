//! The hosts a session's ports are published at, and the endpoints `running`
//! reports (docs/contract.md §9.9).

use runner_core::types::{PortMapping, PortProtocol, RunnerEndpoint};

/// `<port>-<sessionId>.<baseDomain>`, the same for both routing layers: one
/// wildcard label, so a single `*.<baseDomain>` certificate and DNS record
/// cover every session.
pub fn host_for(base_domain: &str, session_id: &str, port: u16) -> String {
    format!("{port}-{session_id}.{base_domain}")
}

/// The endpoints of a session. `base_domain` is `Some` only when sessions are
/// routed; then every tcp port gets its host and `https://` URL. A udp port is
/// never routed (neither Ingress nor HTTPRoute carries udp), so it stays
/// host-less, like every port of a logs-only runner.
pub fn endpoints_for(
    base_domain: Option<&str>,
    session_id: &str,
    ports: &[PortMapping],
) -> Vec<RunnerEndpoint> {
    ports
        .iter()
        .map(|mapping| match (base_domain, mapping.protocol) {
            (Some(domain), PortProtocol::Tcp) => {
                let host = host_for(domain, session_id, mapping.port);
                RunnerEndpoint {
                    url: Some(format!("https://{host}")),
                    host,
                    port: mapping.port,
                    protocol: PortProtocol::Tcp,
                    token: None,
                }
            }
            _ => RunnerEndpoint {
                host: String::new(),
                port: mapping.port,
                protocol: mapping.protocol,
                url: None,
                token: None,
            },
        })
        .collect()
}

pub use runner_api::ports::tcp_ports;

#[cfg(test)]
mod tests {
    use super::*;

    fn port(port: u16, protocol: PortProtocol) -> PortMapping {
        PortMapping { port, protocol }
    }

    fn hostless(port: u16, protocol: PortProtocol) -> RunnerEndpoint {
        RunnerEndpoint {
            host: String::new(),
            port,
            protocol,
            url: None,
            token: None,
        }
    }

    #[test]
    fn routed_tcp_ports_get_a_host_and_an_https_url_and_udp_stays_hostless() {
        let ports = [port(8080, PortProtocol::Tcp), port(5353, PortProtocol::Udp)];
        assert_eq!(
            endpoints_for(Some("telo.run"), "abc", &ports),
            vec![
                RunnerEndpoint {
                    host: "8080-abc.telo.run".into(),
                    port: 8080,
                    protocol: PortProtocol::Tcp,
                    url: Some("https://8080-abc.telo.run".into()),
                    token: None,
                },
                hostless(5353, PortProtocol::Udp),
            ]
        );
    }

    #[test]
    fn unrouted_sessions_report_every_port_hostless() {
        let ports = [port(8080, PortProtocol::Tcp), port(5353, PortProtocol::Udp)];
        assert_eq!(
            endpoints_for(None, "abc", &ports),
            vec![
                hostless(8080, PortProtocol::Tcp),
                hostless(5353, PortProtocol::Udp)
            ]
        );
        assert!(endpoints_for(Some("telo.run"), "abc", &[]).is_empty());
    }

    #[test]
    fn only_tcp_ports_are_routed() {
        let ports = [
            port(5353, PortProtocol::Udp),
            port(9090, PortProtocol::Tcp),
            port(8080, PortProtocol::Tcp),
        ];
        assert_eq!(tcp_ports(&ports), vec![9090, 8080]);
    }
}
