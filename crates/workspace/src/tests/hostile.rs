//! What the workload can plant in the directory it shares with the runner.

use std::fs;
use std::os::unix::fs::symlink;
use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;
use rustix::fs::{CWD, FileType, Mode, mknodat};

use super::*;

fn mkfifo(path: &Path) {
    mknodat(CWD, path, FileType::Fifo, Mode::from_raw_mode(0o644), 0).expect("mkfifo");
}

/// Runs `f` on a thread and fails the test if it has not returned within
/// five seconds (a blocked open of a FIFO never would).
fn within_five_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("blocked")
}

#[test]
fn a_symlink_to_etc_passwd_is_skipped_by_the_tree_and_refused_by_read() {
    let (_dir, ws) = workspace();
    put(&ws, "telo.yaml", b"x");
    symlink("/etc/passwd", ws.root().join("passwd")).expect("symlink");
    assert_eq!(paths(&ws), ["telo.yaml"]);
    assert!(
        ws.snapshot()
            .expect("snapshot")
            .iter()
            .all(|f| f.path != "passwd")
    );
    let error = ws.read("passwd").expect_err("a link");
    assert!(
        matches!(error, WorkspaceError::SymlinkInPath { .. }),
        "{error:?}"
    );
    assert_eq!(error.kind().status, 400);
    assert!(ws.read_bytes("passwd").is_err());
    assert!(ws.touch("passwd").is_err());
}

#[test]
fn a_symlinked_directory_is_not_walked_or_read_through() {
    let (dir, ws) = workspace();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::write(outside.join("secret"), b"s3cret").expect("write");
    symlink(&outside, ws.root().join("out")).expect("symlink");
    put(&ws, "sub/ok", b"x");
    symlink("../out", ws.root().join("sub/up")).expect("symlink");
    assert_eq!(paths(&ws), ["sub/ok"]);
    let error = ws.read("out/secret").expect_err("through a link");
    assert!(
        matches!(error, WorkspaceError::SymlinkInPath { .. }),
        "{error:?}"
    );
    assert!(ws.read("sub/up/secret").is_err());
}

#[test]
fn a_symlinked_parent_makes_a_write_fail_and_nothing_lands_outside() {
    let (dir, ws) = workspace();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).expect("mkdir");
    symlink(&outside, ws.root().join("evil")).expect("symlink");
    fs::create_dir(ws.root().join("real")).expect("mkdir");
    symlink(&outside, ws.root().join("real/evil")).expect("symlink");

    for path in ["evil/x.txt", "evil/deeper/x.txt", "real/evil/x.txt"] {
        let error = ws
            .apply(&changes(
                vec![utf8("fine.txt", "1"), utf8(path, "pwned")],
                &[],
            ))
            .expect_err("through a link");
        assert!(
            matches!(error, WorkspaceError::SymlinkInPath { .. }),
            "{path}: {error:?}"
        );
        assert_eq!(
            error.kind(),
            ErrorKind {
                status: 400,
                code: "invalid_path"
            }
        );
        assert!(is_empty_dir(&outside), "{path} wrote outside");
        assert!(
            !ws.root().join("fine.txt").exists(),
            "{path}: partly applied"
        );
    }
    // The write path itself, past the check, refuses the link too.
    let error = ws
        .write_file("evil/x", "evil/x", b"pwned")
        .expect_err("direct");
    assert!(
        matches!(error, WorkspaceError::SymlinkInPath { .. }),
        "{error:?}"
    );
    assert!(is_empty_dir(&outside));
}

#[test]
fn a_symlinked_parent_makes_a_delete_fail_and_nothing_outside_goes() {
    let (dir, ws) = workspace();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::write(outside.join("keep"), b"1").expect("write");
    symlink(&outside, ws.root().join("evil")).expect("symlink");
    let error = ws
        .apply(&changes(vec![], &["evil/keep"]))
        .expect_err("through a link");
    assert!(
        matches!(error, WorkspaceError::SymlinkInPath { .. }),
        "{error:?}"
    );
    assert!(outside.join("keep").exists());
    // Deleting the link itself removes the link, not its target.
    let result = ws.apply(&changes(vec![], &["evil"])).expect("the link");
    assert_eq!(result.deleted, 1);
    assert!(outside.join("keep").exists());
    assert!(fs::symlink_metadata(ws.root().join("evil")).is_err());
}

#[test]
fn deleting_a_directory_does_not_follow_links_inside_it() {
    let (dir, ws) = workspace();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::write(outside.join("keep"), b"1").expect("write");
    put(&ws, "d/file", b"1");
    symlink(&outside, ws.root().join("d/link")).expect("symlink");
    mkfifo(&ws.root().join("d/fifo"));
    let result = ws.apply(&changes(vec![], &["d"])).expect("delete");
    assert_eq!(result.deleted, 1);
    assert!(is_empty_dir(ws.root()));
    assert!(outside.join("keep").exists());
}

#[test]
fn a_symlink_at_the_target_name_is_replaced_not_followed() {
    let (dir, ws) = workspace();
    let target = dir.path().join("target.txt");
    fs::write(&target, b"original").expect("write");
    symlink(&target, ws.root().join("link.yaml")).expect("symlink");
    ws.apply(&changes(vec![utf8("link.yaml", "mine")], &[]))
        .expect("apply");
    assert_eq!(fs::read(&target).expect("read"), b"original");
    assert!(
        fs::symlink_metadata(ws.root().join("link.yaml"))
            .expect("meta")
            .is_file()
    );
    assert_eq!(ws.read_bytes("link.yaml").expect("read"), b"mine");
}

#[test]
fn a_fifo_is_skipped_by_the_tree_and_read_fails_without_blocking() {
    let (_dir, ws) = workspace();
    put(&ws, "telo.yaml", b"x");
    mkfifo(&ws.root().join("pipe"));
    let ws = std::sync::Arc::new(ws);
    let tree_ws = ws.clone();
    let listed = within_five_seconds(move || paths(&tree_ws));
    assert_eq!(listed, ["telo.yaml"]);
    let read_ws = ws.clone();
    let error = within_five_seconds(move || read_ws.read("pipe")).expect_err("a FIFO");
    assert!(
        matches!(error, WorkspaceError::NotAFile { .. }),
        "{error:?}"
    );
    let touch_ws = ws.clone();
    assert!(within_five_seconds(move || touch_ws.touch("pipe")).is_err());
    let snap_ws = ws.clone();
    assert_eq!(
        within_five_seconds(move || snap_ws.snapshot())
            .expect("snapshot")
            .len(),
        1
    );
}

#[test]
fn a_file_at_the_file_cap_growing_is_refused() {
    let (_dir, ws) = workspace_with(WorkspaceLimits {
        max_file_bytes: 8,
        ..WorkspaceLimits::default()
    });
    put(&ws, "grows", &[b'x'; 9]);
    assert!(matches!(
        ws.read("grows"),
        Err(WorkspaceError::TooLarge {
            limit: Limit::FileBytes,
            ..
        })
    ));
}

#[test]
fn names_that_are_not_utf8_are_left_out() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let (_dir, ws) = workspace();
    put(&ws, "ok", b"1");
    fs::write(ws.root().join(OsStr::from_bytes(b"bad\xff")), b"1").expect("write");
    assert_eq!(paths(&ws), ["ok"]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the path, a write either is refused or lands inside the
    /// root, even with a link to the outside planted in it.
    #[test]
    fn writes_never_land_outside_the_root(raw in "(\\.\\.|\\.|/|a|evil|b){1,8}") {
        let (dir, ws) = workspace();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        symlink(&outside, ws.root().join("evil")).expect("symlink");
        let result = ws.apply(&changes(vec![utf8(&raw, "x")], &[]));
        prop_assert!(is_empty_dir(&outside), "{raw} wrote outside");
        let mut entries: Vec<String> = fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        entries.sort();
        prop_assert_eq!(entries, vec!["outside".to_owned(), "ws".to_owned()]);
        if result.is_ok() {
            let path = normalize_bundle_path(&raw).expect("accepted paths are valid");
            prop_assert_eq!(ws.read_bytes(&path).expect("written"), b"x".to_vec());
        }
    }
}

#[test]
fn deleting_a_wide_directory_takes_several_batches() {
    let (_dir, ws) = workspace();
    let wide = ws.root().join("wide");
    fs::create_dir(&wide).expect("mkdir");
    for index in 0..2500 {
        fs::write(wide.join(format!("f{index}")), b"").expect("write");
    }
    let result = ws.apply(&changes(vec![], &["wide"])).expect("delete");
    assert_eq!(result.deleted, 1);
    assert!(is_empty_dir(ws.root()));
}

#[test]
fn deleting_a_directory_deeper_than_the_limit_stops_with_an_error() {
    let (_dir, ws) = workspace();
    let deep = vec!["d"; beneath::MAX_DEPTH + 2].join("/");
    put(&ws, &format!("{deep}/f"), b"x");
    let error = ws.apply(&changes(vec![], &["d"])).expect_err("too deep");
    assert!(
        matches!(
            error,
            WorkspaceError::TooLarge {
                limit: Limit::Depth,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.kind().status, 413);
}
