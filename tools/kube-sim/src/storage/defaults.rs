//! Defaulting applied on create (the apiserver's `SetDefaults_*` functions
//! and defaulting admission plugins), and the status every new object
//! starts with.

use serde_json::{Map, Value, json};

use super::quantity::Quantity;
use crate::meta;

pub const NODE_NAME: &str = "kube-sim-node";

fn set_default(map: &mut Map<String, Value>, key: &str, value: Value) {
    if !map.contains_key(key) || map.get(key) == Some(&Value::Null) {
        map.insert(key.to_string(), value);
    }
}

/// `imagePullPolicy` default: `Always` for `:latest` or untagged images,
/// else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    match last.split_once(':') {
        None => {
            if image.contains('@') {
                "IfNotPresent"
            } else {
                "Always"
            }
        }
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn default_container(c: &mut Value) {
    let Some(c) = c.as_object_mut() else { return };
    set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(c, "terminationMessagePolicy", json!("File"));
    let image = c
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    set_default(c, "imagePullPolicy", json!(default_pull_policy(&image)));
    set_default(c, "resources", json!({}));
    if let Some(res) = c.get_mut("resources").and_then(Value::as_object_mut) {
        // Limits without requests: requests default to the limits.
        if let Some(limits) = res.get("limits").and_then(Value::as_object).cloned() {
            let requests = res
                .entry("requests")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(requests) = requests.as_object_mut() {
                for (k, v) in limits {
                    requests.entry(k).or_insert(v);
                }
            }
        }
    }
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if let Some(p) = p.as_object_mut() {
                set_default(p, "protocol", json!("TCP"));
            }
        }
    }
    if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
        for e in env {
            if let Some(field_ref) = e
                .pointer_mut("/valueFrom/fieldRef")
                .and_then(Value::as_object_mut)
            {
                set_default(field_ref, "apiVersion", json!("v1"));
            }
        }
    }
}

/// The QoS class the apiserver computes for a pod.
pub fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|g| pod.pointer(&format!("/spec/{g}")).and_then(Value::as_array))
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let limits = c.pointer("/resources/limits").and_then(Value::as_object);
        let requests = c.pointer("/resources/requests").and_then(Value::as_object);
        for res in ["cpu", "memory"] {
            let l = limits.and_then(|l| l.get(res)).and_then(Value::as_str);
            let r = requests.and_then(|r| r.get(res)).and_then(Value::as_str);
            if l.is_some() || r.is_some() {
                any = true;
            }
            match (l.and_then(Quantity::parse), r.and_then(Quantity::parse)) {
                (Some(l), Some(r)) if l.milli == r.milli => {}
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn default_pod(pod: &mut Value) {
    let spec = meta::path_mut(pod, "spec");
    if !spec.is_object() {
        *spec = json!({});
    }
    if let Some(s) = spec.as_object_mut() {
        set_default(s, "restartPolicy", json!("Always"));
        set_default(s, "terminationGracePeriodSeconds", json!(30));
        set_default(s, "dnsPolicy", json!("ClusterFirst"));
        set_default(s, "securityContext", json!({}));
        set_default(s, "schedulerName", json!("default-scheduler"));
        set_default(s, "enableServiceLinks", json!(true));
        set_default(s, "preemptionPolicy", json!("PreemptLowerPriority"));
        set_default(s, "priority", json!(0));
        let sa = s
            .get("serviceAccountName")
            .and_then(Value::as_str)
            .or_else(|| s.get("serviceAccount").and_then(Value::as_str))
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_string();
        s.insert("serviceAccountName".into(), json!(sa));
        s.insert("serviceAccount".into(), json!(sa));
        // DefaultTolerationSeconds admission.
        let tolerations = s.entry("tolerations").or_insert_with(|| json!([]));
        if let Some(list) = tolerations.as_array_mut() {
            for key in [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
            ] {
                if !list
                    .iter()
                    .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
                {
                    list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
                }
            }
        }
        for group in ["initContainers", "containers"] {
            if let Some(cs) = s.get_mut(group).and_then(Value::as_array_mut) {
                cs.iter_mut().for_each(default_container);
            }
        }
        if let Some(vols) = s.get_mut("volumes").and_then(Value::as_array_mut) {
            for v in vols {
                for src in ["configMap", "secret"] {
                    if let Some(m) = v.get_mut(src).and_then(Value::as_object_mut) {
                        set_default(m, "defaultMode", json!(420));
                    }
                }
            }
        }
    }
    let qos = qos_class(pod);
    if let Some(obj) = pod.as_object_mut() {
        obj.insert(
            "status".into(),
            json!({"phase": "Pending", "qosClass": qos}),
        );
    }
}

fn default_service(svc: &mut Value, cluster_ip: &mut dyn FnMut() -> String) {
    let spec = meta::path_mut(svc, "spec");
    if !spec.is_object() {
        *spec = json!({});
    }
    if let Some(s) = spec.as_object_mut() {
        set_default(s, "type", json!("ClusterIP"));
        set_default(s, "sessionAffinity", json!("None"));
        let ty = s
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_string();
        if ty != "ExternalName" {
            let ip = match s.get("clusterIP").and_then(Value::as_str) {
                Some(ip) if !ip.is_empty() => ip.to_string(),
                _ => cluster_ip(),
            };
            s.insert("clusterIP".into(), json!(ip));
            s.insert("clusterIPs".into(), json!([ip]));
            set_default(s, "ipFamilies", json!(["IPv4"]));
            set_default(s, "ipFamilyPolicy", json!("SingleStack"));
            set_default(s, "internalTrafficPolicy", json!("Cluster"));
        }
        if let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports {
                if let Some(p) = p.as_object_mut() {
                    set_default(p, "protocol", json!("TCP"));
                    if let Some(port) = p.get("port").cloned() {
                        set_default(p, "targetPort", port);
                    }
                }
            }
        }
    }
    if let Some(obj) = svc.as_object_mut() {
        obj.insert("status".into(), json!({"loadBalancer": {}}));
    }
}

fn default_namespace(ns: &mut Value) {
    let name = meta::name(ns).to_string();
    let labels = meta::metadata_mut(ns)
        .entry("labels")
        .or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
    if let Some(obj) = ns.as_object_mut() {
        obj.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
        obj.insert("status".into(), json!({"phase": "Active"}));
    }
}

/// `stringData` is write-only: merged into `data` (base64) on every write.
pub fn fold_secret_string_data(secret: &mut Value) {
    use base64::Engine;
    let Some(obj) = secret.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(string_data)) = obj.remove("stringData") {
        let data = obj.entry("data").or_insert_with(|| json!({}));
        if let Some(data) = data.as_object_mut() {
            for (k, v) in string_data {
                let text = v.as_str().unwrap_or("");
                data.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(text)),
                );
            }
        }
    }
    if !obj.contains_key("type") {
        obj.insert("type".into(), json!("Opaque"));
    }
}

fn default_httproute(route: &mut Value) {
    if let Some(parents) = route
        .pointer_mut("/spec/parentRefs")
        .and_then(Value::as_array_mut)
    {
        for p in parents {
            if let Some(p) = p.as_object_mut() {
                set_default(p, "group", json!("gateway.networking.k8s.io"));
                set_default(p, "kind", json!("Gateway"));
            }
        }
    }
    let spec = meta::path_mut(route, "spec");
    if let Some(s) = spec.as_object_mut() {
        set_default(
            s,
            "rules",
            json!([{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]),
        );
        if let Some(rules) = s.get_mut("rules").and_then(Value::as_array_mut) {
            for r in rules {
                if let Some(r) = r.as_object_mut() {
                    set_default(
                        r,
                        "matches",
                        json!([{"path": {"type": "PathPrefix", "value": "/"}}]),
                    );
                    if let Some(backends) = r.get_mut("backendRefs").and_then(Value::as_array_mut) {
                        for b in backends {
                            if let Some(b) = b.as_object_mut() {
                                set_default(b, "group", json!(""));
                                set_default(b, "kind", json!("Service"));
                                set_default(b, "weight", json!(1));
                            }
                        }
                    }
                }
            }
        }
    }
}

fn default_gateway(gw: &mut Value) {
    if let Some(listeners) = gw
        .pointer_mut("/spec/listeners")
        .and_then(Value::as_array_mut)
    {
        for l in listeners {
            if let Some(l) = l.as_object_mut() {
                set_default(l, "allowedRoutes", json!({"namespaces": {"from": "Same"}}));
            }
        }
    }
}

/// Defaults for a new object of `kind`; status starts as the apiserver
/// resets it on create.
pub fn apply_on_create(
    kind: &str,
    has_status: bool,
    obj: &mut Value,
    cluster_ip: &mut dyn FnMut() -> String,
) {
    if has_status && let Some(o) = obj.as_object_mut() {
        o.remove("status");
    }
    match kind {
        "Pod" => default_pod(obj),
        "Service" => default_service(obj, cluster_ip),
        "Namespace" => default_namespace(obj),
        "Secret" => fold_secret_string_data(obj),
        "HTTPRoute" => default_httproute(obj),
        "Gateway" => default_gateway(obj),
        "Deployment" => {
            if let Some(s) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                set_default(s, "replicas", json!(1));
                set_default(s, "revisionHistoryLimit", json!(10));
                set_default(s, "progressDeadlineSeconds", json!(600));
                set_default(
                    s,
                    "strategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
                );
                if let Some(strategy) = s.get_mut("strategy").and_then(Value::as_object_mut)
                    && strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate")
                {
                    set_default(strategy, "rollingUpdate", json!({}));
                    if let Some(rolling) = strategy
                        .get_mut("rollingUpdate")
                        .and_then(Value::as_object_mut)
                    {
                        set_default(rolling, "maxSurge", json!("25%"));
                        set_default(rolling, "maxUnavailable", json!("25%"));
                    }
                }
            }
            if let Some(o) = obj.as_object_mut() {
                o.insert("status".into(), json!({}));
            }
        }
        "ReplicaSet" => {
            if let Some(s) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                set_default(s, "replicas", json!(1));
            }
            if let Some(o) = obj.as_object_mut() {
                o.insert("status".into(), json!({}));
            }
        }
        "Ingress" => {
            if let Some(o) = obj.as_object_mut() {
                o.insert("status".into(), json!({"loadBalancer": {}}));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_start_pending_with_kubelet_facing_defaults() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                             "status": {"phase": "Running"}});
        apply_on_create("Pod", true, &mut pod, &mut || unreachable!());
        assert_eq!(
            pod["status"],
            json!({"phase": "Pending", "qosClass": "BestEffort"})
        );
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
        assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
    }

    #[test]
    fn limits_alone_make_a_guaranteed_pod() {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "x:1",
            "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}}}]}});
        apply_on_create("Pod", true, &mut pod, &mut || unreachable!());
        assert_eq!(pod["status"]["qosClass"], "Guaranteed");
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "500m"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
    }

    #[test]
    fn services_get_a_cluster_ip_and_target_ports() {
        let mut svc = json!({"spec": {"ports": [{"port": 80}]}});
        apply_on_create("Service", true, &mut svc, &mut || "10.96.0.10".to_string());
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(svc["spec"]["ports"][0]["protocol"], "TCP");
    }

    #[test]
    fn secret_string_data_is_folded_into_data() {
        let mut s = json!({"stringData": {"tls.crt": "abc"}});
        fold_secret_string_data(&mut s);
        assert_eq!(s, json!({"data": {"tls.crt": "YWJj"}, "type": "Opaque"}));
    }
}
