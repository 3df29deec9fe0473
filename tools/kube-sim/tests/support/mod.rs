//! Shared helpers for kube-sim's black-box tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kube_sim::{KubeSim, KubeSimBuilder};
use serde_json::Value;

pub const WAIT: Duration = Duration::from_secs(20);

pub fn builder() -> KubeSimBuilder {
    // The namespaces these tests create objects in, as an installer would.
    KubeSim::builder()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .namespace("telo-runner")
        .namespace("telo-sessions")
}

pub async fn sim() -> KubeSim {
    builder().start().await.expect("kube-sim starts")
}

/// A raw HTTP answer: status and JSON body.
pub async fn request(
    sim: &KubeSim,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> (u16, Value) {
    let mut req = sim
        .http_client()
        .request(method, format!("{}{path}", sim.url()));
    if let Some(b) = body {
        req = req.header("content-type", content_type).body(b.to_string());
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, json)
}

pub async fn get(sim: &KubeSim, path: &str) -> (u16, Value) {
    request(sim, reqwest::Method::GET, path, None, "").await
}

pub async fn post(sim: &KubeSim, path: &str, body: Value) -> (u16, Value) {
    request(
        sim,
        reqwest::Method::POST,
        path,
        Some(body),
        "application/json",
    )
    .await
}

/// A ConfigMap holding a fake-telo manifest, mounted at /app by [`pod_with_app`].
pub fn app_configmap(name: &str, script: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"telo.yaml": format!("kind: Telo.Application\nmetadata: {{name: demo}}\nfakeTelo:\n{script}")}
    })
}

pub fn pod_with_app(name: &str, configmap: &str, tty: bool) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "session", "image": "telorun/node:24",
                "command": ["telo", "run", "/app/telo.yaml"], "stdin": true, "tty": tty,
                "volumeMounts": [{"name": "app", "mountPath": "/app"}]}],
            "volumes": [{"name": "app", "configMap": {"name": configmap}}]
        }
    })
}

/// Whether `ip` is a pod IP of `sim`: on its pods' subnet with an isolated
/// pod network, else of 127.0.0.0/8.
pub fn is_pod_ip(sim: &KubeSim, ip: &str) -> bool {
    let Ok(ip) = ip.parse::<std::net::Ipv4Addr>() else {
        return false;
    };
    match sim.pod_bridge() {
        Some(bridge) => {
            let subnet = bridge.subnet();
            let (base, len) = subnet.split_once('/').expect("a CIDR");
            let base: std::net::Ipv4Addr = base.parse().expect("an address");
            let mask = u32::MAX << (32 - len.parse::<u32>().expect("a length"));
            u32::from(ip) & mask == u32::from(base) && ip != sim.node_ip()
        }
        None => ip.is_loopback(),
    }
}

/// Waits until pod `name` (namespace `default`) has logged `line`,
/// following its log, for at most [`WAIT`].
pub async fn until_logged(sim: &KubeSim, name: &str, line: &str) {
    until_logged_within(sim, name, line, WAIT).await;
}

/// [`until_logged`] for at most `wait`.
pub async fn until_logged_within(sim: &KubeSim, name: &str, line: &str, wait: Duration) {
    use futures_util::{AsyncBufReadExt as _, TryStreamExt as _};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, LogParams};
    let running = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Running")
    };
    sim.wait_for::<Pod>("default", name, running, wait)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let params = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let stream = pods.log_stream(name, &params).await.unwrap();
    let mut lines = stream.lines();
    tokio::time::timeout(wait, async {
        while let Some(l) = lines.try_next().await.unwrap() {
            if l.trim() == line {
                return;
            }
        }
        panic!("{name} ended before logging {line:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("{name} did not log {line:?}"));
}

/// Names of this machine's links and network namespaces that `pid`'s
/// simulators made (an isolated pod network's bridge, veths and pod
/// namespaces).
pub fn leftovers(pid: u32) -> Vec<String> {
    use std::process::Command;
    let run = |args: &[&str]| {
        String::from_utf8(Command::new("ip").args(args).output().unwrap().stdout).unwrap()
    };
    let link_prefixes = [format!("ksb{pid:x}-"), format!("ksv{pid:x}-")];
    let netns_prefix = format!("kube-sim-{pid}-");
    let mut found: Vec<String> = run(&["-o", "link", "show"])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|n| {
            n.trim_end_matches(':')
                .split('@')
                .next()
                .unwrap()
                .to_owned()
        })
        .filter(|n| link_prefixes.iter().any(|p| n.starts_with(p.as_str())))
        .collect();
    found.extend(
        run(&["netns", "list"])
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&netns_prefix))
            .map(str::to_owned),
    );
    found
}

/// The kube-sim binary with `args` and `path` as its `PATH`: its stdout
/// lines up to the node address, and the process.
pub fn start_binary(args: &[&str], path: Option<&str>) -> (std::process::Child, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    start_binary_in(dir.path(), args, path)
}

/// [`start_binary`] writing its kubeconfig to `dir/kubeconfig`.
pub fn start_binary_in(
    dir: &std::path::Path,
    args: &[&str],
    path: Option<&str>,
) -> (std::process::Child, Vec<String>) {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kube-sim"));
    cmd.arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .arg("--fake-telo")
        .arg(test_support::fake_telo::fake_telo_path())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = Vec::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let done = line.starts_with("node address ");
        lines.push(line.trim_end().to_owned());
        if done {
            break;
        }
    }
    (child, lines)
}

/// SIGTERM to a binary of [`start_binary`]; what it wrote to stderr.
pub fn stop(child: std::process::Child) -> String {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}
