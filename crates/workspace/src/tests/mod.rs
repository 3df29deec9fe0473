//! Unit tests: the tree, reads and errors here; change sets in `apply`;
//! what a hostile workload can plant in `hostile`.

mod apply;
mod hostile;

use std::fs;
use std::path::Path;

use runner_api::watch::{FileEncoding, WorkspaceChangeSet, WorkspaceWrite};

use super::*;

pub(super) fn workspace() -> (tempfile::TempDir, Workspace) {
    workspace_with(WorkspaceLimits::default())
}

pub(super) fn workspace_with(limits: WorkspaceLimits) -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::create(&dir.path().join("ws"), limits).expect("create");
    (dir, ws)
}

pub(super) fn put(ws: &Workspace, path: &str, bytes: &[u8]) {
    let full = ws.root().join(path);
    fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
    fs::write(full, bytes).expect("write");
}

pub(super) fn utf8(path: &str, content: &str) -> WorkspaceWrite {
    WorkspaceWrite {
        path: path.to_owned(),
        content: content.to_owned(),
        encoding: None,
    }
}

pub(super) fn base64(path: &str, content: &str) -> WorkspaceWrite {
    WorkspaceWrite {
        path: path.to_owned(),
        content: content.to_owned(),
        encoding: Some(FileEncoding::Base64),
    }
}

pub(super) fn changes(write: Vec<WorkspaceWrite>, delete: &[&str]) -> WorkspaceChangeSet {
    WorkspaceChangeSet {
        write,
        delete: delete.iter().map(|d| (*d).to_owned()).collect(),
    }
}

pub(super) fn paths(ws: &Workspace) -> Vec<String> {
    ws.tree()
        .expect("tree")
        .files
        .into_iter()
        .map(|f| f.path)
        .collect()
}

pub(super) fn is_empty_dir(path: &Path) -> bool {
    fs::read_dir(path).expect("read_dir").next().is_none()
}

#[test]
fn tree_lists_regular_files_sorted_with_sha256() {
    let (_dir, ws) = workspace();
    put(&ws, "b.txt", b"hello");
    put(&ws, "a/z.yaml", b"");
    put(&ws, "a/b.yaml", b"x");
    let tree = ws.tree().expect("tree");
    let listed: Vec<(&str, &str)> = tree
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.hash.as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            (
                "a/b.yaml",
                "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
            ),
            (
                "a/z.yaml",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            ),
            (
                "b.txt",
                "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
            ),
        ]
    );
}

#[test]
fn tree_skips_excluded_directories_at_any_depth() {
    let (_dir, ws) = workspace();
    put(&ws, "telo.yaml", b"kind: x");
    put(&ws, "node_modules/pkg/index.js", b"x");
    put(&ws, ".telo/cache/blob", b"x");
    put(&ws, "app/.git/config", b"x");
    put(&ws, "app/deep/node_modules/y.js", b"x");
    put(&ws, "app/main.yaml", b"x");
    assert_eq!(paths(&ws), ["app/main.yaml", "telo.yaml"]);
    assert_eq!(ws.size_bytes().expect("size"), 8);
}

#[test]
fn tree_fails_past_the_file_limit() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_files: 3,
        ..WorkspaceLimits::default()
    });
    for name in ["a", "b", "c"] {
        put(&ws, name, b"x");
    }
    assert_eq!(paths(&ws).len(), 3);
    put(&ws, "d", b"x");
    let error = ws.tree().expect_err("over the file limit");
    assert_eq!(error.kind().status, 413);
    assert_eq!(
        error.to_string(),
        "the workspace holds more than this runner's limit of 3 files (RUNNER_WORKSPACE_MAX_FILES)"
    );
}

#[test]
fn tree_and_snapshot_fail_past_the_workspace_byte_limit() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_workspace_bytes: 10,
        ..WorkspaceLimits::default()
    });
    put(&ws, "a", b"12345");
    put(&ws, "b", b"12345");
    assert!(ws.tree().is_ok());
    assert!(ws.snapshot().is_ok());
    put(&ws, "c", b"1");
    assert!(matches!(
        ws.tree(),
        Err(WorkspaceError::TooLarge {
            limit: Limit::WorkspaceBytes,
            ..
        })
    ));
    assert!(ws.snapshot().is_err());
}

#[test]
fn tree_fails_past_the_depth_limit() {
    let (_dir, ws) = workspace();
    let deep = vec!["d"; beneath::MAX_DEPTH + 2].join("/");
    put(&ws, &format!("{deep}/f"), b"x");
    let error = ws.tree().expect_err("too deep");
    assert!(matches!(
        error,
        WorkspaceError::TooLarge {
            limit: Limit::Depth,
            ..
        }
    ));
}

#[test]
fn read_returns_utf8_content_and_byte_size() {
    let (_dir, ws) = workspace();
    put(&ws, "app/telo.yaml", "name: ünï".as_bytes());
    let file = ws.read("/app/./telo.yaml").expect("read");
    assert_eq!(file.content, "name: ünï");
    assert_eq!(file.size, 11);
}

#[test]
fn read_replaces_invalid_utf8_and_keeps_the_byte_size() {
    let (_dir, ws) = workspace();
    put(&ws, "bin", &[b'a', 0xff, b'b']);
    let file = ws.read("bin").expect("read");
    assert_eq!(file.content, "a\u{fffd}b");
    assert_eq!(file.size, 3);
    assert_eq!(ws.read_bytes("bin").expect("bytes"), [b'a', 0xff, b'b']);
}

#[test]
fn read_errors_name_the_problem() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_file_bytes: 4,
        ..WorkspaceLimits::default()
    });
    put(&ws, "dir/file", b"12345");
    put(&ws, "small", b"1234");

    let missing = ws.read("nope.yaml").expect_err("missing");
    assert_eq!(
        missing.kind(),
        ErrorKind {
            status: 404,
            code: "file_not_found"
        }
    );
    assert_eq!(missing.to_string(), "no file 'nope.yaml' in the workspace");

    let under_file = ws.read("small/x").expect_err("parent is a file");
    assert_eq!(under_file.kind().status, 404);

    let directory = ws.read("dir").expect_err("a directory");
    assert_eq!(
        directory.kind(),
        ErrorKind {
            status: 400,
            code: "not_a_file"
        }
    );

    let big = ws.read("dir/file").expect_err("too big");
    assert_eq!(
        big.kind(),
        ErrorKind {
            status: 413,
            code: "workspace_too_large"
        }
    );
    assert_eq!(
        big.to_string(),
        "'dir/file' is 5 bytes, over this runner's limit of 4 per file (RUNNER_WORKSPACE_MAX_FILE_BYTES)"
    );

    let invalid = ws.read("../etc/passwd").expect_err("traversal");
    assert_eq!(
        invalid.kind(),
        ErrorKind {
            status: 400,
            code: "invalid_path"
        }
    );
    assert_eq!(
        invalid.to_string(),
        "invalid bundle relativePath '../etc/passwd'"
    );

    assert_eq!(ws.read("small").expect("at the limit").size, 4);
}

#[test]
fn every_error_maps_to_a_status_and_code() {
    let io = WorkspaceError::io("write", "a", std::io::Error::other("disk on fire"));
    assert_eq!(
        io.kind(),
        ErrorKind {
            status: 500,
            code: "workspace_io_failed"
        }
    );
    assert_eq!(
        io.to_string(),
        "workspace write failed for 'a': disk on fire"
    );
    let conflict = WorkspaceError::PathConflict {
        path: "a".into(),
        reason: "a directory is there",
    };
    assert_eq!(
        conflict.kind(),
        ErrorKind {
            status: 409,
            code: "path_conflict"
        }
    );
    let link = WorkspaceError::SymlinkInPath { path: "a".into() };
    assert_eq!(link.kind().code, "invalid_path");
    let change =
        WorkspaceError::too_large(Limit::ChangeSetBytes, None, Some(20_971_520), 16_777_216);
    assert_eq!(
        change.to_string(),
        "the change set is 20971520 bytes decoded, over this runner's limit of 16777216 (RUNNER_WORKSPACE_MAX_CHANGE_BYTES)"
    );
}

#[test]
fn default_limits() {
    let limits = WorkspaceLimits::default();
    assert_eq!(limits.max_file_bytes, 10 << 20);
    assert_eq!(limits.max_change_set_bytes, 16 << 20);
    assert_eq!(limits.max_workspace_bytes, 64 << 20);
    assert_eq!(limits.max_files, 10_000);
}

#[test]
fn create_makes_a_private_root_and_open_reopens_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("a/b/ws");
    let ws = Workspace::create(&root, WorkspaceLimits::default()).expect("create");
    assert_eq!(ws.root(), root);
    let mode = fs::metadata(&root).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    put(&ws, "x", b"1");
    let again = Workspace::open(&root, WorkspaceLimits::default()).expect("open");
    assert_eq!(paths(&again), ["x"]);
    assert!(Workspace::open(&dir.path().join("missing"), WorkspaceLimits::default()).is_err());
}

#[test]
fn every_error_kind_is_found_by_its_code_and_no_other_code_is() {
    for kind in ErrorKind::ALL {
        assert_eq!(ErrorKind::from_code(kind.code), Some(kind));
    }
    let codes: std::collections::HashSet<_> = ErrorKind::ALL.iter().map(|k| k.code).collect();
    assert_eq!(codes.len(), ErrorKind::ALL.len(), "codes are distinct");
    for other in ["", "unauthorized", "workspace_failed", "INVALID_PATH"] {
        assert_eq!(ErrorKind::from_code(other), None, "{other}");
    }
    assert_eq!(
        WorkspaceError::NotFound { path: "a".into() }.kind(),
        ErrorKind::NOT_FOUND
    );
}
