//! The start output a script asks for: lines, environment, size, spew and
//! periodic lines.

mod support;

use support::launch;

#[test]
fn stdout_lines_are_printed_and_exit_code_ends_a_batch_script() {
    let mut fake = launch("fakeTelo:\n  stdout: [hello, world]\n  exitCode: 3\n").spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(3));
    assert_eq!(stdout, "hello\nworld\n");
}

#[test]
fn stderr_lines_go_to_stderr_only() {
    let mut fake = launch("fakeTelo:\n  stdout: [out]\n  stderr: [err one, err two]\n").spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "out\n");
    assert_eq!(fake.stderr_text(), "err one\nerr two\n");
}

#[test]
fn print_env_shows_set_empty_and_unset_variables() {
    let mut fake = launch("fakeTelo:\n  printEnv: [FOO, EMPTY, ABSENT]\n")
        .env("FOO", Some("bar baz"))
        .env("EMPTY", Some(""))
        .env("ABSENT", None)
        .spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "FOO=bar baz\nEMPTY=\nABSENT=<unset>\n");
}

#[test]
fn start_output_follows_the_documented_order() {
    // Fields deliberately listed out of order: the output order is fixed.
    let manifest = "fakeTelo:\n  exitAfterMs: 0\n  spewBytes: 80\n  listen: [0]\n  printSize: true\n  printEnv: [FOO]\n  stderr: [warned]\n  stdout: [first]\n";
    let mut fake = launch(manifest)
        .args(&["run", "app.yaml", "--inspect", "127.0.0.1:0"])
        .env("FOO", Some("1"))
        .spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(fake.stderr_text(), "warned\n");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 6, "{stdout:?}");
    assert_eq!(lines[..3], ["first", "FOO=1", "size unknown"]);
    assert!(lines[3].starts_with("listening on "), "{stdout:?}");
    assert!(
        lines[4].starts_with("inspect listening on 127.0.0.1:"),
        "{stdout:?}"
    );
    assert_eq!(lines[5].len(), 79, "the spewed line comes last: {stdout:?}");
}

#[test]
fn spew_bytes_writes_exactly_that_many_bytes_with_a_newline_every_80() {
    let total: usize = 3 * 65_536 + 123;
    let mut fake = launch(&format!("fakeTelo:\n  spewBytes: {total}\n")).spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    let bytes = stdout.as_bytes();
    assert_eq!(bytes.len(), total);
    for (index, &byte) in bytes.iter().enumerate() {
        if index % 80 == 79 {
            assert_eq!(byte, b'\n', "byte {index}");
        } else {
            assert!(byte.is_ascii_graphic(), "byte {index} is {byte}");
        }
    }
}

#[test]
fn print_size_without_a_terminal_reports_size_unknown() {
    let mut fake = launch("fakeTelo: { printSize: true }\n").spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "size unknown\n");
}

#[test]
fn periodic_lines_are_numbered_timestamped_and_end_the_run_after_the_last() {
    let mut fake = launch("fakeTelo:\n  lineEveryMs: 5\n  lines: 4\n  exitCode: 6\n").spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(6));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout:?}");
    let mut previous_millis = 0_u128;
    for (index, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[..2], ["line", &(index + 1).to_string()], "{line}");
        let millis: u128 = fields[2].parse().expect("unix millis");
        assert!(millis >= previous_millis, "{stdout:?}");
        previous_millis = millis;
    }
}

#[test]
fn stdout_hex_writes_raw_bytes_verbatim_after_the_stdout_lines() {
    // Invalid UTF-8, a NUL, and an escape sequence cut across two writes.
    let mut fake =
        launch("fakeTelo:\n  stdout: [text]\n  stdoutHex: [\"ff fe 00 1b\", \"5b 33 31 6d c3\"]\n")
            .spawn();
    let rest = fake.rest_of_stdout();
    let (status, _) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        rest,
        b"text\n\xff\xfe\x00\x1b\x5b\x33\x31\x6d\xc3".to_vec(),
        "{rest:?}"
    );
}

#[test]
fn stdout_hex_that_is_not_hex_is_refused() {
    let mut fake = launch("fakeTelo:\n  stdoutHex: [\"xyz\"]\n").spawn();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(1));
    assert_eq!(stdout, "");
    assert!(
        fake.stderr_text()
            .contains("`stdoutHex` entry 1 is not hex")
    );
}
