//! Change detection for `--watch`: any file under the entry's directory that
//! is created, written, deleted or renamed, outside `.telo/`, `node_modules/`
//! and `.git/`. Bursts are debounced into one change, so a change set that
//! writes several files makes exactly one new generation.

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, EventKind, MetadataKind, ModifyKind};
use notify::{PollWatcher, RecommendedWatcher, RecursiveMode, Watcher};

/// Directories whose changes never reload: the kernel's own cache, installed
/// packages and version control.
pub const IGNORED_DIRS: [&str; 3] = [".telo", "node_modules", ".git"];
/// A change is reported once nothing else changed for this long.
pub const DEBOUNCE: Duration = Duration::from_millis(75);
/// A burst that never goes quiet is still reported after this long.
const MAX_BURST: Duration = Duration::from_secs(1);
/// The polling fallback's interval, when inotify is unavailable.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// `count_files` stops counting here.
const MAX_COUNTED_FILES: usize = 100_000;

/// Keeps the watch alive; dropping it stops change detection.
pub struct WatchHandle {
    _watcher: Box<dyn Watcher + Send>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot watch '{dir}'")]
pub struct WatchError {
    dir: String,
    #[source]
    source: notify::Error,
}

/// Watches `dir` (absolute) recursively and calls `on_change` with the first
/// changed path of each debounced burst, from a background thread.
pub fn spawn(
    dir: &Path,
    on_change: impl Fn(PathBuf) + Send + 'static,
) -> Result<WatchHandle, WatchError> {
    let (raw, bursts) = mpsc::channel::<PathBuf>();
    let root = dir.to_path_buf();
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if !is_change(&event.kind) {
            return;
        }
        for path in event.paths {
            if is_watched(&root, &path) {
                let _ = raw.send(path);
            }
        }
    };
    let watcher = start_watcher(dir, handler).map_err(|source| WatchError {
        dir: dir.display().to_string(),
        source,
    })?;
    thread::Builder::new()
        .name("watch-debounce".to_owned())
        .spawn(move || {
            while let Ok(first) = bursts.recv() {
                let started = Instant::now();
                loop {
                    match bursts.recv_timeout(DEBOUNCE) {
                        Ok(_) if started.elapsed() < MAX_BURST => {}
                        Ok(_) | Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                on_change(first);
            }
        })
        .map_err(|source| WatchError {
            dir: dir.display().to_string(),
            source: notify::Error::io(source),
        })?;
    Ok(WatchHandle { _watcher: watcher })
}

/// inotify when it can be had (the per-user instance limit can run out on a
/// busy machine), else polling.
fn start_watcher(
    dir: &Path,
    handler: impl notify::EventHandler + Clone,
) -> notify::Result<Box<dyn Watcher + Send>> {
    let native = RecommendedWatcher::new(handler.clone(), notify::Config::default()).and_then(
        |mut watcher| {
            watcher.watch(dir, RecursiveMode::Recursive)?;
            Ok(watcher)
        },
    );
    if let Ok(watcher) = native {
        return Ok(Box::new(watcher));
    }
    let mut watcher = PollWatcher::new(
        handler,
        notify::Config::default().with_poll_interval(POLL_INTERVAL),
    )?;
    watcher.watch(dir, RecursiveMode::Recursive)?;
    Ok(Box::new(watcher))
}

/// Opening or reading a file is no change (fake-telo reads the entry itself
/// at every generation, which must not reload it again).
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_)
        | EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        _ => true,
    }
}

/// True for a path strictly under `root` and outside the ignored directories.
pub fn is_watched(root: &Path, path: &Path) -> bool {
    let Ok(relative) = path.strip_prefix(root) else {
        return false;
    };
    let mut components = relative.components().peekable();
    if components.peek().is_none() {
        return false;
    }
    components.all(|component| match component {
        Component::Normal(name) => !IGNORED_DIRS.iter().any(|ignored| name == *ignored),
        _ => true,
    })
}

/// How many files the watch covers (for the `[watch] watching N file(s)` line).
pub fn count_files(dir: &Path) -> usize {
    let mut count = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if !IGNORED_DIRS
                    .iter()
                    .any(|ignored| entry.file_name() == *ignored)
                {
                    pending.push(entry.path());
                }
            } else {
                count += 1;
                if count >= MAX_COUNTED_FILES {
                    return count;
                }
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignored_directories_and_the_root_itself_are_not_watched() {
        let root = Path::new("/app");
        assert!(is_watched(root, Path::new("/app/telo.yaml")));
        assert!(is_watched(root, Path::new("/app/src/a.ts")));
        assert!(is_watched(root, Path::new("/app/.telo-notes")));
        assert!(!is_watched(root, Path::new("/app")));
        assert!(!is_watched(root, Path::new("/app/.telo/cache.json")));
        assert!(!is_watched(root, Path::new("/app/a/node_modules/x.js")));
        assert!(!is_watched(root, Path::new("/app/.git/index")));
        assert!(!is_watched(root, Path::new("/elsewhere/telo.yaml")));
    }

    #[test]
    fn reads_are_no_change_but_writes_are() {
        use notify::event::{CreateKind, DataChange, RemoveKind};
        assert!(!is_change(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(!is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(is_change(&EventKind::Create(CreateKind::File)));
        assert!(is_change(&EventKind::Modify(ModifyKind::Data(
            DataChange::Any
        ))));
        assert!(is_change(&EventKind::Remove(RemoveKind::File)));
    }
}
