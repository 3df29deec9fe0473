//! The resource catalog: every kind kube-sim serves, with what discovery,
//! validation and the store need to know about it.

use crate::errors::GroupResource;

/// How `metadata.name` is validated for a kind (the apiserver's per-kind
/// `ValidateNameFunc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (pods, configmaps, most kinds).
    Dns1123Subdomain,
    /// RFC 1123 label (namespaces).
    Dns1123Label,
    /// RFC 1035 label: must start with a letter (services).
    Dns1035Label,
    /// Any path segment: not `.`/`..`, no `/` or `%` (RBAC kinds).
    PathSegment,
}

/// Which field selectors a kind supports besides `metadata.name` and
/// `metadata.namespace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldSet {
    Meta,
    Pod,
    Event,
    Namespace,
    Secret,
    Node,
}

#[derive(Debug)]
pub struct ResourceInfo {
    pub group: &'static str,
    /// Served versions; the first is the preferred (and storage) version.
    pub versions: &'static [&'static str],
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources besides the object itself (`status`, `log`, `attach`…).
    pub subresources: &'static [&'static str],
    /// `metadata.generation` is set and bumped on spec changes.
    pub tracks_generation: bool,
    pub name_rule: NameRule,
    pub fields: FieldSet,
    /// Only served with `--gateway-api`.
    pub gateway_api: bool,
}

pub const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl ResourceInfo {
    pub fn group_resource(&self) -> GroupResource<'static> {
        GroupResource {
            group: self.group,
            resource: self.plural,
        }
    }

    pub fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    pub fn storage_version(&self) -> &'static str {
        self.versions[0]
    }

    /// Built-in kinds omit `kind`/`apiVersion` on list items; custom
    /// resources (Gateway API) keep them.
    pub fn is_custom(&self) -> bool {
        self.gateway_api
    }
}

macro_rules! resource {
    ($group:expr, $versions:expr, $kind:expr, $plural:expr, $singular:expr, namespaced: $ns:expr,
     short: $short:expr, subresources: $subs:expr, generation: $gen:expr, names: $rule:expr,
     fields: $fields:expr, gateway: $gw:expr, categories: $cats:expr) => {
        ResourceInfo {
            group: $group,
            versions: $versions,
            kind: $kind,
            plural: $plural,
            singular: $singular,
            namespaced: $ns,
            short_names: $short,
            categories: $cats,
            subresources: $subs,
            tracks_generation: $gen,
            name_rule: $rule,
            fields: $fields,
            gateway_api: $gw,
        }
    };
}

const ALL: &[&str] = &["all"];
const NONE: &[&str] = &[];

pub static RESOURCES: &[ResourceInfo] = &[
    resource!("", &["v1"], "Namespace", "namespaces", "namespace", namespaced: false,
        short: &["ns"], subresources: &["status", "finalize"], generation: false,
        names: NameRule::Dns1123Label, fields: FieldSet::Namespace, gateway: false, categories: NONE),
    resource!("", &["v1"], "Pod", "pods", "pod", namespaced: true,
        short: &["po"], subresources: &["status", "log", "attach", "binding"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Pod, gateway: false, categories: ALL),
    resource!("", &["v1"], "Service", "services", "service", namespaced: true,
        short: &["svc"], subresources: &["status"], generation: false,
        names: NameRule::Dns1035Label, fields: FieldSet::Meta, gateway: false, categories: ALL),
    resource!("", &["v1"], "ConfigMap", "configmaps", "configmap", namespaced: true,
        short: &["cm"], subresources: &[], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("", &["v1"], "Event", "events", "event", namespaced: true,
        short: &["ev"], subresources: &[], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Event, gateway: false, categories: NONE),
    resource!("", &["v1"], "ResourceQuota", "resourcequotas", "resourcequota", namespaced: true,
        short: &["quota"], subresources: &["status"], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("", &["v1"], "ServiceAccount", "serviceaccounts", "serviceaccount", namespaced: true,
        short: &["sa"], subresources: &[], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("", &["v1"], "Secret", "secrets", "secret", namespaced: true,
        short: &[], subresources: &[], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Secret, gateway: false, categories: NONE),
    resource!("", &["v1"], "Node", "nodes", "node", namespaced: false,
        short: &["no"], subresources: &["status"], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Node, gateway: false, categories: NONE),
    resource!("apps", &["v1"], "Deployment", "deployments", "deployment", namespaced: true,
        short: &["deploy"], subresources: &["status"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: ALL),
    resource!("apps", &["v1"], "ReplicaSet", "replicasets", "replicaset", namespaced: true,
        short: &["rs"], subresources: &["status"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: ALL),
    resource!("networking.k8s.io", &["v1"], "Ingress", "ingresses", "ingress", namespaced: true,
        short: &["ing"], subresources: &["status"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("networking.k8s.io", &["v1"], "IngressClass", "ingressclasses", "ingressclass", namespaced: false,
        short: &[], subresources: &[], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("networking.k8s.io", &["v1"], "NetworkPolicy", "networkpolicies", "networkpolicy", namespaced: true,
        short: &["netpol"], subresources: &[], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("rbac.authorization.k8s.io", &["v1"], "Role", "roles", "role", namespaced: true,
        short: &[], subresources: &[], generation: false,
        names: NameRule::PathSegment, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("rbac.authorization.k8s.io", &["v1"], "RoleBinding", "rolebindings", "rolebinding", namespaced: true,
        short: &[], subresources: &[], generation: false,
        names: NameRule::PathSegment, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("rbac.authorization.k8s.io", &["v1"], "ClusterRole", "clusterroles", "clusterrole", namespaced: false,
        short: &[], subresources: &[], generation: false,
        names: NameRule::PathSegment, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("rbac.authorization.k8s.io", &["v1"], "ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding", namespaced: false,
        short: &[], subresources: &[], generation: false,
        names: NameRule::PathSegment, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("coordination.k8s.io", &["v1"], "Lease", "leases", "lease", namespaced: true,
        short: &[], subresources: &[], generation: false,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("policy", &["v1"], "PodDisruptionBudget", "poddisruptionbudgets", "poddisruptionbudget", namespaced: true,
        short: &["pdb"], subresources: &["status"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: false, categories: NONE),
    resource!("gateway.networking.k8s.io", &["v1", "v1beta1"], "GatewayClass", "gatewayclasses", "gatewayclass", namespaced: false,
        short: &["gc"], subresources: &["status"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: true, categories: &["gateway-api"]),
    resource!("gateway.networking.k8s.io", &["v1", "v1beta1"], "Gateway", "gateways", "gateway", namespaced: true,
        short: &["gtw"], subresources: &["status"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: true, categories: &["gateway-api"]),
    resource!("gateway.networking.k8s.io", &["v1", "v1beta1"], "HTTPRoute", "httproutes", "httproute", namespaced: true,
        short: &[], subresources: &["status"], generation: true,
        names: NameRule::Dns1123Subdomain, fields: FieldSet::Meta, gateway: true, categories: &["gateway-api"]),
];

/// Index of a resource in [`RESOURCES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId(pub usize);

impl ResourceId {
    pub fn info(self) -> &'static ResourceInfo {
        &RESOURCES[self.0]
    }
}

pub fn find(group: &str, plural: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.plural == plural)
        .map(ResourceId)
}

pub fn find_kind(api_version: &str, kind: &str) -> Option<ResourceId> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.kind == kind && r.versions.contains(&version))
        .map(ResourceId)
}

/// Well-known ids, looked up once.
pub fn id(plural: &str) -> ResourceId {
    let group = match plural {
        "deployments" | "replicasets" => "apps",
        "ingresses" | "ingressclasses" | "networkpolicies" => "networking.k8s.io",
        "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings" => {
            "rbac.authorization.k8s.io"
        }
        "gateways" | "httproutes" | "gatewayclasses" => "gateway.networking.k8s.io",
        "leases" => "coordination.k8s.io",
        "poddisruptionbudgets" => "policy",
        _ => "",
    };
    find(group, plural).unwrap_or(ResourceId(usize::MAX))
}

pub fn pods() -> ResourceId {
    id("pods")
}

pub fn all() -> impl Iterator<Item = ResourceId> {
    (0..RESOURCES.len()).map(ResourceId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_well_known_plural_resolves() {
        for r in RESOURCES {
            assert_eq!(id(r.plural).info().kind, r.kind);
        }
    }

    #[test]
    fn kinds_resolve_by_api_version() {
        assert_eq!(find_kind("v1", "Pod"), Some(pods()));
        assert_eq!(
            find_kind("gateway.networking.k8s.io/v1beta1", "HTTPRoute"),
            Some(id("httproutes"))
        );
        assert_eq!(find_kind("v2", "Pod"), None);
    }
}
