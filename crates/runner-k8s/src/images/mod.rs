//! Which image a session runs: the base images offered to clients, and the
//! image of each telo release.

pub mod base;
pub mod telo;
