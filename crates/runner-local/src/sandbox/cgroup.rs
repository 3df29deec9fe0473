//! A cgroup v2 child per sandbox, where the host delegates the runner's
//! cgroup to it: the session's memory, processes and CPU bounded as a whole
//! (`memory.max`, `pids.max`, `cpu.max`), which rlimits — per process, and
//! never counting a root runner's processes — cannot do.
//!
//! Delegation is what systemd's `Delegate=yes` or a container with a
//! private cgroup namespace gives: the runner's own cgroup is on a cgroup v2
//! hierarchy, writable by the runner, with the `memory`, `pids` and `cpu`
//! controllers available. A cgroup with processes cannot hand controllers to
//! children, so the runner first moves itself into a `runner` leaf; sessions
//! go under `sessions`. Each sandbox's host shell writes itself into its
//! child before it becomes `bwrap`, so every process of the sandbox is in
//! the child from the start. Without delegation the runner says once, at
//! boot, that sessions are bounded by rlimits only.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::debug;

use crate::sandbox::limits::SessionLimits;

/// Where the unified hierarchy is mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// The controllers a session's bounds need.
pub const CONTROLLERS: &[&str] = &["memory", "pids", "cpu"];
/// `cpu.max`'s period, in microseconds (the kernel's default).
const CPU_PERIOD_MICROS: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("the runner is not in a cgroup v2 hierarchy at {CGROUP_MOUNT}")]
    NotUnified,
    #[error("the runner's cgroup {0} lacks the {1} controller")]
    MissingController(PathBuf, &'static str),
    #[error("could not {action} {path}: {source}")]
    Write {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn write(action: &'static str, path: PathBuf, contents: &str) -> Result<(), CgroupError> {
    std::fs::write(&path, contents).map_err(|source| CgroupError::Write {
        action,
        path,
        source,
    })
}

fn make_dir(path: PathBuf) -> Result<(), CgroupError> {
    match std::fs::create_dir(&path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::Write {
            action: "create",
            path,
            source,
        }),
    }
}

/// The cgroup path of the `0::` line of `/proc/self/cgroup`.
pub fn unified_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim)
}

/// The controllers a delegated cgroup lacks, from its `cgroup.controllers`.
pub fn missing_controller(controllers: &str) -> Option<&'static str> {
    CONTROLLERS
        .iter()
        .find(|wanted| !controllers.split_whitespace().any(|have| have == **wanted))
        .copied()
}

/// `cpu.max` for `millis` thousandths of a CPU.
pub fn cpu_max(millis: u64) -> String {
    format!(
        "{} {CPU_PERIOD_MICROS}",
        millis.saturating_mul(CPU_PERIOD_MICROS) / 1000
    )
}

/// The delegated subtree sessions' cgroups are made in.
#[derive(Debug, PartialEq, Eq)]
pub struct CgroupTree {
    sessions: PathBuf,
}

impl CgroupTree {
    /// Takes over the runner's cgroup, when the host delegated it.
    pub fn delegated() -> Result<Self, CgroupError> {
        let own =
            std::fs::read_to_string("/proc/self/cgroup").map_err(|_| CgroupError::NotUnified)?;
        let relative = unified_path(&own).ok_or(CgroupError::NotUnified)?;
        let dir = Path::new(CGROUP_MOUNT).join(relative.trim_start_matches('/'));
        let controllers = std::fs::read_to_string(dir.join("cgroup.controllers"))
            .map_err(|_| CgroupError::NotUnified)?;
        if let Some(missing) = missing_controller(&controllers) {
            return Err(CgroupError::MissingController(dir, missing));
        }
        let enable = CONTROLLERS
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        make_dir(dir.join("runner"))?;
        write(
            "move the runner into",
            dir.join("runner/cgroup.procs"),
            &std::process::id().to_string(),
        )?;
        write(
            "enable controllers in",
            dir.join("cgroup.subtree_control"),
            &enable,
        )?;
        let sessions = dir.join("sessions");
        make_dir(sessions.clone())?;
        write(
            "enable controllers in",
            sessions.join("cgroup.subtree_control"),
            &enable,
        )?;
        let tree = Self { sessions };
        tree.sweep();
        Ok(tree)
    }

    /// Removes the children a previous runner left (empty ones: a child
    /// with processes is left alone).
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.sessions) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }

    /// A new child bounded by `limits`, removed when dropped.
    pub fn child(&self, limits: &SessionLimits) -> Result<SessionCgroup, CgroupError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = self.sessions.join(format!(
            "s{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        make_dir(dir.clone())?;
        let child = SessionCgroup { dir };
        write(
            "set",
            child.dir.join("memory.max"),
            &limits.memory_bytes.to_string(),
        )?;
        // Where swap is accounted, a session must not page out past its bound.
        let _ = std::fs::write(child.dir.join("memory.swap.max"), "0");
        write(
            "set",
            child.dir.join("pids.max"),
            &limits.processes.to_string(),
        )?;
        write(
            "set",
            child.dir.join("cpu.max"),
            &cpu_max(limits.cpu_millis),
        )?;
        Ok(child)
    }
}

/// One sandbox's cgroup.
#[derive(Debug)]
pub struct SessionCgroup {
    dir: PathBuf,
}

impl SessionCgroup {
    /// What the sandbox's host shell writes itself into.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for SessionCgroup {
    /// The session has ended by now: whatever is left of it is killed and
    /// the child removed (a child still emptying is swept at the next boot).
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        if let Err(err) = std::fs::remove_dir(&self.dir) {
            debug!(dir = %self.dir.display(), error = %err, "session cgroup not removed yet");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_hierarchy_is_the_zero_line() {
        assert_eq!(
            unified_path("0::/user.slice/runner.service\n"),
            Some("/user.slice/runner.service")
        );
        assert_eq!(unified_path("4:memory:/x\n1:cpu:/\n0::/\n"), Some("/"));
        assert_eq!(unified_path("4:memory:/x\n1:cpu:/\n"), None);
    }

    #[test]
    fn every_controller_a_bound_needs_must_be_delegated() {
        assert_eq!(
            missing_controller("cpuset cpu io memory hugetlb pids rdma"),
            None
        );
        assert_eq!(missing_controller("cpu io memory"), Some("pids"));
        assert_eq!(missing_controller(""), Some("memory"));
    }

    #[test]
    fn cpu_thousandths_become_a_quota_per_period() {
        assert_eq!(cpu_max(1000), "100000 100000");
        assert_eq!(cpu_max(500), "50000 100000");
        assert_eq!(cpu_max(2500), "250000 100000");
    }
}
