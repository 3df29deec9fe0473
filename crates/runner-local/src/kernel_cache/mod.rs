//! The Telo kernel's cache: every session's kernel writes only its own
//! copy, inside the session's directory; what sessions share is filled by
//! the runner alone and never shown to a session.
//!
//! The kernel caches what it builds — controller bundles (`controller-src/`),
//! compiled validators, analysis stamps, npm install roots — in
//! `TELO_CACHE_DIR`, and npm its downloads in `npm_config_cache`. Each
//! session's kernel gets both in `<session>/kernel-cache/{telo,npm}`
//! ([`SessionCache`]): counted against the session's disk bound
//! (`RUNNER_LOCAL_MAX_DISK`) and removed with its directory. A sandboxed
//! workload sees it at [`KERNEL_CACHE_MOUNT`], the same path in every
//! sandbox, because the kernel keys its npm install roots by where the
//! cache sits relative to the kernel: a copy seen at another path misses
//! them and installs again.
//!
//! Before, one directory under the work root was every session's cache,
//! read-write in every sandbox: a hostile session wrote 256 MiB there that
//! stayed for good, could leave a controller bundle that a later session's
//! kernel loaded, and the kernel's analysis stamps (keyed by each session's
//! own entry path) piled up with nothing to remove them.
//!
//! What sessions share is [`SharedKernelCache`]: complete caches warmed by
//! the runner, `<work root>/.kernel-cache/<key>/{telo,npm}`, one per kernel
//! and warm-up manifest ([`CacheKey`]). The runner fills one by running the
//! kernel on the operator's warm-up manifest
//! (`RUNNER_LOCAL_KERNEL_CACHE_WARM_UP`) in a sandbox of its own, into a
//! fresh directory that becomes the entry by one rename once the kernel
//! exited 0 — a warm-up that failed, timed out or was cut short by a crash
//! is never an entry, and the boot sweep removes what it left (see
//! `kernel::cache_warm_up`). A session started from an entry gets a copy
//! of it as its own cache ([`copy`]); the entry itself is in no sandbox.
//! Together the entries hold at most `RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES`:
//! the least recently used goes first ([`lru`]), where "used" is when a
//! session was last started from it, recorded by the runner as the entry
//! directory's modification time.
//!
//! A session that starts before its kernel's entry is ready, or without a
//! warm-up manifest, starts with an empty cache of its own: a cold start,
//! as every fresh cache is. The copy is bounded by a share of the
//! session's disk bound ([`SEED_SHARE_OF_DISK_BOUND`]); a larger entry is
//! not copied and the session starts cold. Without the sandbox
//! (`RUNNER_LOCAL_SANDBOX=none`) a kernel sees its copy where it lies, not
//! where the warm-up saw it, so it installs its npm controllers again.
//!
//! Measured with the real kernel (CLI 0.81, 2 shared cores): a cache
//! warmed for console, run, javascript and http-server holds 44 files and
//! directories, 0.5 MB, and is copied in ~7 ms; http-hello answered its
//! first request after 3.3–4.1 s cold and 2.3–2.7 s from the copy (medians
//! of 5, two runs of the ignored test
//! `real_kernel_http_hello_cold_and_warm_start_times`): the npm install and
//! source builds the copy spares.
//!
//! The work root holds the shared cache, so runners with different roots
//! never share one, and its name is not a session id, so the session sweep
//! keeps it.

pub mod copy;
pub mod key;
pub mod lru;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use runner_core::sync::lock;
use tracing::{info, warn};

pub use copy::CopyError;
pub use key::{CacheKey, KernelIdentity};
pub use lru::EntryUse;

/// The shared cache's directory name under the work root. Starts with a
/// dot, so it can never be a session id (which the boot sweep deletes).
pub const KERNEL_CACHE_DIR_NAME: &str = ".kernel-cache";
/// A session's own cache, inside its directory.
pub const SESSION_CACHE_DIR_NAME: &str = "kernel-cache";
/// Where a sandboxed kernel sees its cache: one path for every session and
/// every warm-up (see the module doc for why it must not move).
pub const KERNEL_CACHE_MOUNT: &str = "/var/cache/telo-kernel";
/// A session's copy of a warmed cache may take at most this fraction
/// (1/n) of its disk bound, so the copy alone never stops it.
pub const SEED_SHARE_OF_DISK_BOUND: u64 = 2;
/// `RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES`' default.
pub const DEFAULT_MAX_BYTES: &str = "512Mi";

/// A warm-up's directory while it runs; never an entry.
const WARMING_PREFIX: &str = ".warming-";
/// An evicted entry's name while it is removed.
const REMOVING_PREFIX: &str = ".removing-";

/// What the runner's shared cache is configured as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCacheConfig {
    /// `RUNNER_LOCAL_KERNEL_CACHE_WARM_UP`: the manifest each kernel's
    /// cache is warmed with; `None`: no warm-up, every session starts cold.
    pub warm_up: Option<PathBuf>,
    /// `RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES`.
    pub max_bytes: u64,
}

impl Default for KernelCacheConfig {
    fn default() -> Self {
        Self {
            warm_up: None,
            max_bytes: 512 << 20,
        }
    }
}

/// One session's own kernel cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionCache {
    host: PathBuf,
    seen_at: PathBuf,
}

/// How a session's cache was prepared.
#[derive(Debug)]
pub enum Seeded {
    /// A copy of a warmed cache, this many bytes of files.
    Warm(u64),
    /// Empty: no warmed cache was ready.
    Cold,
    /// Already there (a resumed watch session's own).
    Kept,
    /// Empty, because the warmed cache could not be copied.
    Refused(CopyError),
}

impl SessionCache {
    /// The cache at `host`, seen by the workload at [`KERNEL_CACHE_MOUNT`]
    /// when it is sandboxed, else where it is.
    pub fn new(host: PathBuf, sandboxed: bool) -> Self {
        let seen_at = if sandboxed {
            PathBuf::from(KERNEL_CACHE_MOUNT)
        } else {
            host.clone()
        };
        Self { host, seen_at }
    }

    /// Where it is on the host (what the sandbox binds).
    pub fn host_dir(&self) -> &Path {
        &self.host
    }

    /// `TELO_CACHE_DIR`, as the workload sees it.
    pub fn telo_dir(&self) -> PathBuf {
        self.seen_at.join("telo")
    }

    /// `npm_config_cache`, as the workload sees it: the downloads behind
    /// the kernel's `npm install`s, which would otherwise land in `HOME`.
    pub fn npm_dir(&self) -> PathBuf {
        self.seen_at.join("npm")
    }

    /// Fills the cache with a copy of `warmed` (at most `budget` bytes of
    /// it), or leaves it empty; one that exists already is kept.
    pub fn prepare(&self, warmed: Option<&EntryLease>, budget: u64) -> io::Result<Seeded> {
        if self.host.exists() {
            return Ok(Seeded::Kept);
        }
        if let Some(entry) = warmed {
            match copy::copy_tree(entry.dir(), &self.host, budget) {
                Ok(bytes) => return Ok(Seeded::Warm(bytes)),
                Err(err) => {
                    remove_tree(&self.host);
                    self.create_empty()?;
                    return Ok(Seeded::Refused(err));
                }
            }
        }
        self.create_empty()?;
        Ok(Seeded::Cold)
    }

    fn create_empty(&self) -> io::Result<()> {
        for dir in [self.host.join("telo"), self.host.join("npm")] {
            create_private_dir(&dir)?;
        }
        Ok(())
    }
}

/// The warmed caches sessions start from, under the work root.
#[derive(Debug)]
pub struct SharedKernelCache {
    root: PathBuf,
    max_bytes: u64,
    /// How many sessions are being started from each entry right now:
    /// those entries are never evicted.
    busy: Mutex<HashMap<String, usize>>,
}

/// An entry held while a session's copy of it is made.
#[derive(Debug)]
pub struct EntryLease {
    store: Arc<SharedKernelCache>,
    key: CacheKey,
    dir: PathBuf,
}

impl EntryLease {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn key(&self) -> &CacheKey {
        &self.key
    }
}

impl Drop for EntryLease {
    fn drop(&mut self) {
        let mut busy = lock(&self.store.busy);
        if let Some(count) = busy.get_mut(self.key.as_str()) {
            *count -= 1;
            if *count == 0 {
                busy.remove(self.key.as_str());
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error("could not make the warmed cache '{key}' an entry")]
    Rename {
        key: CacheKey,
        #[source]
        source: io::Error,
    },
    #[error(
        "the warmed cache '{key}' holds {bytes} bytes, more than RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES ({max_bytes}); it was not kept"
    )]
    TooLarge {
        key: CacheKey,
        bytes: u64,
        max_bytes: u64,
    },
}

impl SharedKernelCache {
    pub fn under(work_root: &Path, max_bytes: u64) -> Self {
        Self {
            root: work_root.join(KERNEL_CACHE_DIR_NAME),
            max_bytes,
            busy: Mutex::new(HashMap::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Where entry `key` is (whether or not it exists).
    pub fn entry_dir(&self, key: &CacheKey) -> PathBuf {
        self.root.join(key.as_str())
    }

    /// Creates the root, private to the runner's user.
    pub fn create(&self) -> io::Result<()> {
        create_private_dir(&self.root)
    }

    /// Boot: removes everything under the root that is not a complete
    /// entry — a warm-up or an eviction a previous runner did not finish,
    /// and what sessions wrote when this directory was their shared,
    /// writable cache — then evicts down to the bound. Returns how many
    /// were removed.
    pub fn sweep(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_entry = name.to_str().and_then(CacheKey::parse).is_some()
                && entry.file_type().is_ok_and(|kind| kind.is_dir());
            if is_entry {
                continue;
            }
            let path = entry.path();
            info!(path = %path.display(), "removed what is not a warmed cache from the kernel cache");
            remove_tree(&path);
            removed += 1;
        }
        removed + self.evict().len()
    }

    /// Entry `key`, if it is complete, held (never evicted) until the lease
    /// is dropped and recorded as used now.
    pub fn lease(self: &Arc<Self>, key: &CacheKey) -> Option<EntryLease> {
        let dir = self.entry_dir(key);
        let mut busy = lock(&self.busy);
        if !dir.is_dir() {
            return None;
        }
        if let Err(err) = mark_used(&dir) {
            warn!(entry = %key, error = %err, "could not record a kernel cache entry's use");
        }
        *busy.entry(key.as_str().to_owned()).or_default() += 1;
        Some(EntryLease {
            store: self.clone(),
            key: key.clone(),
            dir,
        })
    }

    /// A fresh directory name for a warm-up of `key`: no entry's.
    pub fn warming_dir(&self, key: &CacheKey) -> PathBuf {
        self.root.join(format!(
            "{WARMING_PREFIX}{key}-{}-{}",
            std::process::id(),
            next_suffix()
        ))
    }

    /// Makes `built` (a complete warm-up's cache) entry `key` by one
    /// rename, then evicts down to the bound. Returns the entry's size.
    pub fn promote(&self, built: &Path, key: &CacheKey) -> Result<u64, PromoteError> {
        let entry = self.entry_dir(key);
        if let Err(source) = std::fs::rename(built, &entry) {
            // Made meanwhile (by a runner before this one): that one stays.
            if entry.is_dir() {
                remove_tree(built);
            } else {
                return Err(PromoteError::Rename {
                    key: key.clone(),
                    source,
                });
            }
        }
        if let Err(err) = mark_used(&entry) {
            warn!(entry = %key, error = %err, "could not record a kernel cache entry's use");
        }
        let bytes = crate::disk_bound::usage(&entry);
        if self.evict().iter().any(|name| name == key.as_str()) {
            return Err(PromoteError::TooLarge {
                key: key.clone(),
                bytes,
                max_bytes: self.max_bytes,
            });
        }
        Ok(bytes)
    }

    /// Every complete entry, with its size and last use.
    pub fn entries(&self) -> Vec<EntryUse> {
        let Ok(listing) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        listing
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_str().and_then(CacheKey::parse)?;
                let meta = entry.metadata().ok().filter(|meta| meta.is_dir())?;
                Some(EntryUse {
                    name: name.as_str().to_owned(),
                    last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    bytes: crate::disk_bound::usage(&entry.path()),
                })
            })
            .collect()
    }

    /// Removes the least recently used entries until the rest hold at most
    /// the bound, leaving those a session is being started from. Returns
    /// the names removed.
    pub fn evict(&self) -> Vec<String> {
        // Measured outside the lock: a walk of every entry must not hold up
        // session starts.
        let entries = self.entries();
        let mut doomed = Vec::new();
        {
            let busy = lock(&self.busy);
            for name in lru::evictions(&entries, self.max_bytes, |name| busy.contains_key(name)) {
                // Out of every lease's way at once; deleted after.
                let trash = self
                    .root
                    .join(format!("{REMOVING_PREFIX}{name}-{}", next_suffix()));
                match std::fs::rename(self.root.join(&name), &trash) {
                    Ok(()) => doomed.push((name, trash)),
                    Err(err) => {
                        warn!(entry = %name, error = %err, "could not evict a kernel cache entry");
                    }
                }
            }
        }
        for (name, trash) in &doomed {
            info!(entry = %name, "evicted the least recently used kernel cache entry");
            remove_tree(trash);
        }
        doomed.into_iter().map(|(name, _)| name).collect()
    }
}

/// Records "used now" as the entry directory's modification time: the
/// runner's own record, since no session ever sees the directory.
fn mark_used(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.set_modified(SystemTime::now())
}

pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

pub(crate) fn remove_tree(path: &Path) {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(err) => Err(err),
    };
    match removed {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => {
            warn!(path = %path.display(), error = %err, "could not remove from the kernel cache")
        }
    }
}

fn next_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_core::ids::is_session_id;
    use std::time::Duration;

    fn key(name: &str) -> CacheKey {
        CacheKey::parse(&format!("kernel-{name}-0123456789abcdef")).unwrap()
    }

    /// An entry of `bytes` bytes last used `age` ago.
    fn plant(store: &SharedKernelCache, key: &CacheKey, bytes: usize, age: Duration) {
        let dir = store.entry_dir(key);
        std::fs::create_dir_all(dir.join("telo")).unwrap();
        std::fs::write(dir.join("telo/bundle.mjs"), vec![b'x'; bytes]).unwrap();
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
    }

    #[test]
    fn the_shared_cache_lives_under_the_work_root_and_can_never_be_mistaken_for_a_session() {
        let store = SharedKernelCache::under(Path::new("/var/lib/runner"), 1);
        assert_eq!(store.root(), Path::new("/var/lib/runner/.kernel-cache"));
        assert!(!is_session_id(KERNEL_CACHE_DIR_NAME));
    }

    #[test]
    fn a_sandboxed_session_sees_its_cache_at_one_fixed_path() {
        let cache = SessionCache::new(PathBuf::from("/w/abcdefgh2345/kernel-cache"), true);
        assert_eq!(cache.telo_dir(), Path::new("/var/cache/telo-kernel/telo"));
        assert_eq!(cache.npm_dir(), Path::new("/var/cache/telo-kernel/npm"));
        assert_eq!(cache.host_dir(), Path::new("/w/abcdefgh2345/kernel-cache"));
        let unsandboxed = SessionCache::new(PathBuf::from("/w/abcdefgh2345/kernel-cache"), false);
        assert_eq!(
            unsandboxed.telo_dir(),
            Path::new("/w/abcdefgh2345/kernel-cache/telo")
        );
    }

    #[test]
    fn the_sweep_keeps_complete_entries_only() {
        let root = tempfile::tempdir().unwrap();
        let store = SharedKernelCache::under(root.path(), 1 << 30);
        let kept = key("0.81.0");
        plant(&store, &kept, 10, Duration::ZERO);
        for leftover in [
            "telo/controller-src/planted",
            "npm/_cacache",
            ".warming-kernel-0.81.0-0123456789abcdef-7-0/telo",
            ".removing-kernel-0.80.0-0123456789abcdef-3",
        ] {
            std::fs::create_dir_all(store.root().join(leftover)).unwrap();
        }
        std::fs::write(store.root().join("kernel-0.1.0-0123456789abcdef"), "a file").unwrap();
        assert_eq!(store.sweep(), 5);
        let left: Vec<String> = std::fs::read_dir(store.root())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, [kept.as_str()]);
    }

    #[test]
    fn eviction_keeps_the_most_recently_used_within_the_bound() {
        let root = tempfile::tempdir().unwrap();
        let store = Arc::new(SharedKernelCache::under(root.path(), 100 << 10));
        let (old, older, recent) = (key("1.0.0"), key("2.0.0"), key("3.0.0"));
        plant(&store, &old, 40 << 10, Duration::from_secs(20));
        plant(&store, &older, 40 << 10, Duration::from_secs(30));
        plant(&store, &recent, 40 << 10, Duration::from_secs(10));
        // Using the oldest makes it the most recent.
        drop(store.lease(&older).unwrap());
        assert_eq!(store.evict(), [old.as_str()]);
        assert!(store.entry_dir(&older).is_dir());
        assert!(store.entry_dir(&recent).is_dir());
    }

    #[test]
    fn an_entry_a_session_is_being_started_from_is_never_evicted() {
        let root = tempfile::tempdir().unwrap();
        let store = Arc::new(SharedKernelCache::under(root.path(), 0));
        let held = key("1.0.0");
        plant(&store, &held, 10, Duration::from_secs(60));
        let lease = store.lease(&held).unwrap();
        assert!(store.evict().is_empty());
        drop(lease);
        assert_eq!(store.evict(), [held.as_str()]);
        assert!(store.lease(&held).is_none());
    }

    #[test]
    fn a_warmed_cache_larger_than_the_bound_is_not_kept() {
        let root = tempfile::tempdir().unwrap();
        let store = SharedKernelCache::under(root.path(), 1 << 10);
        store.create().unwrap();
        let built = root.path().join("built");
        std::fs::create_dir_all(built.join("telo")).unwrap();
        std::fs::write(built.join("telo/big"), vec![0u8; 64 << 10]).unwrap();
        let big = key("1.0.0");
        assert!(matches!(
            store.promote(&built, &big),
            Err(PromoteError::TooLarge { .. })
        ));
        assert!(!store.entry_dir(&big).exists());
    }

    #[test]
    fn a_session_cache_is_a_copy_of_the_entry_or_empty_and_an_existing_one_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let store = Arc::new(SharedKernelCache::under(root.path(), 1 << 30));
        let warm = key("1.0.0");
        plant(&store, &warm, 100, Duration::ZERO);
        let lease = store.lease(&warm).unwrap();
        for session in ["s1", "s2", "s3"] {
            std::fs::create_dir(root.path().join(session)).unwrap();
        }

        let copied = SessionCache::new(root.path().join("s1/kernel-cache"), true);
        assert!(matches!(
            copied.prepare(Some(&lease), 1 << 20).unwrap(),
            Seeded::Warm(100)
        ));
        assert!(copied.host_dir().join("telo/bundle.mjs").is_file());

        let too_big = SessionCache::new(root.path().join("s2/kernel-cache"), true);
        assert!(matches!(
            too_big.prepare(Some(&lease), 10).unwrap(),
            Seeded::Refused(_)
        ));
        assert!(too_big.host_dir().join("telo").is_dir());
        assert!(!too_big.host_dir().join("telo/bundle.mjs").exists());

        let cold = SessionCache::new(root.path().join("s3/kernel-cache"), true);
        assert!(matches!(cold.prepare(None, 1 << 20).unwrap(), Seeded::Cold));
        assert!(cold.host_dir().join("npm").is_dir());
        assert!(matches!(
            cold.prepare(Some(&lease), 1 << 20).unwrap(),
            Seeded::Kept
        ));
    }
}
