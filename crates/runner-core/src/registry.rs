//! The session registry: admission, per-session replay buffers, the background
//! start, stop, retention and eviction.
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::backend::{Backend, BackendSession, RecoveredSession, StartError, StartSpec, StopError};
use crate::ids::new_session_id;
use crate::metrics::Metrics;
use crate::replay::{Replay, ReplayBuffer};
use crate::start_gate::{Admission, GateSignal, StartGate};
use crate::sync::lock;
use crate::time::iso_now;
mod sink;

use runner_api::types::{RunEvent, RunStatus, SessionCreated, SessionSnapshot};
pub use sink::SessionSink;

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

#[derive(Debug, Clone)]
pub struct RegistryLimits {
    /// Live plus retained sessions.
    pub max_sessions: usize,
    /// How long a finished session stays readable.
    pub exit_ttl: Duration,
    /// Cap of each of the two per-session replay buffers.
    pub replay_buffer_bytes: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmissionError {
    #[error("runner is at its configured max of {max} concurrent sessions")]
    TooManySessions { max: usize },
}

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

#[derive(Clone)]
pub struct SessionRegistry {
    inner: Arc<RegistryInner>,
}

struct RegistryInner {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    limits: RegistryLimits,
    backend: Arc<dyn Backend>,
    tasks: TaskTracker,
    /// Cancels retention timers and in-flight starts at the end of shutdown.
    shutdown: CancellationToken,
    /// Set once boot-time adoption finished (readiness).
    recovered: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

pub struct Session {
    id: String,
    created_at: String,
    user_stopped: AtomicBool,
    /// Fires on DELETE or shutdown, so a start still waiting on its workload
    /// can give up at once.
    stop_requested: CancellationToken,
    state: Mutex<SessionState>,
    events_seq: watch::Sender<u64>,
    output_seq: watch::Sender<u64>,
    /// Fires when the session reaches a terminal status or leaves the registry,
    /// stopping whatever background work a backend tied to it.
    ended: CancellationToken,
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
    kernel_exit: Mutex<Option<i64>>,
}

/// The debug-stream event a kernel sends when its run is over.
pub const KERNEL_STOPPED: &str = "Kernel.Stopped";

struct SessionState {
    status: RunStatus,
    /// Left running for a successor runner at shutdown: nothing more is
    /// recorded, so this process's streams end without a terminal status and
    /// their clients resume on the successor.
    handed_over: bool,
    exited_at: Option<String>,
    events: ReplayBuffer<EventFrame>,
    output: ReplayBuffer<Bytes>,
    handle: Option<Arc<dyn BackendSession>>,
    /// Input that arrived while the workload was coming up, delivered once it
    /// is up (the reference dropped it, losing the first keystrokes and the
    /// editor's initial terminal size).
    early_stdin: Vec<Bytes>,
    early_stdin_bytes: usize,
    early_resize: Option<(u16, u16)>,
}

/// Input held for a session that is still starting, at most.
pub const EARLY_STDIN_BYTES: usize = 64 * 1024;

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
                sessions: Mutex::new(HashMap::new()),
                limits,
                backend,
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                recovered: watch::Sender::new(false),
                metrics,
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
        let session = self.admit(None)?;
        let spec = build_spec(&session.id, &session.created_at);
        session.close_gate(spec.inspect);
        self.inner.metrics.session_started(spec.self_contained());
        let created = SessionCreated {
            session_id: session.id.clone(),
            stream_url: format!("/v1/sessions/{}/events", session.id),
            created_at: session.created_at.clone(),
        };
        let backend = self.inner.backend.clone();
        self.spawn_launch(session, move |sink| async move {
            backend.start(spec, sink).await
        });
        Ok(created)
    }

    /// Take over the sessions a previous runner process left running (once,
    /// at boot). Returns how many were adopted.
    pub async fn recover(&self) -> usize {
        let recovered = self.inner.backend.recover().await;
        let count = recovered.len();
        for session in recovered {
            let Ok(admitted) = self.admit(Some(&session)) else {
                continue;
            };
            info!(session_id = %session.session_id, generation = session.generation, "adopting a session from a previous runner");
            let backend = self.inner.backend.clone();
            self.spawn_launch(admitted, move |sink| async move {
                backend.resume(session, sink).await
            });
        }
        self.inner.recovered.send_replace(true);
        count
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
                sessions.insert(recovered.session_id.clone(), session.clone());
                drop(sessions);
                session.emit(RunEvent::Status {
                    status: RunStatus::Starting,
                });
                return Ok(session);
            }
            if sessions.len() >= self.inner.limits.max_sessions {
                // History yields to live work: the finished session that ended
                // longest ago makes room; live sessions are never evicted.
                let oldest_finished = sessions
                    .values()
                    .filter_map(|s| s.exited_at().map(|at| (at, s.id.clone())))
                    .min();
                match oldest_finished {
                    Some((_, id)) => evicted = sessions.remove(&id),
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
            let session = Arc::new(Session::new(
                id.clone(),
                iso_now(),
                self.inner.limits.replay_buffer_bytes,
                0,
                Some(tokio::time::Instant::now()),
                self.inner.metrics.clone(),
            ));
            sessions.insert(id, session.clone());
            session
        };
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
        Fut: std::future::Future<Output = Result<Arc<dyn BackendSession>, StartError>> + Send,
    {
        let sink = SessionSink {
            session: session.clone(),
            registry: Arc::downgrade(&self.inner),
        };
        let shutdown = self.inner.shutdown.clone();
        let metrics = self.inner.metrics.clone();
        let span = info_span!("session", session_id = %session.id);
        self.inner.tasks.spawn(
            async move {
                let started = tokio::select! {
                    started = launch(sink.clone()) => started,
                    () = shutdown.cancelled() => {
                        sink.status(RunStatus::Stopped);
                        return;
                    }
                };
                match started {
                    Ok(handle) => {
                        session.install_handle(handle.clone());
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
                    }
                    Err(err) => {
                        error!(stage = %err.stage, error = ?err, "session start failed");
                        metrics.start_failed(err.stage);
                        sink.status(RunStatus::failed(err.to_string()));
                    }
                }
            }
            .instrument(span),
        );
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
        if self.inner.backend.leaves_sessions_on_shutdown() {
            self.hand_over(grace).await;
            self.inner.backend.shutdown().await;
            return;
        }
        let sessions = self.sessions();
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
            if !session.is_terminal() {
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
        let sessions = self.sessions();
        let mut left = 0;
        for session in &sessions {
            let handle = {
                let mut state = lock(&session.state);
                if state.status.is_terminal() {
                    continue;
                }
                state.handed_over = true;
                state.handle.clone()
            };
            left += 1;
            if let Some(handle) = handle {
                handle.detach();
            }
            session.ended.cancel();
        }
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

impl RegistryInner {
    fn schedule_removal(self: &Arc<Self>, session: &Arc<Session>) {
        let ttl = self.limits.exit_ttl;
        let registry = Arc::downgrade(self);
        let target = Arc::downgrade(session);
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(ttl) => {}
                () = shutdown.cancelled() => return,
            }
            let (Some(registry), Some(target)) = (registry.upgrade(), target.upgrade()) else {
                return;
            };
            let removed = {
                let mut sessions = lock(&registry.sessions);
                match sessions.get(&target.id) {
                    Some(current) if Arc::ptr_eq(current, &target) => sessions.remove(&target.id),
                    _ => None,
                }
            };
            if let Some(removed) = removed {
                debug!(session_id = %removed.id, "finished session reached its retention limit");
                removed.ended.cancel();
                registry.backend.release(&removed.id);
            }
        });
    }
}

impl Session {
    fn new(
        id: String,
        created_at: String,
        replay_buffer_bytes: usize,
        generation: u32,
        admitted_at: Option<tokio::time::Instant>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let first_event = u64::from(generation) * EVENT_ID_GENERATION + 1;
        let first_output = u64::from(generation) * OUTPUT_SEQ_GENERATION + 1;
        Self {
            id,
            created_at,
            user_stopped: AtomicBool::new(false),
            stop_requested: CancellationToken::new(),
            state: Mutex::new(SessionState {
                status: RunStatus::Starting,
                exited_at: None,
                events: ReplayBuffer::starting_at(replay_buffer_bytes, first_event),
                output: ReplayBuffer::starting_at(replay_buffer_bytes, first_output),
                handle: None,
                early_stdin: Vec::new(),
                early_stdin_bytes: 0,
                early_resize: None,
                handed_over: false,
            }),
            events_seq: watch::Sender::new(first_event - 1),
            output_seq: watch::Sender::new(first_output - 1),
            ended: CancellationToken::new(),
            admitted_at,
            metrics,
            gate: Mutex::new(None),
            gated: AtomicBool::new(false),
            kernel_exit: Mutex::new(None),
        }
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

    pub fn is_user_stopped(&self) -> bool {
        self.user_stopped.load(Ordering::SeqCst)
    }

    fn request_stop(&self) {
        self.user_stopped.store(true, Ordering::SeqCst);
        self.stop_requested.cancel();
    }

    pub fn snapshot(&self) -> SessionSnapshot {
        let state = lock(&self.state);
        SessionSnapshot {
            session_id: self.id.clone(),
            status: state.status.clone(),
            created_at: self.created_at.clone(),
            exited_at: state.exited_at.clone(),
        }
    }

    /// The live backend session, once its start resolved.
    pub fn handle(&self) -> Option<Arc<dyn BackendSession>> {
        lock(&self.state).handle.clone()
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
    fn install_handle(&self, handle: Arc<dyn BackendSession>) {
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

    fn close_gate(&self, inspect: bool) {
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

    fn signal_gate(&self, signal: GateSignal) {
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
        *lock(&self.kernel_exit)
    }

    /// Record an event; returns its id, or `None` when the session already
    /// reached a terminal status (nothing follows the terminal status).
    fn emit(&self, event: RunEvent) -> Option<u64> {
        let terminal = matches!(&event, RunEvent::Status { status } if status.is_terminal());
        let data = match serde_json::to_vec(&event) {
            Ok(data) => Bytes::from(data),
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
                state.status = status;
                if terminal {
                    state.exited_at = Some(iso_now());
                }
            }
            let size = frame.data.len();
            state.events.push(frame, size)
        };
        self.events_seq.send_replace(id);
        if came_up && let Some(admitted_at) = self.admitted_at {
            self.metrics.session_running_after(admitted_at.elapsed());
        }
        Some(id)
    }

    fn push_output(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        let bytes = chunk.len();
        let last = {
            let mut state = lock(&self.state);
            // Nothing follows the terminal status: output from a process that
            // escaped its session (a daemon that left the process group) must
            // not change a finished session's history.
            if state.status.is_terminal() || state.handed_over {
                return;
            }
            let mut last = 0;
            if chunk.len() <= MAX_OUTPUT_CHUNK_BYTES {
                let size = chunk.len();
                last = state.output.push(chunk, size);
            } else {
                for piece in chunk.chunks(MAX_OUTPUT_CHUNK_BYTES) {
                    // Copied, so evicting one piece frees its memory.
                    last = state
                        .output
                        .push(Bytes::copy_from_slice(piece), piece.len());
                }
            }
            last
        };
        self.output_seq.send_replace(last);
        self.metrics.output_buffered(bytes);
    }

    /// Lifecycle events after `after`, then live ones.
    pub fn subscribe_events(self: &Arc<Self>, after: u64) -> Cursor<EventFrame> {
        Cursor {
            session: self.clone(),
            rx: self.events_seq.subscribe(),
            position: after,
            read: Session::replay_events,
        }
    }

    /// Output chunks after sequence number `after`, then live ones.
    pub fn subscribe_output(self: &Arc<Self>, after: u64) -> Cursor<Bytes> {
        Cursor {
            session: self.clone(),
            rx: self.output_seq.subscribe(),
            position: after,
            read: Session::replay_output,
        }
    }

    /// A receiver that changes whenever a lifecycle event is recorded.
    pub fn watch_events(&self) -> watch::Receiver<u64> {
        self.events_seq.subscribe()
    }

    pub fn replay_events(&self, after: u64) -> Replay<EventFrame> {
        lock(&self.state).events.replay(after)
    }

    pub fn replay_output(&self, after: u64) -> Replay<Bytes> {
        lock(&self.state).output.replay(after)
    }
}

/// A subscriber's position in one of a session's replay buffers.
pub struct Cursor<T> {
    session: Arc<Session>,
    rx: watch::Receiver<u64>,
    position: u64,
    read: fn(&Session, u64) -> Replay<T>,
}

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
        let replay = (self.read)(&self.session, self.position);
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
            if self.rx.changed().await.is_err() {
                return batch;
            }
        }
    }

    pub fn position(&self) -> u64 {
        self.position
    }
}
