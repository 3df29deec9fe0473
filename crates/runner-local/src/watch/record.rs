//! A watch session's record beside its workspace (`watch.json`): what the
//! next runner needs to list the session after a restart and start it
//! again. The workspace with its record is the session's checkpoint.

use std::path::PathBuf;

use runner_core::backend::KeptLink;
use runner_core::{HeldSessions, SuspendedSession, WatchSpec};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::work_root::session_dir::{RECORD_FILE, WorkDir};

/// What a watch session's record keeps: enough to list it after a restart
/// and to start it again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) spec: WatchSpec,
    /// Runner processes that held it so far.
    pub(super) generation: u32,
}

pub(super) fn record_path(work: &WorkDir) -> PathBuf {
    work.root().join(RECORD_FILE)
}

pub(super) fn write_record(work: &WorkDir, record: &Record) -> std::io::Result<()> {
    let json = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    replace_file(work, RECORD_FILE, &json)
}

/// The session's share links, beside its record.
const LINKS_FILE: &str = "links.json";

/// Keeps session `id`'s share links (the whole list) beside its record.
pub(crate) fn write_links(
    work_root: &std::path::Path,
    id: &str,
    links: &[KeptLink],
) -> std::io::Result<()> {
    let work = WorkDir::for_session(work_root, id).map_err(std::io::Error::other)?;
    if !record_path(&work).is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the session has no record",
        ));
    }
    let json = serde_json::to_vec(links).map_err(std::io::Error::other)?;
    replace_file(&work, LINKS_FILE, &json)
}

/// The links kept beside a session's record; none when there is no file,
/// and none (said) when it is not a list of links.
fn read_links(work: &WorkDir, id: &str) -> Vec<KeptLink> {
    let Ok(bytes) = std::fs::read(work.root().join(LINKS_FILE)) else {
        return Vec::new();
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|err| {
        warn!(session_id = %id, error = %err, "a watch session's links file is not a list of links; its links are dropped");
        Vec::new()
    })
}

/// Writes `name` in the session's directory whole or not at all (a temp
/// file renamed over it), private to the runner.
fn replace_file(work: &WorkDir, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let temp = work.root().join(format!("{name}.tmp"));
    {
        // Private: the record holds the session's environment.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temp, work.root().join(name))
}

pub(super) fn read_record(work: &WorkDir) -> Option<Record> {
    let bytes = std::fs::read(record_path(work)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Whether session `id` has a workspace to resume from.
pub(crate) fn has_checkpoint(work_root: &std::path::Path, id: &str) -> bool {
    WorkDir::for_session(work_root, id)
        .is_ok_and(|work| record_path(&work).is_file() && work.app().is_dir())
}

/// Every watch session kept under the work root (boot): each record is
/// rewritten with its generation bumped, so this runner's event ids and
/// sequence numbers start past the last one's.
pub(crate) fn kept_sessions(
    work_root: &std::path::Path,
    held: &HeldSessions,
) -> Vec<SuspendedSession> {
    let Ok(entries) = std::fs::read_dir(work_root) else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if held(&name) {
            // Started by this runner since it booted: not a leftover.
            continue;
        }
        let Ok(work) = WorkDir::for_session(work_root, &name) else {
            continue;
        };
        let Some(mut record) = read_record(&work) else {
            continue;
        };
        if record.spec.session_id != name || !work.app().is_dir() {
            warn!(dir = %work.root().display(), "a watch session record does not match its directory; left alone");
            continue;
        }
        record.generation = record.generation.saturating_add(1);
        if let Err(err) = write_record(&work, &record) {
            warn!(session_id = %name, error = %err, "could not update a kept watch session's record");
        }
        kept.push(SuspendedSession {
            links: read_links(&work, &name),
            spec: record.spec,
            generation: record.generation,
            running: false,
            output_marks: Vec::new(),
        });
    }
    kept
}
