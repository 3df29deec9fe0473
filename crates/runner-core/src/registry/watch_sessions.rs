//! Watch sessions in the registry: admission under the watch ceiling,
//! resume, a new app set, and the suspended sessions a backend kept across
//! a restart. The supervisor that suspends idle ones is `watch_supervisor`.

use std::sync::Arc;

use runner_api::types::{RunBundle, RunEvent, RunPhase, RunStatus, SessionCreated};
use runner_api::watch::{AppSpec, RunTrigger, SessionMode};
use tracing::{info, warn};

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
    /// Running again would put its tenant over a quota.
    #[error("{0}")]
    QuotaExceeded(crate::tenancy::QuotaExceeded),
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
        claimant: &super::Claimant,
        bundle: RunBundle,
        build_spec: impl FnOnce(&str, &str) -> WatchSpec,
    ) -> Result<SessionCreated, AdmissionError> {
        let limits = &self.inner.limits;
        let mut spec_slot = None;
        let ceiling = Some(limits.watch.max_sessions);
        let claim = Some((claimant, super::SessionKind::Watch));
        let session = self.admit_as(None, ceiling, claim, |id, created_at| {
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
            crate::backend::start_watch(backend.as_ref(), spec, WatchStart::Seed(bundle), sink)
                .await
                .map(Launched::watch)
        });
        Ok(created)
    }

    /// `POST /resume`: a suspended session starts again under its id, from
    /// its checkpoint, with every app's next generation attributed `resume`.
    pub async fn resume(&self, id: &str) -> Result<(), ResumeError> {
        self.resume_for(id, None).await
    }

    /// [`SessionRegistry::resume`] under its owner's tier `limits`: a
    /// session that would put its tenant over a live quota stays suspended.
    pub async fn resume_for(
        &self,
        id: &str,
        limits: Option<&crate::tenancy::TierLimits>,
    ) -> Result<(), ResumeError> {
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
        if let (Some(limits), Some(owner)) = (limits, session.owner()) {
            let usage = self.usage(&owner.tenant);
            crate::tenancy::quota::check_resume(limits, &usage, session.tenancy.resources())
                .map_err(ResumeError::QuotaExceeded)?;
        }
        let has_checkpoint = match self.inner.backend.watch_sessions() {
            Some(watch) => watch.has_checkpoint(id).await,
            None => false,
        };
        if !has_checkpoint {
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
            let started =
                crate::backend::start_watch(backend.as_ref(), spec, WatchStart::Resume, sink)
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
        let kept = match self.inner.backend.watch_sessions() {
            Some(watch) => watch.recover_suspended(self.held_sessions()).await,
            None => Vec::new(),
        };
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
            links,
            output_marks,
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
        session.tenancy.set(
            spec.owner.clone(),
            self.inner
                .backend
                .session_resources(super::SessionKind::Watch),
        );
        self.attach_webhooks(&session);
        self.restore_links(&session, links);
        // Kept whatever the limit: refusing it would only lose its files.
        super::lock(&self.inner.sessions).insert(id, session.clone());
        if running {
            // Its workload outlived the last runner: taken over as it runs.
            session.carry_output(self.carried_marks(&session.id, &output_marks));
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
            self.spawn_supervisor(session.clone());
            self.spawn_start(session, move |sink| async move {
                let started =
                    crate::backend::start_watch(backend.as_ref(), spec, WatchStart::Adopt, sink)
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
        self.spawn_supervisor(session);
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
            .filter(|entry| entry.port.is_some() && self.backend_runs_agents());
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
