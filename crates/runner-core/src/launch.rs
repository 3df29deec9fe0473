//! What a backend is given and gives back at the seam: the specs of a run
//! or watch session, the operator's apps and agents, what survives a
//! restart, readiness. Plain data: the core builds these, a backend reads
//! them, neither needs the other's machinery to do so.

use runner_api::types::{PortMapping, PullPolicy, RunBundle, SessionConfig};
use runner_api::watch::AppSpec;
use serde_json::Value;

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

/// Why a backend cannot run a named telo release: the reason a client is
/// shown with `telo_version_unavailable`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TeloUnavailable {
    /// The backend runs no chosen release at all.
    #[error("this runner does not run a chosen telo version")]
    NotOffered,
    /// A local runner without a versions directory.
    #[error("this runner runs only the Telo CLI it was configured with")]
    OnlyConfiguredKernel,
    /// A local runner whose versions directory holds no kernel at all.
    #[error("this runner has no telo {version}, and no chosen release at all")]
    NoReleases { version: String },
    /// A local runner without that release; `have` is what it offers.
    #[error("this runner has no telo {version} \u{2014} it has {}", have.join(", "))]
    NotInstalled { version: String, have: Vec<String> },
    /// An unreleased build has no published image: only one the operator
    /// built from that same tree can run it.
    #[error(
        "{version} is an unreleased build, which has no published image. Pin a released telo \
         version for this workspace, or have the runner's operator set \
         RUNNER_TELO_UNRELEASED_IMAGE to a kernel image built from that same tree"
    )]
    UnreleasedWithoutImage { version: String },
}

/// What `/v1/capabilities` says about the backend; the core adds terms and apps.
#[derive(Debug, Clone)]
pub struct BackendCapabilities {
    pub display_name: String,
    pub description: String,
    /// The JSON Schema of the editable `SessionConfig` surface.
    pub config_schema: Value,
    /// What the backend's sessions can do; the core adds what it decides
    /// (auth, watch, agents, telo versions) to the `features` object.
    pub features: BackendFeatures,
    /// What a request's `config` leaves unset runs with.
    pub default_config: SessionConfig,
}

/// The backend's part of `features`, serialized as it appears there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackendFeatures {
    /// `features.io`: how an app's terminal may reach the client.
    pub io: Vec<runner_api::watch::IoMode>,
    /// `features.ports`: whether sessions publish the ports they declare.
    pub ports: bool,
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
    /// The principal that created it, recorded with the workload so that
    /// ownership outlives this runner process.
    pub owner: Option<crate::identity::Owner>,
}

impl StartSpec {
    pub fn self_contained(&self) -> bool {
        self.app.is_some()
    }

    pub fn tcp_ports(&self) -> Vec<u16> {
        runner_api::ports::tcp_ports(&self.ports)
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
    /// The principal that created it; kept with the session so another
    /// principal never sees it, across restarts too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<crate::identity::Owner>,
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
    /// Its share links as the last runner kept them.
    pub links: Vec<KeptLink>,
    /// Where the last runner's newest output frames ended, when it handed
    /// the session over as it ran (none after a crash, none once
    /// suspended).
    pub output_marks: Vec<crate::backend_session::OutputMarks>,
}

/// A share link as a backend keeps it: what makes its URL again (with the
/// same signing key) and decides whether it is live.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptLink {
    pub id: String,
    pub port: u16,
    /// Unix seconds.
    pub expires_at: u64,
    pub created_at: String,
}

/// Whether this runner process already holds a session by that id. A
/// boot-time recovery leaves such a session alone: the API serves while the
/// recovery lists what earlier runners left, so a session a client created
/// a moment ago may be listed beside them.
pub type HeldSessions = std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>;

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
    /// SHA-256 of its workload token, when its record kept one: the token
    /// itself is not kept (it was the previous runner's to report), but the
    /// edge can still check it ([`crate::session::Session::edge_access`]).
    pub token_digest: Option<[u8; 32]>,
    /// The principal that created it, as its record kept it.
    pub owner: Option<crate::identity::Owner>,
    /// Its share links as the last runner kept them.
    pub links: Vec<KeptLink>,
    /// Where the last runner's newest output frames ended, when it handed
    /// the session over (none after a crash).
    pub output_marks: Vec<crate::backend_session::OutputMarks>,
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

/// Which ceilings a session runs under (`Backend::session_resources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    /// A bundle run session.
    Run,
    /// A catalog app session.
    App,
    Watch,
}
