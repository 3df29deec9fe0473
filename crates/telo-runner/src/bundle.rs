//! Turning an application on disk into a `/v1` bundle: entry resolution, the
//! directory walk, and the request-size check that runs before anything is
//! sent. The decisions (what to skip, how a path is spelled, how an over-limit
//! bundle is explained) are plain functions, unit-tested below; `collect` is
//! the thin layer that reads the disk.

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

/// The body limit a runner applies when its operator did not change it
/// (`RUNNER_MAX_BODY_BYTES`): the request's JSON size, not the files' sum.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1_048_576;

/// The manifest a directory's application starts from.
pub const ENTRY_FILE_NAME: &str = "telo.yaml";

/// Directories that are tooling state, never part of an application; the
/// editor leaves them out too, and `node_modules` alone can blow the limit.
const SKIPPED_DIRS: &[&str] = &[".git", "node_modules", ".telo"];

/// How many of the largest files an over-limit error names.
const LARGEST_FILES_SHOWN: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("could not read '{}': {source}", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{}' has no {ENTRY_FILE_NAME}; pass the manifest file to run instead", dir.display())]
    NoEntryInDirectory { dir: PathBuf },
    #[error("could not read directory '{}': {source}", path.display())]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not read file '{}': {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "'{path}' is not UTF-8 text; the /v1 bundle carries text files only (move it out of the application directory)"
    )]
    NotUtf8 { path: String },
    #[error("'{}' cannot be spelled as a bundle path", path.display())]
    UnrepresentablePath { path: PathBuf },
    #[error("{}", over_limit_message(*.request_bytes, *.limit_bytes, .largest))]
    OverLimit {
        request_bytes: usize,
        limit_bytes: usize,
        largest: Vec<(String, usize)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleFile {
    pub relative_path: String,
    pub contents: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bundle {
    pub entry_relative_path: String,
    pub files: Vec<BundleFile>,
}

/// Where an application lives: the directory that becomes the bundle root and
/// its entry manifest relative to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPoint {
    pub root: PathBuf,
    pub entry_relative_path: String,
}

/// A directory runs its `telo.yaml`; a file runs itself, rooted at its directory.
pub fn resolve_entry(target: &Path) -> Result<EntryPoint, BundleError> {
    let metadata = fs::metadata(target).map_err(|source| BundleError::Inspect {
        path: target.to_owned(),
        source,
    })?;
    if metadata.is_dir() {
        if !target.join(ENTRY_FILE_NAME).is_file() {
            return Err(BundleError::NoEntryInDirectory {
                dir: target.to_owned(),
            });
        }
        return Ok(EntryPoint {
            root: target.to_owned(),
            entry_relative_path: ENTRY_FILE_NAME.to_owned(),
        });
    }
    let name = target
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| BundleError::UnrepresentablePath {
            path: target.to_owned(),
        })?;
    let root = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    Ok(EntryPoint {
        root,
        entry_relative_path: name.to_owned(),
    })
}

/// Whether the walk leaves out a directory entry with this name.
pub fn is_skipped_dir(name: &str) -> bool {
    SKIPPED_DIRS.contains(&name)
}

/// `path` relative to `root`, `/`-separated, or `None` when it is not strictly
/// inside `root` (or has a component that is not UTF-8). Both are expected to
/// be canonical, so `..` only appears when the path escapes.
pub fn bundle_relative_path(root: &Path, path: &Path) -> Option<String> {
    let relative = path.strip_prefix(root).ok()?;
    let mut parts = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_str()?),
            _ => return None,
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.join("/"))
}

/// Reads every file under the entry's root into a bundle. Symlinks are
/// followed only while they stay inside the root: a link to `~/.ssh` must not
/// upload the user's keys to a remote runner.
pub fn collect(entry: &EntryPoint) -> Result<Bundle, BundleError> {
    let root = fs::canonicalize(&entry.root).map_err(|source| BundleError::Inspect {
        path: entry.root.clone(),
        source,
    })?;
    let mut files = Vec::new();
    let mut visited = HashSet::new();
    walk(&root, &root, &mut visited, &mut files)?;
    files.sort_by(|a, b| a.relative_path.cmp(&b.relative_path));
    Ok(Bundle {
        entry_relative_path: entry.entry_relative_path.clone(),
        files,
    })
}

fn walk(
    root: &Path,
    dir: &Path,
    visited: &mut HashSet<PathBuf>,
    files: &mut Vec<BundleFile>,
) -> Result<(), BundleError> {
    // A symlinked directory pointing at an ancestor would otherwise loop forever.
    if !visited.insert(dir.to_owned()) {
        return Ok(());
    }
    let read_dir_error = |source| BundleError::ReadDir {
        path: dir.to_owned(),
        source,
    };
    let mut entries = fs::read_dir(dir)
        .map_err(read_dir_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_dir_error)?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let name = entry.file_name();
        if name.to_str().is_some_and(is_skipped_dir) {
            continue;
        }
        let path = entry.path();
        let Ok(target) = fs::canonicalize(&path) else {
            continue; // a dangling symlink names nothing to upload
        };
        if !target.starts_with(root) {
            continue;
        }
        let metadata = fs::metadata(&target).map_err(|source| BundleError::Inspect {
            path: path.clone(),
            source,
        })?;
        if metadata.is_dir() {
            walk(root, &target, visited, files)?;
        } else if metadata.is_file() {
            let relative = bundle_relative_path(root, &path)
                .ok_or_else(|| BundleError::UnrepresentablePath { path: path.clone() })?;
            let bytes = fs::read(&target).map_err(|source| BundleError::ReadFile {
                path: path.clone(),
                source,
            })?;
            let contents = String::from_utf8(bytes).map_err(|_| BundleError::NotUtf8 {
                path: relative.clone(),
            })?;
            files.push(BundleFile {
                relative_path: relative,
                contents,
            });
        }
    }
    Ok(())
}

/// Refuses a request the runner would answer with 413, naming what to remove.
pub fn check_body_limit(
    bundle: &Bundle,
    request_bytes: usize,
    limit_bytes: usize,
) -> Result<(), BundleError> {
    if request_bytes <= limit_bytes {
        return Ok(());
    }
    let mut largest: Vec<(String, usize)> = bundle
        .files
        .iter()
        .map(|file| (file.relative_path.clone(), file.contents.len()))
        .collect();
    largest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    largest.truncate(LARGEST_FILES_SHOWN);
    Err(BundleError::OverLimit {
        request_bytes,
        limit_bytes,
        largest,
    })
}

fn over_limit_message(
    request_bytes: usize,
    limit_bytes: usize,
    largest: &[(String, usize)],
) -> String {
    let mut message = format!(
        "the bundle is {} bytes over the runner's limit ({request_bytes} bytes to send, limit {limit_bytes} bytes); largest files:",
        request_bytes - limit_bytes
    );
    for (path, bytes) in largest {
        message.push_str(&format!("\n  {bytes:>10}  {path}"));
    }
    message
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(root: &Path, relative: &str, contents: &[u8]) {
        let path = root.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    fn paths(bundle: &Bundle) -> Vec<&str> {
        bundle
            .files
            .iter()
            .map(|file| file.relative_path.as_str())
            .collect()
    }

    #[test]
    fn a_directory_runs_its_telo_yaml() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "telo.yaml", b"kind: x\n");
        let entry = resolve_entry(dir.path()).unwrap();
        assert_eq!(entry.root, dir.path());
        assert_eq!(entry.entry_relative_path, "telo.yaml");
    }

    #[test]
    fn a_directory_without_telo_yaml_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_entry(dir.path()).unwrap_err();
        assert!(err.to_string().contains("has no telo.yaml"), "{err}");
    }

    #[test]
    fn a_manifest_file_is_the_entry_and_its_directory_the_root() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "apps/other.yaml", b"kind: x\n");
        let entry = resolve_entry(&dir.path().join("apps/other.yaml")).unwrap();
        assert_eq!(entry.root, dir.path().join("apps"));
        assert_eq!(entry.entry_relative_path, "other.yaml");
    }

    #[test]
    fn tooling_directories_are_skipped_and_paths_use_slashes() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "telo.yaml", b"kind: x\n");
        write(dir.path(), "lib/util/mod.yaml", b"a: 1\n");
        write(dir.path(), ".git/config", b"x");
        write(dir.path(), "node_modules/pkg/index.js", b"x");
        write(dir.path(), ".telo/cache", b"x");
        write(dir.path(), "lib/node_modules/deep.js", b"x");
        let bundle = collect(&resolve_entry(dir.path()).unwrap()).unwrap();
        assert_eq!(paths(&bundle), ["lib/util/mod.yaml", "telo.yaml"]);
        assert_eq!(bundle.entry_relative_path, "telo.yaml");
    }

    #[test]
    fn symlinks_that_leave_the_root_are_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        write(outside.path(), "secret.txt", b"key");
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "telo.yaml", b"kind: x\n");
        write(dir.path(), "shared.yaml", b"a: 1\n");
        std::os::unix::fs::symlink(
            outside.path().join("secret.txt"),
            dir.path().join("leak.txt"),
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("leakdir")).unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("shared.yaml"),
            dir.path().join("alias.yaml"),
        )
        .unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("loop")).unwrap();
        let bundle = collect(&resolve_entry(dir.path()).unwrap()).unwrap();
        assert_eq!(paths(&bundle), ["alias.yaml", "shared.yaml", "telo.yaml"]);
    }

    #[test]
    fn a_binary_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "telo.yaml", b"kind: x\n");
        write(dir.path(), "assets/logo.png", &[0x89, 0x50, 0xff, 0xfe]);
        let err = collect(&resolve_entry(dir.path()).unwrap()).unwrap_err();
        assert!(matches!(&err, BundleError::NotUtf8 { path } if path == "assets/logo.png"));
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }

    #[test]
    fn relative_paths_never_escape_the_root() {
        let root = Path::new("/app");
        assert_eq!(
            bundle_relative_path(root, Path::new("/app/a/b.yaml")).as_deref(),
            Some("a/b.yaml")
        );
        assert_eq!(bundle_relative_path(root, Path::new("/app")), None);
        assert_eq!(bundle_relative_path(root, Path::new("/other/x")), None);
        assert_eq!(
            bundle_relative_path(root, Path::new("/app/../etc/passwd")),
            None
        );
    }

    #[test]
    fn a_request_within_the_limit_passes() {
        let bundle = Bundle {
            entry_relative_path: "telo.yaml".into(),
            files: vec![],
        };
        assert!(check_body_limit(&bundle, 100, 100).is_ok());
    }

    #[test]
    fn an_over_limit_request_says_by_how_much_and_names_the_largest_files() {
        let file = |path: &str, size: usize| BundleFile {
            relative_path: path.into(),
            contents: "x".repeat(size),
        };
        let bundle = Bundle {
            entry_relative_path: "telo.yaml".into(),
            files: vec![
                file("telo.yaml", 10),
                file("data/big.json", 900),
                file("a", 1),
                file("b", 2),
                file("c", 3),
                file("d", 4),
            ],
        };
        let err = check_body_limit(&bundle, 1_100, 1_000).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("the bundle is 100 bytes over the runner's limit"),
            "{message}"
        );
        let lines: Vec<&str> = message.lines().skip(1).map(str::trim).collect();
        assert_eq!(
            lines,
            [
                "900  data/big.json",
                "10  telo.yaml",
                "4  d",
                "3  c",
                "2  b"
            ]
        );
    }
}
