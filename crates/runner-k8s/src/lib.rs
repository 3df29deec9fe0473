//! The Kubernetes backend: every session runs as a Pod in the session
//! namespace, watched through one shared watch, attached over the `attach`
//! subresource, and adopted again after a runner restart.

pub mod adoption;
pub mod api_error;
pub mod attach;
pub mod backend;
pub mod base_images;
pub mod bundle_store;
pub mod client;
pub mod config;
pub mod env_secret;
pub mod event_watcher;
pub mod limits;
pub mod pod_spec;
pub mod pod_status;
pub mod pod_watcher;
pub mod progress;
pub mod routing;
pub mod session;
pub mod session_record;
pub mod setup;
pub mod splice;
pub mod telo_images;
pub mod terminal;
pub mod warm_pool;
pub mod watch;
pub mod watch_cache;
pub mod watch_loop;

pub use backend::KubeBackend;
