//! `metav1.Status` error bodies, shaped exactly as the apiserver writes them
//! (`k8s.io/apimachinery/pkg/api/errors`): the same code, `reason`, message
//! wording and `details` for every failure a client can see.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// A failed API request: the HTTP code and the `Status` object sent as body.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Box<Value>>,
    /// `Retry-After` seconds for 429/503 answers.
    pub retry_after_seconds: Option<u64>,
}

/// A group-qualified resource as the apiserver prints it: `pods`,
/// `ingresses.networking.k8s.io`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupResource<'a> {
    pub group: &'a str,
    pub resource: &'a str,
}

impl std::fmt::Display for GroupResource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// One field error of a `422 Invalid` answer (`field.Error`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FieldErrorKind {
    /// `Invalid value: <value>` — the value is shown as Go's `%#v` would.
    Invalid(Value),
    Required,
    Forbidden,
    Duplicate(Value),
    NotSupported(Value, Vec<String>),
    NotFound(Value),
    /// `Invalid value: <raw>` printed verbatim (Go's `0x0` for an unset number).
    InvalidRaw(String),
    /// `Too long: must have at most <n> bytes`.
    TooLongBytes(usize),
}

impl FieldError {
    pub fn invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Invalid(value),
            detail: detail.into(),
        }
    }

    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Required,
            detail: detail.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Forbidden,
            detail: detail.into(),
        }
    }

    pub fn duplicate(field: impl Into<String>, value: Value) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Duplicate(value),
            detail: String::new(),
        }
    }

    pub fn not_supported(field: impl Into<String>, value: Value, supported: &[&str]) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::NotSupported(
                value,
                supported.iter().map(|s| s.to_string()).collect(),
            ),
            detail: String::new(),
        }
    }

    /// Shows the invalid value verbatim instead of JSON-quoted.
    pub fn with_raw_value(mut self, raw: &str) -> Self {
        self.kind = FieldErrorKind::InvalidRaw(raw.to_string());
        self
    }

    /// `field.Error.Type` as it appears in `details.causes[].reason`.
    pub fn cause_type(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
            FieldErrorKind::NotSupported(..) => "FieldValueNotSupported",
            FieldErrorKind::NotFound(_) => "FieldValueNotFound",
            FieldErrorKind::InvalidRaw(_) => "FieldValueInvalid",
            FieldErrorKind::TooLongBytes(_) => "FieldValueTooLong",
        }
    }

    /// `field.Error.ErrorBody()`.
    pub fn body(&self) -> String {
        let with_detail = |head: String| {
            if self.detail.is_empty() {
                head
            } else {
                format!("{head}: {}", self.detail)
            }
        };
        match &self.kind {
            FieldErrorKind::Invalid(v) => with_detail(format!("Invalid value: {}", go_value(v))),
            FieldErrorKind::Required => with_detail("Required value".to_string()),
            FieldErrorKind::Forbidden => with_detail("Forbidden".to_string()),
            FieldErrorKind::Duplicate(v) => {
                with_detail(format!("Duplicate value: {}", go_value(v)))
            }
            FieldErrorKind::NotSupported(v, supported) => {
                let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                with_detail(format!(
                    "Unsupported value: {}: supported values: {}",
                    go_value(v),
                    quoted.join(", ")
                ))
            }
            FieldErrorKind::NotFound(v) => with_detail(format!("Not found: {}", go_value(v))),
            FieldErrorKind::InvalidRaw(raw) => with_detail(format!("Invalid value: {raw}")),
            FieldErrorKind::TooLongBytes(max) => {
                with_detail(format!("Too long: must have at most {max} bytes"))
            }
        }
    }

    /// `field.Error.Error()`: `<field>: <body>`.
    pub fn message(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

/// How `%#v`-ish formatting shows a value in a field error: strings quoted,
/// numbers and booleans bare.
fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".to_string(),
        other => other.to_string(),
    }
}

impl ApiError {
    fn new(code: u16, reason: &str, message: impl Into<String>, details: Option<Value>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: details.map(Box::new),
            retry_after_seconds: None,
        }
    }

    fn details(name: &str, gr: GroupResource<'_>) -> Value {
        let mut d = Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if !gr.group.is_empty() {
            d.insert("group".into(), json!(gr.group));
        }
        d.insert("kind".into(), json!(gr.resource));
        Value::Object(d)
    }

    /// `404 NotFound`: `pods "x" not found`.
    pub fn not_found(gr: GroupResource<'_>, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{gr} {name:?} not found"),
            Some(Self::details(name, gr)),
        )
    }

    /// `404` for a path the server does not serve at all.
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        )
    }

    /// `409 AlreadyExists`: `pods "x" already exists`.
    pub fn already_exists(gr: GroupResource<'_>, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{gr} {name:?} already exists"),
            Some(Self::details(name, gr)),
        )
    }

    /// `409 Conflict` for a stale `resourceVersion`.
    pub fn conflict(gr: GroupResource<'_>, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {gr} {name:?}: {why}"),
            Some(Self::details(name, gr)),
        )
    }

    pub const CONFLICT_MODIFIED: &'static str = "the object has been modified; please apply your changes to the latest version and try again";

    /// `422 Invalid`: `Pod "x" is invalid: <errors>`; `qualified_kind` is
    /// `Pod` or `Ingress.networking.k8s.io`.
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let message = match errors {
            [] => format!("{qualified} {name:?} is invalid"),
            [one] => format!("{qualified} {name:?} is invalid: {}", one.message()),
            many => {
                let all: Vec<String> = many.iter().map(FieldError::message).collect();
                format!("{qualified} {name:?} is invalid: [{}]", all.join(", "))
            }
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.cause_type(), "message": e.body(), "field": e.field}))
            .collect();
        let mut d = Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        if !kind.is_empty() {
            d.insert("kind".into(), json!(kind));
        }
        d.insert("causes".into(), Value::Array(causes));
        Self::new(422, "Invalid", message, Some(Value::Object(d)))
    }

    /// `403 Forbidden`: `pods "x" is forbidden: <why>` (no name: `pods is forbidden: …`).
    pub fn forbidden(gr: GroupResource<'_>, name: &str, why: &str) -> Self {
        let message = if name.is_empty() {
            format!("{gr} is forbidden: {why}")
        } else {
            format!("{gr} {name:?} is forbidden: {why}")
        };
        Self::new(403, "Forbidden", message, Some(Self::details(name, gr)))
    }

    /// `401 Unauthorized`, as the apiserver answers a request whose
    /// credentials no authenticator accepts (anonymous access off).
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized", None)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message, None)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            Some(json!({})),
        )
    }

    /// `410 Expired` (too-old resourceVersion or continue token).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message, None)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
            None,
        )
    }

    /// `415` for a request body in a media type the resource does not
    /// decode: the apiserver's `errUnsupportedMediaType`, listing what it
    /// accepts (JSON, YAML and, for built-in kinds, protobuf).
    pub fn unsupported_body_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
            None,
        )
    }

    /// `406` when no media type the client accepts can be produced: the
    /// apiserver's `errNotAcceptable`.
    pub fn not_acceptable(accepted: &[&str]) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: {}",
                accepted.join(", ")
            ),
            None,
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
            None,
        )
    }

    /// A code chosen by fault injection, with the reason the apiserver pairs
    /// with that code.
    pub fn injected(code: u16, message: Option<String>) -> Self {
        let reason = reason_for_code(code);
        let message =
            message.unwrap_or_else(|| format!("kube-sim injected fault ({code} {reason})"));
        let mut err = Self::new(code, reason, message, Some(json!({})));
        if code == 429 || code == 503 {
            err.retry_after_seconds = Some(1);
            err.details = Some(Box::new(json!({"retryAfterSeconds": 1})));
        }
        err
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = Map::new();
        s.insert("kind".into(), json!("Status"));
        s.insert("apiVersion".into(), json!("v1"));
        s.insert("metadata".into(), json!({}));
        s.insert("status".into(), json!("Failure"));
        s.insert("message".into(), json!(self.message));
        s.insert("reason".into(), json!(self.reason));
        if let Some(d) = &self.details {
            s.insert("details".into(), (**d).clone());
        }
        s.insert("code".into(), json!(self.code));
        Value::Object(s)
    }
}

/// The `reason` the apiserver reports for a bare HTTP code.
pub fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_status().to_string();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after_seconds
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: GroupResource<'static> = GroupResource {
        group: "",
        resource: "pods",
    };

    #[test]
    fn not_found_matches_the_apiserver_shape() {
        let s = ApiError::not_found(PODS, "telo-run-x").to_status();
        assert_eq!(
            s,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "message":"pods \"telo-run-x\" not found","reason":"NotFound",
                   "details":{"name":"telo-run-x","kind":"pods"},"code":404})
        );
    }

    #[test]
    fn group_resources_are_qualified() {
        let gr = GroupResource {
            group: "networking.k8s.io",
            resource: "ingresses",
        };
        let e = ApiError::already_exists(gr, "a");
        assert_eq!(
            e.message,
            "ingresses.networking.k8s.io \"a\" already exists"
        );
    }

    #[test]
    fn invalid_lists_several_errors_in_brackets() {
        let errs = [
            FieldError::required("spec.containers", ""),
            FieldError::invalid("metadata.name", json!("A"), "bad"),
        ];
        let e = ApiError::invalid("", "Pod", "A", &errs);
        assert_eq!(
            e.message,
            "Pod \"A\" is invalid: [spec.containers: Required value, metadata.name: Invalid value: \"A\": bad]"
        );
        assert_eq!(e.code, 422);
    }

    #[test]
    fn forbidden_without_a_name_omits_it() {
        let e = ApiError::forbidden(PODS, "", "User \"u\" cannot list resource \"pods\"");
        assert_eq!(
            e.message,
            "pods is forbidden: User \"u\" cannot list resource \"pods\""
        );
    }
}
