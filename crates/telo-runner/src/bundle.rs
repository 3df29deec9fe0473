//! Turning an application on disk into a `/v1` bundle: entry resolution, the
//! directory walk, and the request-size check that runs before anything is
//! sent. The decisions (what to skip, how a path is spelled, how an over-limit
//! bundle is explained) are plain functions, unit-tested below; `collect` is
//! the thin layer that reads the disk.
//!
//! What is left out: the tooling directories in [`SKIPPED_DIRS`], symlinks
//! leading outside the root, and whatever the `.gitignore` and `.teloignore`
//! files inside the root ignore (gitignore syntax, matched by the `ignore`
//! crate: nested files, anchored and `**` patterns, `!` negation). Only
//! ignore files inside the bundle root count, none from its parents or the
//! user's global git configuration, so what a bundle holds is decided by the
//! application's own directory. The entry manifest is never left out: an
//! ignored entry is sent anyway and the client says so, since a bundle
//! without its entry could not run at all.

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// The body limit a runner applies when its operator did not change it
/// (`RUNNER_MAX_BODY_BYTES`): the request's JSON size, not the files' sum.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1_048_576;

/// The manifest a directory's application starts from.
pub const ENTRY_FILE_NAME: &str = "telo.yaml";

/// Directories that are tooling state, never part of an application; the
/// editor leaves them out too, and `node_modules` alone can blow the limit.
const SKIPPED_DIRS: &[&str] = &[".git", "node_modules", ".telo"];

/// The ignore files the walk honours in every directory, in this order: a
/// `.teloignore` line is read after the `.gitignore` ones, so it can
/// re-include (`!path`) what `.gitignore` leaves out of the bundle.
pub const IGNORE_FILE_NAMES: &[&str] = &[".gitignore", ".teloignore"];

/// How many ignored paths the "left out" line names.
const IGNORED_SHOWN: usize = 5;

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

/// The bundle is the contract's own type: what this collects is exactly
/// what the runner validates.
pub use runner_api::types::{BundleFile, RunBundle};

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

/// A bundle and what its ignore files left out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    pub bundle: RunBundle,
    /// Bundle paths the ignore files left out, in walk order; a directory
    /// ends with `/` (what is under it was not looked at).
    pub ignored: Vec<String>,
    /// The entry manifest matched an ignore pattern and was sent anyway.
    pub entry_ignored: bool,
}

/// Reads every file under the entry's root into a bundle. Symlinks are
/// followed only while they stay inside the root: a link to `~/.ssh` must not
/// upload the user's keys to a remote runner.
pub fn collect(entry: &EntryPoint) -> Result<Collected, BundleError> {
    let root = fs::canonicalize(&entry.root).map_err(|source| BundleError::Inspect {
        path: entry.root.clone(),
        source,
    })?;
    let mut walk = Walk {
        root: &root,
        entry: root.join(&entry.entry_relative_path),
        visited: HashSet::new(),
        matchers: Vec::new(),
        files: Vec::new(),
        ignored: Vec::new(),
        entry_ignored: false,
    };
    walk.dir(&root)?;
    let Walk {
        mut files,
        ignored,
        entry_ignored,
        ..
    } = walk;
    files.sort_by(|a, b| a.relative_path.cmp(&b.relative_path));
    Ok(Collected {
        bundle: RunBundle {
            entry_relative_path: entry.entry_relative_path.clone(),
            files,
        },
        ignored,
        entry_ignored,
    })
}

/// The directory walk's state.
struct Walk<'a> {
    root: &'a Path,
    /// The entry manifest's path, which is never left out.
    entry: PathBuf,
    visited: HashSet<PathBuf>,
    /// The ignore rules of the directories being walked, outermost first.
    matchers: Vec<Gitignore>,
    files: Vec<BundleFile>,
    ignored: Vec<String>,
    entry_ignored: bool,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Path) -> Result<(), BundleError> {
        // A symlinked directory pointing at an ancestor would otherwise loop forever.
        if !self.visited.insert(dir.to_owned()) {
            return Ok(());
        }
        let matcher = dir_matcher(dir);
        let pushed = matcher.is_some();
        self.matchers.extend(matcher);
        let walked = self.entries(dir);
        if pushed {
            self.matchers.pop();
        }
        walked
    }

    fn entries(&mut self, dir: &Path) -> Result<(), BundleError> {
        let root = self.root;
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
            if is_ignored(&self.matchers, &path, metadata.is_dir()) {
                if path == self.entry {
                    self.entry_ignored = true;
                } else {
                    self.ignored
                        .push(ignored_name(root, &path, metadata.is_dir()));
                    continue;
                }
            }
            if metadata.is_dir() {
                self.dir(&target)?;
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
                self.files.push(BundleFile {
                    relative_path: relative,
                    contents,
                });
            }
        }
        Ok(())
    }
}

/// The rules of `dir`'s ignore files, `None` when it has none. A line that
/// is not a valid pattern is skipped, as git skips it.
fn dir_matcher(dir: &Path) -> Option<Gitignore> {
    let mut builder = GitignoreBuilder::new(dir);
    let mut any = false;
    for name in IGNORE_FILE_NAMES {
        let file = dir.join(name);
        if file.is_file() {
            any = true;
            let _partial_errors = builder.add(file);
        }
    }
    if !any {
        return None;
    }
    builder.build().ok().filter(|matcher| !matcher.is_empty())
}

/// Whether the innermost rule that matches `path` ignores it: a deeper
/// directory's files decide before a shallower one's, and within one
/// directory the last matching line decides (so `!keep.txt` after `*.txt`
/// keeps it).
pub fn is_ignored(matchers: &[Gitignore], path: &Path, is_dir: bool) -> bool {
    for matcher in matchers.iter().rev() {
        let Ok(relative) = path.strip_prefix(matcher.path()) else {
            continue;
        };
        match matcher.matched(relative, is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => {}
        }
    }
    false
}

/// How an ignored path is named on the "left out" line: a directory with
/// its trailing `/`, as it is spelled in an ignore file.
fn ignored_name(root: &Path, path: &Path, is_dir: bool) -> String {
    let name = bundle_relative_path(root, path).unwrap_or_else(|| path.display().to_string());
    if is_dir { format!("{name}/") } else { name }
}

/// One short line saying what the ignore files left out, naming the first
/// few; `None` when they left out nothing.
pub fn left_out_line(ignored: &[String]) -> Option<String> {
    if ignored.is_empty() {
        return None;
    }
    let files = if ignored.len() == 1 { "path" } else { "paths" };
    let mut line = format!(
        "telo-runner: left out {} {files} ignored by .gitignore/.teloignore: {}",
        ignored.len(),
        ignored[..ignored.len().min(IGNORED_SHOWN)].join(", ")
    );
    if ignored.len() > IGNORED_SHOWN {
        line.push_str(&format!(" and {} more", ignored.len() - IGNORED_SHOWN));
    }
    Some(line)
}

/// Said when the entry manifest matched an ignore pattern.
pub fn entry_ignored_line(entry_relative_path: &str) -> String {
    format!(
        "telo-runner: {entry_relative_path} is ignored by .gitignore/.teloignore, but it is the entry manifest, so it is sent anyway"
    )
}

/// Refuses a request the runner would answer with 413, naming what to remove.
pub fn check_body_limit(
    bundle: &RunBundle,
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

    fn paths(bundle: &RunBundle) -> Vec<&str> {
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
        let bundle = collect(&resolve_entry(dir.path()).unwrap()).unwrap().bundle;
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
        let bundle = collect(&resolve_entry(dir.path()).unwrap()).unwrap().bundle;
        assert_eq!(paths(&bundle), ["alias.yaml", "shared.yaml", "telo.yaml"]);
    }

    fn collect_dir(dir: &Path) -> Collected {
        collect(&resolve_entry(dir).unwrap()).unwrap()
    }

    #[test]
    fn gitignore_and_teloignore_leave_files_out_with_nesting_and_negation() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "telo.yaml", b"kind: x\n");
        write(
            dir.path(),
            ".gitignore",
            b"dist/\n*.log\n!keep.log\n/secrets.env\n",
        );
        write(dir.path(), ".teloignore", b"notes.md\n!dist-readme.log\n");
        write(dir.path(), "dist/bundle.js", b"x");
        write(dir.path(), "app.log", b"x");
        write(dir.path(), "keep.log", b"x");
        write(dir.path(), "secrets.env", b"x");
        write(dir.path(), "notes.md", b"x");
        write(dir.path(), "lib/secrets.env", b"anchored at the root only");
        write(dir.path(), "lib/.gitignore", b"generated/\n!app.log\n");
        write(dir.path(), "lib/app.log", b"re-included one level down");
        write(dir.path(), "lib/generated/out.yaml", b"x");
        write(dir.path(), "lib/mod.yaml", b"a: 1\n");
        let collected = collect_dir(dir.path());
        assert_eq!(
            paths(&collected.bundle),
            [
                ".gitignore",
                ".teloignore",
                "keep.log",
                "lib/.gitignore",
                "lib/app.log",
                "lib/mod.yaml",
                "lib/secrets.env",
                "telo.yaml"
            ]
        );
        assert_eq!(
            collected.ignored,
            [
                "app.log",
                "dist/",
                "lib/generated/",
                "notes.md",
                "secrets.env"
            ]
        );
        assert!(!collected.entry_ignored);
    }

    #[test]
    fn teloignore_can_re_include_what_gitignore_leaves_out() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "telo.yaml", b"kind: x\n");
        write(dir.path(), ".gitignore", b"*.json\n");
        write(dir.path(), ".teloignore", b"!config.json\n");
        write(dir.path(), "config.json", b"{}");
        write(dir.path(), "cache.json", b"{}");
        let collected = collect_dir(dir.path());
        assert!(paths(&collected.bundle).contains(&"config.json"));
        assert_eq!(collected.ignored, ["cache.json"]);
    }

    #[test]
    fn an_ignored_entry_manifest_is_sent_anyway_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "telo.yaml", b"kind: x\n");
        write(dir.path(), ".teloignore", b"*.yaml\n");
        write(dir.path(), "other.yaml", b"a: 1\n");
        let collected = collect_dir(dir.path());
        assert_eq!(paths(&collected.bundle), [".teloignore", "telo.yaml"]);
        assert_eq!(collected.ignored, ["other.yaml"]);
        assert!(collected.entry_ignored);
        assert_eq!(
            entry_ignored_line("telo.yaml"),
            "telo-runner: telo.yaml is ignored by .gitignore/.teloignore, but it is the entry manifest, so it is sent anyway"
        );
    }

    #[test]
    fn the_left_out_line_names_the_first_few() {
        assert_eq!(left_out_line(&[]), None);
        assert_eq!(
            left_out_line(&["dist/".into()]).unwrap(),
            "telo-runner: left out 1 path ignored by .gitignore/.teloignore: dist/"
        );
        let many: Vec<String> = (1..=7).map(|i| format!("f{i}")).collect();
        assert_eq!(
            left_out_line(&many).unwrap(),
            "telo-runner: left out 7 paths ignored by .gitignore/.teloignore: f1, f2, f3, f4, f5 and 2 more"
        );
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
        let bundle = RunBundle {
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
        let bundle = RunBundle {
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
