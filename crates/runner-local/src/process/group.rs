//! A session's processes, as one process group: the session process is
//! started as a session leader, so its pid is also the id of the group that
//! every child it forks joins. Killing the group — not just the process —
//! is what keeps a workload's background children from outliving it.
//!
//! In a sandbox the leader is `bwrap`, and its group holds only `bwrap` and
//! the sandbox's init: killing it ends the sandbox's PID namespace, and with
//! it every process the session started, `setsid` children included. The
//! polite SIGTERM goes to the workload's processes instead (see
//! `tree`), since `bwrap` dies of it at once and takes them along.

use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use portable_pty::Child;
use tracing::warn;

/// Exit code reported when the process's status could not be read at all.
const UNKNOWN_EXIT_CODE: i64 = -1;

/// Who gets the polite SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Members {
    /// The leader's process group.
    Group,
    /// Every process inside the sandbox the leader (`bwrap`) runs.
    Sandbox,
}

pub struct ProcessGroup {
    pid: Pid,
    members: Members,
    /// Set once the leader was reaped. Until then its pid cannot be reused,
    /// so signalling the group can never hit an unrelated process; after,
    /// nothing is signalled any more.
    reaped: Mutex<bool>,
}

fn lock(mutex: &Mutex<bool>) -> MutexGuard<'_, bool> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ProcessGroup {
    pub fn new(pid: Pid, members: Members) -> Self {
        Self {
            pid,
            members,
            reaped: Mutex::new(false),
        }
    }

    /// SIGKILLs every process of the group. A group that is already gone is
    /// not an error.
    pub fn kill(&self) -> Result<(), Errno> {
        self.signal(Signal::SIGKILL)
    }

    /// SIGTERMs every process of the group (of the sandbox): the polite
    /// request that lets the kernel run its teardown (close listeners, flush
    /// logs) before it exits. A sandbox with no workload process yet (still
    /// being set up) has nothing to wait for and is killed at once.
    pub fn terminate(&self) -> Result<(), Errno> {
        match self.members {
            Members::Group => self.signal(Signal::SIGTERM),
            Members::Sandbox => {
                let reaped = lock(&self.reaped);
                if *reaped {
                    return Ok(());
                }
                let workload = crate::process::tree::sandbox_processes(self.pid);
                if workload.is_empty() {
                    return signal_group(self.pid, Signal::SIGKILL);
                }
                for pid in workload {
                    match kill(pid, Signal::SIGTERM) {
                        // Gone since the table was read.
                        Ok(()) | Err(Errno::ESRCH) => {}
                        Err(err) => return Err(err),
                    }
                }
                Ok(())
            }
        }
    }

    fn signal(&self, signal: Signal) -> Result<(), Errno> {
        let reaped = lock(&self.reaped);
        if *reaped {
            return Ok(());
        }
        signal_group(self.pid, signal)
    }

    /// Blocks until the leader exits, kills whatever is left of its group,
    /// reaps the leader and returns its exit code (`128 + signal` when a
    /// signal ended it, as a shell reports it).
    pub fn wait(&self, mut child: Box<dyn Child + Send + Sync>) -> i64 {
        // Wait without reaping: the zombie keeps the pid (and so the group id)
        // reserved while the leftovers are killed.
        let status = loop {
            match waitid(
                Id::Pid(self.pid),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
            ) {
                Ok(status) => break Some(status),
                Err(Errno::EINTR) => continue,
                Err(err) => {
                    warn!(pid = self.pid.as_raw(), error = %err, "could not wait for a session process");
                    break None;
                }
            }
        };
        let mut reaped = lock(&self.reaped);
        if let Err(err) = signal_group(self.pid, Signal::SIGKILL) {
            warn!(pid = self.pid.as_raw(), error = %err, "could not kill what was left of a session's processes");
        }
        let fallback = child.wait();
        *reaped = true;
        match status {
            Some(WaitStatus::Exited(_, code)) => i64::from(code),
            Some(WaitStatus::Signaled(_, signal, _)) => 128 + signal as i64,
            _ => fallback.map_or(UNKNOWN_EXIT_CODE, |status| i64::from(status.exit_code())),
        }
    }
}

fn signal_group(pid: Pid, signal: Signal) -> Result<(), Errno> {
    match killpg(pid, signal) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(err) => Err(err),
    }
}
