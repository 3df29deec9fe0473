//! Where a watch session outlives its pod and the runner: one Secret per
//! session, `telo-watch-<id>`, in the session namespace.
//!
//! It is written when the session starts (its record: the spec, the
//! workspace token, how many runners held it) and again at every checkpoint
//! (the workspace's files, gzip-compressed JSON). A Secret, not a
//! ConfigMap, because both hold what the session's user wrote and the
//! record holds the session's environment and token.
//!
//! A Secret holds at most 1 MiB, record and files together
//! ([`SECRET_MAX_BYTES`]). A workspace whose compressed files do not fit
//! beside the record cannot be checkpointed: the checkpoint fails with a
//! message saying so (the session's clients are told), the last good
//! checkpoint stays, and an idle session that cannot be checkpointed is not
//! suspended (it keeps running until its lifetime limit) — nothing is lost
//! silently.
//!
//! The compressed files are made by the session's workspace service, beside
//! the files ([`WorkspaceClient::checkpoint`]): the runner learns their size
//! before it reads them and never reads more than a Secret can hold, so a
//! large workspace costs the runner neither CPU nor memory.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use runner_core::WatchSpec;
use runner_core::backend::KeptLink;
use runner_core::watch_types::WorkspaceCheckpointFile;
use runner_workspace::checkpoint as stored_form;
use runner_workspace_service::client::{CheckpointFetchError, WorkspaceClient};
use serde::{Deserialize, Serialize};

use crate::cluster::api_error::{api_reason, is_not_found};
use crate::pod::labels::{
    MANAGED_BY_LABEL, MODE_LABEL, REPLICA_ANNOTATION, SESSION_ID_LABEL, WATCH_MODE,
};

/// The record's key in the Secret.
const RECORD_KEY: &str = "record.json";
/// The files' key: gzip of `[WorkspaceCheckpointFile]` as JSON.
const FILES_KEY: &str = "workspace.json.gz";
/// The session's share links' key: `[KeptLink]` as JSON.
const LINKS_KEY: &str = "links.json";
/// What the links may take: a session's most links, each well under this.
const LINKS_ROOM: usize = LINKS_KEY.len() + runner_core::session::links::MAX_LINKS * 256;
/// The most a Secret's data holds, keys and values together (the
/// apiserver refuses a larger one with 422).
pub const SECRET_MAX_BYTES: usize = 1024 * 1024;
/// The most a stored checkpoint may expand to when read back (bounds a
/// Secret edited into a decompression bomb).
const MAX_EXPANDED_BYTES: u64 = 256 * 1024 * 1024;

/// What a session's Secret records besides its files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRecord {
    pub spec: WatchSpec,
    /// How many runner processes held the session before this one.
    pub generation: u32,
    /// The workspace service's bearer token.
    pub token: String,
    /// The pooled pod the session runs on, when one was claimed for it
    /// (`None`: its pod is `telo-watch-<id>` with `app-<name>` containers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooled: Option<PooledPod>,
}

/// A claimed pooled watch pod: its name, and the session app its one app
/// container runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PooledPod {
    pub pod: String,
    pub app: String,
    pub container: String,
}

impl WatchRecord {
    /// The name of the session's pod.
    pub fn pod_name(&self) -> String {
        match &self.pooled {
            Some(pooled) => pooled.pod.clone(),
            None => crate::pod::watch::watch_pod_name(&self.spec.session_id),
        }
    }

    /// The container of app `app` on the session's pod.
    pub fn container_of(&self, app: &str) -> String {
        match &self.pooled {
            Some(pooled) if pooled.app == app => pooled.container.clone(),
            _ => crate::pod::watch::app_container(app),
        }
    }
}

/// Why a checkpoint could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "the workspace is {compressed} bytes compressed and the session's record {record} bytes; a checkpoint in the cluster holds at most {SECRET_MAX_BYTES} bytes together (a Secret's 1 MiB)"
    )]
    TooLarge { compressed: u64, record: usize },
    #[error("could not read the workspace: {0}")]
    Workspace(String),
    #[error("could not store the checkpoint: {0}")]
    Api(String),
    #[error("could not encode the checkpoint: {0}")]
    Encode(String),
}

/// The name of a session's Secret.
pub fn secret_name(session_id: &str) -> String {
    format!("telo-watch-{session_id}")
}

pub struct Checkpoints {
    secrets: Api<Secret>,
    managed_by: String,
    /// The replica a new record names as its owner (several replicas).
    replica: Option<String>,
}

impl Checkpoints {
    pub fn new(secrets: Api<Secret>, managed_by: String, replica: Option<String>) -> Self {
        Self {
            secrets,
            managed_by,
            replica,
        }
    }

    /// The records' API (a replica claims a record with it).
    pub fn api(&self) -> &Api<Secret> {
        &self.secrets
    }

    fn selector(&self) -> String {
        format!(
            "{MANAGED_BY_LABEL}={},{MODE_LABEL}={WATCH_MODE}",
            self.managed_by
        )
    }

    /// A new session's Secret, with its record and no files yet.
    pub async fn create(&self, record: &WatchRecord) -> Result<(), kube::Error> {
        let id = &record.spec.session_id;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name(id)),
                labels: Some(
                    [
                        (MANAGED_BY_LABEL.to_owned(), self.managed_by.clone()),
                        (SESSION_ID_LABEL.to_owned(), id.clone()),
                        (MODE_LABEL.to_owned(), WATCH_MODE.to_owned()),
                    ]
                    .into(),
                ),
                annotations: self.replica.as_ref().map(|replica| {
                    BTreeMap::from([(REPLICA_ANNOTATION.to_owned(), replica.clone())])
                }),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".to_owned()),
            data: Some(BTreeMap::from([(
                RECORD_KEY.to_owned(),
                ByteString(encode_record(record)),
            )])),
            ..Secret::default()
        };
        self.secrets.create(&PostParams::default(), &secret).await?;
        Ok(())
    }

    /// Rewrites the record (a new app set, a new generation).
    pub async fn save_record(&self, record: &WatchRecord) -> Result<(), kube::Error> {
        self.patch(&record.spec.session_id, RECORD_KEY, encode_record(record))
            .await
    }

    /// Stores the workspace's files, as they are now, as the session's
    /// checkpoint: compressed by the workspace service when it can (read
    /// only when they fit), else snapshotted and compressed here, off the
    /// async workers.
    pub async fn save_from(
        &self,
        record: &WatchRecord,
        client: &WorkspaceClient,
    ) -> Result<(), CheckpointError> {
        let room = room_for_files(record);
        let stored = match client.checkpoint(room as u64).await {
            Ok(stored) => stored,
            Err(CheckpointFetchError::TooLarge { bytes }) => {
                return Err(CheckpointError::TooLarge {
                    compressed: bytes,
                    record: record_size(record),
                });
            }
            Err(CheckpointFetchError::NotServed) => {
                let files = client
                    .snapshot()
                    .await
                    .map_err(|err| CheckpointError::Workspace(err.message))?;
                return self.save_files(record, files).await;
            }
            Err(CheckpointFetchError::Failed(err)) => {
                return Err(CheckpointError::Workspace(err.message));
            }
        };
        self.store(record, stored).await
    }

    /// Stores `files` as the session's checkpoint.
    pub async fn save_files(
        &self,
        record: &WatchRecord,
        files: Vec<WorkspaceCheckpointFile>,
    ) -> Result<(), CheckpointError> {
        let stored = tokio::task::spawn_blocking(move || stored_form::encode(&files))
            .await
            .map_err(|err| CheckpointError::Encode(err.to_string()))?
            .map_err(|err| CheckpointError::Encode(err.to_string()))?;
        self.store(record, stored).await
    }

    /// Writes the compressed files beside `record`, when the two fit in one
    /// Secret.
    async fn store(&self, record: &WatchRecord, stored: Vec<u8>) -> Result<(), CheckpointError> {
        if stored.len() > room_for_files(record) {
            return Err(CheckpointError::TooLarge {
                compressed: stored.len() as u64,
                record: record_size(record),
            });
        }
        self.patch(&record.spec.session_id, FILES_KEY, stored)
            .await
            .map_err(|err| CheckpointError::Api(api_reason(&err)))
    }

    async fn patch(&self, session_id: &str, key: &str, value: Vec<u8>) -> Result<(), kube::Error> {
        // ByteString serializes as the base64 a Secret's data holds.
        let patch = serde_json::json!({"data": {key: ByteString(value)}});
        self.secrets
            .patch(
                &secret_name(session_id),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    /// The session's record and its files (`None`: never checkpointed);
    /// `Ok(None)` when the session has no Secret.
    #[allow(clippy::type_complexity)]
    pub async fn load(
        &self,
        session_id: &str,
    ) -> Result<Option<(WatchRecord, Option<Vec<WorkspaceCheckpointFile>>)>, String> {
        let secret = match self.secrets.get(&secret_name(session_id)).await {
            Ok(secret) => secret,
            Err(err) if is_not_found(&err) => return Ok(None),
            Err(err) => return Err(api_reason(&err)),
        };
        let Some(record) = record_of(&secret) else {
            return Err(format!(
                "the checkpoint of session '{session_id}' is not one this runner wrote"
            ));
        };
        let files = match secret.data.as_ref().and_then(|d| d.get(FILES_KEY)) {
            Some(bytes) => {
                let bytes = bytes.0.clone();
                let decoded = tokio::task::spawn_blocking(move || {
                    stored_form::decode(&bytes, MAX_EXPANDED_BYTES)
                })
                .await
                .map_err(|err| format!("the checkpoint cannot be read: {err}"))?;
                Some(decoded.map_err(|err| err.to_string())?)
            }
            None => None,
        };
        Ok(Some((record, files)))
    }

    /// Whether the session has stored files to resume from.
    /// Keeps the session's share links (the whole list) in its Secret.
    pub async fn save_links(
        &self,
        session_id: &str,
        links: &[KeptLink],
    ) -> Result<(), kube::Error> {
        let json = serde_json::to_vec(links).map_err(kube::Error::SerdeError)?;
        self.patch(session_id, LINKS_KEY, json).await
    }

    pub async fn has_files(&self, session_id: &str) -> bool {
        self.secrets
            .get(&secret_name(session_id))
            .await
            .is_ok_and(|secret| {
                secret
                    .data
                    .as_ref()
                    .is_some_and(|data| data.contains_key(FILES_KEY))
            })
    }

    /// Every session record this runner's Secrets hold, with whether each
    /// has files; Secrets that are not well-formed records are skipped.
    pub async fn list(&self) -> Result<Vec<Kept>, kube::Error> {
        let listed = self
            .secrets
            .list(&ListParams::default().labels(&self.selector()))
            .await?;
        Ok(listed
            .items
            .iter()
            .filter_map(|secret| {
                let record = record_of(secret)?;
                let has_files = secret
                    .data
                    .as_ref()
                    .is_some_and(|data| data.contains_key(FILES_KEY));
                let links = links_of(secret, &record.spec.session_id);
                let mut meta = secret.metadata.clone();
                meta.managed_fields = None;
                Some(Kept {
                    record,
                    has_files,
                    links,
                    meta,
                })
            })
            .collect())
    }

    pub async fn delete(&self, session_id: &str) -> Result<(), kube::Error> {
        match self
            .secrets
            .delete(&secret_name(session_id), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if is_not_found(&err) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

fn encode_record(record: &WatchRecord) -> Vec<u8> {
    serde_json::to_vec(record).unwrap_or_default()
}

/// The record of a Secret, checked: it must name the session its label and
/// name say, since anyone with access to the namespace can edit it.
fn record_of(secret: &Secret) -> Option<WatchRecord> {
    let bytes = secret.data.as_ref()?.get(RECORD_KEY)?;
    let record: WatchRecord = serde_json::from_slice(&bytes.0).ok()?;
    let name = secret.metadata.name.as_deref()?;
    (name == secret_name(&record.spec.session_id)
        && runner_core::ids::is_session_id(&record.spec.session_id)
        && record.token.len() >= 32)
        .then_some(record)
}

/// The record's size as stored.
/// A session a Secret keeps: its record, whether it holds files, and its
/// share links.
#[derive(Debug)]
pub struct Kept {
    pub record: WatchRecord,
    pub has_files: bool,
    pub links: Vec<KeptLink>,
    /// The Secret's metadata: its owner and resourceVersion.
    pub meta: ObjectMeta,
}

/// The links a Secret keeps; none when it has none, and none (said) when
/// the key was edited into something else.
fn links_of(secret: &Secret, session_id: &str) -> Vec<KeptLink> {
    let Some(bytes) = secret.data.as_ref().and_then(|data| data.get(LINKS_KEY)) else {
        return Vec::new();
    };
    serde_json::from_slice(&bytes.0).unwrap_or_else(|err| {
        tracing::warn!(session_id, error = %err, "a watch session's links are not a list of links; they are dropped");
        Vec::new()
    })
}

fn record_size(record: &WatchRecord) -> usize {
    encode_record(record).len()
}

/// What the files may take in the Secret beside `record` and the two keys.
fn room_for_files(record: &WatchRecord) -> usize {
    SECRET_MAX_BYTES
        .saturating_sub(RECORD_KEY.len() + record_size(record) + FILES_KEY.len() + LINKS_ROOM)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_core::WatchSpec;

    fn record(env_bytes: usize) -> WatchRecord {
        let spec: WatchSpec = serde_json::from_value(serde_json::json!({
            "session_id": "s",
            "created_at": "now",
            "apps": [],
            "env": [["BIG", "x".repeat(env_bytes)]],
            "config": {"image": "telorun/node:0-slim", "pullPolicy": "missing"},
        }))
        .expect("a watch spec");
        WatchRecord {
            spec,
            generation: 0,
            token: "t".repeat(32),
            pooled: None,
        }
    }

    #[test]
    fn the_room_for_files_is_what_the_record_leaves_of_a_secret() {
        let small = record(0);
        let large = record(700 * 1024);
        assert_eq!(
            room_for_files(&small),
            SECRET_MAX_BYTES
                - RECORD_KEY.len()
                - FILES_KEY.len()
                - record_size(&small)
                - LINKS_ROOM
        );
        assert!(room_for_files(&large) < SECRET_MAX_BYTES - 700 * 1024);
    }
}
