//! Discovery documents (`/api`, `/apis`, group versions, `/version`) as
//! kube-rs, kubectl and Helm read them.

use serde_json::{Value, json};

use crate::kinds::{RESOURCES, ResourceInfo, VERBS};

pub const SERVER_VERSION: &str = "v1.33.0";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": SERVER_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": format!("linux/{}", go_arch()),
    })
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

pub fn served(info: &ResourceInfo, gateway_api: bool) -> bool {
    !info.gateway_api || gateway_api
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn groups(gateway_api: bool) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for r in RESOURCES {
        if r.group.is_empty() || !served(r, gateway_api) {
            continue;
        }
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) => {
                for v in r.versions {
                    if !versions.contains(v) {
                        versions.push(v);
                    }
                }
            }
            None => out.push((r.group, r.versions.to_vec())),
        }
    }
    out
}

fn group_json(name: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": {"groupVersion": format!("{name}/{}", versions[0]), "version": versions[0]},
    })
}

/// `/apis`.
pub fn group_list(gateway_api: bool) -> Value {
    let groups: Vec<Value> = groups(gateway_api)
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`.
pub fn group(name: &str, gateway_api: bool) -> Option<Value> {
    groups(gateway_api)
        .iter()
        .find(|(g, _)| *g == name)
        .map(|(g, vs)| {
            let mut v = group_json(g, vs);
            if let Some(o) = v.as_object_mut() {
                o.insert("kind".into(), json!("APIGroup"));
                o.insert("apiVersion".into(), json!("v1"));
            }
            v
        })
}

fn subresource_entry(r: &ResourceInfo, sub: &str) -> Value {
    let (kind, verbs): (&str, Vec<&str>) = match sub {
        "status" => (r.kind, vec!["get", "patch", "update"]),
        "log" => (r.kind, vec!["get"]),
        "attach" => ("PodAttachOptions", vec!["create", "get"]),
        "binding" => ("Binding", vec!["create"]),
        "finalize" => (r.kind, vec!["update"]),
        _ => (r.kind, vec!["get"]),
    };
    json!({"name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
           "kind": kind, "verbs": verbs})
}

/// `/api/v1` and `/apis/<group>/<version>`.
pub fn resource_list(group: &str, version: &str, gateway_api: bool) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES {
        if r.group != group || !r.versions.contains(&version) || !served(r, gateway_api) {
            continue;
        }
        let verbs: Vec<&str> = if r.kind == "Namespace" {
            VERBS
                .iter()
                .copied()
                .filter(|v| *v != "deletecollection")
                .collect()
        } else {
            VERBS.to_vec()
        };
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs,
        });
        if let Some(o) = entry.as_object_mut() {
            if !r.short_names.is_empty() {
                o.insert("shortNames".into(), json!(r.short_names));
            }
            if !r.categories.is_empty() {
                o.insert("categories".into(), json!(r.categories));
            }
        }
        resources.push(entry);
        for sub in r.subresources {
            resources.push(subresource_entry(r, sub));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_api_is_only_discovered_when_enabled() {
        let without = group_list(false).to_string();
        assert!(!without.contains("gateway.networking.k8s.io"));
        let with = group_list(true);
        let gw = with["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|g| g["name"] == "gateway.networking.k8s.io"))
            .cloned()
            .expect("served");
        assert_eq!(gw["preferredVersion"]["version"], "v1");
        assert_eq!(gw["versions"][1]["version"], "v1beta1");
        assert!(resource_list("gateway.networking.k8s.io", "v1", false).is_none());
    }

    #[test]
    fn leases_are_served_in_coordination_v1() {
        let groups = group_list(false);
        assert!(
            groups["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|g| g["name"] == "coordination.k8s.io"
                    && g["preferredVersion"]["groupVersion"] == "coordination.k8s.io/v1")
        );
        assert_eq!(
            group("coordination.k8s.io", false).expect("group")["kind"],
            "APIGroup"
        );
        let list = resource_list("coordination.k8s.io", "v1", false).expect("served");
        assert_eq!(list["groupVersion"], "coordination.k8s.io/v1");
        assert_eq!(
            list["resources"],
            json!([{"name": "leases", "singularName": "lease", "namespaced": true, "kind": "Lease",
                    "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}])
        );
    }

    #[test]
    fn pod_disruption_budgets_are_served_in_policy_v1() {
        let list = resource_list("policy", "v1", false).expect("served");
        assert_eq!(list["groupVersion"], "policy/v1");
        assert_eq!(
            list["resources"],
            json!([{"name": "poddisruptionbudgets", "singularName": "poddisruptionbudget",
                    "namespaced": true, "kind": "PodDisruptionBudget", "shortNames": ["pdb"],
                    "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]},
                   {"name": "poddisruptionbudgets/status", "singularName": "", "namespaced": true,
                    "kind": "PodDisruptionBudget", "verbs": ["get", "patch", "update"]}])
        );
    }

    #[test]
    fn core_v1_lists_pod_subresources() {
        let list = resource_list("", "v1", false).expect("core");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        for n in [
            "pods",
            "pods/status",
            "pods/log",
            "pods/attach",
            "services",
            "events",
            "resourcequotas",
        ] {
            assert!(names.contains(&n), "{n}");
        }
    }
}
