//! The session registry: admission, the background start, stop, retention and
//! eviction.
//!
//! Each session's record and replay buffers are the [`crate::session`]
//! module; the registry admits sessions, runs their starts and supervises each
//! one end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use runner_api::types::{RunEvent, RunStatus, SessionCreated};
use runner_api::watch::SessionMode;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::backend::{Backend, BackendSession, RecoveredSession, StartError, StartSpec, StopError};
use crate::backend_session::WatchWorkload;
use crate::identity::Owner;
use crate::tenancy::{Ask, QuotaExceeded, SessionResources, TierLimits, Usage};
use crate::watch::WatchConfig;

mod edge;
mod replicas;
mod watch_sessions;
mod watch_supervisor;

use crate::ids::{IdMap, new_session_id};
use crate::metrics::Metrics;
use crate::start_gate::GateSignal;
use crate::sync::lock;
use crate::time::iso_now;
pub use watch_sessions::{ResumeError, SetAppsError};

pub use crate::session::{
    Batch, Cursor, EARLY_STDIN_BYTES, EVENT_ID_GENERATION, EventFrame, KERNEL_STOPPED,
    MAX_OUTPUT_CHUNK_BYTES, OUTPUT_SEQ_GENERATION, Session, SessionSink,
};

#[derive(Debug, Clone)]
pub struct RegistryLimits {
    /// Live plus retained sessions.
    pub max_sessions: usize,
    /// How long a finished session stays readable.
    pub exit_ttl: Duration,
    /// Cap of each of the two per-session replay buffers.
    pub replay_buffer_bytes: usize,
    /// Watch sessions: whether they are offered, their limits and timers.
    pub watch: WatchConfig,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmissionError {
    #[error("runner is at its configured max of {max} concurrent sessions")]
    TooManySessions { max: usize },
    #[error("runner is at its configured max of {max} concurrent watch sessions")]
    TooManyWatchSessions { max: usize },
    /// The tenant is at one of its tier's quotas.
    #[error("{0}")]
    QuotaExceeded(QuotaExceeded),
    /// The runner is shutting down: a session admitted now would be cut
    /// off before it has a workload to leave to a successor.
    #[error("the runner is shutting down; ask again and another runner takes the session")]
    ShuttingDown,
}

/// Who asks for a session and under which limits: the owner it will record
/// and the owner's tier. The default — no owner, no limits — is a runner
/// without authentication.
#[derive(Debug, Clone, Default)]
pub struct Claimant {
    pub owner: Option<Owner>,
    pub limits: Option<TierLimits>,
}

impl Claimant {
    pub fn new(owner: Option<Owner>, limits: Option<TierLimits>) -> Self {
        Self { owner, limits }
    }
}

pub use crate::launch::SessionKind;

#[derive(Clone)]
pub struct SessionRegistry {
    inner: Arc<RegistryInner>,
}

/// How long a runner leaving its sessions to a successor waits for the
/// starts under way.
const START_SETTLE_ON_HAND_OVER: Duration = Duration::from_secs(15);
/// How long a runner leaving its sessions spends leaving their output
/// marks (one write per session, all at once).
const HAND_OVER_BOUND: Duration = Duration::from_secs(5);

/// See `RegistryInner::checkpoint_slots`.
const CHECKPOINTS_AT_ONCE: usize = 2;

struct RegistryInner {
    sessions: Mutex<IdMap<Arc<Session>>>,
    limits: RegistryLimits,
    backend: Arc<dyn Backend>,
    tasks: TaskTracker,
    /// Cancels retention timers and in-flight starts at the end of shutdown.
    shutdown: CancellationToken,
    /// Set once boot-time adoption finished (readiness).
    recovered: watch::Sender<bool>,
    /// Whether the watch supervisor runs.
    supervising: std::sync::atomic::AtomicBool,
    metrics: Arc<Metrics>,
    /// The operator's catalog, where a watch session's agent is looked up
    /// at each start (set once by the server).
    agents: std::sync::OnceLock<crate::apps::AppCatalog>,
    /// Checkpoints and suspends under way at most at once: every due session
    /// checkpointing in the same round made a runner of many large
    /// workspaces miss its liveness probes.
    checkpoint_slots: Arc<tokio::sync::Semaphore>,
    /// Live seconds of sessions that left the registry, by tenant, for the
    /// UTC day they were counted on (`sessionSecondsPerDay`). Locked after
    /// `sessions` when both are.
    departed_seconds: Mutex<HashMap<String, (i64, u64)>>,
    /// Where sessions announce their lifecycle (set once by the server).
    webhooks: std::sync::OnceLock<crate::webhooks::Webhooks>,
    /// With several replicas: where sessions publish their output (after
    /// sending its marks to the peers), and the marks the peers sent.
    mark_stream: std::sync::OnceLock<(
        crate::session::shipping::OutputShipper,
        Arc<crate::session::shipping::PeerMarks>,
    )>,
    /// The session edge's base, when the runner serves session traffic.
    preview: std::sync::OnceLock<crate::edge::Preview>,
    /// How long the edge holds a request for a session coming up.
    wake_timeout: std::sync::OnceLock<Duration>,
    /// Held while sessions are adopted or let go (several replicas).
    adopting: tokio::sync::Mutex<()>,
    /// Starts (and resumes) under way: a runner leaving its sessions to a
    /// successor lets them get as far as a workload first.
    starts_in_flight: watch::Sender<usize>,
    /// Set when shutdown begins: no new session is admitted.
    closing: std::sync::atomic::AtomicBool,
}

/// Counts a start in flight for as long as it lives.
struct StartInFlight(watch::Sender<usize>);

impl StartInFlight {
    fn new(count: &watch::Sender<usize>) -> Self {
        count.send_modify(|n| *n += 1);
        Self(count.clone())
    }
}

impl Drop for StartInFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl SessionRegistry {
    pub fn new(backend: Arc<dyn Backend>, limits: RegistryLimits) -> Self {
        Self::with_metrics(backend, limits, Arc::new(Metrics::new()))
    }

    /// A registry recording into `metrics` (shared with the backend, which
    /// counts its own work there).
    pub fn with_metrics(
        backend: Arc<dyn Backend>,
        limits: RegistryLimits,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner: Arc::new(RegistryInner {
                sessions: Mutex::new(IdMap::default()),
                limits,
                backend,
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                recovered: watch::Sender::new(false),
                supervising: std::sync::atomic::AtomicBool::new(false),
                metrics,
                agents: std::sync::OnceLock::new(),
                checkpoint_slots: Arc::new(tokio::sync::Semaphore::new(CHECKPOINTS_AT_ONCE)),
                departed_seconds: Mutex::new(HashMap::new()),
                webhooks: std::sync::OnceLock::new(),
                mark_stream: std::sync::OnceLock::new(),
                preview: std::sync::OnceLock::new(),
                wake_timeout: std::sync::OnceLock::new(),
                adopting: tokio::sync::Mutex::new(()),
                starts_in_flight: watch::Sender::new(0),
                closing: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    pub fn limits(&self) -> &RegistryLimits {
        &self.inner.limits
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The `/metrics` exposition, sessions by state counted now.
    pub fn encode_metrics(&self) -> Result<String, std::fmt::Error> {
        let mut by_state: HashMap<&'static str, usize> = HashMap::new();
        for session in lock(&self.inner.sessions).values() {
            *by_state.entry(session.status().kind()).or_default() += 1;
        }
        self.inner
            .metrics
            .encode(|state| by_state.get(state).copied().unwrap_or(0))
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.inner.sessions).get(id).cloned()
    }

    pub fn len(&self) -> usize {
        lock(&self.inner.sessions).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every session, oldest first.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<_> = lock(&self.inner.sessions).values().cloned().collect();
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        all
    }

    /// Admit a new session and start it in the background. Returns as soon as
    /// the session is registered; every start failure arrives later as a
    /// terminal `failed` status.
    pub fn create(
        &self,
        build_spec: impl FnOnce(&str, &str) -> StartSpec,
    ) -> Result<SessionCreated, AdmissionError> {
        self.create_for(&Claimant::default(), SessionKind::Run, build_spec)
    }

    /// [`SessionRegistry::create`] for `claimant`, whose quotas it is
    /// checked against (under the admission lock) and whose owner it
    /// records.
    pub fn create_for(
        &self,
        claimant: &Claimant,
        kind: SessionKind,
        build_spec: impl FnOnce(&str, &str) -> StartSpec,
    ) -> Result<SessionCreated, AdmissionError> {
        let session = self.admit_as(None, None, Some((claimant, kind)), |id, created_at| {
            self.new_run_session(id, created_at)
        })?;
        Ok(self.launch_run(session, build_spec))
    }

    /// A run session of one default app, admitted now.
    fn new_run_session(&self, id: String, created_at: String) -> Session {
        Session::new(
            id,
            created_at,
            self.inner.limits.replay_buffer_bytes,
            0,
            Some(tokio::time::Instant::now()),
            self.inner.metrics.clone(),
        )
    }

    fn launch_run(
        &self,
        session: Arc<Session>,
        build_spec: impl FnOnce(&str, &str) -> StartSpec,
    ) -> SessionCreated {
        let mut spec = build_spec(&session.id, &session.created_at);
        spec.owner = session.owner().cloned();
        if let Some(token) = spec.app.as_ref().and_then(|app| app.token.clone()) {
            session.set_endpoint_token(token);
        }
        session.close_gate(spec.inspect);
        self.inner.metrics.session_started(spec.self_contained());
        let created = SessionCreated {
            session_id: session.id.clone(),
            stream_url: format!("/v1/sessions/{}/events", session.id),
            created_at: session.created_at.clone(),
        };
        let backend = self.inner.backend.clone();
        self.spawn_launch(session, move |sink| async move {
            backend.start(spec, sink).await.map(Launched::run)
        });
        created
    }

    /// A run session whose one app is named `app` (not the default `app`),
    /// declaring `ports`.
    pub fn create_named(
        &self,
        claimant: &Claimant,
        app: &str,
        ports: &[runner_api::types::PortMapping],
        telo: Option<&str>,
        build_spec: impl FnOnce(&str, &str) -> StartSpec,
    ) -> Result<SessionCreated, AdmissionError> {
        let apps = [crate::session::SessionApp {
            name: app.to_owned(),
            io: runner_api::watch::IoMode::Tty,
            ports: ports.to_vec(),
            telo: telo.map(str::to_owned),
        }];
        let session = self.admit_as(
            None,
            None,
            Some((claimant, SessionKind::Run)),
            |id, created_at| {
                Session::with_apps(
                    id,
                    created_at,
                    self.inner.limits.replay_buffer_bytes,
                    0,
                    Some(tokio::time::Instant::now()),
                    self.inner.metrics.clone(),
                    runner_api::watch::SessionMode::Run,
                    &apps,
                )
            },
        )?;
        Ok(self.launch_run(session, build_spec))
    }

    /// Publish every session's output through `shipper` from now on, and
    /// carry a session adopted after a crash with the `marks` its peers
    /// sent.
    pub(crate) fn set_mark_stream(
        &self,
        shipper: crate::session::shipping::OutputShipper,
        marks: Arc<crate::session::shipping::PeerMarks>,
    ) {
        let _ = self.inner.mark_stream.set((shipper, marks));
    }

    /// The marks a session adopted here starts from: those its previous
    /// owner left on its objects (a hand-over), else those it sent ahead
    /// to this replica (a crash).
    pub(crate) fn carried_marks(
        &self,
        session_id: &str,
        left: &[crate::backend_session::OutputMarks],
    ) -> Vec<crate::backend_session::OutputMarks> {
        if !left.is_empty() {
            return left.to_vec();
        }
        // Taken: this replica owns the session now, and its own frames'
        // marks go to its peers.
        self.inner
            .mark_stream
            .get()
            .map(|(_, marks)| {
                let kept = marks.marks_of(session_id);
                marks.forget(session_id);
                tracing::debug!(
                    session_id,
                    apps = kept.len(),
                    marks = kept.iter().map(|m| m.points.len()).sum::<usize>(),
                    "carrying the output marks the previous owner sent ahead"
                );
                kept
            })
            .unwrap_or_default()
    }

    /// Announce every session's lifecycle to `webhooks` from now on.
    pub fn set_webhooks(&self, webhooks: crate::webhooks::Webhooks) {
        let _ = self.inner.webhooks.set(webhooks);
    }

    /// Give every session's tcp endpoints their URL on the session edge
    /// `preview` from now on.
    pub fn set_preview(&self, preview: crate::edge::Preview, wake_timeout: Duration) {
        let _ = self.inner.preview.set(preview);
        let _ = self.inner.wake_timeout.set(wake_timeout);
    }

    /// The session edge, when it is on.
    pub fn preview(&self) -> Option<&crate::edge::Preview> {
        self.inner.preview.get()
    }

    /// Gives a session taken over from a previous runner the share links
    /// that runner kept, their URLs made again (they open only with the
    /// same signing key). Without the edge they are not listed, and stay
    /// kept for a runner that has it.
    pub(crate) fn restore_links(&self, session: &Session, kept: Vec<crate::backend::KeptLink>) {
        let Some(preview) = self.preview() else {
            return;
        };
        session
            .links
            .restore(kept, crate::edge::unix_now(), |link| {
                preview.link_url(&link.id, &session.id, link.port, link.expires_at)
            });
    }

    /// Ties a session entering the registry to the webhooks and the edge,
    /// if any, and names the replica that holds it.
    pub(crate) fn attach_webhooks(&self, session: &Session) {
        if let Some(webhooks) = self.inner.webhooks.get() {
            let _ = session.webhooks.set(webhooks.clone());
        }
        if let Some(replicas) = self.inner.backend.replicas() {
            let _ = session.replica.set(Arc::from(replicas.replica_id()));
        }
        if let Some((shipper, _)) = self.inner.mark_stream.get() {
            let _ = session.shipper.set(shipper.for_session(&session.id));
        }
        if let Some(preview) = self.inner.preview.get() {
            let _ = session.preview.set(preview.clone());
        }
    }

    /// The catalog watch sessions' agents come from (`RUNNER_APPS`).
    pub fn set_agent_catalog(&self, catalog: crate::apps::AppCatalog) {
        let _ = self.inner.agents.set(catalog);
    }

    /// The agents a watch session may name (`features.agents`): catalog
    /// entries with a port, when this runner runs watch sessions with
    /// agents.
    pub fn offered_agents(&self) -> Vec<String> {
        if !self.offers_watch() || !self.backend_runs_agents() {
            return Vec::new();
        }
        self.inner
            .agents
            .get()
            .map(|catalog| catalog.agents().into_iter().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Whether `mode: "watch"` is offered: the operator enabled it and the
    /// backend runs watch sessions.
    pub fn offers_watch(&self) -> bool {
        self.inner.limits.watch.enabled && self.inner.backend.watch_sessions().is_some()
    }

    /// What `tenant` holds now (its sessions' count, resources and today's
    /// live seconds).
    pub fn usage(&self, tenant: &str) -> Usage {
        let sessions = lock(&self.inner.sessions);
        self.usage_locked(&sessions, tenant)
    }

    fn usage_locked(&self, sessions: &IdMap<Arc<Session>>, tenant: &str) -> Usage {
        let day = crate::tenancy::utc_day();
        let mut usage = Usage {
            session_seconds_today: lock(&self.inner.departed_seconds)
                .get(tenant)
                .filter(|(kept, _)| *kept == day)
                .map_or(0, |(_, seconds)| *seconds),
            ..Usage::default()
        };
        for session in sessions.values() {
            if session.owner().is_none_or(|owner| owner.tenant != tenant) {
                continue;
            }
            usage.session_seconds_today += session.tenancy.seconds_on(day);
            if session.is_suspended() {
                usage.suspended_sessions += 1;
                continue;
            }
            // A session being stopped is on its way out: a client that
            // deleted one to make room gets the room at once.
            if session.is_terminal() || session.is_user_stopped() {
                continue;
            }
            usage.sessions += 1;
            if session.is_live_watch() {
                usage.watch_sessions += 1;
            }
            let SessionResources {
                cpu_millis,
                memory_bytes,
            } = session.tenancy.resources();
            usage.cpu += cpu_millis;
            usage.memory += memory_bytes;
        }
        usage
    }

    /// Whether the backend's watch sessions can run a co-resident agent.
    pub(super) fn backend_runs_agents(&self) -> bool {
        self.inner
            .backend
            .watch_sessions()
            .is_some_and(|watch| watch.offers_agents())
    }

    /// Watch sessions that are neither over nor suspended.
    pub fn live_watch_sessions(&self) -> usize {
        lock(&self.inner.sessions)
            .values()
            .filter(|s| s.is_live_watch())
            .count()
    }

    /// Take over the sessions a previous runner process left running (once,
    /// at boot). Returns how many were adopted.
    pub async fn recover(&self) -> usize {
        let adopted = {
            let _adopting = self.inner.adopting.lock().await;
            self.adopt_left_sessions().await
        };
        self.inner.recovered.send_replace(true);
        if let Some(replicas) = self.inner.backend.replicas() {
            self.follow_replicas(replicas);
        }
        adopted
    }

    /// The sessions the backend offers that this registry does not hold,
    /// adopted: run sessions resumed, watch sessions kept suspended (or
    /// taken over as they run).
    async fn adopt_left_sessions(&self) -> usize {
        let recovered = self.inner.backend.recover(self.held_sessions()).await;
        let count = recovered.len();
        for session in recovered {
            let Ok(admitted) = self.admit(Some(&session)) else {
                continue;
            };
            if let Some(digest) = session.token_digest {
                admitted.guard_with_token_digest(None, digest);
            }
            info!(session_id = %session.session_id, generation = session.generation, "adopting a session from a previous runner");
            let backend = self.inner.backend.clone();
            self.spawn_launch(admitted, move |sink| async move {
                backend.resume(session, sink).await.map(Launched::run)
            });
        }
        let kept = self.recover_suspended().await;
        count + kept
    }

    /// What the backend's recovery must leave alone: the sessions this
    /// runner holds when it asks. Borrowed for the recovery only.
    pub(crate) fn held_sessions(&self) -> crate::launch::HeldSessions {
        let registry = self.clone();
        std::sync::Arc::new(move |id: &str| lock(&registry.inner.sessions).contains_key(id))
    }

    /// Whether boot-time adoption has finished.
    pub fn is_recovered(&self) -> bool {
        *self.inner.recovered.borrow()
    }

    /// Resolves once boot-time adoption has finished.
    pub async fn wait_recovered(&self) {
        let mut rx = self.inner.recovered.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    fn admit(&self, recovered: Option<&RecoveredSession>) -> Result<Arc<Session>, AdmissionError> {
        self.admit_as(recovered, None, None, |id, created_at| {
            self.new_run_session(id, created_at)
        })
    }

    /// Admits a session built by `build` from its new id and creation time;
    /// with `watch_ceiling`, a watch session, refused when that many live
    /// ones exist (checked under the same lock as the session limit, so two
    /// creates never both take the last place).
    fn admit_as(
        &self,
        recovered: Option<&RecoveredSession>,
        watch_ceiling: Option<usize>,
        claimant: Option<(&Claimant, SessionKind)>,
        build: impl FnOnce(String, String) -> Session,
    ) -> Result<Arc<Session>, AdmissionError> {
        let (claimant, kind) = match claimant {
            Some((claimant, kind)) => (Some(claimant), kind),
            None => (None, SessionKind::Run),
        };
        let resources = self.inner.backend.session_resources(kind);
        // Counted from the shared caches before the lock is taken (it goes
        // over every pod and record): what other replicas hold is only as
        // fresh as those caches anyway.
        let elsewhere = if recovered.is_none() {
            self.inner
                .backend
                .replicas()
                .map(|replicas| replicas.elsewhere())
                .unwrap_or_default()
        } else {
            crate::replicas::Elsewhere::default()
        };
        let mut evicted = None;
        let session = {
            let mut sessions = lock(&self.inner.sessions);
            if let Some(recovered) = recovered {
                // A live workload from before the restart is admitted whatever
                // the limit: refusing it would only orphan it.
                let session = Arc::new(Session::new(
                    recovered.session_id.clone(),
                    recovered.created_at.clone(),
                    self.inner.limits.replay_buffer_bytes,
                    recovered.generation,
                    None,
                    self.inner.metrics.clone(),
                ));
                session.carry_output(
                    self.carried_marks(&recovered.session_id, &recovered.output_marks),
                );
                session.tenancy.set(
                    recovered.owner.clone(),
                    self.inner.backend.session_resources(SessionKind::Run),
                );
                self.attach_webhooks(&session);
                self.restore_links(&session, recovered.links.clone());
                sessions.insert(recovered.session_id.clone(), session.clone());
                drop(sessions);
                session.emit(RunEvent::Status {
                    status: RunStatus::Starting,
                });
                return Ok(session);
            }
            if self.inner.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(AdmissionError::ShuttingDown);
            }
            if let Some(max) = watch_ceiling
                && sessions.values().filter(|s| s.is_live_watch()).count()
                    + elsewhere.watch_sessions
                    >= max
            {
                return Err(AdmissionError::TooManyWatchSessions { max });
            }
            if let Some(Claimant {
                owner: Some(owner),
                limits: Some(limits),
            }) = claimant
            {
                let usage = self.usage_locked(&sessions, &owner.tenant);
                let ask = Ask {
                    watch: kind == SessionKind::Watch,
                    resources,
                };
                crate::tenancy::quota::check(limits, &usage, &ask)
                    .map_err(AdmissionError::QuotaExceeded)?;
            }
            // Suspended watch sessions have their own bound
            // (RUNNER_WATCH_MAX_SUSPENDED) and hold no place here: they are
            // someone's kept work, promised their own retention.
            let occupied =
                sessions.values().filter(|s| !s.is_suspended()).count() + elsewhere.sessions;
            if occupied >= self.inner.limits.max_sessions {
                // History yields to live work: the finished session that
                // ended longest ago makes room; live and suspended sessions
                // are never evicted.
                let oldest_finished = sessions
                    .values()
                    .filter_map(|s| s.exited_at().map(|at| (at, s.id.clone())))
                    .min();
                match oldest_finished {
                    Some((_, id)) => {
                        evicted = sessions.remove(&id);
                        if let Some(evicted) = &evicted {
                            credit_departed(&self.inner, evicted);
                        }
                    }
                    None => {
                        return Err(AdmissionError::TooManySessions {
                            max: self.inner.limits.max_sessions,
                        });
                    }
                }
            }
            let id = loop {
                let id = new_session_id();
                if !sessions.contains_key(&id) {
                    break id;
                }
            };
            let session = build(id.clone(), iso_now());
            session.tenancy.set(
                claimant.and_then(|claimant| claimant.owner.clone()),
                resources,
            );
            self.attach_webhooks(&session);
            let session = Arc::new(session);
            sessions.insert(id, session.clone());
            session
        };
        session.announce(crate::webhooks::LifecycleKind::Created, None);
        if let Some(evicted) = evicted {
            debug!(session_id = %evicted.id, "evicted finished session to admit a new one");
            self.release(&evicted);
        }
        // Every stream starts with the status the session is in.
        session.emit(RunEvent::Status {
            status: RunStatus::Starting,
        });
        Ok(session)
    }

    /// Run a start (or a resume) in the background and wire its outcome.
    fn spawn_launch<F, Fut>(&self, session: Arc<Session>, launch: F)
    where
        F: FnOnce(SessionSink) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Launched, StartError>> + Send,
    {
        self.spawn_supervisor(session.clone());
        self.spawn_start(session, launch);
    }

    /// Runs a start (a first one, or a watch session's resume) and installs
    /// what it started.
    fn spawn_start<F, Fut>(&self, session: Arc<Session>, launch: F)
    where
        F: FnOnce(SessionSink) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Launched, StartError>> + Send,
    {
        let sink = SessionSink::new(session.clone());
        let shutdown = self.inner.shutdown.clone();
        let metrics = self.inner.metrics.clone();
        let backend = self.inner.backend.clone();
        let span = info_span!("session", session_id = %session.id);
        let in_flight = StartInFlight::new(&self.inner.starts_in_flight);
        self.inner.tasks.spawn(
            async move {
                let _in_flight = in_flight;
                // A watch session deleted while it started or resumed never
                // got a workload whose stop would discard what the backend
                // keeps for a resume (its checkpoint): it is discarded here,
                // as for a session deleted while suspended, so a restart
                // never brings the deleted session back.
                let discard_if_deleted = |session: &Session| {
                    if session.mode() == SessionMode::Watch && session.is_user_stopped() {
                        backend.release(&session.id);
                    }
                };
                let started = tokio::select! {
                    started = launch(sink.clone()) => started,
                    () = shutdown.cancelled() => {
                        sink.status(RunStatus::Stopped);
                        return;
                    }
                };
                match started {
                    Ok(Launched { handle, watch }) => {
                        session.install_handle(handle.clone());
                        if let Some(workload) = watch {
                            session.install_watch_workload(workload);
                        }
                        // A DELETE that arrived while the workload was coming up
                        // is honoured now that there is something to stop.
                        if (session.is_user_stopped() || session.kernel_exit().is_some())
                            && !session.is_terminal()
                            && let Err(err) = handle.stop().await
                        {
                            warn!(error = %err, "stopping a session deleted during start failed");
                        }
                    }
                    Err(err) if err.is_cancelled() => {
                        info!("session stopped while starting");
                        sink.status(RunStatus::Stopped);
                        discard_if_deleted(&session);
                    }
                    Err(err) => {
                        error!(stage = %err.stage, error = ?err, "session start failed");
                        metrics.start_failed(err.stage);
                        sink.status(RunStatus::failed(err.to_string()));
                        discard_if_deleted(&session);
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Supervises a session on the registry's behalf until it ends: stops a run
    /// the kernel reported finished, opens the start gate when its fallback
    /// elapses, and once the session is over keeps it readable for the exit
    /// TTL before removing it. The sink only records; everything here has the
    /// registry as its owner, so shutdown cancels and joins it.
    fn spawn_supervisor(&self, session: Arc<Session>) {
        let registry = Arc::downgrade(&self.inner);
        let shutdown = self.inner.shutdown.clone();
        let tasks = self.inner.tasks.clone();
        let ttl = self.inner.limits.exit_ttl;
        self.inner.tasks.spawn(async move {
            let ended = session.ended();
            let mut kernel_exit = session.watch_kernel_exit();
            let mut fallback = session.watch_start_fallback();
            let mut run_finished = false;
            let mut fallback_elapsed = false;
            loop {
                tokio::select! {
                    // A finished run is stopped even when its end is already
                    // recorded: the stop is idempotent, a leftover workload is
                    // not.
                    biased;
                    _ = kernel_exit.wait_for(Option::is_some), if !run_finished => {
                        run_finished = true;
                        // Without a handle yet, the launch stops it once it
                        // has one.
                        if let Some(handle) = session.handle() {
                            let id = session.id.clone();
                            tasks.spawn(async move {
                                if let Err(err) = handle.stop().await {
                                    warn!(session_id = %id, error = %err, "stopping a finished run failed");
                                }
                            });
                        }
                    }
                    () = fallback_deadline(&mut fallback), if !fallback_elapsed => {
                        fallback_elapsed = true;
                        session.signal_gate(GateSignal::FallbackElapsed);
                    }
                    () = ended.cancelled() => break,
                    () = shutdown.cancelled() => return,
                }
            }
            // Ended without finishing: left for a successor runner.
            if !session.is_terminal() {
                return;
            }
            let target = Arc::downgrade(&session);
            drop(session);
            tokio::select! {
                () = tokio::time::sleep(ttl) => {}
                () = shutdown.cancelled() => return,
            }
            remove_expired(&registry, &target);
        });
    }

    /// DELETE: idempotent; an unknown or finished session is a no-op, and a
    /// session still starting is stopped as soon as its workload is up.
    pub async fn stop(&self, id: &str) -> Result<(), StopError> {
        let Some(session) = self.get(id) else {
            return Ok(());
        };
        session.request_stop();
        if session.is_terminal() {
            return Ok(());
        }
        // A suspended watch session has no workload: it ends here, and what
        // the backend kept for its resume goes with it.
        if matches!(session.status(), RunStatus::Suspended) {
            if let Some(mut state) = session.watch_state() {
                state.suspended_at = None;
            }
            session.emit(RunEvent::Status {
                status: RunStatus::Stopped,
            });
            self.inner.backend.release(&session.id);
            return Ok(());
        }
        let handle = lock(&session.state).handle.clone();
        match handle {
            Some(handle) => handle.stop().await,
            None => Ok(()),
        }
    }

    /// Stop every live session (each reports `stopped`), wait up to `grace` for
    /// them to end, then cancel whatever is left and every retention timer,
    /// and let the backend stop its own tasks.
    pub async fn shutdown(&self, grace: Duration) {
        // Under the sessions lock, so no admission is half way through.
        {
            let _sessions = lock(&self.inner.sessions);
            self.inner
                .closing
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if self.inner.backend.leaves_sessions_on_shutdown() {
            self.hand_over(grace).await;
            self.inner.backend.shutdown().await;
            return;
        }
        let mut sessions = self.sessions();
        // Watch sessions outlive the runner: suspended, not stopped.
        let mut kept = Vec::new();
        for session in sessions.iter().filter(|s| s.is_live_watch()) {
            if self.suspend_for_shutdown(session).await {
                kept.push(session.id.clone());
            }
        }
        sessions.retain(|s| !kept.contains(&s.id));
        if !kept.is_empty() {
            info!(
                sessions = kept.len(),
                "watch sessions suspended for the next runner"
            );
        }
        for session in &sessions {
            session.request_stop();
        }
        let mut stops = tokio::task::JoinSet::new();
        for session in sessions.iter().filter(|s| !s.is_terminal()) {
            let handle = lock(&session.state).handle.clone();
            if let Some(handle) = handle {
                let id = session.id.clone();
                stops.spawn(async move {
                    if let Err(err) = handle.stop().await {
                        warn!(session_id = %id, error = %err, "stop during shutdown failed");
                    }
                });
            }
        }
        let all_ended = async {
            while stops.join_next().await.is_some() {}
            for session in &sessions {
                session.ended.cancelled().await;
            }
        };
        if tokio::time::timeout(grace, all_ended).await.is_err() {
            warn!("sessions still running after the shutdown grace period");
        }
        for session in &sessions {
            if !session.is_terminal() && !matches!(session.status(), RunStatus::Suspended) {
                session.emit(RunEvent::Status {
                    status: RunStatus::Stopped,
                });
            }
        }
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        if tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_err()
        {
            warn!("background session tasks did not finish after shutdown");
        }
        self.inner.backend.shutdown().await;
    }

    /// Shutdown of a runner whose successor adopts its workloads: live
    /// sessions are neither stopped nor reported stopped; the backend stops
    /// observing them and this process records nothing more about them.
    async fn hand_over(&self, grace: Duration) {
        // A session admitted a moment ago gets its workload first (its pod
        // created), so the successor has something to adopt; a start that
        // takes longer than this is cut off as before.
        let mut starts = self.inner.starts_in_flight.subscribe();
        let settled = tokio::time::timeout(grace.min(START_SETTLE_ON_HAND_OVER), async {
            let _ = starts.wait_for(|n| *n == 0).await;
        })
        .await
        .is_ok();
        if !settled {
            warn!("sessions still starting when the runner left; they are stopped");
        }
        let sessions = self.sessions();
        let mut left = Vec::new();
        for session in &sessions {
            let handle = {
                let mut state = lock(&session.state);
                if state.status.is_terminal() {
                    continue;
                }
                // No output is recorded from here on, so the marks below
                // are of the last frame any client can get from this runner.
                state.handed_over = true;
                state.handle.clone()
            };
            left.push((session.clone(), handle));
        }
        let handing = left.iter().map(|(session, handle)| async move {
            if let Some(handle) = handle {
                handle.hand_over(session.output_marks()).await;
            }
        });
        if tokio::time::timeout(HAND_OVER_BOUND, futures_util::future::join_all(handing))
            .await
            .is_err()
        {
            warn!(
                "could not leave every session's output marks in time; clients resuming those sessions are told of a gap"
            );
        }
        for (session, _) in &left {
            session.ended.cancel();
        }
        let left = left.len();
        if left > 0 {
            info!(
                sessions = left,
                "leaving live sessions running for the next runner"
            );
        }
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        if tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_err()
        {
            warn!("background session tasks did not finish after shutdown");
        }
    }

    fn release(&self, session: &Arc<Session>) {
        session.ended.cancel();
        self.inner.backend.release(&session.id);
    }
}

/// What a start produced: the workload, and for a watch session its
/// workspace surface too.
pub(crate) struct Launched {
    handle: Arc<dyn BackendSession>,
    watch: Option<Arc<dyn WatchWorkload>>,
}

impl Launched {
    fn run(handle: Arc<dyn BackendSession>) -> Self {
        Self {
            handle,
            watch: None,
        }
    }

    fn watch(workload: Arc<dyn WatchWorkload>) -> Self {
        Self {
            handle: workload.clone(),
            watch: Some(workload),
        }
    }
}

/// Resolves when the start gate's fallback, once armed, has elapsed.
async fn fallback_deadline(armed: &mut watch::Receiver<Option<tokio::time::Instant>>) {
    // The sender lives in the session the caller holds, so the channel cannot
    // close under it; an error would only mean there is nothing to wait for.
    let Ok(at) = armed.wait_for(Option::is_some).await.map(|at| *at) else {
        return std::future::pending().await;
    };
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Keeps the live seconds a session leaving the registry counted today
/// (called with the sessions lock held).
fn credit_departed(registry: &RegistryInner, session: &Session) {
    let Some(owner) = session.owner() else {
        return;
    };
    let day = crate::tenancy::utc_day();
    let seconds = session.tenancy.seconds_on(day);
    if seconds == 0 {
        return;
    }
    let mut departed = lock(&registry.departed_seconds);
    let entry = departed.entry(owner.tenant.clone()).or_insert((day, 0));
    if entry.0 != day {
        *entry = (day, 0);
    }
    entry.1 += seconds;
    departed.retain(|_, (kept, _)| *kept >= day);
}

/// Drops a finished session whose retention ran out, unless it already left
/// (evicted) or the registry is gone.
fn remove_expired(registry: &Weak<RegistryInner>, target: &Weak<Session>) {
    let (Some(registry), Some(target)) = (registry.upgrade(), target.upgrade()) else {
        return;
    };
    let removed = {
        let mut sessions = lock(&registry.sessions);
        match sessions.get(&target.id) {
            Some(current) if Arc::ptr_eq(current, &target) => {
                let removed = sessions.remove(&target.id);
                credit_departed(&registry, &target);
                removed
            }
            _ => None,
        }
    };
    if let Some(removed) = removed {
        debug!(session_id = %removed.id, "finished session reached its retention limit");
        removed.ended.cancel();
        registry.backend.release(&removed.id);
    }
}
