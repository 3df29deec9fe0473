//! The backend-neutral core of telo-runner: the session registry with its
//! replay buffers, the HTTP/SSE/WebSocket router, the backend seam, metrics
//! and the helpers backends share (reachability, debug relay). The contract's
//! data (wire types, validation, frame codecs) is the `runner-api` crate,
//! re-exported here under its module names for the backends.

pub mod accept;
pub mod admission;
pub mod apps;
pub mod audit;
pub mod auth;
pub mod backend;
pub mod backend_session;
pub mod capabilities;
pub mod client_addr;
pub mod config;
pub mod debug_relay;
pub mod edge;
pub mod env;
pub mod errors;
pub mod http;
pub mod http_client;
pub mod identity;
pub mod ids;
pub mod kernel_progress;
pub mod launch;
pub mod metrics;
pub mod observe;
pub mod oidc;
pub mod reach;
pub mod reachability;
pub mod registry;
pub mod replay;
pub mod replicas;
pub mod session;
pub mod setting;
pub mod settings;
pub mod start_gate;
pub mod sync;
pub mod tasks;
pub mod tenancy;
pub mod terms;
#[cfg(test)]
mod test_waker;
pub mod time;
pub mod watch;
pub mod webhooks;

pub use runner_api::watch as watch_types;
pub use runner_api::{app_env, bundle_path, js, types, validate};

pub use backend::{
    AgentLaunch, AgentRef, AppLaunch, Backend, BackendCapabilities, BackendFeatures,
    BackendSession, HeldSessions, InvalidSessionConfig, ProbeConfig, Readiness, RecoveredSession,
    StartError, StartSpec, StartStage, StopError, SuspendedSession, TeloUnavailable, TeloVersions,
    WatchSessions, WatchSpec, WatchStart, WatchWorkload, WorkspaceCause, WorkspaceFailure,
};
pub use registry::{RegistryLimits, SessionRegistry};
pub use session::SessionSink;
