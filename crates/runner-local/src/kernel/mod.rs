//! The Telo CLI the sessions run: which releases are installed, a cheap
//! identity of the configured one, its self-check and the verdict kept per
//! identity, and the runs that warm its caches (the caches themselves are
//! `kernel_cache`).

pub mod cache_warm_up;
pub mod check;
pub(crate) mod fingerprint;
pub(crate) mod monitor;
pub(crate) mod versions;
