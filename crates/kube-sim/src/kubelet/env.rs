//! A container's environment as the kubelet builds it: `env` values with
//! `$(VAR)` expansion, `valueFrom` field, ConfigMap and Secret references,
//! and `envFrom`.

use super::*;

impl Kubelet {
    pub(super) fn resolve_env(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Value,
        mounts: &Mounts,
        container_dir: &Path,
    ) -> Result<Vec<(String, String)>, LaunchError> {
        let mut env: Vec<(String, String)> = Vec::new();
        let set = |k: &str, v: String, env: &mut Vec<(String, String)>| {
            env.retain(|(ek, _)| ek != k);
            env.push((k.to_string(), v));
        };
        let host_path =
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        set(
            "PATH",
            format!("{}:{host_path}", self.shim_dir.display()),
            &mut env,
        );
        set("HOSTNAME", w.name.clone(), &mut env);
        set(
            "HOME",
            container_dir.to_string_lossy().into_owned(),
            &mut env,
        );
        if c.get("tty").and_then(Value::as_bool) == Some(true) {
            set("TERM", "xterm".into(), &mut env);
        }
        for from in c
            .get("envFrom")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let prefix = from.get("prefix").and_then(Value::as_str).unwrap_or("");
            for (source, plural, kind) in [
                ("configMapRef", "configmaps", "configmap"),
                ("secretRef", "secrets", "secret"),
            ] {
                let Some(r) = from.get(source) else { continue };
                let n = r.get("name").and_then(Value::as_str).unwrap_or("");
                let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
                match self.store.get(kinds::id(plural), &w.ns, n) {
                    Some(obj) => {
                        for (k, v) in data_of(&obj.value, plural == "secrets") {
                            set(&format!("{prefix}{k}"), v, &mut env);
                        }
                    }
                    None if optional => {}
                    None => return Err(LaunchError::Config(format!("{kind} {n:?} not found"))),
                }
            }
        }
        for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
            let k = e.get("name").and_then(Value::as_str).unwrap_or("");
            let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
                Some(expand_refs(v, &env))
            } else if let Some(fr) = e
                .pointer("/valueFrom/fieldRef/fieldPath")
                .and_then(Value::as_str)
            {
                Some(field_ref(&ctx.pod, fr, ctx.ip))
            } else {
                let mut resolved = None;
                for (source, plural, kind) in [
                    ("configMapKeyRef", "configmaps", "ConfigMap"),
                    ("secretKeyRef", "secrets", "Secret"),
                ] {
                    let Some(r) = e.pointer(&format!("/valueFrom/{source}")) else {
                        continue;
                    };
                    let n = r.get("name").and_then(Value::as_str).unwrap_or("");
                    let key = r.get("key").and_then(Value::as_str).unwrap_or("");
                    let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
                    match self.store.get(kinds::id(plural), &w.ns, n) {
                        Some(obj) => match data_of(&obj.value, plural == "secrets")
                            .into_iter()
                            .find(|(dk, _)| dk == key)
                        {
                            Some((_, v)) => resolved = Some(v),
                            None if optional => {}
                            None => {
                                return Err(LaunchError::Config(format!(
                                    "couldn't find key {key} in {kind} {}/{n}",
                                    w.ns
                                )));
                            }
                        },
                        None if optional => {}
                        None => {
                            return Err(LaunchError::Config(format!(
                                "{} {n:?} not found",
                                kind.to_lowercase()
                            )));
                        }
                    }
                }
                resolved
            };
            if let Some(v) = value {
                let mapped = mounts
                    .map_path(&v)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or(v);
                set(k, mapped, &mut env);
            }
        }
        // Processes bind to the pod IP (fake-telo's `HOST` rule).
        set("HOST", ctx.ip.to_string(), &mut env);
        Ok(env)
    }
}

/// `$(VAR)` references in env values.
/// The kubelet's expansion of `env[].value`: `$$` is an escaped `$`,
/// `$(NAME)` is the value of a variable defined earlier (left as written when
/// there is none), and any other `$` is kept.
pub(super) fn expand_refs(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

pub(super) fn field_ref(pod: &Value, path: &str, ip: Ipv4Addr) -> String {
    match path {
        "status.podIP" | "status.podIPs" => ip.to_string(),
        "status.hostIP" | "status.hostIPs" => "127.0.0.1".into(),
        "spec.nodeName" => NODE_NAME.into(),
        _ => {
            if let Some(label) = path
                .strip_prefix("metadata.labels['")
                .and_then(|r| r.strip_suffix("']"))
            {
                return meta::labels(pod)
                    .and_then(|l| l.get(label))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
            }
            meta::path_str(pod, path).unwrap_or("").to_string()
        }
    }
}

pub(super) fn data_of(obj: &Value, base64_encoded: bool) -> Vec<(String, String)> {
    use base64::Engine;
    let mut out = Vec::new();
    if let Some(data) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let s = v.as_str().unwrap_or("");
            let decoded = if base64_encoded {
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_default()
            } else {
                s.to_string()
            };
            out.push((k.clone(), decoded));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::expand_refs;

    #[test]
    fn env_values_expand_like_the_kubelet() {
        let env = vec![("HOME".to_owned(), "/home/x".to_owned())];
        assert_eq!(expand_refs("pa$$word", &env), "pa$word");
        assert_eq!(expand_refs("$(HOME)/bin", &env), "/home/x/bin");
        assert_eq!(expand_refs("$$(HOME)", &env), "$(HOME)");
        assert_eq!(expand_refs("$(NOPE) $", &env), "$(NOPE) $");
        assert_eq!(expand_refs("$(unclosed", &env), "$(unclosed");
        assert_eq!(expand_refs("a$b", &env), "a$b");
    }
}
