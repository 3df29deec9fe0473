//! The kubeconfig kube-sim writes: one cluster at its HTTPS URL with the
//! simulator's CA, and the bearer token every request must carry.

use base64::Engine as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

pub const CONTEXT: &str = "kube-sim";

pub fn render(server_url: &str, namespace: &str, ca_pem: &str, token: &str) -> String {
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {CONTEXT}
  cluster:
    server: {server_url}
    certificate-authority-data: {ca_data}
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
  user:
    token: {token}
"
    )
}

/// Writes the kubeconfig atomically (a reader never sees half a file),
/// readable by its owner only: it holds the simulator's credential.
pub fn write(
    path: &Path,
    server_url: &str,
    namespace: &str,
    ca_pem: &str,
    token: &str,
) -> std::io::Result<()> {
    let tmp = path.with_extension("kube-sim-tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(render(server_url, namespace, ca_pem, token).as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_kubeconfig_parses_as_a_kube_rs_kubeconfig_with_its_token() {
        let text = render("https://127.0.0.1:1234", "default", "PEM", "t0ken");
        let kc = kube::config::Kubeconfig::from_yaml(&text).expect("valid kubeconfig");
        assert_eq!(kc.current_context.as_deref(), Some(CONTEXT));
        let server = kc.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone());
        assert_eq!(server.as_deref(), Some("https://127.0.0.1:1234"));
        assert!(
            kc.auth_infos[0]
                .auth_info
                .as_ref()
                .is_some_and(|u| u.token.is_some())
        );
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("yaml");
        assert_eq!(doc["users"][0]["user"]["token"].as_str(), Some("t0ken"));
        assert_eq!(
            doc["clusters"][0]["cluster"]["certificate-authority-data"].as_str(),
            Some("UEVN")
        );
    }

    #[test]
    fn the_kubeconfig_is_readable_by_its_owner_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        write(&path, "https://127.0.0.1:1", "default", "PEM", "t").expect("written");
        let mode = std::fs::metadata(&path)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
