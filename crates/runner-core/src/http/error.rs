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
use crate::backend_session::{StopError, WorkspaceCause, WorkspaceFailure};
use crate::registry::{AdmissionError, ResumeError, SetAppsError};

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
    /// `429 quota_exceeded` naming the quota, its value and the use.
    Quota(crate::tenancy::QuotaExceeded),
    /// `429 rate_limited` with `Retry-After`.
    RateLimited(crate::tenancy::RateLimited),
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

/// A path parameter that does not decode (`/v1/sessions/%ff`).
impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::PathRejection) -> Self {
        Self::new(ErrorCode::InvalidUrl, rejection.body_text())
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
            AdmissionError::QuotaExceeded(refusal) => return Self::Quota(refusal),
            AdmissionError::ShuttingDown => ErrorCode::ShuttingDown,
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
            ResumeError::QuotaExceeded(refusal) => return Self::Quota(refusal),
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

impl From<SetAppsError> for ApiError {
    fn from(err: SetAppsError) -> Self {
        let code = match err {
            SetAppsError::NotRunning => ErrorCode::NotRunning,
            SetAppsError::Failed(_) => ErrorCode::SetAppsFailed,
        };
        Self::new(code, err.to_string())
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

impl From<crate::tenancy::RateLimited> for ApiError {
    fn from(refusal: crate::tenancy::RateLimited) -> Self {
        Self::RateLimited(refusal)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::Quota(refusal) => (
                ErrorCode::QuotaExceeded.status(),
                Json(json!({
                    "error": ErrorCode::QuotaExceeded.as_str(),
                    "message": refusal.message,
                    "quota": refusal.quota,
                    "limit": refusal.limit,
                    "used": refusal.used,
                })),
            )
                .into_response(),
            Self::RateLimited(refusal) => {
                let retry_after = refusal.retry_after_seconds.to_string();
                let mut response = (
                    ErrorCode::RateLimited.status(),
                    Json(ErrorBody {
                        error: ErrorCode::RateLimited.as_str().to_owned(),
                        message: Some(refusal.to_string()),
                        terms: None,
                    }),
                )
                    .into_response();
                if let Ok(value) = axum::http::HeaderValue::from_str(&retry_after) {
                    response
                        .headers_mut()
                        .insert(axum::http::header::RETRY_AFTER, value);
                }
                response
            }
            Self::Json { code, message } => {
                let mut response = (
                    code.status(),
                    Json(ErrorBody {
                        error: code.as_str().to_owned(),
                        message: Some(message),
                        terms: None,
                    }),
                )
                    .into_response();
                if code.is_retry_soon() {
                    response.headers_mut().insert(
                        axum::http::header::RETRY_AFTER,
                        axum::http::HeaderValue::from_static("1"),
                    );
                }
                response
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    async fn wire(error: impl Into<ApiError>) -> (u16, Value) {
        let response = error.into().into_response();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        (status, serde_json::from_slice(&body).expect("JSON"))
    }

    /// Each admission refusal goes out with the status and code the
    /// handlers wrote before admission had its own module.
    #[tokio::test]
    async fn admission_refusals_keep_their_status_and_code() {
        let cases: Vec<(Refusal, u16, &str)> = vec![
            (Refusal::InvalidBundle("x".into()), 400, "invalid_bundle"),
            (
                Refusal::SupersededConfig { key: "image" },
                400,
                "invalid_config",
            ),
            (Refusal::WatchDisabled, 400, "watch_disabled"),
            (Refusal::AgentRequiresWatch, 400, "agent_requires_watch"),
            (
                Refusal::UnknownAgent {
                    agent: "a".into(),
                    offered: vec![],
                },
                400,
                "unknown_agent",
            ),
            (
                Refusal::AgentPortUndeclared { agent: "a".into() },
                400,
                "agent_port_undeclared",
            ),
            (
                Refusal::TooManyWatchSessions { max: 1 },
                409,
                "too_many_watch_sessions",
            ),
            (
                Refusal::IoWatchOnly {
                    app: "a".into(),
                    io: "streams",
                },
                400,
                "io_unsupported",
            ),
            (
                Refusal::AgentPortTaken {
                    owner: "a".into(),
                    port: 1,
                    agent: "b".into(),
                },
                400,
                "port_conflict",
            ),
            (
                Refusal::UnknownApp {
                    message: "m".into(),
                },
                404,
                "unknown_app",
            ),
            (Refusal::ClientEnv("m".into()), 400, "invalid_request"),
            (
                Refusal::Telo(TeloRefusal::Unsupported),
                400,
                "telo_version_unsupported",
            ),
        ];
        for (refusal, status, code) in cases {
            let message = refusal.to_string();
            let (got, body) = wire(refusal).await;
            assert_eq!((got, body["error"].as_str()), (status, Some(code)));
            assert_eq!(body["message"].as_str(), Some(message.as_str()));
        }
    }

    #[tokio::test]
    async fn a_workspace_failure_is_answered_by_its_cause() {
        let (status, body) = wire(WorkspaceFailure::unknown_app("api")).await;
        assert_eq!(
            (status, body),
            (
                404,
                json!({"error": "unknown_app", "message": "session runs no app named 'api'"})
            )
        );
        let (status, body) = wire(WorkspaceFailure::unavailable("gone")).await;
        assert_eq!(
            (status, body),
            (500, json!({"error": "workspace_failed", "message": "gone"}))
        );
    }
}
