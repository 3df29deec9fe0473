//! Test clients and fixtures shared by the black-box suites. Every wait here is
//! on an event with a timeout; nothing sleeps to wait for state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod bundle;
pub mod fake_telo;
pub mod sse;
pub mod ws;

use std::time::Duration;

/// The default time a test waits for something that should happen promptly.
pub const WAIT: Duration = Duration::from_secs(15);
