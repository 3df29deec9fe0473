//! What every per-session routing object carries: its namespace, the labels
//! the shared informer and the adoption selector find it by, and a controller
//! reference to the session pod so the cluster collects it with the pod.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::pod::labels::{MANAGED_BY_LABEL, SESSION_ID_LABEL};

/// The session a routing object belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionObjects {
    pub namespace: String,
    /// Value of `app.kubernetes.io/managed-by`.
    pub managed_by: String,
    pub session_id: String,
    /// The session pod, which owns every routing object.
    pub owner: OwnerReference,
}

impl SessionObjects {
    /// Metadata of a routing object named `name`. Every object carries the
    /// session-id label, the Service included: the reference left it off the
    /// Service, which no session selector could then find.
    pub fn metadata(&self, name: String) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), self.managed_by.clone()),
                (SESSION_ID_LABEL.to_owned(), self.session_id.clone()),
            ])),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// A controller reference to the session pod. With it the garbage collector
/// deletes the Service and routes when the pod goes, so stopping a session is
/// one delete and a runner that dies mid-session leaks nothing.
pub fn pod_owner_reference(pod_name: &str, pod_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: pod_name.to_owned(),
        uid: pod_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}
