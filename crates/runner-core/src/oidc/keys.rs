//! The issuer's key set: a JSON Web Key Set (RFC 7517) parsed into the public
//! keys a token may be signed with. Each key is read on its own, so one key
//! of a kind the runner does not use (an encryption key, a curve it does not
//! verify) is skipped rather than making the whole set unusable; symmetric
//! (`oct`) keys are always skipped, since a published secret is no secret.

use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

/// The largest key set the runner reads; an issuer's set is a few KiB.
pub const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// What kind of public key a JWK holds, which decides the algorithms it can
/// verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

impl KeyKind {
    fn verifies(self, alg: Algorithm) -> bool {
        use Algorithm::*;
        match self {
            KeyKind::Rsa => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            KeyKind::P256 => alg == ES256,
            KeyKind::P384 => alg == ES384,
            KeyKind::Ed25519 => alg == EdDSA,
        }
    }
}

/// One signing key of the set.
#[derive(Clone)]
pub(crate) struct Key {
    pub kid: Option<String>,
    /// The JWK's `alg`, when it names one: the only algorithm the key may
    /// verify.
    pub alg: Option<String>,
    pub kind: KeyKind,
    pub decoding: DecodingKey,
}

impl Key {
    /// Whether a token whose header says `alg` may be checked with this key.
    /// The key's kind must fit the algorithm: `jsonwebtoken` assumes the
    /// caller never pairs an RSA key with another family.
    pub fn accepts(&self, alg: Algorithm, alg_name: &str) -> bool {
        self.kind.verifies(alg) && self.alg.as_deref().is_none_or(|own| own == alg_name)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// The signing keys of one key set.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeySet {
    pub keys: Vec<Key>,
}

impl KeySet {
    /// Parses the text of a key set; the error completes "is not a usable
    /// key set: …".
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() > MAX_JWKS_BYTES {
            return Err(format!("it is larger than {MAX_JWKS_BYTES} bytes"));
        }
        #[derive(Deserialize)]
        struct Set {
            keys: Vec<serde_json::Value>,
        }
        let set: Set = serde_json::from_slice(bytes)
            .map_err(|err| format!("it is not a JSON object with a 'keys' list ({err})"))?;
        let keys: Vec<Key> = set.keys.into_iter().filter_map(parse_key).collect();
        if keys.is_empty() {
            return Err("it holds no RSA, P-256, P-384 or Ed25519 signing key".to_owned());
        }
        Ok(Self { keys })
    }

    /// The keys named `kid`.
    pub fn named<'a>(&'a self, kid: &'a str) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys
            .iter()
            .filter(move |key| key.kid.as_deref() == Some(kid))
    }

    pub fn holds(&self, kid: &str) -> bool {
        self.named(kid).next().is_some()
    }
}

/// The members of a JWK the runner reads; the rest are ignored.
#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    alg: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// One key of the set, or `None` for a key the runner cannot or must not
/// verify with.
fn parse_key(value: serde_json::Value) -> Option<Key> {
    let raw: RawJwk = serde_json::from_value(value).ok()?;
    if raw.usage.as_deref().is_some_and(|usage| usage != "sig") {
        return None;
    }
    let (kind, decoding) = match (raw.kty.as_str(), raw.crv.as_deref()) {
        ("RSA", _) => (
            KeyKind::Rsa,
            DecodingKey::from_rsa_components(raw.n.as_deref()?, raw.e.as_deref()?).ok()?,
        ),
        ("EC", Some(curve @ ("P-256" | "P-384"))) => {
            let kind = if curve == "P-256" {
                KeyKind::P256
            } else {
                KeyKind::P384
            };
            (
                kind,
                DecodingKey::from_ec_components(raw.x.as_deref()?, raw.y.as_deref()?).ok()?,
            )
        }
        ("OKP", Some("Ed25519")) => (
            KeyKind::Ed25519,
            DecodingKey::from_ed_components(raw.x.as_deref()?).ok()?,
        ),
        _ => return None,
    };
    // A key whose own `alg` its kind cannot verify (or that names an
    // algorithm the runner does not know) would never verify a token.
    if let Some(alg) = raw.alg.as_deref() {
        let known: Algorithm = alg.parse().ok()?;
        if !kind.verifies(known) {
            return None;
        }
    }
    Some(Key {
        kid: raw.kid,
        alg: raw.alg,
        kind,
        decoding,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: serde_json::Value) -> Result<KeySet, String> {
        KeySet::parse(value.to_string().as_bytes())
    }

    const ED_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    #[test]
    fn keys_the_runner_cannot_verify_with_are_skipped() {
        let set = parse(json!({"keys": [
            {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
            {"kty": "OKP", "crv": "X25519", "kid": "x", "x": ED_X},
            {"kty": "OKP", "crv": "Ed25519", "kid": "enc", "use": "enc", "x": ED_X},
            {"kty": "OKP", "crv": "Ed25519", "kid": "wrong-alg", "alg": "RS256", "x": ED_X},
            {"kty": "OKP", "crv": "Ed25519", "kid": "odd-alg", "alg": "ECDH-ES", "x": ED_X},
            {"kty": "RSA", "kid": "no-modulus", "e": "AQAB"},
            "not an object",
            {"kty": "OKP", "crv": "Ed25519", "kid": "good", "alg": "EdDSA", "x": ED_X},
        ]}))
        .unwrap();
        let kids: Vec<_> = set.keys.iter().map(|key| key.kid.as_deref()).collect();
        assert_eq!(kids, vec![Some("good")]);
        assert!(set.holds("good"));
        assert!(!set.holds("secret"));
    }

    #[test]
    fn a_set_without_a_usable_key_or_in_the_wrong_shape_is_refused() {
        assert_eq!(
            parse(json!({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]})).unwrap_err(),
            "it holds no RSA, P-256, P-384 or Ed25519 signing key"
        );
        assert!(
            parse(json!([]))
                .unwrap_err()
                .starts_with("it is not a JSON object with a 'keys' list")
        );
        assert!(
            KeySet::parse(b"\xff")
                .unwrap_err()
                .starts_with("it is not a JSON object")
        );
        let huge = vec![b' '; MAX_JWKS_BYTES + 1];
        assert_eq!(
            KeySet::parse(&huge).unwrap_err(),
            "it is larger than 1048576 bytes"
        );
    }

    #[test]
    fn a_key_verifies_only_the_algorithms_of_its_kind_and_alg() {
        let set = parse(json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": ED_X},
            {"kty": "EC", "crv": "P-256", "kid": "ec", "alg": "ES256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
        ]}))
        .unwrap();
        let ed = &set.keys[0];
        assert!(ed.accepts(Algorithm::EdDSA, "EdDSA"));
        assert!(!ed.accepts(Algorithm::RS256, "RS256"));
        let ec = &set.keys[1];
        assert!(ec.accepts(Algorithm::ES256, "ES256"));
        assert!(!ec.accepts(Algorithm::ES384, "ES384"));
    }
}
