//! Header rules of the edge: which headers are the connection's own
//! (hop-by-hop), which framing is ambiguous, and which host a request names.

use http::Request;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::EdgeRefusal;

/// Headers that describe one connection, never passed on (RFC 9110 section 7.6.1,
/// and the non-standard `Keep-Alive` and `Proxy-Connection`).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// Removes the hop-by-hop headers: the fixed ones and every header
/// `Connection` names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
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
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|option| option.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Refuses framing that two parsers could read differently (request
/// smuggling): `Content-Length` beside `Transfer-Encoding`, or several
/// `Content-Length` values that differ. Identical repeats are folded into
/// one header.
pub(crate) fn check_framing(headers: &mut HeaderMap) -> Result<(), EdgeRefusal> {
    let has_length = headers.contains_key(header::CONTENT_LENGTH);
    if has_length && headers.contains_key(header::TRANSFER_ENCODING) {
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

/// The host a request names: the authority of an absolute-form target
/// (which a server must prefer, RFC 9112 section 3.2.2), else its `Host` header.
pub fn request_host<B>(request: &Request<B>) -> Option<String> {
    if let Some(authority) = request.uri().authority() {
        return Some(match authority.port() {
            Some(port) => format!("{}:{}", authority.host(), port.as_str()),
            None => authority.host().to_owned(),
        });
    }
    request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
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
