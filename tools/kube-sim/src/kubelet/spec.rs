//! The pod as the kubelet reads it: the stored JSON is turned into the
//! Kubernetes API types once, when the kubelet picks the pod up, so the rest
//! of the kubelet works with named fields instead of walking JSON by string.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// The reason a pod gets when its stored spec cannot be read as a pod.
pub(super) const UNREADABLE_REASON: &str = "InvalidPodSpec";

/// A picked-up pod: its metadata, its spec and the status it had then.
#[derive(Debug, Clone)]
pub(super) struct PodView {
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
    pub status: PodStatus,
}

impl PodView {
    /// Reads a stored pod. The apiserver's validation keeps malformed pods
    /// out of the store, so a failure here means something wrote a pod
    /// around it; the caller fails the pod with this message instead of
    /// guessing at what was meant.
    pub fn from_stored(stored: &Value) -> Result<Self, String> {
        let mut value = stored.clone();
        // The store is keyed by kind, so the pod's own type fields carry no
        // information here; pinning them keeps a missing or differently
        // spelled `apiVersion` from refusing an otherwise readable pod.
        if let Some(o) = value.as_object_mut() {
            o.insert("apiVersion".into(), Value::from("v1"));
            o.insert("kind".into(), Value::from("Pod"));
        }
        let pod: Pod = serde_json::from_value(value)
            .map_err(|e| format!("the kubelet could not read the pod spec: {e}"))?;
        let spec = pod.spec.ok_or_else(|| {
            "the kubelet could not read the pod spec: spec is missing".to_string()
        })?;
        Ok(Self {
            metadata: pod.metadata,
            spec,
            status: pod.status.unwrap_or_default(),
        })
    }

    pub fn init_containers(&self) -> &[k8s_openapi::api::core::v1::Container] {
        self.spec.init_containers.as_deref().unwrap_or_default()
    }

    pub fn containers(&self) -> &[k8s_openapi::api::core::v1::Container] {
        &self.spec.containers
    }

    /// `spec.restartPolicy`, defaulted as the apiserver does.
    pub fn restart_policy(&self) -> &str {
        self.spec.restart_policy.as_deref().unwrap_or("Always")
    }

    /// The grace period the pod itself asks for when nothing newer (a
    /// deletion's own grace period) is known.
    pub fn termination_grace(&self) -> i64 {
        self.metadata
            .deletion_grace_period_seconds
            .or(self.spec.termination_grace_period_seconds)
            .unwrap_or(30)
    }

    /// The pod as JSON again, for the `fieldRef` paths the kubelet has no
    /// named field for, so that any string field of the pod can still be
    /// read by its dotted path.
    pub fn to_value(&self) -> Value {
        let pod = Pod {
            metadata: self.metadata.clone(),
            spec: Some(self.spec.clone()),
            status: Some(self.status.clone()),
        };
        serde_json::to_value(&pod).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stored_pod_reads_as_typed_containers() {
        let view = PodView::from_stored(&json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "initContainers": [{"name": "fetch", "image": "busybox"}],
                "containers": [{"name": "main", "image": "telo", "tty": true}],
                "restartPolicy": "Never",
            },
        }))
        .unwrap();
        assert_eq!(view.init_containers()[0].name, "fetch");
        assert_eq!(view.containers()[0].tty, Some(true));
        assert_eq!(view.restart_policy(), "Never");
        assert_eq!(view.termination_grace(), 30);
    }

    #[test]
    fn a_pod_that_is_not_a_pod_is_refused_with_a_reason() {
        let err = PodView::from_stored(&json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "command": "not-a-list"}]},
        }))
        .unwrap_err();
        assert!(
            err.starts_with("the kubelet could not read the pod spec: "),
            "{err}"
        );
        let err = PodView::from_stored(&json!({"metadata": {"name": "p"}})).unwrap_err();
        assert!(err.ends_with("spec is missing"), "{err}");
    }
}
