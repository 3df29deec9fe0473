//! Change sets, touch, snapshot and seed.

use std::fs;
use std::time::{Duration, SystemTime};

use runner_api::types::BundleFile;
use runner_api::watch::{
    FileEncoding, WORKSPACE_MARKER, WorkspaceApplyResult, WorkspaceChangeSet, WorkspaceWrite,
};

use super::*;

#[test]
fn utf8_and_base64_writes_land_with_their_parents() {
    let (_dir, ws) = workspace();
    let result = ws
        .apply(&changes(
            vec![
                utf8("/app/telo.yaml", "kind: App\n"),
                base64("bin/blob.bin", "AP8B"),
            ],
            &[],
        ))
        .expect("apply");
    assert_eq!(
        result,
        WorkspaceApplyResult {
            written: 2,
            deleted: 0
        }
    );
    assert_eq!(
        ws.read_bytes("app/telo.yaml").expect("read"),
        b"kind: App\n"
    );
    assert_eq!(ws.read_bytes("bin/blob.bin").expect("read"), [0, 255, 1]);
    assert_eq!(paths(&ws), ["app/telo.yaml", "bin/blob.bin"]);
}

#[test]
fn base64_without_padding_is_accepted() {
    let (_dir, ws) = workspace();
    ws.apply(&changes(vec![base64("a", "aGk")], &[]))
        .expect("apply");
    assert_eq!(ws.read_bytes("a").expect("read"), b"hi");
}

#[test]
fn bad_base64_refuses_the_whole_change_set() {
    let (_dir, ws) = workspace();
    let error = ws
        .apply(&changes(
            vec![utf8("first.txt", "ok"), base64("second.bin", "!!!")],
            &["x"],
        ))
        .expect_err("bad base64");
    assert_eq!(
        error.kind(),
        ErrorKind {
            status: 400,
            code: "invalid_encoding"
        }
    );
    assert!(
        error
            .to_string()
            .starts_with("the content of 'second.bin' is not valid base64")
    );
    assert!(is_empty_dir(ws.root()));
}

#[test]
fn an_invalid_delete_path_refuses_the_writes_too() {
    let (_dir, ws) = workspace();
    let error = ws
        .apply(&changes(vec![utf8("a.txt", "ok")], &["../x"]))
        .expect_err("traversal");
    assert_eq!(error.to_string(), "invalid bundle relativePath '../x'");
    assert!(is_empty_dir(ws.root()));
}

#[test]
fn a_change_set_over_its_cap_is_refused_with_the_limit() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_change_set_bytes: 10,
        ..WorkspaceLimits::default()
    });
    let error = ws
        .apply(&changes(
            vec![utf8("a", "123456"), base64("b", "MTIzNDU2")],
            &[],
        ))
        .expect_err("over the change-set cap");
    assert_eq!(
        error.kind(),
        ErrorKind {
            status: 413,
            code: "workspace_too_large"
        }
    );
    assert_eq!(
        error.to_string(),
        "the change set is 12 bytes decoded, over this runner's limit of 10 (RUNNER_WORKSPACE_MAX_CHANGE_BYTES)"
    );
    assert!(is_empty_dir(ws.root()));
    ws.apply(&changes(vec![utf8("a", "1234567890")], &[]))
        .expect("at the cap");
}

#[test]
fn a_file_over_its_cap_is_refused() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_file_bytes: 3,
        ..WorkspaceLimits::default()
    });
    let error = ws
        .apply(&changes(vec![utf8("ok", "123"), utf8("big", "1234")], &[]))
        .expect_err("over the file cap");
    assert_eq!(
        error.to_string(),
        "'big' is 4 bytes, over this runner's limit of 3 per file (RUNNER_WORKSPACE_MAX_FILE_BYTES)"
    );
    assert!(is_empty_dir(ws.root()));
}

#[test]
fn the_workspace_cap_counts_existing_files_minus_overwritten_ones() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_workspace_bytes: 100,
        ..WorkspaceLimits::default()
    });
    put(&ws, "a", &[b'a'; 50]);
    put(&ws, "b", &[b'b'; 10]);
    // 50 replaced by 80: 90 in all.
    ws.apply(&changes(vec![utf8("a", &"x".repeat(80))], &[]))
        .expect("within");
    // A new 20-byte file: 110.
    let error = ws
        .apply(&changes(vec![utf8("c", &"c".repeat(20))], &[]))
        .expect_err("over the workspace cap");
    assert_eq!(
        error.to_string(),
        "the workspace would hold 110 bytes, over this runner's limit of 100 (RUNNER_WORKSPACE_MAX_BYTES)"
    );
    assert!(!ws.root().join("c").exists());
    // Deleting b in the same change set makes room.
    ws.apply(&changes(vec![utf8("c", &"c".repeat(20))], &["b"]))
        .expect("room made by the delete");
    assert_eq!(ws.size_bytes().expect("size"), 100);
}

#[test]
fn the_workspace_cap_counts_writes_into_excluded_directories() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_workspace_bytes: 10,
        ..WorkspaceLimits::default()
    });
    ws.apply(&changes(vec![utf8(".telo/x", "12345678")], &[]))
        .expect("within");
    assert!(paths(&ws).is_empty(), "excluded directories are not listed");
    assert_eq!(ws.read_bytes(".telo/x").expect("readable"), b"12345678");
    assert!(
        ws.apply(&changes(vec![utf8(".telo/y", "12345678901")], &[]))
            .is_err()
    );
}

#[test]
fn the_file_count_cap_applies_to_the_result() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_files: 2,
        ..WorkspaceLimits::default()
    });
    ws.apply(&changes(vec![utf8("a", "1"), utf8("b", "2")], &[]))
        .expect("two");
    let error = ws
        .apply(&changes(vec![utf8("c", "3")], &[]))
        .expect_err("three");
    assert_eq!(
        error.to_string(),
        "the workspace would hold 3 files, over this runner's limit of 2 (RUNNER_WORKSPACE_MAX_FILES)"
    );
    ws.apply(&changes(vec![utf8("c", "3")], &["a"]))
        .expect("swap");
}

#[test]
fn a_workspace_already_over_a_cap_can_still_be_cleaned_up() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_files: 2,
        max_workspace_bytes: 4,
        ..WorkspaceLimits::default()
    });
    for name in ["a", "b", "c", "d"] {
        put(&ws, name, b"12");
    }
    assert!(ws.apply(&changes(vec![utf8("e", "")], &[])).is_err());
    let result = ws
        .apply(&changes(vec![], &["a", "b"]))
        .expect("deletes only");
    assert_eq!(result.deleted, 2);
    assert_eq!(paths(&ws), ["c", "d"]);
}

#[test]
fn deletes_count_what_was_there() {
    let (_dir, ws) = workspace();
    put(&ws, "a.txt", b"1");
    put(&ws, "dir/x", b"1");
    put(&ws, "dir/sub/y", b"1");
    let result = ws
        .apply(&changes(
            vec![],
            &["a.txt", "missing.txt", "dir", "under/missing", "a.txt"],
        ))
        .expect("apply");
    assert_eq!(
        result,
        WorkspaceApplyResult {
            written: 0,
            deleted: 2
        }
    );
    assert!(is_empty_dir(ws.root()));
}

#[test]
fn writes_then_deletes_in_one_change_set() {
    let (_dir, ws) = workspace();
    let result = ws
        .apply(&changes(vec![utf8("a", "1"), utf8("b", "2")], &["a"]))
        .expect("apply");
    assert_eq!(
        result,
        WorkspaceApplyResult {
            written: 2,
            deleted: 1
        }
    );
    assert_eq!(paths(&ws), ["b"]);
}

#[test]
fn conflicting_paths_are_refused_before_anything_is_written() {
    let (_dir, ws) = workspace();
    put(&ws, "file", b"1");
    put(&ws, "dir/inner", b"1");
    let under_file = ws
        .apply(&changes(vec![utf8("new", "1"), utf8("file/x", "1")], &[]))
        .expect_err("parent is a file");
    assert_eq!(under_file.kind().status, 409);
    let over_dir = ws
        .apply(&changes(vec![utf8("new", "1"), utf8("dir", "1")], &[]))
        .expect_err("target is a directory");
    assert_eq!(
        over_dir.kind(),
        ErrorKind {
            status: 409,
            code: "path_conflict"
        }
    );
    let within = ws
        .apply(&changes(vec![utf8("new", "1"), utf8("new/x", "1")], &[]))
        .expect_err("the change set conflicts with itself");
    assert_eq!(within.kind().status, 409);
    assert_eq!(paths(&ws), ["dir/inner", "file"]);
}

#[test]
fn writes_keep_an_existing_files_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, ws) = workspace();
    put(&ws, "run.sh", b"#!/bin/sh\n");
    let path = ws.root().join("run.sh");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o750)).expect("chmod");
    ws.apply(&changes(vec![utf8("run.sh", "#!/bin/sh\necho\n")], &[]))
        .expect("apply");
    let mode = fs::metadata(&path).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o750);
}

#[test]
fn touch_changes_the_mtime_and_keeps_the_bytes() {
    let (_dir, ws) = workspace();
    put(&ws, "telo.yaml", b"kind: App\n");
    let path = ws.root().join("telo.yaml");
    let past = SystemTime::now() - Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(&path)
        .expect("open")
        .set_modified(past)
        .expect("set mtime");
    let before = fs::metadata(&path)
        .expect("meta")
        .modified()
        .expect("mtime");
    ws.touch("telo.yaml").expect("touch");
    let after = fs::metadata(&path)
        .expect("meta")
        .modified()
        .expect("mtime");
    assert!(after > before);
    assert_eq!(fs::read(&path).expect("read"), b"kind: App\n");
    assert_eq!(paths(&ws), ["telo.yaml"], "no temporary file is left");
    assert!(matches!(
        ws.touch("missing"),
        Err(WorkspaceError::NotFound { .. })
    ));
}

#[test]
fn a_snapshot_round_trips_through_apply_into_a_fresh_workspace() {
    let (_dir, ws) = workspace();
    put(&ws, "telo.yaml", b"kind: App\n");
    put(&ws, "assets/logo.bin", &[0, 1, 2, 254, 255]);
    put(&ws, "node_modules/x.js", b"left out");
    let snapshot = ws.snapshot().expect("snapshot");
    assert!(snapshot.iter().all(|f| f.encoding == FileEncoding::Base64));
    assert_eq!(
        snapshot.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["assets/logo.bin", "telo.yaml"]
    );

    let (_other_dir, fresh) = workspace();
    let change_set = WorkspaceChangeSet {
        write: snapshot
            .iter()
            .map(|f| WorkspaceWrite {
                path: f.path.clone(),
                content: f.content.clone(),
                encoding: Some(f.encoding),
            })
            .collect(),
        delete: vec![],
    };
    fresh.apply(&change_set).expect("apply");
    assert_eq!(fresh.tree().expect("tree"), ws.tree().expect("tree"));
    assert_eq!(fresh.snapshot().expect("snapshot"), snapshot);

    let (_third_dir, restored) = workspace();
    restored.restore(&snapshot).expect("restore");
    assert!(restored.root().join(WORKSPACE_MARKER).exists());
}

fn bundle(files: &[(&str, &str)]) -> Vec<BundleFile> {
    files
        .iter()
        .map(|(path, contents)| BundleFile {
            relative_path: (*path).to_owned(),
            contents: (*contents).to_owned(),
        })
        .collect()
}

#[test]
fn seed_writes_the_marker_unless_present() {
    let (_dir, ws) = workspace();
    let result = ws
        .seed(&bundle(&[("telo.yaml", "kind: App\n")]))
        .expect("seed");
    assert_eq!(result.written, 2);
    assert_eq!(paths(&ws), ["telo-workspace.yaml", "telo.yaml"]);
    let marker = ws.read(WORKSPACE_MARKER).expect("marker").content;
    assert_eq!(marker, MARKER_CONTENT);
    assert!(marker.lines().all(|line| line.starts_with('#')));

    let (_dir, ws) = workspace();
    ws.seed(&bundle(&[
        ("telo.yaml", "x"),
        ("./telo-workspace.yaml", "# mine\n"),
    ]))
    .expect("seed");
    assert_eq!(
        ws.read(WORKSPACE_MARKER).expect("marker").content,
        "# mine\n"
    );

    let (_dir, ws) = workspace();
    put(&ws, WORKSPACE_MARKER, b"# already here\n");
    let result = ws.seed(&bundle(&[("telo.yaml", "x")])).expect("seed");
    assert_eq!(result.written, 1);
    assert_eq!(
        ws.read(WORKSPACE_MARKER).expect("marker").content,
        "# already here\n"
    );
}

#[test]
fn seed_is_not_bounded_by_the_change_set_cap() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_change_set_bytes: 4,
        ..WorkspaceLimits::default()
    });
    ws.seed(&bundle(&[("telo.yaml", "kind: App\n")]))
        .expect("seed");
    let error = ws.seed(&bundle(&[("../x", "")])).expect_err("invalid path");
    assert_eq!(error.to_string(), "invalid bundle relativePath '../x'");
}
