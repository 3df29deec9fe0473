//! One runner per work root. The boot sweep removes every session directory
//! it finds there, so a second runner on the same root would delete the first
//! one's live sessions; an exclusive lock on a file in the root, held for the
//! runner's life, makes the second refuse to start instead.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name; not a session id, so the sweep leaves it.
pub const LOCK_FILE: &str = ".runner.lock";

#[derive(Debug, thiserror::Error)]
pub enum WorkRootLockError {
    #[error(
        "RUNNER_LOCAL_WORK_DIR '{}' is in use by another telo-runner; give each runner its own work directory.",
        .dir.display()
    )]
    InUse { dir: PathBuf },
    #[error("cannot lock RUNNER_LOCAL_WORK_DIR '{}'", .dir.display())]
    Lock {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Held for as long as the runner uses the root; the lock goes with the
/// process, however it ends.
#[derive(Debug)]
pub struct WorkRootLock {
    _file: Flock<File>,
}

impl WorkRootLock {
    pub fn acquire(root: &Path) -> Result<Self, WorkRootLockError> {
        let io_error = |source| WorkRootLockError::Lock {
            dir: root.to_owned(),
            source,
        };
        std::fs::create_dir_all(root).map_err(io_error)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(LOCK_FILE))
            .map_err(io_error)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(file) => Ok(Self { _file: file }),
            Err((_, Errno::EWOULDBLOCK)) => Err(WorkRootLockError::InUse {
                dir: root.to_owned(),
            }),
            Err((_, errno)) => Err(io_error(std::io::Error::from(errno))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_of_one_root_is_refused_until_the_first_lets_go() {
        let root = tempfile::tempdir().unwrap();
        let first = WorkRootLock::acquire(root.path()).unwrap();
        let second = WorkRootLock::acquire(root.path()).unwrap_err();
        assert_eq!(
            second.to_string(),
            format!(
                "RUNNER_LOCAL_WORK_DIR '{}' is in use by another telo-runner; give each runner its own work directory.",
                root.path().display()
            )
        );
        drop(first);
        WorkRootLock::acquire(root.path()).unwrap();
    }
}
