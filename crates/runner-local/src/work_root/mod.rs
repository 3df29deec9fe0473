//! The runner's work root on disk: each session's directory, and the lock
//! that keeps a second runner off the root.

pub mod lock;
pub mod session_dir;
