//! The processes a scenario runs: kube-sim, the runner, and what /proc says
//! about them. Every child is killed when its handle drops.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use base64::Engine as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a process gets to print its address or to exit on SIGTERM.
const STARTUP: Duration = Duration::from_secs(60);
const SHUTDOWN: Duration = Duration::from_secs(60);

/// The three programs a scenario runs, and the edge scenario's plain
/// hyper proxy (its reference, when it was built).
#[derive(Debug, Clone)]
pub struct Binaries {
    pub runner: PathBuf,
    pub kube_sim: PathBuf,
    pub fake_telo: PathBuf,
    pub hyper_proxy: Option<PathBuf>,
}

impl Binaries {
    /// The programs in `dir`, or next to this executable. Unless `build` is
    /// off, `cargo build` brings them up to date first (in the same profile
    /// as this executable), so the figures are for the current source.
    pub fn locate(dir: Option<&Path>, build: bool) -> anyhow::Result<Binaries> {
        let dir = match dir {
            Some(dir) => dir.to_path_buf(),
            None => std::env::current_exe()?
                .parent()
                .context("this executable has no directory")?
                .to_path_buf(),
        };
        if build {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = std::process::Command::new(cargo);
            cmd.args(["build", "--quiet", "--locked"]);
            if dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            cmd.args([
                "-p",
                "telo-runner",
                "--bin",
                "telo-runner",
                "-p",
                "kube-sim",
                "--bin",
                "kube-sim",
                "-p",
                "fake-telo",
                "--bin",
                "fake-telo",
                "-p",
                "telo-runner-bench",
                "--bin",
                "hyper-proxy",
            ]);
            if let Some(target) = dir.parent() {
                cmd.env("CARGO_TARGET_DIR", target);
            }
            cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
            let status = cmd.status().context("running cargo build")?;
            if !status.success() {
                bail!("cargo build of the benchmarked programs failed");
            }
        }
        let find = |name: &str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(anyhow!(
                    "{} not found (build it, or pass --bin-dir)",
                    path.display()
                ))
            }
        };
        Ok(Binaries {
            runner: find("telo-runner")?,
            kube_sim: find("kube-sim")?,
            fake_telo: find("fake-telo")?,
            hyper_proxy: find("hyper-proxy").ok(),
        })
    }
}

/// A child process with its pid, stopped on drop.
pub struct Proc {
    name: &'static str,
    child: Child,
    pid: u32,
}

impl Proc {
    pub async fn spawn(name: &'static str, mut cmd: Command) -> anyhow::Result<(Proc, String)> {
        cmd.stdout(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("child pid")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(STARTUP, lines.next_line())
            .await
            .map_err(|_| anyhow!("{name} did not print its address within {STARTUP:?}"))??
            .with_context(|| format!("{name} exited before printing its address"))?;
        let url = first
            .strip_prefix("listening on ")
            .with_context(|| format!("{name} printed {first:?}"))?
            .to_string();
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((Proc { name, child, pid }, url))
    }

    /// Resident memory now, in bytes.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .context("VmRSS in /proc status")?;
        Ok(kib * 1024)
    }

    /// The peak resident memory so far, in bytes.
    pub fn peak_rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .context("VmHWM in /proc status")?;
        Ok(kib * 1024)
    }

    /// User + system CPU time used so far, in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        cpu_seconds_of(self.pid)
    }

    /// Context switches of all its threads so far.
    pub fn context_switches(&self) -> anyhow::Result<u64> {
        context_switches_of(self.pid)
    }

    /// SIGKILL: the process ends at once, without a word to anyone.
    pub fn kill(self) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid)?;
        kill(Pid::from_raw(pid), Signal::SIGKILL)?;
        // Reaped when the handle drops (kill_on_drop).
        Ok(())
    }

    /// SIGTERM, then wait for a clean exit (kill after a grace period).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid)?;
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        match tokio::time::timeout(SHUTDOWN, self.child.wait()).await {
            Ok(status) => {
                status?;
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("{} did not exit within {SHUTDOWN:?} of SIGTERM", self.name)
            }
        }
    }
}

/// Context switches (voluntary and not) of all a process's threads, from
/// `/proc/<pid>/task/*/status`: each time a thread went to sleep, or was
/// put off the CPU. Steadier than CPU time on a busy machine.
pub fn context_switches_of(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            // A thread that exited since the listing.
            continue;
        };
        total += status
            .lines()
            .filter_map(|line| {
                line.strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|value| value.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}

/// User + system CPU seconds of a process, from `/proc/<pid>/stat`.
pub fn cpu_seconds_of(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("/proc stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line; `rest` starts
    // at field 3 (state).
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields.get(i).context("/proc stat field")?.parse::<f64>()?)
    };
    // /proc reports in USER_HZ, which Linux fixes at 100 for user space.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// How much lower kube-sim's CPU priority is than the runner's
/// (`BENCH_SIM_NICE`, default 0).
pub fn sim_nice() -> i32 {
    std::env::var("BENCH_SIM_NICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A free loopback port (the runner must know its own URL before it binds;
/// a session must be told its app's port before the app binds it).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Which backend the runner uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Kubernetes,
    Local,
}

/// Which Telo kernel a session runs (watch-reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelKind {
    /// fake-telo, the simulated kernel.
    FakeTelo,
    /// The real Telo CLI given (see `--telo`).
    Real,
}

/// What kube-sim's kubelet runs for a session container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workloads {
    /// fake-telo as a real process in a PTY.
    Processes,
    /// A container that runs without a process (attachable, silent), so a
    /// 2-core machine is not spent forking.
    Virtual,
}

/// kube-sim (for the Kubernetes backend) and a runner in front of it.
pub struct Stack {
    pub runner: Proc,
    pub base: String,
    pub sim: Option<Proc>,
    /// kube-sim's URL and a client with its kubeconfig's credentials.
    pub sim_api: Option<SimApi>,
    pub http: reqwest::Client,
    /// What the runner was started with, for more replicas of it.
    env: HashMap<String, String>,
    runner_host: std::net::IpAddr,
    _dir: tempfile::TempDir,
}

impl Stack {
    pub async fn start(
        bins: &Binaries,
        backend: BackendKind,
        extra_env: &[(&str, String)],
    ) -> anyhow::Result<Stack> {
        Self::start_with(bins, backend, extra_env, Workloads::Processes).await
    }

    pub async fn start_with(
        bins: &Binaries,
        backend: BackendKind,
        extra_env: &[(&str, String)],
        workloads: Workloads,
    ) -> anyhow::Result<Stack> {
        Self::launch(
            bins,
            backend,
            extra_env,
            workloads,
            &bins.fake_telo,
            &[],
            None,
        )
        .await
    }

    /// A stack whose runner starts under an open-file limit (soft and hard)
    /// of `open_files`, as under a shell's default `ulimit -n 1024`.
    pub async fn start_with_open_file_limit(
        bins: &Binaries,
        backend: BackendKind,
        extra_env: &[(&str, String)],
        open_files: u64,
    ) -> anyhow::Result<Stack> {
        Self::launch(
            bins,
            backend,
            extra_env,
            Workloads::Processes,
            &bins.fake_telo,
            &[],
            Some(open_files),
        )
        .await
    }

    /// A Kubernetes stack whose kube-sim gets `sim_args` too (a latency
    /// profile, a container runtime).
    pub async fn start_sim_with(
        bins: &Binaries,
        extra_env: &[(&str, String)],
        sim_args: &[String],
    ) -> anyhow::Result<Stack> {
        Self::launch(
            bins,
            BackendKind::Kubernetes,
            extra_env,
            Workloads::Processes,
            &bins.fake_telo,
            sim_args,
            None,
        )
        .await
    }

    /// A stack whose sessions run `kernel` (a real Telo CLI) instead of
    /// fake-telo, in a fresh work directory (local) or a fresh kube-sim,
    /// with more runner environment.
    pub async fn start_kernel_with(
        bins: &Binaries,
        backend: BackendKind,
        extra_env: &[(&str, String)],
        kernel: &Path,
    ) -> anyhow::Result<Stack> {
        Self::launch(
            bins,
            backend,
            extra_env,
            Workloads::Processes,
            kernel,
            &[],
            None,
        )
        .await
    }

    async fn launch(
        bins: &Binaries,
        backend: BackendKind,
        extra_env: &[(&str, String)],
        workloads: Workloads,
        kernel: &Path,
        sim_args: &[String],
        open_files: Option<u64>,
    ) -> anyhow::Result<Stack> {
        let dir = tempfile::tempdir()?;
        let mut env: HashMap<String, String> = HashMap::new();
        let mut runner_host = std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST);
        let (sim, sim_api) = match backend {
            BackendKind::Kubernetes => {
                let kubeconfig = dir.path().join("kubeconfig");
                // `nice` execs kube-sim, so the pid stays kube-sim's.
                let mut cmd = Command::new("nice");
                cmd.arg(format!("-n{}", sim_nice()))
                    .arg(&bins.kube_sim)
                    .args(["--listen", "127.0.0.1:0", "--pull-delay-ms", "0"])
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .arg("--fake-telo")
                    .arg(kernel)
                    .args(["--namespace", "telo-sessions"])
                    .env("RUST_LOG", "error");
                if workloads == Workloads::Virtual {
                    cmd.args(["--image", "telorun/node:*=virtual"]);
                }
                // The runner's own image (a watch pod's `workspace`
                // container runs `telo-runner workspace`) is the runner
                // binary benchmarked here.
                let runner_dir = bins
                    .runner
                    .parent()
                    .context("the runner binary has no directory")?;
                cmd.arg("--image")
                    .arg(format!("telo-runner:*=bin:{}", runner_dir.display()));
                cmd.args(sim_args);
                let (sim, url) = Proc::spawn("kube-sim", cmd).await?;
                let http = sim_http_client(&kubeconfig)?;
                // Pods reach the runner at the node's address.
                runner_host = node_address(&url, &http).await?;
                env.insert("RUNNER_BACKEND".into(), "kubernetes".into());
                env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
                env.insert("RUNNER_IMAGE".into(), "telorun/node:0-slim".into());
                env.insert("RUNNER_BASE_IMAGE_CATALOG_ENABLED".into(), "false".into());
                (Some(sim), Some(SimApi { url, http }))
            }
            BackendKind::Local => {
                env.insert("RUNNER_BACKEND".into(), "local".into());
                env.insert("RUNNER_LOCAL_TELO".into(), kernel.display().to_string());
                env.insert(
                    "RUNNER_LOCAL_WORK_DIR".into(),
                    dir.path().join("sessions").display().to_string(),
                );
                // To compare with and without the session sandbox, and
                // sessions started from a warmed kernel cache.
                for var in ["RUNNER_LOCAL_SANDBOX", "RUNNER_LOCAL_KERNEL_CACHE_WARM_UP"] {
                    if let Ok(value) = std::env::var(var) {
                        env.insert(var.into(), value);
                    }
                }
                (None, None)
            }
        };
        env.insert("LOG_LEVEL".into(), "warn".into());
        env.insert("RUNNER_MAX_SESSIONS".into(), "100000".into());
        // The bench is one client holding every session's streams.
        env.insert("RUNNER_MAX_SUBSCRIBERS_PER_CLIENT".into(), "100000".into());
        env.insert("RUNNER_MAX_SUBSCRIBERS_PER_SESSION".into(), "100000".into());
        env.insert("RUNNER_MAX_CONNECTIONS_PER_CLIENT".into(), "100000".into());
        for (key, value) in extra_env {
            env.insert((*key).to_string(), value.clone());
        }
        let (runner, base) = spawn_runner(&bins.runner, &env, runner_host, open_files).await?;
        let stack = Stack {
            runner,
            base,
            sim,
            sim_api,
            http: http_client()?,
            env,
            runner_host,
            _dir: dir,
        };
        stack.wait_ready().await?;
        Ok(stack)
    }

    /// One more replica of this stack's runner (same cluster, same
    /// settings) named `id`, ready; its address is its own `RUNNER_SELF_URL`
    /// and `RUNNER_REPLICA_URL`.
    pub async fn spawn_replica(&self, bins: &Binaries, id: &str) -> anyhow::Result<(Proc, String)> {
        let mut env = self.env.clone();
        env.insert("RUNNER_REPLICA_ID".into(), id.to_owned());
        let (proc, base) = spawn_runner(&bins.runner, &env, self.runner_host, None).await?;
        wait_ready_at(&self.http, &base).await?;
        Ok((proc, base))
    }
}

/// The runner with `env` on a free port of `host`; with a peer token, its
/// own address is its replica URL too.
async fn spawn_runner(
    runner: &Path,
    env: &HashMap<String, String>,
    runner_host: std::net::IpAddr,
    open_files: Option<u64>,
) -> anyhow::Result<(Proc, String)> {
    let mut env = env.clone();
    let port = TcpListener::bind((runner_host, 0))?.local_addr()?.port();
    let own = format!("http://{runner_host}:{port}");
    env.insert("RUNNER_SELF_URL".into(), own.clone());
    if env.contains_key("RUNNER_PEER_TOKEN_FILE") {
        env.insert("RUNNER_REPLICA_URL".into(), own);
    }
    {
        let bins_runner = runner;
        let mut cmd = match open_files {
            None => Command::new(bins_runner),
            Some(limit) => {
                // `exec` keeps the pid the runner's.
                let mut cmd = Command::new("/bin/sh");
                cmd.arg("-c")
                    .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                    .arg(bins_runner);
                cmd
            }
        };
        cmd.args(["serve", "--listen", &format!("{runner_host}:{port}")])
            .env_clear()
            .envs(&env)
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        Proc::spawn("telo-runner", cmd).await
    }
}

/// Waits for `base`'s `/readyz` to answer 200 (watches synced).
async fn wait_ready_at(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let url = format!("{base}/readyz");
    let deadline = tokio::time::Instant::now() + STARTUP;
    loop {
        if let Ok(resp) = http.get(&url).send().await
            && resp.status().is_success()
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the runner at {base} was not ready within {STARTUP:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Stack {
    /// Waits for `/readyz` to answer 200 (watches synced).
    async fn wait_ready(&self) -> anyhow::Result<()> {
        wait_ready_at(&self.http, &self.base).await
    }

    /// CPU seconds used so far by the runner, kube-sim (0 without it) and
    /// this harness.
    pub fn cpu(&self) -> anyhow::Result<[f64; 3]> {
        let sim = match &self.sim {
            Some(sim) => sim.cpu_seconds()?,
            None => 0.0,
        };
        Ok([
            self.runner.cpu_seconds()?,
            sim,
            cpu_seconds_of(std::process::id())?,
        ])
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn ws_url(&self, path: &str) -> String {
        format!("{}{path}", self.base.replacen("http://", "ws://", 1))
    }

    /// kube-sim's request and watch counters.
    pub async fn sim_stats(&self) -> anyhow::Result<serde_json::Value> {
        let sim = self.sim_api.as_ref().context("no kube-sim in this stack")?;
        Ok(sim
            .http
            .get(format!("{}/_sim/stats", sim.url))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// kube-sim's pod timeline, by pod name.
    pub async fn sim_timeline(&self) -> anyhow::Result<HashMap<String, serde_json::Value>> {
        let sim = self.sim_api.as_ref().context("no kube-sim in this stack")?;
        let body: serde_json::Value = sim
            .http
            .get(format!("{}/_sim/timeline", sim.url))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(body["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p["name"].as_str()?.to_string(), p.clone())))
            .collect())
    }

    /// Stops the runner (its sessions end), then kube-sim.
    pub async fn stop(self) -> anyhow::Result<()> {
        let runner = self.runner.stop().await;
        if let Some(sim) = self.sim {
            sim.stop().await?;
        }
        runner
    }
}

/// Where kube-sim listens, and a client that trusts its CA and sends its
/// token (both from the kubeconfig it wrote, before it said where it
/// listens).
/// The node's `InternalIP` of the kube-sim at `url`: where its pods reach
/// this machine (the pods' gateway with an isolated pod network, else
/// 127.0.0.1).
async fn node_address(url: &str, http: &reqwest::Client) -> anyhow::Result<std::net::IpAddr> {
    let nodes: serde_json::Value = http
        .get(format!("{url}/api/v1/nodes"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["status"]["addresses"].as_array().into_iter().flatten())
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str()?.parse().ok())
        .context("kube-sim's node has no InternalIP")
}

pub struct SimApi {
    pub url: String,
    pub http: reqwest::Client,
}

fn sim_http_client(kubeconfig: &Path) -> anyhow::Result<reqwest::Client> {
    #[derive(serde::Deserialize)]
    struct Kubeconfig {
        clusters: Vec<NamedCluster>,
        users: Vec<NamedUser>,
    }
    #[derive(serde::Deserialize)]
    struct NamedCluster {
        cluster: Cluster,
    }
    #[derive(serde::Deserialize)]
    struct Cluster {
        #[serde(rename = "certificate-authority-data")]
        ca_data: String,
    }
    #[derive(serde::Deserialize)]
    struct NamedUser {
        user: User,
    }
    #[derive(serde::Deserialize)]
    struct User {
        token: String,
    }
    let what = || format!("kube-sim's kubeconfig {}", kubeconfig.display());
    let text = std::fs::read_to_string(kubeconfig).with_context(what)?;
    let config: Kubeconfig = serde_yaml_ng::from_str(&text).with_context(what)?;
    let (Some(cluster), Some(user)) = (config.clusters.first(), config.users.first()) else {
        bail!("{} names no cluster or no user", what());
    };
    let ca_pem = base64::engine::general_purpose::STANDARD
        .decode(cluster.cluster.ca_data.trim())
        .with_context(what)?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", user.user.token).parse()?,
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca_pem)?])
        .default_headers(headers)
        .build()?)
}

pub fn http_client() -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?)
}
