//! The one error type at the HTTP edge: every runner-authored error is
//! `{ "error": <code>, "message": <text> }`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use runner_api::types::{ErrorBody, RunnerTerms};

#[derive(Debug)]
pub enum ApiError {
    Json {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
    TermsRequired(RunnerTerms),
    /// A refused telo version: `{error, message}` and, when it cannot be
    /// had, the `app`, `version` and `reason` a client shows.
    Telo(runner_api::telo::TeloRefusal),
    /// The framework-level "no such route" answer clients already know.
    RouteNotFound {
        method: String,
        uri: String,
    },
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::Json {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn session_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("session '{id}' not in registry"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::Json {
                status,
                code,
                message,
            } => (
                status,
                Json(ErrorBody {
                    error: code.to_owned(),
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
            Self::TermsRequired(terms) => (
                StatusCode::PRECONDITION_REQUIRED,
                Json(ErrorBody {
                    error: "terms_required".to_owned(),
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
