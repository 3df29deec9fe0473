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
    /// What lives exactly as long: the sandbox's cgroup.
    _kept: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
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
        Ok(Self { file, _kept: None })
    }

    /// Keeps `kept` (the sandbox's cgroup) for as long as the sandbox's
    /// arguments are kept: the session's life.
    pub fn keeping(mut self, kept: Option<impl std::fmt::Debug + Send + Sync + 'static>) -> Self {
        self._kept = kept.map(|kept| Box::new(kept) as Box<dyn std::fmt::Debug + Send + Sync>);
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
