//! Why the edge did not forward a request, and the page or JSON it answers
//! instead.

use axum::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use super::SessionHost;

/// Why a request for a session host was not forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeRefusal {
    /// A host under the preview base that is not a session host (421;
    /// never forwarded).
    MisdirectedHost,
    /// No session of that id (404).
    UnknownSession,
    /// The session has ended (410).
    Ended,
    /// The session does not publish that port (404).
    PortNotPublished,
    /// The session is still starting (503, `Retry-After: 2`).
    Starting,
    /// Nothing listens on the port yet (502, `Retry-After: 1`).
    NotListening,
    /// The session's app did not answer in time (504).
    Timeout,
    /// The session has as many requests and connections in flight as the
    /// edge allows one session (503, `Retry-After: 1`).
    TooManyConnections,
    /// A request the edge will not pass on: ambiguous framing (both
    /// `Content-Length` and `Transfer-Encoding`, or differing lengths), or a
    /// target it cannot re-target (400). The text says which.
    BadRequest(&'static str),
    /// The session's app broke off the exchange or answered with something
    /// that is not HTTP (502).
    UpstreamFailed,
    /// The port asks for access the request does not show (401).
    Unauthorized,
    /// A browser's navigation to a session still waking (or starting)
    /// after a moment: a page that says so and reloads itself (503,
    /// `Retry-After: 2`).
    Waking,
}

impl EdgeRefusal {
    /// The status of the refusal's response.
    pub fn status(&self) -> StatusCode {
        match self {
            EdgeRefusal::MisdirectedHost => StatusCode::MISDIRECTED_REQUEST,
            EdgeRefusal::UnknownSession | EdgeRefusal::PortNotPublished => StatusCode::NOT_FOUND,
            EdgeRefusal::Ended => StatusCode::GONE,
            EdgeRefusal::Starting | EdgeRefusal::TooManyConnections | EdgeRefusal::Waking => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            EdgeRefusal::NotListening | EdgeRefusal::UpstreamFailed => StatusCode::BAD_GATEWAY,
            EdgeRefusal::Timeout => StatusCode::GATEWAY_TIMEOUT,
            EdgeRefusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            EdgeRefusal::Unauthorized => StatusCode::UNAUTHORIZED,
        }
    }

    /// The `error` code of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            EdgeRefusal::MisdirectedHost => "misdirected_host",
            EdgeRefusal::UnknownSession => "unknown_session",
            EdgeRefusal::Ended => "session_ended",
            EdgeRefusal::PortNotPublished => "port_not_published",
            EdgeRefusal::Starting => "session_starting",
            EdgeRefusal::NotListening => "port_not_listening",
            EdgeRefusal::Timeout => "upstream_timeout",
            EdgeRefusal::TooManyConnections => "too_many_connections",
            EdgeRefusal::BadRequest(_) => "bad_request",
            EdgeRefusal::UpstreamFailed => "upstream_failed",
            EdgeRefusal::Unauthorized => "unauthorized",
            EdgeRefusal::Waking => "session_waking",
        }
    }

    /// Seconds a client should wait before trying again, where it may.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            EdgeRefusal::Starting | EdgeRefusal::Waking => Some(2),
            EdgeRefusal::NotListening | EdgeRefusal::TooManyConnections => Some(1),
            _ => None,
        }
    }

    /// The sentence saying what is wrong.
    pub fn message(&self, host: Option<&SessionHost>) -> String {
        let session = |what: &str| match host {
            Some(host) => format!("session {} {what}", host.session_id),
            None => format!("this session {what}"),
        };
        match self {
            EdgeRefusal::MisdirectedHost => {
                "this host is not a session address (<port>-<session id> under the preview domain)"
                    .into()
            }
            EdgeRefusal::UnknownSession => session("does not exist"),
            EdgeRefusal::Ended => "this session has ended".into(),
            EdgeRefusal::PortNotPublished => match host {
                Some(host) => format!(
                    "session {} does not publish port {}",
                    host.session_id, host.port
                ),
                None => "this session does not publish this port".into(),
            },
            EdgeRefusal::Starting => session("is still starting; try again shortly"),
            EdgeRefusal::NotListening => match host {
                Some(host) => format!(
                    "nothing in session {} listens on port {} yet; try again shortly",
                    host.session_id, host.port
                ),
                None => "nothing listens on this port yet; try again shortly".into(),
            },
            EdgeRefusal::Timeout => match host {
                Some(host) => format!(
                    "the app of session {} on port {} did not answer in time",
                    host.session_id, host.port
                ),
                None => "the app did not answer in time".into(),
            },
            EdgeRefusal::TooManyConnections => {
                session("has too many requests in flight; try again shortly")
            }
            EdgeRefusal::BadRequest(why) => format!("bad request: {why}"),
            EdgeRefusal::UpstreamFailed => match host {
                Some(host) => format!(
                    "the app of session {} on port {} broke off the exchange",
                    host.session_id, host.port
                ),
                None => "the app broke off the exchange".into(),
            },
            EdgeRefusal::Unauthorized => match host {
                Some(host) => format!(
                    "port {} of session {} is private: open it from the link its session reports, a share link, or with the session's workload token",
                    host.port, host.session_id
                ),
                None => "this port is private".into(),
            },
            EdgeRefusal::Waking => {
                session("is waking up; this page reloads itself until it answers")
            }
        }
    }
}

/// The response to a refusal: a small `text/html` page when the client
/// prefers HTML (a browser), else `{"error": "<code>", "message": "..."}`,
/// with `Retry-After` where the refusal passes.
pub fn refusal_response(
    refusal: &EdgeRefusal,
    wants_html: bool,
    host: Option<&SessionHost>,
) -> Response<Body> {
    let status = refusal.status();
    let message = refusal.message(host);
    let (content_type, body) = if wants_html {
        let title = status.canonical_reason().unwrap_or("Error");
        // The waking page comes back by itself: the browser asks again,
        // which waits on the same resume, until the app answers.
        let reload = match refusal {
            EdgeRefusal::Waking => "<meta http-equiv=\"refresh\" content=\"2\">",
            _ => "",
        };
        let page = format!(
            "<!doctype html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width\">{reload}\
             <title>{code} {title}</title></head>\n<body>\n<h1>{code} {title}</h1>\n\
             <p>{message}</p>\n</body>\n</html>\n",
            code = status.as_u16(),
            title = escape_html(title),
            message = escape_html(&message),
        );
        ("text/html; charset=utf-8", page)
    } else {
        let json = serde_json::json!({"error": refusal.code(), "message": message});
        ("application/json", json.to_string())
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(seconds) = refusal.retry_after() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// Whether `Accept` ranks `text/html` above `application/json` (a browser's
/// navigation); no `Accept`, or one that does not say, means JSON.
pub fn prefers_html(headers: &HeaderMap) -> bool {
    if !super::headers::carries(headers, &header::ACCEPT) {
        return false;
    }
    ranks_html_first(headers.get_all(header::ACCEPT))
}

/// What a request prefers, kept for when a refusal needs it: most
/// requests are forwarded, and never have their `Accept` read.
#[derive(Debug, Clone)]
pub(crate) enum Preference {
    Known(bool),
    /// The request's one `Accept`, read when asked.
    Accept(HeaderValue),
}

impl Preference {
    pub(crate) fn of(headers: &HeaderMap) -> Preference {
        if !super::headers::carries(headers, &header::ACCEPT) {
            return Preference::Known(false);
        }
        let mut values = headers.get_all(header::ACCEPT).into_iter();
        match (values.next(), values.next()) {
            (Some(one), None) => Preference::Accept(one.clone()),
            _ => Preference::Known(prefers_html(headers)),
        }
    }

    /// [`prefers_html`] of the request this was taken of.
    pub(crate) fn html(&self) -> bool {
        match self {
            Preference::Known(html) => *html,
            Preference::Accept(value) => ranks_html_first([value]),
        }
    }
}

/// [`prefers_html`] of these `Accept` values.
fn ranks_html_first<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> bool {
    let mut html = (0u8, 0.0f32);
    let mut json = (0u8, 0.0f32);
    for value in values {
        let Ok(value) = value.to_str() else {
            continue;
        };
        for range in value.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let mut q = 1.0f32;
            for param in parts {
                if let Some((name, value)) = param.split_once('=')
                    && name.trim().eq_ignore_ascii_case("q")
                {
                    q = value.trim().parse().unwrap_or(0.0);
                }
            }
            let q = if q.is_finite() {
                q.clamp(0.0, 1.0)
            } else {
                0.0
            };
            rank(&mut html, media, "text", "html", q);
            rank(&mut json, media, "application", "json", q);
        }
    }
    html.1 > 0.0 && html.1 > json.1
}

/// Keeps, for the type `kind/sub`, the quality of the most specific range
/// that matches it (media types are case-insensitive).
fn rank(best: &mut (u8, f32), media: &str, kind: &str, sub: &str, q: f32) {
    let specificity = match media.split_once('/') {
        Some((k, s)) if k.eq_ignore_ascii_case(kind) && s.eq_ignore_ascii_case(sub) => 3,
        Some((k, "*")) if k.eq_ignore_ascii_case(kind) => 2,
        Some(("*", "*")) => 1,
        _ => return,
    };
    if specificity > best.0 {
        *best = (specificity, q);
    }
}

fn escape_html(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_str(value).expect("accept"),
        );
        headers
    }

    #[test]
    fn browsers_get_html_and_everything_else_json() {
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert!(prefers_html(&accept(browser)));
        assert!(prefers_html(&accept("text/*")));
        assert!(!prefers_html(&HeaderMap::new()));
        assert!(!prefers_html(&accept("*/*")));
        assert!(!prefers_html(&accept("application/json")));
        assert!(!prefers_html(&accept("application/json, text/html;q=0.5")));
        assert!(!prefers_html(&accept("text/html;q=0")));
        assert!(!prefers_html(&accept("text/html;q=nan")));
        assert!(prefers_html(&accept("application/json;q=0.4, text/html")));
        assert!(prefers_html(&accept("Text/HTML")));
        assert!(!prefers_html(&accept("TEXT/html;q=0.2, Application/JSON")));
    }

    #[test]
    fn a_kept_preference_is_what_the_headers_said() {
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        for value in [
            browser,
            "*/*",
            "application/json, text/html;q=0.5",
            "Text/HTML",
        ] {
            let headers = accept(value);
            let kept = Preference::of(&headers);
            assert!(matches!(kept, Preference::Accept(_)), "{value}");
            assert_eq!(kept.html(), prefers_html(&headers), "{value}");
        }
        assert!(!Preference::of(&HeaderMap::new()).html());
        // Several `Accept` headers are read at once, as one list.
        let mut headers = accept("application/json;q=0.5");
        headers.append(header::ACCEPT, HeaderValue::from_static("text/html"));
        let kept = Preference::of(&headers);
        assert!(matches!(kept, Preference::Known(true)));
        assert!(prefers_html(&headers));
    }

    #[tokio::test]
    async fn json_refusals_carry_code_message_and_retry_after() {
        let host = SessionHost {
            port: 8845,
            session_id: "abcdefgh2345".into(),
        };
        let response = refusal_response(&EdgeRefusal::PortNotPublished, false, Some(&host));
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            body,
            serde_json::json!({
                "error": "port_not_published",
                "message": "session abcdefgh2345 does not publish port 8845",
            })
        );
        for (refusal, status, retry) in [
            (EdgeRefusal::MisdirectedHost, 421, None),
            (EdgeRefusal::UnknownSession, 404, None),
            (EdgeRefusal::Ended, 410, None),
            (EdgeRefusal::Starting, 503, Some("2")),
            (EdgeRefusal::NotListening, 502, Some("1")),
            (EdgeRefusal::Timeout, 504, None),
            (EdgeRefusal::TooManyConnections, 503, Some("1")),
            (EdgeRefusal::BadRequest("x"), 400, None),
            (EdgeRefusal::UpstreamFailed, 502, None),
        ] {
            let response = refusal_response(&refusal, false, Some(&host));
            assert_eq!(response.status().as_u16(), status, "{refusal:?}");
            assert_eq!(
                response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .map(|v| v.to_str().expect("ascii")),
                retry,
                "{refusal:?}"
            );
        }
    }

    #[tokio::test]
    async fn html_refusals_are_a_small_escaped_page() {
        let response = refusal_response(&EdgeRefusal::Ended, true, None);
        assert_eq!(response.status(), StatusCode::GONE);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let page = String::from_utf8(body.to_vec()).expect("utf-8");
        assert!(page.contains("<h1>410 Gone</h1>"), "{page}");
        assert!(page.contains("this session has ended"), "{page}");
        let response = refusal_response(&EdgeRefusal::BadRequest("<script>"), true, None);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let page = String::from_utf8(body.to_vec()).expect("utf-8");
        assert!(page.contains("&lt;script&gt;") && !page.contains("<script>"));
    }
}
