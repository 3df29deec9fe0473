//! The sandbox's arguments handed to `bwrap` through a memory file rather
//! than its command line (readable by every local user) or its environment.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// `bwrap`'s arguments in an unnamed memory file, for as long as this value
/// lives: the launched `sh` opens it by its `/proc` path, so it must outlive
/// the start of the process.
#[derive(Debug)]
pub struct ArgsFile {
    file: std::fs::File,
    /// The sandbox's cgroup, which lives exactly as long.
    _cgroup: Option<crate::sandbox::cgroup::SessionCgroup>,
}

impl ArgsFile {
    pub fn new(args: &[OsString]) -> std::io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let fd = nix::sys::memfd::memfd_create(
            c"telo-runner-sandbox-args",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        let mut file = std::fs::File::from(fd);
        let mut bytes = Vec::with_capacity(args.iter().map(|a| a.len() + 1).sum());
        for arg in args {
            bytes.extend_from_slice(arg.as_bytes());
            bytes.push(0);
        }
        file.write_all(&bytes)?;
        Ok(Self {
            file,
            _cgroup: None,
        })
    }

    /// Keeps `cgroup` for as long as the sandbox's arguments are kept: the
    /// session's life.
    pub fn with_cgroup(mut self, cgroup: Option<crate::sandbox::cgroup::SessionCgroup>) -> Self {
        self._cgroup = cgroup;
        self
    }

    /// Where another process of the same user can open it.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.file.as_raw_fd()
        ))
    }
}
