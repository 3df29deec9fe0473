//! A container's environment as the kubelet builds it: `env` values with
//! `$(VAR)` expansion, `valueFrom` field, ConfigMap and Secret references,
//! and `envFrom`.

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar};

use super::*;

/// The two kinds of object a container's environment and volumes may read
/// from, with the spellings a kubelet's messages use for each.
#[derive(Clone, Copy)]
pub(super) enum Source {
    ConfigMap,
    Secret,
}

impl Source {
    pub fn plural(self) -> &'static str {
        match self {
            Source::ConfigMap => "configmaps",
            Source::Secret => "secrets",
        }
    }

    /// As in "configmap \"x\" not found".
    pub fn lower(self) -> &'static str {
        match self {
            Source::ConfigMap => "configmap",
            Source::Secret => "secret",
        }
    }

    /// As in "couldn't find key k in ConfigMap ns/x".
    fn title(self) -> &'static str {
        match self {
            Source::ConfigMap => "ConfigMap",
            Source::Secret => "Secret",
        }
    }

    /// Secret values are stored base64-encoded.
    pub fn encoded(self) -> bool {
        matches!(self, Source::Secret)
    }
}

/// An environment being built: a later definition of a name replaces the
/// earlier one, and `$(NAME)` sees what was defined before it.
#[derive(Default)]
struct Env(Vec<(String, String)>);

impl Env {
    fn set(&mut self, k: &str, v: String) {
        self.0.retain(|(ek, _)| ek != k);
        self.0.push((k.to_string(), v));
    }
}

impl Kubelet {
    pub(super) fn resolve_env(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Container,
        mounts: &Mounts,
        container_dir: &Path,
    ) -> Result<Vec<(String, String)>, LaunchError> {
        let mut env = Env::default();
        let host_path =
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        env.set("PATH", format!("{}:{host_path}", self.shim_dir.display()));
        env.set("HOSTNAME", w.name.clone());
        env.set("HOME", container_dir.to_string_lossy().into_owned());
        if c.tty == Some(true) {
            env.set("TERM", "xterm".into());
        }
        self.add_declared_env(w, ctx, c, &mut env, |v| {
            mounts
                .map_path(&v)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or(v)
        })?;
        if let Some(api) = &self.api
            && ctx.pod.spec.automount_service_account_token != Some(false)
        {
            self.give_api_access(api, ctx, &mut env)?;
        }
        // Processes bind to the pod IP (fake-telo's `HOST` rule).
        env.set("HOST", ctx.ip.to_string());
        Ok(env.0)
    }

    /// The pod's service account access: a kubeconfig with the
    /// apiserver's address, CA and token in the pod's sandbox, named by
    /// `KUBECONFIG` unless the container sets it itself.
    fn give_api_access(
        &self,
        api: &PodApiAccess,
        ctx: &PodCtx,
        env: &mut Env,
    ) -> Result<(), LaunchError> {
        let dir = ctx.sandbox.join("serviceaccount");
        let path = dir.join("kubeconfig");
        let namespace = ctx.pod.metadata.namespace.as_deref().unwrap_or("default");
        std::fs::create_dir_all(&dir)
            .and_then(|()| {
                crate::kubeconfig::write(&path, &api.server, namespace, &api.ca_pem, &api.token)
            })
            .map_err(|e| {
                LaunchError::Create(format!("could not write the service account volume: {e}"))
            })?;
        // Not `KUBERNETES_SERVICE_HOST`: a client seeing it reads the
        // in-cluster files, which a host process does not have.
        if !env.0.iter().any(|(k, _)| k == "KUBECONFIG") {
            env.set("KUBECONFIG", path.to_string_lossy().into_owned());
        }
        Ok(())
    }

    /// A real container's environment (the docker runtime): only what the
    /// container declares, resolved as the kubelet resolves it, its paths
    /// the container's own. The image's environment, `PATH` and `HOME`
    /// come from the image and the engine.
    pub(super) fn container_env(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Container,
    ) -> Result<Vec<(String, String)>, LaunchError> {
        let mut env = Env::default();
        self.add_declared_env(w, ctx, c, &mut env, |v| v)?;
        Ok(env.0)
    }

    /// `envFrom`, then `env` (each value passed through `map`).
    fn add_declared_env(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Container,
        env: &mut Env,
        map: impl Fn(String) -> String,
    ) -> Result<(), LaunchError> {
        for from in c.env_from.iter().flatten() {
            self.add_env_from(w, from, env)?;
        }
        for e in c.env.iter().flatten() {
            if let Some(v) = self.env_value(w, ctx, e, env)? {
                env.set(&e.name, map(v));
            }
        }
        Ok(())
    }

    /// One `envFrom` entry: every key of the ConfigMap and/or Secret, with
    /// the entry's prefix.
    fn add_env_from(
        &self,
        w: &PodWorker,
        from: &EnvFromSource,
        env: &mut Env,
    ) -> Result<(), LaunchError> {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let refs = [
            from.config_map_ref
                .as_ref()
                .map(|r| (Source::ConfigMap, &r.name, r.optional)),
            from.secret_ref
                .as_ref()
                .map(|r| (Source::Secret, &r.name, r.optional)),
        ];
        for (source, name, optional) in refs.into_iter().flatten() {
            match self.store.get(kinds::id(source.plural()), &w.ns, name) {
                Some(obj) => {
                    for (k, v) in data_of(&obj.value, source.encoded()) {
                        env.set(&format!("{prefix}{k}"), v);
                    }
                }
                None if optional.unwrap_or(false) => {}
                None => {
                    return Err(LaunchError::Config(format!(
                        "{} {name:?} not found",
                        source.lower()
                    )));
                }
            }
        }
        Ok(())
    }

    /// One `env` entry's value: a literal with `$(VAR)` expanded, a pod
    /// field, or a ConfigMap or Secret key. `None`: nothing to set (an
    /// optional reference that is missing, or a source the kubelet here
    /// does not provide).
    fn env_value(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        e: &EnvVar,
        env: &Env,
    ) -> Result<Option<String>, LaunchError> {
        if let Some(v) = &e.value {
            return Ok(Some(expand_refs(v, &env.0)));
        }
        let Some(from) = &e.value_from else {
            return Ok(None);
        };
        if let Some(fr) = &from.field_ref {
            return Ok(Some(field_ref(
                &ctx.pod,
                &fr.field_path,
                ctx.ip,
                self.node_ip,
            )));
        }
        let refs = [
            from.config_map_key_ref
                .as_ref()
                .map(|r| (Source::ConfigMap, &r.name, &r.key, r.optional)),
            from.secret_key_ref
                .as_ref()
                .map(|r| (Source::Secret, &r.name, &r.key, r.optional)),
        ];
        let mut resolved = None;
        for (source, name, key, optional) in refs.into_iter().flatten() {
            let optional = optional.unwrap_or(false);
            match self.store.get(kinds::id(source.plural()), &w.ns, name) {
                Some(obj) => match data_of(&obj.value, source.encoded())
                    .into_iter()
                    .find(|(dk, _)| dk == key)
                {
                    Some((_, v)) => resolved = Some(v),
                    None if optional => {}
                    None => {
                        return Err(LaunchError::Config(format!(
                            "couldn't find key {key} in {} {}/{name}",
                            source.title(),
                            w.ns
                        )));
                    }
                },
                None if optional => {}
                None => {
                    return Err(LaunchError::Config(format!(
                        "{} {name:?} not found",
                        source.lower()
                    )));
                }
            }
        }
        Ok(resolved)
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

/// A `fieldRef`'s value. The node-level fields come from this kubelet;
/// the pod's own from the spec it was picked up with.
pub(super) fn field_ref(pod: &PodView, path: &str, ip: Ipv4Addr, node_ip: Ipv4Addr) -> String {
    let text = |v: Option<&String>| v.cloned().unwrap_or_default();
    match path {
        "status.podIP" | "status.podIPs" => ip.to_string(),
        "status.hostIP" | "status.hostIPs" => node_ip.to_string(),
        "spec.nodeName" => NODE_NAME.into(),
        "metadata.name" => text(pod.metadata.name.as_ref()),
        "metadata.namespace" => text(pod.metadata.namespace.as_ref()),
        "metadata.uid" => text(pod.metadata.uid.as_ref()),
        "spec.serviceAccountName" => text(pod.spec.service_account_name.as_ref()),
        _ => {
            if let Some(label) = path
                .strip_prefix("metadata.labels['")
                .and_then(|r| r.strip_suffix("']"))
            {
                return text(pod.metadata.labels.as_ref().and_then(|l| l.get(label)));
            }
            // Other paths (`metadata.generateName`, `status.qosClass`, …)
            // are read by walking the picked-up pod as JSON.
            meta::path_str(&pod.to_value(), path)
                .unwrap_or("")
                .to_string()
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
