//! Every label and annotation key the runner writes on the objects it
//! creates, with the values it gives them and the questions asked of them.

use k8s_openapi::api::core::v1::Pod;

/// Label on every object the runner creates; its value is `RUNNER_MANAGED_BY`.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const SESSION_ID_LABEL: &str = "telo.run/session-id";

/// The session record's fields, one annotation each
/// ([`record_annotations`](super::session_record::record_annotations)).
pub const CREATED_AT_ANNOTATION: &str = "telo.run/created-at";
pub const KIND_ANNOTATION: &str = "telo.run/kind";
pub const PORTS_ANNOTATION: &str = "telo.run/ports";
pub const INSPECT_ANNOTATION: &str = "telo.run/inspect";
pub const APP_ANNOTATION: &str = "telo.run/app";
/// SHA-256 (hex) of an app session's workload token: enough for a later
/// runner to check the token at the edge, never the token itself.
pub const TOKEN_DIGEST_ANNOTATION: &str = "telo.run/token-sha256";
/// The principal that created the session (`{"subject","tenant"}`), so a
/// restarted runner answers only it (and admins) about the session.
pub const OWNER_ANNOTATION: &str = "telo.run/owner";
/// The replica that owns the session (several replicas): on a run pod, on
/// a watch session's record Secret.
pub const REPLICA_ANNOTATION: &str = "telo.run/replica";
/// A run or app session's share links (`[{"id","port","expiresAt",
/// "createdAt"}]`), so a restarted runner lists and honours the same ones.
pub const LINKS_ANNOTATION: &str = "telo.run/links";
/// How many times a session was taken over by a restarted runner.
pub const GENERATION_ANNOTATION: &str = "telo.run/generation";

/// On every env Secret: the name of the pod it belongs to.
pub const ENV_OF_LABEL: &str = "telo.run/env-of";

/// `watch` on a watch pod; adoption of run sessions leaves these alone.
pub const MODE_LABEL: &str = "telo.run/mode";
pub const WATCH_MODE: &str = "watch";

/// The pool a warm pod belongs to (a digest of its kernel image: a label
/// value cannot hold an image reference).
pub const POOL_LABEL: &str = "telo.run/warm-pool";
/// `idle` while the pod waits for a session; removed by the claim.
pub const STATE_LABEL: &str = "telo.run/warm";
pub const IDLE: &str = "idle";
/// The kernel image a pool's pods run, as written (the label is a digest).
pub const IMAGE_ANNOTATION: &str = "telo.run/warm-image";
/// The session's app a claimed pooled watch pod runs, as an annotation (the
/// session record says the same).
pub const POOLED_APP_ANNOTATION: &str = "telo.run/pooled-app";

/// Whether `pod` is a warm pod no session has claimed.
pub fn is_idle(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(STATE_LABEL))
        .is_some_and(|state| state == IDLE)
}

/// Whether `pod` is a watch pod (left to the watch sessions' recovery).
pub fn is_watch_pod(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MODE_LABEL))
        .is_some_and(|mode| mode == WATCH_MODE)
}
