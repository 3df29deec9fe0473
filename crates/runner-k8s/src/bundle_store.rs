//! Staged bundles (docs/contract.md §9.8): a run session's files wait here,
//! as a tar.gz, until the pod's `body-fetch` init container downloads them
//! from `GET /internal/bundles/{id}?token=…` on the runner.
//!
//! The URL is the only credential, and the route has no other
//! authentication, so a download is single use, expires after
//! [`STAGING_TTL`], and its token is compared in constant time.

mod archive;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use runner_core::bundle_path::InvalidBundlePath;
use runner_core::types::RunBundle;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

pub use archive::{MAX_TAR_PATH_BYTES, bundle_tar_gz};

/// How long a staged bundle waits for its download. A pod that has not
/// fetched it by then has failed to start for another reason (its start
/// deadline is shorter than this only when misconfigured); the entry must
/// not outlive it.
pub const STAGING_TTL: Duration = Duration::from_secs(5 * 60);

/// Random bytes in a download token (48 hex characters in the URL).
const TOKEN_BYTES: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file path that would land outside `/app` (the core's message).
    #[error(transparent)]
    InvalidPath(#[from] InvalidBundlePath),
    #[error("bundle path too long for tar (max {MAX_TAR_PATH_BYTES} bytes): '{0}'")]
    PathTooLong(String),
    /// Writing into memory failed; only an allocation failure could do it.
    #[error("could not build the bundle archive")]
    Archive(#[source] std::io::Error),
}

struct StagedBundle {
    token: String,
    tar_gz: Bytes,
    staged_at: Instant,
}

impl StagedBundle {
    fn is_expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.staged_at) >= STAGING_TTL
    }
}

/// The bundles waiting for their pods, by session id. Shared by the backend
/// (which stages and drops) and the runner's HTTP server ([`router`]).
pub struct BundleStore {
    self_url: String,
    staged: Mutex<HashMap<String, StagedBundle>>,
}

impl BundleStore {
    /// `self_url` is the runner's base URL as pods reach it
    /// (`RUNNER_SELF_URL`).
    pub fn new(self_url: String) -> Self {
        Self {
            self_url: self_url.trim_end_matches('/').to_owned(),
            staged: Mutex::new(HashMap::new()),
        }
    }

    /// Stages `bundle` for `session_id`, replacing whatever was staged for it
    /// before, and returns the one-time download URL
    /// `<selfUrl>/internal/bundles/<id>?token=<48 hex>`.
    pub fn stage(&self, session_id: &str, bundle: &RunBundle) -> Result<String, BundleError> {
        // A URL handed out earlier must not serve after a re-stage, even if
        // building the new archive fails.
        self.drop_bundle(session_id);
        self.purge_expired();
        let tar_gz = Bytes::from(bundle_tar_gz(bundle)?);
        // `rand::random` draws from the thread-local CSPRNG: the token is the
        // only thing between the network and the bundle.
        let token = hex::encode(rand::random::<[u8; TOKEN_BYTES]>());
        let url = format!(
            "{}/internal/bundles/{session_id}?token={token}",
            self.self_url
        );
        self.lock().insert(
            session_id.to_owned(),
            StagedBundle {
                token,
                tar_gz,
                staged_at: Instant::now(),
            },
        );
        Ok(url)
    }

    /// The staged archive, if `token` is its token and it has not expired.
    /// A hit removes the entry (single use); a wrong token leaves it for the
    /// pod that holds the right one.
    pub fn take(&self, session_id: &str, token: &str) -> Option<Bytes> {
        let mut staged = self.lock();
        let entry = staged.get(session_id)?;
        if entry.is_expired(Instant::now()) {
            staged.remove(session_id);
            return None;
        }
        // Length is public (always 48); the comparison of the bytes is not.
        let matches = entry.token.len() == token.len()
            && bool::from(entry.token.as_bytes().ct_eq(token.as_bytes()));
        if !matches {
            return None;
        }
        staged.remove(session_id).map(|entry| entry.tar_gz)
    }

    /// Forgets the bundle of `session_id`: the session finished or failed to
    /// start. A no-op when nothing is staged.
    pub fn drop_bundle(&self, session_id: &str) {
        self.lock().remove(session_id);
    }

    /// Removes every expired entry. Expired entries are already invisible to
    /// [`take`](Self::take); this only frees their memory, so it runs on
    /// every [`stage`](Self::stage) instead of on a timer per bundle.
    pub fn purge_expired(&self) {
        let now = Instant::now();
        self.lock().retain(|_, entry| !entry.is_expired(now));
    }

    /// How many bundles are held, expired ones included until purged.
    pub fn staged_count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, StagedBundle>> {
        // Every critical section is a single map operation, so a panic while
        // holding the lock cannot leave the map half-updated.
        self.staged.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `GET /internal/bundles/{id}?token=…`, for the runner's HTTP server.
pub fn router(store: Arc<BundleStore>) -> Router {
    Router::new()
        .route("/internal/bundles/{id}", get(serve_bundle))
        .with_state(store)
}

async fn serve_bundle(
    State(store): State<Arc<BundleStore>>,
    Path(session_id): Path<String>,
    // Pairs rather than a struct: a repeated or odd query parameter is then a
    // plain miss (404), like every other wrong URL, not a 400.
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let token = query
        .iter()
        .find(|(key, _)| key == "token")
        .map_or("", |(_, value)| value.as_str());
    match store.take(&session_id, token) {
        Some(tar_gz) => (
            StatusCode::OK,
            [
                (CONTENT_TYPE, "application/gzip"),
                (CACHE_CONTROL, "no-store"),
            ],
            tar_gz,
        )
            .into_response(),
        None => {
            tracing::debug!(
                session_id,
                "bundle download refused: unknown, used, expired or wrong token"
            );
            (
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({ "error": "not_found" })),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use runner_core::types::BundleFile;
    use tower::ServiceExt;

    use super::*;

    const SELF_URL: &str = "http://runner.telo.svc:8062";
    const SESSION: &str = "abcdefghijkl";

    fn bundle() -> RunBundle {
        RunBundle {
            entry_relative_path: "telo.yaml".to_owned(),
            files: vec![
                BundleFile {
                    relative_path: "telo.yaml".to_owned(),
                    contents: "kind: Telo.Application\n".to_owned(),
                },
                BundleFile {
                    relative_path: "sub/lib.yaml".to_owned(),
                    contents: "kind: Telo.Library\n".to_owned(),
                },
            ],
        }
    }

    fn token_of(url: &str) -> &str {
        url.split_once("?token=").unwrap().1
    }

    #[test]
    fn staging_returns_the_download_url_with_a_48_hex_token() {
        let store = BundleStore::new(format!("{SELF_URL}/"));
        let url = store.stage(SESSION, &bundle()).unwrap();
        let prefix = format!("{SELF_URL}/internal/bundles/{SESSION}?token=");
        assert!(url.starts_with(&prefix), "{url}");
        let token = token_of(&url);
        assert_eq!(token.len(), 48);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }

    #[test]
    fn the_staged_archive_is_the_bundle_tar_gz() {
        let store = BundleStore::new(SELF_URL.to_owned());
        let url = store.stage(SESSION, &bundle()).unwrap();
        let served = store.take(SESSION, token_of(&url)).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&served[..]));
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["telo.yaml", "sub/lib.yaml"]);
    }

    #[test]
    fn a_bundle_can_be_taken_only_once() {
        let store = BundleStore::new(SELF_URL.to_owned());
        let url = store.stage(SESSION, &bundle()).unwrap();
        assert!(store.take(SESSION, token_of(&url)).is_some());
        assert!(store.take(SESSION, token_of(&url)).is_none());
        assert_eq!(store.staged_count(), 0);
    }

    #[test]
    fn a_wrong_token_is_refused_and_keeps_the_bundle() {
        let store = BundleStore::new(SELF_URL.to_owned());
        let url = store.stage(SESSION, &bundle()).unwrap();
        let token = token_of(&url);
        let mut wrong = token.to_owned();
        wrong.replace_range(0..1, if token.starts_with('0') { "1" } else { "0" });
        assert!(store.take(SESSION, &wrong).is_none());
        assert!(store.take(SESSION, "").is_none());
        assert!(store.take(SESSION, &format!("{token}0")).is_none());
        assert!(store.take(SESSION, &token[..47]).is_none());
        assert!(store.take("otherid23456", token).is_none());
        assert!(store.take(SESSION, token).is_some());
    }

    #[test]
    fn restaging_replaces_the_previous_bundle_and_token() {
        let store = BundleStore::new(SELF_URL.to_owned());
        let first = store.stage(SESSION, &bundle()).unwrap();
        let second = store.stage(SESSION, &bundle()).unwrap();
        assert_ne!(first, second);
        assert!(store.take(SESSION, token_of(&first)).is_none());
        assert!(store.take(SESSION, token_of(&second)).is_some());
    }

    #[test]
    fn a_failed_restage_still_revokes_the_previous_url() {
        let store = BundleStore::new(SELF_URL.to_owned());
        let first = store.stage(SESSION, &bundle()).unwrap();
        let mut bad = bundle();
        bad.files[1].relative_path = "../escape".to_owned();
        let error = store.stage(SESSION, &bad).unwrap_err();
        assert_eq!(error.to_string(), "invalid bundle relativePath '../escape'");
        assert!(store.take(SESSION, token_of(&first)).is_none());
    }

    #[test]
    fn dropping_a_bundle_revokes_its_url() {
        let store = BundleStore::new(SELF_URL.to_owned());
        let url = store.stage(SESSION, &bundle()).unwrap();
        store.drop_bundle(SESSION);
        store.drop_bundle(SESSION);
        assert!(store.take(SESSION, token_of(&url)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_bundle_expires_after_the_staging_ttl() {
        let store = BundleStore::new(SELF_URL.to_owned());
        let url = store.stage(SESSION, &bundle()).unwrap();
        tokio::time::advance(STAGING_TTL - Duration::from_millis(1)).await;
        let other = store.stage("other2345678", &bundle()).unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(store.take(SESSION, token_of(&url)).is_none());
        // The younger bundle is still there.
        assert!(store.take("other2345678", token_of(&other)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn staging_purges_expired_bundles() {
        let store = BundleStore::new(SELF_URL.to_owned());
        store.stage(SESSION, &bundle()).unwrap();
        store.stage("other2345678", &bundle()).unwrap();
        tokio::time::advance(STAGING_TTL).await;
        assert_eq!(store.staged_count(), 2);
        store.stage("third2345678", &bundle()).unwrap();
        assert_eq!(store.staged_count(), 1);
    }

    async fn get(
        store: &Arc<BundleStore>,
        uri: &str,
    ) -> (StatusCode, Vec<(String, String)>, Bytes) {
        let response = router(store.clone())
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, headers, body)
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[tokio::test]
    async fn the_route_serves_the_archive_once_then_404s() {
        let store = Arc::new(BundleStore::new(SELF_URL.to_owned()));
        let url = store.stage(SESSION, &bundle()).unwrap();
        let path = url.strip_prefix(SELF_URL).unwrap();

        let (status, headers, body) = get(&store, path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "content-type"), Some("application/gzip"));
        assert_eq!(header(&headers, "cache-control"), Some("no-store"));
        assert_eq!(&body[..2], [0x1f, 0x8b], "a gzip stream");

        let (status, headers, body) = get(&store, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert_eq!(&body[..], br#"{"error":"not_found"}"#);
    }

    #[tokio::test]
    async fn the_route_404s_without_the_right_token_and_keeps_the_bundle() {
        let store = Arc::new(BundleStore::new(SELF_URL.to_owned()));
        let url = store.stage(SESSION, &bundle()).unwrap();
        let token = token_of(&url);
        for uri in [
            format!("/internal/bundles/{SESSION}"),
            format!("/internal/bundles/{SESSION}?token="),
            format!("/internal/bundles/{SESSION}?token={}", "0".repeat(48)),
            format!("/internal/bundles/{SESSION}?token=a&token=b"),
            format!("/internal/bundles/{SESSION}?tok%zz=%%"),
            format!("/internal/bundles/unknown?token={token}"),
        ] {
            let (status, _, body) = get(&store, &uri).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
            assert_eq!(&body[..], br#"{"error":"not_found"}"#, "{uri}");
        }
        let (status, _, _) = get(
            &store,
            &format!("/internal/bundles/{SESSION}?token={token}"),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
}
