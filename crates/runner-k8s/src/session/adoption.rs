//! Adoption (docs/contract.md §6.5): how a runner takes over the session pods a
//! previous runner left.
//!
//! At boot every pod carrying this runner's managed-by label is read back.
//! One with a well-formed session record is adopted — unless the orphan
//! policy is `reap`, or it finished longer ago than a finished session is
//! kept — and its generation is counted up on the pod, so a later restart
//! continues past this generation's event ids. Every other pod is deleted.
//! The adopted records wait here until the registry resumes each session.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use runner_core::HeldSessions;
use runner_core::RecoveredSession;
use runner_core::backend::KeptLink;
use runner_core::sync::lock;
use serde_json::json;
use tracing::{debug, info, warn};

use crate::cluster::api_error::{is_not_found, is_transient};
use crate::config::OrphanPolicy;
use crate::pod::informer::PodInformer;
use crate::pod::labels::{GENERATION_ANNOTATION, LINKS_ANNOTATION};
use crate::pod::session_record::{SessionRecord, session_record_from_pod};
use crate::pod::status;
use crate::replica::KubeReplicas;
use crate::session::delete_pod;

/// Attempts at recording an adoption when the apiserver fails transiently.
const ADOPTION_PATCH_ATTEMPTS: u32 = 5;

pub struct Adoption {
    policy: OrphanPolicy,
    /// `RUNNER_EXIT_TTL_MS`: how long a finished session is kept.
    exit_ttl: Duration,
    /// Sessions adopted at boot with their pod's name (`telo-run-<id>`, or
    /// the warm pod it claimed), kept until `take` hands them to a resume.
    adopted: Mutex<HashMap<String, (SessionRecord, String)>>,
}

impl Adoption {
    pub fn new(policy: OrphanPolicy, exit_ttl: Duration) -> Self {
        Self {
            policy,
            exit_ttl,
            adopted: Mutex::new(HashMap::new()),
        }
    }

    /// Adopts or deletes every session pod the first full list shows.
    /// With several replicas, only the pods this replica holds or claims:
    /// a live peer's are left to it.
    pub async fn recover(
        &self,
        informer: &PodInformer,
        pods: &Api<Pod>,
        held: &HeldSessions,
        replicas: Option<&KubeReplicas>,
    ) -> Vec<RecoveredSession> {
        informer.wait_synced().await;
        if let Some(replicas) = replicas {
            replicas.wait_synced().await;
        }
        let mut recovered = Vec::new();
        for pod in informer.pods() {
            // Watch pods are the watch sessions' own (their records are
            // Secrets): `recover_suspended` takes them. Idle warm pods are
            // their pool's, which takes them over as they are.
            if crate::pod::labels::is_watch_pod(&pod) || crate::pod::labels::is_idle(&pod) {
                continue;
            }
            // A session this runner started since it booted.
            if crate::pod::informer::session_id_of(&pod).is_some_and(|id| held(&id)) {
                continue;
            }
            // Claimed, the pod is read as written: with whatever its
            // previous owner left on it when it handed the session over.
            let pod = match replicas {
                Some(replicas) => match replicas.claim_object(pods, &pod.metadata).await {
                    Some(claimed) => std::sync::Arc::new(claimed),
                    None => continue,
                },
                None => pod,
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            let finished = status::is_finished(&pod);
            let record = session_record_from_pod(&pod);
            // A session that finished while no runner was up is adopted as
            // finished (its exit code and log), unless it finished longer
            // ago than a finished session is kept.
            let expired = finished && finished_longer_ago_than(&pod, self.exit_ttl);
            let adoptable = self.policy == OrphanPolicy::Adopt && !expired;
            match record {
                Ok(record) if adoptable => {
                    let generation = generation_of(&pod).saturating_add(1);
                    // Recorded on the pod so a later restart continues past
                    // this generation's ids.
                    match record_adoption(pods, &name, generation).await {
                        Ok(()) => {}
                        Err(err) if is_not_found(&err) => continue,
                        // A live session is never deleted for bookkeeping:
                        // it is adopted, and only a later restart may hand
                        // out ids that overlap this generation's.
                        Err(err) => {
                            warn!(pod = %name, error = %err, "could not record the adoption on the pod; adopting it anyway");
                        }
                    }
                    recovered.push(RecoveredSession {
                        session_id: record.session_id.clone(),
                        created_at: record.created_at.clone(),
                        generation,
                        token_digest: record.token_digest,
                        owner: record.owner.clone(),
                        links: links_of_pod(&pod),
                        output_marks: super::marks::decode(pod.metadata.annotations.as_ref()),
                    });
                    lock(&self.adopted).insert(record.session_id.clone(), (record, name.clone()));
                }
                other => {
                    let why = match &other {
                        Err(err) => err.to_string(),
                        Ok(_) if expired => {
                            "finished longer ago than RUNNER_EXIT_TTL_MS".to_owned()
                        }
                        Ok(_) => "orphan policy is reap".to_owned(),
                    };
                    info!(pod = %name, reason = %why, "deleting a session pod left by a previous runner");
                    if let Err(err) = delete_pod(pods, &name).await {
                        warn!(pod = %name, error = %err, "could not delete a leftover session pod");
                    }
                }
            }
        }
        recovered
    }

    /// The record of an adopted session and its pod's name, once: a
    /// resume takes them.
    pub fn take(&self, session_id: &str) -> Option<(SessionRecord, String)> {
        lock(&self.adopted).remove(session_id)
    }
}

/// How many runners adopted the pod before this one (0 for a pod never
/// adopted, or one whose annotation was edited into nonsense).
fn generation_of(pod: &Pod) -> u32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GENERATION_ANNOTATION))
        .and_then(|g| g.parse::<u32>().ok())
        .unwrap_or(0)
}

/// Whether the pod's session container finished more than `ttl` ago; a pod
/// without a finish time counts as finished long ago.
fn finished_longer_ago_than(pod: &Pod, ttl: Duration) -> bool {
    let finished_at = pod
        .status
        .as_ref()
        .and_then(|status| status.container_statuses.as_ref())
        .and_then(|statuses| statuses.first())
        .and_then(|status| status.state.as_ref())
        .and_then(|state| state.terminated.as_ref())
        .and_then(|terminated| terminated.finished_at.as_ref());
    let Some(finished_at) = finished_at else {
        return true;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(finished_at.0);
    age.as_secs_f64() > ttl.as_secs_f64()
}

/// Records the adoption's generation on the pod, so a later restart
/// continues past this generation's ids; transient failures are retried.
/// Keeps a run or app session's share links (the whole list) on its pod.
pub(crate) async fn keep_links_on_pod(
    pods: &Api<Pod>,
    name: &str,
    links: &[KeptLink],
) -> Result<(), kube::Error> {
    let text = serde_json::to_string(links).map_err(kube::Error::SerdeError)?;
    let patch = json!({"metadata": {"annotations": {LINKS_ANNOTATION: text}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// The links a pod keeps; none without the annotation, and none (said)
/// when it was edited into something else: a link the runner cannot read
/// opens nothing, and the session is adopted all the same.
fn links_of_pod(pod: &Pod) -> Vec<KeptLink> {
    let Some(text) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LINKS_ANNOTATION))
    else {
        return Vec::new();
    };
    serde_json::from_str(text).unwrap_or_else(|err| {
        warn!(pod = pod.metadata.name.as_deref().unwrap_or_default(), error = %err, "a session pod's links annotation is not a list of links; its links are dropped");
        Vec::new()
    })
}

async fn record_adoption(pods: &Api<Pod>, name: &str, generation: u32) -> Result<(), kube::Error> {
    let patch =
        json!({"metadata": {"annotations": {GENERATION_ANNOTATION: generation.to_string()}}});
    let mut attempt = 1;
    loop {
        match pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(err) if attempt < ADOPTION_PATCH_ATTEMPTS && is_transient(&err) => {
                debug!(pod = name, error = %err, attempt, "recording the adoption failed; retrying");
                tokio::time::sleep(Duration::from_millis(100) * attempt).await;
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}
