//! Watch sessions in the registry: admission under the watch ceiling, the
//! supervisor that checkpoints them and suspends idle ones, resume, a new
//! app set, and the suspended sessions a backend kept across a restart.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runner_api::types::{RunBundle, RunEvent, RunPhase, RunStatus, SessionCreated};
use runner_api::watch::{AppSpec, RunTrigger, SessionMode};
use tracing::{Instrument, debug, info, info_span, warn};

use super::{AdmissionError, Launched, SessionRegistry};
use crate::backend::{AgentLaunch, SuspendedSession, WatchSpec, WatchStart};
use crate::session::{Session, SessionApp};
use crate::time::iso_now;

/// Why `POST /resume` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResumeError {
    #[error("session '{0}' is not suspended")]
    NotSuspended(String),
    #[error("session was suspended before a workspace checkpoint was taken")]
    NoCheckpoint,
}

/// Why `PUT /apps` failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SetAppsError {
    #[error("session has no live workload")]
    NotRunning,
    /// The change failed and ended the session.
    #[error("{0}")]
    Failed(String),
}

impl SessionRegistry {
    /// Admits a watch session and starts it in the background: its
    /// workspace seeded with `bundle`, every app's first generation
    /// attributed `initial`.
    pub fn create_watch(
        &self,
        bundle: RunBundle,
        build_spec: impl FnOnce(&str, &str) -> WatchSpec,
    ) -> Result<SessionCreated, AdmissionError> {
        let limits = &self.inner.limits;
        let mut spec_slot = None;
        let ceiling = Some(limits.watch.max_sessions);
        let session = self.admit_as(None, ceiling, |id, created_at| {
            let spec = build_spec(&id, &created_at);
            let apps = session_apps(&spec.apps);
            let session = Session::with_apps(
                id,
                created_at,
                limits.replay_buffer_bytes,
                0,
                Some(tokio::time::Instant::now()),
                self.inner.metrics.clone(),
                SessionMode::Watch,
                &apps,
            )
            .with_watch(spec.clone());
            spec_slot = Some(spec);
            session
        })?;
        let Some(spec) = spec_slot else {
            unreachable!("admission builds the session it admits");
        };
        session.attribute_next_run(None, RunTrigger::Initial);
        self.inner.metrics.session_started(false);
        self.ensure_supervisor();
        let created = SessionCreated {
            session_id: session.id.clone(),
            stream_url: format!("/v1/sessions/{}/events", session.id),
            created_at: session.created_at.clone(),
        };
        let backend = self.inner.backend.clone();
        let mut spec = spec;
        self.resolve_agent(&session, &mut spec);
        self.spawn_launch(session, move |sink| async move {
            backend
                .start_watch(spec, WatchStart::Seed(bundle), sink)
                .await
                .map(Launched::watch)
        });
        Ok(created)
    }

    /// `POST /resume`: a suspended session starts again under its id, from
    /// its checkpoint, with every app's next generation attributed `resume`.
    pub async fn resume(&self, id: &str) -> Result<(), ResumeError> {
        let not_suspended = || ResumeError::NotSuspended(id.to_owned());
        let lifecycle = self
            .get(id)
            .and_then(|s| s.watch_lifecycle())
            .ok_or_else(not_suspended)?;
        let _turn = lifecycle.lock().await;
        let session = self
            .get(id)
            .filter(|s| matches!(s.status(), RunStatus::Suspended))
            .ok_or_else(not_suspended)?;
        if !self.inner.backend.has_checkpoint(id).await {
            return Err(ResumeError::NoCheckpoint);
        }
        let spec = {
            let Some(mut state) = session.watch_state() else {
                return Err(not_suspended());
            };
            // Two resumes at once: the second finds it no longer suspended.
            if state.busy || state.suspended_at.is_none() {
                return Err(not_suspended());
            }
            state.busy = true;
            state.suspended_at = None;
            state.spec.clone()
        };
        session.attribute_next_run(None, RunTrigger::Resume);
        session.emit(RunEvent::Status {
            status: RunStatus::Starting,
        });
        info!(session_id = %id, "resuming a suspended watch session");
        let mut spec = spec;
        self.resolve_agent(&session, &mut spec);
        let backend = self.inner.backend.clone();
        let resumed = session.clone();
        self.spawn_start(session, move |sink| async move {
            let started = backend
                .start_watch(spec, WatchStart::Resume, sink)
                .await
                .map(Launched::watch);
            if let Some(mut state) = resumed.watch_state() {
                state.busy = false;
            }
            started
        });
        Ok(())
    }

    /// `PUT /apps`: the session runs `apps` from now on, over the same
    /// workspace. A failure ends the session `failed`.
    pub async fn set_apps(
        &self,
        session: &Arc<Session>,
        apps: Vec<AppSpec>,
    ) -> Result<Vec<String>, SetAppsError> {
        let lifecycle = session.watch_lifecycle().ok_or(SetAppsError::NotRunning)?;
        // One change at a time; a later one finds the earlier one's apps.
        let _turn = lifecycle.lock().await;
        let workload = session.watch_workload().ok_or(SetAppsError::NotRunning)?;
        let added = session.add_channels(&apps);
        session.attribute_next_run(None, RunTrigger::Resume);
        if let Some(mut state) = session.watch_state() {
            state.busy = true;
        }
        let changed = workload.set_apps(apps.clone()).await;
        if let Some(mut state) = session.watch_state() {
            state.busy = false;
            if changed.is_ok() {
                state.spec.apps = apps.clone();
            }
        }
        match changed {
            Ok(()) => {
                session.retain_channels(&apps);
                Ok(apps.into_iter().map(|app| app.name).collect())
            }
            Err(err) => {
                session.remove_channels(&added);
                let message = err.message.clone();
                warn!(session_id = %session.id, error = ?err, "changing the app set failed");
                if let Err(stop) = workload.stop().await {
                    warn!(session_id = %session.id, error = %stop, "stopping after a failed app change failed");
                }
                session.emit(RunEvent::Status {
                    status: RunStatus::failed(format!("changing the app set failed: {message}")),
                });
                Err(SetAppsError::Failed(message))
            }
        }
    }

    /// Lists the watch sessions a backend kept from before this runner (a
    /// restart, a crash) as `suspended`: resumable with their files.
    pub(super) async fn recover_suspended(&self) -> usize {
        let kept = self
            .inner
            .backend
            .recover_suspended(self.held_sessions())
            .await;
        let count = kept.len();
        for record in kept {
            self.restore_suspended(record);
        }
        if count > 0 {
            info!(
                sessions = count,
                "kept watch sessions are suspended until resumed"
            );
        }
        self.ensure_supervisor();
        count
    }

    fn restore_suspended(&self, record: SuspendedSession) {
        let SuspendedSession {
            spec,
            generation,
            running,
        } = record;
        let id = spec.session_id.clone();
        if self.get(&id).is_some() {
            // A backend that listed one of this runner's own sessions: it
            // runs here already, and replacing it would lose it.
            warn!(session_id = %id, "recovery listed a session this runner holds; left as it is");
            return;
        }
        let session = Arc::new(
            Session::with_apps(
                id.clone(),
                spec.created_at.clone(),
                self.inner.limits.replay_buffer_bytes,
                generation,
                None,
                self.inner.metrics.clone(),
                SessionMode::Watch,
                &session_apps(&spec.apps),
            )
            .with_watch(spec.clone()),
        );
        // Kept whatever the limit: refusing it would only lose its files.
        super::lock(&self.inner.sessions).insert(id, session.clone());
        if running {
            // Its workload outlived the last runner: taken over as it runs.
            if let Some(mut state) = session.watch_state() {
                state.busy = true;
            }
            session.emit(RunEvent::Status {
                status: RunStatus::Starting,
            });
            info!(session_id = %session.id, "adopting a watch session whose workload still runs");
            let mut spec = spec.clone();
            self.resolve_agent(&session, &mut spec);
            let backend = self.inner.backend.clone();
            let adopted = session.clone();
            self.spawn_watch(session.clone());
            self.spawn_start(session, move |sink| async move {
                let started = backend
                    .start_watch(spec, WatchStart::Adopt, sink)
                    .await
                    .map(Launched::watch);
                if let Some(mut state) = adopted.watch_state() {
                    state.busy = false;
                }
                started
            });
            return;
        }
        if let Some(mut state) = session.watch_state() {
            state.suspended_at = Some((tokio::time::Instant::now(), iso_now()));
        }
        session.emit(RunEvent::Status {
            status: RunStatus::Suspended,
        });
        session.release_spare_capacity();
        self.spawn_watch(session);
    }

    /// Starts the watch supervisor once (the first watch session, or boot).
    fn ensure_supervisor(&self) {
        if self.inner.supervising.swap(true, Ordering::SeqCst) {
            return;
        }
        let registry = self.clone();
        let shutdown = self.inner.shutdown.clone();
        let tick = self.inner.limits.watch.tick;
        self.inner.tasks.spawn(
            async move {
                let mut interval = tokio::time::interval(tick);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = interval.tick() => registry.supervise(),
                        () = shutdown.cancelled() => return,
                    }
                }
            }
            .instrument(info_span!("watch_supervisor")),
        );
    }

    /// One supervisor round: idle sessions are suspended, live ones
    /// checkpointed when due, suspended ones dropped past their TTL.
    fn supervise(&self) {
        let config = &self.inner.limits.watch;
        let mut suspended = self.sessions().iter().filter(|s| s.is_suspended()).count();
        let mut kept_running = Vec::new();
        for session in self.sessions() {
            if session.mode() != SessionMode::Watch {
                continue;
            }
            let status = session.status();
            let job = {
                let Some(mut state) = session.watch_state() else {
                    continue;
                };
                if let Some((since, _)) = &state.suspended_at {
                    if since.elapsed() >= config.suspended_ttl {
                        drop(state);
                        self.expire_suspended(&session);
                    }
                    continue;
                }
                if state.busy
                    || !matches!(status, RunStatus::Running { .. })
                    || state.workload.is_none()
                {
                    continue;
                }
                let expired = state
                    .started_at
                    .is_some_and(|at| at.elapsed() >= config.max_ttl);
                let mut idle = session
                    .idle_since()
                    .is_some_and(|since| since.elapsed() >= config.idle);
                if idle && suspended >= config.max_suspended {
                    // No place to keep it suspended: it runs on (to its time
                    // limit) rather than push another session's work out.
                    idle = false;
                    if !std::mem::replace(&mut state.kept_running_told, true) {
                        // Told once the watch state's lock is released.
                        kept_running.push(session.clone());
                    }
                }
                let due = state
                    .checkpointed_at
                    .is_none_or(|at| at.elapsed() >= config.checkpoint_every);
                // A checkpoint (or a suspend, which needs one) that failed
                // waits its backoff out; expiry never waits.
                let backing_off = state
                    .checkpoint_retry_at
                    .is_some_and(|at| tokio::time::Instant::now() < at);
                if !expired && (backing_off || (!idle && !due)) {
                    continue;
                }
                state.busy = true;
                if expired {
                    Job::Expire
                } else if idle {
                    suspended += 1;
                    Job::Suspend
                } else {
                    Job::Checkpoint
                }
            };
            let registry = self.clone();
            let span = info_span!("session", session_id = %session.id);
            let slots = self.inner.checkpoint_slots.clone();
            let every = config.checkpoint_every;
            let metrics = self.inner.metrics.clone();
            let lifecycle = session.watch_lifecycle();
            self.inner.tasks.spawn(
                async move {
                    let _turn = match &lifecycle {
                        Some(lifecycle) => Some(lifecycle.lock().await),
                        None => None,
                    };
                    match job {
                        Job::Expire => expire(&session).await,
                        Job::Suspend | Job::Checkpoint => {
                            // Closed only if the registry is gone.
                            let Ok(_slot) = slots.acquire_owned().await else {
                                return;
                            };
                            let outcome = match job {
                                Job::Suspend => registry.suspend(&session).await,
                                _ => checkpoint(&session).await,
                            };
                            // A session whose workload was already gone
                            // had nothing to store: not counted.
                            match &outcome {
                                Ok(Stored::Yes) => metrics.workspace_checkpoint(true),
                                Ok(Stored::NothingToStore) => {}
                                Err(_) => metrics.workspace_checkpoint(false),
                            }
                            note_checkpoint(&session, outcome.map(|_| ()), every);
                        }
                    }
                    if let Some(mut state) = session.watch_state() {
                        state.busy = false;
                    }
                }
                .instrument(span),
            );
        }
        for session in kept_running {
            session.emit(RunEvent::Progress {
                app: None,
                phase: RunPhase::Provision,
                message: format!(
                    "this idle session keeps running: the runner already keeps {} suspended sessions (RUNNER_WATCH_MAX_SUSPENDED)",
                    config.max_suspended
                ),
                done: None,
            });
        }
    }

    /// Suspends an idle session: the backend checkpoints and ends its
    /// workload; the session stays, `suspended`. A failed suspend is tried
    /// again after the checkpoint backoff.
    async fn suspend(&self, session: &Arc<Session>) -> Result<Stored, String> {
        let Some(workload) = session.watch_workload() else {
            return Ok(Stored::NothingToStore);
        };
        match workload.suspend().await {
            Ok(()) => {
                session.clear_handle();
                if let Some(mut state) = session.watch_state() {
                    state.workload = None;
                    state.checkpointed_at = Some(tokio::time::Instant::now());
                    state.suspended_at = Some((tokio::time::Instant::now(), iso_now()));
                }
                info!("idle watch session suspended");
                session.emit(RunEvent::Status {
                    status: RunStatus::Suspended,
                });
                session.release_spare_capacity();
                Ok(Stored::Yes)
            }
            Err(err) => {
                warn!(error = %err, "watch session checkpoint/suspend failed");
                Err(err.message)
            }
        }
    }

    /// Shutdown of a runner that keeps watch sessions: each live one is
    /// suspended (checkpointed, its workload ended) instead of stopped, so
    /// the next runner lists it `suspended` and it resumes with its files.
    pub(super) async fn suspend_for_shutdown(&self, session: &Arc<Session>) -> bool {
        let Some(workload) = session.watch_workload() else {
            return false;
        };
        match workload.suspend().await {
            Ok(()) => {
                session.clear_handle();
                true
            }
            Err(err) => {
                warn!(session_id = %session.id, error = %err, "could not suspend a watch session at shutdown; stopping it");
                false
            }
        }
    }

    fn expire_suspended(&self, session: &Arc<Session>) {
        let removed = {
            let mut sessions = super::lock(&self.inner.sessions);
            match sessions.get(&session.id) {
                Some(current) if Arc::ptr_eq(current, session) => sessions.remove(&session.id),
                _ => None,
            }
        };
        if let Some(removed) = removed {
            debug!(session_id = %removed.id, "suspended session reached its retention limit");
            self.release(&removed);
        }
    }
}

enum Job {
    /// The workload ran for `RUNNER_WATCH_MAX_TTL_SECONDS`.
    Expire,
    Suspend,
    Checkpoint,
}

/// Ends a watch session whose workload reached its lifetime limit: the
/// failure first, so the stop that follows is not reported as a client's.
async fn expire(session: &Arc<Session>) {
    let Some(workload) = session.watch_workload() else {
        return;
    };
    info!("watch session reached its time limit");
    session.emit(RunEvent::Status {
        status: RunStatus::failed("watch session reached its time limit"),
    });
    if let Err(err) = workload.stop().await {
        warn!(error = %err, "stopping an expired watch session failed");
    }
}

/// Whether a checkpoint or a suspend stored the workspace.
enum Stored {
    Yes,
    /// The session's workload was already gone.
    NothingToStore,
}

async fn checkpoint(session: &Arc<Session>) -> Result<Stored, String> {
    let Some(workload) = session.watch_workload() else {
        return Ok(Stored::NothingToStore);
    };
    match workload.checkpoint().await {
        Ok(()) => {
            if let Some(mut state) = session.watch_state() {
                state.checkpointed_at = Some(tokio::time::Instant::now());
            }
            Ok(Stored::Yes)
        }
        Err(err) => {
            warn!(error = %err, "watch session checkpoint/suspend failed");
            Err(err.message)
        }
    }
}

/// The longest wait before a failed checkpoint is tried again, in
/// checkpoint periods.
const MAX_CHECKPOINT_BACKOFF_PERIODS: u32 = 8;

/// Records how a checkpoint (or a suspend) went: a failure backs the next
/// attempt off (one checkpoint period, doubling), and the session's clients
/// are told once what cannot be kept — a workspace the runner cannot
/// checkpoint is lost by a suspend or the loss of its pod, and its user
/// must know before that, not only the runner's log. A later success says
/// so too.
fn note_checkpoint(session: &Arc<Session>, outcome: Result<(), String>, every: Duration) {
    let tell = {
        let Some(mut state) = session.watch_state() else {
            return;
        };
        match outcome {
            Ok(()) => {
                state.checkpoint_failures = 0;
                state.checkpoint_retry_at = None;
                state
                    .checkpoint_failure_told
                    .take()
                    .map(|_| "the workspace is checkpointed again".to_owned())
            }
            Err(reason) => {
                state.checkpoint_failures = state.checkpoint_failures.saturating_add(1);
                let periods = 2u32
                    .saturating_pow(state.checkpoint_failures - 1)
                    .min(MAX_CHECKPOINT_BACKOFF_PERIODS);
                state.checkpoint_retry_at = Some(tokio::time::Instant::now() + every * periods);
                let message = format!(
                    "the workspace could not be checkpointed: {reason}; until it can be, \
                     the session is not suspended when idle, and its newest files live only \
                     in its running workload"
                );
                (state.checkpoint_failure_told.as_deref() != Some(message.as_str())).then(|| {
                    state.checkpoint_failure_told = Some(message.clone());
                    message
                })
            }
        }
    };
    if let Some(message) = tell {
        session.emit(RunEvent::Progress {
            app: None,
            phase: RunPhase::Provision,
            message,
            done: None,
        });
    }
}

impl SessionRegistry {
    /// Looks the session's agent up in the catalog as it is now: what the
    /// backend runs. An agent the operator withdrew since is not started,
    /// and the session says so.
    fn resolve_agent(&self, session: &Session, spec: &mut WatchSpec) {
        let Some(agent) = &spec.agent else {
            return;
        };
        let entry = self
            .inner
            .agents
            .get()
            .and_then(|catalog| catalog.get(&agent.name))
            .filter(|entry| entry.port.is_some() && self.inner.backend.offers_agents());
        spec.agent_launch = match entry {
            Some(entry) => Some(AgentLaunch {
                name: agent.name.clone(),
                image: entry.image.clone(),
                pull_policy: entry.pull_policy,
                command: entry.command.clone(),
                port: entry.port.unwrap_or(agent.port),
                env: match &agent.token {
                    Some(token) => entry.with_token(entry.env.clone(), token),
                    None => entry.env.clone(),
                },
            }),
            None => {
                session.emit(RunEvent::Progress {
                    app: None,
                    phase: RunPhase::Provision,
                    message: format!(
                        "co-resident agent '{}' was not started: this runner no longer offers it",
                        agent.name
                    ),
                    done: None,
                });
                None
            }
        };
    }
}

fn session_apps(apps: &[AppSpec]) -> Vec<SessionApp> {
    apps.iter()
        .map(|app| SessionApp {
            name: app.name.clone(),
            io: app.io,
            ports: app.ports.clone(),
            telo: app.telo.clone(),
        })
        .collect()
}
