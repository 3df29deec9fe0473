//! The command line and the entry file, as a runner invokes `telo`.

mod support;

use support::{launch, run_to_exit};

#[test]
fn a_manifest_without_a_fake_telo_block_prints_one_line_and_exits_zero() {
    let mut fake = launch("kind: Telo.Application\nmetadata: { name: demo }\n").spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "fake-telo: ran app.yaml\n");
}

#[test]
fn options_may_follow_the_entry_and_run_may_be_omitted() {
    let manifest = "fakeTelo: { stdout: [started] }\n";
    for args in [
        &["run", "--no-open", "app.yaml"][..],
        &["run", "app.yaml", "--inspect=127.0.0.1:0", "--no-open"],
        &["app.yaml", "--inspect", "127.0.0.1:0", "--no-open"],
    ] {
        let mut fake = launch(manifest).args(args).spawn();
        assert_eq!(fake.next_line(), "started", "args {args:?}");
        let (status, _) = fake.wait_for_exit();
        assert_eq!(status.code(), Some(0), "args {args:?}");
    }
}

#[test]
fn an_absolute_entry_path_is_read_wherever_the_process_runs() {
    let entry_dir = tempfile::tempdir().unwrap();
    let entry = entry_dir.path().join("elsewhere.yaml");
    std::fs::write(&entry, "fakeTelo: { stdout: [from elsewhere] }\n").unwrap();
    let entry = entry.to_str().unwrap();
    let (status, stdout, _) = run_to_exit(&["run", entry]);
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "from elsewhere\n");
}

#[test]
fn the_first_document_with_a_fake_telo_block_is_the_script() {
    let manifest = "kind: Telo.Application\n---\nkind: Http.Server\nfakeTelo:\n  stdout: [second]\n---\nfakeTelo:\n  stdout: [third]\n";
    let mut fake = launch(manifest).spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "second\n");
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let (status, stdout, stderr) = run_to_exit(&["run", "--verbose", "app.yaml"]);
    assert_eq!(status.code(), Some(2));
    assert_eq!(stdout, "");
    assert!(stderr.contains("unknown option '--verbose'"), "{stderr}");
    assert!(stderr.contains("usage: fake-telo run"), "{stderr}");
}

#[test]
fn a_bad_inspect_address_and_a_missing_entry_are_usage_errors() {
    for args in [
        &["run", "--inspect", "nowhere", "app.yaml"][..],
        &["run", "--no-open"],
        &[],
    ] {
        let (status, _, stderr) = run_to_exit(args);
        assert_eq!(status.code(), Some(2), "args {args:?}: {stderr}");
    }
}

#[test]
fn version_prints_one_line() {
    let (status, stdout, _) = run_to_exit(&["--version"]);
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, format!("fake-telo {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn a_missing_entry_file_fails_with_exit_one() {
    let (status, stdout, stderr) = run_to_exit(&["run", "missing.yaml"]);
    assert_eq!(status.code(), Some(1));
    assert_eq!(stdout, "");
    assert!(
        stderr.contains("cannot read entry 'missing.yaml'"),
        "{stderr}"
    );
}

#[test]
fn an_invalid_entry_fails_with_exit_one_and_says_why() {
    let cases = [
        ("fakeTelo: [unclosed\n", "not valid YAML"),
        (
            "fakeTelo: { exitAfterMS: 10 }\n",
            "unknown field `exitAfterMS`",
        ),
        ("fakeTelo: { exitCode: nope }\n", "invalid fakeTelo block"),
        (
            "fakeTelo: { lines: 3 }\n",
            "`lines` and `linePadding` need `lineEveryMs`",
        ),
        (
            "fakeTelo: { linePadding: 10 }\n",
            "`lines` and `linePadding` need `lineEveryMs`",
        ),
    ];
    for (manifest, reason) in cases {
        let mut fake = launch(manifest).spawn();
        let (status, stdout) = fake.wait_for_exit();
        let stderr = fake.stderr_text();
        assert_eq!(status.code(), Some(1), "{manifest}");
        assert_eq!(stdout, "", "{manifest}");
        assert!(stderr.contains("invalid entry 'app.yaml'"), "{stderr}");
        assert!(stderr.contains(reason), "{manifest}: {stderr}");
    }
}
