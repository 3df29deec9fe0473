//! Server-side printing: `meta.k8s.io/v1` Table answers for clients that
//! ask for them (`kubectl get`), with the columns the apiserver prints.

use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::kinds::ResourceInfo;
use crate::meta;

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// `duration.HumanDuration`, as the AGE column shows it.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    format!("{}y", hours / 24 / 365)
}

fn age(obj: &Value, field: &str) -> String {
    match meta::path_str(obj, field).and_then(meta::parse_timestamp) {
        Some(t) => human_duration((OffsetDateTime::now_utc() - t).whole_seconds()),
        None => "<unknown>".into(),
    }
}

fn column(name: &str, ty: &str, format: &str, priority: i64) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": priority})
}

fn columns(info: &ResourceInfo) -> Vec<Value> {
    match info.kind {
        "Pod" => vec![
            column("Name", "string", "name", 0),
            column("Ready", "string", "", 0),
            column("Status", "string", "", 0),
            column("Restarts", "string", "", 0),
            column("Age", "string", "", 0),
            column("IP", "string", "", 1),
            column("Node", "string", "", 1),
            column("Nominated Node", "string", "", 1),
            column("Readiness Gates", "string", "", 1),
        ],
        "Service" => vec![
            column("Name", "string", "name", 0),
            column("Type", "string", "", 0),
            column("Cluster-IP", "string", "", 0),
            column("External-IP", "string", "", 0),
            column("Port(s)", "string", "", 0),
            column("Age", "string", "", 0),
            column("Selector", "string", "", 1),
        ],
        "Namespace" => vec![
            column("Name", "string", "name", 0),
            column("Status", "string", "", 0),
            column("Age", "string", "", 0),
        ],
        "ConfigMap" => vec![
            column("Name", "string", "name", 0),
            column("Data", "integer", "", 0),
            column("Age", "string", "", 0),
        ],
        "Lease" => vec![
            column("Name", "string", "name", 0),
            column("Holder", "string", "", 0),
            column("Age", "string", "", 0),
        ],
        "Event" => vec![
            column("Last Seen", "string", "", 0),
            column("Type", "string", "", 0),
            column("Reason", "string", "", 0),
            column("Object", "string", "", 0),
            column("Message", "string", "", 0),
        ],
        _ => vec![
            column("Name", "string", "name", 0),
            column("Age", "string", "", 0),
        ],
    }
}

/// The STATUS column of `kubectl get pods` (`printPod`).
pub fn pod_status_reason(pod: &Value) -> String {
    let mut reason = meta::path_str(pod, "status.reason")
        .or_else(|| meta::path_str(pod, "status.phase"))
        .unwrap_or("")
        .to_string();
    let init_specs = meta::path(pod, "spec.initContainers")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or(0);
    let mut initializing = false;
    if let Some(inits) = meta::path(pod, "status.initContainerStatuses").and_then(Value::as_array) {
        for (i, c) in inits.iter().enumerate() {
            let state = c.get("state").cloned().unwrap_or(Value::Null);
            if let Some(t) = state.get("terminated") {
                if t.get("exitCode").and_then(Value::as_i64) == Some(0) {
                    continue;
                }
                reason = match t.get("reason").and_then(Value::as_str) {
                    Some(r) if !r.is_empty() => format!("Init:{r}"),
                    _ => format!(
                        "Init:ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    ),
                };
            } else if let Some(w) = state
                .get("waiting")
                .and_then(|w| w.get("reason"))
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty() && *r != "PodInitializing")
            {
                reason = format!("Init:{w}");
            } else {
                reason = format!("Init:{i}/{init_specs}");
            }
            initializing = true;
            break;
        }
    }
    if !initializing {
        let mut has_running = false;
        if let Some(cs) = meta::path(pod, "status.containerStatuses").and_then(Value::as_array) {
            for c in cs.iter().rev() {
                let state = c.get("state").cloned().unwrap_or(Value::Null);
                if let Some(w) = state
                    .get("waiting")
                    .and_then(|w| w.get("reason"))
                    .and_then(Value::as_str)
                    .filter(|r| !r.is_empty())
                {
                    reason = w.to_string();
                } else if let Some(t) = state.get("terminated") {
                    reason = match t.get("reason").and_then(Value::as_str) {
                        Some(r) if !r.is_empty() => r.to_string(),
                        _ => format!(
                            "ExitCode:{}",
                            t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                        ),
                    };
                } else if state.get("running").is_some()
                    && c.get("ready").and_then(Value::as_bool) == Some(true)
                {
                    has_running = true;
                }
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    if meta::deletion_timestamp(pod).is_some() {
        reason = "Terminating".into();
    }
    reason
}

fn cells(info: &ResourceInfo, obj: &Value) -> Vec<Value> {
    let name = meta::name(obj);
    let created = age(obj, "metadata.creationTimestamp");
    match info.kind {
        "Pod" => {
            let total = meta::path(obj, "spec.containers")
                .and_then(Value::as_array)
                .map(Vec::len)
                .unwrap_or(0);
            let statuses = meta::path(obj, "status.containerStatuses")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let ready = statuses
                .iter()
                .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
                .count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
                .sum();
            vec![
                json!(name),
                json!(format!("{ready}/{total}")),
                json!(pod_status_reason(obj)),
                json!(restarts.to_string()),
                json!(created),
                json!(meta::path_str(obj, "status.podIP").unwrap_or("<none>")),
                json!(meta::path_str(obj, "spec.nodeName").unwrap_or("<none>")),
                json!("<none>"),
                json!("<none>"),
            ]
        }
        "Service" => {
            let ports: Vec<String> = meta::path(obj, "spec.ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p.get("port").and_then(Value::as_i64).unwrap_or(0),
                        p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                    )
                })
                .collect();
            vec![
                json!(name),
                json!(meta::path_str(obj, "spec.type").unwrap_or("ClusterIP")),
                json!(meta::path_str(obj, "spec.clusterIP").unwrap_or("<none>")),
                json!("<none>"),
                json!(if ports.is_empty() {
                    "<none>".to_string()
                } else {
                    ports.join(",")
                }),
                json!(created),
                json!("<none>"),
            ]
        }
        "Namespace" => vec![
            json!(name),
            json!(meta::path_str(obj, "status.phase").unwrap_or("")),
            json!(created),
        ],
        "ConfigMap" => vec![
            json!(name),
            json!(
                obj.get("data")
                    .and_then(Value::as_object)
                    .map(|d| d.len())
                    .unwrap_or(0)
                    + obj
                        .get("binaryData")
                        .and_then(Value::as_object)
                        .map(|d| d.len())
                        .unwrap_or(0)
            ),
            json!(created),
        ],
        "Lease" => vec![
            json!(name),
            json!(meta::path_str(obj, "spec.holderIdentity").unwrap_or("")),
            json!(created),
        ],
        "Event" => vec![
            json!(age(obj, "lastTimestamp")),
            json!(obj.get("type").and_then(Value::as_str).unwrap_or("")),
            json!(obj.get("reason").and_then(Value::as_str).unwrap_or("")),
            json!(format!(
                "{}/{}",
                meta::path_str(obj, "involvedObject.kind")
                    .unwrap_or("")
                    .to_lowercase(),
                meta::path_str(obj, "involvedObject.name").unwrap_or("")
            )),
            json!(obj.get("message").and_then(Value::as_str).unwrap_or("")),
        ],
        _ => vec![json!(name), json!(created)],
    }
}

fn row(info: &ResourceInfo, obj: &Value, include_object: &str) -> Value {
    let object = match include_object {
        "Object" => obj.clone(),
        "None" => Value::Null,
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
        }),
    };
    json!({"cells": cells(info, obj), "object": object})
}

/// A Table of `objects`.
pub fn table<'a>(
    info: &ResourceInfo,
    objects: impl Iterator<Item = &'a Value>,
    resource_version: u64,
    include_object: &str,
) -> Value {
    let rows: Vec<Value> = objects.map(|o| row(info, o, include_object)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": columns(info),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(50 * 3600), "2d2h");
    }

    #[test]
    fn pod_status_shows_init_progress_and_pull_errors() {
        let pod = json!({"spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}]},
            "status": {"phase": "Pending",
              "initContainerStatuses": [{"name": "i", "state": {"running": {}}}],
              "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "PodInitializing"}}}]}});
        assert_eq!(pod_status_reason(&pod), "Init:0/1");
        let pod = json!({"spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending",
              "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "ErrImagePull"}}}]}});
        assert_eq!(pod_status_reason(&pod), "ErrImagePull");
    }

    #[test]
    fn accept_headers_select_tables() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
