//! Env values no pod may show: an app session's environment (the operator's
//! catalog `env`, the workload token, and the client's values beside them)
//! and a co-resident agent's (the operator's `env` and its token). Anyone
//! who may `get pods` in the session namespace reads every spec, annotation
//! and label, so these values go into one Secret per pod instead, and each
//! container entry names its key (`valueFrom.secretKeyRef`). The variable's
//! name stays in the spec; its value never does.
//!
//! Its life follows the pod's:
//! - it is created before the pod: a container whose Secret is missing
//!   waits on `CreateContainerConfigError` and the start fails;
//! - once the pod exists the Secret is tied to it (an ownerReference), so
//!   Kubernetes' garbage collector deletes it with the pod, however the pod
//!   goes: the session ends or fails, the runner reaps it, someone deletes
//!   it. A runner restart changes nothing: the pod and its Secret stay;
//! - a pod create that is refused deletes the Secret at once;
//! - a runner that dies between the Secret and the tie leaves a Secret no
//!   pod owns: the next runner's boot sweep ([`EnvSecrets::sweep`]) ties it
//!   to its pod when that pod exists and refers to it, and deletes it
//!   otherwise.
//!
//! A Secret belongs to one pod and is named after it with a random suffix:
//! a watch session's next pod (same pod name) gets a new Secret, never one
//! the collector is about to delete.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, Pod, Secret, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use runner_core::{HeldSessions, StartError, StartStage};
use tracing::{debug, info, warn};

use crate::cluster::api_error::{api_failure, api_reason, is_not_found, is_transient};
use crate::pod::labels::{ENV_OF_LABEL, MANAGED_BY_LABEL, SESSION_ID_LABEL};

/// What follows the pod's name in its Secret's name, before the suffix.
const NAME_INFIX: &str = "-env-";
/// Random bytes of a Secret's name suffix (8 hex characters).
const SUFFIX_BYTES: usize = 4;
/// Attempts at a tie or a delete when the apiserver fails transiently; the
/// wait before the n-th retry is n times [`RETRY_DELAY`].
const ATTEMPTS: u32 = 5;
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// The env values of one pod, kept for its Secret, and the entries that
/// refer to them. Plain data: the pod builders fill it, the I/O layer
/// stores it.
#[derive(Clone, PartialEq, Eq)]
pub struct PodEnvSecret {
    name: String,
    values: BTreeMap<String, String>,
}

/// The values are secret: only the keys are shown.
impl std::fmt::Debug for PodEnvSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodEnvSecret")
            .field("name", &self.name)
            .field("keys", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl PodEnvSecret {
    /// A new Secret for the pod `pod_name`: `<pod>-env-<8 hex>`.
    pub fn for_pod(pod_name: &str) -> Self {
        let suffix = hex::encode(rand::random::<[u8; SUFFIX_BYTES]>());
        Self::named(format!("{pod_name}{NAME_INFIX}{suffix}"))
    }

    /// A Secret of a given name (tests, snapshots).
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            values: BTreeMap::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether no value was kept: the pod then needs no Secret.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Keeps `value` of `container`'s variable `variable` and returns the
    /// entry that takes it from the Secret. Keys are `<container>.<n>`:
    /// always a valid Secret key, whatever characters the variable's name
    /// has. The value is kept as it is: Kubernetes expands `$(VAR)` only in
    /// literal values, never in one read from a Secret.
    pub fn refer(&mut self, container: &str, variable: &str, value: &str) -> EnvVar {
        let key = format!("{container}.{}", self.values.len());
        self.values.insert(key.clone(), value.to_owned());
        EnvVar {
            name: variable.to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: self.name.clone(),
                    key,
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
        }
    }

    /// The Secret as the runner creates it, labelled like the session's
    /// other objects and with the pod it belongs to.
    pub fn manifest(&self, managed_by: &str, session_id: &str, pod_name: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY_LABEL.to_owned(), managed_by.to_owned()),
                    (SESSION_ID_LABEL.to_owned(), session_id.to_owned()),
                    (ENV_OF_LABEL.to_owned(), pod_name.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".to_owned()),
            data: Some(
                self.values
                    .iter()
                    .map(|(key, value)| (key.clone(), ByteString(value.clone().into_bytes())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }
}

/// Whether `name` is one [`PodEnvSecret::for_pod`] makes.
pub fn is_env_secret_name(name: &str) -> bool {
    name.rsplit_once(NAME_INFIX).is_some_and(|(pod, suffix)| {
        !pod.is_empty()
            && suffix.len() == SUFFIX_BYTES * 2
            && suffix.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The env Secret a kubelet's `CreateContainerConfigError` message is
/// about (`secret "x" not found`, `couldn't find key k in Secret ns/x`),
/// when it is one of the runner's.
pub fn env_secret_in_kubelet_message(message: &str) -> Option<&str> {
    let name = if let Some(rest) = message.strip_prefix("secret \"") {
        rest.strip_suffix("\" not found")?
    } else {
        let (_, rest) = message
            .strip_prefix("couldn't find key ")?
            .split_once(" in Secret ")?;
        rest.rsplit_once('/')?.1
    };
    is_env_secret_name(name).then_some(name)
}

/// Whether any container of `pod` takes a value from the Secret `name`.
pub fn pod_refers_to(pod: &Pod, name: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|container| container.env.iter().flatten())
        .filter_map(|entry| entry.value_from.as_ref()?.secret_key_ref.as_ref())
        .any(|reference| reference.name == name)
}

fn owned_by(pod: &Pod) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone()?,
        ..OwnerReference::default()
    })
}

/// Why a pod that needs an env Secret could not be created; nothing of it
/// is left behind.
#[derive(Debug, thiserror::Error)]
pub enum PodCreateError {
    #[error("could not store the session's environment")]
    StoreEnv(#[source] kube::Error),
    #[error("could not create the session pod")]
    CreatePod(#[source] kube::Error),
    #[error("could not tie the session's environment to its pod")]
    TieEnv(#[source] kube::Error),
}

impl PodCreateError {
    /// The `create` start failure a client sees, with the API's reason.
    pub fn into_start_error(self) -> StartError {
        let action = self.to_string();
        let (Self::StoreEnv(err) | Self::CreatePod(err) | Self::TieEnv(err)) = self;
        api_failure(err, StartStage::Create, &action)
    }
}

/// The env Secrets of one session namespace.
pub struct EnvSecrets {
    secrets: Api<Secret>,
    pods: Api<Pod>,
    managed_by: String,
}

impl EnvSecrets {
    pub fn new(secrets: Api<Secret>, pods: Api<Pod>, managed_by: String) -> Self {
        Self {
            secrets,
            pods,
            managed_by,
        }
    }

    /// Creates the pod `create` makes, named `pod_name`, of session
    /// `session_id`: first its Secret (when it holds anything), then the
    /// pod, then the tie between them. On any failure nothing is left: a
    /// refused pod takes its Secret along, a failed tie both.
    pub async fn create_pod<F, Fut>(
        &self,
        secret: &PodEnvSecret,
        session_id: &str,
        pod_name: &str,
        create: F,
    ) -> Result<Pod, PodCreateError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Pod, kube::Error>>,
    {
        if secret.is_empty() {
            return create().await.map_err(PodCreateError::CreatePod);
        }
        let manifest = secret.manifest(&self.managed_by, session_id, pod_name);
        self.secrets
            .create(&PostParams::default(), &manifest)
            .await
            .map_err(PodCreateError::StoreEnv)?;
        let pod = match create().await {
            Ok(pod) => pod,
            Err(err) => {
                self.delete_logged(secret.name()).await;
                return Err(PodCreateError::CreatePod(err));
            }
        };
        if let Err(err) = self.tie(secret.name(), &pod).await {
            if let Err(err) = self.delete_pod(pod_name).await {
                warn!(pod = pod_name, error = %api_reason(&err), "could not delete a pod whose env Secret could not be tied to it");
            }
            self.delete_logged(secret.name()).await;
            return Err(PodCreateError::TieEnv(err));
        }
        Ok(pod)
    }

    /// Makes `pod` the owner of the Secret `name`, so the garbage collector
    /// deletes the Secret with the pod.
    async fn tie(&self, name: &str, pod: &Pod) -> Result<(), kube::Error> {
        let Some(owner) = owned_by(pod) else {
            // A created pod always has a name and a uid.
            return Err(kube::Error::Service(
                "the created pod has no name or uid".into(),
            ));
        };
        let patch = serde_json::json!({"metadata": {"ownerReferences": [owner]}});
        retry_transient(|| async {
            self.secrets
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop)
        })
        .await
    }

    /// Deletes the Secret `name`; one already gone is fine.
    async fn delete(&self, name: &str) -> Result<(), kube::Error> {
        retry_transient(|| async {
            match self.secrets.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(err) if is_not_found(&err) => Ok(()),
                Err(err) => Err(err),
            }
        })
        .await
    }

    /// Deletes a pod that cannot run without its env Secret, at once.
    async fn delete_pod(&self, name: &str) -> Result<(), kube::Error> {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        retry_transient(|| async {
            match self.pods.delete(name, &now).await {
                Ok(_) => Ok(()),
                Err(err) if is_not_found(&err) => Ok(()),
                Err(err) => Err(err),
            }
        })
        .await
    }

    /// [`Self::delete`], a failure logged: the next boot sweep retries it.
    async fn delete_logged(&self, name: &str) {
        if let Err(err) = self.delete(name).await {
            warn!(secret = name, error = %api_reason(&err), "could not delete an env Secret; the next runner's boot sweep will");
        }
    }

    /// At boot: every env Secret of this runner that no pod owns (a runner
    /// died between creating it and tying it) is tied to its pod when that
    /// pod exists and refers to it, and deleted otherwise. Secrets of
    /// sessions this runner holds are being started: left alone. Owned
    /// Secrets are the garbage collector's.
    pub async fn sweep(&self, held: &HeldSessions) {
        let selector = format!("{MANAGED_BY_LABEL}={},{ENV_OF_LABEL}", self.managed_by);
        let listed = match self
            .secrets
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(listed) => listed,
            Err(err) => {
                warn!(error = %api_reason(&err), "could not list the env Secrets left by a previous runner");
                return;
            }
        };
        for secret in listed.items {
            let meta = &secret.metadata;
            let Some(name) = meta.name.as_deref() else {
                continue;
            };
            if meta
                .owner_references
                .as_ref()
                .is_some_and(|o| !o.is_empty())
            {
                continue;
            }
            let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned();
            if label(SESSION_ID_LABEL).is_some_and(|id| held(&id)) {
                continue;
            }
            let pod = match label(ENV_OF_LABEL) {
                Some(pod_name) => match self.pods.get_opt(&pod_name).await {
                    Ok(pod) => pod.filter(|pod| pod_refers_to(pod, name)),
                    Err(err) => {
                        warn!(secret = name, error = %api_reason(&err), "could not read the pod of an unowned env Secret; leaving it");
                        continue;
                    }
                },
                None => None,
            };
            match pod {
                Some(pod) => match self.tie(name, &pod).await {
                    Ok(()) => info!(
                        secret = name,
                        "tied an env Secret a previous runner left to its pod"
                    ),
                    Err(err) => {
                        warn!(secret = name, error = %api_reason(&err), "could not tie an env Secret to its pod")
                    }
                },
                None => {
                    info!(secret = name, "deleting an env Secret whose pod is gone");
                    self.delete_logged(name).await;
                }
            }
        }
    }
}

/// `op`, tried again while it fails transiently (a 5xx, a 429, no answer).
async fn retry_transient<F, Fut>(mut op: F) -> Result<(), kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Err(err) if attempt < ATTEMPTS && is_transient(&err) => {
                debug!(error = %err, attempt, "env Secret request failed; retrying");
                tokio::time::sleep(RETRY_DELAY * attempt).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    #[test]
    fn each_value_gets_a_key_and_the_entry_names_only_the_key() {
        let mut secret = PodEnvSecret::named("telo-run-abc234defghi-env-0badc0de");
        let first = secret.refer("session", "API_KEY", "k3y $(HOME) $$");
        let second = secret.refer("session", "weird name=", "v");
        assert_eq!(first.value, None);
        let reference = first.value_from.unwrap().secret_key_ref.unwrap();
        assert_eq!(reference.name, "telo-run-abc234defghi-env-0badc0de");
        assert_eq!(reference.key, "session.0");
        assert_eq!(reference.optional, None);
        assert_eq!(
            second.value_from.unwrap().secret_key_ref.unwrap().key,
            "session.1"
        );
        let manifest = secret.manifest("telo-k8s-runner", "abc234defghi", "telo-run-abc234defghi");
        let data = manifest.data.unwrap();
        assert_eq!(data["session.0"].0, b"k3y $(HOME) $$");
        assert_eq!(data["session.1"].0, b"v");
        let labels = manifest.metadata.labels.unwrap();
        assert_eq!(labels[ENV_OF_LABEL], "telo-run-abc234defghi");
        assert_eq!(labels[SESSION_ID_LABEL], "abc234defghi");
        assert_eq!(labels[MANAGED_BY_LABEL], "telo-k8s-runner");
        assert!(!format!("{secret:?}").contains("k3y"));
    }

    #[test]
    fn names_are_per_pod_and_recognised() {
        let one = PodEnvSecret::for_pod("telo-watch-abc234defghi");
        let two = PodEnvSecret::for_pod("telo-watch-abc234defghi");
        assert_ne!(one.name(), two.name());
        assert!(one.name().starts_with("telo-watch-abc234defghi-env-"));
        assert!(one.name().len() <= 63);
        assert!(is_env_secret_name(one.name()));
        assert!(!is_env_secret_name("telo-watch-abc234defghi"));
        assert!(!is_env_secret_name("regcred"));
        assert!(!is_env_secret_name("-env-0badc0de"));
        assert!(!is_env_secret_name("x-env-0badc0dz"));
    }

    #[test]
    fn the_kubelets_messages_name_the_env_secret() {
        let name = "telo-run-abc234defghi-env-0badc0de";
        assert_eq!(
            env_secret_in_kubelet_message(&format!("secret \"{name}\" not found")),
            Some(name)
        );
        assert_eq!(
            env_secret_in_kubelet_message(&format!(
                "couldn't find key session.0 in Secret telo-sessions/{name}"
            )),
            Some(name)
        );
        assert_eq!(
            env_secret_in_kubelet_message("secret \"regcred\" not found"),
            None
        );
        assert_eq!(env_secret_in_kubelet_message("no secret"), None);
    }

    #[test]
    fn a_pod_refers_to_the_secrets_its_containers_read() {
        let mut secret = PodEnvSecret::named("s-env-00000000");
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "agent".into(),
                    env: Some(vec![secret.refer("agent", "KEY", "v")]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        assert!(pod_refers_to(&pod, "s-env-00000000"));
        assert!(!pod_refers_to(&pod, "s-env-11111111"));
        assert!(!pod_refers_to(&Pod::default(), "s-env-00000000"));
    }
}
