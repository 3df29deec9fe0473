//! The local backend's sandbox, black-box, with the runner as a process of
//! its own holding real secrets: a workload reads none of them — not through
//! `/proc` (`/proc/$PPID/environ` gave the whole environment, operator app
//! keys included), not from the token file — sees no runner process, and a
//! daemon it leaves behind dies with a SIGKILLed runner.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Backend, RunnerProcess};
use serde_json::{Value, json};

const TOKEN: &str = "tok-3b9d2c71e0";
const SECRET: &str = "runner-secret-7d1f0a";
const OTHER_APPS_KEY: &str = "other-app-key-5e2c";

/// Everything a workload could try to learn about the runner: every
/// environment `/proc` shows, the token file (`$0`), every command line.
const PROBE: &str = "for f in /proc/$PPID/environ /proc/1/environ /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\" 2>/dev/null; done; cat \"$0\" 2>&1; for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline; echo; done; echo end-of-probe";

async fn post(base: &str, path: &str, body: &Value, token: Option<&str>) -> Value {
    let client = runner_core::http_client::client();
    let mut request = client.post(format!("{base}{path}")).json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    response.json().await.unwrap()
}

async fn output_until_close(runner: &RunnerProcess, id: &str, token: &str) -> String {
    let mut socket = test_support::ws::connect(
        &format!(
            "{}/v1/sessions/{id}/io?lastSeq=0&access_token={token}",
            runner.ws_base()
        ),
        None,
    )
    .await;
    let frames = test_support::ws::read_until_close(&mut socket).await;
    String::from_utf8_lossy(&test_support::ws::output_of(&frames)).into_owned()
}

#[tokio::test]
async fn a_local_workload_reads_no_runner_secret_and_sees_no_runner_process() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let apps = json!({
        "prober": {"image": "unused", "command": ["sh", "-c", PROBE, tokens.to_string_lossy()]},
        "other": {"image": "unused", "env": {"OTHER_KEY": OTHER_APPS_KEY}, "command": ["true"]},
    })
    .to_string();
    let tokens_path = tokens.to_string_lossy().into_owned();
    let runner = RunnerProcess::spawn(
        Backend::Local,
        dir.path(),
        None,
        &[
            ("RUNNER_AUTH_TOKENS_FILE", &tokens_path),
            ("RUNNER_APPS", &apps),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("DATABASE_PASSWORD", SECRET),
        ],
    )
    .await;
    let created = post(
        &runner.base,
        "/v1/apps/prober/sessions",
        &json!({}),
        Some(TOKEN),
    )
    .await;
    let id = created["sessionId"].as_str().unwrap();
    let output = output_until_close(&runner, id, TOKEN).await;
    assert!(output.contains("end-of-probe"), "{output}");
    for secret in [
        SECRET,
        TOKEN,
        OTHER_APPS_KEY,
        "RUNNER_APPS",
        "RUNNER_AUTH_TOKENS_FILE",
    ] {
        assert!(
            !output.contains(secret),
            "{secret} reached the workload: {output}"
        );
    }
    // The token file cannot be read (here the command names it, so it is
    // shown — covered).
    assert!(
        output.contains(&format!("cat: {tokens_path}: ")),
        "{output}"
    );
    let binary = env!("CARGO_BIN_EXE_telo-runner");
    assert!(!output.contains(binary), "the runner is visible: {output}");
}

/// Host pids of the processes with `marker` as an argument.
fn pids_with_marker(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            (cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == marker.as_bytes())
                && state != "Z")
                .then_some(pid)
        })
        .collect()
}

async fn wait_for(what: &str, condition: impl Fn() -> bool) {
    let waited = tokio::time::timeout(test_support::WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

#[tokio::test]
async fn a_daemon_that_left_its_session_dies_with_a_sigkilled_runner() {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("marker-escaped-{}", std::process::id());
    // Leaves the session (`setsid`), ignores SIGHUP and SIGTERM, and runs
    // on while the session's own process waits.
    let script = format!(
        "setsid sh -c 'trap \"\" HUP TERM; while :; do sleep 1; done' {marker} & while :; do sleep 1; done"
    );
    let apps = json!({"escaper": {"image": "unused", "command": ["sh", "-c", script]}}).to_string();
    let mut runner =
        RunnerProcess::spawn(Backend::Local, dir.path(), None, &[("RUNNER_APPS", &apps)]).await;
    post(&runner.base, "/v1/apps/escaper/sessions", &json!({}), None).await;
    wait_for("the daemon to start", || {
        !pids_with_marker(&marker).is_empty()
    })
    .await;
    runner.child.kill().unwrap();
    runner.child.wait().unwrap();
    wait_for("the daemon to end", || pids_with_marker(&marker).is_empty()).await;
}
