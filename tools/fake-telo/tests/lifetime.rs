//! When a scripted run ends: echo, timers, servers and signals.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use support::{http_get, launch};

#[test]
fn echo_copies_stdin_lines_until_a_line_exit() {
    let mut fake = launch("fakeTelo:\n  stdout: [ready]\n  echo: true\n  exitCode: 4\n").spawn();
    assert_eq!(fake.next_line(), "ready");
    fake.write_stdin("hello\n");
    assert_eq!(fake.next_line(), "hello");
    fake.write_stdin("exit now\r\n");
    assert_eq!(fake.next_line(), "exit now\r");
    fake.write_stdin("exit\r\n");
    let (status, rest) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(4));
    assert_eq!(rest, "");
}

#[test]
fn echo_ends_the_run_when_stdin_closes() {
    let mut fake = launch("fakeTelo: { echo: true, exitCode: 5 }\n").spawn();
    fake.write_stdin("last words");
    fake.close_stdin();
    let (status, rest) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(5));
    assert_eq!(rest, "last words");
}

#[test]
fn exit_after_ms_ends_the_run_no_earlier_than_asked() {
    let started = Instant::now();
    let mut fake = launch("fakeTelo: { exitAfterMs: 150, exitCode: 9 }\n").spawn();
    let (status, _) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(9));
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[test]
fn exit_after_ms_also_ends_a_serving_script() {
    let mut fake = launch("fakeTelo: { listen: [0], exitAfterMs: 100 }\n").spawn();
    assert!(fake.next_line().starts_with("listening on "));
    let (status, _) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_serving_script_runs_until_sigterm_ends_it() {
    let mut fake = launch("fakeTelo: { listen: [0] }\n").spawn();
    let port = fake.line_after("listening on ");
    // Still serving after start: the request is answered, so it did not exit.
    let (_, body) = http_get(&format!("127.0.0.1:{port}"), "/");
    assert_eq!(body, format!("ok {port}"));
    kill_process(Pid::from_child(fake.child()), Signal::TERM).unwrap();
    let (status, _) = fake.wait_for_exit();
    assert_eq!(status.signal(), Some(15));
}

#[test]
fn sigint_ends_a_running_script() {
    let mut fake = launch("fakeTelo: { stdout: [up], echo: true }\n").spawn();
    assert_eq!(fake.next_line(), "up");
    kill_process(Pid::from_child(fake.child()), Signal::INT).unwrap();
    let (status, _) = fake.wait_for_exit();
    assert_eq!(status.signal(), Some(2));
}

#[test]
fn sigint_ends_a_running_script_even_when_the_launcher_left_it_ignored() {
    for (signal, number) in [(Signal::INT, 2), (Signal::TERM, 15)] {
        let mut fake = launch("fakeTelo: { stdout: [up], echo: true }\n")
            .with_stop_signals_ignored()
            .spawn();
        assert_eq!(fake.next_line(), "up");
        kill_process(Pid::from_child(fake.child()), signal).unwrap();
        let (status, _) = fake.wait_for_exit();
        assert_eq!(status.signal(), Some(number), "{signal:?}");
    }
}

#[test]
fn wait_for_input_holds_the_start_output_until_a_line_arrives() {
    let mut fake =
        launch("fakeTelo: { waitForInput: true, stdout: [started], echo: true }\n").spawn();
    // The line that releases the run is consumed, not echoed; later lines are.
    fake.write_stdin("go\nagain\n");
    assert_eq!(fake.next_line(), "started");
    assert_eq!(fake.next_line(), "again");
    fake.write_stdin("exit\n");
    let (status, _) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn wait_for_input_also_ends_at_the_end_of_stdin() {
    let mut fake = launch("fakeTelo: { waitForInput: true, stdout: [started] }\n").spawn();
    fake.close_stdin();
    let (status, stdout) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "started\n");
}

fn signal(fake: &support::FakeTelo, signal: Signal) {
    kill_process(Pid::from_child(fake.child()), signal).expect("signal fake-telo");
}

#[test]
fn stop_line_is_printed_on_sigterm_and_the_run_exits_zero() {
    let mut fake =
        launch("fakeTelo:\n  stdout: [ready]\n  listen: [0]\n  stopLine: Stopped listening\n  exitCode: 7\n")
            .spawn();
    assert_eq!(fake.next_line(), "ready");
    fake.line_after("listening on ");
    signal(&fake, Signal::TERM);
    let (status, rest) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(rest, "Stopped listening\n");
}

#[test]
fn ignore_sigterm_survives_sigterm_and_still_answers() {
    let mut fake = launch(
        "fakeTelo:\n  stdout: [ready]\n  echo: true\n  ignoreSigterm: true\n  stopLine: bye\n",
    )
    .spawn();
    assert_eq!(fake.next_line(), "ready");
    signal(&fake, Signal::TERM);
    // A pending signal is delivered before the process next runs, so an
    // echo after it proves SIGTERM neither killed nor stopped it.
    fake.write_stdin("still here\n");
    assert_eq!(fake.next_line(), "still here");
    // SIGINT is still the graceful stop.
    signal(&fake, Signal::INT);
    let (status, rest) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(rest, "bye\n");
}
