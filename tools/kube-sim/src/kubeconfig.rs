//! The kubeconfig kube-sim writes: one cluster at its URL, plain HTTP, no
//! credentials.

use std::path::Path;

pub const CONTEXT: &str = "kube-sim";

pub fn render(server_url: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {CONTEXT}
  cluster:
    server: {server_url}
contexts:
- name: {CONTEXT}
  context:
    cluster: {CONTEXT}
    user: {CONTEXT}
    namespace: {namespace}
current-context: {CONTEXT}
preferences: {{}}
users:
- name: {CONTEXT}
  user: {{}}
"
    )
}

/// Writes the kubeconfig atomically (a reader never sees half a file).
pub fn write(path: &Path, server_url: &str, namespace: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("kube-sim-tmp");
    std::fs::write(&tmp, render(server_url, namespace))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_parses_as_a_kube_rs_kubeconfig() {
        let text = render("http://127.0.0.1:1234", "default");
        let kc = kube::config::Kubeconfig::from_yaml(&text).expect("valid kubeconfig");
        assert_eq!(kc.current_context.as_deref(), Some(CONTEXT));
        let server = kc.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone());
        assert_eq!(server.as_deref(), Some("http://127.0.0.1:1234"));
    }
}
