//! A real runner on an ephemeral loopback port, with fake-telo as its kernel.
#![allow(dead_code)]

pub mod helm;
pub mod watch;

use std::collections::HashMap;

use reqwest::StatusCode;
use serde_json::Value;
use telo_runner::server::RunningService;
use tempfile::TempDir;
use test_support::fake_telo::fake_telo_path;
use test_support::sse::SseStream;
use test_support::ws::{self, Socket};

/// Which backend a runner under test uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    /// Pods on a kube-sim cluster, with fake-telo as the kernel image.
    Kubernetes,
}

pub struct Runner {
    pub service: Option<RunningService>,
    pub base: String,
    pub client: reqwest::Client,
    pub work_dir: TempDir,
    pub backend: Backend,
    /// The simulated cluster (Kubernetes backend only).
    pub sim: Option<kube_sim::KubeSim>,
}

/// A fresh kube-sim with the namespaces the runner uses, as the chart (or an
/// operator) creates them on a real cluster: a fresh kube-sim has only a new
/// cluster's namespaces.
pub fn cluster() -> kube_sim::KubeSimBuilder {
    kube_sim::KubeSim::builder()
        .namespace("telo-runner")
        .namespace("telo-sessions")
        .image(
            "telo-runner:*",
            kube_sim::ImageBehaviour::Binaries(runner_binaries()),
        )
}

/// For the Kubernetes backend a started [`cluster`] with fake-telo as the
/// kernel, which outlives the runner processes a test starts on it; for
/// the local backend none.
pub async fn cluster_for(backend: Backend) -> Option<kube_sim::KubeSim> {
    match backend {
        Backend::Local => None,
        Backend::Kubernetes => Some(
            cluster()
                .fake_telo(fake_telo_path())
                .start()
                .await
                .expect("kube-sim starts"),
        ),
    }
}

/// The Secrets a stored pod's containers take env values from
/// (`valueFrom.secretKeyRef`), each named once.
pub fn env_secrets_of(pod: &Value) -> Vec<String> {
    let mut names: Vec<String> = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| pod["spec"][list].as_array().cloned().unwrap_or_default())
        .flat_map(|container| container["env"].as_array().cloned().unwrap_or_default())
        .filter_map(|entry| {
            entry["valueFrom"]["secretKeyRef"]["name"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The node's address of the cluster `kubeconfig` names, read from its
/// Node's `InternalIP`: where session pods reach this machine, so a runner
/// they must reach (for their bundles, the watch agent) listens there.
/// kube-sim's is the pods' gateway with an isolated pod network, else
/// `127.0.0.1`.
pub async fn node_address(kubeconfig: &std::path::Path) -> std::net::IpAddr {
    use k8s_openapi::api::core::v1::Node;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).expect("a kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("a kube config");
    let client = kube::Client::try_from(config).expect("a kube client");
    let nodes = kube::Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .expect("the nodes");
    nodes
        .items
        .iter()
        .flat_map(|n| n.status.iter().flat_map(|s| s.addresses.iter().flatten()))
        .find(|a| a.type_ == "InternalIP")
        .and_then(|a| a.address.parse().ok())
        .expect("a node with an InternalIP")
}

/// Where the runner binary under test is: the runner image's executables
/// (a watch pod's workspace container runs `telo-runner workspace`).
pub fn runner_binaries() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_BIN_EXE_telo-runner"))
        .parent()
        .expect("the runner binary is in a directory")
        .to_path_buf()
}

impl Runner {
    pub async fn start() -> Runner {
        Self::start_with(&[]).await
    }

    pub async fn start_with(vars: &[(&str, &str)]) -> Runner {
        Self::start_on(Backend::Local, vars).await
    }

    pub async fn start_on(backend: Backend, vars: &[(&str, &str)]) -> Runner {
        match backend {
            Backend::Local => Self::start_local(vars).await,
            Backend::Kubernetes => Self::start_kube(cluster(), vars).await,
        }
    }

    /// A runner on the Kubernetes backend against a fresh kube-sim built by
    /// `sim` (fake-telo as the kernel, the built-in bundle fetcher as busybox).
    pub async fn start_kube(sim: kube_sim::KubeSimBuilder, vars: &[(&str, &str)]) -> Runner {
        Self::start_kube_with_kernel(sim, fake_telo_path(), vars).await
    }

    /// Like [`Runner::start_kube`], with `kernel` as what kernel images run.
    pub async fn start_kube_with_kernel(
        sim: kube_sim::KubeSimBuilder,
        kernel: std::path::PathBuf,
        vars: &[(&str, &str)],
    ) -> Runner {
        let work_dir = tempfile::tempdir().expect("work dir");
        let sim = sim
            .fake_telo(kernel)
            .start()
            .await
            .expect("kube-sim starts");
        let kubeconfig = work_dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        // Pods reach the runner at the node's address.
        let listener = tokio::net::TcpListener::bind((sim.node_ip(), 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut env: HashMap<String, String> = HashMap::new();
        env.insert("RUNNER_BACKEND".into(), "kubernetes".into());
        env.insert(
            "KUBECONFIG".into(),
            kubeconfig.to_string_lossy().into_owned(),
        );
        env.insert("RUNNER_SELF_URL".into(), format!("http://{addr}"));
        env.insert("RUNNER_BASE_IMAGE_CATALOG_ENABLED".into(), "false".into());
        env.insert("RUNNER_IMAGE".into(), "telorun/node:0-slim".into());
        for (key, value) in vars {
            env.insert((*key).into(), (*value).into());
        }
        let service = RunningService::start_on(&env, listener)
            .await
            .expect("runner starts");
        Runner {
            base: service.base_url(),
            service: Some(service),
            client: runner_core::http_client::client(),
            work_dir,
            backend: Backend::Kubernetes,
            sim: Some(sim),
        }
    }

    async fn start_local(vars: &[(&str, &str)]) -> Runner {
        let work_dir = tempfile::tempdir().expect("work dir");
        let mut env: HashMap<String, String> = HashMap::new();
        env.insert(
            "RUNNER_LOCAL_TELO".into(),
            fake_telo_path().to_string_lossy().into_owned(),
        );
        env.insert(
            "RUNNER_LOCAL_WORK_DIR".into(),
            work_dir
                .path()
                .join("sessions")
                .to_string_lossy()
                .into_owned(),
        );
        for (key, value) in vars {
            env.insert((*key).into(), (*value).into());
        }
        let service = RunningService::start(&env, "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("runner starts");
        Runner {
            base: service.base_url(),
            service: Some(service),
            client: runner_core::http_client::client(),
            work_dir,
            backend: Backend::Local,
            sim: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn ws_url(&self, path: &str) -> String {
        format!("{}{}", self.base.replacen("http", "ws", 1), path)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(self.url(path)).send().await.expect("GET");
        let status = response.status();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Waits until the runner's pool of `image` has `ready` warm pods it
    /// would hand a session (running is not enough: the runner checks a
    /// pod's workspace service before it offers the pod).
    pub async fn until_warm_pods_ready(&self, image: &str, ready: u64) {
        let line = format!("telo_runner_warm_pods{{pool=\"{image}\",state=\"ready\"}} {ready}");
        let deadline = tokio::time::Instant::now() + test_support::WAIT;
        loop {
            let (_, metrics) = self.get("/metrics").await;
            let metrics = metrics.as_str().unwrap_or_default().to_owned();
            if metrics.lines().any(|l| l.trim_end() == line) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never {ready} warm pods of {image} ready:\n{metrics}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.post_with(path, body, &[]).await
    }

    pub async fn post_with(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut request = self.client.post(self.url(path)).json(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("POST");
        let status = response.status();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, String) {
        let response = self
            .client
            .delete(self.url(path))
            .send()
            .await
            .expect("DELETE");
        (response.status(), response.text().await.expect("body"))
    }

    /// Start a session scripted by `fake_telo`; returns its id.
    pub async fn create(&self, fake_telo: Value) -> String {
        self.create_body(test_support::bundle::start_body(fake_telo))
            .await
    }

    pub async fn create_body(&self, body: Value) -> String {
        let (status, created) = self.post("/v1/sessions", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        created["sessionId"].as_str().expect("sessionId").to_owned()
    }

    pub async fn events(&self, id: &str, headers: &[(&str, &str)]) -> SseStream {
        SseStream::connect(&self.url(&format!("/v1/sessions/{id}/events")), headers).await
    }

    pub async fn events_query(&self, id: &str, query: &str, headers: &[(&str, &str)]) -> SseStream {
        SseStream::connect(
            &self.url(&format!("/v1/sessions/{id}/events?{query}")),
            headers,
        )
        .await
    }

    pub async fn io(&self, id: &str, query: &str) -> Socket {
        ws::connect(&self.ws_url(&format!("/v1/sessions/{id}/io{query}")), None).await
    }

    /// Everything the session printed, replayed over a fresh socket until the
    /// server closes it (the session must be finished).
    pub async fn full_output(&self, id: &str) -> String {
        let mut socket = self.io(id, "?lastSeq=0").await;
        let frames = ws::read_until_close(&mut socket).await;
        String::from_utf8_lossy(&ws::output_of(&frames)).into_owned()
    }

    /// Wait for the session's terminal status through SSE; returns its JSON.
    pub async fn wait_terminal(&self, id: &str) -> Value {
        let mut events = self.events(id, &[]).await;
        let frames = events.events_until_end().await;
        let last = frames.last().expect("at least one event");
        assert_eq!(last.event.as_deref(), Some("status"));
        last.json()["status"].clone()
    }

    pub async fn stop(mut self) {
        if let Some(service) = self.service.take() {
            service.stop().await.expect("clean shutdown");
        }
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await;
        }
    }
}

/// A runner started as its own process (so its real process environment and
/// its memory can be observed); killed when dropped.
pub struct RunnerProcess {
    pub child: std::process::Child,
    pub base: String,
}

impl RunnerProcess {
    /// Starts `telo-runner serve` on a free port with only `PATH`, the
    /// backend's settings (fake-telo as the local kernel; `sim`'s kubeconfig
    /// for the Kubernetes backend) and `vars` in its environment.
    pub async fn spawn(
        backend: Backend,
        dir: &std::path::Path,
        sim: Option<&kube_sim::KubeSim>,
        vars: &[(&str, &str)],
    ) -> RunnerProcess {
        Self::spawn_with_open_file_limit(backend, dir, sim, vars, None).await
    }

    /// Like [`RunnerProcess::spawn`], started (through `sh`'s `ulimit`) with
    /// an open-file soft limit of `soft_limit`, as a shell's default would
    /// leave it.
    pub async fn spawn_with_open_file_limit(
        backend: Backend,
        dir: &std::path::Path,
        sim: Option<&kube_sim::KubeSim>,
        vars: &[(&str, &str)],
        soft_limit: Option<u64>,
    ) -> RunnerProcess {
        Self::spawn_logging(backend, dir, sim, vars, soft_limit, None).await
    }

    /// Like [`RunnerProcess::spawn`], its log (stderr) written to `log`.
    pub async fn spawn_logging_to(
        backend: Backend,
        dir: &std::path::Path,
        sim: Option<&kube_sim::KubeSim>,
        vars: &[(&str, &str)],
        log: &std::path::Path,
    ) -> RunnerProcess {
        Self::spawn_logging(backend, dir, sim, vars, None, Some(log)).await
    }

    async fn spawn_logging(
        backend: Backend,
        dir: &std::path::Path,
        sim: Option<&kube_sim::KubeSim>,
        vars: &[(&str, &str)],
        soft_limit: Option<u64>,
        log: Option<&std::path::Path>,
    ) -> RunnerProcess {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        // Pods reach a Kubernetes runner at the node's address.
        let host: std::net::IpAddr = match (backend, sim) {
            (Backend::Kubernetes, Some(sim)) => sim.node_ip().into(),
            _ => std::net::Ipv4Addr::LOCALHOST.into(),
        };
        let port = {
            let listener = std::net::TcpListener::bind((host, 0)).expect("bind");
            listener.local_addr().expect("addr").port()
        };
        let base = format!("http://{host}:{port}");
        let runner = env!("CARGO_BIN_EXE_telo-runner");
        let mut command = match soft_limit {
            None => Command::new(runner),
            Some(limit) => {
                let mut command = Command::new("/bin/sh");
                command.args([
                    "-c",
                    &format!("ulimit -Sn {limit} && exec \"$0\" \"$@\""),
                    runner,
                ]);
                command
            }
        };
        command
            .args(["serve", "--listen", &format!("{host}:{port}")])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUNNER_SELF_URL", &base)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(match log {
                Some(log) => Stdio::from(std::fs::File::create(log).expect("log file")),
                None if std::env::var_os("TEST_RUNNER_STDERR").is_some() => Stdio::inherit(),
                None => Stdio::null(),
            });
        match backend {
            Backend::Local => {
                command
                    .env("RUNNER_BACKEND", "local")
                    .env("RUNNER_LOCAL_TELO", fake_telo_path())
                    .env("RUNNER_LOCAL_WORK_DIR", dir.join("sessions"));
            }
            Backend::Kubernetes => {
                let kubeconfig = dir.join("kubeconfig");
                sim.expect("a kube-sim")
                    .write_kubeconfig(&kubeconfig)
                    .expect("kubeconfig");
                command
                    .env("RUNNER_BACKEND", "kubernetes")
                    .env("KUBECONFIG", kubeconfig)
                    .env("RUNNER_BASE_IMAGE_CATALOG_ENABLED", "false")
                    .env("RUNNER_IMAGE", "telorun/node:0-slim");
            }
        }
        for (key, value) in vars {
            command.env(key, value);
        }
        // A replica is reached by its peers where it listens.
        if vars.iter().any(|(key, _)| *key == "RUNNER_PEER_TOKEN_FILE")
            && !vars.iter().any(|(key, _)| *key == "RUNNER_REPLICA_URL")
        {
            command.env("RUNNER_REPLICA_URL", &base);
        }
        let mut child = command.spawn().expect("runner spawns");
        let stdout = child.stdout.take().expect("stdout");
        let process = RunnerProcess { child, base };
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            line
        })
        .await
        .expect("read the first line");
        assert!(line.starts_with("listening on "), "{line}");
        process
    }

    pub fn ws_base(&self) -> String {
        self.base.replacen("http", "ws", 1)
    }

    /// The process's resident memory, from `/proc`.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("proc status");
        let kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kib * 1024
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let pid = self.child.id();
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A killed runner cannot remove its sessions' network namespaces.
        // The next runner to start on the machine does, but the last of a
        // test run has no next one.
        for name in namespaces_of(pid) {
            remove_namespace(&name);
        }
    }
}

/// The network namespaces the runner `pid` made (`telo-<pid>-…`).
pub fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("telo-{pid}-");
    std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the named network namespace `name` with iproute2's `ip`, as
/// a runner sweeping a dead one's does (quietly: it may be gone already).
fn remove_namespace(name: &str) {
    for ip in ["ip", "/usr/sbin/ip", "/sbin/ip"] {
        let removed = std::process::Command::new(ip)
            .args(["netns", "del", name])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if removed.is_ok() {
            return;
        }
    }
}
