//! The Kubernetes backend: every session runs as a Pod in the session
//! namespace, followed through one shared informer per kind, attached over
//! the `attach` subresource, and adopted again after a runner restart.
//!
//! Modules by layer, each using only those above it in this list:
//!
//! - [`images`]: which image a base or a telo release runs in.
//! - [`config`]: the `RUNNER_*` settings of this backend.
//! - [`cluster`]: the cluster client, its errors and the informer every cache
//!   of cluster objects is built on.
//! - [`pod`]: the session pods: their labels, records, specs, statuses and
//!   the informers that follow them.
//! - [`terminal`], [`bundle_store`], [`routing`]: a session's terminal,
//!   bundle and published ports.
//! - [`replica`]: several replicas of one installation: their Leases, who
//!   owns a session, and taking over a lapsed replica's sessions.
//! - `session`: one session's pod from creation to its terminal status, and
//!   adoption after a restart.
//! - `warm_pool`: idle pods a start claims instead of creating one.
//! - `watch`: watch sessions, whose files are edited live.
//! - `backend` and [`setup`]: the backend the runner calls, and how it is
//!   built from the configuration.

mod backend;
pub mod bundle_store;
pub mod cluster;
pub mod config;
pub mod images;
pub mod pod;
pub mod replica;
pub mod routing;
mod session;
pub mod setup;
pub mod terminal;
mod warm_pool;
mod watch;

pub use backend::KubeBackend;
