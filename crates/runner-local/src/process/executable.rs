//! Finding the program a session runs, the way a shell would: a name with a
//! `/` is a path, anything else is looked up on `PATH`.
//!
//! We resolve it ourselves instead of leaving it to the PTY library because
//! that library resolves relative paths against the *workload's* directory and
//! reports a missing program as a multi-line spawn error; the probe and the
//! start failure need one clear sentence instead.
//!
//! A [`FileStamp`] is what `stat` says of a program: what notices that it
//! was replaced.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The absolute path of `program`, or `None` when no executable file of that
/// name exists. A relative path containing `/` is taken relative to the
/// runner's working directory.
pub fn resolve_executable(program: &str, search_path: &str) -> Option<PathBuf> {
    if program.is_empty() {
        return None;
    }
    if program.contains('/') {
        let path = std::path::absolute(program).ok()?;
        return is_executable_file(&path).then_some(path);
    }
    std::env::split_paths(search_path)
        // An empty PATH entry means "the current directory" to a shell, which
        // for a runner would be wherever it happened to be started: skip it.
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable_file(candidate))
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// One file as `stat` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    pub path: PathBuf,
    pub len: u64,
    pub mtime: (i64, i64),
    pub dev: u64,
    pub inode: u64,
}

impl FileStamp {
    /// The stamp of what `path` names (through symlinks, so re-pointing a
    /// link changes it); `None` when it cannot be read.
    pub fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            path: path.to_owned(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            dev: meta.dev(),
            inode: meta.ino(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write_file(path: &Path, mode: u32) {
        fs::write(path, "#!/bin/sh\n").unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_bare_name_is_found_on_the_search_path_in_order() {
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        write_file(&first.path().join("telo"), 0o644);
        write_file(&second.path().join("telo"), 0o755);
        let search = format!(
            "relative/dir::{}:{}",
            first.path().display(),
            second.path().display()
        );
        assert_eq!(
            resolve_executable("telo", &search),
            Some(second.path().join("telo"))
        );
        assert_eq!(resolve_executable("nope", &search), None);
    }

    #[test]
    fn a_path_must_name_an_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("telo");
        write_file(&exe, 0o755);
        let plain = dir.path().join("plain");
        write_file(&plain, 0o644);
        let exe_str = exe.to_str().unwrap();
        assert_eq!(resolve_executable(exe_str, ""), Some(exe.clone()));
        assert_eq!(resolve_executable(plain.to_str().unwrap(), ""), None);
        assert_eq!(resolve_executable(dir.path().to_str().unwrap(), ""), None);
        assert_eq!(resolve_executable("/no/such/telo", "/usr/bin"), None);
        assert_eq!(resolve_executable("", "/usr/bin"), None);
    }

    #[test]
    fn a_directory_on_the_path_is_not_a_program() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("telo")).unwrap();
        assert_eq!(
            resolve_executable("telo", dir.path().to_str().unwrap()),
            None
        );
    }
}
