//! The base-image catalog (docs/contract.md §8.6): the Docker Hub tags a runner offers
//! as session base images. The same list is advertised as the `image` enum of
//! the capabilities schema and enforced by `validateConfig`, so the runner
//! stays the source of truth: a client that skips the editor's picker still
//! cannot choose an image the operator did not offer.
//!
//! The catalog degrades instead of failing. Before Docker Hub has answered
//! once it offers only the operator's default image; after that, a failed
//! refresh keeps the last good list. A Hub outage therefore never stops the
//! runner from booting or a session from starting on the default.
//!
//! Tag filtering and reference parsing are plain functions over strings; the
//! catalog adds the Hub calls and the cached list.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use regex::Regex;
use reqwest::header::ACCEPT;
use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use runner_core::InvalidSessionConfig;
use runner_core::sync::lock;

/// Where the tag API lives unless a test points the catalog elsewhere.
pub const DOCKER_HUB_URL: &str = "https://hub.docker.com";
pub const DEFAULT_TAG_LIMIT: usize = 20;
pub const DEFAULT_MAX_TAGS_SCANNED: usize = 200;
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// `RUNNER_BASE_IMAGE_REFRESH_SECONDS` default; the owner passes it to
/// [`BaseImageCatalog::spawn_refresher`].
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(60 * 60);
/// A Docker Hub page of 100 tags is tens of KiB; anything near this is a
/// misbehaving or hostile server, and reading it whole would let that server
/// decide how much memory the runner spends.
pub const MAX_HUB_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

const TAGS_PAGE_SIZE: &str = "100";
/// Registry hosts that name Docker Hub itself; any other host is a registry the
/// Hub API cannot describe.
const DOCKER_HUB_HOSTS: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
/// First identifier after `MAJOR.MINOR.PATCH-` that marks a prerelease. Any
/// other suffix (`-slim`, `-rust-1.95.0`) is a build variant of a release.
const PRERELEASE_IDENTIFIERS: [&str; 10] = [
    "rc", "alpha", "beta", "pre", "preview", "next", "canary", "dev", "nightly", "snapshot",
];
/// `tokio::time::interval` panics on a zero period.
const MIN_REFRESH_PERIOD: Duration = Duration::from_millis(1);

/// Why one call to Docker Hub produced nothing usable.
#[derive(Debug, thiserror::Error)]
pub enum HubRequestError {
    /// Rendered as the reference's `<status> <statusText>`.
    #[error("{} {}", .status.as_u16(), .status.canonical_reason().unwrap_or(""))]
    Status { status: StatusCode },
    #[error("{}", describe_transport_error(.source))]
    Send {
        #[source]
        source: reqwest::Error,
    },
    #[error("no complete answer within {after:?}")]
    TimedOut { after: Duration },
    /// The client followed a redirect off the Hub's origin; what came back is
    /// not the Hub's answer, so it is not used.
    #[error("the answer came from {origin}, not from Docker Hub")]
    Redirected { origin: String },
    #[error("response body exceeds {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("response body is not JSON: {source}")]
    Decode {
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("base-image catalog hub URL '{url}' is not an absolute http(s) URL")]
    ParseHubUrl { url: String },
    /// Display is the reference's text:
    /// `Docker Hub tags request for '<repository>' failed: <status> <statusText>`.
    #[error("Docker Hub tags request for '{repository}' failed: {source}")]
    FetchTags {
        repository: String,
        #[source]
        source: HubRequestError,
    },
    #[error("Docker Hub tag request for '{reference}' failed: {source}")]
    ResolveDigest {
        reference: String,
        #[source]
        source: HubRequestError,
    },
}

/// reqwest's own message ("error sending request for url …") hides the cause
/// an operator needs (refused, DNS, TLS); the log line should carry it.
fn describe_transport_error(error: &reqwest::Error) -> String {
    runner_core::errors::error_chain(error)
}

/// Narrows a repository's tags to the offered menu. The flags cover the usual
/// cases; `include`/`exclude` are the operator's escape hatch.
#[derive(Debug, Clone, Default)]
pub struct TagFilter {
    /// Keep only `MAJOR.MINOR.PATCH[-variant]` tags, dropping moving tags
    /// (`latest`, `0`, `0.30`, `latest-slim`).
    pub pinned_only: bool,
    /// Drop commit-hash tags (`sha-<hex>` or bare hex, 7+ digits).
    pub exclude_sha: bool,
    /// Drop semver prereleases (`0.30.1-rc.1`), keep variants (`0.30.1-slim`).
    pub exclude_prerelease: bool,
    /// When non-empty, a tag must match at least one of these.
    pub include: Vec<Regex>,
    /// A tag matching any of these is dropped.
    pub exclude: Vec<Regex>,
}

impl TagFilter {
    /// Whether `tag` survives the filter; the checks run in the reference's
    /// order (sha, pinned, prerelease, include, exclude).
    pub fn keeps(&self, tag: &str) -> bool {
        if self.exclude_sha && is_commit_sha_tag(tag) {
            return false;
        }
        if self.pinned_only && !is_pinned_tag(tag) {
            return false;
        }
        if self.exclude_prerelease && is_prerelease_tag(tag) {
            return false;
        }
        if !self.include.is_empty() && !self.include.iter().any(|re| re.is_match(tag)) {
            return false;
        }
        !self.exclude.iter().any(|re| re.is_match(tag))
    }
}

/// The tags `filter` keeps, in input order.
pub fn filter_tags<S: AsRef<str>>(tags: &[S], filter: &TagFilter) -> Vec<String> {
    tags.iter()
        .map(AsRef::as_ref)
        .filter(|tag| filter.keeps(tag))
        .map(str::to_owned)
        .collect()
}

// The three built-in rules are the reference's JavaScript regexes, spelled out
// by hand: `\d` there is ASCII-only and `.` stops at JavaScript's line
// terminators, neither of which is what the `regex` crate means by them.

/// `/^(?:sha-)?[0-9a-f]{7,}$/i`
fn is_commit_sha_tag(tag: &str) -> bool {
    let hex = strip_prefix_ignore_ascii_case(tag, "sha-").unwrap_or(tag);
    hex.len() >= 7 && hex.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// `/^\d+\.\d+\.\d+(?:[-.].*)?$/`
fn is_pinned_tag(tag: &str) -> bool {
    let Some(rest) = after_version_core(tag) else {
        return false;
    };
    match rest.strip_prefix(['-', '.']) {
        Some(variant) => !has_js_line_terminator(variant),
        None => rest.is_empty(),
    }
}

/// `/^\d+\.\d+\.\d+-(.+)$/`, then the first identifier of the capture (split
/// on `-` or `.`), lowercased, is one of [`PRERELEASE_IDENTIFIERS`].
fn is_prerelease_tag(tag: &str) -> bool {
    let Some(suffix) = after_version_core(tag).and_then(|rest| rest.strip_prefix('-')) else {
        return false;
    };
    if suffix.is_empty() || has_js_line_terminator(suffix) {
        return false;
    }
    let first = suffix.split(['-', '.']).next().unwrap_or_default();
    PRERELEASE_IDENTIFIERS.contains(&first.to_lowercase().as_str())
}

/// The text after a leading `MAJOR.MINOR.PATCH` of ASCII digits.
fn after_version_core(tag: &str) -> Option<&str> {
    let mut rest = tag;
    for part in 0..3 {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = rest.split_at(digits).1;
        if part < 2 {
            rest = rest.strip_prefix('.')?;
        }
    }
    Some(rest)
}

fn strip_prefix_ignore_ascii_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.split_at_checked(prefix.len())
        .filter(|(head, _)| head.eq_ignore_ascii_case(prefix))
        .map(|(_, rest)| rest)
}

fn has_js_line_terminator(text: &str) -> bool {
    text.contains(['\n', '\r', '\u{2028}', '\u{2029}'])
}

/// Docker Hub coordinates of an image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    pub namespace: String,
    pub repository: String,
    pub tag: String,
    /// The `@digest` the reference is pinned to, if any (an empty one counts
    /// as none).
    pub digest: Option<String>,
}

/// Splits an image reference into Docker Hub coordinates, or `None` when it
/// names another registry (a first path segment with `.` or `:`, or
/// `localhost`, is a registry host; only Docker Hub's own hosts are accepted).
/// Bare names live in the `library` namespace; the tag defaults to `latest`.
/// Nothing else is validated.
pub fn parse_docker_hub_ref(reference: &str) -> Option<HubRef> {
    let (mut rest, digest) = match reference.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (reference, None),
    };
    if let Some((first, path)) = rest.split_once('/') {
        let names_a_registry = first.contains(['.', ':']) || first == "localhost";
        if names_a_registry {
            if !DOCKER_HUB_HOSTS.contains(&first) {
                return None;
            }
            rest = path;
        }
    }
    // A `:` before the last `/` belongs to the name (it would be a port), not
    // to a tag.
    let (name, tag) = match (rest.rfind(':'), rest.rfind('/')) {
        (Some(colon), slash) if slash.is_none_or(|slash| colon > slash) => {
            (&rest[..colon], &rest[colon + 1..])
        }
        _ => (rest, "latest"),
    };
    let (namespace, repository) = name.split_once('/').unwrap_or(("library", name));
    Some(HubRef {
        namespace: namespace.to_owned(),
        repository: repository.to_owned(),
        tag: tag.to_owned(),
        digest: digest.filter(|d| !d.is_empty()).map(str::to_owned),
    })
}

/// How a [`BaseImageCatalog`] is built. [`CatalogOptions::new`] fills in the
/// reference's defaults.
#[derive(Debug, Clone)]
pub struct CatalogOptions {
    /// `namespace/repository` on Docker Hub; a bare name means
    /// `library/<name>`. Offered refs are `<repository>:<tag>` as written here.
    pub repository: String,
    /// Always offered, always first, even when the filter would drop it.
    pub default_ref: String,
    pub filter: TagFilter,
    /// How many filtered tags (newest first) are offered.
    pub limit: usize,
    /// Paging stops once this many tags were collected (it may overshoot by
    /// one page); the newest are kept because the list is sorted afterwards.
    pub max_tags_scanned: usize,
    /// Per Hub call, from connecting until the body has been read.
    pub request_timeout: Duration,
    /// Base URL of the Hub API, `https://hub.docker.com` in production.
    pub hub_url: String,
    /// Redirects follow this client's policy. The catalog refuses an answer
    /// that ended up on another origin, but only a client built with
    /// `reqwest::redirect::Policy::none()` keeps the request itself from
    /// going there.
    pub client: reqwest::Client,
}

impl CatalogOptions {
    pub fn new(
        repository: impl Into<String>,
        default_ref: impl Into<String>,
        client: reqwest::Client,
    ) -> Self {
        Self {
            repository: repository.into(),
            default_ref: default_ref.into(),
            filter: TagFilter::default(),
            limit: DEFAULT_TAG_LIMIT,
            max_tags_scanned: DEFAULT_MAX_TAGS_SCANNED,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            hub_url: DOCKER_HUB_URL.to_owned(),
            client,
        }
    }
}

/// The offered base images, refreshed from Docker Hub.
#[derive(Debug)]
pub struct BaseImageCatalog {
    repository: String,
    hub_namespace: String,
    hub_repository: String,
    default_ref: String,
    filter: TagFilter,
    limit: usize,
    max_tags_scanned: usize,
    request_timeout: Duration,
    hub_url: Url,
    client: reqwest::Client,
    /// `current()` as of the last successful refresh. Swapped whole, so a
    /// reader clones an `Arc` under the lock and never waits on the network.
    offered: Mutex<Arc<[String]>>,
    /// Refreshes run one at a time, so a slow one that started earlier can
    /// never overwrite the list of one that started later.
    refresh_serial: tokio::sync::Mutex<()>,
}

impl BaseImageCatalog {
    pub fn new(options: CatalogOptions) -> Result<Self, CatalogError> {
        let hub_url = Url::parse(&options.hub_url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && !url.cannot_be_a_base())
            .ok_or_else(|| CatalogError::ParseHubUrl {
                url: options.hub_url.clone(),
            })?;
        let (hub_namespace, hub_repository) = options
            .repository
            .split_once('/')
            .unwrap_or(("library", &options.repository));
        Ok(Self {
            hub_namespace: hub_namespace.to_owned(),
            hub_repository: hub_repository.to_owned(),
            offered: Mutex::new(Arc::from([options.default_ref.clone()])),
            repository: options.repository,
            default_ref: options.default_ref,
            filter: options.filter,
            limit: options.limit,
            max_tags_scanned: options.max_tags_scanned,
            request_timeout: options.request_timeout,
            hub_url,
            client: options.client,
            refresh_serial: tokio::sync::Mutex::new(()),
        })
    }

    pub fn default_ref(&self) -> &str {
        &self.default_ref
    }

    /// The offered refs: the default first, then `<repository>:<tag>` for the
    /// filtered tags, newest first, without duplicates.
    pub fn current(&self) -> Vec<String> {
        self.offered_snapshot().to_vec()
    }

    /// Exact membership in [`current`](Self::current).
    pub fn is_allowed(&self, image: &str) -> bool {
        self.offered_snapshot()
            .iter()
            .any(|offered| offered == image)
    }

    /// The `validateConfig` refusal for an image this catalog does not offer.
    pub fn allowlist_error(&self, image: &str) -> InvalidSessionConfig {
        InvalidSessionConfig::ImageNotOffered {
            image: image.to_owned(),
            offered: self.offered_snapshot().to_vec(),
        }
    }

    /// Fetches the tag list and replaces the offered list. On failure the
    /// previous list keeps serving.
    pub async fn refresh(&self) -> Result<(), CatalogError> {
        let _serial = self.refresh_serial.lock().await;
        let newest_first =
            self.fetch_tags_newest_first()
                .await
                .map_err(|source| CatalogError::FetchTags {
                    repository: self.repository.clone(),
                    source,
                })?;
        let mut tags = filter_tags(&newest_first, &self.filter);
        tags.truncate(self.limit);
        let refs = offered_refs(&self.default_ref, &self.repository, &tags);
        *lock(&self.offered) = refs.into();
        Ok(())
    }

    /// The current manifest digest of a Docker Hub reference, so a build keyed
    /// on it notices when a moving tag moves. `None` for another registry (not
    /// an error), for a tag without a digest, and when the Hub call fails (that
    /// is logged). A reference pinned with `@digest` answers without a call.
    pub async fn resolve_tag_digest(&self, reference: &str) -> Option<String> {
        let hub_ref = parse_docker_hub_ref(reference)?;
        if hub_ref.digest.is_some() {
            return hub_ref.digest;
        }
        let url = self.hub_api_url(&[
            &hub_ref.namespace,
            &hub_ref.repository,
            "tags",
            &hub_ref.tag,
        ]);
        match self.get_hub_json(url).await {
            Ok(body) => digest_of_tag(&body),
            Err(source) => {
                let err = CatalogError::ResolveDigest {
                    reference: reference.to_owned(),
                    source,
                };
                warn!(error = %err, "could not resolve a base image digest");
                None
            }
        }
    }

    /// Refreshes every `every` (first run one period from now; the owner does
    /// the boot refresh) until `stop` fires, which also abandons a refresh in
    /// flight. Failures are logged and the last good list keeps serving.
    pub fn spawn_refresher(
        self: Arc<Self>,
        every: Duration,
        stop: CancellationToken,
    ) -> JoinHandle<()> {
        let period = every.max(MIN_REFRESH_PERIOD);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
            // A refresh that outlasts the period must not be followed by a
            // burst of catch-up calls against a rate-limited API.
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    result = self.refresh() => {
                        if let Err(err) = result {
                            warn!(error = %err, "base-image catalog refresh failed");
                        }
                    }
                }
            }
        })
    }

    fn offered_snapshot(&self) -> Arc<[String]> {
        Arc::clone(&lock(&self.offered))
    }

    /// Tag names across pages, sorted by `last_updated` descending (string
    /// order, stable), so the scan cap keeps the newest whatever the Hub's
    /// page order.
    async fn fetch_tags_newest_first(&self) -> Result<Vec<String>, HubRequestError> {
        let mut url = self.hub_api_url(&[&self.hub_namespace, &self.hub_repository, "tags"]);
        url.query_pairs_mut()
            .append_pair("page_size", TAGS_PAGE_SIZE);
        let mut scanned: Vec<ScannedTag> = Vec::new();
        while scanned.len() < self.max_tags_scanned {
            let page = self.get_hub_json(url.clone()).await?;
            let before = scanned.len();
            collect_page_tags(&page, &mut scanned);
            let Some(next) = page.get("next").and_then(Value::as_str) else {
                break;
            };
            // A page that adds nothing yet points onward would have us page
            // forever without ever reaching the scan cap.
            if scanned.len() == before {
                break;
            }
            match self.same_origin_next(&url, next) {
                Some(next_url) => url = next_url,
                None => {
                    warn!(
                        next,
                        "Docker Hub pointed the next tags page at another origin; not following it"
                    );
                    break;
                }
            }
        }
        scanned.sort_by(|a, b| b.last_updated.cmp(&a.last_updated));
        Ok(scanned.into_iter().map(|tag| tag.name).collect())
    }

    /// The `next` link only if it stays on the configured Hub origin. The
    /// response body is not trusted to choose where the runner sends requests:
    /// otherwise whoever controls a response could point the runner at an
    /// internal address (SSRF) and have its answer become the image allowlist.
    fn same_origin_next(&self, current: &Url, next: &str) -> Option<Url> {
        current
            .join(next)
            .ok()
            .filter(|url| url.origin() == self.hub_url.origin())
    }

    /// `<hub_url>/v2/repositories/<segments…>`, each segment percent-encoded.
    fn hub_api_url(&self, segments: &[&str]) -> Url {
        let mut url = self.hub_url.clone();
        url.set_query(None);
        url.set_fragment(None);
        // `new` only accepts URLs that can be a base, so this always succeeds.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty()
                .extend(["v2", "repositories"])
                .extend(segments);
        }
        url
    }

    async fn get_hub_json(&self, url: Url) -> Result<Value, HubRequestError> {
        let timeout = self.request_timeout;
        let transport = |source: reqwest::Error| {
            if source.is_timeout() {
                HubRequestError::TimedOut { after: timeout }
            } else {
                HubRequestError::Send { source }
            }
        };
        let mut response = self
            .client
            .get(url)
            .header(ACCEPT, "application/json")
            .timeout(timeout)
            .send()
            .await
            .map_err(transport)?;
        if response.url().origin() != self.hub_url.origin() {
            return Err(HubRequestError::Redirected {
                origin: response.url().origin().ascii_serialization(),
            });
        }
        let status = response.status();
        if !status.is_success() {
            return Err(HubRequestError::Status { status });
        }
        let too_large = HubRequestError::BodyTooLarge {
            limit: MAX_HUB_RESPONSE_BYTES,
        };
        if response
            .content_length()
            .is_some_and(|length| length > MAX_HUB_RESPONSE_BYTES as u64)
        {
            return Err(too_large);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > MAX_HUB_RESPONSE_BYTES {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|source| HubRequestError::Decode { source })
    }
}

struct ScannedTag {
    name: String,
    last_updated: String,
}

/// Entries without a string `name` are skipped; a missing `last_updated`
/// sorts as the empty string, i.e. oldest.
fn collect_page_tags(page: &Value, into: &mut Vec<ScannedTag>) {
    let results = page.get("results").and_then(Value::as_array);
    for result in results.into_iter().flatten() {
        if let Some(name) = result.get("name").and_then(Value::as_str) {
            let last_updated = result.get("last_updated").and_then(Value::as_str);
            into.push(ScannedTag {
                name: name.to_owned(),
                last_updated: last_updated.unwrap_or_default().to_owned(),
            });
        }
    }
}

/// The tag's own `digest`, else the first image's. An empty string is no
/// digest: pinning a build to `image@` would only break it.
fn digest_of_tag(body: &Value) -> Option<String> {
    let digest_of = |value: &Value| {
        value
            .get("digest")
            .and_then(Value::as_str)
            .filter(|digest| !digest.is_empty())
            .map(str::to_owned)
    };
    digest_of(body).or_else(|| body.get("images")?.as_array()?.iter().find_map(digest_of))
}

fn offered_refs(default_ref: &str, repository: &str, tags: &[String]) -> Vec<String> {
    let candidates = std::iter::once(default_ref.to_owned())
        .chain(tags.iter().map(|tag| format!("{repository}:{tag}")));
    let mut seen = HashSet::new();
    candidates
        .filter(|candidate| seen.insert(candidate.clone()))
        .collect()
}
