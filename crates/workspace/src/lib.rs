//! The workspace directory of a watch session, as the editor sees it through
//! the runner: list the tree, read a file, apply a change set, touch a file
//! so the kernel reloads, take a snapshot, seed from a bundle.
//!
//! The directory is shared with the untrusted app process, which can plant
//! symbolic links, FIFOs, devices, huge files and deep or wide trees. No
//! operation here follows a symbolic link, opens anything but a regular file,
//! or reads more than a limit allows; see the crate README for the exact
//! guarantees. Everything is synchronous: callers run it on a blocking
//! thread.

mod apply;
mod beneath;
pub mod checkpoint;
mod error;
mod walk;

#[cfg(test)]
mod tests;

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use runner_api::bundle_path::normalize_bundle_path;
use runner_api::types::BundleFile;
use runner_api::watch::{
    FileEncoding, WORKSPACE_MARKER, WorkspaceApplyResult, WorkspaceChangeSet,
    WorkspaceCheckpointFile, WorkspaceFileContent, WorkspaceFileEntry, WorkspaceTree,
    WorkspaceWrite,
};
use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::apply::{ChangeCap, parent_error};
use crate::beneath::{OpenFileError, lstat_at, open_dir, open_regular, read_bounded, split};
pub use crate::error::{ErrorKind, Limit, WorkspaceError};

/// The text of the marker file seeding writes when the bundle has none.
pub const MARKER_CONTENT: &str = "\
# This file marks the root of a Telo workspace.
# The Telo kernel keeps its .telo cache next to it, so the cache stays in
# this directory however deep the entry manifest is. It holds no settings;
# leave it in place.
";

/// The runner's limits on one workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLimits {
    /// The largest file a read, a write or a touch handles
    /// (`RUNNER_WORKSPACE_MAX_FILE_BYTES`).
    pub max_file_bytes: u64,
    /// The largest decoded change set (`RUNNER_WORKSPACE_MAX_CHANGE_BYTES`).
    pub max_change_set_bytes: u64,
    /// The most bytes the listed files may hold together; bounds the tree,
    /// a snapshot and what a change set may grow the workspace to
    /// (`RUNNER_WORKSPACE_MAX_BYTES`).
    pub max_workspace_bytes: u64,
    /// The most files the tree lists (`RUNNER_WORKSPACE_MAX_FILES`). A walk
    /// also stops after four times as many entries of any kind.
    pub max_files: usize,
}

impl Default for WorkspaceLimits {
    /// 10 MiB per file, 16 MiB per change set, 64 MiB per workspace, 10,000
    /// files.
    fn default() -> Self {
        WorkspaceLimits {
            max_file_bytes: 10 * 1024 * 1024,
            max_change_set_bytes: 16 * 1024 * 1024,
            max_workspace_bytes: 64 * 1024 * 1024,
            max_files: 10_000,
        }
    }
}

/// A workspace root, opened once. Every operation works relative to the
/// root's descriptor, so renaming the root away does not redirect it.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    fd: OwnedFd,
    limits: WorkspaceLimits,
}

/// Validates a client path with the bundle path rules and returns it
/// normalized, relative to the root.
pub(crate) fn validate_path(raw: &str) -> Result<String, WorkspaceError> {
    normalize_bundle_path(raw).map_err(|_| WorkspaceError::InvalidPath {
        path: raw.to_owned(),
    })
}

/// The lowercase hex sha256 of some bytes.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Workspace {
    /// Creates the root (and its missing parents, mode `0o700`) and opens
    /// it. An existing directory is opened as it is.
    pub fn create(root: &Path, limits: WorkspaceLimits) -> Result<Self, WorkspaceError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|error| WorkspaceError::io("create", ".", error))?;
        Self::open(root, limits)
    }

    /// Opens an existing root directory. The root path is the runner's own
    /// and trusted; only what is under it is not.
    pub fn open(root: &Path, limits: WorkspaceLimits) -> Result<Self, WorkspaceError> {
        let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(root, flags, Mode::empty())
            .map_err(|error| WorkspaceError::io("open", ".", error.into()))?;
        Ok(Workspace {
            root: root.to_owned(),
            fd,
            limits,
        })
    }

    /// The root's path, as given to [`Workspace::create`] or
    /// [`Workspace::open`].
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The limits this workspace enforces.
    pub fn limits(&self) -> &WorkspaceLimits {
        &self.limits
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Every regular file, sorted by path, with the sha256 of its bytes.
    ///
    /// Directories named in `WORKSPACE_EXCLUDED` are skipped at any depth,
    /// and so are symbolic links (never followed), FIFOs, sockets, devices,
    /// names that are not UTF-8 and this crate's in-flight temporary files.
    /// Fails past `max_files` files, past `max_workspace_bytes` bytes, or
    /// past the depth limit, rather than listing part of the tree.
    pub fn tree(&self) -> Result<WorkspaceTree, WorkspaceError> {
        let mut files = Vec::new();
        self.collect(&mut |path, bytes| {
            files.push(WorkspaceFileEntry {
                path: path.to_owned(),
                hash: sha256_hex(bytes),
            });
        })?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(WorkspaceTree { files })
    }

    /// Every file [`Workspace::tree`] lists, with its bytes in base64. The
    /// whole snapshot is bounded by `max_workspace_bytes`.
    pub fn snapshot(&self) -> Result<Vec<WorkspaceCheckpointFile>, WorkspaceError> {
        let mut files = Vec::new();
        self.collect(&mut |path, bytes| {
            files.push(WorkspaceCheckpointFile {
                path: path.to_owned(),
                hash: sha256_hex(bytes),
                content: STANDARD.encode(bytes),
                encoding: FileEncoding::Base64,
            });
        })?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// [`Workspace::snapshot`] in a checkpoint's stored form
    /// ([`checkpoint::encode`]).
    pub fn checkpoint(&self) -> Result<Vec<u8>, WorkspaceError> {
        let files = self.snapshot()?;
        checkpoint::encode(&files).map_err(|err| {
            WorkspaceError::io("encode", "the checkpoint", std::io::Error::other(err))
        })
    }

    /// Walks the tree and reads each listed file, one at a time, within the
    /// workspace byte budget.
    fn collect(&self, each: &mut dyn FnMut(&str, &[u8])) -> Result<(), WorkspaceError> {
        let max = self.limits.max_workspace_bytes;
        let mut total: u64 = 0;
        walk::walk(self.fd(), self.limits.max_files, &mut |found| {
            let over = || WorkspaceError::too_large(Limit::WorkspaceBytes, None, None, max);
            if total.saturating_add(beneath::size_of(found.stat)) > max {
                return Err(over());
            }
            let mut file = match open_regular(found.dir, found.name) {
                Ok((file, _)) => file,
                // Swapped or removed by the workload since it was listed.
                Err(
                    OpenFileError::Missing | OpenFileError::Symlink | OpenFileError::NotRegular,
                ) => {
                    return Ok(());
                }
                Err(OpenFileError::Os(error)) => {
                    return Err(WorkspaceError::io("read", found.path, error.into()));
                }
            };
            let bytes = read_bounded(&mut file, max - total)
                .map_err(|error| WorkspaceError::io("read", found.path, error))?;
            total = total.saturating_add(bytes.len() as u64);
            if total > max {
                return Err(over());
            }
            each(found.path, &bytes);
            Ok(())
        })
    }

    /// The total size of the files the tree lists, from their metadata
    /// alone. Bounded like the tree walk.
    pub fn size_bytes(&self) -> Result<u64, WorkspaceError> {
        let mut total: u64 = 0;
        walk::walk(self.fd(), self.limits.max_files, &mut |found| {
            total = total.saturating_add(beneath::size_of(found.stat));
            Ok(())
        })?;
        Ok(total)
    }

    /// A file's content as UTF-8 and its size in bytes.
    ///
    /// Bytes that are not UTF-8 are replaced with U+FFFD, as the reference
    /// workspace does; `size` is still the byte count on disk. Use
    /// [`Workspace::read_bytes`] for the exact bytes.
    pub fn read(&self, path: &str) -> Result<WorkspaceFileContent, WorkspaceError> {
        let bytes = self.read_bytes(path)?;
        Ok(WorkspaceFileContent {
            size: bytes.len() as u64,
            content: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    /// A file's bytes. Refuses symbolic links (anywhere in the path),
    /// anything but a regular file (a FIFO is never opened, so this cannot
    /// block), and files over `max_file_bytes`, checked before reading and
    /// again while reading in case the file grows.
    pub fn read_bytes(&self, path: &str) -> Result<Vec<u8>, WorkspaceError> {
        let relative = validate_path(path)?;
        let (parent, name) = split(&relative);
        let dir = open_dir(self.fd(), parent).map_err(|error| match error {
            rustix::io::Errno::NOTDIR => WorkspaceError::NotFound {
                path: path.to_owned(),
            },
            error => parent_error("read", path, error),
        })?;
        let (file, stat) = open_regular(dir.as_fd(), name).map_err(|error| match error {
            OpenFileError::Missing => WorkspaceError::NotFound {
                path: path.to_owned(),
            },
            OpenFileError::Symlink => WorkspaceError::SymlinkInPath {
                path: path.to_owned(),
            },
            OpenFileError::NotRegular => WorkspaceError::NotAFile {
                path: path.to_owned(),
            },
            OpenFileError::Os(error) => WorkspaceError::io("read", path, error.into()),
        })?;
        let max = self.limits.max_file_bytes;
        let size = beneath::size_of(&stat);
        if size > max {
            return Err(WorkspaceError::too_large(
                Limit::FileBytes,
                Some(path),
                Some(size),
                max,
            ));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        file.take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|error| WorkspaceError::io("read", path, error))?;
        if bytes.len() as u64 > max {
            return Err(WorkspaceError::too_large(
                Limit::FileBytes,
                Some(path),
                None,
                max,
            ));
        }
        Ok(bytes)
    }

    /// Applies a change set: its writes, then its deletes.
    ///
    /// Every path (writes, then deletes) is validated, every content decoded
    /// and the file, change-set and workspace caps are checked before the
    /// disk is touched, as are the conflicts the disk would otherwise report
    /// halfway (a link or file where a parent directory goes, a directory
    /// where a file goes), so a refused change set changes nothing. The
    /// workload can still change the directory between the check and the
    /// writes; then a later write can fail after earlier ones landed.
    ///
    /// Each write is atomic (a temporary file in the same directory, renamed
    /// over the name) and creates missing parent directories. Writing into
    /// an excluded directory is allowed: the files are the user's, the tree
    /// just does not list them. A symbolic link at the target name is
    /// replaced, not followed. Deleting a missing path counts 0; deleting a
    /// directory removes it and everything in it (never following a link)
    /// and counts 1. `written` counts the change set's writes.
    pub fn apply(
        &self,
        changes: &WorkspaceChangeSet,
    ) -> Result<WorkspaceApplyResult, WorkspaceError> {
        self.apply_with(changes, ChangeCap::Enforce)
    }

    /// Rewrites a file with its own bytes (a new inode, a new mtime) so the
    /// kernel's watcher reloads it. Bounded by `max_file_bytes`.
    pub fn touch(&self, path: &str) -> Result<(), WorkspaceError> {
        let bytes = self.read_bytes(path)?;
        let relative = validate_path(path)?;
        self.write_file(path, &relative, &bytes)
    }

    /// Writes a bundle's files (UTF-8) and, unless the bundle has one or
    /// the workspace already does, the marker file ([`MARKER_CONTENT`]).
    /// Bounded by the file and workspace caps, not the change-set cap.
    pub fn seed(&self, files: &[BundleFile]) -> Result<WorkspaceApplyResult, WorkspaceError> {
        let writes = files
            .iter()
            .map(|file| WorkspaceWrite {
                path: file.relative_path.clone(),
                content: file.contents.clone(),
                encoding: Some(FileEncoding::Utf8),
            })
            .collect();
        self.seed_writes(writes)
    }

    /// Writes a checkpoint's files back (resume), adding the marker like
    /// [`Workspace::seed`] when the checkpoint has none.
    pub fn restore(
        &self,
        files: &[WorkspaceCheckpointFile],
    ) -> Result<WorkspaceApplyResult, WorkspaceError> {
        let writes = files
            .iter()
            .map(|file| WorkspaceWrite {
                path: file.path.clone(),
                content: file.content.clone(),
                encoding: Some(file.encoding),
            })
            .collect();
        self.seed_writes(writes)
    }

    fn seed_writes(
        &self,
        mut write: Vec<WorkspaceWrite>,
    ) -> Result<WorkspaceApplyResult, WorkspaceError> {
        let in_bundle = write
            .iter()
            .any(|w| normalize_bundle_path(&w.path).is_ok_and(|p| p == WORKSPACE_MARKER));
        let on_disk = lstat_at(self.fd(), WORKSPACE_MARKER)
            .map_err(|error| WorkspaceError::io("seed", WORKSPACE_MARKER, error.into()))?
            .is_some();
        if !in_bundle && !on_disk {
            write.push(WorkspaceWrite {
                path: WORKSPACE_MARKER.to_owned(),
                content: MARKER_CONTENT.to_owned(),
                encoding: Some(FileEncoding::Utf8),
            });
        }
        let changes = WorkspaceChangeSet {
            write,
            delete: Vec::new(),
        };
        self.apply_with(&changes, ChangeCap::Skip)
    }
}
