//! The Kubernetes backend's configuration, read from the environment once at
//! boot (docs/contract.md §9.1).
//!
//! Variables are evaluated in the reference's order — `RUNNER_SELF_URL` first,
//! then the session namespace, the core config, and the backend's own fields —
//! so an environment with several mistakes reports the same one the reference
//! runner would, with the same sentence. Anything wrong is refused here, with
//! exit code 2 at the binary: a runner that boots on a typo and then fails
//! every session is harder to diagnose than one that does not boot.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use runner_core::config::{ConfigError, CoreConfig, Env, IntegerRange, Setting, load_core_config};
use runner_core::env::env_string;
use runner_core::types::PullPolicy;

use crate::images::telo::{
    DEFAULT_TELO_IMAGE_REPOSITORY, DEFAULT_TELO_IMAGE_VARIANT, TeloImageSource,
};

/// The port the Kubernetes runner listens on when `PORT` is unset; the core
/// default (8061) belongs to the Docker runner, and the chart's Service
/// targets this one.
pub const DEFAULT_PORT: u16 = 8062;

pub const DEFAULT_DISPLAY_NAME: &str = "Telo Runner";
pub const DEFAULT_DESCRIPTION: &str = "Runs the Telo application in a cloud environment";
pub const DEFAULT_SESSION_NAMESPACE: &str = "telo-sessions";
/// A source-checkout fallback only: the container image bakes the kernel
/// image it was built against into `RUNNER_IMAGE`.
pub const DEFAULT_IMAGE: &str = "telorun/node:latest-slim";
/// The bundle-fetch init container runs `wget` and `tar`, nothing else.
pub const DEFAULT_INIT_IMAGE: &str = "busybox:stable";
/// The runner's own image, whose `telo-runner workspace` serves a watch
/// pod's workspace to the runner.
pub const DEFAULT_WORKSPACE_IMAGE: &str = concat!("telo-runner:", env!("CARGO_PKG_VERSION"));
pub const DEFAULT_MANAGED_BY: &str = "telo-k8s-runner";

/// Run-session ceilings are sized for a pod that downloads and resolves its
/// own module closure into an emptyDir: the older 50m / 100Mi / 512Mi meant an
/// OOM kill on memory and an eviction on ephemeral storage for an ordinary app.
pub const DEFAULT_MAX_CPU: &str = "500m";
pub const DEFAULT_MAX_MEMORY: &str = "512Mi";
pub const DEFAULT_MAX_EPHEMERAL_STORAGE: &str = "1Gi";

pub const DEFAULT_BASE_IMAGE_REPOSITORY: &str = "telorun/node";
pub const DEFAULT_DOCKER_HUB_URL: &str = "https://hub.docker.com";

/// Kubernetes settings refused for a reason of their own (not one shape
/// of value among many).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeConfigRefusal {
    /// The init containers fetch the bundle from the runner's own URL.
    #[error(
        "RUNNER_SELF_URL env var is required. Set it to the runner's in-cluster base URL (e.g. \
         http://k8s-runner.telo-runner.svc:8062) so session initContainers can fetch the bundle."
    )]
    SelfUrlRequired,
    /// Gateway routing without a Gateway to attach routes to.
    #[error(
        "SESSION_ROUTING_MODE=gateway requires SESSION_GATEWAY_NAME \u{2014} the Gateway each \
         session's HTTPRoute attaches to. Set it (and SESSION_GATEWAY_NAMESPACE when the Gateway \
         is not in '{session_namespace}')."
    )]
    GatewayNameRequired { session_namespace: String },
}

/// Everything the Kubernetes backend is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sConfig {
    pub core: CoreConfig,
    /// Shown by clients in the runner picker (`/v1/capabilities`).
    pub display_name: String,
    pub description: String,
    /// Where session pods, services and routing objects are created.
    pub session_namespace: String,
    pub default_image: String,
    pub init_image: String,
    /// `RUNNER_WORKSPACE_IMAGE`: the image of a watch pod's `workspace`
    /// container (`telo-runner workspace`), normally the runner's own.
    pub workspace_image: String,
    /// `RUNNER_WORKSPACE_MAX_*`: what a watch session's workspace may hold,
    /// enforced by every watch pod's workspace service.
    pub workspace_limits: runner_workspace::WorkspaceLimits,
    /// dockerconfig Secret in the session namespace the kubelet pulls session
    /// images with (the kernel image and any private catalog image).
    pub image_pull_secret: Option<String>,
    /// Sandbox RuntimeClass (gVisor, Kata); unset means the cluster default.
    pub runtime_class: Option<String>,
    /// The runner's in-cluster base URL without trailing slashes; the init
    /// container fetches the bundle from `<self_url>/internal/bundles/<id>`.
    pub self_url: String,
    /// Value of `app.kubernetes.io/managed-by` on every session object; the
    /// selector of the shared informer and of adoption.
    pub managed_by: String,
    pub limits: LimitCeilings,
    pub app_limits: LimitCeilings,
    pub routing: RoutingConfig,
    pub base_image_catalog: BaseImageCatalogConfig,
    /// Where the image of a named telo release comes from, and the pull
    /// policy of every image the runner chooses itself.
    pub telo_images: TeloImageSource,
    pub orphan_policy: OrphanPolicy,
    pub start_deadline: Duration,
    /// `RUNNER_WARM_POOL`: ready run pods kept per kernel image.
    pub warm_pools: Vec<PoolSpec>,
    /// `RUNNER_WARM_POOL_SURGE`: the most pods one pool has starting
    /// (created, not ready yet) at once.
    pub warm_pool_surge: usize,
    /// `RUNNER_WARM_POOL_WATCH`: ready watch pods (one app, no agent) kept
    /// per kernel image.
    pub watch_pools: Vec<PoolSpec>,
    /// `RUNNER_WARM_POOL_MODULES`: the standard modules whose controllers
    /// a warm pod's kernel cache is warmed with before it is offered;
    /// empty: no warm-up.
    pub warm_pool_modules: Vec<String>,
    /// `RUNNER_PEER_TOKEN_FILE` and the replica settings: set, this runner
    /// is one of several replicas of the installation.
    pub replication: Option<ReplicationConfig>,
}

/// One replica of several serving an installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// `RUNNER_REPLICA_ID`: this replica's name, unique in the installation.
    pub id: String,
    /// `RUNNER_REPLICA_URL`: how peers reach this replica's API.
    pub url: String,
    /// The installation's shared secret for replica-to-replica calls.
    pub token: PeerTokenText,
    /// `RUNNER_LEASE_DURATION_SECONDS`: how long a replica's Lease holds
    /// without a renewal before peers take its sessions over.
    pub lease_duration: Duration,
}

/// The peer secret, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerTokenText(pub String);

impl std::fmt::Debug for PeerTokenText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTokenText(…)")
    }
}

/// Operator ceilings for one session shape. Quantities stay strings: they are
/// handed to Kubernetes as written, and [`crate::pod::limits`] compares them only
/// when a request asks for less.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitCeilings {
    pub cpu: String,
    pub memory: String,
    pub ttl_seconds: u64,
    pub ephemeral_storage: String,
}

/// Which layer per-session routes are published on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoutingMode {
    /// Decide from what is configured, then from what the cluster serves, and
    /// refuse to boot when that is ambiguous.
    Auto,
    /// `networking.k8s.io/v1` Ingress.
    Ingress,
    /// `gateway.networking.k8s.io` HTTPRoute.
    Gateway,
    /// Publish nothing: sessions are logs-only even with a base domain.
    None,
}

impl RoutingMode {
    pub const ALL: [RoutingMode; 4] = [Self::Auto, Self::Ingress, Self::Gateway, Self::None];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ingress => "ingress",
            Self::Gateway => "gateway",
            Self::None => "none",
        }
    }

    /// Exact, case-sensitive match, as the reference.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|mode| mode.as_str() == raw)
    }
}

impl fmt::Display for RoutingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The Gateway a session's HTTPRoute attaches to. It is configured, never
/// discovered: picking one of several Gateways is a guess, and a route on the
/// wrong Gateway fails as silently as no route at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayParent {
    pub name: String,
    /// Defaults to the session namespace, as Gateway API's own
    /// `parentRefs[].namespace` defaults to the route's namespace.
    pub namespace: String,
    /// The listener to attach to, when only one of several should carry
    /// session traffic.
    pub section_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingConfig {
    pub mode: RoutingMode,
    /// Wildcard domain of per-session hosts (`<port>-<id>.<base_domain>`);
    /// without it no host can be built, so routing is off whatever the mode.
    pub base_domain: Option<String>,
    pub ingress_class_name: Option<String>,
    /// `kubernetes.io/tls` Secret the session Ingress presents. Ingress only:
    /// under Gateway API the certificate belongs to the Gateway's listener.
    pub tls_secret_name: Option<String>,
    /// Annotations every session Ingress carries (`SESSION_INGRESS_ANNOTATIONS`),
    /// `{sessionId}` in a value standing for the session's id: how an
    /// operator has the ingress controller check workload tokens.
    pub ingress_annotations: BTreeMap<String, String>,
    pub gateway: Option<GatewayParent>,
    /// How long a published route may stay unclaimed by any controller before
    /// it is reported `unprogrammed`.
    pub route_ready_timeout: Duration,
}

/// The menu of base images a session may pick, read from Docker Hub tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseImageCatalogConfig {
    pub enabled: bool,
    /// Docker Hub `namespace/repository`.
    pub repository: String,
    pub filter: TagFilter,
    /// How many tags are offered at most.
    pub limit: usize,
    pub refresh_interval: Duration,
    /// Docker Hub's base URL without trailing slashes. Not in the reference:
    /// it lets tests and air-gapped mirrors serve the tag list themselves.
    pub hub_url: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagFilter {
    /// Only tags that name an exact version.
    pub pinned_only: bool,
    pub exclude_sha: bool,
    pub exclude_prerelease: bool,
    /// Regular-expression sources (Rust `regex` syntax), already validated.
    pub include: Option<String>,
    pub exclude: Option<String>,
}

/// What the runner does at boot with session pods a previous process left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OrphanPolicy {
    /// Take live sessions over (re-attach, rebuild history, resume status);
    /// delete only finished or expired ones.
    #[default]
    Adopt,
    /// Delete every session pod, as the reference runner does.
    Reap,
}

impl OrphanPolicy {
    pub const ALL: [OrphanPolicy; 2] = [Self::Adopt, Self::Reap];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Adopt => "adopt",
            Self::Reap => "reap",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|policy| policy.as_str() == raw)
    }
}

impl fmt::Display for OrphanPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads the whole Kubernetes backend configuration; the first invalid
/// variable in evaluation order is the error.
pub fn load_k8s_config(env: &Env) -> Result<K8sConfig, ConfigError> {
    let self_url = load_self_url(env)?;
    let session_namespace = RUNNER_SESSION_NAMESPACE.string_or_default(env);
    let core = load_core_config(env, DEFAULT_PORT)?;
    let display_name = RUNNER_DISPLAY_NAME.string_or_default(env);
    let description = RUNNER_DESCRIPTION.string_or_default(env);
    let default_image = RUNNER_IMAGE.string_or_default(env);
    let init_image = RUNNER_INIT_IMAGE.string_or_default(env);
    let workspace_image = RUNNER_WORKSPACE_IMAGE.string_or_default(env);
    let workspace_limits = runner_workspace_service::workspace_limits_from_env(env)?;
    let image_pull_secret = RUNNER_IMAGE_PULL_SECRET.string(env);
    let runtime_class = RUNNER_RUNTIME_CLASS.string(env);
    let routing = load_routing_config(env, &session_namespace)?;
    let managed_by = RUNNER_MANAGED_BY.string_or_default(env);
    let limits = load_ceilings(env, &RUN_CEILINGS)?;
    let app_limits = load_ceilings(env, &APP_CEILINGS)?;
    let base_image_catalog = load_base_image_catalog(env)?;
    let telo_images = load_telo_images(env)?;
    // Our additions come last so they never change which reference error an
    // environment produces.
    let orphan_policy = load_orphan_policy(env)?;
    let start_deadline = Duration::from_secs(RUNNER_START_DEADLINE_SECONDS.positive_int(env)?);
    let warm_pools = load_warm_pools(env)?;
    let warm_pool_surge = load_warm_pool_surge(env)?;
    let watch_pools = load_watch_pools(env, core.watch.enabled)?;
    let warm_pool_modules = load_warm_pool_modules(env)?;
    let replication = load_replication(env, core.port)?;
    Ok(K8sConfig {
        core,
        display_name,
        description,
        session_namespace,
        default_image,
        init_image,
        workspace_image,
        workspace_limits,
        image_pull_secret,
        runtime_class,
        self_url,
        managed_by,
        limits,
        app_limits,
        routing,
        base_image_catalog,
        telo_images,
        orphan_policy,
        start_deadline,
        warm_pools,
        warm_pool_surge,
        watch_pools,
        warm_pool_modules,
        replication,
    })
}

/// The shortest peer secret accepted.
pub const MIN_PEER_TOKEN_BYTES: usize = 32;
/// The shortest Lease a replica may hold: it renews every third of it.
pub const MIN_LEASE_DURATION_SECONDS: u64 = 3;

/// `RUNNER_PEER_TOKEN_FILE` with `RUNNER_REPLICA_ID`, `RUNNER_REPLICA_URL`
/// and `RUNNER_LEASE_DURATION_SECONDS`: `None` without the token file (the
/// runner is the installation's only replica).
fn load_replication(env: &Env, port: u16) -> Result<Option<ReplicationConfig>, ConfigError> {
    let duration = RUNNER_LEASE_DURATION_SECONDS.positive_int(env)?;
    if duration < MIN_LEASE_DURATION_SECONDS {
        return Err(ConfigError::invalid(
            RUNNER_LEASE_DURATION_SECONDS.name,
            &format!("be a whole number of seconds from {MIN_LEASE_DURATION_SECONDS}"),
            &duration.to_string(),
        ));
    }
    let id = RUNNER_REPLICA_ID.string(env);
    let url = RUNNER_REPLICA_URL.string(env);
    let Some(path) = RUNNER_PEER_TOKEN_FILE.string(env) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path).map_err(|err| ConfigError::UnreadableFile {
        var: RUNNER_PEER_TOKEN_FILE.name.to_owned(),
        path: path.clone(),
        reason: err.to_string(),
    })?;
    let token = text.trim().to_owned();
    if token.len() < MIN_PEER_TOKEN_BYTES {
        return Err(ConfigError::must_be(
            RUNNER_PEER_TOKEN_FILE.name,
            format!(
                "a file holding a secret of at least {MIN_PEER_TOKEN_BYTES} bytes ('{path}' holds {})",
                token.len()
            ),
        ));
    }
    let id = id
        .or_else(|| env_string(env, "POD_NAME"))
        .or_else(|| env_string(env, "HOSTNAME"))
        .ok_or_else(|| {
            ConfigError::conflict(
                RUNNER_PEER_TOKEN_FILE.name,
                "this replica has no name: set RUNNER_REPLICA_ID (or POD_NAME from the downward API).",
            )
        })?;
    if !is_replica_id(&id) {
        return Err(ConfigError::invalid(
            RUNNER_REPLICA_ID.name,
            "be a DNS label (lowercase letters, digits and dashes, at most 50 characters, starting and ending with a letter or digit)",
            &id,
        ));
    }
    let url = match url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => match env_string(env, "POD_IP") {
            Some(ip) if ip.contains(':') => format!("http://[{ip}]:{port}"),
            Some(ip) => format!("http://{ip}:{port}"),
            None => {
                return Err(ConfigError::conflict(
                    RUNNER_PEER_TOKEN_FILE.name,
                    "peers cannot reach this replica: set RUNNER_REPLICA_URL (or POD_IP from the downward API).",
                ));
            }
        },
    };
    let parsed = reqwest::Url::parse(&url).ok();
    if !parsed.as_ref().is_some_and(|u| {
        matches!(u.scheme(), "http" | "https") && u.host_str().is_some() && u.path() == "/"
    }) {
        return Err(ConfigError::invalid(
            RUNNER_REPLICA_URL.name,
            "be an absolute http(s) URL with no path (http://10.0.0.7:8062)",
            &url,
        ));
    }
    Ok(Some(ReplicationConfig {
        id,
        url,
        token: PeerTokenText(token),
        lease_duration: Duration::from_secs(duration),
    }))
}

/// A replica id names its Lease (`telo-runner-replica-<id>`), so it is a
/// DNS label short enough for that name.
fn is_replica_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !id.is_empty()
        && id.len() <= 50
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The most pods one pool may keep: a pool is a latency cushion, not a
/// reservation of the cluster.
pub const MAX_WARM_POOL_SIZE: usize = 100;

/// How many pods a pool starts at once by default (docs/benchmarks.md,
/// `warm-pool`, has the runs it was chosen from).
pub const DEFAULT_WARM_POOL_SURGE: usize = 4;

/// One pool of `RUNNER_WARM_POOL`: `size` pods of `image`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub image: String,
    pub size: usize,
}

/// `RUNNER_WARM_POOL`: `<image>=<count>` pairs separated by commas
/// (`telorun/node:latest-slim=5`). An image a telo release runs
/// (`telorun/node:0.96.0-slim`) pools that release.
fn load_warm_pools(env: &Env) -> Result<Vec<PoolSpec>, ConfigError> {
    load_pool_specs(env, RUNNER_WARM_POOL)
}

/// `RUNNER_WARM_POOL_WATCH`: `<image>=<count>` pairs like
/// `RUNNER_WARM_POOL`, of watch pods (one app, no agent). Watch sessions
/// must be on: a pool of pods no session can claim is refused.
fn load_watch_pools(env: &Env, watch_enabled: bool) -> Result<Vec<PoolSpec>, ConfigError> {
    const VAR: Setting = RUNNER_WARM_POOL_WATCH;
    let pools = load_pool_specs(env, VAR)?;
    if !watch_enabled && pools.iter().any(|pool| pool.size > 0) {
        return Err(ConfigError::invalid(
            VAR.name,
            "be empty unless RUNNER_WATCH_SESSIONS is true",
            &VAR.string(env).unwrap_or_default(),
        ));
    }
    Ok(pools)
}

/// `<image>=<count>` pairs separated by commas, from `VAR`.
fn load_pool_specs(env: &Env, setting: Setting) -> Result<Vec<PoolSpec>, ConfigError> {
    let Some(raw) = setting.string(env) else {
        return Ok(Vec::new());
    };
    let refuse = || {
        ConfigError::invalid(
            setting.name,
            &format!(
                "be a comma-separated list of <image>=<count>, each image once, counts 0 to {MAX_WARM_POOL_SIZE}"
            ),
            &raw,
        )
    };
    let mut pools: Vec<PoolSpec> = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (image, count) = entry.rsplit_once('=').ok_or_else(refuse)?;
        let image = image.trim();
        let size: usize = count.trim().parse().map_err(|_| refuse())?;
        if image.is_empty()
            || image.chars().any(char::is_whitespace)
            || size > MAX_WARM_POOL_SIZE
            || pools.iter().any(|pool| pool.image == image)
        {
            return Err(refuse());
        }
        pools.push(PoolSpec {
            image: image.to_owned(),
            size,
        });
    }
    Ok(pools)
}

/// `RUNNER_WARM_POOL_SURGE`: a whole number of pods from 1 to the largest
/// pool (more could never be starting at once).
fn load_warm_pool_surge(env: &Env) -> Result<usize, ConfigError> {
    const VAR: Setting = RUNNER_WARM_POOL_SURGE;
    let raw = VAR.raw(env);
    VAR.positive_int(env)
        .ok()
        .and_then(|surge| usize::try_from(surge).ok())
        .filter(|surge| *surge <= MAX_WARM_POOL_SIZE)
        .ok_or_else(|| {
            ConfigError::invalid(
                VAR.name,
                &format!("be a whole number of pods from 1 to {MAX_WARM_POOL_SIZE}"),
                raw.unwrap_or_default(),
            )
        })
}

/// The modules a warm pod's kernel cache is warmed with by default: those
/// the runner's own examples and the editor's templates import (an HTTP
/// API, its handlers, the console, scripts). The runner cannot list what a
/// kernel image ships without running it, and warming every module an
/// image holds would install controllers (Rust ones need a toolchain) no
/// session may use.
pub const DEFAULT_WARM_POOL_MODULES: [&str; 4] = ["http-server", "run", "console", "javascript"];

/// The most modules a warm-up imports.
pub const MAX_WARM_POOL_MODULES: usize = 32;

/// `RUNNER_WARM_POOL_MODULES`: `none` (no warm-up), or module names
/// separated by commas; unset or empty, [`DEFAULT_WARM_POOL_MODULES`].
fn load_warm_pool_modules(env: &Env) -> Result<Vec<String>, ConfigError> {
    const VAR: Setting = RUNNER_WARM_POOL_MODULES;
    let Some(raw) = VAR.string(env) else {
        return Ok(DEFAULT_WARM_POOL_MODULES.map(str::to_owned).to_vec());
    };
    if raw.trim() == "none" {
        return Ok(Vec::new());
    }
    let refuse = || {
        ConfigError::invalid(
            VAR.name,
            &format!(
                "be none or a comma-separated list of at most {MAX_WARM_POOL_MODULES} module names (lowercase letters and digits, words joined by single dashes), each once"
            ),
            &raw,
        )
    };
    let mut modules: Vec<String> = Vec::new();
    for name in raw.split(',').map(str::trim) {
        let valid = !name.is_empty()
            && name.split('-').all(|word| {
                !word.is_empty()
                    && word
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            });
        if !valid || name == "none" || modules.iter().any(|known| known == name) {
            return Err(refuse());
        }
        modules.push(name.to_owned());
    }
    if modules.len() > MAX_WARM_POOL_MODULES {
        return Err(refuse());
    }
    Ok(modules)
}

/// `RUNNER_SELF_URL`, trimmed and without trailing slashes. A value made only
/// of slashes is refused like a missing one (the reference accepted it and
/// handed the init container a host-less URL).
fn load_self_url(env: &Env) -> Result<String, ConfigError> {
    RUNNER_SELF_URL
        .string(env)
        .map(|url| url.trim_end_matches('/').to_owned())
        .filter(|url| !url.is_empty())
        .ok_or_else(|| ConfigError::refused(KubeConfigRefusal::SelfUrlRequired))
}

/// `SESSION_*` routing variables. Mode and the gateway-mode requirements are
/// checked here; what depends on the cluster is decided at boot by
/// [`crate::routing::mode::decide`].
pub fn load_routing_config(
    env: &Env,
    session_namespace: &str,
) -> Result<RoutingConfig, ConfigError> {
    let mode = load_routing_mode(env)?;
    let gateway_name = SESSION_GATEWAY_NAME.string(env);
    let tls_secret_name = SESSION_INGRESS_TLS_SECRET.string(env);

    // A certificate for a layer that never presents it is a silent downgrade to
    // plaintext origin traffic. This catches only the mode that names the layer
    // outright; under `auto` a named Gateway decides later, and the decision
    // repeats the check against the resolved layer.
    if mode == RoutingMode::Gateway && tls_secret_name.is_some() {
        return Err(ConfigError::conflict(
            SESSION_INGRESS_TLS_SECRET.name,
            "SESSION_ROUTING_MODE=gateway. Under Gateway API \
             the origin certificate belongs to the Gateway listener's own `tls.certificateRefs`, \
             not to the per-session route. Move the Secret reference to the Gateway and unset \
             this."
                .to_owned(),
        ));
    }
    if mode == RoutingMode::Gateway && gateway_name.is_none() {
        return Err(gateway_name_required(session_namespace));
    }

    let base_domain = SESSION_ROUTING_BASE_DOMAIN.string(env);
    let ingress_class_name = SESSION_INGRESS_CLASS.string(env);
    let gateway = gateway_name.map(|name| GatewayParent {
        name,
        namespace: SESSION_GATEWAY_NAMESPACE
            .string(env)
            .unwrap_or_else(|| session_namespace.to_owned()),
        section_name: SESSION_GATEWAY_SECTION_NAME.string(env),
    });
    let route_ready_timeout =
        Duration::from_secs(SESSION_ROUTE_READY_TIMEOUT_SECONDS.positive_int(env)?);
    let ingress_annotations = load_ingress_annotations(env)?;
    if mode == RoutingMode::Gateway && !ingress_annotations.is_empty() {
        return Err(ingress_annotations_under_gateway());
    }
    Ok(RoutingConfig {
        mode,
        base_domain,
        ingress_class_name,
        tls_secret_name,
        ingress_annotations,
        gateway,
        route_ready_timeout,
    })
}

/// `SESSION_INGRESS_ANNOTATIONS`: a JSON object of annotation keys to
/// string values. Keys are checked as the apiserver checks them, so a typo
/// stops the boot instead of failing every session's Ingress.
fn load_ingress_annotations(env: &Env) -> Result<BTreeMap<String, String>, ConfigError> {
    const VAR: Setting = SESSION_INGRESS_ANNOTATIONS;
    let Some(raw) = VAR.string(env) else {
        return Ok(BTreeMap::new());
    };
    let annotations: BTreeMap<String, String> =
        serde_json::from_str(&raw).map_err(|err| ConfigError::Malformed {
            var: VAR.name.to_owned(),
            expected: "a JSON object of annotation names to strings".to_owned(),
            reason: err.to_string(),
        })?;
    if let Some(key) = annotations.keys().find(|key| !is_qualified_name(key)) {
        return Err(ConfigError::invalid(
            VAR.name,
            "name each annotation as Kubernetes does ([prefix/]name: a DNS subdomain prefix, a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)",
            key,
        ));
    }
    Ok(annotations)
}

/// A Kubernetes qualified name: `[prefix/]name`, the prefix a DNS-1123
/// subdomain, the name at most 63 characters of `[A-Za-z0-9_.-]` that start
/// and end alphanumeric.
fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|prefix| {
        !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// Ingress annotations where no Ingress is made: a token check the operator
/// meant to have would be silently missing.
pub(crate) fn ingress_annotations_under_gateway() -> ConfigError {
    ConfigError::conflict(
        SESSION_INGRESS_ANNOTATIONS.name,
        "session routing is Gateway API, which makes no Ingress to carry them (the token check \
         they configure would be silently missing). Configure the check on the Gateway, or set \
         SESSION_ROUTING_MODE=ingress."
            .to_owned(),
    )
}

/// The refusal of gateway mode without a Gateway to attach routes to; shared
/// with the routing decision, which can meet a hand-built config.
pub(crate) fn gateway_name_required(session_namespace: &str) -> ConfigError {
    ConfigError::refused(KubeConfigRefusal::GatewayNameRequired {
        session_namespace: session_namespace.to_owned(),
    })
}

/// An unknown mode is refused rather than read as `auto`: a typo that silently
/// fell back to the default is the very failure explicit modes exist to end.
fn load_routing_mode(env: &Env) -> Result<RoutingMode, ConfigError> {
    let Some(raw) = SESSION_ROUTING_MODE.string(env) else {
        return Ok(RoutingMode::Auto);
    };
    RoutingMode::parse(&raw).ok_or_else(|| {
        let choices: Vec<&str> = RoutingMode::ALL.iter().map(|mode| mode.as_str()).collect();
        ConfigError::not_one_of(SESSION_ROUTING_MODE.name, &choices, &raw)
    })
}

/// The four variables of one set of ceilings.
struct CeilingSettings {
    cpu: Setting,
    memory: Setting,
    ttl_seconds: Setting,
    ephemeral_storage: Setting,
}

/// `RUNNER_MAX_*`: run sessions' ceilings.
const RUN_CEILINGS: CeilingSettings = CeilingSettings {
    cpu: RUNNER_MAX_CPU,
    memory: RUNNER_MAX_MEMORY,
    ttl_seconds: RUNNER_MAX_TTL_SECONDS,
    ephemeral_storage: RUNNER_MAX_EPHEMERAL_STORAGE,
};

/// `RUNNER_APP_MAX_*`: app and watch sessions' ceilings.
const APP_CEILINGS: CeilingSettings = CeilingSettings {
    cpu: RUNNER_APP_MAX_CPU,
    memory: RUNNER_APP_MAX_MEMORY,
    ttl_seconds: RUNNER_APP_MAX_TTL_SECONDS,
    ephemeral_storage: RUNNER_APP_MAX_EPHEMERAL_STORAGE,
};

/// One set of ceilings. Quantities are not validated here: an unparseable
/// ceiling is passed to Kubernetes as written, as the reference.
fn load_ceilings(env: &Env, settings: &CeilingSettings) -> Result<LimitCeilings, ConfigError> {
    let cpu = settings.cpu.string_or_default(env);
    let memory = settings.memory.string_or_default(env);
    let ttl_seconds = settings.ttl_seconds.positive_int(env)?;
    let ephemeral_storage = settings.ephemeral_storage.string_or_default(env);
    Ok(LimitCeilings {
        cpu,
        memory,
        ttl_seconds,
        ephemeral_storage,
    })
}

fn load_base_image_catalog(env: &Env) -> Result<BaseImageCatalogConfig, ConfigError> {
    let enabled = RUNNER_BASE_IMAGE_CATALOG_ENABLED.bool(env)?;
    let repository = RUNNER_BASE_IMAGE_REPO.string_or_default(env);
    let filter = TagFilter {
        pinned_only: RUNNER_BASE_IMAGE_PINNED_ONLY.bool(env)?,
        exclude_sha: RUNNER_BASE_IMAGE_EXCLUDE_SHA.bool(env)?,
        exclude_prerelease: RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE.bool(env)?,
        include: load_tag_regex(env, RUNNER_BASE_IMAGE_INCLUDE)?,
        exclude: load_tag_regex(env, RUNNER_BASE_IMAGE_EXCLUDE)?,
    };
    let limit_raw = RUNNER_BASE_IMAGE_LIMIT.raw(env);
    let limit = RUNNER_BASE_IMAGE_LIMIT
        .positive_int(env)
        .and_then(|limit| {
            usize::try_from(limit).map_err(|_| {
                ConfigError::invalid_integer(
                    RUNNER_BASE_IMAGE_LIMIT.name,
                    IntegerRange::Positive,
                    limit_raw.unwrap_or_default(),
                )
            })
        })?;
    let refresh_interval =
        Duration::from_secs(RUNNER_BASE_IMAGE_REFRESH_SECONDS.positive_int(env)?);
    let hub_url = load_hub_url(env)?;
    Ok(BaseImageCatalogConfig {
        enabled,
        repository,
        filter,
        limit,
        refresh_interval,
        hub_url,
    })
}

/// A tag filter is compiled once here so a bad pattern stops the boot instead
/// of emptying the image menu at the first refresh. The syntax is Rust's
/// `regex` (no look-around or back-references), which covers the tag
/// patterns operators write.
fn load_tag_regex(env: &Env, setting: Setting) -> Result<Option<String>, ConfigError> {
    let Some(source) = setting.string(env) else {
        return Ok(None);
    };
    regex::Regex::new(&source)
        .map(|_| Some(source))
        .map_err(|err| ConfigError::Malformed {
            var: setting.name.to_owned(),
            expected: "a valid regular expression".to_owned(),
            reason: err.to_string(),
        })
}

fn load_hub_url(env: &Env) -> Result<String, ConfigError> {
    let raw = RUNNER_DOCKER_HUB_URL.string_or_default(env);
    let url = raw.trim_end_matches('/');
    let has_host = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .is_some_and(|rest| !rest.is_empty());
    if has_host {
        Ok(url.to_owned())
    } else {
        Err(ConfigError::must_be(
            RUNNER_DOCKER_HUB_URL.name,
            format!("an http:// or https:// URL (got '{raw}')"),
        ))
    }
}

/// `RUNNER_TELO_IMAGE_*`, `RUNNER_TELO_UNRELEASED_IMAGE` and
/// `RUNNER_PULL_POLICY`. A mistyped pull policy stops the boot: read as the
/// default it would pull (or not) against what the operator asked for.
fn load_telo_images(env: &Env) -> Result<TeloImageSource, ConfigError> {
    let raw = RUNNER_PULL_POLICY.string_or_default(env);
    let pull_policy = PullPolicy::parse(&raw).ok_or_else(|| ConfigError::Invalid {
        var: RUNNER_PULL_POLICY.name.to_owned(),
        rule: format!("be one of {}", PullPolicy::ALL.join(", ")),
        value: raw,
    })?;
    Ok(TeloImageSource {
        repository: RUNNER_TELO_IMAGE_REPOSITORY.string_or_default(env),
        variant: RUNNER_TELO_IMAGE_VARIANT.string_or_default(env),
        unreleased: RUNNER_TELO_UNRELEASED_IMAGE.string(env),
        pull_policy,
    })
}

fn load_orphan_policy(env: &Env) -> Result<OrphanPolicy, ConfigError> {
    let raw = RUNNER_ORPHAN_POLICY.string_or_default(env);
    OrphanPolicy::parse(&raw).ok_or_else(|| {
        let choices: Vec<&str> = OrphanPolicy::ALL.iter().map(|p| p.as_str()).collect();
        ConfigError::not_one_of(RUNNER_ORPHAN_POLICY.name, &choices, &raw)
    })
}

pub const RUNNER_PEER_TOKEN_FILE: Setting = Setting {
    name: "RUNNER_PEER_TOKEN_FILE",
    default: "(unset: this runner is the installation's only replica)",
    description: "File holding the installation's shared secret (at least 32 bytes) for replica-to-replica calls; set, the runner is one of several replicas that find each other through Leases in its namespace, forward requests to a session's owner and take over the sessions of a replica that stops renewing its Lease.",
};

pub const RUNNER_REPLICA_ID: Setting = Setting {
    name: "RUNNER_REPLICA_ID",
    default: "(POD_NAME, else HOSTNAME)",
    description: "This replica's name, unique in the installation (a DNS label); reported as `replica` on the sessions it owns.",
};

pub const RUNNER_REPLICA_URL: Setting = Setting {
    name: "RUNNER_REPLICA_URL",
    default: "(http://$POD_IP:$PORT)",
    description: "How peer replicas reach this replica's API over the pod network; without it and without POD_IP a replicated runner does not start.",
};

pub const RUNNER_LEASE_DURATION_SECONDS: Setting = Setting {
    name: "RUNNER_LEASE_DURATION_SECONDS",
    default: "15",
    description: "Seconds a replica's Lease holds without a renewal (renewed every third of it); a replica that could not renew for most of it stops acting on its sessions, and once it lapses its peers take them over.",
};

pub const RUNNER_SELF_URL: Setting = Setting {
    name: "RUNNER_SELF_URL",
    default: "(required)",
    description: "The runner's in-cluster base URL (e.g. http://k8s-runner.telo-runner.svc:8062); session init containers fetch their bundle from it.",
};

pub const RUNNER_DISPLAY_NAME: Setting = Setting {
    name: "RUNNER_DISPLAY_NAME",
    default: DEFAULT_DISPLAY_NAME,
    description: "Name clients show for this runner.",
};

pub const RUNNER_DESCRIPTION: Setting = Setting {
    name: "RUNNER_DESCRIPTION",
    default: DEFAULT_DESCRIPTION,
    description: "One-line description clients show for this runner.",
};

pub const RUNNER_SESSION_NAMESPACE: Setting = Setting {
    name: "RUNNER_SESSION_NAMESPACE",
    default: DEFAULT_SESSION_NAMESPACE,
    description: "Namespace session pods, services and routes are created in; it must exist.",
};

pub const RUNNER_IMAGE: Setting = Setting {
    name: "RUNNER_IMAGE",
    default: DEFAULT_IMAGE,
    description: "Kernel image run sessions use when the request picks none.",
};

pub const RUNNER_INIT_IMAGE: Setting = Setting {
    name: "RUNNER_INIT_IMAGE",
    default: DEFAULT_INIT_IMAGE,
    description: "Image of the init container that downloads and unpacks the bundle; needs wget and tar.",
};

pub const RUNNER_WARM_POOL: Setting = Setting {
    name: "RUNNER_WARM_POOL",
    default: "(unset)",
    description: "Warm pools: `<image>=<count>` pairs, comma-separated (`telorun/node:latest-slim=5`); that many run pods of each kernel image are kept up and ready, and a run session of that image claims one instead of waiting for a new pod. Counts 0 to 100.",
};

pub const RUNNER_WARM_POOL_SURGE: Setting = Setting {
    name: "RUNNER_WARM_POOL_SURGE",
    default: "4",
    description: "Warm pools: the most pods one pool has starting (created, not ready yet) at once, 1 to 100; a drained pool refills this many at a time, so its refill does not crowd the cluster's container runtime.",
};

pub const RUNNER_WARM_POOL_WATCH: Setting = Setting {
    name: "RUNNER_WARM_POOL_WATCH",
    default: "(unset)",
    description: "Warm pools of watch pods: `<image>=<count>` pairs like `RUNNER_WARM_POOL`; that many watch pods of one app and no agent are kept up and ready per kernel image, and a watch session of that shape and image claims one. Other shapes start cold and say why. Needs `RUNNER_WATCH_SESSIONS=true`. Counts 0 to 100.",
};

pub const RUNNER_WARM_POOL_MODULES: Setting = Setting {
    name: "RUNNER_WARM_POOL_MODULES",
    default: "http-server,run,console,javascript",
    description: "Warm pools: the standard modules (names in the kernel image's `TELO_MODULES` directory, comma-separated) whose controllers a warm pod's kernel cache holds before the pod is offered: its `warm-up` init container runs `telo install` and `telo run` of a manifest importing them, so a session's kernel neither npm-installs nor builds them. `none`: no warm-up. A failed warm-up offers the pod with a cold cache (logged, and counted in `telo_runner_warm_pool_warm_ups_total`).",
};

pub const RUNNER_WORKSPACE_IMAGE: Setting = Setting {
    name: "RUNNER_WORKSPACE_IMAGE",
    default: DEFAULT_WORKSPACE_IMAGE,
    description: "Image of a watch pod's workspace container, which runs `telo-runner workspace`: the runner's own image (the chart sets it to the runner image).",
};

pub const RUNNER_IMAGE_PULL_SECRET: Setting = Setting {
    name: "RUNNER_IMAGE_PULL_SECRET",
    default: "(unset)",
    description: "dockerconfig Secret in the session namespace used to pull session images from a private registry.",
};

pub const RUNNER_RUNTIME_CLASS: Setting = Setting {
    name: "RUNNER_RUNTIME_CLASS",
    default: "(unset)",
    description: "RuntimeClass of session pods (e.g. gvisor); unset means the cluster default.",
};

pub const RUNNER_MANAGED_BY: Setting = Setting {
    name: "RUNNER_MANAGED_BY",
    default: DEFAULT_MANAGED_BY,
    description: "Value of the app.kubernetes.io/managed-by label on every session object; two runners sharing a namespace need different values.",
};

pub const RUNNER_MAX_CPU: Setting = Setting {
    name: "RUNNER_MAX_CPU",
    default: DEFAULT_MAX_CPU,
    description: "CPU limit (and request) of a run-session container.",
};

pub const RUNNER_MAX_MEMORY: Setting = Setting {
    name: "RUNNER_MAX_MEMORY",
    default: DEFAULT_MAX_MEMORY,
    description: "Memory limit (and request) of a run-session container.",
};

pub const RUNNER_MAX_TTL_SECONDS: Setting = Setting {
    name: "RUNNER_MAX_TTL_SECONDS",
    default: "3600",
    description: "Longest a run-session pod may run (activeDeadlineSeconds).",
};

pub const RUNNER_MAX_EPHEMERAL_STORAGE: Setting = Setting {
    name: "RUNNER_MAX_EPHEMERAL_STORAGE",
    default: DEFAULT_MAX_EPHEMERAL_STORAGE,
    description: "Ephemeral-storage limit of a run-session container; the module cache counts against it.",
};

pub const RUNNER_APP_MAX_CPU: Setting = Setting {
    name: "RUNNER_APP_MAX_CPU",
    default: DEFAULT_MAX_CPU,
    description: "CPU limit of app-session and watch-session containers.",
};

pub const RUNNER_APP_MAX_MEMORY: Setting = Setting {
    name: "RUNNER_APP_MAX_MEMORY",
    default: DEFAULT_MAX_MEMORY,
    description: "Memory limit of app-session and watch-session containers.",
};

/// App and watch sessions are operator-curated and long-lived, so they keep
/// their own ceilings (notably a six-hour TTL) without loosening the
/// anonymous run-session ones.
pub const RUNNER_APP_MAX_TTL_SECONDS: Setting = Setting {
    name: "RUNNER_APP_MAX_TTL_SECONDS",
    default: "21600",
    description: "Longest an app-session pod may run (activeDeadlineSeconds).",
};

pub const RUNNER_APP_MAX_EPHEMERAL_STORAGE: Setting = Setting {
    name: "RUNNER_APP_MAX_EPHEMERAL_STORAGE",
    default: DEFAULT_MAX_EPHEMERAL_STORAGE,
    description: "Ephemeral-storage limit of app-session and watch-session containers.",
};

pub const RUNNER_BASE_IMAGE_CATALOG_ENABLED: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_CATALOG_ENABLED",
    default: "true",
    description: "Offer clients a menu of base-image tags read from Docker Hub.",
};

pub const RUNNER_BASE_IMAGE_REPO: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_REPO",
    default: DEFAULT_BASE_IMAGE_REPOSITORY,
    description: "Docker Hub namespace/repository the base-image menu lists tags of.",
};

pub const RUNNER_BASE_IMAGE_PINNED_ONLY: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_PINNED_ONLY",
    default: "true",
    description: "List only tags that name an exact version.",
};

pub const RUNNER_BASE_IMAGE_EXCLUDE_SHA: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_EXCLUDE_SHA",
    default: "true",
    description: "Leave out tags that are commit hashes.",
};

pub const RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE",
    default: "true",
    description: "Leave out pre-release tags (alpha, beta, rc, ...).",
};

pub const RUNNER_BASE_IMAGE_INCLUDE: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_INCLUDE",
    default: "(unset)",
    description: "Regular expression a tag must match to be listed; an invalid one is a boot error.",
};

pub const RUNNER_BASE_IMAGE_EXCLUDE: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_EXCLUDE",
    default: "(unset)",
    description: "Regular expression of tags to leave out; an invalid one is a boot error.",
};

pub const RUNNER_BASE_IMAGE_LIMIT: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_LIMIT",
    default: "20",
    description: "Most tags the base-image menu offers.",
};

pub const RUNNER_BASE_IMAGE_REFRESH_SECONDS: Setting = Setting {
    name: "RUNNER_BASE_IMAGE_REFRESH_SECONDS",
    default: "3600",
    description: "How often the base-image menu is re-read from Docker Hub.",
};

pub const RUNNER_DOCKER_HUB_URL: Setting = Setting {
    name: "RUNNER_DOCKER_HUB_URL",
    default: DEFAULT_DOCKER_HUB_URL,
    description: "Base URL the tag list is read from; point it at a mirror or a local server.",
};

pub const RUNNER_TELO_IMAGE_REPOSITORY: Setting = Setting {
    name: "RUNNER_TELO_IMAGE_REPOSITORY",
    default: DEFAULT_TELO_IMAGE_REPOSITORY,
    description: "Repository of the kernel images of named telo releases: a session whose apps name `telo` version V runs `<repository>:V-<variant>`.",
};

pub const RUNNER_TELO_IMAGE_VARIANT: Setting = Setting {
    name: "RUNNER_TELO_IMAGE_VARIANT",
    default: DEFAULT_TELO_IMAGE_VARIANT,
    description: "Tag suffix of those images (`slim` → `telorun/node:0.96.0-slim`).",
};

pub const RUNNER_TELO_UNRELEASED_IMAGE: Setting = Setting {
    name: "RUNNER_TELO_UNRELEASED_IMAGE",
    default: "(unset)",
    description: "Kernel image an unreleased telo build (a version with `+`) runs; unset refuses such a version with 400 telo_version_unavailable.",
};

pub const RUNNER_PULL_POLICY: Setting = Setting {
    name: "RUNNER_PULL_POLICY",
    default: "missing",
    description: "imagePullPolicy of the images the runner chooses itself (those of named telo releases): missing, always or never.",
};

pub const SESSION_ROUTING_MODE: Setting = Setting {
    name: "SESSION_ROUTING_MODE",
    default: "auto",
    description: "Routing layer for session ports: auto, ingress, gateway or none; auto refuses to boot when the choice is ambiguous.",
};

pub const SESSION_ROUTING_BASE_DOMAIN: Setting = Setting {
    name: "SESSION_ROUTING_BASE_DOMAIN",
    default: "(unset)",
    description: "Wildcard domain of session hosts (<port>-<session>.<domain>); unset means sessions are logs-only.",
};

pub const SESSION_INGRESS_CLASS: Setting = Setting {
    name: "SESSION_INGRESS_CLASS",
    default: "(unset)",
    description: "ingressClassName of session Ingresses; setting it also makes auto choose Ingress.",
};

pub const SESSION_INGRESS_TLS_SECRET: Setting = Setting {
    name: "SESSION_INGRESS_TLS_SECRET",
    default: "(unset)",
    description: "TLS Secret session Ingresses present for *.<domain>; refused when routing is Gateway API.",
};

pub const SESSION_INGRESS_ANNOTATIONS: Setting = Setting {
    name: "SESSION_INGRESS_ANNOTATIONS",
    default: "(unset)",
    description: "JSON object of annotations every session Ingress carries; `{sessionId}` in a value is the session's id (e.g. an ingress controller's external-auth URL pointing at the runner's `/internal/sessions/{sessionId}/access`). Refused when routing is Gateway API.",
};

pub const SESSION_GATEWAY_NAME: Setting = Setting {
    name: "SESSION_GATEWAY_NAME",
    default: "(unset)",
    description: "Gateway session HTTPRoutes attach to; required for gateway mode, and makes auto choose Gateway API.",
};

pub const SESSION_GATEWAY_NAMESPACE: Setting = Setting {
    name: "SESSION_GATEWAY_NAMESPACE",
    default: "(the session namespace)",
    description: "Namespace of that Gateway.",
};

pub const SESSION_GATEWAY_SECTION_NAME: Setting = Setting {
    name: "SESSION_GATEWAY_SECTION_NAME",
    default: "(unset)",
    description: "Listener of the Gateway session routes attach to.",
};

pub const SESSION_ROUTE_READY_TIMEOUT_SECONDS: Setting = Setting {
    name: "SESSION_ROUTE_READY_TIMEOUT_SECONDS",
    default: "60",
    description: "How long a route may stay unclaimed by a controller before it is reported unprogrammed.",
};

pub const RUNNER_ORPHAN_POLICY: Setting = Setting {
    name: "RUNNER_ORPHAN_POLICY",
    default: "adopt",
    description: "`adopt`: on SIGTERM leave live sessions running and at boot adopt what a previous runner left (finished ones with their exit code and log); `reap`: stop every session on SIGTERM and delete leftovers at boot.",
};

/// How long a pod may stay short of `Running` before the start is abandoned.
/// `activeDeadlineSeconds` bounds only a pod that already runs, so a pod
/// stuck in `Pending` needs this runner-side deadline.
pub const RUNNER_START_DEADLINE_SECONDS: Setting = Setting {
    name: "RUNNER_START_DEADLINE_SECONDS",
    default: "120",
    description: "How long a session pod may take to reach Running before the start fails.",
};

pub const KUBECONFIG: Setting = Setting {
    name: "KUBECONFIG",
    default: "(in-cluster service account, else ~/.kube/config)",
    description: "Kubeconfig used outside a cluster; inside one the pod's service account is used.",
};

/// Every variable the Kubernetes backend reads beyond the core ones
/// ([`runner_core::config::CORE_SETTINGS`]) and the workspace limits
/// ([`runner_workspace_service::WORKSPACE_LIMIT_SETTINGS`]). With this
/// backend `PORT` defaults to [`DEFAULT_PORT`] (8062), not the core's 8061.
pub const K8S_SETTINGS: &[Setting] = &[
    RUNNER_SELF_URL,
    RUNNER_DISPLAY_NAME,
    RUNNER_DESCRIPTION,
    RUNNER_SESSION_NAMESPACE,
    RUNNER_IMAGE,
    RUNNER_INIT_IMAGE,
    RUNNER_WARM_POOL,
    RUNNER_WARM_POOL_SURGE,
    RUNNER_WARM_POOL_WATCH,
    RUNNER_WARM_POOL_MODULES,
    RUNNER_WORKSPACE_IMAGE,
    RUNNER_IMAGE_PULL_SECRET,
    RUNNER_RUNTIME_CLASS,
    RUNNER_MANAGED_BY,
    RUNNER_MAX_CPU,
    RUNNER_MAX_MEMORY,
    RUNNER_MAX_TTL_SECONDS,
    RUNNER_MAX_EPHEMERAL_STORAGE,
    RUNNER_APP_MAX_CPU,
    RUNNER_APP_MAX_MEMORY,
    RUNNER_APP_MAX_TTL_SECONDS,
    RUNNER_APP_MAX_EPHEMERAL_STORAGE,
    RUNNER_BASE_IMAGE_CATALOG_ENABLED,
    RUNNER_BASE_IMAGE_REPO,
    RUNNER_BASE_IMAGE_PINNED_ONLY,
    RUNNER_BASE_IMAGE_EXCLUDE_SHA,
    RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE,
    RUNNER_BASE_IMAGE_INCLUDE,
    RUNNER_BASE_IMAGE_EXCLUDE,
    RUNNER_BASE_IMAGE_LIMIT,
    RUNNER_BASE_IMAGE_REFRESH_SECONDS,
    RUNNER_DOCKER_HUB_URL,
    RUNNER_TELO_IMAGE_REPOSITORY,
    RUNNER_TELO_IMAGE_VARIANT,
    RUNNER_TELO_UNRELEASED_IMAGE,
    RUNNER_PULL_POLICY,
    SESSION_ROUTING_MODE,
    SESSION_ROUTING_BASE_DOMAIN,
    SESSION_INGRESS_CLASS,
    SESSION_INGRESS_TLS_SECRET,
    SESSION_INGRESS_ANNOTATIONS,
    SESSION_GATEWAY_NAME,
    SESSION_GATEWAY_NAMESPACE,
    SESSION_GATEWAY_SECTION_NAME,
    SESSION_ROUTE_READY_TIMEOUT_SECONDS,
    RUNNER_ORPHAN_POLICY,
    RUNNER_START_DEADLINE_SECONDS,
    RUNNER_PEER_TOKEN_FILE,
    RUNNER_REPLICA_ID,
    RUNNER_REPLICA_URL,
    RUNNER_LEASE_DURATION_SECONDS,
    KUBECONFIG,
];

#[cfg(test)]
mod tests;
