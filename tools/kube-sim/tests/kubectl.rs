//! kubectl 1.32 against the binary: get, get -w, create -f, logs,
//! attach -i, delete. Skipped (with a note) where kubectl is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KUBECTL: &str = "/usr/bin/kubectl";

/// The kube-sim binary, killed on drop.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM lets kube-sim stop its processes and remove its sandbox
        // directory; SIGKILL only if it has not exited after a while.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_kube-sim"));
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--fake-telo")
            .arg(test_support::fake_telo::fake_telo_path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(
            first.starts_with("listening on https://127.0.0.1:"),
            "{first:?}"
        );
        Self { child, dir }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn kubectl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(KUBECTL);
        cmd.env("KUBECONFIG", self.kubeconfig())
            .env("HOME", self.dir.path())
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args);
        cmd
    }

    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.kubectl(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Polls `kubectl get` until `pred` holds (kubectl is the client under
    /// test, so this waits on its own answers).
    fn wait_until(&self, args: &[&str], pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, out, _) = self.run(args);
            if pred(&out) {
                return out;
            }
            assert!(Instant::now() < deadline, "timed out; last output {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn have_kubectl() -> bool {
    if Path::new(KUBECTL).exists() {
        true
    } else {
        eprintln!("skipping: {KUBECTL} is not installed");
        false
    }
}

const APP: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: app}
data:
  telo.yaml: |
    kind: Telo.Application
    metadata: {name: demo}
    fakeTelo:
      stdout: ["hello from fake-telo"]
      echo: true
      exitCode: 3
---
apiVersion: v1
kind: Pod
metadata: {name: demo}
spec:
  restartPolicy: Never
  containers:
  - name: session
    image: telorun/node:24
    command: ["telo", "run", "/app/telo.yaml"]
    stdin: true
    volumeMounts: [{name: app, mountPath: /app}]
  volumes: [{name: app, configMap: {name: app}}]
"#;

#[test]
fn kubectl_creates_watches_attaches_to_and_deletes_a_fake_telo_pod() {
    if !have_kubectl() {
        return;
    }
    let server = Server::start();
    let (ok, out, err) = server.run(&["get", "namespaces"]);
    assert!(ok, "{err}");
    // A fresh kube-sim is a fresh cluster.
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(out.contains(ns), "{out}");
    }
    let mut watch = server
        .kubectl(&["get", "pods", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let file = server.write("pod.yaml", APP);
    let (ok, out, err) = server.run(&["create", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("pod/demo created"), "{out}");
    server.wait_until(&["get", "pod", "demo"], |o| o.contains("Running"));
    let (ok, logs, err) = server.run(&["logs", "demo"]);
    assert!(ok, "{err}");
    assert_eq!(logs, "hello from fake-telo\n");
    let mut attach = server
        .kubectl(&["attach", "-i", "demo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    attach
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"echoed line\nexit\n")
        .unwrap();
    let out = attach.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("echoed line"));
    let status = server.wait_until(
        &["get", "pod", "demo", "-o", "jsonpath={.status.phase}"],
        |o| o == "Failed",
    );
    assert_eq!(status, "Failed");
    let (_, table, _) = server.run(&["get", "pod", "demo"]);
    assert!(table.contains("Error"), "{table}");
    let (ok, out, err) = server.run(&["delete", "pod", "demo"]);
    assert!(ok, "{err}");
    assert!(out.contains("pod \"demo\" deleted"), "{out}");
    let _ = watch.kill();
    let watched = watch.wait_with_output().unwrap();
    let lines = String::from_utf8_lossy(&watched.stdout).into_owned();
    assert!(lines.contains("demo"), "get -w printed {lines:?}");
    assert!(lines.lines().count() >= 3, "get -w printed {lines:?}");
}

#[test]
fn kubectl_shows_api_errors_verbatim() {
    if !have_kubectl() {
        return;
    }
    let server = Server::start();
    let (ok, _, err) = server.run(&["get", "pod", "missing"]);
    assert!(!ok);
    assert!(err.contains("pods \"missing\" not found"), "{err}");
    let file = server.write(
        "bad.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: Bad_Name}\n",
    );
    let (ok, _, err) = server.run(&["create", "-f", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains(
            "ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\""
        ),
        "{err}"
    );
}

#[test]
fn kubectl_with_a_wrong_token_must_log_in() {
    if !have_kubectl() {
        return;
    }
    let server = Server::start();
    let with_token = std::fs::read_to_string(server.kubeconfig()).unwrap();
    let wrong: String = with_token
        .lines()
        .map(|line| match line.split_once("token: ") {
            Some((indent, _)) => format!("{indent}token: not-the-token\n"),
            None => format!("{line}\n"),
        })
        .collect();
    assert_ne!(wrong, with_token);
    std::fs::write(server.kubeconfig(), wrong).unwrap();
    let (ok, _, err) = server.run(&["get", "secrets", "-A"]);
    assert!(!ok);
    assert!(
        err.contains("You must be logged in to the server (the server has asked for the client to provide credentials)"),
        "{err}"
    );
}
