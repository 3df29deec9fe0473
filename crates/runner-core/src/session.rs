//! One session's record: its status, its two replay buffers (lifecycle
//! events and terminal output), its start gate and the input that waits for
//! its workload. The backend writes into it through the [`SessionSink`]; the
//! registry owns the sessions and supervises each to its end.
//!
//! Subscribers (SSE streams, WebSockets) never get their own queues. Each
//! session keeps two replay buffers — lifecycle events and terminal output —
//! and a `watch` channel per buffer that carries the newest id. A subscriber
//! keeps a cursor and, when woken, copies what lies past it out of the buffer.
//! So a connect is "snapshot and subscribe" in one step (nothing can fall
//! between them), memory is bounded by the buffers whatever the number of
//! subscribers, and a subscriber too slow to keep up is never waited for: it
//! learns it missed evicted entries through a `gap`, exactly like a client that
//! reconnects late.
//!
//! This module knows nothing of the registry or of the backend trait, only of
//! the workload handle it passes input to, so the backend seam can hand the
//! sink to a backend without the two depending on each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use runner_api::types::{PortMapping, RunEvent, RunStatus, SessionSnapshot};
use runner_api::watch::{IoMode, SessionMode, StreamTag};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::backend_session::BackendSession;
use crate::metrics::Metrics;
use crate::replay::{Replay, ReplayBuffer};
use crate::start_gate::{Admission, GateSignal, StartGate};
use crate::sync::lock;
use crate::time::iso_now;

mod carry;
mod channel;
#[cfg(test)]
mod edge_tests;
pub mod links;
#[cfg(test)]
mod retention_tests;
pub(crate) mod shipping;
mod sink;
mod tenancy;
mod watch_session;
mod watch_state;

pub use carry::{OutputMarks, ResumeAt};
pub use channel::{AppChannel, OutputChunk};
pub use sink::SessionSink;
pub use watch_state::WatchState;

/// Output chunks larger than this are split so that the byte cap of the
/// replay buffer really bounds memory (one huge chunk would otherwise be kept
/// whole as the newest entry).
pub const MAX_OUTPUT_CHUNK_BYTES: usize = 64 * 1024;

/// Event ids of a session's `n`-th generation (0 = started by this runner,
/// n = taken over after the n-th restart) start at `n * EVENT_ID_GENERATION + 1`,
/// past anything an earlier runner handed out.
pub const EVENT_ID_GENERATION: u64 = 1 << 40;
/// Output sequence numbers are 32 bits on the wire: 256 generations of up to
/// 16.7 million chunks each.
pub const OUTPUT_SEQ_GENERATION: u64 = 1 << 24;

/// One serialized lifecycle event, as stored for replay.
#[derive(Debug, Clone)]
pub struct EventFrame {
    /// SSE `event:` name.
    pub name: &'static str,
    /// The whole `RunEvent` as JSON.
    pub data: Bytes,
    /// A terminal status: the last event a stream delivers.
    pub terminal: bool,
}

pub struct Session {
    pub(crate) id: String,
    pub(crate) created_at: String,
    user_stopped: AtomicBool,
    /// Fires on DELETE or shutdown, so a start still waiting on its workload
    /// can give up at once.
    stop_requested: CancellationToken,
    pub(crate) mode: SessionMode,
    pub(crate) state: Mutex<SessionState>,
    events_seq: watch::Sender<u64>,
    /// The first output sequence number of every channel (its generation).
    first_output: u64,
    replay_buffer_bytes: usize,
    /// A watch session's workload, launch description and budget.
    pub(crate) watch: Option<Mutex<WatchState>>,
    /// Open SSE streams and terminal sockets.
    subscribers: std::sync::atomic::AtomicUsize,
    /// When the last subscriber left (creation, when none came yet).
    idle_since: Mutex<tokio::time::Instant>,
    /// Fires when the session reaches a terminal status or leaves the registry,
    /// stopping whatever background work a backend tied to it.
    pub(crate) ended: CancellationToken,
    /// Fired when this replica lets go of the session for another to
    /// serve: its open streams end so their clients reconnect.
    pub(crate) moved: CancellationToken,
    /// When this runner admitted it; `None` for an adopted session, whose
    /// start-to-running time this runner never saw.
    admitted_at: Option<tokio::time::Instant>,
    metrics: Arc<Metrics>,
    /// Holds `running` until the kernel says it started (new sessions only);
    /// `None` once open.
    gate: Mutex<Option<StartGate>>,
    /// Cleared once the gate opened, so output does not take its lock.
    gated: AtomicBool,
    /// The exit code the kernel reported on its debug stream
    /// (`Kernel.Stopped`) for a run it holds open (`--inspect`); the session
    /// then ends `exited` with it rather than `stopped`.
    kernel_exit: watch::Sender<Option<i64>>,
    /// When a start gate holding `running` opens on its own (its fallback,
    /// [`StartGate::fallback`]) if nothing opened it before. The sink sets it;
    /// the registry waits for it, so the timer has an owner that joins it.
    start_fallback: watch::Sender<Option<tokio::time::Instant>>,
    /// The workload token its app's endpoints carry (`tokenEnv`, 0.16).
    endpoint_token: std::sync::OnceLock<String>,
    /// The workload token of its co-resident agent, reported on
    /// `running.agent`.
    agent_token: std::sync::OnceLock<String>,
    /// SHA-256 of every workload token a request to its published ports
    /// must present ([`Session::edge_access`]), with the one port it guards
    /// (`None`: every port, an app session's token); empty when it has none.
    edge_digests: Mutex<Vec<(Option<u16>, [u8; 32])>>,
    /// Its owner, the resources it holds and how long it was live today.
    pub(crate) tenancy: tenancy::SessionTenancy,
    /// Where its lifecycle steps are announced (`RUNNER_WEBHOOK_URL`).
    pub(crate) webhooks: std::sync::OnceLock<crate::webhooks::Webhooks>,
    /// The id of the replica that holds the session, when the runner runs
    /// several (reported as `replica`).
    pub(crate) replica: std::sync::OnceLock<Arc<str>>,
    /// With several replicas: where output is published, once its marks
    /// are on their way to the peers ([`shipping`]).
    pub(crate) shipper: std::sync::OnceLock<shipping::SessionShipper>,
    /// The session edge's base (`RUNNER_PREVIEW_BASE_URL`): its tcp
    /// endpoints then carry their edge `url`.
    pub(crate) preview: std::sync::OnceLock<crate::edge::Preview>,
    /// Its share links (`/v1/sessions/{id}/links`).
    pub links: links::ShareLinks,
    /// It runs with `inspect` (its kernel's inspection port may be served
    /// through the edge), and that port once the backend says.
    inspect_requested: AtomicBool,
    inspect_port: std::sync::OnceLock<u16>,
    /// Where its current workload's ports are dialed, once it runs.
    reach: Mutex<Option<crate::reach::Reach>>,
    /// Where ports its apps' kernels resolve are published, when the
    /// backend publishes ports per session.
    port_router: Mutex<Option<Arc<dyn crate::backend_session::PortRouter>>>,
    /// The tcp ports it publishes now (its endpoints), the only ones the
    /// edge forwards to.
    published: Mutex<std::collections::BTreeSet<u16>>,
}

/// What an edge in front of a session's published ports is told about a
/// request ([`Session::edge_access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeAccess {
    /// The session has no workload token: its hosts are public, as the
    /// reference runner's are.
    Open,
    /// The request presents one of the session's tokens.
    Granted,
    /// The session has a token and the request does not present it.
    Denied,
}

/// SHA-256 of a workload token: what is kept and compared of it.
pub fn token_digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// The debug-stream event a kernel sends when its run is over.
pub const KERNEL_STOPPED: &str = "Kernel.Stopped";

pub(crate) struct SessionState {
    pub(crate) status: RunStatus,
    /// Left running for a successor runner at shutdown: nothing more is
    /// recorded, so this process's streams end without a terminal status and
    /// their clients resume on the successor.
    pub(crate) handed_over: bool,
    exited_at: Option<String>,
    events: ReplayBuffer<EventFrame>,
    /// One byte channel per app, in the session's app order.
    pub(crate) channels: Vec<AppChannel>,
    pub(crate) handle: Option<Arc<dyn BackendSession>>,
    /// Input that arrived while the workload was coming up, delivered once it
    /// is up (the reference dropped it, losing the first keystrokes and the
    /// editor's initial terminal size).
    early_stdin: Vec<Bytes>,
    early_stdin_bytes: usize,
    early_resize: Option<(u16, u16)>,
}

/// Input held for a session that is still starting, at most.
pub const EARLY_STDIN_BYTES: usize = 64 * 1024;

impl Session {
    pub(crate) fn new(
        id: String,
        created_at: String,
        replay_buffer_bytes: usize,
        generation: u32,
        admitted_at: Option<tokio::time::Instant>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::with_apps(
            id,
            created_at,
            replay_buffer_bytes,
            generation,
            admitted_at,
            metrics,
            SessionMode::Run,
            &[SessionApp::default_app(Vec::new())],
        )
    }

    /// A session of `mode` running `apps` (one byte channel each).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_apps(
        id: String,
        created_at: String,
        replay_buffer_bytes: usize,
        generation: u32,
        admitted_at: Option<tokio::time::Instant>,
        metrics: Arc<Metrics>,
        mode: SessionMode,
        apps: &[SessionApp],
    ) -> Self {
        let first_event = u64::from(generation) * EVENT_ID_GENERATION + 1;
        let first_output = u64::from(generation) * OUTPUT_SEQ_GENERATION + 1;
        let channels = apps
            .iter()
            .map(|app| AppChannel::new(app, replay_buffer_bytes, first_output))
            .collect();
        Self {
            id,
            created_at,
            mode,
            first_output,
            replay_buffer_bytes,
            watch: None,
            subscribers: std::sync::atomic::AtomicUsize::new(0),
            idle_since: Mutex::new(tokio::time::Instant::now()),
            user_stopped: AtomicBool::new(false),
            stop_requested: CancellationToken::new(),
            state: Mutex::new(SessionState {
                status: RunStatus::Starting,
                exited_at: None,
                events: ReplayBuffer::starting_at(replay_buffer_bytes, first_event),
                channels,
                handle: None,
                early_stdin: Vec::new(),
                early_stdin_bytes: 0,
                early_resize: None,
                handed_over: false,
            }),
            events_seq: watch::Sender::new(first_event - 1),
            ended: CancellationToken::new(),
            moved: CancellationToken::new(),
            admitted_at,
            metrics,
            gate: Mutex::new(None),
            gated: AtomicBool::new(false),
            kernel_exit: watch::Sender::new(None),
            start_fallback: watch::Sender::new(None),
            endpoint_token: std::sync::OnceLock::new(),
            agent_token: std::sync::OnceLock::new(),
            edge_digests: Mutex::new(Vec::new()),
            tenancy: tenancy::SessionTenancy::default(),
            webhooks: std::sync::OnceLock::new(),
            replica: std::sync::OnceLock::new(),
            shipper: std::sync::OnceLock::new(),
            preview: std::sync::OnceLock::new(),
            links: links::ShareLinks::default(),
            port_router: Mutex::new(None),
            inspect_requested: AtomicBool::new(false),
            inspect_port: std::sync::OnceLock::new(),
            reach: Mutex::new(None),
            published: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// Traffic reached the session another way than its subscribers (the
    /// session edge): it is not idle now.
    pub fn note_activity(&self) {
        *lock(&self.idle_since) = tokio::time::Instant::now();
    }

    /// Whether the session publishes tcp `port` now: an endpoint it
    /// reported, or a port one of its apps declares or its kernel resolved.
    pub fn publishes_tcp(&self, port: u16) -> bool {
        lock(&self.published).contains(&port) || self.publishes_tcp_port(port)
    }

    /// Its kernel's inspection port, once the backend said.
    pub fn inspect_port(&self) -> Option<u16> {
        self.inspect_port.get().copied()
    }

    pub(crate) fn record_inspect_port(&self, port: u16) {
        let _ = self.inspect_port.set(port);
    }

    /// Where its current workload's ports are dialed.
    pub fn reach(&self) -> Option<crate::reach::Reach> {
        lock(&self.reach).clone()
    }

    pub(crate) fn record_reach(&self, reach: crate::reach::Reach) {
        *lock(&self.reach) = Some(reach);
    }

    /// Whether the edge serves `port` of this session: a tcp port it
    /// publishes, or its kernel's inspection port (when no app took it).
    pub fn serves_on_edge(&self, port: u16) -> bool {
        self.publishes_tcp(port)
            || (port == crate::edge::INSPECT_PORT && self.inspect_port().is_some())
    }

    /// Keeps the published ports, and gives each tcp endpoint its edge URL
    /// when the edge is on (and a session run with `inspect` its
    /// `inspectUrl`).
    fn with_edge_urls(&self, mut event: RunEvent) -> RunEvent {
        if let (
            Some(preview),
            RunEvent::Status {
                status: RunStatus::Running { inspect_url, .. },
            },
        ) = (self.preview.get(), &mut event)
            && self.inspect_requested.load(Ordering::SeqCst)
        {
            let port = crate::edge::INSPECT_PORT;
            let guarded = self.edge_access(None, Some(port)) != EdgeAccess::Open;
            *inspect_url = Some(preview.reported_url(&self.id, port, guarded));
        }
        // The co-resident agent's port is published like an app's, under
        // its own token.
        let mut agent_port = None;
        if let RunEvent::Status {
            status: RunStatus::Running {
                agent: Some(agent), ..
            },
        } = &mut event
            && agent.protocol == runner_api::types::PortProtocol::Tcp
        {
            agent_port = Some(agent.port);
            lock(&self.published).insert(agent.port);
            if let Some(preview) = self.preview.get() {
                let guarded = self.edge_access(None, Some(agent.port)) != EdgeAccess::Open;
                agent.url = Some(preview.reported_url(&self.id, agent.port, guarded));
            }
        }
        let (added, removed) = match &mut event {
            // A `running` that lists endpoints says what is published now;
            // one without (a watch session's) leaves the ports its
            // `endpoints` events announced.
            RunEvent::Status {
                status:
                    RunStatus::Running {
                        endpoints: Some(endpoints),
                        ..
                    },
            } => {
                let mut published = lock(&self.published);
                published.clear();
                published.extend(agent_port);
                drop(published);
                (Some(endpoints), None)
            }
            RunEvent::Endpoints { added, removed, .. } => (added.as_mut(), removed.as_ref()),
            _ => return event,
        };
        let mut published = lock(&self.published);
        for endpoint in removed.into_iter().flatten() {
            if endpoint.protocol == runner_api::types::PortProtocol::Tcp {
                published.remove(&endpoint.port);
            }
        }
        for endpoint in added.into_iter().flatten() {
            if endpoint.protocol != runner_api::types::PortProtocol::Tcp {
                continue;
            }
            published.insert(endpoint.port);
            if let Some(preview) = self.preview.get() {
                let guarded = self.edge_access(None, Some(endpoint.port)) != EdgeAccess::Open;
                endpoint.url = Some(preview.reported_url(&self.id, endpoint.port, guarded));
            }
        }
        drop(published);
        event
    }

    /// Announces a lifecycle step to the operator's webhook, if any.
    pub(crate) fn announce(
        &self,
        kind: crate::webhooks::LifecycleKind,
        status: Option<&RunStatus>,
    ) {
        let Some(webhooks) = self.webhooks.get() else {
            return;
        };
        let owner = self.owner();
        webhooks.emit(crate::webhooks::LifecycleEvent {
            kind,
            session_id: self.id.clone(),
            mode: self.mode.as_str().to_owned(),
            tenant: owner.map(|owner| owner.tenant.clone()),
            subject: owner.map(|owner| owner.subject.clone()),
            status: status.map(|status| status.kind().to_owned()),
            exit_code: match status {
                Some(RunStatus::Exited { code }) => Some(*code),
                _ => None,
            },
            time: time::OffsetDateTime::now_utc(),
        });
    }

    /// The principal that created it (`None` when it was created without
    /// authentication).
    pub fn owner(&self) -> Option<&crate::identity::Owner> {
        self.tenancy.owner()
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn created_at(&self) -> &str {
        &self.created_at
    }

    pub fn status(&self) -> RunStatus {
        lock(&self.state).status.clone()
    }

    pub fn exited_at(&self) -> Option<String> {
        lock(&self.state).exited_at.clone()
    }

    pub fn is_terminal(&self) -> bool {
        lock(&self.state).status.is_terminal()
    }

    /// Whether it runs now (without copying its status).
    pub fn is_running(&self) -> bool {
        matches!(lock(&self.state).status, RunStatus::Running { .. })
    }

    pub fn is_user_stopped(&self) -> bool {
        self.user_stopped.load(Ordering::SeqCst)
    }

    pub(crate) fn request_stop(&self) {
        self.user_stopped.store(true, Ordering::SeqCst);
        self.stop_requested.cancel();
    }

    pub fn snapshot(&self) -> SessionSnapshot {
        let agent = self
            .watch_state()
            .and_then(|watch| watch.spec.agent.as_ref().map(|agent| agent.name.clone()));
        let state = lock(&self.state);
        SessionSnapshot {
            session_id: self.id.clone(),
            status: state.status.clone(),
            mode: Some(self.mode),
            agent,
            apps: Some(state.channels.iter().map(AppChannel::snapshot).collect()),
            created_at: self.created_at.clone(),
            exited_at: state.exited_at.clone(),
            replica: self.replica.get().map(|replica| replica.to_string()),
        }
    }

    pub fn mode(&self) -> SessionMode {
        self.mode
    }

    /// The session's apps, in order.
    pub fn app_names(&self) -> Vec<String> {
        lock(&self.state)
            .channels
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    /// The name and io mode of app `name`, or of the only app when `name` is
    /// `None`; the `/io` app resolution (docs/contract.md §5.1).
    pub fn resolve_app(&self, name: Option<&str>) -> Result<(String, IoMode), AppResolution> {
        let state = lock(&self.state);
        match name {
            Some(name) => state
                .channels
                .iter()
                .find(|c| c.name == name)
                .map(|c| (c.name.clone(), c.io))
                .ok_or(AppResolution::Unknown),
            None if state.channels.len() == 1 => {
                let only = &state.channels[0];
                Ok((only.name.clone(), only.io))
            }
            None => Err(AppResolution::Ambiguous(state.channels.len())),
        }
    }

    /// The live backend session, once its start resolved.
    pub fn handle(&self) -> Option<Arc<dyn BackendSession>> {
        lock(&self.state).handle.clone()
    }

    /// Input for app `app`: its workload gets it (a session's first app
    /// is the one [`Session::write_stdin`] feeds).
    pub fn write_app_stdin(&self, app: &str, bytes: Bytes) {
        if self.mode == SessionMode::Run {
            return self.write_stdin(bytes);
        }
        // Dropped while no workload runs (starting, suspended), as the
        // reference does for watch sessions.
        if let Some(handle) = &lock(&self.state).handle {
            handle.write_app_stdin(app, bytes);
        }
    }

    /// A terminal resize of app `app`.
    pub fn resize_app(&self, app: &str, cols: u16, rows: u16) {
        if self.mode == SessionMode::Run {
            return self.resize(cols, rows);
        }
        if let Some(handle) = &lock(&self.state).handle {
            handle.resize_app(app, cols, rows);
        }
    }

    /// Counts a subscriber (an SSE stream, a terminal socket) for idle
    /// detection until the guard drops.
    pub fn subscriber(self: &Arc<Self>) -> SubscriberGuard {
        self.subscribers.fetch_add(1, Ordering::SeqCst);
        SubscriberGuard(self.clone())
    }

    /// Since when the session had no subscriber; `None` while someone does.
    pub fn idle_since(&self) -> Option<tokio::time::Instant> {
        if self.subscribers.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*lock(&self.idle_since))
    }

    /// Terminal input: to the workload, or held (bounded) until it is up.
    pub fn write_stdin(&self, bytes: Bytes) {
        let mut state = lock(&self.state);
        if let Some(handle) = &state.handle {
            handle.write_stdin(bytes);
        } else if !state.status.is_terminal()
            && state.early_stdin_bytes + bytes.len() <= EARLY_STDIN_BYTES
        {
            state.early_stdin_bytes += bytes.len();
            state.early_stdin.push(bytes);
        }
    }

    /// A terminal resize: applied now, or remembered (the last one wins) until
    /// the workload is up.
    pub fn resize(&self, cols: u16, rows: u16) {
        let mut state = lock(&self.state);
        if let Some(handle) = &state.handle {
            handle.resize(cols, rows);
        } else {
            state.early_resize = Some((cols, rows));
        }
    }

    /// The workload is up: deliver what waited for it, in order, then let
    /// input flow directly. Done under the state lock (backends take input
    /// without blocking) so nothing typed meanwhile can overtake it.
    pub(crate) fn install_handle(&self, handle: Arc<dyn BackendSession>) {
        let mut state = lock(&self.state);
        if let Some((cols, rows)) = state.early_resize.take() {
            handle.resize(cols, rows);
        }
        for bytes in std::mem::take(&mut state.early_stdin) {
            handle.write_stdin(bytes);
        }
        state.early_stdin_bytes = 0;
        state.handle = Some(handle);
    }

    /// A token that fires when the session ends or leaves the registry.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    pub(crate) fn close_gate(&self, inspect: bool) {
        self.inspect_requested.store(inspect, Ordering::SeqCst);
        *lock(&self.gate) = Some(StartGate::new(inspect));
        self.gated.store(true, Ordering::SeqCst);
    }

    /// Emit `event` through the start gate. Returns the id of the last event
    /// emitted, `None` when it was held or nothing could be emitted.
    fn publish(&self, event: RunEvent) -> Option<u64> {
        if !self.gated.load(Ordering::SeqCst) {
            return self.emit(event);
        }
        let mut gate = lock(&self.gate);
        let Some(open_gate) = gate.as_mut() else {
            drop(gate);
            return self.emit(event);
        };
        let admission = open_gate.admit(event);
        self.apply(&mut gate, admission)
    }

    pub(crate) fn signal_gate(&self, signal: GateSignal) {
        if !self.gated.load(Ordering::SeqCst) {
            return;
        }
        let mut gate = lock(&self.gate);
        if let Some(admission) = gate.as_mut().and_then(|g| g.signal(signal)) {
            self.apply(&mut gate, admission);
        }
    }

    /// Emits under the gate's lock, so nothing overtakes what it released.
    fn apply(&self, gate: &mut Option<StartGate>, admission: Admission) -> Option<u64> {
        match admission {
            Admission::Pass(event) => self.emit(event),
            Admission::Held => None,
            Admission::Open(events) => {
                *gate = None;
                self.gated.store(false, Ordering::SeqCst);
                events.into_iter().fold(None, |_, event| self.emit(event))
            }
        }
    }

    fn is_holding_running(&self) -> bool {
        lock(&self.gate).as_ref().is_some_and(StartGate::is_holding)
    }

    /// The exit code the kernel reported for a run it holds open.
    pub fn kernel_exit(&self) -> Option<i64> {
        *self.kernel_exit.borrow()
    }

    /// Records the exit code of a run the kernel reported finished; `false`
    /// when one was recorded before (only the first report counts).
    fn record_kernel_exit(&self, code: i64) -> bool {
        self.kernel_exit.send_if_modified(|exit| {
            if exit.is_some() {
                return false;
            }
            *exit = Some(code);
            true
        })
    }

    /// Changes once the kernel reported its run finished.
    pub(crate) fn watch_kernel_exit(&self) -> watch::Receiver<Option<i64>> {
        self.kernel_exit.subscribe()
    }

    /// Asks for the start gate to open by itself at `at`; the first request
    /// stands.
    fn arm_start_fallback(&self, at: tokio::time::Instant) {
        self.start_fallback.send_if_modified(|armed| {
            if armed.is_some() {
                return false;
            }
            *armed = Some(at);
            true
        });
    }

    /// Changes once the start gate's fallback is armed.
    pub(crate) fn watch_start_fallback(&self) -> watch::Receiver<Option<tokio::time::Instant>> {
        self.start_fallback.subscribe()
    }

    /// The token every endpoint this session reports carries.
    pub(crate) fn set_endpoint_token(&self, token: String) {
        self.guard_with_token_digest(None, token_digest(&token));
        let _ = self.endpoint_token.set(token);
    }

    /// A token's digest the edge requires on `port` (`None`: on every
    /// port): a token this runner minted, or one an adopted session's
    /// record kept (its token itself is not kept).
    pub(crate) fn guard_with_token_digest(&self, port: Option<u16>, digest: [u8; 32]) {
        let mut digests = lock(&self.edge_digests);
        if !digests.contains(&(port, digest)) {
            digests.push((port, digest));
        }
    }

    /// Whether a request to this session's published `port` (`None`: not
    /// known, so every token of the session applies) that presents
    /// `presented` may pass: an app session's token guards all its ports,
    /// an agent's token its own port, and a watch session's apps are
    /// public. A port no app of the session publishes is not one of the
    /// public ones: every token applies there too, so a host the edge
    /// routes by pattern cannot name an undeclared port to get in without
    /// one. Compared by digest, in constant time.
    pub fn edge_access(&self, presented: Option<&str>, port: Option<u16>) -> EdgeAccess {
        use subtle::ConstantTimeEq;
        // Most sessions guard nothing: told without looking at their apps.
        if lock(&self.edge_digests).is_empty() {
            return EdgeAccess::Open;
        }
        let published = port.is_some_and(|port| self.publishes_tcp_port(port));
        let digests = lock(&self.edge_digests);
        let guarding: Vec<&[u8; 32]> = digests
            .iter()
            .filter(|(guarded, _)| guarded.is_none() || !published || *guarded == port)
            .map(|(_, digest)| digest)
            .collect();
        if guarding.is_empty() {
            return EdgeAccess::Open;
        }
        let Some(presented) = presented else {
            return EdgeAccess::Denied;
        };
        let presented = token_digest(presented);
        let matched = guarding
            .iter()
            .fold(subtle::Choice::from(0), |any, digest| {
                any | digest.ct_eq(&presented)
            });
        if bool::from(matched) {
            EdgeAccess::Granted
        } else {
            EdgeAccess::Denied
        }
    }

    /// Whether an app of this session declares tcp `port`.
    fn publishes_tcp_port(&self, port: u16) -> bool {
        lock(&self.state).channels.iter().any(|channel| {
            channel.ports.iter().any(|mapping| {
                mapping.port == port && mapping.protocol == runner_api::types::PortProtocol::Tcp
            })
        })
    }

    /// Stamps the workload tokens on the endpoints an event reports.
    fn with_tokens(&self, mut event: RunEvent) -> RunEvent {
        if let (
            Some(token),
            RunEvent::Status {
                status:
                    RunStatus::Running {
                        agent: Some(agent), ..
                    },
            },
        ) = (self.agent_token.get(), &mut event)
        {
            agent.token = Some(token.clone());
        }
        let Some(token) = self.endpoint_token.get() else {
            return event;
        };
        let endpoints = match &mut event {
            RunEvent::Status {
                status:
                    RunStatus::Running {
                        endpoints: Some(endpoints),
                        ..
                    },
            } => endpoints,
            RunEvent::Endpoints {
                added: Some(endpoints),
                ..
            } => endpoints,
            _ => return event,
        };
        for endpoint in endpoints {
            endpoint.token = Some(token.clone());
        }
        event
    }

    pub(crate) fn emit(&self, event: RunEvent) -> Option<u64> {
        let event = self.with_tokens(self.with_edge_urls(event));
        let terminal = matches!(&event, RunEvent::Status { status } if status.is_terminal());
        let data = match serde_json::to_vec(&event) {
            // Exactly sized: the serializer's doubling growth would otherwise
            // be kept for as long as the event is replayable, and a `Bytes`
            // over a vector with spare room costs one more allocation.
            Ok(mut data) => {
                data.shrink_to_fit();
                Bytes::from(data)
            }
            Err(err) => {
                error!(error = %err, "could not serialize a session event");
                return None;
            }
        };
        let frame = EventFrame {
            name: event.name(),
            data,
            terminal,
        };
        let mut came_up = false;
        let id = {
            let mut state = lock(&self.state);
            if state.status.is_terminal() || state.handed_over {
                return None;
            }
            if let RunEvent::Status { status } = event {
                came_up = matches!(state.status, RunStatus::Starting)
                    && matches!(status, RunStatus::Running { .. });
                if terminal || matches!(status, RunStatus::Suspended) {
                    self.tenancy.went_idle();
                } else {
                    self.tenancy.went_live();
                }
                use crate::webhooks::LifecycleKind;
                let step = match (&state.status, &status) {
                    (_, status) if status.is_terminal() => Some(LifecycleKind::Ended),
                    (RunStatus::Suspended, RunStatus::Starting) => Some(LifecycleKind::Resumed),
                    (RunStatus::Running { .. }, RunStatus::Running { .. }) => None,
                    (_, RunStatus::Running { .. }) => Some(LifecycleKind::Running),
                    (RunStatus::Suspended, RunStatus::Suspended) => None,
                    (_, RunStatus::Suspended) => Some(LifecycleKind::Suspended),
                    _ => None,
                };
                if let Some(step) = step {
                    self.announce(step, terminal.then_some(&status));
                }
                state.status = status;
                if terminal {
                    state.exited_at = Some(iso_now());
                }
            }
            // Counted before the event can be read: a client that saw
            // `running` finds it in the metrics.
            if came_up && let Some(admitted_at) = self.admitted_at {
                self.metrics.session_running_after(admitted_at.elapsed());
            }
            let size = frame.data.len();
            state.events.push(frame, size)
        };
        self.events_seq.send_replace(id);
        // Whoever recorded the end, what is tied to the session stops now.
        if terminal {
            self.ended.cancel();
        }
        Some(id)
    }

    /// Records output of app `app` (the first app when `None`).
    /// Records `chunk` and reads the kernel's resolution lines in it
    /// (`None`: nothing was recorded).
    fn push_output(&self, app: Option<&str>, tag: StreamTag, chunk: Bytes) -> Option<OutputScan> {
        if chunk.is_empty() {
            return None;
        }
        let bytes = chunk.len();
        let (seq, last, scan) = {
            let mut state = lock(&self.state);
            // Nothing follows the terminal status: output from a process that
            // escaped its session (a daemon that left the process group) must
            // not change a finished session's history.
            if state.status.is_terminal() || state.handed_over {
                return None;
            }
            let channel = channel_mut(&mut state.channels, app)?;
            let scan = channel.resolution.feed(&chunk);
            let scan = OutputScan {
                resolving: channel.resolution.is_resolving(),
                resolutions: scan.resolutions,
                app_output: scan.app_output,
            };
            let before = channel.newest_seq();
            let last = channel.record(tag, chunk);
            self.metrics.output_buffered(bytes);
            if self.ship(channel, before, last) {
                return Some(scan);
            }
            (channel.seq.clone(), last, scan)
        };
        seq.send_replace(last);
        Some(scan)
    }

    /// Output the backend knows it lost, at this point of app `app`.
    fn leave_output_hole(&self, app: Option<&str>) {
        self.record_inexact(app, |channel| channel.output.leave_hole());
    }

    /// Records on app `app`'s channel with `record` (which returns the new
    /// newest seq), unless the session has ended or left this runner;
    /// the channel's byte count no longer follows the workload's output.
    fn record_inexact(&self, app: Option<&str>, record: impl FnOnce(&mut AppChannel) -> u64) {
        let (seq, last) = {
            let mut state = lock(&self.state);
            if state.status.is_terminal() || state.handed_over {
                return;
            }
            let Some(channel) = channel_mut(&mut state.channels, app) else {
                return;
            };
            channel.lose_count();
            let before = channel.newest_seq();
            let last = record(channel);
            if self.ship(channel, before, last) {
                return;
            }
            (channel.seq.clone(), last)
        };
        seq.send_replace(last);
    }

    /// With several replicas, hands what `channel` recorded after seq
    /// `before`, up to `last`, to the shipper, which publishes it in order
    /// once its frames' marks (when the byte count is exact) are on their
    /// way to the peers. Called with the state locked, so shipments keep
    /// the order of recording. `false`: no shipper, publish it here.
    fn ship(&self, channel: &AppChannel, before: u64, last: u64) -> bool {
        let Some(shipper) = self.shipper.get() else {
            return false;
        };
        let points = channel.points_after(before);
        let tail = if points.is_empty() {
            Vec::new()
        } else {
            channel.checked_tail()
        };
        shipper.ship(shipping::Shipment {
            session: shipper.session.clone(),
            app: channel.shared_name.clone(),
            points,
            tail,
            seq: channel.seq.clone(),
            publish: last,
        });
        true
    }

    /// Lifecycle events after `after`, then live ones.
    pub fn subscribe_events(self: &Arc<Self>, after: u64) -> Cursor<EventFrame> {
        Cursor {
            session: self.clone(),
            rx: self.events_seq.subscribe(),
            position: after,
            resolve: None,
            settle_by: tokio::time::Instant::now(),
            read: Box::new(|session: &Session, after| session.replay_events(after)),
        }
    }

    /// Output chunks of the first app after sequence number `after`, then
    /// live ones.
    pub fn subscribe_output(self: &Arc<Self>, after: u64) -> Cursor<OutputChunk> {
        let first = lock(&self.state).channels.first().map(|c| c.name.clone());
        self.subscribe_app_output(first.as_deref().unwrap_or_default(), after)
    }

    /// Output chunks of app `app` after sequence number `after`, then live
    /// ones. A cursor on an app the session no longer runs reads nothing.
    pub fn subscribe_app_output(self: &Arc<Self>, app: &str, after: u64) -> Cursor<OutputChunk> {
        let rx = {
            let state = lock(&self.state);
            match state.channels.iter().find(|c| c.name == app) {
                Some(channel) => channel.seq.subscribe(),
                None => watch::Sender::new(0).subscribe(),
            }
        };
        let app: Arc<str> = Arc::from(app);
        let resolving = app.clone();
        Cursor {
            session: self.clone(),
            rx,
            position: after,
            settle_by: tokio::time::Instant::now() + SETTLE_WITHIN,
            // A seq of the previous owner's is translated once the output
            // it lies in has been rebuilt here.
            resolve: Some(Box::new(move |session: &Session, after| {
                let state = lock(&session.state);
                match state.channels.iter().find(|c| *c.name == *resolving) {
                    Some(channel) => channel.resume_at(after),
                    None => ResumeAt::After(after),
                }
            })),
            read: Box::new(move |session: &Session, after| session.replay_app_output(&app, after)),
        }
    }

    /// Takes the previous owner's marks of each app's output (before any
    /// output is recorded), so clients resuming from its frames are served
    /// from the same byte here.
    pub fn carry_output(&self, marks: Vec<OutputMarks>) {
        let mut state = lock(&self.state);
        for marks in marks {
            if let Some(channel) = state.channels.iter_mut().find(|c| c.name == marks.app) {
                channel.carry(marks);
            }
        }
    }

    /// Marks of each app's newest output frames, for the owner that takes
    /// the session over; apps whose byte count is not exact have none.
    pub fn output_marks(&self) -> Vec<OutputMarks> {
        lock(&self.state)
            .channels
            .iter()
            .filter_map(AppChannel::marks)
            .collect()
    }

    /// Text of the runner's own on app `app`'s output (the first app when
    /// `None`): shown like output, but it is not the workload's, so the
    /// byte count no longer matches the workload's output.
    fn push_note(&self, app: Option<&str>, tag: StreamTag, text: Bytes) {
        if !text.is_empty() {
            self.record_inexact(app, |channel| channel.record(tag, text));
        }
    }

    /// A receiver that changes whenever a lifecycle event is recorded.
    pub fn watch_events(&self) -> watch::Receiver<u64> {
        self.events_seq.subscribe()
    }

    pub fn replay_events(&self, after: u64) -> Replay<EventFrame> {
        lock(&self.state).events.replay(after)
    }

    /// The first app's output after `after`.
    pub fn replay_output(&self, after: u64) -> Replay<OutputChunk> {
        let state = lock(&self.state);
        match state.channels.first() {
            Some(channel) => channel.output.replay(after),
            None => Replay::empty(),
        }
    }

    pub fn replay_app_output(&self, app: &str, after: u64) -> Replay<OutputChunk> {
        let state = lock(&self.state);
        match state.channels.iter().find(|c| c.name == app) {
            Some(channel) => channel.output.replay(after),
            None => Replay::empty(),
        }
    }
}

/// Holds one subscriber's place in the count ([`Session::subscriber`]).
pub struct SubscriberGuard(Arc<Session>);

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        let session = &self.0;
        let mut idle_since = lock(&session.idle_since);
        if session.subscribers.fetch_sub(1, Ordering::SeqCst) == 1 {
            *idle_since = tokio::time::Instant::now();
        }
    }
}

/// Why `/io` could not pick an app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppResolution {
    /// `?app=` names no app of the session.
    Unknown,
    /// No `?app=` and the session runs this many apps.
    Ambiguous(usize),
}

/// An app as the session records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionApp {
    pub name: String,
    pub io: IoMode,
    pub ports: Vec<PortMapping>,
    /// The telo release the runner runs the app with, when it chose one.
    pub telo: Option<String>,
}

impl SessionApp {
    /// The one app of a session that names none.
    pub fn default_app(ports: Vec<PortMapping>) -> Self {
        Self {
            name: runner_api::watch::DEFAULT_APP_NAME.to_owned(),
            io: IoMode::Tty,
            ports,
            telo: None,
        }
    }
}

/// What a recorded output chunk said besides its bytes.
pub(crate) struct OutputScan {
    /// Controller resolutions the kernel started or ended in it.
    pub(crate) resolutions: Vec<crate::kernel_progress::Resolution>,
    /// Whether the kernel is still resolving after it.
    pub(crate) resolving: bool,
    /// Whether it holds the application's own output.
    pub(crate) app_output: bool,
}

fn channel_mut<'a>(
    channels: &'a mut [AppChannel],
    app: Option<&str>,
) -> Option<&'a mut AppChannel> {
    match app {
        None => channels.first_mut(),
        Some(name) => channels.iter_mut().find(|c| c.name == name),
    }
}

/// How a cursor reads its buffer.
type ReadFn<T> = Box<dyn Fn(&Session, u64) -> Replay<T> + Send + Sync>;
/// How a cursor finds where its first position lies.
type ResolveFn = Box<dyn Fn(&Session, u64) -> ResumeAt + Send + Sync>;

/// A subscriber's position in one of a session's replay buffers.
pub struct Cursor<T> {
    session: Arc<Session>,
    rx: watch::Receiver<u64>,
    position: u64,
    /// Until the first position is settled.
    resolve: Option<ResolveFn>,
    /// When the cursor stops waiting for its position to settle.
    settle_by: tokio::time::Instant,
    read: ReadFn<T>,
}

/// How long a cursor on a seq of the previous owner's waits for the output
/// it lies in to be rebuilt (a log read: well under a second). Past it, or
/// when that output never reaches the seq (a session that ended first), the
/// subscriber is told of a gap and gets what is held.
pub const SETTLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// What a subscriber reads next.
pub struct Batch<T> {
    /// Entries it wanted were evicted before it read them.
    pub gap: bool,
    pub entries: Vec<(u64, T)>,
}

impl<T> Cursor<T> {
    /// Everything available now past the cursor, without waiting (may be empty).
    pub fn try_next(&mut self) -> Batch<T> {
        // Mark the channel seen before reading, so a push racing with the read
        // still wakes the next `changed()`.
        self.rx.borrow_and_update();
        if let Some(resolve) = &self.resolve {
            match resolve(&self.session, self.position) {
                ResumeAt::After(position) => {
                    self.position = position;
                    self.resolve = None;
                }
                // Given up on: read as an unknown seq (a gap, then all).
                ResumeAt::Pending if tokio::time::Instant::now() >= self.settle_by => {
                    self.resolve = None;
                }
                ResumeAt::Pending => {
                    return Batch {
                        gap: false,
                        entries: Vec::new(),
                    };
                }
            }
        }
        let mut replay = (self.read)(&self.session, self.position);
        // Only what is published: with several replicas output is recorded
        // before its marks are on their way to the peers, and published
        // after.
        let published = *self.rx.borrow();
        replay.entries.retain(|(id, _)| *id <= published);
        if let Some((id, _)) = replay.entries.last() {
            self.position = *id;
        }
        Batch {
            gap: replay.has_gap,
            entries: replay.entries,
        }
    }

    /// Wait for entries past the cursor (or news that some were evicted).
    pub async fn next(&mut self) -> Batch<T> {
        loop {
            let batch = self.try_next();
            if batch.gap || !batch.entries.is_empty() {
                return batch;
            }
            // The sender lives in the session this cursor holds, so the
            // channel cannot close under it; an error would only mean there is
            // nothing more to wait for.
            if self.resolve.is_some() {
                // Still settling: until then, or until output comes.
                match tokio::time::timeout_at(self.settle_by, self.rx.changed()).await {
                    Ok(Err(_)) => return batch,
                    Ok(Ok(())) | Err(_) => continue,
                }
            }
            if self.rx.changed().await.is_err() {
                return batch;
            }
        }
    }

    /// What a new subscriber is greeted with: once the cursor's first
    /// position is settled (at once, unless it is on a seq of the previous
    /// owner's whose output is still being rebuilt, and never past
    /// [`SETTLE_WITHIN`]), everything available then — which may be
    /// nothing. It waits for no new output.
    pub async fn settled(&mut self) -> Batch<T> {
        loop {
            let batch = self.try_next();
            if self.resolve.is_none() {
                return batch;
            }
            // Past the deadline, the next `try_next` gives the seq up.
            let changed = tokio::time::timeout_at(self.settle_by, self.rx.changed()).await;
            if let Ok(Err(_)) = changed {
                return batch;
            }
        }
    }

    pub fn position(&self) -> u64 {
        self.position
    }
}
