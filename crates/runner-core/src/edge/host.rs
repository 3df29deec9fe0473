//! The preview base (`RUNNER_PREVIEW_BASE_URL`) and the session hosts under
//! it: `<port>-<sessionId>.<base host>[:<base port>]`.

use std::fmt;

use crate::ids::is_session_id;

use super::EdgeRefusal;

/// The longest DNS name (RFC 1035), without a trailing dot.
const MAX_NAME: usize = 253;
/// The longest DNS label.
const MAX_LABEL: usize = 63;
/// The longest session label: `65535-` and a session id.
const MAX_SESSION_LABEL: usize = 6 + crate::ids::SESSION_ID_LEN;

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub const fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    pub const fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// `RUNNER_PREVIEW_BASE_URL`, parsed: scheme, host (lower-case, no trailing
/// dot) and the port when it is not the scheme's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewBase {
    scheme: Scheme,
    host: String,
    port: Option<u16>,
}

/// The session a request's host names: its port and session id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionHost {
    pub port: u16,
    pub session_id: String,
}

impl fmt::Display for SessionHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.port, self.session_id)
    }
}

impl PreviewBase {
    /// Parses an absolute `http`/`https` URL without path (or `/`), query,
    /// fragment or user info, whose host is a DNS name or `localhost`. The
    /// error completes "must …" (`be an absolute http or https URL`).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        let (scheme, rest) = if let Some(rest) = strip_prefix_ignore_case(raw, "https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = strip_prefix_ignore_case(raw, "http://") {
            (Scheme::Http, rest)
        } else {
            return Err("be an absolute http:// or https:// URL".into());
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err("have no path, query or fragment (only scheme, host and port)".into());
        }
        if authority.contains('@') {
            return Err("have no user info".into());
        }
        if authority.starts_with('[') {
            return Err("name its host with a DNS name, not an IP address".into());
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (
                host,
                Some(parse_port(port).ok_or("have a port from 1 to 65535")?),
            ),
            None => (authority, None),
        };
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        if !is_dns_name(host) {
            return Err("have a DNS name (or localhost) as its host".into());
        }
        // A session host puts `<port>-<id>.` before it.
        if host.len() + MAX_SESSION_LABEL + 1 > MAX_NAME {
            return Err(format!(
                "have a host of at most {} characters",
                MAX_NAME - MAX_SESSION_LABEL - 1
            ));
        }
        Ok(Self {
            scheme,
            host: host.to_owned(),
            port: port.filter(|port| *port != scheme.default_port()),
        })
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host, lower-case, without a trailing dot.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, when it is not the scheme's default.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The URL of session `session_id`'s `port`:
    /// `<scheme>://<port>-<id>.<host>[:<port>]`, without a trailing slash.
    pub fn session_url(&self, session_id: &str, port: u16) -> String {
        let mut url = format!(
            "{}://{port}-{session_id}.{}",
            self.scheme.as_str(),
            self.host
        );
        if let Some(base_port) = self.port {
            url.push_str(&format!(":{base_port}"));
        }
        url
    }

    /// Which session host `host` (a Host header, or the authority of an
    /// absolute-form target) names: `Ok(None)` when it is not under the base
    /// (the request is the API's), `Err(MisdirectedHost)` when it is under
    /// the base but not a well-formed session host on the base's port.
    /// Case-insensitive; one trailing dot is tolerated.
    pub fn session_host(&self, host: &str) -> Result<Option<SessionHost>, EdgeRefusal> {
        if host.starts_with('[') {
            // An IPv6 literal is never under a DNS name.
            return Ok(None);
        }
        // Found byte by byte: a host is short, and a searcher costs more
        // to set up than the search.
        let (name, port) = match host.bytes().rposition(|b| b == b':') {
            Some(colon) => (&host[..colon], Some(&host[colon + 1..])),
            None => (host, None),
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        let Some(prefix) = strip_dns_suffix(name, &self.host) else {
            return Ok(None);
        };
        let port = match port {
            None => self.scheme.default_port(),
            Some(port) => parse_port(port).ok_or(EdgeRefusal::MisdirectedHost)?,
        };
        if port != self.port.unwrap_or(self.scheme.default_port()) {
            return Err(EdgeRefusal::MisdirectedHost);
        }
        parse_session_label(prefix)
            .map(Some)
            .ok_or(EdgeRefusal::MisdirectedHost)
    }
}

impl fmt::Display for PreviewBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

fn strip_prefix_ignore_case<'a>(raw: &'a str, prefix: &str) -> Option<&'a str> {
    let head = raw.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &raw[prefix.len()..])
}

/// `name` less `.<base>` (ASCII case-insensitive), when it ends in it.
fn strip_dns_suffix<'a>(name: &'a str, base: &str) -> Option<&'a str> {
    let cut = name.len().checked_sub(base.len() + 1)?;
    let tail = name.get(cut..)?;
    let (dot, rest) = tail.split_at(1);
    (dot == "." && rest.eq_ignore_ascii_case(base)).then(|| &name[..cut])
}

/// A decimal port from 1 to 65535 without a sign or leading zeros.
fn parse_port(raw: &str) -> Option<u16> {
    if raw.is_empty() || raw.len() > 5 || raw.starts_with('0') {
        return None;
    }
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse::<u16>().ok().filter(|port| *port != 0)
}

/// `<port>-<sessionId>` (one label, case-insensitive).
fn parse_session_label(label: &str) -> Option<SessionHost> {
    if label.len() > MAX_SESSION_LABEL || !label.is_ascii() {
        return None;
    }
    let dash = label.bytes().position(|b| b == b'-')?;
    let (port, id) = (&label[..dash], &label[dash + 1..]);
    let port = parse_port(port)?;
    let id = id.to_ascii_lowercase();
    is_session_id(&id).then_some(SessionHost {
        port,
        session_id: id,
    })
}

/// A lower-case DNS name of letters, digits and hyphens, with at least two
/// labels or `localhost`, whose last label is not numeric (no IPv4).
fn is_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_NAME {
        return false;
    }
    let labels: Vec<&str> = name.split('.').collect();
    let well_formed = labels.iter().all(|label| {
        !label.is_empty()
            && label.len() <= MAX_LABEL
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    let last_numeric = labels
        .last()
        .is_some_and(|label| label.bytes().all(|b| b.is_ascii_digit()));
    well_formed && !last_numeric
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "abcdefgh2345";

    fn base(raw: &str) -> PreviewBase {
        PreviewBase::parse(raw).expect("base")
    }

    fn session(port: u16) -> Option<SessionHost> {
        Some(SessionHost {
            port,
            session_id: ID.into(),
        })
    }

    #[test]
    fn parses_bases() {
        let prod = base("https://Run.Example.com.");
        assert_eq!(prod.scheme(), Scheme::Https);
        assert_eq!(prod.host(), "run.example.com");
        assert_eq!(prod.port(), None);
        assert_eq!(prod.to_string(), "https://run.example.com");
        let dev = base("http://localhost:8061/");
        assert_eq!(dev.port(), Some(8061));
        assert_eq!(base("https://run.example.com:443").port(), None);
        assert_eq!(base("HTTP://run.example.com:443").port(), Some(443));
    }

    #[test]
    fn refuses_bases_that_are_not_a_scheme_host_and_port() {
        for raw in [
            "",
            "run.example.com",
            "ftp://run.example.com",
            "https://",
            "https://run.example.com/preview",
            "https://run.example.com/?a=b",
            "https://run.example.com#x",
            "https://user@run.example.com",
            "https://user:pw@run.example.com",
            "https://127.0.0.1",
            "https://[::1]:8061",
            "https://run.example.com:0",
            "https://run.example.com:65536",
            "https://run.example.com:08061",
            "https://run.example.com:",
            "https://run_example.com",
            "https://-run.example.com",
            "https://run..example.com",
            "https://rün.example.com",
            "https://run.example.com..",
        ] {
            assert!(PreviewBase::parse(raw).is_err(), "{raw:?} was accepted");
        }
        let long = format!("https://{}.example.com", vec!["a".repeat(60); 4].join("."));
        assert!(PreviewBase::parse(&long).is_err());
    }

    #[test]
    fn builds_session_urls() {
        assert_eq!(
            base("https://run.example.com/").session_url(ID, 8845),
            format!("https://8845-{ID}.run.example.com")
        );
        assert_eq!(
            base("http://localhost:8061").session_url(ID, 3000),
            format!("http://3000-{ID}.localhost:8061")
        );
    }

    #[test]
    fn session_urls_name_their_session_host() {
        for raw in ["https://run.example.com", "http://localhost:8061"] {
            let base = base(raw);
            let url = base.session_url(ID, 8845);
            let host = url.split_once("://").expect("scheme").1;
            assert_eq!(base.session_host(host), Ok(session(8845)), "{url}");
        }
    }

    #[test]
    fn finds_session_hosts() {
        let prod = base("https://run.example.com");
        for host in [
            format!("8845-{ID}.run.example.com"),
            format!("8845-{ID}.run.example.com."),
            format!("8845-{ID}.RUN.Example.COM"),
            format!("8845-{}.run.example.com", ID.to_uppercase()),
            format!("8845-{ID}.run.example.com:443"),
            format!("8845-{ID}.run.example.com.:443"),
        ] {
            assert_eq!(prod.session_host(&host), Ok(session(8845)), "{host}");
        }
        let dev = base("http://localhost:8061");
        assert_eq!(
            dev.session_host(&format!("1-{ID}.localhost:8061")),
            Ok(session(1))
        );
        assert_eq!(
            dev.session_host(&format!("65535-{ID}.localhost:8061")),
            Ok(session(65535))
        );
    }

    #[test]
    fn other_hosts_are_the_apis() {
        let prod = base("https://run.example.com");
        for host in [
            "",
            "run.example.com",
            "run.example.com.",
            "run.example.com:443",
            "example.com",
            "127.0.0.1",
            "127.0.0.1:8061",
            "[::1]:8061",
            "[::1]",
            "localhost:6443",
            "xrun.example.com",
            &format!("8845-{ID}.evil.example"),
            &format!("8845-{ID}.run.example.com.evil.example"),
            &format!("8845-{ID}.run.example.com.."),
            &format!("8845-{ID}.run.example.com:443:443"),
        ] {
            assert_eq!(prod.session_host(host), Ok(None), "{host:?}");
        }
        let dev = base("http://localhost:8061");
        assert_eq!(dev.session_host("localhost:8061"), Ok(None));
        assert_eq!(dev.session_host("localhost:6443"), Ok(None));
    }

    #[test]
    fn malformed_hosts_under_the_base_are_misdirected() {
        let prod = base("https://run.example.com");
        let long_label = "a".repeat(64);
        for host in [
            format!("08080-{ID}.run.example.com"),
            format!("0-{ID}.run.example.com"),
            format!("65536-{ID}.run.example.com"),
            format!("-{ID}.run.example.com"),
            format!("+80-{ID}.run.example.com"),
            format!("8845{ID}.run.example.com"),
            format!("8845-{ID}x.run.example.com"),
            "8845-abcdefgh234.run.example.com".into(),
            "8845-abcdefgh2341.run.example.com".into(),
            "8845-abcdefgh234-.run.example.com".into(),
            format!("x.8845-{ID}.run.example.com"),
            format!("8845-{ID}.x.run.example.com"),
            format!("8845-{long_label}.run.example.com"),
            format!("{long_label}.run.example.com"),
            format!("{}.run.example.com", "a.".repeat(200)),
            "8845-abcdéfgh2345.run.example.com".into(),
            "8845-ａbcdefgh2345.run.example.com".into(),
            "ü.run.example.com".into(),
            ".run.example.com".into(),
            format!("8845-{ID}.run.example.com:8443"),
            format!("8845-{ID}.run.example.com:0443"),
            format!("8845-{ID}.run.example.com:"),
            format!("8845-{ID}.run.example.com:x"),
        ] {
            assert_eq!(
                prod.session_host(&host),
                Err(EdgeRefusal::MisdirectedHost),
                "{host:?}"
            );
        }
        let dev = base("http://localhost:8061");
        for host in [
            format!("8845-{ID}.localhost"),
            format!("8845-{ID}.localhost:80"),
            format!("8845-{ID}.localhost:6443"),
        ] {
            assert_eq!(
                dev.session_host(&host),
                Err(EdgeRefusal::MisdirectedHost),
                "{host:?}"
            );
        }
    }
}
