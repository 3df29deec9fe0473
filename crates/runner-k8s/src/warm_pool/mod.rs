//! Warm pools (`RUNNER_WARM_POOL`): pods of a run session's shape kept up
//! and ready before any session asks, per kernel image, so a session that
//! matches one starts on a running pod instead of waiting for scheduling,
//! the sandbox and the container starts.
//!
//! - **Claim.** A start takes the oldest ready pod of its image's pool with
//!   one conditional write (the `resourceVersion` it last saw): the session
//!   id label, the session record and the deadline go on, the idle label
//!   comes off. Two starts (or two runners) after the same pod: the
//!   apiserver lets exactly one through, the other tries the next pod or
//!   starts cold. A claimed pod is the session's, never the pool's again.
//! - **Refill.** Each pool's task follows its idle pods through the shared
//!   pod informer and creates pods up to the pool's size; a pod counts from its
//!   create until it leaves the pool. At most `RUNNER_WARM_POOL_SURGE` pods
//!   of a pool are starting (created, not ready) at once. Nothing is
//!   created while any session is starting, warm or cold — until its
//!   kernel has been announced `running`, not only its pod (at most 10 s
//!   after the pod runs) — nor for [`REPLENISH_DELAY`] after the last one:
//!   a burst is served from the pool, and neither its cold starts nor its
//!   kernels' loads compete with a refill (whose pods warm their own
//!   kernel caches). An idle pod that stopped is replaced.
//! - **Quota.** Warm pods count against the namespace's quota like any pod.
//!   A full quota stops the refill (the pool holds what it has, said once
//!   in the log) and, when a cold start is refused by the quota, one idle
//!   warm pod gives way to it: a session that asked beats one that may.
//! - **Restarts.** Idle pods are the pool's by their labels, so a new runner
//!   takes over its predecessor's pool (their tokens read back from their
//!   specs); claimed ones are sessions, adopted like any other.
//! - **Watch pools** (`RUNNER_WARM_POOL_WATCH`, [`watch_pods`]): pools of
//!   one-app watch pods, kept, claimed and paced by the same machinery;
//!   their pool label is a digest of the kind and the image, so a run pool
//!   and a watch pool of one image never share a pod.

pub mod watch_pods;

pub use crate::config::PoolSpec;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use runner_core::metrics::{Metrics, WarmPoolGauges};
use runner_core::sync::lock;
use runner_core::tasks::OwnedTasks;
use runner_core::types::PullPolicy;
use runner_workspace_service::client::WorkspaceClient;
use serde_json::json;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::cluster::api_error::{api_reason, is_conflict, is_not_found, is_quota_refusal};
use crate::pod::informer::KeyedPods;
use crate::pod::labels::{SESSION_ID_LABEL, STATE_LABEL};
use crate::pod::session_record::warm_pod_name;
use crate::pod::spec::{PodSettings, Resources};
use crate::pod::status::PodPhase;
use crate::pod::warm::{WarmPodInput, build_warm_pod, pool_key};
use crate::pod::warm_up;
use crate::pod::watch::WORKSPACE_PORT;
use crate::session::{SessionContext, delete_pod};

/// How long a full quota keeps a pool from trying again (doubling from the
/// first, up to the last).
const QUOTA_BACKOFF: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(60));
/// How soon a running pod whose workspace service did not answer is asked
/// again (doubling from the first, up to the last).
const RECHECK: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// How many pods a start tries to claim before it starts cold.
const CLAIM_ATTEMPTS: usize = 3;
/// How long the pools stay still after the last start under way ended. A
/// burst arrives as starts close together, not at once: a client that
/// starts sessions one after another posts the next a few milliseconds
/// after it saw the last one run, and a refill begun in that gap would
/// compete with the burst's later starts for the container runtime. Short
/// against a pod's own start (about a second on a cluster), so a pool is
/// whole again soon after the burst.
pub const REPLENISH_DELAY: Duration = Duration::from_millis(500);

/// What every pool is built and claimed with.
pub struct Shared {
    pub ctx: Arc<SessionContext>,
    pub settings: PodSettings,
    /// A run session's limits (a claim sets the deadline from them).
    pub resources: Resources,
    pub workspace_image: String,
    /// What a watch pool's pods are made with (`None`: watch sessions are
    /// off, and there is no watch pool).
    pub watch: Option<crate::pod::pooled_watch::WatchPoolShared>,
    /// `RUNNER_WARM_POOL_MODULES`: what a warm pod's kernel cache is
    /// warmed with; empty, no warm-up.
    pub warm_up_modules: Vec<String>,
    /// With several replicas, whether this one is the refiller now: only
    /// it creates and trims warm pods (any replica claims them). `None`:
    /// the only replica, always the refiller.
    pub refiller: Option<watch::Receiver<bool>>,
}

impl Shared {
    /// Resolves once this replica is the refiller (at once for the only
    /// replica).
    async fn until_refiller(&self) {
        if let Some(refiller) = &self.refiller {
            let mut refiller = refiller.clone();
            let _ = refiller.wait_for(|refiller| *refiller).await;
        }
    }

    fn is_refiller(&self) -> bool {
        self.refiller
            .as_ref()
            .is_none_or(|refiller| *refiller.borrow())
    }
}

/// The pools of one runner.
pub struct WarmPools {
    shared: Arc<Shared>,
    pools: Vec<Arc<Pool>>,
    /// Session starts under way: while any is, and for [`REPLENISH_DELAY`]
    /// after the last, no pool creates pods.
    starts: watch::Sender<Starts>,
}

/// Session starts under way, and when the last one ended.
#[derive(Debug, Clone, Copy, Default)]
struct Starts {
    in_flight: usize,
    last_ended: Option<tokio::time::Instant>,
}

impl Starts {
    /// Until when the pools must not create pods (`None`: they may now).
    fn hold_until(&self, now: tokio::time::Instant) -> Option<Hold> {
        if self.in_flight > 0 {
            return Some(Hold::WhileStarting);
        }
        let quiet_until = self.last_ended? + REPLENISH_DELAY;
        (now < quiet_until).then_some(Hold::Until(quiet_until))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Until the starts under way end.
    WhileStarting,
    /// Until this instant (the quiet period after the last start).
    Until(tokio::time::Instant),
}

/// A session start under way ([`WarmPools::starting`]); the pools may
/// refill again [`REPLENISH_DELAY`] after every such guard is dropped.
pub struct Starting {
    starts: watch::Sender<Starts>,
}

impl Drop for Starting {
    fn drop(&mut self) {
        self.starts.send_modify(|starts| {
            starts.in_flight = starts.in_flight.saturating_sub(1);
            if starts.in_flight == 0 {
                starts.last_ended = Some(tokio::time::Instant::now());
            }
        });
    }
}

/// A claimed pod: the session's now, with the workspace service that takes
/// its bundle and its launch file.
pub struct Claimed {
    pub pod_name: String,
    pub workspace: WorkspaceClient,
    /// The bearer token of the pod's workspace service (minted with the
    /// pod, known to no one else once the pool forgot it).
    pub token: String,
}

/// What a pool's pods are made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolKind {
    /// Run sessions (`RUNNER_WARM_POOL`).
    Run,
    /// Watch sessions of one app and no agent (`RUNNER_WARM_POOL_WATCH`).
    Watch,
}

struct Pool {
    kind: PoolKind,
    image: String,
    key: String,
    size: usize,
    /// The most pods it has starting (created, not ready) at once.
    surge: usize,
    state: Mutex<PoolState>,
    metrics: WarmPoolGauges,
}

#[derive(Default)]
struct PoolState {
    /// Workspace tokens by pod (minted here, or read back from the spec).
    tokens: HashMap<String, String>,
    /// Idle pods whose workspace service answered, oldest first.
    ready: Vec<String>,
    /// Created and not seen by the pod informer yet.
    creating: HashSet<String>,
    /// Being claimed or checked right now.
    busy: HashSet<String>,
}

impl PoolState {
    /// Pods created and not ready yet: those not seen by the pod informer, and the
    /// idle ones neither ready nor on their way out.
    fn starting(&self, pods: &KeyedPods) -> usize {
        let seen = pods
            .keys()
            .filter(|name| !self.busy.contains(*name) && !self.ready.contains(name))
            .count();
        seen + self.creating.len()
    }
}

impl WarmPools {
    /// The run pools of `specs` and the watch pools of `watch_specs`
    /// (these only when `shared` says how watch pods are made).
    pub fn new(
        shared: Shared,
        specs: &[PoolSpec],
        watch_specs: &[PoolSpec],
        surge: usize,
        metrics: &Metrics,
    ) -> Arc<Self> {
        let watch_specs = if shared.watch.is_some() {
            watch_specs
        } else {
            &[]
        };
        let kinds = specs
            .iter()
            .map(|spec| (PoolKind::Run, spec))
            .chain(watch_specs.iter().map(|spec| (PoolKind::Watch, spec)));
        let pools = kinds
            .filter(|(_, spec)| spec.size > 0)
            .map(|(kind, spec)| {
                let (key, label) = match kind {
                    PoolKind::Run => (pool_key(&spec.image), spec.image.clone()),
                    PoolKind::Watch => (
                        crate::pod::pooled_watch::watch_pool_key(&spec.image),
                        crate::pod::pooled_watch::watch_pool_label(&spec.image),
                    ),
                };
                Arc::new(Pool {
                    kind,
                    image: spec.image.clone(),
                    key,
                    size: spec.size,
                    surge: surge.max(1),
                    state: Mutex::new(PoolState::default()),
                    metrics: metrics.warm_pool(&label),
                })
            })
            .collect();
        Arc::new(Self {
            shared: Arc::new(shared),
            pools,
            starts: watch::Sender::new(Starts::default()),
        })
    }

    /// Marks a session starting, on a claimed pod or a new one, until the
    /// guard is dropped (once it runs, or its start failed). Meanwhile, and
    /// for [`REPLENISH_DELAY`] after the last such start, the pools create
    /// nothing: a refill beside the starts of a burst would compete with
    /// them for the scheduler, the nodes and the container runtime (a claim
    /// attaches and reads the log through that runtime too), and a session
    /// someone waits for comes before a pod someone may.
    pub fn starting(&self) -> Starting {
        self.starts.send_modify(|starts| starts.in_flight += 1);
        Starting {
            starts: self.starts.clone(),
        }
    }

    /// Starts each pool's task (keeping it filled) under `tasks`, and the
    /// one sweep of idle pods no configured pool claims (a pool an earlier
    /// runner had).
    pub fn spawn(&self, tasks: &OwnedTasks) {
        let keys: Vec<String> = self.pools.iter().map(|pool| pool.key.clone()).collect();
        tasks.spawn(sweep_unpooled(self.shared.clone(), keys));
        for pool in &self.pools {
            let idle = self.shared.ctx.pod_informer.subscribe_pool(&pool.key);
            tasks.spawn(keep_filled(
                self.shared.clone(),
                pool.clone(),
                idle,
                self.starts.subscribe(),
                tasks.stopping(),
            ));
        }
    }

    /// Counts a run session of `image` (whose pool served or did not).
    pub fn count_start(&self, image: &str, warm: bool) {
        if let Some(pool) = self.pool(image) {
            pool.metrics.started(warm);
        }
    }

    /// Whether a session of `image` under `pull_policy` can start warm:
    /// its image has a pool, and it did not ask for a fresh pull.
    pub fn serves(&self, image: &str, pull_policy: PullPolicy) -> bool {
        pull_policy != PullPolicy::Always && self.pool(image).is_some()
    }

    fn pool(&self, image: &str) -> Option<&Arc<Pool>> {
        self.pool_of(PoolKind::Run, image)
    }

    fn pool_of(&self, kind: PoolKind, image: &str) -> Option<&Arc<Pool>> {
        self.pools
            .iter()
            .find(|pool| pool.kind == kind && pool.image == image)
    }

    /// Takes a ready pod of `image`'s pool for session `session_id`,
    /// recording `annotations` (the session record) on it and its deadline
    /// (`ttl_seconds` of activity from now). `None`: no pod could be had
    /// (none ready, or each lost to another claim); the start goes cold.
    pub async fn claim(
        &self,
        image: &str,
        session_id: &str,
        annotations: &std::collections::BTreeMap<String, String>,
        ttl_seconds: u32,
    ) -> Option<Claimed> {
        let pool = self.pool(image)?;
        self.claim_from(
            pool,
            session_id,
            &serde_json::Map::new(),
            annotations,
            ttl_seconds,
        )
        .await
    }

    /// Takes a ready pod of `pool` (see [`WarmPools::claim`]), setting
    /// `labels` on it besides the session id.
    async fn claim_from(
        &self,
        pool: &Pool,
        session_id: &str,
        labels: &serde_json::Map<String, serde_json::Value>,
        annotations: &std::collections::BTreeMap<String, String>,
        ttl_seconds: u32,
    ) -> Option<Claimed> {
        for _ in 0..CLAIM_ATTEMPTS {
            let (name, token) = {
                let mut state = lock(&pool.state);
                let name = state.ready.first().cloned()?;
                state.ready.remove(0);
                state.busy.insert(name.clone());
                let token = state.tokens.get(&name).cloned();
                (name, token)
            };
            let outcome = self
                .claim_pod(&name, session_id, labels, annotations, ttl_seconds)
                .await;
            let mut state = lock(&pool.state);
            state.busy.remove(&name);
            state.tokens.remove(&name);
            match (outcome, token) {
                (Ok(ip), Some(token)) => {
                    let workspace = WorkspaceClient::new(
                        self.shared.ctx.http.clone(),
                        SocketAddr::new(ip, WORKSPACE_PORT),
                        token.clone(),
                    );
                    info!(session_id, pod = %name, image = %pool.image, "claimed a warm pod");
                    return Some(Claimed {
                        pod_name: name,
                        workspace,
                        token,
                    });
                }
                (Ok(_), None) => {
                    warn!(session_id, pod = %name, "claimed a warm pod whose token is unknown");
                    return None;
                }
                (Err(reason), _) => {
                    debug!(session_id, pod = %name, %reason, "a warm pod was not claimed");
                }
            }
        }
        None
    }

    /// The conditional write that makes pod `name` session `session_id`'s.
    async fn claim_pod(
        &self,
        name: &str,
        session_id: &str,
        labels: &serde_json::Map<String, serde_json::Value>,
        annotations: &std::collections::BTreeMap<String, String>,
        ttl_seconds: u32,
    ) -> Result<IpAddr, String> {
        let pods = self.shared.ctx.pod_informer.pods();
        let cached = pods
            .iter()
            .find(|pod| pod.metadata.name.as_deref() == Some(name))
            .ok_or("gone from the watch")?;
        // The precondition below is the version this runner saw: when its
        // informer already shows another runner's claim (the pool's list
        // had not caught up), that version would let it claim the pod a
        // second time.
        if !crate::pod::labels::is_idle(cached) {
            return Err("already claimed".into());
        }
        let version = cached
            .metadata
            .resource_version
            .clone()
            .ok_or("no resourceVersion")?;
        let ip = pod_ip(cached).ok_or("no pod IP")?;
        // The deadline counts from the pod's start: what it spent waiting
        // is added, so the session gets its whole lifetime.
        let waited = cached
            .status
            .as_ref()
            .and_then(|status| status.start_time.as_ref())
            .map_or(0, |start| {
                k8s_openapi::jiff::Timestamp::now()
                    .duration_since(start.0)
                    .as_secs()
                    .max(0)
                    .unsigned_abs()
            });
        let deadline = waited.saturating_add(u64::from(ttl_seconds)) + 1;
        let mut labels = labels.clone();
        labels.insert(SESSION_ID_LABEL.to_owned(), json!(session_id));
        labels.insert(STATE_LABEL.to_owned(), serde_json::Value::Null);
        let patch = json!({
            "metadata": {
                "resourceVersion": version,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": {"activeDeadlineSeconds": deadline},
        });
        match self
            .shared
            .ctx
            .pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(ip),
            Err(err) if is_conflict(&err) || is_not_found(&err) => {
                Err("taken by another claim, or gone".to_owned())
            }
            Err(err) => Err(api_reason(&err)),
        }
    }

    /// A cold start was refused by the quota: one idle warm pod gives way
    /// (deleted), so the session can be created in its place. Whether one
    /// did.
    pub async fn give_way(&self) -> bool {
        for pool in &self.pools {
            let victim = {
                let mut state = lock(&pool.state);
                state.ready.pop()
            };
            if let Some(name) = victim {
                lock(&pool.state).tokens.remove(&name);
                warn!(pool = %pool.image, pod = %name, "the session namespace's quota is full: a warm pod gives way to a session");
                if let Err(err) = delete_pod(&self.shared.ctx.pods, &name).await {
                    warn!(pod = %name, error = %err, "could not delete a warm pod");
                    continue;
                }
                return true;
            }
        }
        false
    }
}

/// Deletes the idle warm pods of pools this runner does not keep.
async fn sweep_unpooled(shared: Arc<Shared>, keys: Vec<String>) {
    shared.ctx.pod_informer.wait_synced().await;
    shared.until_refiller().await;
    for pod in shared.ctx.pod_informer.pods() {
        let pool = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(crate::pod::labels::POOL_LABEL));
        if !crate::pod::labels::is_idle(&pod) || pool.is_some_and(|pool| keys.contains(pool)) {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        info!(pod = %name, "deleting an idle warm pod of a pool this runner does not keep");
        if let Err(err) = delete_pod(&shared.ctx.pods, &name).await {
            warn!(pod = %name, error = %err, "could not delete an idle warm pod");
        }
    }
}

fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// Whether `pod` can be claimed: it runs, all its containers do, and it is
/// not being deleted.
fn is_running(pod: &Pod) -> bool {
    PodPhase::of(pod) == Some(PodPhase::Running)
        && pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|status| status.container_statuses.as_ref())
            .is_some_and(|statuses| {
                statuses.len() == 2
                    && statuses
                        .iter()
                        .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            })
}

/// Whether an idle pod is past serving: finished, or one of its
/// containers ended (the pod runs on, but never again as a warm pod).
fn has_ended(pod: &Pod) -> bool {
    matches!(
        PodPhase::of(pod),
        Some(PodPhase::Succeeded | PodPhase::Failed)
    ) || pod
        .status
        .as_ref()
        .and_then(|status| status.container_statuses.as_ref())
        .is_some_and(|statuses| {
            statuses
                .iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
        })
}

/// One pool's task: on every change of its idle pods, forget what left,
/// check the new running ones, and create what is missing.
async fn keep_filled(
    shared: Arc<Shared>,
    pool: Arc<Pool>,
    mut idle: watch::Receiver<KeyedPods>,
    mut starts: watch::Receiver<Starts>,
    stop: tokio_util::sync::CancellationToken,
) {
    shared.ctx.pod_informer.wait_synced().await;
    let mut refiller = shared.refiller.clone();
    let mut quota_full: Option<Duration> = None;
    let mut retry_at: Option<tokio::time::Instant> = None;
    // What a previous runner left beyond the pool's size goes once, at
    // boot; afterwards the pool never makes more than its size by itself
    // (two runners sharing a namespace may hold twice as many, and must not
    // take turns deleting each other's pods).
    let mut trimmed = false;
    let mut recheck = RECHECK.0;
    loop {
        let pods = idle.borrow_and_update().clone();
        // A pod that runs but whose service did not answer yet is looked at
        // again soon, whether or not anything else changes.
        let unanswered = settle(&shared, &pool, &pods).await;
        let recheck_at = if unanswered {
            let at = tokio::time::Instant::now() + recheck;
            recheck = (recheck * 2).min(RECHECK.1);
            Some(at)
        } else {
            recheck = RECHECK.0;
            None
        };
        // Another replica refills: this one only claims.
        let refilling = shared.is_refiller();
        if !trimmed && refilling {
            trim(&shared, &pool, &pods).await;
            trimmed = true;
        }
        // What is missing, as far as the surge lets it be started now; the
        // rest follows as those starting become ready.
        let (missing, room) = {
            let state = lock(&pool.state);
            let present = pods.len() + state.creating.len();
            (
                pool.size.saturating_sub(present),
                pool.surge.saturating_sub(state.starting(&pods)),
            )
        };
        let now = tokio::time::Instant::now();
        let hold = starts.borrow_and_update().hold_until(now);
        let quiet_until = match hold {
            Some(Hold::Until(at)) if missing > 0 => Some(at),
            _ => None,
        };
        let may_create = refilling && retry_at.is_none_or(|at| now >= at) && hold.is_none();
        let count = missing.min(room);
        if count > 0 && may_create {
            match create(&shared, &pool, count).await {
                Ok(()) => {
                    if quota_full.take().is_some() {
                        info!(pool = %pool.image, "the session namespace has room again: the warm pool refills");
                    }
                    retry_at = None;
                }
                Err(CreateFailure::Quota(reason)) => {
                    let wait =
                        quota_full.map_or(QUOTA_BACKOFF.0, |last| (last * 2).min(QUOTA_BACKOFF.1));
                    if quota_full.is_none() {
                        let held = pods.len() + lock(&pool.state).creating.len();
                        warn!(pool = %pool.image, held, size = pool.size, %reason, "the session namespace's quota is full: the warm pool holds fewer pods than its size until there is room");
                    }
                    quota_full = Some(wait);
                    retry_at = Some(tokio::time::Instant::now() + wait);
                }
                Err(CreateFailure::Other(reason)) => {
                    warn!(pool = %pool.image, %reason, "could not create a warm pod; trying again");
                    retry_at = Some(tokio::time::Instant::now() + QUOTA_BACKOFF.0);
                }
            }
        }
        let next = [retry_at, recheck_at, quiet_until]
            .into_iter()
            .flatten()
            .min();
        let wake = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let refiller_changed = async {
            match refiller.as_mut() {
                Some(refiller) => refiller.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = idle.changed() => if changed.is_err() { return },
            changed = starts.changed() => if changed.is_err() { return },
            alive = refiller_changed => if !alive { return },
            () = wake => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Brings the pool's bookkeeping in line with its idle pods as watched:
/// what left is forgotten, what runs is checked (its workspace service
/// answers) and then ready. Whether a running pod did not answer yet.
async fn settle(shared: &Shared, pool: &Pool, pods: &KeyedPods) -> bool {
    let drop_ended: Vec<String>;
    let unchecked: Vec<(String, IpAddr, bool)> = {
        let mut state = lock(&pool.state);
        publish_counts(pool, &state, pods);
        state.creating.retain(|name| !pods.contains_key(name));
        state.ready.retain(|name| pods.contains_key(name));
        // A pod being deleted or claimed is done with once it left.
        state.busy.retain(|name| pods.contains_key(name));
        let keep: HashSet<String> = pods
            .keys()
            .chain(&state.creating)
            .chain(&state.busy)
            .cloned()
            .collect();
        state.tokens.retain(|name, _| keep.contains(name));
        // A pod that stopped running while idle (its workspace service or
        // its waiting shell ended) will never serve: out, and replaced.
        state
            .ready
            .retain(|name| !pods.get(name).is_some_and(|pod| has_ended(pod)));
        let ended: Vec<String> = pods
            .iter()
            .filter(|(name, pod)| !state.busy.contains(*name) && has_ended(pod))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &ended {
            state.busy.insert(name.clone());
        }
        drop_ended = ended;
        pods.iter()
            .filter(|(name, pod)| {
                is_running(pod) && !state.ready.contains(name) && !state.busy.contains(*name)
            })
            .filter_map(|(name, pod)| Some((name.clone(), pod_ip(pod)?, warm_up::has_warm_up(pod))))
            .collect()
    };
    for name in drop_ended {
        warn!(pool = %pool.image, pod = %name, "a warm pod stopped while idle; replacing it");
        if let Err(err) = delete_pod(&shared.ctx.pods, &name).await {
            warn!(pod = %name, error = %err, "could not delete a stopped warm pod");
            lock(&pool.state).busy.remove(&name);
        }
    }
    let mut unanswered = false;
    for (name, ip, warmed) in unchecked {
        let known = lock(&pool.state).tokens.get(&name).cloned();
        let token = match known {
            Some(token) => token,
            // Left by a previous runner: its token is in its spec.
            None => match shared.ctx.pods.get(&name).await {
                Ok(full) => match crate::pod::warm::token_of(&full) {
                    Some(token) => {
                        lock(&pool.state).tokens.insert(name.clone(), token.clone());
                        token
                    }
                    None => continue,
                },
                Err(_) => {
                    unanswered = true;
                    continue;
                }
            },
        };
        let client = WorkspaceClient::new(
            shared.ctx.http.clone(),
            SocketAddr::new(ip, WORKSPACE_PORT),
            token,
        );
        if client.health().await {
            if warmed {
                note_warm_up(shared, pool, &name).await;
            }
            let mut state = lock(&pool.state);
            if !state.ready.contains(&name) {
                state.ready.push(name);
            }
            publish_counts(pool, &state, pods);
        } else {
            unanswered = true;
        }
    }
    unanswered
}

/// Logs and counts how pod `name`'s kernel cache warm-up ended, as it
/// becomes ready (once): a failed one offers the pod with a cold cache.
async fn note_warm_up(shared: &Shared, pool: &Pool, name: &str) {
    match warm_up::read_outcome(&shared.ctx.pods, name).await {
        Ok(Some(warm_up::Outcome::Warm)) => {
            debug!(pool = %pool.image, pod = %name, "a warm pod's kernel cache is warm");
            pool.metrics.warm_up_done(true);
        }
        Ok(Some(warm_up::Outcome::Cold(reason))) => {
            warn!(pool = %pool.image, pod = %name, %reason, "a warm pod's kernel cache warm-up failed: the pod is offered with a cold cache");
            pool.metrics.warm_up_done(false);
        }
        Ok(None) => {
            warn!(pool = %pool.image, pod = %name, "a warm pod's kernel cache warm-up said nothing: the pod is offered with a cold cache");
            pool.metrics.warm_up_done(false);
        }
        Err(reason) => {
            debug!(pool = %pool.image, pod = %name, %reason, "could not read how a warm pod's warm-up ended");
        }
    }
}

/// The pool's gauges: ready pods, and the rest it holds or is creating.
fn publish_counts(pool: &Pool, state: &PoolState, pods: &KeyedPods) {
    let ready = state.ready.len();
    let held = pods.len() + state.creating.len();
    pool.metrics
        .ready
        .set(i64::try_from(ready).unwrap_or(i64::MAX));
    pool.metrics
        .starting
        .set(i64::try_from(held.saturating_sub(ready)).unwrap_or(i64::MAX));
}

/// Deletes idle pods past the pool's size (a pool made smaller, or one a
/// previous runner filled too), those not ready first.
async fn trim(shared: &Shared, pool: &Pool, pods: &KeyedPods) {
    let excess = pods.len().saturating_sub(pool.size);
    if excess == 0 {
        return;
    }
    let victims: Vec<String> = {
        let mut state = lock(&pool.state);
        let mut names: Vec<String> = pods
            .keys()
            .filter(|name| !state.busy.contains(*name))
            .cloned()
            .collect();
        names.sort_by_key(|name| state.ready.contains(name));
        names.truncate(excess);
        for name in &names {
            state.ready.retain(|ready| ready != name);
            state.busy.insert(name.clone());
        }
        names
    };
    for name in victims {
        debug!(pool = %pool.image, pod = %name, "deleting a warm pod past the pool's size");
        if let Err(err) = delete_pod(&shared.ctx.pods, &name).await {
            warn!(pod = %name, error = %err, "could not delete a warm pod past the pool's size");
            lock(&pool.state).busy.remove(&name);
        }
    }
}

enum CreateFailure {
    Quota(String),
    Other(String),
}

/// Creates `count` warm pods of `pool`, one after another.
async fn create(shared: &Shared, pool: &Pool, count: usize) -> Result<(), CreateFailure> {
    for _ in 0..count {
        let name = warm_pod_name();
        let token = runner_core::ids::new_workload_token();
        let pod = match (pool.kind, &shared.watch) {
            (PoolKind::Watch, Some(watch)) => crate::pod::pooled_watch::build_pooled_watch_pod(
                &shared.settings,
                watch,
                &name,
                &pool.image,
                &shared.workspace_image,
                &token,
            ),
            _ => build_warm_pod(
                &shared.settings,
                &WarmPodInput {
                    name: &name,
                    image: &pool.image,
                    pull_policy: PullPolicy::Missing,
                    workspace_image: &shared.workspace_image,
                    token: &token,
                    resources: &shared.resources,
                    modules: &shared.warm_up_modules,
                },
            ),
        };
        {
            let mut state = lock(&pool.state);
            state.creating.insert(name.clone());
            state.tokens.insert(name.clone(), token);
        }
        if let Err(err) = shared.ctx.pods.create(&PostParams::default(), &pod).await {
            let mut state = lock(&pool.state);
            state.creating.remove(&name);
            state.tokens.remove(&name);
            return Err(if is_quota_refusal(&err) {
                CreateFailure::Quota(api_reason(&err))
            } else {
                CreateFailure::Other(api_reason(&err))
            });
        }
        debug!(pool = %pool.image, pod = %name, "created a warm pod");
    }
    Ok(())
}

/// Why `bundle` cannot be handed to a warm pod, if it cannot: its
/// workspace service takes a bundle within the workspace limits it runs
/// with (the defaults: a warm pod is made before any session's bundle is
/// known), which a run session's bundle need not respect. Such a bundle
/// starts cold, decided before a pod is claimed.
pub fn bundle_exceeds_warm_pod(bundle: &runner_core::types::RunBundle) -> Option<String> {
    let limits = runner_workspace::WorkspaceLimits::default();
    let files = bundle.files.len();
    if files > limits.max_files {
        return Some(format!(
            "The bundle has {files} files, more than a warm pod takes ({})",
            limits.max_files
        ));
    }
    let total: u64 = bundle.files.iter().map(|f| f.contents.len() as u64).sum();
    let largest = bundle
        .files
        .iter()
        .map(|f| f.contents.len() as u64)
        .max()
        .unwrap_or(0);
    if largest > limits.max_file_bytes {
        return Some(format!(
            "The bundle has a file of {largest} bytes, more than a warm pod takes ({})",
            limits.max_file_bytes
        ));
    }
    let cap = limits.max_workspace_bytes.min(limits.max_change_set_bytes);
    if total > cap {
        return Some(format!(
            "The bundle holds {total} bytes, more than a warm pod takes ({cap})"
        ));
    }
    None
}
