//! Change sets: everything is checked first, then the disk is touched.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsFd;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT;
use runner_api::watch::{FileEncoding, WorkspaceApplyResult, WorkspaceChangeSet};
use rustix::fs::FileType;
use rustix::io::Errno;

use crate::beneath::{
    self, RemoveError, create_dir_all, file_type, lstat_at, open_dir, remove, split, write_atomic,
};
use crate::error::{Limit, WorkspaceError};
use crate::walk::{is_excluded, walk};
use crate::{Workspace, validate_path};

/// One write, validated and decoded.
struct Write {
    raw: String,
    path: String,
    bytes: Vec<u8>,
}

/// Whether the change set's own size cap applies (it does for client change
/// sets, not for seeding, whose size the workspace cap bounds).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeCap {
    Enforce,
    Skip,
}

impl Workspace {
    pub(crate) fn apply_with(
        &self,
        changes: &WorkspaceChangeSet,
        cap: ChangeCap,
    ) -> Result<WorkspaceApplyResult, WorkspaceError> {
        let mut writes = Vec::with_capacity(changes.write.len());
        for write in &changes.write {
            writes.push((write, validate_path(&write.path)?));
        }
        let mut deletes = Vec::with_capacity(changes.delete.len());
        for raw in &changes.delete {
            deletes.push((raw.as_str(), validate_path(raw)?));
        }
        let writes = self.decode(writes, cap)?;
        check_write_conflicts(&writes)?;
        for write in &writes {
            self.probe_write(write)?;
        }
        for (raw, path) in &deletes {
            self.probe_delete(raw, path)?;
        }
        self.check_workspace_caps(&writes, &deletes)?;

        for write in &writes {
            self.write_file(&write.raw, &write.path, &write.bytes)?;
        }
        let mut deleted = 0;
        for (raw, path) in &deletes {
            if self.delete_path(raw, path)? {
                deleted += 1;
            }
        }
        Ok(WorkspaceApplyResult {
            written: writes.len(),
            deleted,
        })
    }

    /// Decodes every write, checking each file against the per-file cap and
    /// the sum against the change-set cap. Past the change-set cap the bytes
    /// are dropped and only counted, so memory stays bounded while the
    /// message still reports the whole decoded size.
    fn decode(
        &self,
        writes: Vec<(&runner_api::watch::WorkspaceWrite, String)>,
        cap: ChangeCap,
    ) -> Result<Vec<Write>, WorkspaceError> {
        let limits = &self.limits;
        let mut total: u64 = 0;
        let mut decoded = Vec::with_capacity(writes.len());
        for (write, path) in writes {
            let bytes = match write.encoding.unwrap_or_default() {
                FileEncoding::Utf8 => write.content.as_bytes().to_vec(),
                FileEncoding::Base64 => STANDARD_PAD_INDIFFERENT
                    .decode(write.content.as_bytes())
                    .map_err(|error| WorkspaceError::BadEncoding {
                    path: write.path.clone(),
                    encoding: "base64",
                    reason: error.to_string(),
                })?,
            };
            let size = bytes.len() as u64;
            if size > limits.max_file_bytes {
                return Err(WorkspaceError::too_large(
                    Limit::FileBytes,
                    Some(&write.path),
                    Some(size),
                    limits.max_file_bytes,
                ));
            }
            total = total.saturating_add(size);
            let over = cap == ChangeCap::Enforce && total > limits.max_change_set_bytes;
            decoded.push(Write {
                raw: write.path.clone(),
                path,
                bytes: if over { Vec::new() } else { bytes },
            });
        }
        if cap == ChangeCap::Enforce && total > limits.max_change_set_bytes {
            return Err(WorkspaceError::too_large(
                Limit::ChangeSetBytes,
                None,
                Some(total),
                limits.max_change_set_bytes,
            ));
        }
        Ok(decoded)
    }

    /// Refuses a write the disk would refuse halfway: a symbolic link or a
    /// file where a parent directory should be, or a directory at the
    /// target.
    fn probe_write(&self, write: &Write) -> Result<(), WorkspaceError> {
        let (parent, name) = split(&write.path);
        match open_dir(self.fd(), parent) {
            Ok(dir) => match lstat_at(dir.as_fd(), name) {
                Ok(Some(stat)) if file_type(&stat) == FileType::Directory => {
                    Err(WorkspaceError::PathConflict {
                        path: write.raw.clone(),
                        reason: "a directory is there",
                    })
                }
                Ok(_) => Ok(()),
                Err(error) => Err(WorkspaceError::io("write", &write.raw, error.into())),
            },
            // Missing parents are created; an existing link or file on the
            // way is found by walking the part that exists.
            Err(Errno::NOENT) => self.probe_missing_parent(write, parent),
            Err(error) => Err(parent_error("write", &write.raw, error)),
        }
    }

    fn probe_missing_parent(&self, write: &Write, parent: &str) -> Result<(), WorkspaceError> {
        let ends = parent.match_indices('/').map(|(index, _)| index);
        for end in ends.chain([parent.len()]) {
            match open_dir(self.fd(), &parent[..end]) {
                Ok(_) => {}
                Err(Errno::NOENT) => return Ok(()),
                Err(error) => return Err(parent_error("write", &write.raw, error)),
            }
        }
        Ok(())
    }

    fn probe_delete(&self, raw: &str, path: &str) -> Result<(), WorkspaceError> {
        let (parent, _) = split(path);
        match open_dir(self.fd(), parent) {
            Ok(_) | Err(Errno::NOENT | Errno::NOTDIR) => Ok(()),
            Err(error) => Err(parent_error("delete", raw, error)),
        }
    }

    /// The workspace caps count what the tree would list after the change
    /// set: the files there now, minus the ones it overwrites or deletes,
    /// plus the ones it writes. A write into an excluded directory is not
    /// listed but its growth counts all the same. A change set is refused
    /// only if it leaves the workspace over a cap and bigger than it was, so
    /// a workspace the workload pushed over a cap can still be cleaned up.
    fn check_workspace_caps(
        &self,
        writes: &[Write],
        deletes: &[(&str, String)],
    ) -> Result<(), WorkspaceError> {
        let limits = &self.limits;
        let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
        let scanned = walk(self.fd(), limits.max_files, &mut |found| {
            sizes.insert(found.path.to_owned(), beneath::size_of(found.stat));
            Ok(())
        });
        if let Err(error) = scanned {
            // Already over a cap: only a change set that writes nothing
            // (so cannot grow it) goes ahead.
            return if writes.is_empty() {
                Ok(())
            } else {
                Err(error)
            };
        }
        let before_bytes: u64 = sizes.values().sum();
        let before_files = sizes.len();
        let mut hidden_growth: i128 = 0;
        for write in writes {
            let size = write.bytes.len() as u64;
            if is_excluded(&write.path) {
                hidden_growth += i128::from(size) - i128::from(self.existing_size(&write.path));
            } else {
                sizes.insert(write.path.clone(), size);
            }
        }
        for (_, path) in deletes {
            if sizes.remove(path).is_none() {
                let prefix = format!("{path}/");
                let inside: Vec<String> = sizes
                    .range(prefix.clone()..)
                    .take_while(|(key, _)| key.starts_with(&prefix))
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in inside {
                    sizes.remove(&key);
                }
            }
        }
        let listed: u64 = sizes.values().sum();
        let after_bytes =
            u64::try_from((i128::from(listed) + hidden_growth).max(0)).unwrap_or(u64::MAX);
        if after_bytes > limits.max_workspace_bytes && after_bytes > before_bytes {
            return Err(WorkspaceError::too_large(
                Limit::WorkspaceBytes,
                None,
                Some(after_bytes),
                limits.max_workspace_bytes,
            ));
        }
        if sizes.len() > limits.max_files && sizes.len() > before_files {
            return Err(WorkspaceError::too_large(
                Limit::Files,
                None,
                Some(sizes.len() as u64),
                limits.max_files as u64,
            ));
        }
        Ok(())
    }

    /// The size of the regular file at `path`, or 0.
    fn existing_size(&self, path: &str) -> u64 {
        let (parent, name) = split(path);
        let Ok(dir) = open_dir(self.fd(), parent) else {
            return 0;
        };
        match lstat_at(dir.as_fd(), name) {
            Ok(Some(stat)) if file_type(&stat) == FileType::RegularFile => beneath::size_of(&stat),
            _ => 0,
        }
    }

    /// Writes one validated path, creating its parent directories.
    pub(crate) fn write_file(
        &self,
        raw: &str,
        path: &str,
        bytes: &[u8],
    ) -> Result<(), WorkspaceError> {
        let (parent, name) = split(path);
        let dir =
            create_dir_all(self.fd(), parent).map_err(|error| parent_error("write", raw, error))?;
        write_atomic(dir.as_fd(), name, bytes).map_err(|error| match error.raw_os_error() {
            Some(code) if code == Errno::ISDIR.raw_os_error() => WorkspaceError::PathConflict {
                path: raw.to_owned(),
                reason: "a directory is there",
            },
            _ => WorkspaceError::io("write", raw, error),
        })
    }

    /// Deletes one validated path; `false` when nothing was there.
    fn delete_path(&self, raw: &str, path: &str) -> Result<bool, WorkspaceError> {
        let (parent, name) = split(path);
        let dir = match open_dir(self.fd(), parent) {
            Ok(dir) => dir,
            Err(Errno::NOENT | Errno::NOTDIR) => return Ok(false),
            Err(error) => return Err(parent_error("delete", raw, error)),
        };
        remove(dir.as_fd(), name).map_err(|error| match error {
            RemoveError::TooDeep => {
                WorkspaceError::too_large(Limit::Depth, None, None, beneath::MAX_DEPTH as u64)
            }
            RemoveError::Endless => WorkspaceError::io(
                "delete",
                raw,
                std::io::Error::other("the directory keeps refilling"),
            ),
            RemoveError::Os(error) => WorkspaceError::io("delete", raw, error.into()),
        })
    }
}

/// Two writes where one's path is a directory of the other's cannot both
/// succeed.
fn check_write_conflicts(writes: &[Write]) -> Result<(), WorkspaceError> {
    let paths: BTreeSet<&str> = writes.iter().map(|w| w.path.as_str()).collect();
    for write in writes {
        let mut prefix = write.path.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if paths.contains(parent) {
                return Err(WorkspaceError::PathConflict {
                    path: write.raw.clone(),
                    reason: "the change set also writes a file where its parent directory goes",
                });
            }
            prefix = parent;
        }
    }
    Ok(())
}

/// Maps a failure to open a parent directory.
pub(crate) fn parent_error(op: &'static str, raw: &str, error: Errno) -> WorkspaceError {
    match error {
        Errno::LOOP => WorkspaceError::SymlinkInPath {
            path: raw.to_owned(),
        },
        Errno::NOTDIR => WorkspaceError::PathConflict {
            path: raw.to_owned(),
            reason: "a parent is not a directory",
        },
        Errno::XDEV => WorkspaceError::InvalidPath {
            path: raw.to_owned(),
        },
        Errno::NOENT => WorkspaceError::NotFound {
            path: raw.to_owned(),
        },
        error => WorkspaceError::io(op, raw, error.into()),
    }
}
