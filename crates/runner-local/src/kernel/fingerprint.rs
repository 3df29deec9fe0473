//! A cheap identity of the kernel sessions would run: the resolved Telo CLI
//! and the first `node` on the workload `PATH`, each as its path plus size,
//! modification time and inode. The self-check costs a kernel start (~1.4 s),
//! so it runs once per fingerprint; a few `stat` calls per probe and per start
//! are what notices an upgrade (or a broken install) without a restart.

use std::path::Path;

use crate::process::executable::{FileStamp, resolve_executable};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFingerprint {
    /// `None`: the Telo CLI was not found.
    pub telo: Option<FileStamp>,
    /// `None`: no `node` on the workload `PATH` (a wrapper may bring its own).
    pub node: Option<FileStamp>,
}

impl KernelFingerprint {
    pub fn take(telo: &str, search_path: &str) -> Self {
        let stamp = |program: &str| {
            resolve_executable(program, search_path).and_then(|path| FileStamp::of(&path))
        };
        Self {
            telo: stamp(telo),
            node: stamp("node"),
        }
    }

    /// The resolved Telo CLI, when there is one.
    pub fn telo_path(&self) -> Option<&Path> {
        self.telo.as_ref().map(|stamp| stamp.path.as_path())
    }

    pub fn node_path(&self) -> Option<&Path> {
        self.node.as_ref().map(|stamp| stamp.path.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn write_exe(path: &Path, body: &str) {
        fs::write(path, body).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Writes a new file and renames it over `path`, as an installer does.
    fn replace_exe(path: &Path, body: &str) {
        let fresh = path.with_extension("new");
        write_exe(&fresh, body);
        fs::rename(&fresh, path).unwrap();
    }

    fn search(dirs: &[&Path]) -> String {
        std::env::join_paths(dirs).unwrap().into_string().unwrap()
    }

    #[test]
    fn an_untouched_kernel_keeps_its_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        write_exe(&dir.path().join("telo"), "#!/bin/sh\n");
        write_exe(&dir.path().join("node"), "#!/bin/sh\n");
        let path = search(&[dir.path()]);
        let first = KernelFingerprint::take("telo", &path);
        assert!(first.telo.is_some() && first.node.is_some());
        assert_eq!(first, KernelFingerprint::take("telo", &path));
    }

    #[test]
    fn replacing_the_telo_cli_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let telo = dir.path().join("telo");
        write_exe(&telo, "#!/bin/sh\nexit 0\n");
        let path = search(&[dir.path()]);
        let before = KernelFingerprint::take(telo.to_str().unwrap(), &path);
        // Same length, new inode: only a rename tells them apart.
        replace_exe(&telo, "#!/bin/sh\nexit 1\n");
        let after = KernelFingerprint::take(telo.to_str().unwrap(), &path);
        assert_ne!(before, after);
        assert_eq!(before.telo_path(), after.telo_path());
    }

    #[test]
    fn rewriting_the_telo_cli_in_place_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let telo = dir.path().join("telo");
        write_exe(&telo, "#!/bin/sh\n");
        let before = KernelFingerprint::take(telo.to_str().unwrap(), "");
        fs::write(&telo, "#!/bin/sh\necho upgraded\n").unwrap();
        assert_ne!(before, KernelFingerprint::take(telo.to_str().unwrap(), ""));
    }

    #[test]
    fn a_node_appearing_earlier_on_the_path_changes_the_fingerprint() {
        let early = tempfile::tempdir().unwrap();
        let late = tempfile::tempdir().unwrap();
        write_exe(&late.path().join("telo"), "#!/bin/sh\n");
        write_exe(&late.path().join("node"), "#!/bin/sh\n");
        let path = search(&[early.path(), late.path()]);
        let before = KernelFingerprint::take("telo", &path);
        assert_eq!(before.node_path(), Some(late.path().join("node").as_path()));
        write_exe(&early.path().join("node"), "#!/bin/sh\n");
        let after = KernelFingerprint::take("telo", &path);
        assert_ne!(before, after);
        assert_eq!(after.node_path(), Some(early.path().join("node").as_path()));
    }

    #[test]
    fn a_missing_telo_cli_or_node_is_part_of_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let path = search(&[dir.path()]);
        let nothing = KernelFingerprint::take("telo", &path);
        assert_eq!(
            nothing,
            KernelFingerprint {
                telo: None,
                node: None
            }
        );
        write_exe(&dir.path().join("telo"), "#!/bin/sh\n");
        assert_ne!(nothing, KernelFingerprint::take("telo", &path));
    }
}
