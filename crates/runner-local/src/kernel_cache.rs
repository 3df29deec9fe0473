//! The Telo kernel's cache that every local bundle session shares, under the
//! runner's work root: `<work root>/.kernel-cache/telo` (`TELO_CACHE_DIR`) and
//! `<work root>/.kernel-cache/npm` (`npm_config_cache`).
//!
//! Without it each session's kernel cached beside its own entry manifest, in
//! a directory deleted with the session, so every session rebuilt the same
//! controllers from source (`source-build…` on the console) and re-ran the
//! same schema compilation: http-hello listened ~0.6 s later than with a warm
//! cache.
//!
//! Sharing one directory between concurrent kernels is safe with the Telo CLI
//! 0.81 kernel, which is written for it (several kernels per cache is its own
//! test-suite setup):
//! - controller bundles (`controller-src/`), their shims, and analysis stamps
//!   are written to a private `<file>.<pid>.<n>.tmp` and renamed into place,
//!   the index last, so a reader sees a whole file or none; keys are content
//!   hashes, so racing writers write identical bytes;
//! - compiled validators (`validators/`) are written in place, but each starts
//!   with a sha256 of its body that is checked on load: a torn file reads as
//!   a miss and is recompiled;
//! - npm install roots (`npm/<hash>/`) are only changed under a cross-process
//!   directory lock (`<root>/.lock`, reclaimed when its holder stops
//!   refreshing it for 30 s), and a lost symlink race (`EEXIST`) is tolerated;
//!   npm's own cache is content-addressed and safe to share.
//!
//! Checked against the real kernel: 5 rounds of 12 concurrent `telo run`s
//! (4 each of hello-world, javascript and a self-contained bundle) and 3 rounds of 4
//! concurrent http-hello servers (the npm install path), each round on an
//! empty cache, all succeeded with the expected output. So the first sessions
//! fill the cache together; nothing here serializes them.
//!
//! The cache lives under the work root, so runners with different roots never
//! share one, and its name is not a session id, so the boot sweep keeps it.
//! It is the one writable place Telo sessions share: each session's sandbox
//! shows it read-write beside the session's own directory, and nothing else
//! of the work root. It holds nothing of the runner (no secret is ever
//! written there), but a session can leave files in it that a later
//! session's kernel loads — so one runner's sessions trust each other's
//! kernels with the cache, and mutually untrusted users need separate
//! runners (the price of not rebuilding every controller for every session).

use std::io;
use std::path::{Path, PathBuf};

/// The cache's directory name under the work root. Starts with a dot, so it
/// can never be a session id (which the boot sweep deletes).
pub const KERNEL_CACHE_DIR_NAME: &str = ".kernel-cache";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    root: PathBuf,
}

impl KernelCache {
    pub fn under(work_root: &Path) -> Self {
        Self {
            root: work_root.join(KERNEL_CACHE_DIR_NAME),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `TELO_CACHE_DIR`: the kernel keeps `analysis/`, `validators/`,
    /// `controller-src/`, `manifests/` and `npm/` install roots here.
    pub fn telo_dir(&self) -> PathBuf {
        self.root.join("telo")
    }

    /// `npm_config_cache`: the downloads behind the kernel's `npm install`s,
    /// which would otherwise land in each session's own `HOME`.
    pub fn npm_dir(&self) -> PathBuf {
        self.root.join("npm")
    }

    /// Creates the cache directory, private to the runner's user like the
    /// session directories (the kernel creates what is inside).
    pub fn create(&self) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_core::ids::is_session_id;

    #[test]
    fn the_cache_lives_under_the_work_root() {
        let cache = KernelCache::under(Path::new("/var/lib/runner"));
        assert_eq!(
            cache.telo_dir(),
            Path::new("/var/lib/runner/.kernel-cache/telo")
        );
        assert_eq!(
            cache.npm_dir(),
            Path::new("/var/lib/runner/.kernel-cache/npm")
        );
    }

    #[test]
    fn the_cache_directory_can_never_be_mistaken_for_a_session() {
        assert!(!is_session_id(KERNEL_CACHE_DIR_NAME));
    }
}
