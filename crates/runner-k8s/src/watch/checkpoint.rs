//! Where a watch session outlives its pod and the runner: one Secret per
//! session, `telo-watch-<id>`, in the session namespace.
//!
//! It is written when the session starts (its record: the spec, the
//! workspace token, how many runners held it) and again at every checkpoint
//! (the workspace's files, gzip-compressed JSON). A Secret, not a
//! ConfigMap, because both hold what the session's user wrote and the
//! record holds the session's environment and token.
//!
//! A Secret holds at most 1 MiB. A workspace whose compressed files do not
//! fit ([`MAX_CHECKPOINT_BYTES`]) cannot be checkpointed: the checkpoint
//! fails with a message saying so, the last good checkpoint stays, and an
//! idle session that cannot be checkpointed is not suspended (it keeps
//! running until its lifetime limit) — nothing is lost silently.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use runner_core::WatchSpec;
use runner_core::watch_types::WorkspaceCheckpointFile;
use serde::{Deserialize, Serialize};

use crate::api_error::{api_reason, is_not_found};
use crate::session_record::{MANAGED_BY_LABEL, SESSION_ID_LABEL};
use crate::watch::pod::{MODE_LABEL, WATCH_MODE};

/// The record's key in the Secret.
const RECORD_KEY: &str = "record.json";
/// The files' key: gzip of `[WorkspaceCheckpointFile]` as JSON.
const FILES_KEY: &str = "workspace.json.gz";
/// The most compressed workspace a checkpoint takes: a Secret's 1 MiB less
/// room for the record.
pub const MAX_CHECKPOINT_BYTES: usize = 1024 * 1024 - 64 * 1024;
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
}

/// Why a checkpoint could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "the workspace is {compressed} bytes compressed; a checkpoint in the cluster holds at most {MAX_CHECKPOINT_BYTES} (a Secret's 1 MiB)"
    )]
    TooLarge { compressed: usize },
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
}

impl Checkpoints {
    pub fn new(secrets: Api<Secret>, managed_by: String) -> Self {
        Self {
            secrets,
            managed_by,
        }
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

    /// Stores the workspace's files as the session's checkpoint.
    pub async fn save_files(
        &self,
        session_id: &str,
        files: &[WorkspaceCheckpointFile],
    ) -> Result<(), CheckpointError> {
        let compressed = compress(files)?;
        if compressed.len() > MAX_CHECKPOINT_BYTES {
            return Err(CheckpointError::TooLarge {
                compressed: compressed.len(),
            });
        }
        self.patch(session_id, FILES_KEY, compressed)
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
            Some(bytes) => Some(decompress(&bytes.0)?),
            None => None,
        };
        Ok(Some((record, files)))
    }

    /// Whether the session has stored files to resume from.
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
    pub async fn list(&self) -> Result<Vec<(WatchRecord, bool)>, kube::Error> {
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
                Some((record, has_files))
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

fn compress(files: &[WorkspaceCheckpointFile]) -> Result<Vec<u8>, CheckpointError> {
    let json = serde_json::to_vec(files).map_err(|err| CheckpointError::Encode(err.to_string()))?;
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder
        .write_all(&json)
        .and_then(|()| encoder.finish())
        .map_err(|err| CheckpointError::Encode(err.to_string()))
}

fn decompress(bytes: &[u8]) -> Result<Vec<WorkspaceCheckpointFile>, String> {
    let mut json = Vec::new();
    GzDecoder::new(bytes)
        .take(MAX_EXPANDED_BYTES)
        .read_to_end(&mut json)
        .map_err(|err| format!("the checkpoint cannot be read: {err}"))?;
    serde_json::from_slice(&json).map_err(|err| format!("the checkpoint cannot be read: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_core::watch_types::FileEncoding;

    #[test]
    fn files_survive_compression_and_a_bomb_is_bounded() {
        let files = vec![WorkspaceCheckpointFile {
            path: "telo.yaml".into(),
            hash: "h".into(),
            content: "kind: Telo.Application\n".repeat(1000),
            encoding: FileEncoding::Utf8,
        }];
        let compressed = compress(&files).expect("compresses");
        assert!(compressed.len() < 2000, "{}", compressed.len());
        assert_eq!(decompress(&compressed).expect("reads"), files);
        assert!(decompress(b"not gzip").is_err());
    }
}
