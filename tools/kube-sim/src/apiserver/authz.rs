//! Configured RBAC denials: requests matching a rule get the apiserver's
//! authorization 403, message and all, as a real cluster answers a
//! service account that lacks a permission.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::errors::{ApiError, GroupResource};

/// The identity named in denial messages unless a rule names another.
pub const DEFAULT_USER: &str = "system:serviceaccount:telo-runner:telo-k8s-runner";

/// Deny `verb` on `resource` (optionally one namespace).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    /// `create`, `get`, `list`, `watch`, `update`, `patch`, `delete`; `*` for all.
    pub verb: String,
    /// `pods`, `pods/attach`, `ingressclasses`, …; `*` for all.
    pub resource: String,
    #[serde(default)]
    pub namespace: Option<String>,
    /// The user named in the message (default: the runner's service account).
    #[serde(default)]
    pub user: Option<String>,
}

/// What an API request asks to do, for authorization.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

#[derive(Default)]
pub struct Authorizer {
    denials: Mutex<Vec<Denial>>,
}

impl Authorizer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Denial>> {
        self.denials.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn deny(&self, denial: Denial) {
        self.lock().push(denial);
    }

    pub fn clear(&self) {
        self.lock().clear();
    }

    pub fn denials(&self) -> Vec<Denial> {
        self.lock().clone()
    }

    pub fn authorize(&self, a: &Attributes<'_>) -> Result<(), ApiError> {
        let full_resource = match a.subresource {
            Some(sub) => format!("{}/{sub}", a.resource),
            None => a.resource.to_string(),
        };
        let denials = self.lock();
        let hit = denials.iter().find(|d| {
            (d.verb == "*" || d.verb == a.verb)
                && (d.resource == "*" || d.resource == full_resource)
                && d.namespace
                    .as_deref()
                    .is_none_or(|ns| Some(ns) == a.namespace)
        });
        let Some(d) = hit else { return Ok(()) };
        let user = d.user.as_deref().unwrap_or(DEFAULT_USER);
        Err(forbidden(user, a, &full_resource))
    }
}

/// The authorization filter's 403 (`forbiddenMessage`).
pub fn forbidden(user: &str, a: &Attributes<'_>, full_resource: &str) -> ApiError {
    let scope = match a.namespace {
        Some(ns) if !ns.is_empty() => format!("in the namespace {ns:?}"),
        _ => "at the cluster scope".to_string(),
    };
    let why = format!(
        "User {user:?} cannot {} resource {full_resource:?} in API group {:?} {scope}",
        a.verb, a.group
    );
    ApiError::forbidden(
        GroupResource {
            group: a.group,
            resource: a.resource,
        },
        a.name.unwrap_or(""),
        &why,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_create_reads_like_the_apiserver() {
        let authz = Authorizer::default();
        authz.deny(Denial {
            verb: "create".into(),
            resource: "pods".into(),
            namespace: None,
            user: None,
        });
        let err = authz
            .authorize(&Attributes {
                verb: "create",
                group: "",
                resource: "pods",
                subresource: None,
                namespace: Some("telo-sessions"),
                name: None,
            })
            .unwrap_err();
        assert_eq!(err.code, 403);
        assert_eq!(
            err.message,
            "pods is forbidden: User \"system:serviceaccount:telo-runner:telo-k8s-runner\" cannot create resource \"pods\" in API group \"\" in the namespace \"telo-sessions\""
        );
    }

    #[test]
    fn cluster_scoped_denials_say_so() {
        let err = forbidden(
            "u",
            &Attributes {
                verb: "list",
                group: "networking.k8s.io",
                resource: "ingressclasses",
                subresource: None,
                namespace: None,
                name: None,
            },
            "ingressclasses",
        );
        assert_eq!(
            err.message,
            "ingressclasses.networking.k8s.io is forbidden: User \"u\" cannot list resource \"ingressclasses\" in API group \"networking.k8s.io\" at the cluster scope"
        );
    }
}
