//! The `telo-runner` binary's wiring: configuration, backend selection, the
//! HTTP server and its graceful shutdown, and the terminal client (`run`,
//! `attach`, `logs`, `sessions`, `stop`, `dev`). No contract logic lives here.

pub mod bundle;
pub mod cli;
pub mod client;
pub mod dev;
pub mod logging;
pub mod server;
