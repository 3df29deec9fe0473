//! The runner's side: [`WorkspaceClient`] speaks to one session's service.
//!
//! A service error comes back as the status, code and message the service
//! gave, its code mapped back to `runner-workspace`'s kinds; anything else
//! (a refused token, a code this client does not know, a connection that
//! failed or timed out, a body that is not what the route answers) is a
//! 500 `workspace_failed`, since none of it is the editor's doing. Answers
//! are read up to a bound, so a misbehaving service cannot make the runner
//! buffer without end.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode, Url};
use runner_api::types::BundleFile;
use runner_api::watch::{
    WorkspaceApplyResult, WorkspaceChangeSet, WorkspaceCheckpointFile, WorkspaceFileContent,
    WorkspaceTree,
};
use runner_core::WorkspaceFailure;
use runner_workspace::{ErrorKind, WorkspaceLimits};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::body_cap;
use crate::wire::{CheckpointBody, ErrorBody, Health, SeedBody};

/// How long one request may take, answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest answer read by default: a snapshot of a workspace at the
/// default `RUNNER_WORKSPACE_MAX_BYTES`, in base64, with room for its JSON.
pub fn default_max_response_bytes() -> u64 {
    body_cap(WorkspaceLimits::default().max_workspace_bytes)
}

/// Why [`WorkspaceClient::checkpoint`] brought nothing back.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointFetchError {
    /// The stored form is `bytes` long, more than the caller can store.
    #[error("the workspace's checkpoint is {bytes} bytes compressed")]
    TooLarge { bytes: u64 },
    /// The service has no checkpoint route (an older one).
    #[error("the workspace service does not make checkpoints")]
    NotServed,
    #[error(transparent)]
    Failed(#[from] WorkspaceFailure),
}

/// A client for one session's workspace service.
#[derive(Clone)]
pub struct WorkspaceClient {
    http: reqwest::Client,
    addr: SocketAddr,
    token: String,
    max_response_bytes: u64,
}

impl std::fmt::Debug for WorkspaceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceClient")
            .field("addr", &self.addr)
            .field("token", &"<redacted>")
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl WorkspaceClient {
    /// A client of the service at `addr` (plain HTTP inside the cluster),
    /// sending `token`.
    pub fn new(http: reqwest::Client, addr: SocketAddr, token: String) -> Self {
        WorkspaceClient {
            http,
            addr,
            token,
            max_response_bytes: default_max_response_bytes(),
        }
    }

    /// Reads answers up to `limits`' snapshot size instead of the default
    /// limits' (the runner's own `RUNNER_WORKSPACE_MAX_BYTES`).
    pub fn with_limits(mut self, limits: &WorkspaceLimits) -> Self {
        self.max_response_bytes = body_cap(limits.max_workspace_bytes);
        self
    }

    /// The service's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn url(&self, path: &str, file: Option<&str>) -> Result<Url, WorkspaceFailure> {
        let mut url = Url::parse(&format!("http://{}{path}", self.addr)).map_err(|err| {
            WorkspaceFailure::unavailable(format!(
                "the session's workspace address {} does not make a URL: {err}",
                self.addr
            ))
        })?;
        if let Some(file) = file {
            url.query_pairs_mut().append_pair("path", file);
        }
        Ok(url)
    }

    /// Whether the service answers `GET /v1/health` with `{"ok":true}`.
    pub async fn health(&self) -> bool {
        let Ok(url) = self.url("/v1/health", None) else {
            return false;
        };
        let request = self.http.get(url).timeout(REQUEST_TIMEOUT);
        let Ok(response) = request.send().await else {
            return false;
        };
        if response.status() != StatusCode::OK {
            return false;
        }
        read_capped(response, 1024)
            .await
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Health>(&bytes).ok())
            .is_some_and(|health| health.ok)
    }

    /// `GET /v1/tree`.
    pub async fn tree(&self) -> Result<WorkspaceTree, WorkspaceFailure> {
        let url = self.url("/v1/tree", None)?;
        decode(&self.send(self.http.get(url)).await?)
    }

    /// `GET /v1/file?path=`.
    pub async fn read_file(&self, path: &str) -> Result<WorkspaceFileContent, WorkspaceFailure> {
        let url = self.url("/v1/file", Some(path))?;
        decode(&self.send(self.http.get(url)).await?)
    }

    /// `POST /v1/apply`.
    pub async fn apply(
        &self,
        changes: &WorkspaceChangeSet,
    ) -> Result<WorkspaceApplyResult, WorkspaceFailure> {
        let url = self.url("/v1/apply", None)?;
        decode(&self.send_json(Method::POST, url, changes).await?)
    }

    /// `POST /v1/touch?path=`.
    pub async fn touch(&self, path: &str) -> Result<(), WorkspaceFailure> {
        let url = self.url("/v1/touch", Some(path))?;
        self.send(self.http.post(url)).await.map(drop)
    }

    /// `POST /v1/seed`: the bundle's files and the marker.
    pub async fn seed(
        &self,
        files: &[BundleFile],
    ) -> Result<WorkspaceApplyResult, WorkspaceFailure> {
        let url = self.url("/v1/seed", None)?;
        let body = SeedBody {
            files: files.to_vec(),
        };
        decode(&self.send_json(Method::POST, url, &body).await?)
    }

    /// `GET /v1/snapshot`: every file of the tree, in base64.
    pub async fn snapshot(&self) -> Result<Vec<WorkspaceCheckpointFile>, WorkspaceFailure> {
        let url = self.url("/v1/snapshot", None)?;
        let body: CheckpointBody = decode(&self.send(self.http.get(url)).await?)?;
        Ok(body.files)
    }

    /// `GET /v1/checkpoint`: the workspace in a checkpoint's stored form
    /// (see `runner_workspace::checkpoint`), refused unread when its
    /// `Content-Length` is over `max_bytes`.
    pub async fn checkpoint(&self, max_bytes: u64) -> Result<Vec<u8>, CheckpointFetchError> {
        let url = self.url("/v1/checkpoint", None)?;
        let response = self.answer(self.http.get(url)).await?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            // A workspace service from before the route (a pod an older
            // runner made): the caller takes the snapshot instead.
            return Err(CheckpointFetchError::NotServed);
        }
        if !status.is_success() {
            let body = read_capped(response, 64 * 1024).await?;
            return Err(refused(status, &body).into());
        }
        match response.content_length() {
            Some(bytes) if bytes > max_bytes => Err(CheckpointFetchError::TooLarge { bytes }),
            // Without a length (never sent so by the service) it is read up
            // to one byte past the bound, never further.
            _ => {
                read_capped(response, max_bytes)
                    .await
                    .map_err(|_| CheckpointFetchError::TooLarge {
                        bytes: max_bytes.saturating_add(1),
                    })
            }
        }
    }

    /// `POST /v1/restore`: writes a checkpoint's files back.
    pub async fn restore(&self, files: &[WorkspaceCheckpointFile]) -> Result<(), WorkspaceFailure> {
        let url = self.url("/v1/restore", None)?;
        let body = CheckpointBody {
            files: files.to_vec(),
        };
        self.send_json(Method::POST, url, &body).await.map(drop)
    }

    async fn send_json<T: Serialize>(
        &self,
        method: Method,
        url: Url,
        body: &T,
    ) -> Result<Vec<u8>, WorkspaceFailure> {
        let bytes = serde_json::to_vec(body).map_err(|err| {
            WorkspaceFailure::unavailable(format!("could not encode the workspace request: {err}"))
        })?;
        let request = self
            .http
            .request(method, url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes);
        self.send(request).await
    }

    /// Sends `request` with the token and the timeout: its answer, unread.
    async fn answer(&self, request: RequestBuilder) -> Result<reqwest::Response, WorkspaceFailure> {
        request
            .bearer_auth(&self.token)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(did_not_answer)
    }

    /// Sends `request` with the token and the timeout; the answer's body on
    /// a 2xx, the failure it stands for otherwise.
    async fn send(&self, request: RequestBuilder) -> Result<Vec<u8>, WorkspaceFailure> {
        let response = self.answer(request).await?;
        let status = response.status();
        let body = read_capped(response, self.max_response_bytes).await?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(refused(status, &body))
        }
    }
}

fn did_not_answer(err: reqwest::Error) -> WorkspaceFailure {
    let reason = if err.is_timeout() {
        format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())
    } else {
        error_chain(&err)
    };
    WorkspaceFailure::unavailable(format!("the session's workspace did not answer: {reason}"))
}

/// An error and its sources, as one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The body, refusing one over `cap` bytes as it arrives.
async fn read_capped(
    mut response: reqwest::Response,
    cap: u64,
) -> Result<Vec<u8>, WorkspaceFailure> {
    let over = || {
        WorkspaceFailure::unavailable(format!(
            "the session's workspace answered with more than {cap} bytes"
        ))
    };
    if response.content_length().is_some_and(|length| length > cap) {
        return Err(over());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(did_not_answer)? {
        if (body.len() as u64).saturating_add(chunk.len() as u64) > cap {
            return Err(over());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WorkspaceFailure> {
    serde_json::from_slice(body).map_err(|err| {
        WorkspaceFailure::unavailable(format!(
            "the session's workspace answered with a body that does not parse: {err}"
        ))
    })
}

/// The failure a non-2xx answer stands for.
fn refused(status: StatusCode, body: &[u8]) -> WorkspaceFailure {
    let Ok(ErrorBody { error, message }) = serde_json::from_slice::<ErrorBody>(body) else {
        return WorkspaceFailure::unavailable(format!(
            "the session's workspace answered {status} without an error body"
        ));
    };
    match ErrorKind::from_code(&error) {
        Some(kind) => WorkspaceFailure::new(crate::cause(kind), message),
        None => WorkspaceFailure::unavailable(format!(
            "the session's workspace refused the request ({} {error}): {message}",
            status.as_u16()
        )),
    }
}
