//! Object validation with the apiserver's field paths and message wording
//! (`k8s.io/apimachinery/pkg/util/validation` and the per-kind validators):
//! a name, label or port the real apiserver refuses is refused here with the
//! same `422 Invalid` body.

use serde_json::{Value, json};

use crate::errors::{FieldError, FieldErrorKind};
use crate::kinds::{NameRule, ResourceInfo};
use crate::meta;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const CONFIG_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_KEY_MSG: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";

pub fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `validation.RegexError`, including its double space before " or ".
pub fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, ex) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{ex}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn is_alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(matches_dns1123_label)
}

fn matches_dns1035_label(s: &str) -> bool {
    matches_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

fn matches_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

pub fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !matches_dns1123_label(s) {
        if matches_dns1123_subdomain(s) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

pub fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !matches_dns1123_subdomain(s) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

pub fn dns1035_label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !matches_dns1035_label(s) {
        errs.push(regex_error(
            DNS1035_LABEL_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

fn path_segment_errors(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    let mut errs = Vec::new();
    for bad in ["/", "%"] {
        if s.contains(bad) {
            errs.push(format!("may not contain '{bad}'"));
        }
    }
    errs
}

/// `IsQualifiedName` (label and annotation keys).
pub fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                for m in dns1123_subdomain_errors(prefix) {
                    errs.push(format!("prefix part {m}"));
                }
            }
            name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

pub fn label_value_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !s.is_empty() && !matches_qualified_name_part(s) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `IsValidPortName` (IANA service names: container port names).
pub fn port_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 15 {
        errs.push(max_len_error(15));
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if s.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if s.starts_with('-') || s.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
    }
    errs
}

fn config_key_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
    {
        errs.push(regex_error(
            CONFIG_KEY_MSG,
            CONFIG_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if s == "." || s == ".." {
        errs.push(format!("must not be '{s}'"));
    } else if s.starts_with("..") {
        errs.push("must not start with '..'".into());
    }
    errs
}

fn name_errors(rule: NameRule, name: &str) -> Vec<String> {
    match rule {
        NameRule::Dns1123Subdomain => dns1123_subdomain_errors(name),
        NameRule::Dns1123Label => dns1123_label_errors(name),
        NameRule::Dns1035Label => dns1035_label_errors(name),
        NameRule::PathSegment => path_segment_errors(name),
    }
}

fn invalid_each(field: &str, value: &str, msgs: Vec<String>) -> Vec<FieldError> {
    msgs.into_iter()
        .map(|m| FieldError::invalid(field, json!(value), m))
        .collect()
}

/// `ValidateObjectMeta`: name (or generateName), labels, annotations keys.
pub fn validate_object_meta(info: &ResourceInfo, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta::meta_str(obj, "name").unwrap_or("");
    let generate = meta::meta_str(obj, "generateName").unwrap_or("");
    if name.is_empty() && generate.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else if !name.is_empty() {
        errs.extend(invalid_each(
            "metadata.name",
            name,
            name_errors(info.name_rule, name),
        ));
    }
    if let Some(labels) = meta::labels(obj) {
        for (k, v) in labels {
            errs.extend(invalid_each("metadata.labels", k, qualified_name_errors(k)));
            match v.as_str() {
                Some(v) => errs.extend(invalid_each("metadata.labels", v, label_value_errors(v))),
                None => errs.push(FieldError::invalid(
                    "metadata.labels",
                    v.clone(),
                    "label values must be strings",
                )),
            }
        }
    }
    if let Some(ann) = meta::metadata(obj)
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)
    {
        for k in ann.keys() {
            errs.extend(invalid_each(
                "metadata.annotations",
                k,
                qualified_name_errors(&k.to_lowercase()),
            ));
        }
    }
    errs
}

/// Per-kind spec validation on create and update.
pub fn validate_spec(info: &ResourceInfo, obj: &Value) -> Vec<FieldError> {
    match info.kind {
        "Pod" => validate_pod_spec(obj),
        "Service" => validate_service_spec(obj),
        "ConfigMap" => validate_configmap(obj),
        "Secret" => validate_secret(obj),
        "Ingress" => validate_ingress(obj),
        "HTTPRoute" => validate_httproute(obj),
        "Lease" => validate_lease(obj),
        _ => Vec::new(),
    }
}

fn validate_pod_spec(pod: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = pod.get("spec").cloned().unwrap_or(Value::Null);
    let volumes: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut seen_volumes = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}].name");
        errs.extend(invalid_each(&field, v, dns1123_label_errors(v)));
        if seen_volumes.contains(v) {
            errs.push(FieldError::duplicate(field, json!(v)));
        }
        seen_volumes.push(v.clone());
    }
    let containers = spec.get("containers").and_then(Value::as_array);
    match containers {
        None => errs.push(FieldError::required("spec.containers", "")),
        Some(cs) if cs.is_empty() => errs.push(FieldError::required("spec.containers", "")),
        Some(_) => {}
    }
    let mut names: Vec<String> = Vec::new();
    for group in ["initContainers", "containers"] {
        let Some(cs) = spec.get(group).and_then(Value::as_array) else {
            continue;
        };
        for (i, c) in cs.iter().enumerate() {
            let base = format!("spec.{group}[{i}]");
            validate_container(c, &base, &volumes, &mut names, &mut errs);
        }
    }
    if let Some(policy) = spec.get("restartPolicy") {
        let ok = ["Always", "OnFailure", "Never"];
        if !policy.as_str().is_some_and(|p| ok.contains(&p)) {
            errs.push(FieldError::not_supported(
                "spec.restartPolicy",
                policy.clone(),
                &ok,
            ));
        }
    }
    if let Some(ads) = spec.get("activeDeadlineSeconds") {
        let valid = ads
            .as_i64()
            .is_some_and(|n| (1..=2_147_483_647).contains(&n));
        if !valid {
            errs.push(FieldError::invalid(
                "spec.activeDeadlineSeconds",
                ads.clone(),
                "must be between 1 and 2147483647, inclusive",
            ));
        }
    }
    errs
}

fn validate_container(
    c: &Value,
    base: &str,
    volumes: &[String],
    names: &mut Vec<String>,
    errs: &mut Vec<FieldError>,
) {
    let name = c.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        errs.push(FieldError::required(format!("{base}.name"), ""));
    } else {
        errs.extend(invalid_each(
            &format!("{base}.name"),
            name,
            dns1123_label_errors(name),
        ));
        if names.iter().any(|n| n == name) {
            errs.push(FieldError::duplicate(format!("{base}.name"), json!(name)));
        }
        names.push(name.to_string());
    }
    let image = c.get("image").and_then(Value::as_str).unwrap_or("");
    if image.trim().is_empty() {
        errs.push(FieldError::required(format!("{base}.image"), ""));
    }
    if let Some(p) = c.get("imagePullPolicy") {
        let ok = ["Always", "IfNotPresent", "Never"];
        if !p.as_str().is_some_and(|p| ok.contains(&p)) {
            errs.push(FieldError::not_supported(
                format!("{base}.imagePullPolicy"),
                p.clone(),
                &ok,
            ));
        }
    }
    if let Some(ports) = c.get("ports").and_then(Value::as_array) {
        let mut port_names: Vec<&str> = Vec::new();
        for (j, p) in ports.iter().enumerate() {
            let pbase = format!("{base}.ports[{j}]");
            if let Some(pn) = p.get("name").and_then(Value::as_str)
                && !pn.is_empty()
            {
                errs.extend(invalid_each(
                    &format!("{pbase}.name"),
                    pn,
                    port_name_errors(pn),
                ));
                if port_names.contains(&pn) {
                    errs.push(FieldError::duplicate(format!("{pbase}.name"), json!(pn)));
                }
                port_names.push(pn);
            }
            match p.get("containerPort") {
                None => errs.push(FieldError::required(format!("{pbase}.containerPort"), "")),
                Some(v) => {
                    if !v.as_i64().is_some_and(|n| (1..=65535).contains(&n)) {
                        errs.push(FieldError::invalid(
                            format!("{pbase}.containerPort"),
                            v.clone(),
                            "must be between 1 and 65535, inclusive",
                        ));
                    }
                }
            }
            if let Some(proto) = p.get("protocol") {
                let ok = ["SCTP", "TCP", "UDP"];
                if !proto.as_str().is_some_and(|x| ok.contains(&x)) {
                    errs.push(FieldError::not_supported(
                        format!("{pbase}.protocol"),
                        proto.clone(),
                        &ok,
                    ));
                }
            }
        }
    }
    if let Some(env) = c.get("env").and_then(Value::as_array) {
        for (j, e) in env.iter().enumerate() {
            let n = e.get("name").and_then(Value::as_str).unwrap_or("");
            let field = format!("{base}.env[{j}].name");
            if n.is_empty() {
                errs.push(FieldError::required(field, ""));
            } else if n.contains('=') || !n.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                errs.push(FieldError::invalid(
                    field,
                    json!(n),
                    "a valid environment variable name must consist only of printable ASCII characters other than '='",
                ));
            }
        }
    }
    if let Some(mounts) = c.get("volumeMounts").and_then(Value::as_array) {
        for (j, m) in mounts.iter().enumerate() {
            let n = m.get("name").and_then(Value::as_str).unwrap_or("");
            if !volumes.iter().any(|v| v == n) {
                errs.push(FieldError {
                    field: format!("{base}.volumeMounts[{j}].name"),
                    kind: FieldErrorKind::NotFound(json!(n)),
                    detail: String::new(),
                });
            }
            if m.get("mountPath")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                errs.push(FieldError::required(
                    format!("{base}.volumeMounts[{j}].mountPath"),
                    "",
                ));
            }
        }
    }
}

fn validate_service_spec(svc: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = svc.get("spec").cloned().unwrap_or(Value::Null);
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    let types = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
    if !types.contains(&ty) {
        errs.push(FieldError::not_supported("spec.type", json!(ty), &types));
    }
    let ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    if ports.is_empty() && ty != "ExternalName" && !headless {
        errs.push(FieldError::required("spec.ports", ""));
    }
    let mut seen = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let base = format!("spec.ports[{i}]");
        let name = p.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            if ports.len() > 1 {
                errs.push(FieldError::required(format!("{base}.name"), ""));
            }
        } else {
            errs.extend(invalid_each(
                &format!("{base}.name"),
                name,
                dns1123_label_errors(name),
            ));
            if seen.contains(&name) {
                errs.push(FieldError::duplicate(format!("{base}.name"), json!(name)));
            }
            seen.push(name);
        }
        match p.get("port") {
            None => errs.push(FieldError::required(format!("{base}.port"), "")),
            Some(v) if !v.as_i64().is_some_and(|n| (1..=65535).contains(&n)) => {
                errs.push(FieldError::invalid(
                    format!("{base}.port"),
                    v.clone(),
                    "must be between 1 and 65535, inclusive",
                ))
            }
            Some(_) => {}
        }
        if let Some(proto) = p.get("protocol") {
            let ok = ["SCTP", "TCP", "UDP"];
            if !proto.as_str().is_some_and(|x| ok.contains(&x)) {
                errs.push(FieldError::not_supported(
                    format!("{base}.protocol"),
                    proto.clone(),
                    &ok,
                ));
            }
        }
    }
    if let Some(sel) = spec.get("selector").and_then(Value::as_object) {
        for (k, v) in sel {
            errs.extend(invalid_each("spec.selector", k, qualified_name_errors(k)));
            if let Some(v) = v.as_str() {
                errs.extend(invalid_each("spec.selector", v, label_value_errors(v)));
            }
        }
    }
    errs
}

fn validate_configmap(cm: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0usize;
    for field in ["data", "binaryData"] {
        if let Some(data) = cm.get(field).and_then(Value::as_object) {
            for (k, v) in data {
                errs.extend(invalid_each(field, k, config_key_errors(k)));
                total += k.len() + v.as_str().map(str::len).unwrap_or(0);
            }
        }
    }
    const MAX_CONFIGMAP_BYTES: usize = 1024 * 1024;
    if total > MAX_CONFIGMAP_BYTES {
        errs.push(FieldError {
            field: "[]".to_string(),
            kind: FieldErrorKind::TooLongBytes(MAX_CONFIGMAP_BYTES),
            detail: String::new(),
        });
    }
    errs
}

/// A Secret's keys are config keys and its decoded `data` may hold 1 MiB
/// (`MaxSecretSize`), as the apiserver checks it.
fn validate_secret(secret: &Value) -> Vec<FieldError> {
    use base64::Engine as _;
    let mut errs = Vec::new();
    let mut total = 0usize;
    if let Some(data) = secret.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            errs.extend(invalid_each("data", k, config_key_errors(k)));
            let encoded = v.as_str().unwrap_or("");
            total += base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_or(encoded.len(), |bytes| bytes.len());
        }
    }
    if let Some(data) = secret.get("stringData").and_then(Value::as_object) {
        for (k, v) in data {
            errs.extend(invalid_each("stringData", k, config_key_errors(k)));
            total += v.as_str().map_or(0, str::len);
        }
    }
    const MAX_SECRET_BYTES: usize = 1024 * 1024;
    if total > MAX_SECRET_BYTES {
        errs.push(FieldError {
            field: "data".to_string(),
            kind: FieldErrorKind::TooLongBytes(MAX_SECRET_BYTES),
            detail: String::new(),
        });
    }
    errs
}

fn validate_ingress(ing: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(class) = meta::path_str(ing, "spec.ingressClassName") {
        errs.extend(invalid_each(
            "spec.ingressClassName",
            class,
            dns1123_subdomain_errors(class),
        ));
    }
    let rules = meta::path(ing, "spec.rules")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let has_default = meta::path(ing, "spec.defaultBackend").is_some();
    if rules.is_empty() && !has_default {
        errs.push(FieldError::invalid(
            "spec.rules",
            json!([]),
            "either `defaultBackend` or `rules` must be specified",
        ));
    }
    for (i, rule) in rules.iter().enumerate() {
        if let Some(host) = rule.get("host").and_then(Value::as_str) {
            let plain = host.strip_prefix("*.").unwrap_or(host);
            errs.extend(invalid_each(
                &format!("spec.rules[{i}].host"),
                host,
                dns1123_subdomain_errors(plain),
            ));
        }
        let paths = rule
            .pointer("/http/paths")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (j, p) in paths.iter().enumerate() {
            let base = format!("spec.rules[{i}].http.paths[{j}]");
            match p.get("pathType").and_then(Value::as_str) {
                None => errs.push(FieldError::required(
                    format!("{base}.pathType"),
                    "pathType must be specified",
                )),
                Some(t) if !["Exact", "Prefix", "ImplementationSpecific"].contains(&t) => errs
                    .push(FieldError::not_supported(
                        format!("{base}.pathType"),
                        json!(t),
                        &["Exact", "ImplementationSpecific", "Prefix"],
                    )),
                Some(_) => {}
            }
            if let Some(path) = p.get("path").and_then(Value::as_str)
                && !path.starts_with('/')
            {
                errs.push(FieldError::invalid(
                    format!("{base}.path"),
                    json!(path),
                    "must be an absolute path",
                ));
            }
        }
    }
    errs
}

/// `ValidateLeaseSpec`. `strategy` and `preferredHolder` are not checked:
/// without the `CoordinatedLeaderElection` gate they never get this far.
fn validate_lease(lease: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(v) = meta::path(lease, "spec.leaseDurationSeconds")
        && v.as_i64().is_some_and(|n| n <= 0)
    {
        errs.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            v.clone(),
            "must be greater than 0",
        ));
    }
    if let Some(v) = meta::path(lease, "spec.leaseTransitions")
        && v.as_i64().is_some_and(|n| n < 0)
    {
        errs.push(FieldError::invalid(
            "spec.leaseTransitions",
            v.clone(),
            "must be greater than or equal to 0",
        ));
    }
    errs
}

const GATEWAY_HOSTNAME_PATTERN: &str =
    "^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

fn validate_httproute(route: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(hosts) = meta::path(route, "spec.hostnames").and_then(Value::as_array) {
        for (i, h) in hosts.iter().enumerate() {
            let h = h.as_str().unwrap_or("");
            let plain = h.strip_prefix("*.").unwrap_or(h);
            if !matches_dns1123_subdomain(plain) || h.len() > 253 {
                let field = format!("spec.hostnames[{i}]");
                errs.push(FieldError::invalid(
                    field.clone(),
                    json!(h),
                    format!("{field} in body should match '{GATEWAY_HOSTNAME_PATTERN}'"),
                ));
            }
        }
    }
    if let Some(parents) = meta::path(route, "spec.parentRefs").and_then(Value::as_array)
        && parents.len() > 32
    {
        errs.push(FieldError::invalid(
            "spec.parentRefs",
            json!(parents.len()),
            "must have at most 32 items",
        ));
    }
    errs
}

/// Pod spec fields an update may change (`ValidatePodUpdate`); anything else
/// is refused with the apiserver's "pod updates may not change fields" error.
pub fn validate_pod_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut old_spec = old.get("spec").cloned().unwrap_or(Value::Null);
    let mut new_spec = new.get("spec").cloned().unwrap_or(Value::Null);
    let mut errs = Vec::new();
    if let (Some(o), Some(n)) = (
        old_spec
            .get("activeDeadlineSeconds")
            .and_then(Value::as_i64),
        new_spec.get("activeDeadlineSeconds"),
    ) {
        match n.as_i64() {
            Some(n) if n <= o => {}
            _ => errs.push(FieldError::invalid(
                "spec.activeDeadlineSeconds",
                n.clone(),
                "must be less than or equal to previous value",
            )),
        }
    }
    // Blank out what may change, then compare the rest.
    for spec in [&mut old_spec, &mut new_spec] {
        if let Some(map) = spec.as_object_mut() {
            map.remove("activeDeadlineSeconds");
            map.remove("tolerations");
            map.remove("terminationGracePeriodSeconds");
            for group in ["containers", "initContainers"] {
                if let Some(cs) = map.get_mut(group).and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(c) = c.as_object_mut() {
                            c.remove("image");
                        }
                    }
                }
            }
        }
    }
    if old_spec != new_spec {
        let changed: Vec<String> = match (old_spec.as_object(), new_spec.as_object()) {
            (Some(o), Some(n)) => o
                .keys()
                .chain(n.keys())
                .filter(|k| o.get(*k) != n.get(*k))
                .map(|k| format!("  \t{k}: changed"))
                .collect(),
            _ => vec!["  \tspec: changed".to_string()],
        };
        let mut detail = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n  core.PodSpec{\n".to_string();
        let mut changed = changed;
        changed.dedup();
        detail.push_str(&changed.join("\n"));
        detail.push_str("\n  }\n");
        errs.push(FieldError::forbidden("spec", detail));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds;
    use rstest::rstest;

    #[rstest]
    #[case("telo-run-abc", true)]
    #[case("a.b.c", true)]
    #[case("Bad_Name", false)]
    #[case("-lead", false)]
    #[case("", false)]
    fn dns_subdomain_names(#[case] name: &str, #[case] ok: bool) {
        assert_eq!(dns1123_subdomain_errors(name).is_empty(), ok, "{name}");
    }

    #[test]
    fn service_names_must_start_with_a_letter() {
        let errs = dns1035_label_errors("1abc");
        assert_eq!(
            errs,
            vec!["a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_string()]
        );
    }

    #[test]
    fn label_values_are_limited_to_63_characters() {
        assert_eq!(
            label_value_errors(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
    }

    #[test]
    fn port_names_are_limited_to_15_characters() {
        assert_eq!(
            port_name_errors("a-very-long-port-name"),
            vec!["must be no more than 15 characters".to_string()]
        );
        assert_eq!(
            port_name_errors("8080"),
            vec!["must contain at least one letter (a-z)".to_string()]
        );
    }

    #[test]
    fn object_meta_reports_each_name_problem() {
        let obj = json!({"metadata": {"name": "Bad_Name"}});
        let errs = validate_object_meta(kinds::pods().info(), &obj);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.name");
        assert!(
            errs[0]
                .body()
                .starts_with("Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain")
        );
    }

    #[test]
    fn pods_need_containers() {
        let errs = validate_pod_spec(&json!({"spec": {}}));
        assert_eq!(errs[0].message(), "spec.containers: Required value");
    }

    #[test]
    fn pod_updates_may_only_change_images_and_deadlines() {
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x"}], "restartPolicy": "Never"}});
        let ok = json!({"spec": {"containers": [{"name": "a", "image": "y"}], "restartPolicy": "Never"}});
        assert!(validate_pod_update(&old, &ok).is_empty());
        let bad = json!({"spec": {"containers": [{"name": "a", "image": "x"}], "restartPolicy": "Always"}});
        let errs = validate_pod_update(&old, &bad);
        assert!(
            errs[0]
                .message()
                .starts_with("spec: Forbidden: pod updates may not change fields other than")
        );
    }
}
