//! The disk bound of a session's directory (`RUNNER_LOCAL_MAX_DISK`).
//!
//! A size-limited tmpfs per session would be exact, but the directory must
//! be the runner's to write (the bundle, a watch session's workspace) and
//! to read from outside the sandbox, and a tmpfs is memory. So the bound is
//! kept by a check: `RLIMIT_FSIZE` stops any one file at the bound at once,
//! and the directory as a whole is measured every [`DISK_CHECK_EVERY`]; a
//! session found past it is stopped and fails saying so. Between two
//! checks a workload can write past the bound by what it writes in that
//! time, in files of at most the bound each.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a session's directory is measured.
pub const DISK_CHECK_EVERY: Duration = Duration::from_secs(1);

/// A directory and the most it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskBound {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// The bytes `dir` takes on disk (allocated blocks, so a sparse file counts
/// what it uses), not following symlinks.
pub fn usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    total
}

/// Returns once `bound.dir` holds more than its bound: never, otherwise.
pub async fn exceeded(bound: DiskBound) -> u64 {
    let mut every = tokio::time::interval(DISK_CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let dir = bound.dir.clone();
        // Thousands of files take milliseconds to measure: never on the
        // async workers.
        let used = tokio::task::spawn_blocking(move || usage(&dir))
            .await
            .unwrap_or(0);
        if used > bound.max_bytes {
            return used;
        }
    }
}

/// The failure of a session stopped for its directory's size.
pub fn exceeded_message(max_bytes: u64) -> String {
    format!(
        "the session's directory grew past its disk bound of {} (RUNNER_LOCAL_MAX_DISK) and the session was stopped",
        human_bytes(max_bytes)
    )
}

/// The end of a watch session's app taken down for the session
/// directory's size. The session and its files stay: the user frees space
/// and starts the app again.
pub fn app_over_message(app: &str, used: u64, max_bytes: u64) -> String {
    format!(
        "app '{app}' was stopped: the session's directory holds {}, past its disk bound of {} (RUNNER_LOCAL_MAX_DISK); its files are kept: delete some, then change its app set to start it again",
        human_bytes(used),
        human_bytes(max_bytes)
    )
}

/// `1 GiB`, `512 MiB`, `1500 bytes`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: &[(u64, &str)] = &[
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    UNITS
        .iter()
        .find(|(unit, _)| bytes >= *unit && bytes.is_multiple_of(*unit))
        .map_or_else(
            || format!("{bytes} bytes"),
            |(unit, name)| format!("{} {name}", bytes / unit),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_said_in_the_unit_they_were_likely_given_in() {
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(512 << 20), "512 MiB");
        assert_eq!(human_bytes(1500), "1500 bytes");
        assert_eq!(
            exceeded_message(1 << 20),
            "the session's directory grew past its disk bound of 1 MiB (RUNNER_LOCAL_MAX_DISK) and the session was stopped"
        );
    }

    #[test]
    fn usage_counts_every_file_below_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/big"), vec![1u8; 256 << 10]).unwrap();
        std::fs::write(dir.path().join("small"), b"x").unwrap();
        let used = usage(dir.path());
        assert!(used >= 256 << 10, "{used}");
        assert_eq!(usage(&dir.path().join("absent")), 0);
    }
}
