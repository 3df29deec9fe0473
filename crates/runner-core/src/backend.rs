//! The seam between the backend-neutral core and a backend (local processes,
//! Kubernetes pods). A backend knows nothing about HTTP; the core knows nothing
//! about how a workload runs. [`Backend`] is what every backend does; what
//! only some do is a capability the core asks for: [`TeloVersions`] (a
//! chosen telo release) and [`WatchSessions`].

use std::sync::Arc;

use async_trait::async_trait;
use runner_api::telo::TeloVersion;
use runner_api::types::{AvailabilityReport, SessionConfig};
use runner_api::watch::SessionMode;

pub use crate::backend_session::{
    BackendSession, StartError, StartStage, StopError, WatchWorkload, WorkspaceCause,
    WorkspaceFailure,
};
pub use crate::launch::SessionKind;
pub use crate::launch::{
    AgentLaunch, AgentRef, AppLaunch, BackendCapabilities, BackendFeatures, HeldSessions,
    InvalidSessionConfig, KeptLink, ProbeConfig, Readiness, RecoveredSession, StartSpec,
    SuspendedSession, TeloUnavailable, WatchSpec, WatchStart,
};
use crate::session::SessionSink;
pub use crate::tenancy::SessionResources;

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    fn capabilities(&self) -> BackendCapabilities;

    /// Whether the backend can serve now (its cluster reachable, its
    /// informers synced). A backend with nothing to wait for is always ready.
    fn readiness(&self) -> Readiness {
        Readiness::default()
    }

    /// Readiness for the given config, without starting anything.
    async fn probe(&self, config: &ProbeConfig) -> AvailabilityReport;

    /// Server-side check of a bundle session's config (`400 invalid_config`).
    fn validate_config(&self, _config: &SessionConfig) -> Result<(), InvalidSessionConfig> {
        Ok(())
    }

    /// Start the workload. Resolves once it runs (after the backend reported
    /// `running` through the sink); every failure before that is a
    /// [`StartError`], which the core turns into a terminal `failed` status.
    async fn start(
        &self,
        spec: StartSpec,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError>;

    /// Sessions a previous runner process left running that this backend can
    /// take over (called once at boot, while the API already serves).
    /// Finished or expired workloads are cleaned up here instead of being
    /// returned; sessions `held` by this runner are neither listed nor
    /// touched.
    async fn recover(&self, _held: HeldSessions) -> Vec<RecoveredSession> {
        Vec::new()
    }

    /// Take over a session returned by [`Backend::recover`]: rebuild its
    /// output history, report its status and re-attach, like a start.
    async fn resume(
        &self,
        session: RecoveredSession,
        _sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        Err(StartError::new(
            StartStage::Resume,
            format!(
                "this backend cannot resume session '{}'",
                session.session_id
            ),
        ))
    }

    /// The registry dropped the session (retention expired or evicted): free
    /// whatever the backend still holds for it.
    fn release(&self, _session_id: &str) {}

    /// Whether a shutdown leaves live workloads running for a successor
    /// runner that adopts them ([`BackendSession::detach`]) instead of
    /// stopping them.
    fn leaves_sessions_on_shutdown(&self) -> bool {
        false
    }

    /// The runner is going away and its sessions are stopped or handed
    /// over: stop every background task the backend owns and wait for them
    /// ([`crate::tasks::OwnedTasks`]).
    async fn shutdown(&self) {}

    /// The CPU and memory ceilings a session of `kind` runs under, which
    /// count against its tenant's `cpu` and `memory` quotas (zero where the
    /// backend sets none).
    fn session_resources(&self, _kind: SessionKind) -> SessionResources {
        SessionResources::default()
    }

    /// Keeps `links`, the whole list of `session_id`'s share links as it is
    /// about to be, where the session outlives this process (its pod, its
    /// watch record), so the next runner lists and honours exactly these.
    /// The core makes a link change only once this succeeded; `Err` says
    /// why it could not be kept. The default keeps nothing, for a backend
    /// whose sessions end with the process.
    async fn keep_links(
        &self,
        _session_id: &str,
        _mode: SessionMode,
        _links: &[KeptLink],
    ) -> Result<(), String> {
        Ok(())
    }

    /// The telo releases a request may name (`features.teloVersions`);
    /// `None` when sessions run the kernel the backend provides.
    fn telo_versions(&self) -> Option<&dyn TeloVersions> {
        None
    }

    /// Watch sessions (`features.watch`); `None` when this backend does not
    /// run them.
    fn watch_sessions(&self) -> Option<&dyn WatchSessions> {
        None
    }

    /// The replicas of this installation, when it runs several; `None` for
    /// a runner that is the installation's only one.
    fn replicas(&self) -> Option<std::sync::Arc<dyn crate::replicas::Replicas>> {
        None
    }
}

/// A backend that runs the telo release a request names.
pub trait TeloVersions: Send + Sync {
    /// Whether the backend can run telo `version` for a session of `mode`
    /// (asked before the session exists, once per app). `Err` is the reason
    /// a client is shown with `telo_version_unavailable`. Only cheap local
    /// checks belong here: a pull that fails is a start failure naming the
    /// version.
    fn supply_telo(&self, version: &TeloVersion, mode: SessionMode) -> Result<(), TeloUnavailable>;
}

/// A backend that runs watch sessions: long-lived workloads over a
/// workspace, suspended when idle and resumed from a checkpoint.
#[async_trait]
pub trait WatchSessions: Send + Sync {
    /// Whether its watch sessions can run a co-resident agent.
    fn offers_agents(&self) -> bool {
        false
    }

    /// Start a watch session's workload (seeded) or resume it from its
    /// checkpoint. Resolves once it runs (after `running` went through the
    /// sink).
    async fn start_watch(
        &self,
        spec: WatchSpec,
        start: WatchStart,
        sink: SessionSink,
    ) -> Result<Arc<dyn WatchWorkload>, StartError>;

    /// Whether a suspended session has a checkpoint to resume from.
    async fn has_checkpoint(&self, session_id: &str) -> bool;

    /// Watch sessions kept from before this runner started (once, at boot).
    /// Sessions `held` by this runner are neither listed nor touched.
    async fn recover_suspended(&self, held: HeldSessions) -> Vec<SuspendedSession>;
}

/// Starts a watch session's workload on `backend`, or says it does not run
/// watch sessions.
pub async fn start_watch(
    backend: &dyn Backend,
    spec: WatchSpec,
    start: WatchStart,
    sink: SessionSink,
) -> Result<Arc<dyn WatchWorkload>, StartError> {
    match backend.watch_sessions() {
        Some(watch) => watch.start_watch(spec, start, sink).await,
        None => Err(StartError::new(
            StartStage::Start,
            format!(
                "this runner's backend does not run watch sessions (session '{}')",
                spec.session_id
            ),
        )),
    }
}
