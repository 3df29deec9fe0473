//! The backend-neutral core of telo-runner: the `/v1` contract types, the
//! session registry with its replay buffers, the HTTP/SSE/WebSocket router and
//! the helpers backends share (reachability, debug relay, bundle paths).

pub mod app_env;
pub mod apps;
pub mod auth;
pub mod backend;
pub mod bundle_path;
pub mod capabilities;
pub mod config;
pub mod debug_relay;
pub mod env;
pub mod errors;
pub mod http;
pub mod http_client;
pub mod ids;
pub mod js;
pub mod metrics;
pub mod reachability;
pub mod registry;
pub mod replay;
pub mod start_gate;
pub mod sync;
pub mod terms;
pub mod time;
pub mod types;
pub mod validate;

pub use backend::{
    AppLaunch, Backend, BackendCapabilities, BackendSession, ProbeConfig, Readiness,
    RecoveredSession, StartError, StartSpec, StartStage, StopError,
};
pub use registry::{RegistryLimits, SessionRegistry, SessionSink};
