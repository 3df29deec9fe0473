//! Who a connection's client is: the socket's peer, or — when the peer is a
//! proxy the operator trusts (`RUNNER_TRUSTED_PROXIES`) — the address that
//! proxy reports in `X-Forwarded-For`. Only the hops appended by trusted
//! proxies are believed: the client is the rightmost address that is not a
//! trusted proxy, since anything left of it was written by the client.

use std::net::IpAddr;
use std::str::FromStr as _;
use std::sync::Arc;

use http::HeaderMap;
use ipnet::IpNet;
use runner_api::js::js_trim;

use crate::env::ConfigError;
use crate::settings::RUNNER_TRUSTED_PROXIES;

/// The proxies whose `X-Forwarded-For` is believed (none by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Arc<[IpNet]>);

impl TrustedProxies {
    /// `RUNNER_TRUSTED_PROXIES`: a comma-separated list of addresses and
    /// CIDR ranges; blank entries are skipped, unset or blank trusts none.
    pub fn parse(raw: Option<&str>) -> Result<Self, ConfigError> {
        let Some(raw) = raw else {
            return Ok(Self::default());
        };
        let mut nets = Vec::new();
        for entry in raw
            .split(',')
            .map(js_trim)
            .filter(|entry| !entry.is_empty())
        {
            let net = IpNet::from_str(entry)
                .ok()
                .or_else(|| IpAddr::from_str(entry).ok().map(IpNet::from))
                .ok_or_else(|| ConfigError::Invalid {
                    var: RUNNER_TRUSTED_PROXIES.name.to_owned(),
                    rule: format!(
                        "be a comma-separated list of IP addresses and CIDR ranges ('{entry}' is neither)"
                    ),
                    value: raw.to_owned(),
                })?;
            nets.push(canonical_net(net));
        }
        Ok(Self(nets.into()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `addr` is one of the trusted proxies.
    pub fn trusts(&self, addr: IpAddr) -> bool {
        let addr = addr.to_canonical();
        self.0.iter().any(|net| net.contains(&addr))
    }

    /// The client a request from `peer` speaks for: `peer` itself unless it
    /// is trusted, else the rightmost `X-Forwarded-For` hop that is not a
    /// trusted proxy (the leftmost when every hop is one). A hop that is not
    /// an address stops the walk: the proxy that wrote it is the client.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.trusts(client) {
            return client;
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(js_trim)
            .filter(|hop| !hop.is_empty())
            .collect();
        for hop in hops.iter().rev() {
            let Some(addr) = parse_hop(hop) else {
                return client;
            };
            client = addr;
            if !self.trusts(addr) {
                return addr;
            }
        }
        client
    }
}

/// A range of IPv4-mapped IPv6 addresses is the IPv4 range it maps.
fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) => match v6.addr().to_ipv4_mapped() {
            Some(v4) if v6.prefix_len() >= 96 => {
                IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net)
            }
            _ => net,
        },
        IpNet::V4(_) => net,
    }
}

/// One `X-Forwarded-For` entry: an address, possibly with a port
/// (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(addr) = IpAddr::from_str(hop) {
        return Some(addr.to_canonical());
    }
    if let Ok(addr) = std::net::SocketAddr::from_str(hop) {
        return Some(addr.ip().to_canonical());
    }
    let bracketed = hop.strip_prefix('[')?.strip_suffix(']')?;
    IpAddr::from_str(bracketed)
        .ok()
        .map(|addr| addr.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-forwarded-for", value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn addresses_and_ranges_are_read_and_anything_else_is_refused_by_name() {
        let proxies = TrustedProxies::parse(Some(" 10.0.0.0/8, ,192.0.2.7,fd00::/8 ")).unwrap();
        assert!(proxies.trusts(ip("10.1.2.3")));
        assert!(proxies.trusts(ip("::ffff:10.1.2.3")));
        assert!(proxies.trusts(ip("192.0.2.7")));
        assert!(!proxies.trusts(ip("192.0.2.8")));
        assert!(proxies.trusts(ip("fd12::1")));
        assert!(TrustedProxies::parse(None).unwrap().is_empty());
        assert!(TrustedProxies::parse(Some(" ")).unwrap().is_empty());
        assert_eq!(
            TrustedProxies::parse(Some("10.0.0.0/8,proxy.internal"))
                .unwrap_err()
                .to_string(),
            "RUNNER_TRUSTED_PROXIES must be a comma-separated list of IP addresses and CIDR ranges ('proxy.internal' is neither), got '10.0.0.0/8,proxy.internal'."
        );
        assert!(TrustedProxies::parse(Some("10.0.0.0/33")).is_err());
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let proxies = TrustedProxies::parse(Some("10.0.0.1")).unwrap();
        assert_eq!(
            proxies.client(ip("198.51.100.9"), &forwarded(&["203.0.113.5"])),
            ip("198.51.100.9")
        );
        let none = TrustedProxies::default();
        assert_eq!(
            none.client(ip("10.0.0.1"), &forwarded(&["203.0.113.5"])),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn the_client_is_the_rightmost_hop_no_trusted_proxy_wrote() {
        let proxies = TrustedProxies::parse(Some("10.0.0.0/8")).unwrap();
        let peer = ip("10.0.0.1");
        // The client forged the leftmost entry; the proxy appended the rest.
        assert_eq!(
            proxies.client(peer, &forwarded(&["1.1.1.1, 203.0.113.5, 10.0.0.9"])),
            ip("203.0.113.5")
        );
        // Several header lines are one list, in order.
        assert_eq!(
            proxies.client(peer, &forwarded(&["1.1.1.1", "203.0.113.5:4711"])),
            ip("203.0.113.5")
        );
        assert_eq!(
            proxies.client(peer, &forwarded(&["[2001:db8::1]:80"])),
            ip("2001:db8::1")
        );
        // The proxy's own requests.
        assert_eq!(proxies.client(peer, &HeaderMap::new()), peer);
        // Only proxies: the farthest of them.
        assert_eq!(
            proxies.client(peer, &forwarded(&["10.0.0.3, 10.0.0.2"])),
            ip("10.0.0.3")
        );
        // Garbage stops the walk at the proxy that passed it on.
        assert_eq!(
            proxies.client(peer, &forwarded(&["203.0.113.5, unknown, 10.0.0.2"])),
            ip("10.0.0.2")
        );
    }
}
