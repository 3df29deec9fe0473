//! `RUNNER_WORKSPACE_WAKE_FIFO`: a named pipe the service holds open for
//! as long as it runs, so another container of the pod can wait for the
//! service to be done by reading it — blocked in the kernel, not polling.
//!
//! A reader's open succeeds while the service holds the pipe and its read
//! ends (end-of-file) when the service exits. The pipe is removed before
//! it is closed: an open that comes after the service is gone finds no
//! pipe (and looks for what the service left instead) rather than waiting
//! for a writer that will never come.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::Mode;

/// The pipe, held open; dropping it removes the pipe, then closes it.
#[derive(Debug)]
pub struct WakePipe {
    path: PathBuf,
    _held: File,
}

impl WakePipe {
    /// Makes the pipe at `path` (owner read and write only), or takes the
    /// one already there, and opens it for reading and writing — which, on
    /// Linux, does not wait for the other end.
    pub fn hold(path: &Path) -> io::Result<WakePipe> {
        match nix::unistd::mkfifo(path, Mode::S_IRUSR | Mode::S_IWUSR) {
            Ok(()) => {}
            Err(nix::errno::Errno::EEXIST) => {
                let kind = std::fs::symlink_metadata(path)?.file_type();
                if !kind.is_fifo() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "something that is not a named pipe is in the way",
                    ));
                }
            }
            Err(errno) => return Err(io::Error::from(errno)),
        }
        let held = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(WakePipe {
            path: path.to_owned(),
            _held: held,
        })
    }
}

impl Drop for WakePipe {
    fn drop(&mut self) {
        // Before the file closes (fields drop after this): see the module.
        let _ = std::fs::remove_file(&self.path);
    }
}
