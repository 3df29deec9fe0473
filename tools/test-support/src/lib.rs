//! Test clients and fixtures shared by the black-box suites. Every wait here is
//! on an event with a timeout; nothing sleeps to wait for state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod bundle;
pub mod containers;
pub mod fake_telo;
pub mod real_kernel;
pub mod relay;
pub mod sse;
pub mod ws;

use std::time::Duration;

/// The default time a test waits for something that should happen promptly.
pub const WAIT: Duration = Duration::from_secs(15);

/// An HTTP client for tests (the workspace's reqwest has TLS without a
/// built-in provider; install the process-wide one first).
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A loopback TCP port nobody listens on right now (for a process that must
/// be told its port before it starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
