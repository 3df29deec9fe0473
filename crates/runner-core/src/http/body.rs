//! Reading a JSON request body: size limit, content type, parse. Validation of
//! the parsed value is `runner_api::validate`'s job.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use serde_json::Value;

use super::ServerOptions;
use super::error::{ApiError, ErrorCode};

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("Request body is too large (the limit is {limit} bytes)")]
    TooLarge { limit: usize },
    #[error("The request body did not arrive within {secs} s")]
    Timeout { secs: u64 },
    #[error("Body cannot be empty when content-type is set to 'application/json'")]
    EmptyJson,
    #[error("Unsupported Media Type: {content_type}; send the body as application/json")]
    NotJson { content_type: String },
    #[error("Body is not valid JSON: {0}")]
    InvalidJson(serde_json::Error),
}

impl From<BodyError> for ApiError {
    fn from(err: BodyError) -> Self {
        let code = match err {
            BodyError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            BodyError::Timeout { .. } => ErrorCode::RequestTimeout,
            BodyError::EmptyJson => ErrorCode::EmptyJsonBody,
            BodyError::NotJson { .. } => ErrorCode::UnsupportedMediaType,
            BodyError::InvalidJson(_) => ErrorCode::InvalidJson,
        };
        ApiError::new(code, err.to_string())
    }
}

/// The parsed body, or `None` when the request carried none. A body over
/// `max_body_bytes` is a 413; one that has not arrived in full within
/// `body_timeout` is a 408 (a client trickling bytes must not hold a
/// connection and its buffer for ever).
pub async fn read_json_body(
    headers: &HeaderMap,
    body: Body,
    options: &ServerOptions,
) -> Result<Option<Value>, ApiError> {
    let limit = options.max_body_bytes;
    let too_large = || BodyError::TooLarge { limit };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large().into());
    }
    let timeout = options.body_timeout;
    let bytes = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| BodyError::Timeout {
            secs: timeout.as_secs(),
        })?
        .map_err(|_| too_large())?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let is_json = content_type.as_deref().is_some_and(is_json_media_type);
    let bytes_len = bytes.len();
    if bytes.is_empty() {
        if is_json {
            return Err(BodyError::EmptyJson.into());
        }
        return Ok(None);
    }
    if !is_json {
        return Err(BodyError::NotJson {
            content_type: content_type.unwrap_or_else(|| "none".to_owned()),
        }
        .into());
    }
    let parse = move || {
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(BodyError::InvalidJson)
    };
    off_the_runtime_when(bytes_len >= LARGE_BODY_BYTES, parse).await
}

/// Bodies at least this big are parsed on Tokio's blocking pool: a
/// 1.5 MB bundle of 23,500 files takes tens of milliseconds to parse and
/// check, during which a runtime thread would answer nothing else (`/livez`
/// included); smaller ones are not worth the hand-over.
pub const LARGE_BODY_BYTES: usize = 64 * 1024;

/// Runs `work` on the blocking pool when `large`, else right here.
pub async fn off_the_runtime_when<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    large: bool,
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    if !large {
        return work().map_err(Into::into);
    }
    let done = tokio::task::spawn_blocking(work).await.map_err(|err| {
        ApiError::new(
            ErrorCode::InternalError,
            format!("reading the request was interrupted: {err}"),
        )
    })?;
    done.map_err(Into::into)
}

fn is_json_media_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}
