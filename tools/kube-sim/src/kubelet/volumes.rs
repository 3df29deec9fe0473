//! A pod's volumes: `emptyDir`, ConfigMap and Secret volumes written as
//! files before its containers start.

use super::env::Source;
use super::*;
use crate::storage::store::ObjRef;

impl Kubelet {
    pub(super) async fn prepare_volumes(&self, w: &PodWorker, ctx: &PodCtx) -> Result<(), String> {
        for v in ctx.pod.spec.volumes.iter().flatten() {
            let name = v.name.as_str();
            let dir = ctx.sandbox.join("volumes").join(name);
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| format!("MountVolume.SetUp failed for volume {name:?} : {e}"))?;
            let sources = [
                v.config_map
                    .as_ref()
                    .map(|s| (Source::ConfigMap, s.name.as_str(), s.optional)),
                v.secret.as_ref().map(|s| {
                    (
                        Source::Secret,
                        s.secret_name.as_deref().unwrap_or(""),
                        s.optional,
                    )
                }),
            ];
            for (source, obj_name, optional) in sources.into_iter().flatten() {
                let obj = self
                    .wait_for_source(w, name, source, obj_name, optional.unwrap_or(false))
                    .await;
                if let Some(obj) = obj {
                    write_volume_files(&obj.value, source.encoded(), &dir).await;
                }
            }
        }
        Ok(())
    }

    /// The ConfigMap or Secret a volume shows, once it exists; the kubelet
    /// keeps retrying the mount (with a `FailedMount` event each time) until
    /// it does. `None`: an optional source that is not there.
    async fn wait_for_source(
        &self,
        w: &PodWorker,
        volume: &str,
        source: Source,
        obj_name: &str,
        optional: bool,
    ) -> Option<ObjRef> {
        loop {
            match self.store.get(kinds::id(source.plural()), &w.ns, obj_name) {
                Some(o) => return Some(o),
                None if optional => return None,
                None => {
                    self.event(
                        w,
                        None,
                        EventType::Warning,
                        "FailedMount",
                        &format!(
                            "MountVolume.SetUp failed for volume {volume:?} : {} {obj_name:?} not found",
                            source.lower()
                        ),
                    );
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
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
