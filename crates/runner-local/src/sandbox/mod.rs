//! The bubblewrap sandbox every session process runs in, and what bounds
//! it: rlimits, a cgroup where the host delegates one, the disk bound of
//! its directory, and the check of whether this host can start one.

pub mod bubblewrap;
pub mod cgroup;
pub mod check;
pub mod disk_bound;
pub mod limits;
