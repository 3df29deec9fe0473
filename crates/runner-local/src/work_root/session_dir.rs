//! Each session's private directory: `<root>/<sessionId>/app` holds the bundle
//! and is the workload's working directory, `<root>/<sessionId>/home` is its
//! `HOME`, so nothing a workload writes lands in another session or in the
//! runner's own home. A watch session's co-resident agent has a home of its
//! own beside them (`agent-home`), which no app of the session is shown.

use std::io;
use std::path::{Path, PathBuf};

use runner_core::bundle_path::{InvalidBundlePath, normalize_bundle_path};
use runner_core::ids::is_session_id;
use runner_core::types::RunBundle;
use tracing::{info, warn};

#[derive(Debug, thiserror::Error)]
pub enum WorkDirError {
    #[error("invalid session id '{0}'")]
    InvalidSessionId(String),
    /// The path stays out of the message (which reaches clients); the log
    /// gets it through `Debug`.
    #[error("could not create the session's work directory")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// As for the directory: the path stays in the log.
    #[error("could not create the session's kernel cache")]
    CreateKernelCache {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    InvalidBundlePath(#[from] InvalidBundlePath),
    #[error("could not write bundle file '{relative_path}'")]
    WriteFile {
        relative_path: String,
        #[source]
        source: io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkDir {
    root: PathBuf,
}

impl WorkDir {
    /// The session's directory under `work_root`. Only ids of the shape the
    /// registry generates are accepted, so an id can never name a path
    /// outside the root.
    pub fn for_session(work_root: &Path, session_id: &str) -> Result<Self, WorkDirError> {
        if !is_session_id(session_id) {
            return Err(WorkDirError::InvalidSessionId(session_id.to_owned()));
        }
        Ok(Self {
            root: work_root.join(session_id),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The workload's working directory, holding the bundle.
    pub fn app(&self) -> PathBuf {
        self.root.join("app")
    }

    /// The workload's `HOME`.
    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    /// The session kernel's own cache (see `kernel_cache`): inside the
    /// session's directory, so it counts against its disk bound and goes
    /// with it.
    pub fn kernel_cache(&self) -> PathBuf {
        self.root.join(crate::kernel_cache::SESSION_CACHE_DIR_NAME)
    }

    /// The `HOME` of a watch session's co-resident agent. Not the apps'
    /// `home`: an app that could write there planted a `~/.gitconfig`
    /// (`core.fsmonitor`) and a Python `usercustomize.py` that the agent's
    /// `git status` and `python3` then ran with the operator's secrets in
    /// their environment.
    pub fn agent_home(&self) -> PathBuf {
        self.root.join("agent-home")
    }

    /// Creates [`WorkDir::agent_home`], private to the runner's user; an
    /// existing one (a resumed session's) is kept.
    pub fn create_agent_home(&self) -> Result<PathBuf, WorkDirError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.agent_home();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| WorkDirError::CreateDir {
                path: dir.clone(),
                source,
            })?;
        Ok(dir)
    }

    /// Creates the (empty) `app` and `home` directories, private to the
    /// runner's user.
    pub fn create(&self) -> Result<(), WorkDirError> {
        use std::os::unix::fs::DirBuilderExt;
        for dir in [self.root.clone(), self.app(), self.home()] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|source| WorkDirError::CreateDir { path: dir, source })?;
        }
        Ok(())
    }

    /// Writes every bundle file under `app`, creating parent directories.
    /// Paths are checked again here even though the core already did: this
    /// is the place where a traversal would do harm.
    pub fn write_bundle(&self, bundle: &RunBundle) -> Result<(), WorkDirError> {
        let app = self.app();
        for file in &bundle.files {
            let relative = normalize_bundle_path(&file.relative_path)?;
            let target = app.join(&relative);
            let write_error = |source| WorkDirError::WriteFile {
                relative_path: relative.clone(),
                source,
            };
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(write_error)?;
            }
            std::fs::write(&target, &file.contents).map_err(write_error)?;
        }
        Ok(())
    }

    /// Removes the directory and everything in it; a missing one is fine.
    /// Blocks for as long as that takes (a big bundle's thousands of files).
    pub fn remove(&self) {
        remove_dir(&self.root);
    }

    /// Takes the directory away at once and removes it in the background:
    /// renamed to a name no session can have (so the session's directory is
    /// gone when this returns), then deleted on Tokio's blocking pool —
    /// never on the async runtime, where deleting a 23,500-file bundle
    /// stalled every other request. Without a runtime it is deleted here.
    pub fn discard(&self) {
        let Some(parent) = self.root.parent() else {
            return;
        };
        let name = self.root.file_name().unwrap_or_default().to_string_lossy();
        let trash = parent.join(format!("{TRASH_PREFIX}{name}-{}", trash_suffix()));
        match std::fs::rename(&self.root, &trash) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => return,
            Err(err) => {
                warn!(dir = %self.root.display(), error = %err, "could not move a session work directory aside; removing it in place");
                self.remove();
                return;
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // Not joined, on purpose: the directory is already out of
                // every session's way, and one a runner exits before removing
                // keeps its trash name, which the next boot sweep removes.
                runtime.spawn_blocking(move || with_bulk_file_work(|| remove_dir(&trash)));
            }
            Err(_) => {
                remove_dir(&trash);
            }
        }
    }
}

/// Runs `work` — writing or removing a whole bundle's files — once fewer
/// than [`bulk_file_workers`] others do. Off the async runtime is not
/// enough on a small machine: six 23,500-file bundles written at once by
/// six blocking threads left the runtime's threads a quarter of two cores,
/// and `/livez` waited ~0.8 s as it had when the writes ran on the runtime.
/// Callers are on Tokio's blocking pool, where waiting costs no CPU.
pub fn with_bulk_file_work<T>(work: impl FnOnce() -> T) -> T {
    use std::sync::{Condvar, Mutex, OnceLock};
    static RUNNING: OnceLock<(Mutex<usize>, Condvar)> = OnceLock::new();
    let (running, done) = RUNNING.get_or_init(|| (Mutex::new(0), Condvar::new()));
    let limit = bulk_file_workers();
    {
        let mut count = running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while *count >= limit {
            count = done
                .wait(count)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *count += 1;
    }
    struct Release<'a>(&'a Mutex<usize>, &'a Condvar);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            let mut count = self
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            *count -= 1;
            self.1.notify_one();
        }
    }
    let _release = Release(running, done);
    work()
}

/// How many bundles' files are written or removed at once: all cores but
/// one, which stays the async runtime's; at least one.
pub fn bulk_file_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |cores| cores.get().saturating_sub(1))
        .max(1)
}

/// A watch session's record beside its workspace: a directory holding one
/// is a kept session, which the boot sweep leaves alone.
pub const RECORD_FILE: &str = "watch.json";

/// Names of directories being deleted (see [`WorkDir::discard`]); a dot
/// first, so never a session id. The boot sweep removes what a runner that
/// died mid-delete left.
pub const TRASH_PREFIX: &str = ".removing-";

fn trash_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn remove_dir(dir: &Path) -> bool {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => true,
        Err(err) if err.kind() == io::ErrorKind::NotFound => false,
        Err(err) => {
            warn!(dir = %dir.display(), error = %err, "could not remove a session work directory");
            false
        }
    }
}

/// Boot sweep: removes every session directory left under `work_root` by a
/// previous runner process (the registry is empty at boot, so none of them
/// belongs to a live session). Only entries named like a session id are
/// touched, so a root pointed at a directory holding other data loses
/// nothing else. Returns how many directories were removed.
pub fn sweep_work_root(work_root: &Path) -> usize {
    let entries = match std::fs::read_dir(work_root) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return 0,
        Err(err) => {
            warn!(dir = %work_root.display(), error = %err, "could not list the session work root");
            return 0;
        }
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_session_dir = name
            .to_str()
            .is_some_and(|name| is_session_id(name) || name.starts_with(TRASH_PREFIX))
            && entry.file_type().is_ok_and(|kind| kind.is_dir());
        if !is_session_dir {
            continue;
        }
        let path = entry.path();
        // A watch session's directory is its checkpoint: the registry
        // lists it suspended and a resume starts from it.
        if path.join(RECORD_FILE).is_file() {
            continue;
        }
        if remove_dir(&path) {
            info!(dir = %path.display(), "removed a work directory left by a previous run");
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_core::types::BundleFile;

    const ID: &str = "abcdefgh2345";

    fn bundle(paths: &[&str]) -> RunBundle {
        RunBundle {
            entry_relative_path: paths[0].to_owned(),
            files: paths
                .iter()
                .map(|p| BundleFile {
                    relative_path: (*p).to_owned(),
                    contents: format!("contents of {p}"),
                })
                .collect(),
        }
    }

    #[test]
    fn only_generated_session_ids_name_a_directory() {
        let root = Path::new("/tmp/root");
        for bad in ["..", "../abcdefgh2345", "abc/defgh234", "ABCDEFGH2345", ""] {
            assert!(
                matches!(
                    WorkDir::for_session(root, bad),
                    Err(WorkDirError::InvalidSessionId(_))
                ),
                "{bad:?}"
            );
        }
        let dir = WorkDir::for_session(root, ID).unwrap();
        assert_eq!(dir.app(), Path::new("/tmp/root/abcdefgh2345/app"));
        assert_eq!(dir.home(), Path::new("/tmp/root/abcdefgh2345/home"));
        assert_eq!(
            dir.agent_home(),
            Path::new("/tmp/root/abcdefgh2345/agent-home")
        );
    }

    #[test]
    fn bundle_files_are_written_under_app_with_their_parents() {
        let root = tempfile::tempdir().unwrap();
        let dir = WorkDir::for_session(root.path(), ID).unwrap();
        dir.create().unwrap();
        dir.write_bundle(&bundle(&[
            "/app/telo.yaml",
            "lib/deep/x.yaml",
            "a/../b.yaml",
        ]))
        .unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.app().join(p)).unwrap();
        assert_eq!(read("app/telo.yaml"), "contents of /app/telo.yaml");
        assert_eq!(read("lib/deep/x.yaml"), "contents of lib/deep/x.yaml");
        assert_eq!(read("b.yaml"), "contents of a/../b.yaml");
        assert!(dir.home().is_dir());
    }

    #[test]
    fn a_traversing_path_is_refused_and_nothing_escapes() {
        let root = tempfile::tempdir().unwrap();
        let dir = WorkDir::for_session(root.path(), ID).unwrap();
        dir.create().unwrap();
        let err = dir
            .write_bundle(&bundle(&["ok.yaml", "../../escape.yaml"]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid bundle relativePath '../../escape.yaml'"
        );
        assert!(!root.path().join("escape.yaml").exists());
    }

    #[test]
    fn remove_deletes_the_whole_session_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = WorkDir::for_session(root.path(), ID).unwrap();
        dir.create().unwrap();
        dir.write_bundle(&bundle(&["a/b.yaml"])).unwrap();
        dir.remove();
        assert!(!dir.root().exists());
        // Removing twice is fine.
        dir.remove();
    }

    #[test]
    fn the_sweep_removes_session_directories_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        for id in ["abcdefgh2345", "zzzzzzzz7777"] {
            let dir = WorkDir::for_session(root.path(), id).unwrap();
            dir.create().unwrap();
            dir.write_bundle(&bundle(&["x.yaml"])).unwrap();
        }
        std::fs::create_dir(root.path().join("keep-me")).unwrap();
        std::fs::write(root.path().join("mnopqrstuvwx"), "a file, not a dir").unwrap();
        assert_eq!(sweep_work_root(root.path()), 2);
        let mut left: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["keep-me", "mnopqrstuvwx"]);
    }

    #[test]
    fn a_discarded_directory_is_gone_at_once_and_removed_in_the_background() {
        let root = tempfile::tempdir().unwrap();
        let dir = WorkDir::for_session(root.path(), ID).unwrap();
        dir.create().unwrap();
        dir.write_bundle(&bundle(&["a/b.yaml", "c.yaml"])).unwrap();
        dir.discard();
        assert!(!dir.root().exists());
        // No runtime here: the removal was done in place.
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
        dir.discard();
    }

    #[test]
    fn the_sweep_finishes_removals_a_previous_runner_left() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(".removing-abcdefgh2345-0/app")).unwrap();
        std::fs::create_dir_all(root.path().join(".kernel-cache")).unwrap();
        assert_eq!(sweep_work_root(root.path()), 1);
        assert!(root.path().join(".kernel-cache").is_dir());
        assert!(!root.path().join(".removing-abcdefgh2345-0").exists());
    }

    #[test]
    fn sweeping_a_missing_root_is_a_no_op() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(sweep_work_root(&root.path().join("absent")), 0);
    }
}
