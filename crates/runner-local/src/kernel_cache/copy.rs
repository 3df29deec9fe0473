//! A session's own copy of a warmed cache: every file copied, every
//! symlink made again as it was, nothing shared with the original.
//!
//! Not hard links: a linked file is the shared file, and its owner — the
//! runner's user, which a sandboxed workload is too — may `chmod` a
//! read-only file and write it (tried under bubblewrap 0.8: the shared copy
//! changed). Not an overlay mount either: bubblewrap 0.8 (Debian 12) has no
//! `--overlay`. A copy costs what the warmed cache holds; see
//! [`super::SEED_SHARE_OF_DISK_BOUND`] for the bound on that.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the warmed cache holds more than the {budget} bytes a session may take of it")]
    OverBudget { budget: u64 },
    #[error("could not copy '{}'", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Copies the tree at `from` to `to` (which must not exist), never
/// following a symlink; stops once more than `budget` bytes of files were
/// copied. Returns the bytes copied. On failure `to` is left as far as it
/// got: the caller removes it.
pub fn copy_tree(from: &Path, to: &Path, budget: u64) -> Result<u64, CopyError> {
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| CopyError::Io { path, source }
    };
    let mut copied = 0u64;
    let mut pending = vec![(from.to_owned(), to.to_owned())];
    while let Some((from_dir, to_dir)) = pending.pop() {
        std::fs::create_dir(&to_dir).map_err(io_error(&to_dir))?;
        let entries = std::fs::read_dir(&from_dir).map_err(io_error(&from_dir))?;
        for entry in entries {
            let entry = entry.map_err(io_error(&from_dir))?;
            let source = entry.path();
            let target = to_dir.join(entry.file_name());
            let kind = entry.file_type().map_err(io_error(&source))?;
            if kind.is_dir() {
                pending.push((source, target));
            } else if kind.is_symlink() {
                let link = std::fs::read_link(&source).map_err(io_error(&source))?;
                std::os::unix::fs::symlink(&link, &target).map_err(io_error(&target))?;
            } else if kind.is_file() {
                let len = entry.metadata().map_err(io_error(&source))?.len();
                copied = copied.saturating_add(len);
                if copied > budget {
                    return Err(CopyError::OverBudget { budget });
                }
                std::fs::copy(&source, &target).map_err(io_error(&source))?;
            }
            // Sockets, pipes and devices are nothing a kernel caches.
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("entry");
        std::fs::create_dir_all(root.join("telo/controller-src/k/node_modules/@telorun")).unwrap();
        std::fs::write(root.join("telo/controller-src/k/bundle.mjs"), "export {}").unwrap();
        std::os::unix::fs::symlink(
            "../../../../../../opt/telo/sdk",
            root.join("telo/controller-src/k/node_modules/@telorun/sdk"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("npm")).unwrap();
        dir
    }

    #[test]
    fn files_are_copied_and_symlinks_made_again_as_they_were() {
        let dir = tree();
        let to = dir.path().join("copy");
        let copied = copy_tree(&dir.path().join("entry"), &to, 1 << 20).unwrap();
        assert_eq!(copied, "export {}".len() as u64);
        assert_eq!(
            std::fs::read_to_string(to.join("telo/controller-src/k/bundle.mjs")).unwrap(),
            "export {}"
        );
        assert_eq!(
            std::fs::read_link(to.join("telo/controller-src/k/node_modules/@telorun/sdk")).unwrap(),
            Path::new("../../../../../../opt/telo/sdk")
        );
        assert!(to.join("npm").is_dir());
        // A write to the copy leaves the original alone.
        std::fs::write(to.join("telo/controller-src/k/bundle.mjs"), "changed").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("entry/telo/controller-src/k/bundle.mjs"))
                .unwrap(),
            "export {}"
        );
    }

    #[test]
    fn a_tree_past_the_budget_is_refused() {
        let dir = tree();
        let to = dir.path().join("copy");
        assert!(matches!(
            copy_tree(&dir.path().join("entry"), &to, 3),
            Err(CopyError::OverBudget { budget: 3 })
        ));
    }
}
