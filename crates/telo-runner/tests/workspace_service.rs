//! `telo-runner workspace`: the pod-local workspace service as the binary
//! runs it in a Kubernetes watch pod's `workspace` container.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use runner_workspace_service::client::WorkspaceClient;

const BIN: &str = env!("CARGO_BIN_EXE_telo-runner");
const TOKEN: &str = "a-session-token-of-at-least-32-characters";
/// Every wait in these tests is bounded by this.
const BOUND: Duration = Duration::from_secs(30);

/// The service process: its stdout lines and its exit arrive on channels;
/// it is killed if the test ends before it exited.
struct Service {
    pid: Pid,
    lines: mpsc::Receiver<String>,
    exited: mpsc::Receiver<ExitStatus>,
    reaped: bool,
}

impl Service {
    fn spawn(vars: &[(&str, &str)]) -> (Service, std::process::ChildStderr) {
        let mut command = Command::new(BIN);
        command
            .arg("workspace")
            .env_clear()
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child: Child = command.spawn().unwrap();
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (line_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (exit_tx, exited) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(status) = child.wait() {
                let _ = exit_tx.send(status);
            }
        });
        let service = Service {
            pid,
            lines,
            exited,
            reaped: false,
        };
        (service, stderr)
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let status = self
            .exited
            .recv_timeout(BOUND)
            .expect("the service exits in time");
        self.reaped = true;
        status
    }

    /// The address of its `listening on http://<addr>` line.
    fn listening(&self) -> SocketAddr {
        loop {
            let line = self
                .lines
                .recv_timeout(BOUND)
                .expect("the service prints its address in time");
            if let Some(addr) = line.strip_prefix("listening on http://") {
                return addr.parse().unwrap();
            }
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if !self.reaped && self.exited.try_recv().is_err() {
            let _ = kill(self.pid, Signal::SIGKILL);
            let _ = self.exited.recv_timeout(BOUND);
        }
    }
}

/// Runs the subcommand to its exit: the code and everything on stderr.
fn refused(vars: &[(&str, &str)]) -> (Option<i32>, String) {
    let (mut service, mut stderr) = Service::spawn(vars);
    let mut text = String::new();
    stderr.read_to_string(&mut text).unwrap();
    (service.wait_exit().code(), text)
}

#[test]
fn bad_configuration_exits_2_with_the_exact_message() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workspace");
    let root = root.to_str().unwrap();
    let cases: [(&[(&str, &str)], &str); 4] = [
        (
            &[("RUNNER_WORKSPACE_DIR", root)],
            "RUNNER_WORKSPACE_TOKEN must be set to the session's token (at least 32 characters).\n",
        ),
        (
            &[("RUNNER_WORKSPACE_TOKEN", TOKEN)],
            "RUNNER_WORKSPACE_DIR must be set to the absolute workspace directory to serve.\n",
        ),
        (
            &[
                ("RUNNER_WORKSPACE_DIR", root),
                ("RUNNER_WORKSPACE_TOKEN", "too-short"),
            ],
            "RUNNER_WORKSPACE_TOKEN must be at least 32 characters, got 9.\n",
        ),
        (
            &[
                ("RUNNER_WORKSPACE_DIR", "relative/dir"),
                ("RUNNER_WORKSPACE_TOKEN", TOKEN),
            ],
            "RUNNER_WORKSPACE_DIR must be an absolute path, got 'relative/dir'.\n",
        ),
    ];
    for (vars, message) in cases {
        assert_eq!(refused(vars), (Some(2), message.to_owned()), "{vars:?}");
    }
    assert!(
        !dir.path().join("workspace").exists(),
        "nothing is created before the configuration holds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_service_serves_health_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workspace");
    let (mut service, mut stderr) = Service::spawn(&[
        ("RUNNER_WORKSPACE_DIR", root.to_str().unwrap()),
        ("RUNNER_WORKSPACE_LISTEN", "127.0.0.1:0"),
        ("RUNNER_WORKSPACE_TOKEN", TOKEN),
    ]);
    let logs = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let addr = tokio::task::block_in_place(|| service.listening());
    let client = WorkspaceClient::new(runner_core::http_client::client(), addr, TOKEN.to_owned());
    let answer = tokio::time::timeout(
        BOUND,
        runner_core::http_client::client()
            .get(format!("http://{addr}/v1/health"))
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(answer.text().await.unwrap(), r#"{"ok":true}"#);
    assert!(root.is_dir(), "the service creates its directory");
    std::fs::write(root.join("telo.yaml"), "kind: x\n").unwrap();
    let tree = tokio::time::timeout(BOUND, client.tree())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tree.files.len(), 1);
    assert_eq!(tree.files[0].path, "telo.yaml");

    kill(service.pid, Signal::SIGTERM).unwrap();
    let status = tokio::task::block_in_place(|| service.wait_exit());
    assert_eq!(status.code(), Some(0), "SIGTERM stops it gracefully");
    let logs = logs.join().unwrap();
    assert!(!logs.contains(TOKEN), "the token is never logged: {logs}");
}
