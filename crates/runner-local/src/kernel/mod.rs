//! The Telo CLI the sessions run: which releases are installed, a cheap
//! identity of the configured one, its self-check and the verdict kept per
//! identity, and its caches.

pub mod cache_warm_up;
pub mod check;
pub mod fingerprint;
pub mod monitor;
pub mod versions;
