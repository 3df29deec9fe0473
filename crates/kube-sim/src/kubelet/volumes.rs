//! A pod's volumes: `emptyDir`, ConfigMap and Secret volumes written as
//! files before its containers start.

use super::*;

impl Kubelet {
    pub(super) async fn prepare_volumes(&self, w: &PodWorker, ctx: &PodCtx) -> Result<(), String> {
        let volumes = meta::path(&ctx.pod, "spec.volumes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for v in volumes {
            let name = v.get("name").and_then(Value::as_str).unwrap_or("");
            let dir = ctx.sandbox.join("volumes").join(name);
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| format!("MountVolume.SetUp failed for volume {name:?} : {e}"))?;
            for (source, plural, key) in [
                ("configMap", "configmaps", "name"),
                ("secret", "secrets", "secretName"),
            ] {
                let Some(src) = v.get(source) else { continue };
                let obj_name = src.get(key).and_then(Value::as_str).unwrap_or("");
                let optional = src
                    .get("optional")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let obj = loop {
                    match self.store.get(kinds::id(plural), &w.ns, obj_name) {
                        Some(o) => break Some(o),
                        None if optional => break None,
                        None => {
                            let kind = if source == "configMap" {
                                "configmap"
                            } else {
                                "secret"
                            };
                            self.event(
                                w,
                                None,
                                EventType::Warning,
                                "FailedMount",
                                &format!("MountVolume.SetUp failed for volume {name:?} : {kind} {obj_name:?} not found"),
                            );
                            tokio::time::sleep(Duration::from_secs(2)).await;
                        }
                    }
                };
                if let Some(obj) = obj {
                    write_volume_files(&obj.value, source == "secret", &dir).await;
                }
            }
        }
        Ok(())
    }
}

pub(super) async fn write_volume_files(obj: &Value, secret: bool, dir: &Path) {
    use base64::Engine;
    for (field, encoded) in [("data", secret), ("binaryData", true)] {
        if let Some(data) = obj.get(field).and_then(Value::as_object) {
            for (k, v) in data {
                let s = v.as_str().unwrap_or("");
                let bytes = if encoded {
                    base64::engine::general_purpose::STANDARD
                        .decode(s)
                        .unwrap_or_default()
                } else {
                    s.as_bytes().to_vec()
                };
                if k.contains('/') || k.starts_with("..") {
                    continue;
                }
                let _ = tokio::fs::write(dir.join(k), bytes).await;
            }
        }
    }
}
