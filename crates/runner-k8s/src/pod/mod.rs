//! The session pods: the labels and annotations they carry, the session
//! record read back from them, the specs they are built from (run, app and
//! watch pods, warm pods and their warm-up), what their
//! statuses mean, and the informers that follow them and their Events.

pub mod env_secret;
pub(crate) mod event_informer;
pub mod informer;
pub mod labels;
pub mod limits;
pub mod pooled_watch;
pub(crate) mod progress;
pub mod session_record;
pub mod spec;
pub mod status;
pub mod warm;
pub mod warm_up;
pub mod watch;
