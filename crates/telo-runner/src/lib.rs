//! The `telo-runner` binary's wiring: configuration, backend selection, the
//! HTTP server and its graceful shutdown. No contract logic lives here.

pub mod cli;
pub mod logging;
pub mod server;
