//! The watch-session supervisor: one task that, every tick, decides for
//! each live watch session whether it is suspended (idle), checkpointed
//! (due) or ended (past its lifetime), and drops suspended sessions past
//! their retention. The decision itself is [`Round::job`], pure and
//! unit-tested; the rest carries it out.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runner_api::types::{RunEvent, RunPhase, RunStatus};
use runner_api::watch::SessionMode;
use tracing::{Instrument, debug, info, info_span, warn};

use super::SessionRegistry;
use crate::session::Session;
use crate::time::iso_now;

impl SessionRegistry {
    /// Starts the watch supervisor once (the first watch session, or boot).
    pub(super) fn ensure_supervisor(&self) {
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
                        _ = interval.tick() => registry.tend_watch_sessions(),
                        () = shutdown.cancelled() => return,
                    }
                }
            }
            .instrument(info_span!("watch_supervisor")),
        );
    }

    /// One supervisor round: idle sessions are suspended, live ones
    /// checkpointed when due, suspended ones dropped past their TTL.
    fn tend_watch_sessions(&self) {
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
                let round = Round {
                    expired: state
                        .started_at
                        .is_some_and(|at| at.elapsed() >= config.max_ttl),
                    idle: session
                        .idle_since()
                        .is_some_and(|since| since.elapsed() >= config.idle),
                    room_to_suspend: suspended < config.max_suspended,
                    checkpoint_due: state
                        .checkpointed_at
                        .is_none_or(|at| at.elapsed() >= config.checkpoint_every),
                    backing_off: state
                        .checkpoint_retry_at
                        .is_some_and(|at| tokio::time::Instant::now() < at),
                };
                if round.kept_running() && !std::mem::replace(&mut state.kept_running_told, true) {
                    // Told once the watch state's lock is released.
                    kept_running.push(session.clone());
                }
                let Some(job) = round.job() else {
                    continue;
                };
                state.busy = true;
                if job == Job::Suspend {
                    suspended += 1;
                }
                job
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
                Some(current) if Arc::ptr_eq(current, session) => {
                    super::credit_departed(&self.inner, session);
                    sessions.remove(&session.id)
                }
                _ => None,
            }
        };
        if let Some(removed) = removed {
            debug!(session_id = %removed.id, "suspended session reached its retention limit");
            self.release(&removed);
        }
    }
}

/// What one round does to a live watch session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    /// The workload ran for `RUNNER_WATCH_MAX_TTL_SECONDS`.
    Expire,
    /// Nobody subscribed for `RUNNER_WATCH_IDLE_SECONDS`.
    Suspend,
    /// `RUNNER_WORKSPACE_CHECKPOINT_SECONDS` passed since the last one.
    Checkpoint,
}

/// What one round knows of a live watch session (running, its workload
/// up, no job of the supervisor's under way).
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    /// It ran for its lifetime limit.
    expired: bool,
    /// Nobody subscribed for the idle time.
    idle: bool,
    /// Fewer sessions are suspended than `RUNNER_WATCH_MAX_SUSPENDED`.
    room_to_suspend: bool,
    /// Its last checkpoint is a checkpoint period old (or it has none).
    checkpoint_due: bool,
    /// A failed checkpoint or suspend waits its backoff out.
    backing_off: bool,
}

impl Round {
    /// The idle-suspend decision. Expiry comes first and never waits; a
    /// backoff holds both a suspend (which needs a checkpoint) and a
    /// checkpoint; an idle session is suspended only while there is room
    /// to keep one more suspended, and otherwise runs on to its time limit
    /// rather than push another session's work out.
    fn job(self) -> Option<Job> {
        if self.expired {
            Some(Job::Expire)
        } else if self.backing_off {
            None
        } else if self.idle && self.room_to_suspend {
            Some(Job::Suspend)
        } else if self.checkpoint_due {
            Some(Job::Checkpoint)
        } else {
            None
        }
    }

    /// An idle session that runs on for want of room (its clients are
    /// told once).
    fn kept_running(self) -> bool {
        self.idle && !self.room_to_suspend
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_comes_first_and_never_waits_for_a_backoff() {
        let round = Round {
            expired: true,
            idle: true,
            room_to_suspend: true,
            checkpoint_due: true,
            backing_off: true,
        };
        assert_eq!(round.job(), Some(Job::Expire));
    }

    #[test]
    fn an_idle_session_is_suspended_while_there_is_room() {
        let idle = Round {
            idle: true,
            room_to_suspend: true,
            ..Round::default()
        };
        assert_eq!(idle.job(), Some(Job::Suspend));
        assert!(!idle.kept_running());
    }

    #[test]
    fn an_idle_session_without_room_runs_on_and_is_checkpointed_when_due() {
        let full = Round {
            idle: true,
            ..Round::default()
        };
        assert_eq!(full.job(), None);
        assert!(full.kept_running());
        let due = Round {
            checkpoint_due: true,
            ..full
        };
        assert_eq!(due.job(), Some(Job::Checkpoint));
    }

    #[test]
    fn a_backoff_holds_suspends_and_checkpoints() {
        let round = Round {
            idle: true,
            room_to_suspend: true,
            checkpoint_due: true,
            backing_off: true,
            ..Round::default()
        };
        assert_eq!(round.job(), None);
    }

    #[test]
    fn a_busy_free_session_with_nothing_due_is_left_alone() {
        let round = Round {
            room_to_suspend: true,
            ..Round::default()
        };
        assert_eq!(round.job(), None);
        assert!(!round.kept_running());
    }
}
