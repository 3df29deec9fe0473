//! The edge's door: whether a request may reach a session's port, and what
//! of the request is the edge's own (the `telo_access` parameter and
//! cookie, which the app never sees).

use axum::body::Body;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};

use super::access::{ACCESS_PARAM, AccessPolicy, COOKIE_TTL, Pass, PassKind, PreviewAccess};
use super::headers::carries;
use super::resolver::EdgeResolver;
use super::{EdgeRefusal, Scheme, SessionHost};

/// What the door decided for a request that may pass.
pub(super) enum Admission {
    /// Forward it (what is the edge's own has been taken out).
    Forward,
    /// Answer this instead: a grant or link traded for a cookie, and the
    /// browser sent on to the same address without the parameter.
    Answer(Response<Body>),
}

/// The credentials a request carries, taken out of it.
#[derive(Default)]
struct Presented {
    param: Option<String>,
    cookies: Vec<String>,
    bearer: Option<String>,
}

/// Decides whether `request` may reach `host`, taking the edge's own
/// parameter and cookie out of it either way. `Err(Unauthorized)` when the
/// port asks for access and the request shows none that opens it.
pub(super) fn admit<B>(
    policy: &AccessPolicy,
    resolver: &dyn EdgeResolver,
    host: &SessionHost,
    scheme: Scheme,
    request: &mut Request<B>,
    upgrade: bool,
) -> Result<Admission, EdgeRefusal> {
    let presented = take_presented(request)?;
    let guarded = resolver.token_guarded(host)?;
    if policy.access == PreviewAccess::Public && !guarded {
        return Ok(Admission::Forward);
    }
    let now = super::access::unix_now();
    let live = |pass: &Pass| pass.link_id().is_none_or(|id| resolver.link_live(host, id));
    if let Some(pass) = presented
        .param
        .as_deref()
        .and_then(|token| policy.signer.verify(token))
        .filter(|pass| matches!(pass.kind, PassKind::Grant | PassKind::Link { .. }))
        .filter(|pass| pass.opens(&host.session_id, host.port, now) && live(pass))
    {
        let navigation = matches!(*request.method(), Method::GET | Method::HEAD) && !upgrade;
        if navigation {
            return Ok(Admission::Answer(trade_for_cookie(
                policy, &pass, scheme, request, now,
            )));
        }
        return Ok(Admission::Forward);
    }
    let by_cookie = presented.cookies.iter().any(|token| {
        policy.signer.verify(token).is_some_and(|pass| {
            matches!(pass.kind, PassKind::Cookie { .. })
                && pass.opens(&host.session_id, host.port, now)
                && live(&pass)
        })
    });
    if by_cookie {
        return Ok(Admission::Forward);
    }
    if presented
        .bearer
        .as_deref()
        .is_some_and(|token| resolver.token_admits(host, token))
    {
        return Ok(Admission::Forward);
    }
    Err(EdgeRefusal::Unauthorized)
}

/// A `303 See Other` to the request's own target without the parameter,
/// setting the cookie the pass is traded for.
fn trade_for_cookie<B>(
    policy: &AccessPolicy,
    pass: &Pass,
    scheme: Scheme,
    request: &Request<B>,
    now: u64,
) -> Response<Body> {
    let link = pass.link_id().map(str::to_owned);
    let expires_at = now
        .saturating_add(COOKIE_TTL.as_secs())
        .min(if link.is_some() {
            pass.expires_at
        } else {
            u64::MAX
        });
    let cookie = policy.signer.sign(&Pass {
        kind: PassKind::Cookie { link },
        session_id: pass.session_id.clone(),
        port: pass.port,
        expires_at,
    });
    let secure = if scheme == Scheme::Https {
        "; Secure"
    } else {
        ""
    };
    let set_cookie = format!(
        "{ACCESS_PARAM}={cookie}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
        expires_at.saturating_sub(now)
    );
    let location = request
        .uri()
        .path_and_query()
        .map_or("/", |target| target.as_str())
        .to_owned();
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SEE_OTHER;
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, value);
    }
    if let Ok(value) = HeaderValue::from_str(&set_cookie) {
        headers.insert(header::SET_COOKIE, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Takes the `telo_access` parameter out of the target and the
/// `telo_access` cookies out of `Cookie`, and reads a bearer token.
fn take_presented<B>(request: &mut Request<B>) -> Result<Presented, EdgeRefusal> {
    let mut presented = Presented::default();
    // Most requests carry neither the parameter nor the cookie: one search
    // each tells, before anything is split or copied.
    if let Some(query) = request
        .uri()
        .query()
        .filter(|query| query.contains(ACCESS_PARAM))
    {
        let mut kept = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some((ACCESS_PARAM, value)) => presented.param = Some(value.to_owned()),
                _ if pair == ACCESS_PARAM => {}
                _ => kept.push(pair),
            }
        }
        if kept.len() != query.split('&').count() {
            let rest = kept.join("&");
            let target = if rest.is_empty() {
                request.uri().path().to_owned()
            } else {
                format!("{}?{rest}", request.uri().path())
            };
            let mut parts = request.uri().clone().into_parts();
            parts.path_and_query =
                Some(target.parse().map_err(|_| {
                    EdgeRefusal::BadRequest("the request target is not a valid path")
                })?);
            *request.uri_mut() = Uri::from_parts(parts)
                .map_err(|_| EdgeRefusal::BadRequest("the request target is not a valid path"))?;
        }
    }
    let headers = request.headers_mut();
    let carries_ours = carries(headers, &header::COOKIE)
        && headers.get_all(header::COOKIE).iter().any(|value| {
            value
                .as_bytes()
                .windows(ACCESS_PARAM.len())
                .any(|w| w == ACCESS_PARAM.as_bytes())
        });
    if carries_ours {
        let cookie_values: Vec<HeaderValue> =
            headers.get_all(header::COOKIE).iter().cloned().collect();
        let mut kept = Vec::new();
        for value in &cookie_values {
            let Ok(text) = value.to_str() else {
                continue;
            };
            for cookie in text.split(';').map(str::trim).filter(|c| !c.is_empty()) {
                match cookie.split_once('=') {
                    Some((name, value)) if name.trim() == ACCESS_PARAM => {
                        presented
                            .cookies
                            .push(value.trim().trim_matches('"').to_owned());
                    }
                    _ => kept.push(cookie.to_owned()),
                }
            }
        }
        headers.remove(header::COOKIE);
        if !kept.is_empty()
            && let Ok(value) = HeaderValue::from_str(&kept.join("; "))
        {
            headers.insert(header::COOKIE, value);
        }
    }
    if !carries(headers, &header::AUTHORIZATION) {
        return Ok(presented);
    }
    presented.bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        });
    Ok(presented)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(target: &str, cookies: &[&str]) -> Request<()> {
        let mut builder = Request::builder().uri(target);
        for cookie in cookies {
            builder = builder.header(header::COOKIE, *cookie);
        }
        builder.body(()).expect("request")
    }

    #[test]
    fn the_parameter_and_cookie_are_taken_out_and_the_rest_kept() {
        let mut req = request(
            "/api/x?a=1&telo_access=tok&b=2",
            &["theme=dark; telo_access=c1", "telo_access=\"c2\""],
        );
        let presented = take_presented(&mut req).expect("taken");
        assert_eq!(presented.param.as_deref(), Some("tok"));
        assert_eq!(presented.cookies, ["c1", "c2"]);
        assert_eq!(req.uri().to_string(), "/api/x?a=1&b=2");
        assert_eq!(req.headers()[header::COOKIE], "theme=dark");

        let mut req = request("/?telo_access=tok", &["telo_access=c1"]);
        take_presented(&mut req).expect("taken");
        assert_eq!(req.uri().to_string(), "/");
        assert!(req.headers().get(header::COOKIE).is_none());

        let mut req = request("/p?a=1&b", &["theme=dark;  lang=en", "x=1"]);
        let presented = take_presented(&mut req).expect("taken");
        assert!(presented.param.is_none() && presented.cookies.is_empty());
        assert_eq!(req.uri().to_string(), "/p?a=1&b");
        let cookies: Vec<_> = req.headers().get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["theme=dark;  lang=en", "x=1"]);

        let mut req = request("http://8080-abc.run.example.com/p?q=1", &[]);
        let presented = take_presented(&mut req).expect("taken");
        assert_eq!(presented.param, None);
        assert_eq!(
            req.uri().to_string(),
            "http://8080-abc.run.example.com/p?q=1"
        );
    }

    #[test]
    fn a_bearer_token_is_read_in_any_case_of_its_scheme() {
        let mut req = Request::builder()
            .uri("/")
            .header(header::AUTHORIZATION, "bearer  abc ")
            .body(())
            .expect("request");
        assert_eq!(
            take_presented(&mut req).expect("taken").bearer.as_deref(),
            Some("abc")
        );
    }
}
