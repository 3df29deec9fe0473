//! Who a request comes from, and whose a session is.
//!
//! With authentication on, every `/v1` request that passes the gate carries
//! a [`Principal`]: the static token it presented, the OIDC subject its JWT
//! names, or — in anonymous mode — its client address. A session created by
//! a principal records an [`Owner`] (kept on the session's objects, so it
//! survives a restart and adoption); another principal is answered about it
//! exactly as about an unknown id. Without authentication there are no
//! principals and every client sees every session, as before.

use std::net::IpAddr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// What a verified bearer token that is not a static one names (an OIDC
/// JWT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedIdentity {
    pub subject: String,
    pub tenant: String,
    pub groups: Vec<String>,
}

/// Verifies bearer tokens of a form the static token file does not hold
/// (JWTs of the configured OIDC issuer).
#[async_trait]
pub trait BearerVerifier: Send + Sync {
    /// Whether `token` is of this verifier's form (a static token that is
    /// not is looked up in the token file instead).
    fn recognizes(&self, token: &str) -> bool;

    /// Who `token` names, or one client-safe sentence saying why it was
    /// refused.
    async fn verify(&self, token: &str) -> Result<VerifiedIdentity, String>;
}

/// The principal a session belongs to, as its records keep it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// The principal's subject (`token:<name>`, `oidc:<sub>`,
    /// `address:<ip>`).
    pub subject: String,
    /// The tenant its quotas are counted against.
    pub tenant: String,
}

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalSource {
    /// A token of `RUNNER_AUTH_TOKENS_FILE`.
    StaticToken,
    /// A JWT the configured OIDC issuer signed.
    Oidc,
    /// Anonymous mode: the client address.
    Anonymous,
}

/// The identity behind an authenticated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub subject: String,
    pub tenant: String,
    pub groups: Vec<String>,
    /// Sees and stops every session of the installation.
    pub admin: bool,
    pub source: PrincipalSource,
}

impl Principal {
    /// The principal of an anonymous client: its address, in the
    /// `anonymous` tier.
    pub fn anonymous(address: IpAddr) -> Self {
        let subject = format!("address:{}", address.to_canonical());
        Self {
            tenant: subject.clone(),
            subject,
            groups: Vec::new(),
            admin: false,
            source: PrincipalSource::Anonymous,
        }
    }

    /// What a session this principal creates records.
    pub fn owner(&self) -> Owner {
        Owner {
            subject: self.subject.clone(),
            tenant: self.tenant.clone(),
        }
    }

    /// Whether a session owned by `owner` exists for this principal: its
    /// own, or any when it is an admin. A session without an owner (created
    /// while authentication was off) is an admin's only.
    pub fn may_see(&self, owner: Option<&Owner>) -> bool {
        self.admin || owner.is_some_and(|owner| owner.subject == self.subject)
    }

    /// Whether this principal acts on a session that is not its own (an
    /// admin action, which the audit log names as such).
    pub fn acts_for_another(&self, owner: Option<&Owner>) -> bool {
        owner.is_none_or(|owner| owner.subject != self.subject)
    }
}

/// Who is asking, as the session routes see it: nobody in particular when
/// authentication is off (every session is visible), else a principal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Viewer {
    #[default]
    Everyone,
    Principal(Principal),
}

impl Viewer {
    pub fn principal(&self) -> Option<&Principal> {
        match self {
            Viewer::Everyone => None,
            Viewer::Principal(principal) => Some(principal),
        }
    }

    pub fn may_see(&self, owner: Option<&Owner>) -> bool {
        match self {
            Viewer::Everyone => true,
            Viewer::Principal(principal) => principal.may_see(owner),
        }
    }

    /// The owner a session this viewer creates records (`None` without
    /// authentication).
    pub fn owner(&self) -> Option<Owner> {
        self.principal().map(Principal::owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(subject: &str, admin: bool) -> Principal {
        Principal {
            subject: subject.into(),
            tenant: "acme".into(),
            groups: Vec::new(),
            admin,
            source: PrincipalSource::Oidc,
        }
    }

    fn owned_by(subject: &str) -> Owner {
        Owner {
            subject: subject.into(),
            tenant: "acme".into(),
        }
    }

    #[test]
    fn a_principal_sees_its_own_sessions_and_an_admin_sees_all() {
        let alice = principal("oidc:alice", false);
        let admin = principal("oidc:root", true);
        assert!(alice.may_see(Some(&owned_by("oidc:alice"))));
        assert!(!alice.may_see(Some(&owned_by("oidc:bob"))));
        assert!(!alice.may_see(None));
        assert!(admin.may_see(Some(&owned_by("oidc:bob"))));
        assert!(admin.may_see(None));
        assert!(Viewer::Everyone.may_see(None));
        assert!(Viewer::Everyone.may_see(Some(&owned_by("oidc:bob"))));
    }

    #[test]
    fn the_same_tenant_does_not_share_sessions() {
        let alice = principal("oidc:alice", false);
        let colleague = owned_by("oidc:carol");
        assert_eq!(colleague.tenant, alice.tenant);
        assert!(!alice.may_see(Some(&colleague)));
    }

    #[test]
    fn an_anonymous_client_is_its_canonical_address() {
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        let principal = Principal::anonymous(mapped);
        assert_eq!(principal.subject, "address:192.0.2.7");
        assert_eq!(principal.tenant, "address:192.0.2.7");
        assert!(!principal.admin);
    }
}
