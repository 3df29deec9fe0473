//! The one error type at the HTTP edge: every runner-authored error is
//! `{ "error": <code>, "message": <text> }`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use runner_api::telo::TeloRefusal;
use runner_api::types::{ErrorBody, RunnerTerms};
use runner_api::validate::ValidationError;
use runner_api::watch::AppRefusal;

pub use super::error_code::ErrorCode;
use crate::admission::Refusal;
use crate::registry::{AdmissionError, ResumeError};
use crate::workload::{StopError, WorkspaceCause, WorkspaceFailure};

#[derive(Debug)]
pub enum ApiError {
    /// `{error, message}` with the code's status.
    Json {
        code: ErrorCode,
        message: String,
    },
    TermsRequired(RunnerTerms),
    /// A refused telo version: `{error, message}` and, when it cannot be
    /// had, the `app`, `version` and `reason` a client shows.
    Telo(runner_api::telo::TeloRefusal),
    /// An app set refused by the app rules: a `400` with the rule's code.
    Apps(AppRefusal),
    /// The framework-level "no such route" answer clients already know.
    RouteNotFound {
        method: String,
        uri: String,
    },
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Json {
            code,
            message: message.into(),
        }
    }

    pub fn session_not_found(id: &str) -> Self {
        Self::new(
            ErrorCode::NotFound,
            format!("session '{id}' not in registry"),
        )
    }
}

impl From<ValidationError> for ApiError {
    fn from(err: ValidationError) -> Self {
        Self::new(ErrorCode::InvalidRequest, err.message)
    }
}

impl From<TeloRefusal> for ApiError {
    fn from(refusal: TeloRefusal) -> Self {
        Self::Telo(refusal)
    }
}

impl From<AppRefusal> for ApiError {
    fn from(refusal: AppRefusal) -> Self {
        Self::Apps(refusal)
    }
}

impl From<AdmissionError> for ApiError {
    fn from(err: AdmissionError) -> Self {
        let code = match err {
            AdmissionError::TooManySessions { .. } => ErrorCode::TooManySessions,
            AdmissionError::TooManyWatchSessions { .. } => ErrorCode::TooManyWatchSessions,
        };
        Self::new(code, err.to_string())
    }
}

impl From<StopError> for ApiError {
    fn from(err: StopError) -> Self {
        Self::new(ErrorCode::StopFailed, err.message)
    }
}

impl From<ResumeError> for ApiError {
    fn from(err: ResumeError) -> Self {
        let code = match err {
            ResumeError::NotSuspended(_) => ErrorCode::NotSuspended,
            ResumeError::NoCheckpoint => ErrorCode::NoCheckpoint,
        };
        Self::new(code, err.to_string())
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let code = match &refusal {
            Refusal::Telo(refusal) => return Self::Telo(refusal.clone()),
            Refusal::Apps(refusal) => return Self::Apps(refusal.clone()),
            Refusal::InvalidBundle(_) => ErrorCode::InvalidBundle,
            Refusal::SupersededConfig { .. } | Refusal::InvalidConfig(_) => {
                ErrorCode::InvalidConfig
            }
            Refusal::WatchDisabled => ErrorCode::WatchDisabled,
            Refusal::AgentRequiresWatch => ErrorCode::AgentRequiresWatch,
            Refusal::UnknownAgent { .. } => ErrorCode::UnknownAgent,
            Refusal::AgentPortUndeclared { .. } => ErrorCode::AgentPortUndeclared,
            Refusal::TooManyWatchSessions { .. } => ErrorCode::TooManyWatchSessions,
            Refusal::IoNotOffered { .. } | Refusal::IoWatchOnly { .. } => ErrorCode::IoUnsupported,
            Refusal::AgentPortTaken { .. } => ErrorCode::PortConflict,
            Refusal::UnknownApp { .. } => ErrorCode::UnknownApp,
            Refusal::ClientEnv(_) => ErrorCode::InvalidRequest,
        };
        Self::new(code, refusal.to_string())
    }
}

impl From<WorkspaceCause> for ErrorCode {
    fn from(cause: WorkspaceCause) -> Self {
        match cause {
            WorkspaceCause::InvalidPath => ErrorCode::InvalidPath,
            WorkspaceCause::NotAFile => ErrorCode::NotAFile,
            WorkspaceCause::InvalidEncoding => ErrorCode::InvalidEncoding,
            WorkspaceCause::NotFound => ErrorCode::FileNotFound,
            WorkspaceCause::Conflict => ErrorCode::PathConflict,
            WorkspaceCause::TooLarge => ErrorCode::WorkspaceTooLarge,
            WorkspaceCause::Io => ErrorCode::WorkspaceIoFailed,
            WorkspaceCause::UnknownApp => ErrorCode::UnknownApp,
            WorkspaceCause::Unavailable => ErrorCode::WorkspaceFailed,
        }
    }
}

impl From<WorkspaceFailure> for ApiError {
    fn from(failure: WorkspaceFailure) -> Self {
        Self::new(failure.cause.into(), failure.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::Json { code, message } => (
                code.status(),
                Json(ErrorBody {
                    error: code.as_str().to_owned(),
                    message: Some(message),
                    terms: None,
                }),
            )
                .into_response(),
            Self::Telo(refusal) => {
                let mut body = json!({ "error": refusal.code(), "message": refusal.to_string() });
                if let Some(details) = refusal.details() {
                    body["app"] = json!(details.app);
                    body["version"] = json!(details.version);
                    body["reason"] = json!(details.reason);
                }
                (StatusCode::BAD_REQUEST, Json(body)).into_response()
            }
            Self::Apps(refusal) => (
                StatusCode::BAD_REQUEST,
                Json(ErrorBody {
                    error: refusal.code.to_owned(),
                    message: Some(refusal.message),
                    terms: None,
                }),
            )
                .into_response(),
            Self::TermsRequired(terms) => (
                ErrorCode::TermsRequired.status(),
                Json(ErrorBody {
                    error: ErrorCode::TermsRequired.as_str().to_owned(),
                    message: None,
                    terms: Some(terms),
                }),
            )
                .into_response(),
            Self::RouteNotFound { method, uri } => (
                StatusCode::NOT_FOUND,
                Json(json!({
                    "message": format!("Route {method}:{uri} not found"),
                    "error": "Not Found",
                    "statusCode": 404,
                })),
            )
                .into_response(),
        }
    }
}
