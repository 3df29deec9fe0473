//! A port a workload declares: the one shape both the run-session wire
//! types and the watch-session app specs carry.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortProtocol {
    Tcp,
    Udp,
}

impl PortProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortMapping {
    pub port: u16,
    pub protocol: PortProtocol,
}

/// The tcp ports among `ports`, in order: what can be probed and routed.
pub fn tcp_ports(ports: &[PortMapping]) -> Vec<u16> {
    ports
        .iter()
        .filter(|mapping| mapping.protocol == PortProtocol::Tcp)
        .map(|mapping| mapping.port)
        .collect()
}
