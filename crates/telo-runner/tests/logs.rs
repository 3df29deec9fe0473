//! `LOG_FORMAT=json`: every line a session's work emits names the session at
//! the top level, where log pipelines filter.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use serde_json::{Value, json};
use test_support::fake_telo::fake_telo_path;

const BIN: &str = env!("CARGO_BIN_EXE_telo-runner");

/// Kills the child if the test ends before it exited.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn json_log_lines_inside_a_session_carry_its_id_at_the_top_level() {
    let work_root = tempfile::tempdir().unwrap();
    // An app whose command cannot be started: its failure is logged from
    // inside the session's span, by code that does not repeat the id.
    let apps = json!({"broken": {"image": "x", "command": ["/nonexistent/telo"]}}).to_string();
    let mut child = ChildGuard(
        Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUNNER_LOCAL_TELO", fake_telo_path())
            .env("RUNNER_LOCAL_WORK_DIR", work_root.path().join("sessions"))
            .env("RUNNER_APPS", apps)
            .env("LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .expect("first line names the address")
        .to_owned();
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });

    let client = runner_core::http_client::client();
    let created: Value = client
        .post(format!("{base}/v1/apps/broken/sessions"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();

    let found = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + test_support::WAIT;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = lines_rx.recv_timeout(left) else {
                break;
            };
            let parsed: Value = serde_json::from_str(&line)
                .unwrap_or_else(|err| panic!("not a JSON log line ({err}): {line}"));
            if parsed["session_id"] == json!(id) && parsed["message"] == "session start failed" {
                return Ok(parsed);
            }
            seen.push(line);
        }
        Err(seen)
    })
    .await
    .unwrap();
    let line = found.unwrap_or_else(|seen| {
        panic!(
            "no start-failure line with the session id; saw:\n{}",
            seen.join("\n")
        )
    });
    assert_eq!(line["level"], "ERROR");
    assert!(line["stage"].is_string(), "{line}");
}

#[tokio::test]
async fn running_sessions_unsandboxed_is_logged_as_an_error_at_boot() {
    let work_root = tempfile::tempdir().unwrap();
    let mut child = ChildGuard(
        Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUNNER_LOCAL_TELO", fake_telo_path())
            .env("RUNNER_LOCAL_WORK_DIR", work_root.path().join("sessions"))
            .env("RUNNER_LOCAL_SANDBOX", "none")
            .env("LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let found = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let parsed: Value = serde_json::from_str(&line)
                .unwrap_or_else(|err| panic!("not a JSON log line ({err}): {line}"));
            if parsed["message"].as_str().is_some_and(|m| {
                m.starts_with("RUNNER_LOCAL_SANDBOX=none: sessions run WITHOUT a sandbox")
            }) {
                return Ok(parsed);
            }
            seen.push(line);
            if seen.len() > 50 {
                break;
            }
        }
        Err(seen)
    });
    let line = tokio::time::timeout(test_support::WAIT, found)
        .await
        .expect("the boot log")
        .unwrap()
        .unwrap_or_else(|seen| {
            panic!(
                "no warning about the missing sandbox; saw:\n{}",
                seen.join("\n")
            )
        });
    assert_eq!(line["level"], "ERROR");
}
