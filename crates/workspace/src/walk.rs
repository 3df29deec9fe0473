//! The bounded walk behind `tree`, `snapshot` and `size_bytes`.
//!
//! It descends through directory descriptors only, never follows a
//! symbolic link, hands only regular files to its visitor, and stops with an
//! error past the file, entry and depth limits instead of growing without
//! bound.

use std::os::fd::{BorrowedFd, OwnedFd};

use runner_api::watch::WORKSPACE_EXCLUDED;
use rustix::fs::{Dir, FileType, Mode, OFlags, Stat, openat};
use rustix::io::Errno;

use crate::beneath::{MAX_DEPTH, file_type, lstat_at};
use crate::error::{Limit, WorkspaceError};

/// The longest path a client can name (Linux `PATH_MAX`); a file nested
/// deeper is left out because no request could address it.
const MAX_PATH_BYTES: usize = 4096;

/// A regular file the walk found.
pub(crate) struct Found<'a> {
    /// Its `/`-separated path relative to the root.
    pub path: &'a str,
    /// The directory holding it.
    pub dir: BorrowedFd<'a>,
    /// Its name in that directory.
    pub name: &'a str,
    /// Its `lstat`.
    pub stat: &'a Stat,
}

/// Whether a path names something the tree leaves out: any segment is one
/// of [`WORKSPACE_EXCLUDED`].
pub(crate) fn is_excluded(path: &str) -> bool {
    path.split('/')
        .any(|segment| WORKSPACE_EXCLUDED.contains(&segment))
}

/// Whether a name is one of this crate's in-flight temporary files.
pub(crate) fn is_temporary(name: &str) -> bool {
    (name.starts_with(".telo-write-") && name.ends_with(".tmp"))
        || name.starts_with(".telo-remove-")
}

struct Walk<'f> {
    max_files: usize,
    max_entries: usize,
    files: usize,
    entries: usize,
    visit: &'f mut dyn FnMut(Found<'_>) -> Result<(), WorkspaceError>,
}

/// Calls `visit` for every regular file under `root` that the tree lists,
/// in directory order (callers sort).
pub(crate) fn walk(
    root: BorrowedFd<'_>,
    max_files: usize,
    visit: &mut dyn FnMut(Found<'_>) -> Result<(), WorkspaceError>,
) -> Result<(), WorkspaceError> {
    let mut walk = Walk {
        max_files,
        max_entries: max_files.saturating_mul(4).max(64),
        files: 0,
        entries: 0,
        visit,
    };
    let fd = open_walk_dir(root, ".").map_err(|e| walk_io(".", e))?;
    walk.dir(fd, "", 0)
}

fn open_walk_dir(parent: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    openat(parent, name, flags, Mode::empty())
}

fn walk_io(path: &str, error: Errno) -> WorkspaceError {
    WorkspaceError::io(
        "listing",
        if path.is_empty() { "." } else { path },
        error.into(),
    )
}

impl Walk<'_> {
    fn dir(&mut self, fd: OwnedFd, prefix: &str, depth: usize) -> Result<(), WorkspaceError> {
        if depth > MAX_DEPTH {
            return Err(WorkspaceError::too_large(
                Limit::Depth,
                None,
                None,
                MAX_DEPTH as u64,
            ));
        }
        let mut entries = Dir::new(fd).map_err(|e| walk_io(prefix, e))?;
        while let Some(entry) = entries.read() {
            let entry = entry.map_err(|e| walk_io(prefix, e))?;
            let Ok(name) = entry.file_name().to_str() else {
                // Not UTF-8: no request can name it.
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            self.entries += 1;
            if self.entries > self.max_entries {
                return Err(WorkspaceError::too_large(
                    Limit::Entries,
                    None,
                    None,
                    self.max_entries as u64,
                ));
            }
            if WORKSPACE_EXCLUDED.contains(&name) || is_temporary(name) {
                continue;
            }
            let path = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            };
            if path.len() > MAX_PATH_BYTES {
                continue;
            }
            let here = entries.fd().map_err(|e| walk_io(prefix, e))?;
            let Some(stat) = lstat_at(here, name).map_err(|e| walk_io(&path, e))? else {
                // Removed since it was listed.
                continue;
            };
            match file_type(&stat) {
                FileType::Directory => {
                    let child = match open_walk_dir(here, name) {
                        Ok(child) => child,
                        // Replaced by a link or removed since the lstat.
                        Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => continue,
                        Err(error) => return Err(walk_io(&path, error)),
                    };
                    self.dir(child, &path, depth + 1)?;
                }
                FileType::RegularFile => {
                    self.files += 1;
                    if self.files > self.max_files {
                        return Err(WorkspaceError::too_large(
                            Limit::Files,
                            None,
                            None,
                            self.max_files as u64,
                        ));
                    }
                    (self.visit)(Found {
                        path: &path,
                        dir: here,
                        name,
                        stat: &stat,
                    })?;
                }
                // Links are never followed; FIFOs, sockets and devices are
                // not files an editor edits.
                _ => {}
            }
        }
        Ok(())
    }
}
