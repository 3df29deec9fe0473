//! The service: an axum router over one workspace root.
//!
//! Every route but `GET /v1/health` needs `Authorization: Bearer <token>`;
//! the token is kept as a SHA-256 digest and compared in constant time.
//! Every file operation runs on a blocking thread, with the JSON it reads
//! or writes. Errors are `{"error": <code>, "message": <sentence>}` with the
//! status and code of the `runner-workspace` error kind.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use runner_api::watch::WorkspaceChangeSet;
use runner_workspace::{Workspace, WorkspaceError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::body_cap;
use crate::config::{BODY_TIMEOUT, Config};
use crate::wire::{CheckpointBody, ErrorBody, Health, SeedBody};

/// A refused request, answered as the JSON error envelope.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }
}

impl From<WorkspaceError> for Refusal {
    fn from(err: WorkspaceError) -> Self {
        let kind = err.kind();
        if kind.status >= 500 {
            warn!(code = kind.code, error = %err, "workspace operation failed");
        }
        Refusal::new(
            StatusCode::from_u16(kind.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            kind.code,
            err.to_string(),
        )
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        json_bytes(self.status, bytes)
    }
}

fn json_bytes(status: StatusCode, bytes: Vec<u8>) -> Response {
    let mut response = (status, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// What every handler shares.
struct Shared {
    workspace: Arc<Workspace>,
    token_digest: [u8; 32],
    /// `POST /v1/apply`'s body.
    apply_cap: BodyCap,
    /// `POST /v1/seed`'s and `POST /v1/restore`'s bodies.
    workspace_cap: BodyCap,
    /// Fired once a change set wrote [`Config::exit_after_write`].
    exit: Option<(String, CancellationToken)>,
}

impl Shared {
    /// Runs `operation` on the workspace on a blocking thread.
    async fn run<T: Send + 'static>(
        &self,
        operation: impl FnOnce(&Workspace) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        let workspace = self.workspace.clone();
        tokio::task::spawn_blocking(move || operation(&workspace))
            .await
            .map_err(|join| {
                warn!(error = %join, "a workspace operation did not finish");
                Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "the workspace operation did not finish",
                )
            })?
    }

    fn accepts(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.token_digest.ct_eq(&digest).into()
    }
}

/// The router over `workspace`, accepting `token` as the bearer token.
pub fn router(workspace: Workspace, token: &str) -> Router {
    router_exiting(workspace, token, None)
}

/// [`router`] whose service is done once a change set wrote `path`:
/// `done` fires after that change set is applied.
pub fn router_exiting(
    workspace: Workspace,
    token: &str,
    exit: Option<(String, CancellationToken)>,
) -> Router {
    let limits = *workspace.limits();
    let shared = Arc::new(Shared {
        workspace: Arc::new(workspace),
        token_digest: Sha256::digest(token.as_bytes()).into(),
        apply_cap: BodyCap {
            bytes: body_cap(limits.max_change_set_bytes),
            from: "RUNNER_WORKSPACE_MAX_CHANGE_BYTES",
        },
        workspace_cap: BodyCap {
            bytes: body_cap(limits.max_workspace_bytes),
            from: "RUNNER_WORKSPACE_MAX_BYTES",
        },
        exit,
    });
    let authenticated = Router::new()
        .route("/v1/tree", get(tree))
        .route("/v1/file", get(file))
        .route("/v1/apply", post(apply))
        .route("/v1/touch", post(touch))
        .route("/v1/seed", post(seed))
        .route("/v1/snapshot", get(snapshot))
        .route("/v1/checkpoint", get(checkpoint))
        .route("/v1/restore", post(restore))
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            require_token,
        ));
    Router::new()
        .route("/v1/health", get(health))
        .merge(authenticated)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(shared)
}

async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match presented {
        Some(token) if shared.accepts(token) => next.run(request).await,
        Some(_) => Refusal::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the bearer token is not this workspace's",
        )
        .into_response(),
        None => Refusal::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this route needs an Authorization: Bearer <token> header",
        )
        .into_response(),
    }
}

async fn no_route(method: Method, uri: Uri) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route {method} {}", uri.path()),
    )
}

async fn wrong_method(method: Method, uri: Uri) -> Refusal {
    Refusal::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}", uri.path()),
    )
}

async fn health() -> Response {
    let bytes = serde_json::to_vec(&Health { ok: true }).unwrap_or_default();
    json_bytes(StatusCode::OK, bytes)
}

/// A serialized 200 body, built on the blocking thread.
fn ok_json<T: Serialize>(value: &T) -> Result<Vec<u8>, Refusal> {
    serde_json::to_vec(value).map_err(|err| {
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("could not encode the answer: {err}"),
        )
    })
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(bytes).map_err(|err| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not the JSON this route takes: {err}"),
        )
    })
}

async fn tree(State(shared): State<Arc<Shared>>) -> Result<Response, Refusal> {
    let bytes = shared.run(|workspace| ok_json(&workspace.tree()?)).await?;
    Ok(json_bytes(StatusCode::OK, bytes))
}

#[derive(serde::Deserialize)]
struct PathQuery {
    path: Option<String>,
}

fn query_path(query: Result<Query<PathQuery>, QueryRejection>) -> Result<String, Refusal> {
    let Query(query) = query.map_err(|err| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("the query does not parse: {}", err.body_text()),
        )
    })?;
    query.path.filter(|path| !path.is_empty()).ok_or_else(|| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the query needs ?path=<a file of the workspace>",
        )
    })
}

async fn file(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<PathQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let path = query_path(query)?;
    let bytes = shared
        .run(move |workspace| ok_json(&workspace.read(&path)?))
        .await?;
    Ok(json_bytes(StatusCode::OK, bytes))
}

async fn touch(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<PathQuery>, QueryRejection>,
) -> Result<StatusCode, Refusal> {
    let path = query_path(query)?;
    shared
        .run(move |workspace| Ok(workspace.touch(&path)?))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn snapshot(State(shared): State<Arc<Shared>>) -> Result<Response, Refusal> {
    let bytes = shared
        .run(|workspace| {
            ok_json(&CheckpointBody {
                files: workspace.snapshot()?,
            })
        })
        .await?;
    Ok(json_bytes(StatusCode::OK, bytes))
}

/// The workspace in a checkpoint's stored form (gzip of the snapshot's JSON),
/// made here, beside the files: the runner receives only what it stores,
/// and learns its size from `Content-Length` before it reads any of it.
async fn checkpoint(State(shared): State<Arc<Shared>>) -> Result<Response, Refusal> {
    let bytes = shared.run(|workspace| Ok(workspace.checkpoint()?)).await?;
    let mut response = (StatusCode::OK, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/gzip"),
    );
    Ok(response)
}

/// The largest body a route reads, and the variable it follows from.
#[derive(Debug, Clone, Copy)]
struct BodyCap {
    bytes: u64,
    from: &'static str,
}

/// The request body, within `cap` and [`BODY_TIMEOUT`].
async fn read_body(headers: &HeaderMap, body: Body, cap: BodyCap) -> Result<Vec<u8>, Refusal> {
    let too_large = || {
        Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "workspace_too_large",
            format!(
                "the request body is over this service's limit of {} bytes (which follows {})",
                cap.bytes, cap.from
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > cap.bytes) {
        return Err(too_large());
    }
    let limit = usize::try_from(cap.bytes).unwrap_or(usize::MAX);
    let bytes = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            Refusal::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            )
        })?
        .map_err(|_| too_large())?;
    Ok(bytes.into())
}

async fn apply(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let body = read_body(&headers, body, shared.apply_cap).await?;
    let exit_path = shared.exit.as_ref().map(|(path, _)| path.clone());
    let (bytes, wrote_exit_path) = shared
        .run(move |workspace| {
            let changes: WorkspaceChangeSet = parse(&body)?;
            let wrote = exit_path.is_some_and(|exit| {
                changes.write.iter().any(|write| {
                    runner_api::bundle_path::normalize_bundle_path(&write.path)
                        .is_ok_and(|path| path == exit)
                })
            });
            Ok((ok_json(&workspace.apply(&changes)?)?, wrote))
        })
        .await?;
    if wrote_exit_path && let Some((_, done)) = &shared.exit {
        done.cancel();
    }
    Ok(json_bytes(StatusCode::OK, bytes))
}

async fn seed(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let body = read_body(&headers, body, shared.workspace_cap).await?;
    let bytes = shared
        .run(move |workspace| {
            let seed: SeedBody = parse(&body)?;
            ok_json(&workspace.seed(&seed.files)?)
        })
        .await?;
    Ok(json_bytes(StatusCode::OK, bytes))
}

async fn restore(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, Refusal> {
    let body = read_body(&headers, body, shared.workspace_cap).await?;
    shared
        .run(move |workspace| {
            let checkpoint: CheckpointBody = parse(&body)?;
            workspace.restore(&checkpoint.files)?;
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Why the service could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("could not open the workspace directory {}: {source}", dir.display())]
    Workspace {
        dir: PathBuf,
        #[source]
        source: WorkspaceError,
    },
    #[error("the workspace service failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Listens on `config.listen` and serves until `shutdown` fires.
pub async fn serve(config: Config, shutdown: CancellationToken) -> Result<(), ServeError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
    serve_on(listener, config, shutdown).await
}

/// The workspace service in the accept loop's refusals.
const WORKSPACE_SERVICE: runner_core::accept::ServiceName = runner_core::accept::ServiceName {
    name: "workspace service",
    limit_setting: None,
    client_limit_setting: None,
};

/// Serves `config.dir` on `listener` (its `listen` is not used) until
/// `shutdown` fires, then lets requests in flight finish. The directory is
/// created (mode `0700`) if missing.
///
/// The runner's own accept loop serves it, with its bounds: a pod's
/// network is shared by its app containers, which run the session's
/// untrusted code, so a half-sent request is closed at the header deadline
/// and connections past `config.connections` are refused.
pub async fn serve_on(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let dir = config.dir.clone();
    let limits = config.limits;
    let workspace = tokio::task::spawn_blocking(move || Workspace::create(&dir, limits))
        .await
        .map_err(|join| ServeError::Serve(std::io::Error::other(join)))?
        .map_err(|source| ServeError::Workspace {
            dir: config.dir.clone(),
            source,
        })?;
    // Fires on shutdown, or once the exit file was written.
    let done = shutdown.child_token();
    let exit = config
        .exit_after_write
        .clone()
        .map(|path| (path, done.clone()));
    let app = router_exiting(workspace, &config.token, exit);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, dir = %config.dir.display(), "workspace service serving");
    }
    runner_core::accept::serve(
        listener,
        app,
        config.connections,
        WORKSPACE_SERVICE,
        Default::default(),
        done,
    )
    .await
    .map_err(ServeError::Serve)?;
    if !shutdown.is_cancelled() {
        info!("the workspace's exit file was written; done");
    }
    info!("workspace service shut down");
    Ok(())
}
