//! The base-image catalog against a fake Docker Hub on a real socket: paging,
//! filtering, degradation when the Hub fails, digest resolution, the
//! allowlist text and the background refresher.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use regex::Regex;
use rstest::rstest;
use runner_k8s::images::base::{
    BaseImageCatalog, CatalogError, CatalogOptions, HubRef, HubRequestError,
    MAX_HUB_RESPONSE_BYTES, TagFilter, filter_tags, parse_docker_hub_ref,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Upper bound on waiting for an event that should come almost at once.
const WAIT: Duration = Duration::from_secs(10);
const DEFAULT_REF: &str = "telorun/node:latest-slim";

// ---------------------------------------------------------------------------
// A fake Docker Hub
// ---------------------------------------------------------------------------

/// What the fake Hub answers; a test may change it between calls.
#[derive(Default)]
struct HubScript {
    /// Tag-list pages; `?page=N` (1-based, default 1) picks one, and `next`
    /// links to the following page until the last.
    pages: Vec<Vec<Value>>,
    /// Replaces every page's `next` link.
    next_override: Option<String>,
    /// Every request is answered with this status and a text body.
    fail_with: Option<StatusCode>,
    /// Every request is accepted and never answered.
    hang: bool,
    /// Tag-list answers become a body larger than the catalog reads, either
    /// announced by `content-length` or streamed without one.
    oversized: Option<Oversized>,
    /// Single-tag bodies, keyed by request path.
    tag_details: HashMap<String, Value>,
}

#[derive(Clone, Copy, Debug)]
enum Oversized {
    Announced,
    Streamed,
}

struct HubState {
    base: String,
    script: Mutex<HubScript>,
    requests: Mutex<Vec<String>>,
    request_count: watch::Sender<usize>,
}

struct FakeHub {
    state: Arc<HubState>,
    _stop_server: DropGuard,
}

impl FakeHub {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(HubState {
            base,
            script: Mutex::new(HubScript::default()),
            requests: Mutex::new(Vec::new()),
            request_count: watch::Sender::new(0),
        });
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&state));
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await
                .unwrap();
        });
        Self {
            state,
            _stop_server: stop.drop_guard(),
        }
    }

    fn base(&self) -> &str {
        &self.state.base
    }

    fn script(&self) -> MutexGuard<'_, HubScript> {
        self.state.script.lock().unwrap()
    }

    fn serve_pages(&self, pages: Vec<Vec<Value>>) {
        self.script().pages = pages;
    }

    /// Path and query of every request received, in order.
    fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    async fn wait_for_requests(&self, count: usize) {
        let mut seen = self.state.request_count.subscribe();
        tokio::time::timeout(WAIT, seen.wait_for(|seen| *seen >= count))
            .await
            .unwrap()
            .unwrap();
    }

    fn options(&self) -> CatalogOptions {
        let mut options = CatalogOptions::new(
            "telorun/node",
            DEFAULT_REF,
            runner_core::http_client::client(),
        );
        options.hub_url = self.base().to_owned();
        options
    }

    fn catalog(&self) -> BaseImageCatalog {
        BaseImageCatalog::new(self.options()).unwrap()
    }

    fn catalog_with(&self, configure: impl FnOnce(&mut CatalogOptions)) -> BaseImageCatalog {
        let mut options = self.options();
        configure(&mut options);
        BaseImageCatalog::new(options).unwrap()
    }
}

async fn answer(State(hub): State<Arc<HubState>>, uri: Uri) -> Response {
    hub.requests.lock().unwrap().push(uri.to_string());
    hub.request_count.send_modify(|count| *count += 1);
    let (hang, fail_with, oversized) = {
        let script = hub.script.lock().unwrap();
        (script.hang, script.fail_with, script.oversized)
    };
    if hang {
        std::future::pending::<()>().await;
    }
    if let Some(status) = fail_with {
        return (status, "nope").into_response();
    }
    let path = uri.path();
    if path.contains("/tags/") {
        return match hub.script.lock().unwrap().tag_details.get(path) {
            Some(body) => axum::Json(body.clone()).into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        };
    }
    if !path.ends_with("/tags") {
        return StatusCode::NOT_FOUND.into_response();
    }
    match oversized {
        Some(Oversized::Announced) => {
            return vec![b' '; MAX_HUB_RESPONSE_BYTES + 1].into_response();
        }
        Some(Oversized::Streamed) => {
            let chunk = Bytes::from(vec![b' '; 64 * 1024]);
            let chunks = (MAX_HUB_RESPONSE_BYTES / chunk.len()) + 2;
            let stream = futures_util::stream::iter(
                std::iter::repeat_n(chunk, chunks).map(Ok::<_, Infallible>),
            );
            return Body::from_stream(stream).into_response();
        }
        None => {}
    }
    let page: usize = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("page="))
        .and_then(|number| number.parse().ok())
        .unwrap_or(1);
    let script = hub.script.lock().unwrap();
    let results = script.pages.get(page - 1).cloned().unwrap_or_default();
    let next = match &script.next_override {
        Some(next) => Value::String(next.clone()),
        None if page < script.pages.len() => Value::String(format!(
            "{}{path}?page={}&page_size=100",
            hub.base,
            page + 1
        )),
        None => Value::Null,
    };
    axum::Json(json!({ "count": results.len(), "next": next, "results": results })).into_response()
}

fn tag(name: &str, last_updated: &str) -> Value {
    json!({ "name": name, "last_updated": last_updated })
}

/// `count` distinct tags for page `page`, all pinned releases.
fn page_of_tags(page: usize, count: usize) -> Vec<Value> {
    (0..count)
        .map(|index| {
            tag(
                &format!("{page}.0.{index}"),
                &format!("2026-01-{:02}T00:00:00Z", page),
            )
        })
        .collect()
}

fn refs(tags: &[&str]) -> Vec<String> {
    std::iter::once(DEFAULT_REF.to_owned())
        .chain(tags.iter().map(|tag| format!("telorun/node:{tag}")))
        .collect()
}

// ---------------------------------------------------------------------------
// Tag filter (pure)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Rule {
    PinnedOnly,
    ExcludeSha,
    ExcludePrerelease,
}

impl Rule {
    fn filter(self) -> TagFilter {
        TagFilter {
            pinned_only: matches!(self, Rule::PinnedOnly),
            exclude_sha: matches!(self, Rule::ExcludeSha),
            exclude_prerelease: matches!(self, Rule::ExcludePrerelease),
            ..TagFilter::default()
        }
    }
}

#[rstest]
#[case::release_is_pinned("0.30.1", Rule::PinnedOnly, true)]
#[case::slim_variant_is_pinned("0.30.1-slim", Rule::PinnedOnly, true)]
#[case::rust_variant_is_pinned("0.30.1-rust-1.95.0", Rule::PinnedOnly, true)]
#[case::dotted_suffix_is_pinned("1.2.3.4", Rule::PinnedOnly, true)]
#[case::prerelease_is_still_pinned("0.30.1-rc.1", Rule::PinnedOnly, true)]
#[case::latest_moves("latest", Rule::PinnedOnly, false)]
#[case::latest_variant_moves("latest-rust-1.95.0-slim", Rule::PinnedOnly, false)]
#[case::major_moves("0", Rule::PinnedOnly, false)]
#[case::major_variant_moves("0-slim", Rule::PinnedOnly, false)]
#[case::minor_moves("0.30", Rule::PinnedOnly, false)]
#[case::other_suffix_separator_is_not_pinned("1.2.3_slim", Rule::PinnedOnly, false)]
#[case::non_ascii_digits_are_not_digits("١.٢.٣", Rule::PinnedOnly, false)]
#[case::sha_prefixed("sha-abc1234", Rule::ExcludeSha, false)]
#[case::sha_uppercase("SHA-ABC1234", Rule::ExcludeSha, false)]
#[case::bare_hex("deadbeef1234", Rule::ExcludeSha, false)]
#[case::long_number_reads_as_hex("2026010", Rule::ExcludeSha, false)]
#[case::six_hex_digits_are_too_short("abc123", Rule::ExcludeSha, true)]
#[case::sha_prefix_with_non_hex("sha-xyz1234", Rule::ExcludeSha, true)]
#[case::release_is_not_a_sha("0.30.1", Rule::ExcludeSha, true)]
#[case::rc_dropped("0.30.1-rc.1", Rule::ExcludePrerelease, false)]
#[case::rc_variant_dropped("0.30.1-rc.1-slim", Rule::ExcludePrerelease, false)]
#[case::uppercase_identifier_dropped("0.30.1-RC.2", Rule::ExcludePrerelease, false)]
#[case::alpha_dropped("1.0.0-alpha", Rule::ExcludePrerelease, false)]
#[case::beta_dropped("1.0.0-beta.3", Rule::ExcludePrerelease, false)]
#[case::nightly_dropped("1.0.0-nightly.20260101", Rule::ExcludePrerelease, false)]
#[case::canary_dropped("1.0.0-canary-abc", Rule::ExcludePrerelease, false)]
#[case::snapshot_dropped("1.0.0-snapshot", Rule::ExcludePrerelease, false)]
#[case::slim_kept("0.30.1-slim", Rule::ExcludePrerelease, true)]
#[case::rust_kept("0.30.1-rust-1.95.0", Rule::ExcludePrerelease, true)]
#[case::similar_identifier_kept("1.0.0-rcx", Rule::ExcludePrerelease, true)]
#[case::dotted_suffix_is_no_prerelease("1.0.0.rc", Rule::ExcludePrerelease, true)]
#[case::moving_tag_is_no_prerelease("latest-rc", Rule::ExcludePrerelease, true)]
fn each_builtin_rule_keeps_or_drops_a_tag(
    #[case] tag: &str,
    #[case] rule: Rule,
    #[case] kept: bool,
) {
    assert_eq!(rule.filter().keeps(tag), kept, "{rule:?} on {tag:?}");
    assert_eq!(filter_tags(&[tag], &rule.filter()).len(), usize::from(kept));
}

const SAMPLE: [&str; 16] = [
    "latest",
    "latest-slim",
    "0",
    "0-slim",
    "0.30",
    "0.30-slim",
    "0.30.1",
    "0.30.1-slim",
    "0.30.0",
    "0.29.3-slim",
    "latest-rust-1.95.0-slim",
    "0.30.1-rust-1.95.0",
    "0.30.1-rc.1",
    "0.30.1-rc.1-slim",
    "sha-abc1234",
    "deadbeef1234",
];

#[test]
fn the_three_flags_together_yield_the_release_menu_in_input_order() {
    let filter = TagFilter {
        pinned_only: true,
        exclude_sha: true,
        exclude_prerelease: true,
        ..TagFilter::default()
    };
    assert_eq!(
        filter_tags(&SAMPLE, &filter),
        [
            "0.30.1",
            "0.30.1-slim",
            "0.30.0",
            "0.29.3-slim",
            "0.30.1-rust-1.95.0"
        ]
    );
}

#[test]
fn a_filter_without_rules_keeps_everything() {
    assert_eq!(filter_tags(&SAMPLE, &TagFilter::default()), SAMPLE);
}

#[test]
fn include_keeps_only_matching_tags() {
    let filter = TagFilter {
        include: vec![Regex::new("-slim$").unwrap()],
        ..TagFilter::default()
    };
    assert_eq!(
        filter_tags(&SAMPLE, &filter),
        [
            "latest-slim",
            "0-slim",
            "0.30-slim",
            "0.30.1-slim",
            "0.29.3-slim",
            "latest-rust-1.95.0-slim",
            "0.30.1-rc.1-slim",
        ]
    );
}

#[test]
fn exclude_drops_matches_even_when_include_kept_them() {
    let filter = TagFilter {
        pinned_only: true,
        include: vec![
            Regex::new("^0\\.30\\.1").unwrap(),
            Regex::new("^0\\.29").unwrap(),
        ],
        exclude: vec![Regex::new("-rust-").unwrap(), Regex::new("rc").unwrap()],
        ..TagFilter::default()
    };
    assert_eq!(
        filter_tags(&SAMPLE, &filter),
        ["0.30.1", "0.30.1-slim", "0.29.3-slim"]
    );
}

// ---------------------------------------------------------------------------
// Reference parsing (pure)
// ---------------------------------------------------------------------------

fn hub_ref(namespace: &str, repository: &str, tag: &str, digest: Option<&str>) -> HubRef {
    HubRef {
        namespace: namespace.to_owned(),
        repository: repository.to_owned(),
        tag: tag.to_owned(),
        digest: digest.map(str::to_owned),
    }
}

#[rstest]
#[case::namespace_repo_tag(
    "telorun/node:latest-slim",
    Some(hub_ref("telorun", "node", "latest-slim", None))
)]
#[case::bare_name_defaults("node", Some(hub_ref("library", "node", "latest", None)))]
#[case::bare_name_with_tag("node:20", Some(hub_ref("library", "node", "20", None)))]
#[case::docker_io_stripped(
    "docker.io/telorun/node:0.30.1",
    Some(hub_ref("telorun", "node", "0.30.1", None))
)]
#[case::index_host_stripped(
    "index.docker.io/library/node:20",
    Some(hub_ref("library", "node", "20", None))
)]
#[case::registry_1_host_stripped(
    "registry-1.docker.io/node",
    Some(hub_ref("library", "node", "latest", None))
)]
#[case::digest_carried(
    "telorun/node@sha256:abc",
    Some(hub_ref("telorun", "node", "latest", Some("sha256:abc")))
)]
#[case::tag_and_digest(
    "telorun/node:1.0@sha256:abc",
    Some(hub_ref("telorun", "node", "1.0", Some("sha256:abc")))
)]
#[case::empty_digest_is_none("telorun/node:1.0@", Some(hub_ref("telorun", "node", "1.0", None)))]
#[case::deeper_path_stays_in_repository("a/b/c:1", Some(hub_ref("a", "b/c", "1", None)))]
#[case::ghcr("ghcr.io/telorun/node:latest", None)]
#[case::registry_with_port("registry.telo-runner.svc:5000/x:y", None)]
#[case::localhost("localhost/x", None)]
#[case::localhost_with_port("localhost:5000/x:1", None)]
#[case::host_match_is_case_sensitive("DOCKER.IO/x", None)]
fn docker_hub_references_parse_into_coordinates(
    #[case] reference: &str,
    #[case] expected: Option<HubRef>,
) {
    assert_eq!(parse_docker_hub_ref(reference), expected);
}

// ---------------------------------------------------------------------------
// Catalog construction
// ---------------------------------------------------------------------------

#[rstest]
#[case::not_a_url("not a url")]
#[case::not_http("ftp://hub.example")]
#[case::cannot_be_a_base("mailto:hub@example.com")]
fn an_unusable_hub_url_is_refused(#[case] hub_url: &str) {
    let mut options = CatalogOptions::new(
        "telorun/node",
        DEFAULT_REF,
        runner_core::http_client::client(),
    );
    options.hub_url = hub_url.to_owned();
    let err = BaseImageCatalog::new(options).unwrap_err();
    assert!(matches!(err, CatalogError::ParseHubUrl { .. }), "{err:?}");
}

#[test]
fn before_any_refresh_only_the_default_is_offered() {
    let catalog = BaseImageCatalog::new(CatalogOptions::new(
        "telorun/node",
        DEFAULT_REF,
        runner_core::http_client::client(),
    ))
    .unwrap();
    assert_eq!(catalog.current(), [DEFAULT_REF]);
    assert_eq!(catalog.default_ref(), DEFAULT_REF);
    assert!(catalog.is_allowed(DEFAULT_REF));
    assert!(!catalog.is_allowed("telorun/node:0.30.1"));
}

// ---------------------------------------------------------------------------
// Refresh: paging, sorting, filtering, limit
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_first_request_asks_for_pages_of_one_hundred() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![tag("0.30.1", "2026-06-15T00:00:00Z")]]);
    hub.catalog().refresh().await.unwrap();
    assert_eq!(
        hub.requests(),
        ["/v2/repositories/telorun/node/tags?page_size=100"]
    );
}

#[tokio::test]
async fn every_next_page_is_read_while_under_the_scan_cap() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![
        page_of_tags(1, 2),
        page_of_tags(2, 2),
        page_of_tags(3, 2),
    ]);
    let catalog = hub.catalog();
    catalog.refresh().await.unwrap();
    assert_eq!(hub.requests().len(), 3);
    assert_eq!(catalog.current().len(), 1 + 6);
}

#[tokio::test]
async fn paging_stops_once_the_scan_cap_is_reached_overshooting_by_at_most_a_page() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![
        page_of_tags(1, 60),
        page_of_tags(2, 60),
        page_of_tags(3, 60),
    ]);
    let catalog = hub.catalog_with(|options| {
        options.max_tags_scanned = 100;
        options.limit = 1_000;
    });
    catalog.refresh().await.unwrap();

    let requests = hub.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(requests[1].contains("page=2"), "{requests:?}");
    let offered: HashSet<String> = catalog.current().into_iter().collect();
    assert_eq!(offered.len(), 1 + 120);
    assert!(offered.contains("telorun/node:2.0.59"));
    assert!(!offered.contains("telorun/node:3.0.0"));
}

#[tokio::test]
async fn a_page_that_adds_no_tags_ends_paging_even_with_a_next_link() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![]]);
    hub.script().next_override = Some(format!(
        "{}/v2/repositories/telorun/node/tags?page=1&page_size=100",
        hub.base()
    ));
    let catalog = hub.catalog();
    catalog.refresh().await.unwrap();
    assert_eq!(hub.requests().len(), 1);
    assert_eq!(catalog.current(), [DEFAULT_REF]);
}

#[tokio::test]
async fn tags_are_offered_newest_first_filtered_and_limited_after_the_default() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![
        tag("0.30.0", "2026-06-14T00:00:00Z"),
        tag("0.30.1", "2026-06-15T00:00:00Z"),
        tag("0.29.9", "2026-06-10T00:00:00Z"),
        tag("latest", "2026-06-15T00:00:00Z"),
    ]]);
    let catalog = hub.catalog_with(|options| {
        options.filter.pinned_only = true;
        options.limit = 2;
    });
    catalog.refresh().await.unwrap();

    assert_eq!(catalog.current(), refs(&["0.30.1", "0.30.0"]));
    assert!(catalog.is_allowed("telorun/node:0.30.1"));
    assert!(
        !catalog.is_allowed("telorun/node:0.29.9"),
        "cut by the limit"
    );
    assert!(
        !catalog.is_allowed("telorun/node:latest"),
        "dropped by the filter"
    );
}

#[tokio::test]
async fn sorting_spans_pages_and_keeps_hub_order_for_equal_timestamps() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![
        vec![
            tag("1.0.0", "2026-01-01T00:00:00Z"),
            tag("1.0.1-slim", "2026-02-01T00:00:00Z"),
            tag("1.0.1", "2026-02-01T00:00:00Z"),
        ],
        vec![tag("2.0.0", "2026-03-01T00:00:00Z")],
    ]);
    let catalog = hub.catalog();
    catalog.refresh().await.unwrap();
    assert_eq!(
        catalog.current(),
        refs(&["2.0.0", "1.0.1-slim", "1.0.1", "1.0.0"])
    );
}

#[tokio::test]
async fn results_without_a_name_are_skipped_and_undated_ones_sort_last() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![
        json!({ "name": "undated" }),
        json!({ "last_updated": "2026-06-15T00:00:00Z" }),
        json!({ "name": 7, "last_updated": "2026-06-15T00:00:00Z" }),
        tag("dated", "2026-01-01T00:00:00Z"),
    ]]);
    let catalog = hub.catalog();
    catalog.refresh().await.unwrap();
    assert_eq!(catalog.current(), refs(&["dated", "undated"]));
}

#[tokio::test]
async fn the_default_is_offered_once_and_first_even_when_the_filter_drops_it() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![
        tag("0.30.0", "2026-06-14T00:00:00Z"),
        tag("0.30.1", "2026-06-15T00:00:00Z"),
    ]]);
    let catalog = hub.catalog_with(|options| {
        options.default_ref = "telorun/node:0.30.0".to_owned();
        options.filter.pinned_only = true;
    });
    catalog.refresh().await.unwrap();
    assert_eq!(
        catalog.current(),
        ["telorun/node:0.30.0", "telorun/node:0.30.1"]
    );

    let moving_default = hub.catalog_with(|options| options.filter.pinned_only = true);
    moving_default.refresh().await.unwrap();
    assert!(moving_default.is_allowed(DEFAULT_REF));
}

#[tokio::test]
async fn a_bare_repository_name_is_looked_up_in_the_library_namespace() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![tag("20", "2026-06-15T00:00:00Z")]]);
    let catalog = hub.catalog_with(|options| {
        options.repository = "node".to_owned();
        options.default_ref = "node:lts".to_owned();
    });
    catalog.refresh().await.unwrap();
    assert_eq!(
        hub.requests(),
        ["/v2/repositories/library/node/tags?page_size=100"]
    );
    assert_eq!(catalog.current(), ["node:lts", "node:20"]);
}

#[tokio::test]
async fn a_hub_url_with_a_path_prefix_keeps_it() {
    let hub = FakeHub::start().await;
    let catalog = hub.catalog_with(|options| options.hub_url = format!("{}/mirror/", hub.base()));
    catalog.refresh().await.unwrap();
    assert_eq!(
        hub.requests(),
        ["/mirror/v2/repositories/telorun/node/tags?page_size=100"]
    );
}

// ---------------------------------------------------------------------------
// Refresh: failures
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_failed_refresh_keeps_serving_the_last_good_list() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![tag("0.30.1", "2026-06-15T00:00:00Z")]]);
    let catalog = hub.catalog();
    catalog.refresh().await.unwrap();
    let good = catalog.current();
    assert_eq!(good, refs(&["0.30.1"]));

    hub.script().fail_with = Some(StatusCode::SERVICE_UNAVAILABLE);
    catalog.refresh().await.unwrap_err();
    assert_eq!(catalog.current(), good);
    assert!(catalog.is_allowed("telorun/node:0.30.1"));
}

#[tokio::test]
async fn a_failure_before_the_first_success_serves_only_the_default() {
    let hub = FakeHub::start().await;
    hub.script().fail_with = Some(StatusCode::INTERNAL_SERVER_ERROR);
    let catalog = hub.catalog();
    catalog.refresh().await.unwrap_err();
    assert_eq!(catalog.current(), [DEFAULT_REF]);
    assert!(catalog.is_allowed(DEFAULT_REF));
}

#[rstest]
#[case(StatusCode::SERVICE_UNAVAILABLE, "503 Service Unavailable")]
#[case(StatusCode::NOT_FOUND, "404 Not Found")]
#[case(StatusCode::TOO_MANY_REQUESTS, "429 Too Many Requests")]
#[tokio::test]
async fn a_refused_tags_request_names_the_repository_status_and_reason(
    #[case] status: StatusCode,
    #[case] rendered: &str,
) {
    let hub = FakeHub::start().await;
    hub.script().fail_with = Some(status);
    let err = hub.catalog().refresh().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("Docker Hub tags request for 'telorun/node' failed: {rendered}")
    );
}

#[tokio::test]
async fn a_next_link_to_another_origin_is_not_followed() {
    let hub = FakeHub::start().await;
    let elsewhere = FakeHub::start().await;
    elsewhere.serve_pages(vec![vec![tag("9.9.9", "2030-01-01T00:00:00Z")]]);
    hub.serve_pages(vec![vec![tag("0.30.1", "2026-06-15T00:00:00Z")]]);
    hub.script().next_override = Some(format!(
        "{}/v2/repositories/telorun/node/tags?page=2&page_size=100",
        elsewhere.base()
    ));

    let catalog = hub.catalog();
    catalog.refresh().await.unwrap();
    assert_eq!(catalog.current(), refs(&["0.30.1"]));
    assert_eq!(hub.requests().len(), 1);
    assert!(elsewhere.requests().is_empty());
}

#[rstest]
#[case::announced(Oversized::Announced)]
#[case::streamed(Oversized::Streamed)]
#[tokio::test]
async fn an_oversized_answer_is_refused_without_reading_it_whole(#[case] oversized: Oversized) {
    let hub = FakeHub::start().await;
    hub.script().oversized = Some(oversized);
    let err = hub.catalog().refresh().await.unwrap_err();
    assert!(
        matches!(
            err,
            CatalogError::FetchTags {
                source: HubRequestError::BodyTooLarge { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_answer_that_is_not_json_fails_the_refresh() {
    let hub = FakeHub::start().await;
    hub.script().fail_with = Some(StatusCode::OK);
    let err = hub.catalog().refresh().await.unwrap_err();
    assert!(
        matches!(
            err,
            CatalogError::FetchTags {
                source: HubRequestError::Decode { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_hub_that_never_answers_times_out() {
    let hub = FakeHub::start().await;
    hub.script().hang = true;
    let catalog = hub.catalog_with(|options| options.request_timeout = Duration::from_millis(200));
    let err = tokio::time::timeout(WAIT, catalog.refresh())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Docker Hub tags request for 'telorun/node' failed: no complete answer within 200ms"
    );
}

// ---------------------------------------------------------------------------
// Allowlist
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_allowlist_error_lists_every_offered_image() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![
        tag("0.30.0", "2026-06-14T00:00:00Z"),
        tag("0.30.1", "2026-06-15T00:00:00Z"),
    ]]);
    let catalog = hub.catalog();
    assert_eq!(
        catalog.allowlist_error("evil/image:1").to_string(),
        "base image 'evil/image:1' is not offered by this runner. Allowed images: \
         telorun/node:latest-slim"
    );

    catalog.refresh().await.unwrap();
    assert!(!catalog.is_allowed("evil/image:1"));
    assert!(
        !catalog.is_allowed("docker.io/telorun/node:0.30.1"),
        "exact match only"
    );
    assert_eq!(
        catalog.allowlist_error("evil/image:1").to_string(),
        "base image 'evil/image:1' is not offered by this runner. Allowed images: \
         telorun/node:latest-slim, telorun/node:0.30.1, telorun/node:0.30.0"
    );
}

// ---------------------------------------------------------------------------
// Digest resolution
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_digest_comes_from_the_tag_body() {
    let hub = FakeHub::start().await;
    hub.script().tag_details.insert(
        "/v2/repositories/telorun/node/tags/latest-slim".to_owned(),
        json!({ "digest": "sha256:abc123", "images": [{ "digest": "sha256:zzz" }] }),
    );
    let digest = hub
        .catalog()
        .resolve_tag_digest("telorun/node:latest-slim")
        .await;
    assert_eq!(digest.as_deref(), Some("sha256:abc123"));
}

#[tokio::test]
async fn without_a_tag_digest_the_first_image_digest_is_used() {
    let hub = FakeHub::start().await;
    hub.script().tag_details.insert(
        "/v2/repositories/library/node/tags/20-slim".to_owned(),
        json!({ "images": [{ "architecture": "amd64" }, { "digest": "sha256:img" }, { "digest": "sha256:later" }] }),
    );
    let digest = hub
        .catalog()
        .resolve_tag_digest("docker.io/node:20-slim")
        .await;
    assert_eq!(digest.as_deref(), Some("sha256:img"));
}

#[tokio::test]
async fn a_tag_without_any_digest_resolves_to_none() {
    let hub = FakeHub::start().await;
    hub.script().tag_details.insert(
        "/v2/repositories/telorun/node/tags/latest".to_owned(),
        json!({ "name": "latest", "images": [] }),
    );
    assert_eq!(hub.catalog().resolve_tag_digest("telorun/node").await, None);
    assert_eq!(
        hub.requests(),
        ["/v2/repositories/telorun/node/tags/latest"]
    );
}

#[tokio::test]
async fn a_pinned_reference_resolves_without_a_request() {
    let hub = FakeHub::start().await;
    let digest = hub
        .catalog()
        .resolve_tag_digest("telorun/node@sha256:deadbeef")
        .await;
    assert_eq!(digest.as_deref(), Some("sha256:deadbeef"));
    assert!(hub.requests().is_empty());
}

#[tokio::test]
async fn a_reference_to_another_registry_resolves_to_none_without_a_request() {
    let hub = FakeHub::start().await;
    assert_eq!(
        hub.catalog().resolve_tag_digest("ghcr.io/foo/bar:1").await,
        None
    );
    assert!(hub.requests().is_empty());
}

#[tokio::test]
async fn a_failed_tag_request_resolves_to_none() {
    let hub = FakeHub::start().await;
    assert_eq!(
        hub.catalog()
            .resolve_tag_digest("telorun/node:missing")
            .await,
        None
    );
    assert_eq!(
        hub.requests(),
        ["/v2/repositories/telorun/node/tags/missing"]
    );
}

// ---------------------------------------------------------------------------
// Background refresher
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_refresher_refreshes_periodically_and_stops_when_cancelled() {
    let hub = FakeHub::start().await;
    hub.serve_pages(vec![vec![tag("0.30.1", "2026-06-15T00:00:00Z")]]);
    let catalog = Arc::new(hub.catalog());
    let stop = CancellationToken::new();
    let refresher = Arc::clone(&catalog).spawn_refresher(Duration::from_millis(10), stop.clone());

    // Refreshes run one after another, so a second request means the first
    // refresh has already stored its list.
    hub.wait_for_requests(2).await;
    assert_eq!(catalog.current(), refs(&["0.30.1"]));

    stop.cancel();
    tokio::time::timeout(WAIT, refresher)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn the_refresher_keeps_going_after_failures() {
    let hub = FakeHub::start().await;
    hub.script().fail_with = Some(StatusCode::BAD_GATEWAY);
    let catalog = Arc::new(hub.catalog());
    let stop = CancellationToken::new();
    let refresher = Arc::clone(&catalog).spawn_refresher(Duration::from_millis(10), stop.clone());

    hub.wait_for_requests(3).await;
    assert!(!refresher.is_finished());
    assert_eq!(catalog.current(), [DEFAULT_REF]);

    stop.cancel();
    tokio::time::timeout(WAIT, refresher)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn cancelling_abandons_a_refresh_in_flight() {
    let hub = FakeHub::start().await;
    hub.script().hang = true;
    let catalog = Arc::new(hub.catalog_with(|options| {
        options.request_timeout = Duration::from_secs(3_600);
    }));
    let stop = CancellationToken::new();
    let refresher = Arc::clone(&catalog).spawn_refresher(Duration::from_millis(10), stop.clone());

    hub.wait_for_requests(1).await;
    stop.cancel();
    tokio::time::timeout(WAIT, refresher)
        .await
        .unwrap()
        .unwrap();
}
