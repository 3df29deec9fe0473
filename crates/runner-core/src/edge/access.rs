//! Who may reach a session's port through the edge.
//!
//! A private port (`RUNNER_PREVIEW_ACCESS=private`, or a port a workload
//! token guards) opens to a request that presents one of:
//!
//! - a **grant** or a **share link** in the `telo_access` query parameter:
//!   a signed pass for one session and port, with an expiry (a link also
//!   has an id, and is live only while its session lists it);
//! - the **cookie** a grant or link was traded for (host-only, so it goes
//!   back only to the host it came from, and signed for that session and
//!   port);
//! - the session's workload token as `Authorization: Bearer`.
//!
//! Passes are HMAC-SHA256 signed with the operator's key, so any runner
//! holding the key can check one; nothing about a pass is stored except a
//! link's id on its session (which is what makes a link revocable).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The query parameter a grant or link travels in, and the cookie's name.
pub const ACCESS_PARAM: &str = "telo_access";
/// How long the cookie a grant is traded for lasts (a link's cookie ends
/// with the link).
pub const COOKIE_TTL: Duration = Duration::from_secs(12 * 3600);
/// The shortest signing key the runner accepts.
pub const MIN_KEY_BYTES: usize = 32;

/// Whether session ports ask for access (`RUNNER_PREVIEW_ACCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreviewAccess {
    /// Open, except a port a workload token guards.
    #[default]
    Public,
    /// Every port asks for a grant, link, cookie or workload token.
    Private,
}

impl PreviewAccess {
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "public" => Some(Self::Public),
            "private" => Some(Self::Private),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Private => "private",
        }
    }
}

/// What a pass is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassKind {
    /// Put on the URLs the runner reports to the session's owner.
    Grant,
    /// A share link, live while its session lists `id`.
    Link { id: String },
    /// What the edge set as a cookie; `link` when it came from a link (and
    /// then ends when the link is revoked).
    Cookie { link: Option<String> },
}

/// A signed permission to reach one port of one session until `expires_at`
/// (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    pub kind: PassKind,
    pub session_id: String,
    pub port: u16,
    pub expires_at: u64,
}

impl Pass {
    /// Whether this pass is for `session_id`'s `port` and unexpired at `now`.
    pub fn opens(&self, session_id: &str, port: u16, now: u64) -> bool {
        self.session_id == session_id && self.port == port && now < self.expires_at
    }

    /// The link this pass depends on, if any.
    pub fn link_id(&self) -> Option<&str> {
        match &self.kind {
            PassKind::Link { id } => Some(id),
            PassKind::Cookie { link } => link.as_deref(),
            PassKind::Grant => None,
        }
    }

    /// The pass's text before signing: fields joined by `|`, none of which
    /// can hold one (session ids and link ids are DNS-label characters).
    fn payload(&self) -> String {
        let (kind, link) = match &self.kind {
            PassKind::Grant => ("g", ""),
            PassKind::Link { id } => ("l", id.as_str()),
            PassKind::Cookie { link } => ("c", link.as_deref().unwrap_or("")),
        };
        format!(
            "v1|{kind}|{link}|{}|{}|{}",
            self.session_id, self.port, self.expires_at
        )
    }

    fn from_payload(payload: &str) -> Option<Self> {
        let mut fields = payload.split('|');
        let (version, kind, link, session_id, port, expires_at) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        if version != "v1" || fields.next().is_some() || session_id.is_empty() {
            return None;
        }
        let kind = match (kind, link) {
            ("g", "") => PassKind::Grant,
            ("l", id) if !id.is_empty() => PassKind::Link { id: id.to_owned() },
            ("c", "") => PassKind::Cookie { link: None },
            ("c", id) => PassKind::Cookie {
                link: Some(id.to_owned()),
            },
            _ => return None,
        };
        Some(Self {
            kind,
            session_id: session_id.to_owned(),
            port: port.parse().ok()?,
            expires_at: expires_at.parse().ok()?,
        })
    }
}

/// Signs and checks passes with the operator's key.
#[derive(Clone, PartialEq, Eq)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

impl Signer {
    /// A signer with `key` (at least [`MIN_KEY_BYTES`]; checked by the
    /// loader).
    pub fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    /// A signer with a random key of this process's own.
    pub fn generated() -> Self {
        Self::new(rand::random::<[u8; 32]>().to_vec())
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length; the error is for fixed-key MACs.
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).expect("HMAC takes any key length")
    }

    /// `<payload>.<signature>`, both base64url.
    pub fn sign(&self, pass: &Pass) -> String {
        let payload = pass.payload();
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    /// The pass `token` carries when this key signed it (compared in
    /// constant time); whether it is still valid is the caller's check.
    pub fn verify(&self, token: &str) -> Option<Pass> {
        // A pass is short; a longer value is not worth decoding.
        if token.len() > 512 {
            return None;
        }
        let (payload, signature) = token.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&signature).ok()?;
        Pass::from_payload(std::str::from_utf8(&payload).ok()?)
    }
}

/// How the edge decides access: the mode, the key, and how long the grants
/// on reported URLs last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessPolicy {
    pub access: PreviewAccess,
    pub signer: Signer,
    /// Whether the key was generated for this process (not the operator's).
    pub generated_key: bool,
    pub grant_ttl: Duration,
}

impl AccessPolicy {
    /// A public edge with a generated key (what tests and `Edge::new`'s
    /// callers without settings get).
    pub fn public() -> Self {
        Self {
            access: PreviewAccess::Public,
            signer: Signer::generated(),
            generated_key: true,
            grant_ttl: Duration::from_secs(12 * 3600),
        }
    }

    /// A grant for `session_id`'s `port`, valid from `now` (unix seconds)
    /// for the grant lifetime.
    pub fn grant(&self, session_id: &str, port: u16, now: u64) -> String {
        self.signer.sign(&Pass {
            kind: PassKind::Grant,
            session_id: session_id.to_owned(),
            port,
            expires_at: now.saturating_add(self.grant_ttl.as_secs()),
        })
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// `url` with `telo_access=<token>` as its query (`url` has none).
pub fn with_access(url: &str, token: &str) -> String {
    format!("{url}/?{ACCESS_PARAM}={token}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer::new(vec![7; 32])
    }

    fn pass(kind: PassKind) -> Pass {
        Pass {
            kind,
            session_id: "abc123".into(),
            port: 8080,
            expires_at: 2_000,
        }
    }

    #[test]
    fn every_kind_of_pass_survives_signing() {
        for kind in [
            PassKind::Grant,
            PassKind::Link { id: "l1".into() },
            PassKind::Cookie { link: None },
            PassKind::Cookie {
                link: Some("l1".into()),
            },
        ] {
            let pass = pass(kind);
            assert_eq!(signer().verify(&signer().sign(&pass)), Some(pass));
        }
    }

    #[test]
    fn a_pass_opens_only_its_session_and_port_until_it_expires() {
        let pass = pass(PassKind::Grant);
        assert!(pass.opens("abc123", 8080, 1_999));
        assert!(!pass.opens("abc123", 8080, 2_000));
        assert!(!pass.opens("abc123", 8081, 1_000));
        assert!(!pass.opens("abc124", 8080, 1_000));
    }

    #[test]
    fn another_key_a_changed_byte_or_garbage_is_refused() {
        let token = signer().sign(&pass(PassKind::Grant));
        assert!(Signer::new(vec![8; 32]).verify(&token).is_none());
        let (payload, signature) = token.split_once('.').expect("two parts");
        // The payload of another session under the first one's signature.
        let forged = URL_SAFE_NO_PAD.encode("v1|g||abc124|8080|2000");
        assert!(signer().verify(&format!("{forged}.{signature}")).is_none());
        assert!(signer().verify(payload).is_none());
        for garbage in ["", ".", "a.b", "..", &"x".repeat(600)] {
            assert!(signer().verify(garbage).is_none(), "{garbage}");
        }
    }

    #[test]
    fn malformed_payloads_are_no_pass() {
        for payload in [
            "v2|g||abc|8080|1",
            "v1|g|l1|abc|8080|1",
            "v1|l||abc|8080|1",
            "v1|x||abc|8080|1",
            "v1|g||abc|80800|1",
            "v1|g|||8080|1",
            "v1|g||abc|8080|1|extra",
            "v1|g||abc|8080",
        ] {
            assert_eq!(Pass::from_payload(payload), None, "{payload}");
        }
    }

    #[test]
    fn modes_parse_by_name() {
        assert_eq!(
            PreviewAccess::parse("private"),
            Some(PreviewAccess::Private)
        );
        assert_eq!(PreviewAccess::parse("public"), Some(PreviewAccess::Public));
        assert_eq!(PreviewAccess::parse("Private"), None);
    }
}
