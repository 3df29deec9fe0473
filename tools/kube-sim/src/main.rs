//! `kube-sim`: serves a simulated cluster until killed.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use kube_sim::{ImageBehaviour, KubeSim, PodNetwork, Runtime};

/// A simulated Kubernetes apiserver + kubelet running pods as local processes
/// (or as real containers of a docker engine, `--runtime docker`).
#[derive(Debug, Parser)]
#[command(name = "kube-sim", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write a kubeconfig for this simulator.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Serve the Gateway API (gateway.networking.k8s.io v1 and v1beta1).
    #[arg(long)]
    gateway_api: bool,
    /// Start with the simulated Ingress controller switched off.
    #[arg(long)]
    no_ingress_controller: bool,
    /// Start with the simulated Gateway controller switched off.
    #[arg(long)]
    no_gateway_controller: bool,
    /// `<glob>=<behaviour>`: fake-telo, fake-telo:<entry>, bundle-fetcher,
    /// host, virtual, pull-error[:<message>]. Repeatable; checked before the
    /// defaults.
    #[arg(long = "image", value_name = "GLOB=BEHAVIOUR")]
    images: Vec<String>,
    /// An image glob the registry holds (repeatable). Once any is given,
    /// every other image fails to pull as not found; without any, every
    /// image the --image table knows exists.
    #[arg(long = "published-image", value_name = "GLOB")]
    published_images: Vec<String>,
    /// The fake-telo binary (default: next to kube-sim, else on PATH).
    #[arg(long)]
    fake_telo: Option<PathBuf>,
    /// How long a simulated image pull takes, in milliseconds (benchmarks
    /// set 0 so only the runner's own overhead is measured).
    #[arg(long, value_name = "MS")]
    pull_delay_ms: Option<u64>,
    /// Start latencies from published figures: `cluster` (a 0.1 s binding, a
    /// 0.6 s sandbox, 0.15 s per container start; see the README). The
    /// `--*-delay-ms` flags below override parts of it.
    #[arg(long, value_name = "PROFILE", value_parser = ["none", "cluster"])]
    latency_profile: Option<String>,
    /// How long the scheduler takes to bind a pod, in milliseconds.
    #[arg(long, value_name = "MS")]
    schedule_delay_ms: Option<u64>,
    /// How long a pod's sandbox (network, volumes) takes before its first
    /// container, in milliseconds.
    #[arg(long, value_name = "MS")]
    sandbox_delay_ms: Option<u64>,
    /// How long each container's start takes, in milliseconds.
    #[arg(long, value_name = "MS")]
    container_start_delay_ms: Option<u64>,
    /// The longest an attach waits, after its upgrade was answered, before it
    /// carries the container's output, in milliseconds (default 5).
    #[arg(long, value_name = "MS")]
    attach_delay_ms: Option<u64>,
    /// Create an IngressClass handled by the simulated controller;
    /// `NAME:default` marks it the cluster default.
    #[arg(long = "ingress-class", value_name = "NAME[:default]")]
    ingress_classes: Vec<String>,
    /// Create this namespace at start (repeatable). A fresh kube-sim has a
    /// new cluster's namespaces only (default, kube-system, kube-public,
    /// kube-node-lease); a runner outside the cluster needs its session
    /// namespace, e.g. `--namespace telo-sessions`.
    #[arg(long = "namespace", value_name = "NAME")]
    namespaces: Vec<String>,
    /// How containers run: `process` (local processes, the image table
    /// says which) or `docker` (real containers of a docker engine; the
    /// securityContext and resource limits are enforced, images must be
    /// local).
    #[arg(long, value_name = "process|docker", default_value = "process", value_parser = parse_runtime)]
    runtime: Runtime,
    /// The docker client of `--runtime docker` (default: the
    /// TELO_RUNNER_CONTAINER_ENGINE environment variable, else `docker` on
    /// PATH).
    #[arg(long, value_name = "PATH")]
    container_engine: Option<PathBuf>,
    /// The pods' network: `isolated` (each pod its own network namespace
    /// and address on a bridge kube-sim makes; needs root and iproute2),
    /// `host` (pods share the host's network, each with an address of
    /// 127.0.0.0/8), or `auto` (isolated where the machine allows it, else
    /// host, saying why). With `--runtime docker` an infra container per
    /// pod holds its namespace (the local image busybox:stable), and the
    /// engine must be local and not rootless.
    #[arg(long, value_name = "isolated|host|auto", default_value = "auto", value_parser = parse_pod_network)]
    pod_network: PodNetwork,
}

fn parse_runtime(s: &str) -> Result<Runtime, String> {
    s.parse()
}

fn parse_pod_network(s: &str) -> Result<PodNetwork, String> {
    s.parse()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let mut builder = KubeSim::builder()
        .listen(args.listen)
        .gateway_api(args.gateway_api)
        .ingress_controller(!args.no_ingress_controller)
        .gateway_controller(!args.no_gateway_controller);
    for spec in &args.images {
        let (glob, behaviour) = spec
            .rsplit_once('=')
            .with_context(|| format!("--image expects <glob>=<behaviour>, got {spec:?}"))?;
        let behaviour = ImageBehaviour::parse(behaviour).map_err(anyhow::Error::msg)?;
        builder = builder.image(glob, behaviour);
    }
    for glob in &args.published_images {
        builder = builder.published_image(glob);
    }
    if let Some(ms) = args.pull_delay_ms {
        builder = builder.pull_delay(std::time::Duration::from_millis(ms));
    }
    if let Some(ms) = args.attach_delay_ms {
        builder = builder.attach_delay(std::time::Duration::from_millis(ms));
    }
    let mut latency = match args.latency_profile.as_deref() {
        Some("cluster") => kube_sim::Latency::CLUSTER,
        _ => kube_sim::Latency::default(),
    };
    let ms = std::time::Duration::from_millis;
    if let Some(v) = args.schedule_delay_ms {
        latency.schedule = ms(v);
    }
    if let Some(v) = args.sandbox_delay_ms {
        latency.sandbox = ms(v);
    }
    if let Some(v) = args.container_start_delay_ms {
        latency.container_start = ms(v);
    }
    builder = builder.latency(latency);
    if let Some(ft) = args.fake_telo {
        builder = builder.fake_telo(ft);
    }
    for class in &args.ingress_classes {
        let (name, default) = match class.split_once(':') {
            Some((n, "default")) => (n, true),
            Some(_) => anyhow::bail!("--ingress-class expects NAME or NAME:default, got {class:?}"),
            None => (class.as_str(), false),
        };
        builder = builder.ingress_class(name, default);
    }
    for name in &args.namespaces {
        builder = builder.namespace(name);
    }
    builder = builder.runtime(args.runtime).pod_network(args.pod_network);
    if let Some(client) = args.container_engine {
        builder = builder.container_engine(client);
    }
    let sim = builder.start().await?;
    sim.write_kubeconfig(&args.kubeconfig)
        .with_context(|| format!("writing {}", args.kubeconfig.display()))?;
    {
        let mut out = std::io::stdout().lock();
        // Then where pods reach this machine: a service they must reach
        // (the runner) listens there. One write, so a reader that stops
        // after the first line does not make the second fail.
        let lines = format!(
            "listening on {}\nnode address {}\n",
            sim.url(),
            sim.node_ip()
        );
        out.write_all(lines.as_bytes())?;
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    sim.shutdown().await;
    Ok(())
}
