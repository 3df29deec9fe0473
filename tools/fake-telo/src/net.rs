//! Which address fake-telo binds. kube-sim runs every pod as a local process
//! and gives each its pod IP in `HOST`: an address of its own network
//! namespace with kube-sim's isolated pod network, a loopback address of the
//! shared one with its host network. On the host network binding anything
//! wider would let two pods' `listen: [8080]` collide and make pod-IP
//! reachability checks pass for the wrong pod.

use std::io;
use std::net::{IpAddr, TcpListener};

use crate::cli::InspectAddr;

/// The environment variable naming the host to bind: kube-sim sets it to
/// the pod IP (docs/architecture.md § Tests without a cluster).
pub const HOST_VAR: &str = "HOST";
const DEFAULT_HOST: &str = "127.0.0.1";

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {host}:{port}")]
pub struct BindError {
    pub host: String,
    pub port: u16,
    #[source]
    pub source: io::Error,
}

/// The host for `listen` ports: `HOST` when set and non-empty, else loopback.
pub fn listen_host(env_host: Option<&str>) -> &str {
    env_host
        .filter(|host| !host.is_empty())
        .unwrap_or(DEFAULT_HOST)
}

/// The host for the `--inspect` server. An explicit address is honoured; the
/// wildcard the runners pass (`0.0.0.0:9230`) means "this pod's address", so
/// it narrows to `HOST` when that is set, for the collision reason above.
pub fn inspect_host<'a>(requested: &'a InspectAddr, env_host: Option<&'a str>) -> &'a str {
    let wildcard = requested
        .host
        .parse::<IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    match env_host.filter(|host| !host.is_empty()) {
        Some(host) if wildcard => host,
        _ => &requested.host,
    }
}

pub fn bind(host: &str, port: u16) -> Result<TcpListener, BindError> {
    TcpListener::bind((host, port)).map_err(|source| BindError {
        host: host.to_owned(),
        port,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(host: &str, port: u16) -> InspectAddr {
        InspectAddr {
            host: host.to_owned(),
            port,
        }
    }

    #[test]
    fn listeners_bind_host_when_set_else_loopback() {
        assert_eq!(listen_host(Some("127.0.3.4")), "127.0.3.4");
        assert_eq!(listen_host(Some("")), "127.0.0.1");
        assert_eq!(listen_host(None), "127.0.0.1");
    }

    #[test]
    fn a_wildcard_inspect_address_narrows_to_host() {
        let cases = [
            (addr("0.0.0.0", 9230), Some("127.0.3.4"), "127.0.3.4"),
            (addr("::", 9230), Some("127.0.3.4"), "127.0.3.4"),
            (addr("0.0.0.0", 9230), None, "0.0.0.0"),
            (addr("0.0.0.0", 9230), Some(""), "0.0.0.0"),
            (addr("127.0.0.1", 0), Some("127.0.3.4"), "127.0.0.1"),
            (addr("localhost", 0), Some("127.0.3.4"), "localhost"),
        ];
        for (requested, env_host, expected) in &cases {
            assert_eq!(
                inspect_host(requested, *env_host),
                *expected,
                "{requested:?} with HOST={env_host:?}"
            );
        }
    }
}
