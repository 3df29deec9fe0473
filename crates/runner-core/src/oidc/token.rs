//! Reading a presented token: its shape and header before any key is looked
//! up, its signature against the key set, and its claims once the signature
//! holds. Every refusal is one sentence a client may be shown; values the
//! client sent are quoted only shortened.

use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::macros::format_description;

use super::keys::{Key, KeySet};
use super::{OidcConfig, TokenRefused, VerifiedToken};

/// The largest token the runner reads.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The most of a client-sent value a refusal quotes.
const QUOTED_CHARS: usize = 64;

/// A token split into its parts, its header read.
pub(crate) struct Parsed<'t> {
    pub alg: Algorithm,
    pub alg_name: String,
    pub kid: Option<String>,
    /// `header.payload`, what the signature covers.
    signed: &'t str,
    payload: &'t str,
    signature: &'t str,
}

fn refused(reason: impl Into<String>) -> TokenRefused {
    TokenRefused {
        reason: reason.into(),
    }
}

/// A client-sent value as a refusal quotes it: at most [`QUOTED_CHARS`]
/// characters, control characters dropped.
pub(crate) fn quoted(value: &str) -> String {
    let mut shown: String = value
        .chars()
        .filter(|c| !c.is_control())
        .take(QUOTED_CHARS)
        .collect();
    if value.chars().filter(|c| !c.is_control()).count() > QUOTED_CHARS {
        shown.push('…');
    }
    shown
}

fn is_base64url(part: &str) -> bool {
    part.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Three base64url parts separated by dots; the signature part may be empty
/// (an unsigned token, which is a JWT the runner refuses by its `alg`).
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    !header.is_empty()
        && !payload.is_empty()
        && is_base64url(header)
        && is_base64url(payload)
        && is_base64url(signature)
}

fn decode_object(part: &str) -> Option<Map<String, Value>> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Value::Object(object) => Some(object),
        _ => None,
    }
}

/// Checks the token's size, shape and header.
pub(crate) fn parse(token: &str) -> Result<Parsed<'_>, TokenRefused> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(refused(format!(
            "the token is larger than {MAX_TOKEN_BYTES} bytes"
        )));
    }
    if !looks_like_jwt(token) {
        return Err(refused("the token is not a JWT"));
    }
    let (signed, signature) = token.rsplit_once('.').unwrap_or((token, ""));
    let (header, payload) = signed.split_once('.').unwrap_or((signed, ""));
    let header =
        decode_object(header).ok_or_else(|| refused("the token's header is not a JSON object"))?;
    let alg_name = match header.get("alg") {
        Some(Value::String(alg)) => alg.clone(),
        _ => return Err(refused("the token's header names no alg")),
    };
    let alg = algorithm(&alg_name)?;
    if header.contains_key("crit") {
        return Err(refused(
            "the token's header lists critical extensions ('crit'), which this runner does not understand",
        ));
    }
    let kid = match header.get("kid") {
        None | Some(Value::Null) => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(refused("the token's key id ('kid') is not a string")),
    };
    Ok(Parsed {
        alg,
        alg_name,
        kid,
        signed,
        payload,
        signature,
    })
}

/// The algorithm a header names, if it is one a public key set can verify.
fn algorithm(name: &str) -> Result<Algorithm, TokenRefused> {
    if name.eq_ignore_ascii_case("none") {
        return Err(refused(format!(
            "the token is signed with alg '{}', which this runner never accepts",
            quoted(name)
        )));
    }
    match Algorithm::from_str(name) {
        Ok(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) => Err(refused(format!(
            "the token is signed with alg '{name}', a shared-secret algorithm this runner never accepts"
        ))),
        Ok(alg) => Ok(alg),
        Err(_) => Err(refused(format!(
            "the token is signed with alg '{}', which this runner does not support",
            quoted(name)
        ))),
    }
}

/// Checks the signature with the key the token names, or, when it names
/// none, with every key of the set that fits its algorithm.
pub(crate) fn check_signature(parsed: &Parsed<'_>, keys: &KeySet) -> Result<(), TokenRefused> {
    let candidates: Vec<&Key> = match &parsed.kid {
        Some(kid) => {
            let named: Vec<&Key> = keys.named(kid).collect();
            let fitting: Vec<&Key> = named
                .iter()
                .copied()
                .filter(|key| key.accepts(parsed.alg, &parsed.alg_name))
                .collect();
            if fitting.is_empty() {
                return Err(refused(format!(
                    "the token is signed with alg '{}', which key '{}' of the issuer's key set is not for",
                    parsed.alg_name,
                    quoted(kid)
                )));
            }
            fitting
        }
        None => {
            let fitting: Vec<&Key> = keys
                .keys
                .iter()
                .filter(|key| key.accepts(parsed.alg, &parsed.alg_name))
                .collect();
            if fitting.is_empty() {
                return Err(refused(format!(
                    "the token names no key id and the issuer's key set holds no key for alg '{}'",
                    parsed.alg_name
                )));
            }
            fitting
        }
    };
    // `accepts` has matched each key's kind to the algorithm, which
    // `jsonwebtoken::crypto::verify` relies on.
    let verified = candidates.iter().any(|key| {
        jsonwebtoken::crypto::verify(
            parsed.signature,
            parsed.signed.as_bytes(),
            &key.decoding,
            parsed.alg,
        )
        .unwrap_or(false)
    });
    if verified {
        Ok(())
    } else {
        Err(refused("the token's signature does not verify"))
    }
}

pub(crate) fn iso_seconds(at: f64) -> String {
    let format = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    // Saturating conversion: an absurd date is shown as its number.
    OffsetDateTime::from_unix_timestamp(at.floor() as i64)
        .ok()
        .and_then(|at| at.format(&format).ok())
        .unwrap_or_else(|| at.to_string())
}

/// A NumericDate claim: absent, or seconds since the epoch.
fn numeric_date(claims: &Map<String, Value>, name: &str) -> Result<Option<f64>, TokenRefused> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(number)) => match number.as_f64() {
            Some(seconds) if seconds.is_finite() => Ok(Some(seconds)),
            _ => Err(refused(format!(
                "the token's '{name}' claim is not a number"
            ))),
        },
        Some(_) => Err(refused(format!(
            "the token's '{name}' claim is not a number"
        ))),
    }
}

/// Checks the claims of a token whose signature holds, at `now` (seconds
/// since the epoch), and says who it names.
pub(crate) fn check_claims(
    parsed: &Parsed<'_>,
    config: &OidcConfig,
    now: f64,
) -> Result<VerifiedToken, TokenRefused> {
    let claims = decode_object(parsed.payload)
        .ok_or_else(|| refused("the token's claims are not a JSON object"))?;
    let skew = config.max_clock_skew.as_secs_f64();

    let Some(expires) = numeric_date(&claims, "exp")? else {
        return Err(refused(
            "the token has no expiry ('exp' claim), which this runner requires",
        ));
    };
    if now >= expires + skew {
        return Err(refused(format!(
            "the token expired at {}",
            iso_seconds(expires)
        )));
    }
    if let Some(not_before) = numeric_date(&claims, "nbf")?
        && now + skew < not_before
    {
        return Err(refused(format!(
            "the token is not valid before {}",
            iso_seconds(not_before)
        )));
    }
    if let Some(issued) = numeric_date(&claims, "iat")?
        && issued > now + skew
    {
        return Err(refused(format!(
            "the token was issued in the future, at {}",
            iso_seconds(issued)
        )));
    }

    if claims.get("iss").and_then(Value::as_str) != Some(config.issuer.as_str()) {
        return Err(refused(format!(
            "the token's issuer is not '{}'",
            config.issuer
        )));
    }
    let audience_named = match claims.get("aud") {
        Some(Value::String(audience)) => *audience == config.audience,
        Some(Value::Array(audiences)) => audiences
            .iter()
            .any(|audience| audience.as_str() == Some(config.audience.as_str())),
        _ => false,
    };
    if !audience_named {
        return Err(refused(format!(
            "the token's audience is not '{}'",
            config.audience
        )));
    }

    let subject = match claims.get("sub") {
        Some(Value::String(subject)) if !subject.is_empty() => subject.clone(),
        _ => {
            return Err(refused(
                "the token has no 'sub' claim, which names its subject",
            ));
        }
    };
    let tenant_claim = &config.tenant_claim;
    let tenant = match claims.get(tenant_claim) {
        None | Some(Value::Null) => {
            return Err(refused(format!(
                "the token has no '{tenant_claim}' claim, which names its tenant"
            )));
        }
        Some(Value::String(tenant)) if !tenant.is_empty() => tenant.clone(),
        Some(_) => {
            return Err(refused(format!(
                "the token's '{tenant_claim}' claim, which names its tenant, is not a non-empty string"
            )));
        }
    };
    let groups_claim = &config.groups_claim;
    let not_groups = || {
        refused(format!(
            "the token's '{groups_claim}' claim, which names its groups, is not a string or a list of strings"
        ))
    };
    let groups = match claims.get(groups_claim) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(group)) => vec![group.clone()],
        Some(Value::Array(groups)) => groups
            .iter()
            .map(|group| group.as_str().map(str::to_owned).ok_or_else(not_groups))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(not_groups()),
    };
    Ok(VerifiedToken {
        subject,
        tenant,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(value: &Value) -> String {
        URL_SAFE_NO_PAD.encode(value.to_string())
    }

    fn reason(token: &str) -> String {
        match parse(token) {
            Ok(_) => "parsed".to_owned(),
            Err(err) => err.reason,
        }
    }

    #[test]
    fn the_shape_of_a_jwt_is_three_base64url_parts() {
        assert!(looks_like_jwt("eyJh.eyJi.c2ln"));
        assert!(looks_like_jwt("eyJh.eyJi."));
        assert!(!looks_like_jwt("eyJh.eyJi"));
        assert!(!looks_like_jwt("eyJh.eyJi.c2ln.more"));
        assert!(!looks_like_jwt(".eyJi.c2ln"));
        assert!(!looks_like_jwt("eyJh..c2ln"));
        assert!(!looks_like_jwt("eyJh.eyJi.c2ln="));
        assert!(!looks_like_jwt("eyJh.ey Ji.c2ln"));
        assert!(!looks_like_jwt("a-static-token_1"));
        assert!(!looks_like_jwt(""));
    }

    #[test]
    fn headers_the_runner_cannot_use_are_refused_by_name() {
        let claims = part(&serde_json::json!({}));
        let with = |header: Value| format!("{}.{claims}.c2ln", part(&header));
        assert_eq!(
            reason(&with(serde_json::json!({"alg": "HS512"}))),
            "the token is signed with alg 'HS512', a shared-secret algorithm this runner never accepts"
        );
        assert_eq!(
            reason(&with(serde_json::json!({"alg": "NONE"}))),
            "the token is signed with alg 'NONE', which this runner never accepts"
        );
        assert_eq!(
            reason(&with(serde_json::json!({"alg": "RSA-OAEP"}))),
            "the token is signed with alg 'RSA-OAEP', which this runner does not support"
        );
        assert_eq!(
            reason(&with(serde_json::json!({"typ": "JWT"}))),
            "the token's header names no alg"
        );
        assert_eq!(
            reason(&with(serde_json::json!({"alg": "ES256", "kid": 7}))),
            "the token's key id ('kid') is not a string"
        );
        assert_eq!(
            reason(&with(serde_json::json!({"alg": "ES256", "crit": ["exp"]}))),
            "the token's header lists critical extensions ('crit'), which this runner does not understand"
        );
        assert_eq!(
            reason(&format!("{}.{claims}.c2ln", URL_SAFE_NO_PAD.encode("[1]"))),
            "the token's header is not a JSON object"
        );
        assert_eq!(
            reason(&"a".repeat(MAX_TOKEN_BYTES + 1)),
            "the token is larger than 16384 bytes"
        );
        assert_eq!(
            reason(&with(serde_json::json!({"alg": "ES256", "kid": "k"}))),
            "parsed"
        );
    }

    #[test]
    fn quoted_values_are_short_and_printable() {
        assert_eq!(quoted("k1"), "k1");
        assert_eq!(quoted("a\nb"), "ab");
        assert_eq!(quoted(&"x".repeat(100)), format!("{}…", "x".repeat(64)));
    }

    #[test]
    fn dates_are_shown_to_the_second() {
        assert_eq!(iso_seconds(1_796_378_400.0), "2026-12-04T10:00:00Z");
        assert_eq!(iso_seconds(1e20), "100000000000000000000");
    }
}
