//! Sessions are isolated from the runner and from each other: a workload
//! sees none of the runner's processes, environment or files, nor another
//! session's directory, cannot signal the runner, and no process it starts
//! outlives its session. The test process plays the runner.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use runner_core::types::{AvailabilityReport, PullPolicy, RunStatus};
use runner_core::{Backend, ProbeConfig};
use runner_local::{SandboxConfig, sandbox::check::SandboxHealth};
use serde_json::json;
use support::{Events, Harness, Output, app_spec, bundle_spec, limits, output_now, with_env};

fn probe_config() -> ProbeConfig {
    ProbeConfig {
        image: "local".to_owned(),
        pull_policy: PullPolicy::Missing,
    }
}

/// Runs `script` with `sh -c` as an app session and returns its output
/// once it exited 0.
async fn run_script(harness: &Harness, script: &str, env: &[(&str, &str)]) -> String {
    let session = harness.start(with_env(app_spec(Some(&["sh", "-c", script])), env));
    let status = Events::of(&session).terminal().await;
    let output = output_now(&session);
    assert_eq!(status, RunStatus::Exited { code: 0 }, "{output}");
    output
}

/// The test process's own environment, as `NAME=value` lines a workload
/// must never see (leaving out what a workload is given on purpose).
fn runner_assignments() -> Vec<String> {
    let given = ["HOME", "PATH", "TERM", "SHELL", "PWD", "FORCE_COLOR"];
    std::env::vars()
        .filter(|(name, value)| !given.contains(&name.as_str()) && value.len() > 3)
        .map(|(name, value)| format!("{name}={value}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_environment_cannot_be_read_through_proc() {
    let leaks = runner_assignments();
    assert!(
        !leaks.is_empty(),
        "the test process has no environment to leak"
    );
    let harness = Harness::new();
    let output = run_script(
        &harness,
        "for f in /proc/$PPID/environ /proc/1/environ /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done; echo done",
        &[],
    )
    .await;
    assert!(output.contains("done"), "{output}");
    let text = output.replace("\r\n", "\n");
    for leak in &leaks {
        assert!(
            !text.lines().any(|line| line == leak),
            "{leak} reached the workload"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_process_of_the_runner_is_visible() {
    let harness = Harness::new();
    let runner = std::env::current_exe().unwrap();
    let runner = runner.to_string_lossy();
    let output = run_script(
        &harness,
        "for d in /proc/[0-9]*; do printf '%s: ' ${d#/proc/}; tr '\\0' ' ' < $d/cmdline; echo; done",
        &[],
    )
    .await;
    assert!(!output.contains(runner.as_ref()), "{output}");
    let pid = std::process::id().to_string();
    assert!(
        !output
            .lines()
            .any(|line| line.starts_with(&format!("{pid}: "))),
        "{output}"
    );
    // Only the sandbox's own processes: its init, the shell, what it runs.
    assert!(output.lines().count() <= 6, "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_cannot_be_signalled() {
    let harness = Harness::new();
    let pid = std::process::id().to_string();
    let output = run_script(
        &harness,
        "if kill -0 \"$RUNNER\" 2>/dev/null; then echo reached; else echo unreachable; fi",
        &[("RUNNER", &pid)],
    )
    .await;
    assert_eq!(output, "unreachable\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_outside_the_session_cannot_be_read() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("tokens");
    std::fs::write(&secret, "tok-3b9d2c71e0\n").unwrap();
    let harness = Harness::new();
    let output = run_script(
        &harness,
        "cat \"$SECRET\" 2>&1; ls \"$HOME/..\"/.. 2>&1; cat /etc/shadow 2>&1; echo end",
        &[("SECRET", &secret.to_string_lossy())],
    )
    .await;
    assert!(!output.contains("tok-3b9d2c71e0"), "{output}");
    assert!(output.contains("No such file or directory"), "{output}");
    assert!(output.ends_with("end\r\n"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_file_is_covered_even_inside_a_directory_the_sandbox_shows() {
    let shown = tempfile::tempdir().unwrap();
    let tokens = shown.path().join("tokens");
    std::fs::write(&tokens, "tok-3b9d2c71e0\n").unwrap();
    std::fs::write(shown.path().join("readme"), "shown\n").unwrap();
    let (dir, file) = (shown.path().to_owned(), tokens.clone());
    let harness = Harness::with(
        move |c| {
            if let SandboxConfig::Bubblewrap(sandbox) = &mut c.sandbox {
                sandbox.read_only.push(dir);
                sandbox.hidden.push(file);
            }
        },
        limits(),
    );
    let output = run_script(
        &harness,
        "cat \"$DIR/readme\"; cat \"$DIR/tokens\" 2>&1; echo end",
        &[("DIR", &shown.path().to_string_lossy())],
    )
    .await;
    // The directory is there, the token file's contents are not (a device
    // bound without device access cannot even be opened).
    assert!(output.starts_with("shown\r\n"), "{output}");
    assert!(!output.contains("tok-3b9d2c71e0"), "{output}");
    assert!(output.ends_with("end\r\n"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_directory_is_invisible() {
    let harness = Harness::new();
    let first = harness.start(app_spec(Some(&[
        "sh",
        "-c",
        "echo private > mine; echo ready; while :; do sleep 0.1; done",
    ])));
    Output::of(&first).until("ready").await;
    let root = harness.config.work_root.to_string_lossy().into_owned();
    let theirs = format!("{root}/{}/app/mine", first.id());
    assert!(std::path::Path::new(&theirs).is_file());
    let output = run_script(
        &harness,
        "ls -A \"$ROOT\"; echo --; cat \"$THEIRS\" 2>&1; echo end",
        &[("ROOT", &root), ("THEIRS", &theirs)],
    )
    .await;
    // The work root holds nothing but the session's own directory.
    let (listed, read) = output.split_once("--\r\n").unwrap();
    assert_eq!(listed.lines().count(), 1, "{output}");
    assert!(!listed.contains(first.id()), "{output}");
    assert!(!read.contains("private"), "{output}");
    assert!(read.contains("No such file or directory"), "{output}");
    harness.registry.stop(first.id()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_environment_never_reaches_the_sandbox_itself() {
    // `bwrap` runs as the runner's user outside every namespace: a session
    // env holding LD_PRELOAD must never become its environment.
    let harness = Harness::new();
    let output = run_script(
        &harness,
        "tr '\\0' '\\n' < /proc/1/environ; echo; echo \"mine=$SESSION_ONLY\"",
        &[("SESSION_ONLY", "from-the-session")],
    )
    .await;
    let before_own_line = output.rsplit_once("mine=").unwrap().0;
    assert!(!before_own_line.contains("from-the-session"), "{output}");
    assert!(output.ends_with("mine=from-the-session\r\n"), "{output}");
}

/// Starts a daemon that left the session (`setsid`) and ignores SIGHUP and
/// SIGTERM, then runs `rest`.
fn escaping(rest: &str) -> String {
    format!(
        "setsid sh -c 'trap \"\" HUP TERM; touch escaped; while :; do sleep 1; done' \"$MARKER\" & while [ ! -e escaped ]; do sleep 0.01; done; echo escaped; {rest}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_daemon_ends_when_the_session_is_stopped() {
    let harness = Harness::new();
    let marker = support::marker("escaped");
    let script = escaping("while :; do sleep 0.1; done");
    let session = harness.start(with_env(
        app_spec(Some(&["sh", "-c", &script])),
        &[("MARKER", &marker)],
    ));
    Output::of(&session).until("escaped").await;
    support::wait_for_marker(&marker).await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
    support::wait_until_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_daemon_ends_when_the_workload_exits() {
    let harness = Harness::new();
    let marker = support::marker("escaped");
    let script = escaping("exit 0");
    let session = harness.start(with_env(
        app_spec(Some(&["sh", "-c", &script])),
        &[("MARKER", &marker)],
    ));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert!(output_now(&session).contains("escaped"));
    support::wait_until_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_daemon_ends_when_the_runner_shuts_down() {
    let harness = Harness::new();
    let marker = support::marker("escaped");
    let script = escaping("trap 'exit 0' TERM; while :; do sleep 0.1; done");
    let session = harness.start(with_env(
        app_spec(Some(&["sh", "-c", &script])),
        &[("MARKER", &marker)],
    ));
    Output::of(&session).until("escaped").await;
    support::wait_for_marker(&marker).await;
    harness
        .registry
        .shutdown(std::time::Duration::from_secs(10))
        .await;
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
    support::wait_until_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_reaches_the_workload_and_leaves_the_sandbox_running() {
    let harness = Harness::new();
    let session = harness.start(app_spec(Some(&[
        "sh",
        "-c",
        "trap 'echo interrupted' INT; echo ready; while :; do sleep 0.1; done",
    ])));
    let mut output = Output::of(&session);
    output.until("ready").await;
    let handle = support::handle_of(&session).await;
    handle.write_stdin("\u{3}".into());
    output.until("interrupted").await;
    handle.write_stdin("\u{3}".into());
    output.until_count("interrupted", 2).await;
    assert!(!session.is_terminal());
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
}

fn missing_bwrap_harness() -> Harness {
    Harness::with(
        |c| {
            if let SandboxConfig::Bubblewrap(sandbox) = &mut c.sandbox {
                sandbox.bwrap = "/nonexistent/bin/bwrap".to_owned();
            }
        },
        limits(),
    )
}

const NO_BWRAP: &str = "Sessions run in a bubblewrap sandbox, but '/nonexistent/bin/bwrap' was not found on this runner's host.";
const INSTALL_BWRAP: &str = "Install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap), or set RUNNER_LOCAL_SANDBOX=none to run sessions without isolation from the runner.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bubblewrap_the_probe_says_so_and_no_session_runs() {
    let harness = missing_bwrap_harness();
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Unavailable {
            message: NO_BWRAP.to_owned(),
            remediation: Some(INSTALL_BWRAP.to_owned()),
        }
    );
    for spec in [
        bundle_spec(json!({})),
        app_spec(Some(&["sh", "-c", "echo ran"])),
    ] {
        let session = harness.start(spec);
        assert_eq!(
            Events::of(&session).terminal().await,
            RunStatus::failed(format!("start: {NO_BWRAP} {INSTALL_BWRAP}"))
        );
        assert!(!output_now(&session).contains("ran"));
        assert!(!harness.session_dir(&session).exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bubblewrap_that_cannot_create_namespaces_is_quoted_and_no_session_runs() {
    let dir = tempfile::tempdir().unwrap();
    let bwrap = dir.path().join("bwrap");
    support::install_script(
        &bwrap,
        "#!/bin/sh\necho 'bwrap: No permissions to create a new namespace, likely because the kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n",
    );
    let configured = bwrap.to_string_lossy().into_owned();
    let harness = Harness::with(
        move |c| {
            if let SandboxConfig::Bubblewrap(sandbox) = &mut c.sandbox {
                sandbox.bwrap = configured;
            }
        },
        limits(),
    );
    let message = format!(
        "bubblewrap ('{}') cannot create a session sandbox on this host: bwrap: No permissions to create a new namespace, likely because the kernel does not allow non-privileged user namespaces.",
        bwrap.display()
    );
    match harness.backend.probe(&probe_config()).await {
        AvailabilityReport::Unavailable {
            message: said,
            remediation,
        } => {
            assert_eq!(said, message);
            let remediation = remediation.unwrap();
            assert!(remediation.contains("user namespaces"), "{remediation}");
            assert!(
                remediation.ends_with("or set RUNNER_LOCAL_SANDBOX=none to run sessions without isolation from the runner."),
                "{remediation}"
            );
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    let session = harness.start(app_spec(Some(&["sh", "-c", "echo ran"])));
    match Events::of(&session).terminal().await {
        RunStatus::Failed { message: failed } => {
            assert!(
                failed.starts_with(&format!("start: {message} ")),
                "{failed}"
            );
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_who_opted_out_runs_sessions_unsandboxed() {
    let harness = Harness::with(|c| c.sandbox = SandboxConfig::None, limits());
    assert_eq!(harness.backend.sandbox_health().await, SandboxHealth::Off);
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Ready
    );
    let pid = std::process::id().to_string();
    let output = run_script(
        &harness,
        "if kill -0 \"$RUNNER\" 2>/dev/null; then echo reached; else echo unreachable; fi",
        &[("RUNNER", &pid)],
    )
    .await;
    assert_eq!(output, "reached\r\n");
}

fn bounded(memory_bytes: u64, processes: u64, disk_bytes: u64) -> Harness {
    Harness::with(
        move |c| {
            c.limits = runner_local::sandbox::limits::SessionLimits {
                memory_bytes,
                processes,
                cpu_millis: 1000,
                disk_bytes,
            };
        },
        limits(),
    )
}

/// The soft and hard values of `name` in a `/proc/<pid>/limits` text.
fn limit_of(text: &str, name: &str) -> (String, String) {
    let line = text
        .lines()
        .find(|line| line.starts_with(name))
        .unwrap_or_else(|| panic!("{name} missing from {text}"));
    let mut values = line[name.len()..].split_whitespace();
    (
        values.next().unwrap().to_owned(),
        values.next().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_processes_run_under_its_resource_limits() {
    let harness = bounded(64 << 20, 100, 1 << 20);
    let output = run_script(&harness, "cat /proc/self/limits", &[]).await;
    let text = output.replace("\r\n", "\n");
    let both = |value: &str| (value.to_owned(), value.to_owned());
    assert_eq!(limit_of(&text, "Max processes"), both("100"), "{text}");
    assert_eq!(limit_of(&text, "Max data size"), both("67108864"), "{text}");
    assert_eq!(limit_of(&text, "Max file size"), both("1048576"), "{text}");
    assert_eq!(limit_of(&text, "Max core file size"), both("0"), "{text}");
    let (soft, hard) = limit_of(&text, "Max open files");
    assert_eq!(soft, hard, "{text}");
    assert!(soft.parse::<u64>().unwrap() <= 4096, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_allocate_past_its_memory_bound() {
    let harness = bounded(64 << 20, 100, 1 << 20);
    let output = run_script(
        &harness,
        "python3 -c 'bytearray(256 << 20)' 2>&1 | tail -1; echo end",
        &[],
    )
    .await;
    assert!(output.contains("MemoryError"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_write_a_file_past_its_disk_bound() {
    let harness = bounded(64 << 20, 100, 1 << 20);
    let output = run_script(
        &harness,
        "(head -c 4194304 /dev/zero > big) 2>/dev/null; wc -c < big; (head -c 4194304 /dev/zero > /tmp/big) 2>/dev/null; wc -c < /tmp/big",
        &[],
    )
    .await;
    // The shell reports each writer killed by SIGXFSZ; the sizes follow.
    let sizes: Vec<&str> = output
        .lines()
        .filter(|line| line.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    assert_eq!(sizes, ["1048576", "1048576"], "{output}");
}
