//! The `/v1` calls the terminal client makes, with the editor's reading of
//! each answer (docs/contract.md §1.3, §1.6): a 428 carries the terms, other errors carry
//! `message`.

use std::time::Duration;

use reqwest::StatusCode;
use runner_api::io::FrameFormat;
use runner_api::types::{
    ErrorBody, PullPolicy, RequestedConfig, RunnerCapabilities, RunnerTerms, SessionCreated,
    SessionList, SessionSnapshot,
};
use serde_json::Value;

/// Matches the editor's `start` timeout: the runner answers 201 before
/// starting anything, so only a sick runner takes this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("couldn't reach the runner at {base}: {}", unreachable_reason(source))]
    Unreachable {
        base: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the runner returned HTTP {status} on {path}: {message}")]
    Http {
        path: String,
        status: StatusCode,
        message: String,
    },
    #[error("the runner returned a malformed answer on {path}: {source}")]
    Malformed {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the runner refused the request without a valid token on {path}; pass --token or set TELO_RUNNER_TOKEN"
    )]
    Unauthorized { path: String },
    #[error("the runner requires accepting its usage terms")]
    TermsRequired { terms: Option<RunnerTerms> },
    #[error(
        "the runner refused the bundle as too large (HTTP 413): {message}. Its limit is lower than --max-body-bytes; remove large files or lower the flag to see which"
    )]
    TooLarge { message: String },
}

/// Why a runner could not be reached, in words that say what to do.
fn unreachable_reason(err: &reqwest::Error) -> String {
    if err.is_connect() {
        return format!(
            "nothing answers there ({}). Start a runner with `telo-runner serve` (a Kubernetes-backend runner listens on 8062 unless PORT says otherwise), or pass --runner with its URL",
            root_cause(err)
        );
    }
    if err.is_timeout() {
        return "it did not answer in time".to_owned();
    }
    root_cause(err)
}

/// The innermost error's text ("Connection refused (os error 111)"), not
/// the request wrapper's "error sending request for url …".
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The runner at `base` (no trailing slash).
#[derive(Debug, Clone)]
pub struct RunnerApi {
    pub base: String,
    token: Option<String>,
    http: reqwest::Client,
    /// How the runner lays out terminal frames, read once from its
    /// capabilities.
    frame_format: std::sync::Arc<tokio::sync::OnceCell<FrameFormat>>,
}

impl RunnerApi {
    /// `token` is sent as a bearer token when the runner requires one.
    pub fn new(base: &str, token: Option<String>) -> RunnerApi {
        let http = runner_core::http_client::client_builder()
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        RunnerApi {
            base: base.trim_end_matches('/').to_owned(),
            token: token.filter(|token| !token.is_empty()),
            http,
            frame_format: Default::default(),
        }
    }

    /// The runner's terminal frame layout: a list for `features.io` means
    /// tagged frames, `true` the 0.8 ones. A runner whose capabilities cannot
    /// be read is taken to speak the current wire.
    pub async fn frame_format(&self) -> FrameFormat {
        *self
            .frame_format
            .get_or_init(|| async {
                match self.capabilities().await {
                    Ok(capabilities) => FrameFormat::of_features(&capabilities.features),
                    Err(_) => FrameFormat::Tagged,
                }
            })
            .await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `ws://` or `wss://` for the same runner.
    pub fn ws_url(&self, path: &str) -> String {
        let base = if let Some(rest) = self.base.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = self.base.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            self.base.clone()
        };
        format!("{base}{path}")
    }

    /// The runner's host name, for endpoints that leave it to the client.
    pub fn host(&self) -> String {
        self.base
            .split("://")
            .nth(1)
            .and_then(|rest| rest.split(['/', ':']).next())
            .filter(|host| !host.is_empty())
            .unwrap_or("localhost")
            .to_owned()
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// A request to `path` carrying the token, if any.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, self.url(path))
            .timeout(REQUEST_TIMEOUT);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Like `request`, without the timeout (long-lived streams).
    pub fn stream_request(&self, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.get(self.url(path));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    fn unreachable(&self, source: reqwest::Error) -> ApiError {
        ApiError::Unreachable {
            base: self.base.clone(),
            source,
        }
    }

    async fn read(
        &self,
        path: &str,
        response: reqwest::Response,
    ) -> Result<(StatusCode, Value), ApiError> {
        let status = response.status();
        let text = response.text().await.map_err(|e| self.unreachable(e))?;
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok((status, body));
        }
        let error = serde_json::from_value::<ErrorBody>(body.clone()).ok();
        let message = error
            .as_ref()
            .and_then(|error| error.message.clone())
            .unwrap_or_else(|| body.as_str().unwrap_or_default().to_owned());
        match status {
            StatusCode::PRECONDITION_REQUIRED => Err(ApiError::TermsRequired {
                terms: error.and_then(|error| error.terms),
            }),
            StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::TooLarge { message }),
            StatusCode::UNAUTHORIZED => Err(ApiError::Unauthorized {
                path: path.to_owned(),
            }),
            _ => Err(ApiError::Http {
                path: path.to_owned(),
                status,
                message,
            }),
        }
    }

    fn parse<T: serde::de::DeserializeOwned>(path: &str, body: Value) -> Result<T, ApiError> {
        serde_json::from_value(body).map_err(|source| ApiError::Malformed {
            path: path.to_owned(),
            source,
        })
    }

    pub async fn capabilities(&self) -> Result<RunnerCapabilities, ApiError> {
        let path = "/v1/capabilities";
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let (_, body) = self.read(path, response).await?;
        Self::parse(path, body)
    }

    /// `body` is the serialized request, so its size is exactly what was checked.
    pub async fn create_session(
        &self,
        body: Vec<u8>,
        accepted_terms: Option<&str>,
    ) -> Result<SessionCreated, ApiError> {
        let path = "/v1/sessions";
        let mut request = self
            .request(reqwest::Method::POST, path)
            .header("content-type", "application/json")
            .body(body);
        if let Some(version) = accepted_terms {
            request = request.header("x-telo-accepted-terms", version);
        }
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let (_, body) = self.read(path, response).await?;
        Self::parse(path, body)
    }

    pub async fn session(&self, id: &str) -> Result<SessionSnapshot, ApiError> {
        let path = format!("/v1/sessions/{id}");
        let response = self
            .request(reqwest::Method::GET, &path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let (_, body) = self.read(&path, response).await?;
        Self::parse(&path, body)
    }

    pub async fn sessions(&self) -> Result<Vec<SessionSnapshot>, ApiError> {
        let path = "/v1/sessions";
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let (_, body) = self.read(path, response).await?;
        Ok(Self::parse::<SessionList>(path, body)?.sessions)
    }

    /// `GET /v1/sessions` as the runner answered it.
    pub async fn sessions_json(&self) -> Result<Value, ApiError> {
        let path = "/v1/sessions";
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let (_, body) = self.read(path, response).await?;
        Ok(body)
    }

    pub async fn stop(&self, id: &str) -> Result<(), ApiError> {
        let path = format!("/v1/sessions/{id}");
        let response = self
            .request(reqwest::Method::DELETE, &path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.read(&path, response).await.map(|_| ())
    }
}

/// The `SessionConfig` the runner proposes: the schema's defaults for the
/// required fields, as the editor fills its form.
pub fn default_config(capabilities: &RunnerCapabilities) -> RequestedConfig {
    let properties = capabilities
        .config
        .as_ref()
        .and_then(|config| config.schema.get("properties"));
    let default_of = |name: &str| {
        properties
            .and_then(|p| p.get(name))
            .and_then(|p| p.get("default"))
            .and_then(Value::as_str)
    };
    RequestedConfig {
        image: Some(
            default_of("image")
                .unwrap_or("telorun/node:0-slim")
                .to_owned(),
        ),
        pull_policy: Some(
            default_of("pullPolicy")
                .and_then(PullPolicy::parse)
                .unwrap_or(PullPolicy::Missing),
        ),
        registry_url: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_takes_the_schema_defaults() {
        let capabilities: RunnerCapabilities = serde_json::from_value(json!({
            "config": {"schema": {"properties": {
                "image": {"default": "example/kernel:1"},
                "pullPolicy": {"default": "never"},
            }}}
        }))
        .unwrap();
        assert_eq!(
            serde_json::to_value(default_config(&capabilities)).unwrap(),
            json!({"image": "example/kernel:1", "pullPolicy": "never"})
        );
    }

    #[test]
    fn websocket_and_host_derive_from_the_base_url() {
        let api = RunnerApi::new("https://runner.example.com:8443/", None);
        assert_eq!(api.ws_url("/v1/x"), "wss://runner.example.com:8443/v1/x");
        assert_eq!(api.host(), "runner.example.com");
        assert_eq!(
            RunnerApi::new("http://127.0.0.1:8061", None).ws_url("/a"),
            "ws://127.0.0.1:8061/a"
        );
    }
}
