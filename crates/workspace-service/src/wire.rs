//! The bodies of the service's own routes; the workspace types themselves
//! are `runner_api::watch`'s.

use runner_api::types::BundleFile;
use runner_api::watch::WorkspaceCheckpointFile;
use serde::{Deserialize, Serialize};

/// `GET /v1/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub ok: bool,
}

/// `POST /v1/seed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedBody {
    pub files: Vec<BundleFile>,
}

/// `GET /v1/snapshot` and `POST /v1/restore`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointBody {
    pub files: Vec<WorkspaceCheckpointFile>,
}

/// Every error: a code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}
