//! The seam between the backend-neutral core and a backend (local processes,
//! Kubernetes pods). A backend knows nothing about HTTP; the core knows nothing
//! about how a workload runs.

use std::sync::Arc;

use async_trait::async_trait;
use runner_api::telo::TeloVersion;
use runner_api::types::{AvailabilityReport, PortMapping, PullPolicy, RunBundle, SessionConfig};
use runner_api::watch::SessionMode;
use serde_json::Value;

use crate::session::SessionSink;
pub use crate::workload::{
    BackendSession, StartError, StartStage, StopError, WatchWorkload, WorkspaceFailure,
};
use runner_api::watch::AppSpec;

/// Why a backend refuses a bundle session's config; its text is the
/// `invalid_config` message the client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSessionConfig {
    /// The image is not one the runner offers (its base-image allowlist).
    #[error(
        "base image '{image}' is not offered by this runner. Allowed images: {}",
        offered.join(", ")
    )]
    ImageNotOffered { image: String, offered: Vec<String> },
}

/// What `/v1/capabilities` says about the backend; the core adds terms and apps.
#[derive(Debug, Clone)]
pub struct BackendCapabilities {
    pub display_name: String,
    pub description: String,
    /// The JSON Schema of the editable `SessionConfig` surface.
    pub config_schema: Value,
    /// The `features` object (`io`, `ports`, ...).
    pub features: Value,
    /// What a request's `config` leaves unset runs with.
    pub default_config: SessionConfig,
}

/// `POST /v1/probe` body's `config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    pub image: String,
    pub pull_policy: PullPolicy,
}

/// An operator-predefined application (`RUNNER_APPS`) a session runs instead of
/// a client bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppLaunch {
    pub name: String,
    pub image: String,
    pub pull_policy: PullPolicy,
    /// Local backend only: the command the app runs as.
    pub command: Option<Vec<String>>,
    /// The session's workload token (`tokenEnv`), already in the env;
    /// the core reports it on the session's endpoints.
    pub token: Option<String>,
}

/// Everything a backend needs to start one session.
#[derive(Debug, Clone)]
pub struct StartSpec {
    pub session_id: String,
    /// ISO-8601 creation time, as reported to clients.
    pub created_at: String,
    /// The client's bundle; an empty placeholder for app sessions.
    pub bundle: RunBundle,
    /// Traversal-checked, normalized entry path (no leading `/`).
    pub entry_relative_path: String,
    /// The final workload environment, in insertion order (operator env merged,
    /// `TELO_REGISTRY_URL` rule applied).
    pub env: Vec<(String, String)>,
    pub ports: Vec<PortMapping>,
    pub config: SessionConfig,
    /// Set for app sessions (`selfContained`): run the app, stage no bundle.
    pub app: Option<AppLaunch>,
    /// Launch the kernel with `--inspect` and relay its debug stream.
    pub inspect: bool,
    /// The telo release the request named (checked with
    /// [`Backend::supply_telo`]); `None` runs the backend's default kernel
    /// (or `config.image`).
    pub telo: Option<String>,
}

impl StartSpec {
    pub fn self_contained(&self) -> bool {
        self.app.is_some()
    }

    pub fn tcp_ports(&self) -> Vec<u16> {
        self.ports
            .iter()
            .filter(|p| p.protocol == runner_api::types::PortProtocol::Tcp)
            .map(|p| p.port)
            .collect()
    }
}

/// Everything a backend needs to start or resume a watch session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WatchSpec {
    pub session_id: String,
    pub created_at: String,
    /// Resolved: DNS-label names, normalized entries, no port clash.
    pub apps: Vec<AppSpec>,
    /// The apps' environment (never the workspace's, never the agent's).
    pub env: Vec<(String, String)>,
    pub config: SessionConfig,
    /// The co-resident agent the session was created with (0.10): its
    /// catalog name, port and token. Kept with the session, so a resumed
    /// session runs it again with the same token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRef>,
    /// The agent as this runner's catalog defines it now, filled in by the
    /// core before every start. Never stored: the operator's env is secret,
    /// and a session's stored record is not.
    #[serde(skip)]
    pub agent_launch: Option<AgentLaunch>,
}

/// A watch session's agent as the session records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentRef {
    pub name: String,
    pub port: u16,
    /// Its workload token, when its entry has `tokenEnv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// What a backend runs as a watch session's co-resident agent: the
/// operator's catalog app, beside the apps, over the same workspace.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentLaunch {
    pub name: String,
    pub image: String,
    pub pull_policy: PullPolicy,
    /// Local backend: the program and arguments it runs.
    pub command: Option<Vec<String>>,
    /// The TCP port it listens on.
    pub port: u16,
    /// The operator's env, with the token under `tokenEnv`: the agent's
    /// only environment besides what the backend adds (`WORKSPACE_DIR`).
    pub env: Vec<(String, String)>,
}

/// Operator env is secret: only its keys are shown.
impl std::fmt::Debug for AgentLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env_keys: Vec<&str> = self.env.iter().map(|(key, _)| key.as_str()).collect();
        f.debug_struct("AgentLaunch")
            .field("name", &self.name)
            .field("image", &self.image)
            .field("command", &self.command)
            .field("port", &self.port)
            .field("env_keys", &env_keys)
            .finish()
    }
}

/// How a watch workload begins.
#[derive(Debug, Clone)]
pub enum WatchStart {
    /// A new session: its workspace is seeded with the bundle (and the
    /// workspace marker unless the bundle has one).
    Seed(RunBundle),
    /// A suspended session resumes: the backend restores its checkpoint.
    Resume,
    /// A session whose workload outlived the previous runner
    /// ([`SuspendedSession::running`]): the backend takes it over as it
    /// runs, or, when it cannot, resumes it from its checkpoint.
    Adopt,
}

/// A watch session a backend kept while it was suspended (or whose
/// workload a runner crash ended): found at boot, listed as `suspended`,
/// resumable with its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuspendedSession {
    pub spec: WatchSpec,
    /// How many runner processes held it before (event ids and sequence
    /// numbers start past theirs).
    pub generation: u32,
    /// Its workload still runs (a Kubernetes watch pod outlives the
    /// runner): the registry adopts it at once instead of listing it
    /// `suspended`.
    pub running: bool,
}

/// A session that outlived the runner process that started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredSession {
    pub session_id: String,
    pub created_at: String,
    /// How many times the session was taken over before (its generation):
    /// event ids and output sequence numbers of this generation start past
    /// every earlier one, so a client resuming from before the restart is told
    /// it missed something instead of silently skipping output.
    pub generation: u32,
}

/// What keeps a backend from taking traffic (`/readyz`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readiness {
    /// One client-safe sentence per unmet condition; empty when ready.
    pub waiting: Vec<String>,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    fn capabilities(&self) -> BackendCapabilities;

    /// Whether the backend can serve now (its cluster reachable, its watches
    /// synced). A backend with nothing to wait for is always ready.
    fn readiness(&self) -> Readiness {
        Readiness::default()
    }

    /// Readiness for the given config, without starting anything.
    async fn probe(&self, config: &ProbeConfig) -> AvailabilityReport;

    /// Whether a request may name the telo release its apps run
    /// (`features.teloVersions`).
    fn offers_telo_versions(&self) -> bool {
        false
    }

    /// Whether the backend can run telo `version` for a session of `mode`
    /// (asked before the session exists, once per app). `Err` is the reason
    /// a client is shown with `telo_version_unavailable`. Only cheap local
    /// checks belong here: a pull that fails is a start failure naming the
    /// version.
    fn supply_telo(&self, _version: &TeloVersion, _mode: SessionMode) -> Result<(), String> {
        Err("this runner does not run a chosen telo version".to_owned())
    }

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

    /// Whether this backend runs watch sessions.
    fn offers_watch(&self) -> bool {
        false
    }

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
        _start: WatchStart,
        _sink: SessionSink,
    ) -> Result<Arc<dyn WatchWorkload>, StartError> {
        Err(StartError::new(
            StartStage::Start,
            format!(
                "this runner's backend does not run watch sessions (session '{}')",
                spec.session_id
            ),
        ))
    }

    /// Whether a suspended session has a checkpoint to resume from.
    async fn has_checkpoint(&self, _session_id: &str) -> bool {
        false
    }

    /// Watch sessions kept from before this runner started (once, at boot).
    async fn recover_suspended(&self) -> Vec<SuspendedSession> {
        Vec::new()
    }

    /// Sessions a previous runner process left running that this backend can
    /// take over (called once at boot, before serving). Finished or expired
    /// workloads are cleaned up here instead of being returned.
    async fn recover(&self) -> Vec<RecoveredSession> {
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
}
