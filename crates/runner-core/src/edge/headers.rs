//! Header rules of the edge: which headers are the connection's own
//! (hop-by-hop), which framing is ambiguous, and which host a request names.

use std::borrow::Cow;
use std::net::IpAddr;

use bytes::Bytes;
use http::Request;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::EdgeRefusal;

/// The names that describe one connection and are never passed on (RFC
/// 9110 section 7.6.1, and the non-standard `Keep-Alive` and
/// `Proxy-Connection`), as a `HeaderName` spells them: in lower case. The
/// options of `Connection`, which a client may write in any case, are
/// compared with them ignoring case.
const HOP_BY_HOP_NAMES: [&str; 9] = [
    "connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
    "keep-alive",
    "proxy-connection",
];

/// Whether `name` describes one connection and is never passed on. Its
/// text is compared: a name of another length costs one comparison.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP_NAMES.contains(&name.as_str())
}

/// Header blocks up to this many names are searched name by name, which
/// costs less than hashing the name for a lookup.
const SCAN_NAMES: usize = 16;

/// Whether `headers` carry `name`. Most requests and responses carry a few
/// headers and none of the ones the edge looks for: telling that costs a
/// few comparisons, where a lookup would hash the name first.
pub(crate) fn carries(headers: &HeaderMap, name: &HeaderName) -> bool {
    if headers.keys_len() <= SCAN_NAMES {
        headers.keys().any(|carried| carried == name)
    } else {
        headers.contains_key(name)
    }
}

/// The options of `Connection`, trimmed.
fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .into_iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
}

/// Removes the hop-by-hop headers: the fixed ones and every header
/// `Connection` names. Most requests and responses carry few headers and
/// none or one of these (`Connection: keep-alive`), so one pass finds the
/// first, and each next pass looks through the names for the next to
/// remove rather than looking each candidate up.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let Some(first) = headers.keys().find(|name| is_hop_by_hop(name)).cloned() else {
        return;
    };
    // `Connection: keep-alive` (or `close`, or `upgrade`) names no header
    // that is not removed anyway.
    let names_others = connection_options(headers).any(|option| {
        !option.eq_ignore_ascii_case("close")
            && !HOP_BY_HOP_NAMES
                .iter()
                .any(|name| option.eq_ignore_ascii_case(name))
    });
    if names_others {
        let named_by_connection = |headers: &HeaderMap| {
            headers
                .keys()
                .find(|name| {
                    !is_hop_by_hop(name)
                        && connection_options(headers)
                            .any(|option| option.eq_ignore_ascii_case(name.as_str()))
                })
                .cloned()
        };
        while let Some(name) = named_by_connection(headers) {
            headers.remove(name);
        }
    }
    headers.remove(first);
    while let Some(name) = headers.keys().find(|name| is_hop_by_hop(name)).cloned() {
        headers.remove(name);
    }
}

/// The head a client gets of an upstream's `101 Switching Protocols`: its
/// own hop-by-hop headers dropped, the switch to `asked` (or the protocol
/// the upstream named) said again, HTTP/1.1, and nothing of the upstream
/// connection's extensions.
pub(crate) fn switched_head(
    mut parts: http::response::Parts,
    asked: Option<HeaderValue>,
) -> http::response::Parts {
    parts.extensions = http::Extensions::new();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(protocol) = protocol.or(asked) {
        parts.headers.insert(header::UPGRADE, protocol);
    }
    parts.version = http::Version::HTTP_11;
    parts
}

/// The protocol a request asks to switch to: its `Upgrade`, when
/// `Connection` carries the `upgrade` option.
pub(crate) fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    if !carries(headers, &header::CONNECTION) {
        return None;
    }
    let asks = connection_options(headers).any(|option| option.eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Refuses framing that two parsers could read differently (request
/// smuggling): `Content-Length` beside `Transfer-Encoding`, or several
/// `Content-Length` values that differ. Identical repeats are folded into
/// one header.
pub(crate) fn check_framing(headers: &mut HeaderMap) -> Result<(), EdgeRefusal> {
    let has_length = carries(headers, &header::CONTENT_LENGTH);
    if has_length && carries(headers, &header::TRANSFER_ENCODING) {
        return Err(EdgeRefusal::BadRequest(
            "a request may not carry both Content-Length and Transfer-Encoding",
        ));
    }
    if !has_length {
        return Ok(());
    }
    let mut length: Option<u64> = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        let text = value.to_str().map_err(|_| bad_length())?;
        for item in text.split(',') {
            let item = item.trim();
            if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad_length());
            }
            let parsed: u64 = item.parse().map_err(|_| bad_length())?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(EdgeRefusal::BadRequest(
                    "a request may not carry differing Content-Length values",
                ));
            }
            length = Some(parsed);
        }
    }
    if let Some(length) = length {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    Ok(())
}

fn bad_length() -> EdgeRefusal {
    EdgeRefusal::BadRequest("Content-Length must be a whole number")
}

/// An address as a header value (`X-Forwarded-For`).
pub(crate) fn address_value(ip: IpAddr) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from(ip.to_string())).ok()
}

/// The host a request names: the authority of an absolute-form target
/// (which a server must prefer, RFC 9112 section 3.2.2), else its `Host` header.
pub fn request_host<B>(request: &Request<B>) -> Option<Cow<'_, str>> {
    if let Some(authority) = request.uri().authority() {
        if !authority.as_str().contains('@') {
            return Some(Cow::Borrowed(authority.as_str()));
        }
        return Some(Cow::Owned(match authority.port() {
            Some(port) => format!("{}:{}", authority.host(), port.as_str()),
            None => authority.host().to_owned(),
        }));
    }
    request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(Cow::Borrowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        headers
    }

    #[test]
    fn carries_tells_a_name_in_small_and_large_blocks() {
        let small = headers(&[("host", "a"), ("x-forwarded-for", "10.0.0.1")]);
        assert!(carries(&small, &header::HOST));
        assert!(carries(&small, &HeaderName::from_static("x-forwarded-for")));
        assert!(!carries(&small, &header::CONNECTION));
        assert!(!carries(
            &small,
            &HeaderName::from_static("x-forwarded-host")
        ));
        let names: Vec<String> = (0..SCAN_NAMES + 4).map(|n| format!("x-h-{n}")).collect();
        let mut pairs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
        pairs.push(("connection", "close"));
        let large = headers(&pairs);
        assert!(large.keys_len() > SCAN_NAMES);
        assert!(carries(&large, &header::CONNECTION));
        assert!(carries(&large, &HeaderName::from_static("x-h-3")));
        assert!(!carries(&large, &header::UPGRADE));
    }

    #[test]
    fn a_block_without_hop_by_hop_headers_is_left_as_it_is() {
        let mut h = headers(&[("content-type", "text/plain"), ("x-kept", "1")]);
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = headers(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("proxy-authenticate", "Basic"),
            ("x-secret", "1"),
            ("x-other", "1"),
            ("x-kept", "1"),
            ("authorization", "Bearer t"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "x-kept"]);
    }

    #[test]
    fn a_connection_naming_only_hop_by_hop_options_keeps_the_rest() {
        let mut h = headers(&[
            ("Connection", "Keep-Alive"),
            ("keep-alive", "timeout=5"),
            ("content-type", "text/plain"),
            ("x-kept", "1"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-kept"]);
    }

    proptest::proptest! {
        /// Whatever the names and the options of `Connection`, what is left
        /// is exactly the headers that are neither fixed hop-by-hop ones
        /// nor named by `Connection`.
        #[test]
        fn stripping_leaves_exactly_the_end_to_end_headers(
            present in proptest::sample::subsequence(POOL.to_vec(), 0..POOL.len()),
            options in proptest::collection::vec(
                proptest::sample::select(POOL.iter().map(|n| n.to_uppercase()).chain(["close".into(), " x-a ".into()]).collect::<Vec<String>>()),
                0..4,
            ),
        ) {
            let mut pairs: Vec<(&str, &str)> = present.iter().map(|name| (*name, "v")).collect();
            let connection = options.join(",");
            if !options.is_empty() {
                pairs.push(("connection", &connection));
            }
            let mut h = headers(&pairs);
            strip_hop_by_hop(&mut h);
            let named: Vec<String> = options.iter().map(|o| o.trim().to_ascii_lowercase()).collect();
            let mut expected: Vec<&str> = present
                .iter()
                .copied()
                .filter(|name| {
                    !HOP_BY_HOP_NAMES.contains(name)
                        && !named.iter().any(|n| n == name)
                })
                .collect();
            expected.sort_unstable();
            let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
            left.sort_unstable();
            proptest::prop_assert_eq!(left, expected);
        }
    }

    const POOL: [&str; 8] = [
        "keep-alive",
        "te",
        "upgrade",
        "x-a",
        "x-b",
        "content-type",
        "authorization",
        "proxy-authorization",
    ];

    #[test]
    fn finds_upgrades() {
        let ws = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert_eq!(
            upgrade_protocol(&ws),
            Some(HeaderValue::from_static("websocket"))
        );
        assert_eq!(
            upgrade_protocol(&headers(&[("upgrade", "websocket")])),
            None
        );
        assert_eq!(
            upgrade_protocol(&headers(&[("connection", "upgrade")])),
            None
        );
    }

    #[test]
    fn refuses_ambiguous_framing() {
        let mut both = headers(&[("content-length", "5"), ("transfer-encoding", "chunked")]);
        assert!(check_framing(&mut both).is_err());
        let mut differing = headers(&[("content-length", "5"), ("content-length", "6")]);
        assert!(check_framing(&mut differing).is_err());
        let mut listed = headers(&[("content-length", "5, 6")]);
        assert!(check_framing(&mut listed).is_err());
        let mut signed = headers(&[("content-length", "+5")]);
        assert!(check_framing(&mut signed).is_err());
        let mut repeated = headers(&[("content-length", "5"), ("content-length", "5, 5")]);
        assert_eq!(check_framing(&mut repeated), Ok(()));
        assert_eq!(
            repeated
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .collect::<Vec<_>>(),
            [HeaderValue::from_static("5")]
        );
        assert_eq!(
            check_framing(&mut headers(&[("transfer-encoding", "chunked")])),
            Ok(())
        );
    }

    #[test]
    fn absolute_form_targets_name_the_host() {
        let request = Request::get("http://8845-abcdefgh2345.run.example.com:8061/x?y")
            .header(header::HOST, "other.example")
            .body(())
            .expect("request");
        assert_eq!(
            request_host(&request).as_deref(),
            Some("8845-abcdefgh2345.run.example.com:8061")
        );
        let request = Request::get("/x")
            .header(header::HOST, "Run.Example.com")
            .body(())
            .expect("request");
        assert_eq!(request_host(&request).as_deref(), Some("Run.Example.com"));
        let request = Request::get("/x").body(()).expect("request");
        assert_eq!(request_host(&request), None);
    }
}
