//! `telo-runner-bench <scenario>`: starts kube-sim (or the local backend),
//! the runner and fake-telo workloads as separate processes, drives them with
//! real HTTP/SSE/WebSocket clients and prints a table plus one JSON line.

#![forbid(unsafe_code)]

mod clients;
mod procs;
mod report;
mod scenarios;
mod telo_fixture;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};

use crate::procs::{BackendKind, Binaries, KernelKind, Workloads};
use crate::scenarios::Ctx;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// N sessions started C at a time: POST → 201, → pod created, pod Running → SSE `running`.
    StartLatency,
    /// One session spewing output to one, then ten WebSocket clients.
    RelayThroughput,
    /// N live sessions printing every 100 ms, one SSE + one WS subscriber each.
    Fanout,
    /// Runner RSS idle, with N idle and N streaming sessions.
    Footprint,
    /// Watches held and API requests per session start and stop.
    ApiserverLoad,
    /// The real Telo kernel through the runner, cold and warm: hello-world
    /// and http-hello (needs a real kernel given, see `--telo`).
    RealKernel,
    /// N sessions (C at a time, default 5) printing 3 numbered lines while
    /// the terminal attaches: each line shown exactly once.
    StartOutput,
    /// N big bundles (default 6 × 23,500 files) started at once while
    /// `/livez` is probed every 5 ms.
    BigBundles,
    /// One watch session edited N times (default 50, `--sessions`): change
    /// set → next generation started, → its first output; fake-telo or the
    /// real kernel (`--kernel real`, default 20 edits).
    WatchReload,
    /// N watch sessions (default 200, C = 10 at a time) run once and left
    /// to suspend: runner memory per suspended session, resume → `running`
    /// (local backend).
    WatchSuspend,
    /// Warm pools: POST → `running` and → first output, warm and cold, at
    /// pool sizes 0/5/20 (`--pool-sizes`) and C = 1 and 10, on a kube-sim
    /// with a cluster's start latencies; refill rate, apiserver requests.
    WarmPool,
    /// Watch pools: one-app watch sessions one at a time, POST → `running`
    /// and → first output, on a pooled pod and on a new one, on a kube-sim
    /// with a cluster's start latencies.
    WatchPool,
    /// N idle connections (default 1,100; `--sessions`) against a runner
    /// under `ulimit -n 1024`, from one address then 64: `/livez`,
    /// `/v1/health` and an authorised POST timed before, during and after.
    ConnectionPressure,
    /// What authentication, ownership, quota and rate checks add to a
    /// request (N requests, default 5,000, side by side with an open
    /// runner), and the memory of 10,000 rate-limited principals.
    Access,
    /// The session edge as a reverse proxy beside direct and nginx: small
    /// requests at 1/50/500 clients (`--requests` per level, default
    /// 60,000/200,000/100,000), 1 GiB streamed each way (`--bytes`),
    /// 10,000 idle proxied WebSockets (`--websockets`), 20 wakes of a
    /// suspended session by a request (`--wakes`); local backend.
    Edge,
    /// One and three replicas behind a round-robin relay on kube-sim:
    /// starts per second and POST → `running` at C = 50 (`--sessions`,
    /// default 200), apiserver requests per idle replica per minute, and
    /// SIGKILL → each of the killed replica's sessions served again.
    Replicas,
    /// Every scenario in turn.
    All,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::StartLatency => "start-latency",
            Scenario::RelayThroughput => "relay-throughput",
            Scenario::Fanout => "fanout",
            Scenario::Footprint => "footprint",
            Scenario::ApiserverLoad => "apiserver-load",
            Scenario::RealKernel => "real-kernel",
            Scenario::StartOutput => "start-output",
            Scenario::BigBundles => "big-bundles",
            Scenario::WatchReload => "watch-reload",
            Scenario::WatchSuspend => "watch-suspend",
            Scenario::WarmPool => "warm-pool",
            Scenario::WatchPool => "watch-pool",
            Scenario::ConnectionPressure => "connection-pressure",
            Scenario::Access => "access",
            Scenario::Edge => "edge",
            Scenario::Replicas => "replicas",
            Scenario::All => "all",
        }
    }
}

/// Benchmarks telo-runner (release build, on this machine).
#[derive(Debug, Parser)]
#[command(name = "telo-runner-bench")]
struct Args {
    scenario: Scenario,
    /// Sessions (default per scenario: 500; fanout 2000; real-kernel: warm
    /// sessions per app, 8).
    #[arg(long)]
    sessions: Option<usize>,
    /// Sessions started at once (default 50; start-output 5).
    #[arg(long)]
    concurrency: Option<usize>,
    /// relay-throughput: bytes the workload writes (default 512 MiB); edge:
    /// bytes downloaded and uploaded through each proxy (default 1 GiB).
    #[arg(long)]
    bytes: Option<u64>,
    /// edge: `GET /small` requests per proxy at each client count, shared
    /// evenly among the clients (default 60,000 at 1 client, 200,000 at 50,
    /// 100,000 at 500).
    #[arg(long)]
    requests: Option<usize>,
    /// edge: idle WebSockets held through each proxy (default 10,000).
    #[arg(long)]
    websockets: Option<usize>,
    /// edge: wakes of a suspended session by a request (default 20).
    #[arg(long)]
    wakes: Option<usize>,
    /// fanout: lines each session prints (default 100, one per 100 ms).
    #[arg(long)]
    lines: Option<u64>,
    /// big-bundles: files in each bundle (default 23,500).
    #[arg(long)]
    files: Option<usize>,
    /// start-latency, apiserver-load: session containers as real fake-telo
    /// processes, or kube-sim's virtual containers (default: virtual).
    #[arg(long, value_enum)]
    workloads: Option<Workloads>,
    /// start-latency: start sessions through `POST /v1/sessions` (a bundle,
    /// the default) or an operator catalog app (`POST /v1/apps/bench/sessions`,
    /// its pod's env in a Secret; fake-telo as a process whatever
    /// `--workloads` says).
    #[arg(long, value_enum, default_value = "session")]
    door: scenarios::start_latency::Door,
    /// real-kernel: cold samples per app, each on a freshly started runner
    /// (and kube-sim) with an empty work directory (default 3).
    #[arg(long)]
    cold: Option<usize>,
    /// watch-reload: the kernel the watch session runs (default fake-telo;
    /// `real` is a real Telo CLI you give, see `--telo`).
    #[arg(long, value_enum, default_value = "fake-telo")]
    kernel: KernelKind,
    /// real-kernel, watch-reload, edge (its real-kernel wake): the real
    /// Telo CLI (default: `$TELO_REAL_KERNEL_DIR/bin/telo`; there is no
    /// other).
    #[arg(long)]
    telo: Option<PathBuf>,
    /// real-kernel, edge: the fixture's example apps (default:
    /// `<workspace>/../shared/telo/examples`).
    #[arg(long)]
    examples: Option<PathBuf>,
    /// real-kernel: start the sessions with `inspect: true` (the kernel then
    /// holds hello-world open; it is stopped once its line is printed).
    #[arg(long)]
    inspect: bool,
    /// The backend (apiserver-load needs kubernetes).
    #[arg(long, value_enum, default_value = "kubernetes")]
    backend: BackendKind,
    /// Print only the JSON line.
    #[arg(long)]
    json: bool,
    /// Rewrite this scenario's section of docs/benchmarks.md.
    #[arg(long)]
    write_docs: bool,
    /// Names the section `--write-docs` rewrites (`<scenario>:<label>`), for
    /// several runs of one scenario.
    #[arg(long)]
    label: Option<String>,
    /// Where telo-runner, kube-sim and fake-telo are (default: next to this
    /// program, rebuilt first with cargo).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Use the programs as they are, without running cargo build.
    #[arg(long)]
    no_build: bool,
    /// warm-pool: pool sizes, comma-separated (default 0,5,20).
    #[arg(long, value_delimiter = ',')]
    pool_sizes: Option<Vec<usize>>,
    /// warm-pool: run kube-sim's pods as processes or as real containers
    /// (`docker`; needs the engine and the local images).
    #[arg(long, value_enum, default_value = "process")]
    runtime: scenarios::warm_pool::SimRuntime,
    /// warm-pool: `RUNNER_WARM_POOL_SURGE` (default: the runner's).
    #[arg(long)]
    surge: Option<usize>,
    /// real-kernel (kubernetes): every session claims the pod of a warm
    /// pool of one (`RUNNER_WARM_POOL`), waiting for it to be ready, whose
    /// kernel cache is warmed with these modules (`RUNNER_WARM_POOL_MODULES`;
    /// `none`: no warm-up).
    #[arg(long)]
    warm_pool_modules: Option<String>,
}

fn command_line(args: &Args, scenario: Scenario) -> String {
    let mut cmd = format!(
        "cargo run --release -p telo-runner-bench -- {}",
        scenario.name()
    );
    for (flag, value) in [
        ("--sessions", args.sessions.map(|v| v.to_string())),
        ("--concurrency", args.concurrency.map(|v| v.to_string())),
        ("--bytes", args.bytes.map(|v| v.to_string())),
        ("--requests", args.requests.map(|v| v.to_string())),
        ("--websockets", args.websockets.map(|v| v.to_string())),
        ("--wakes", args.wakes.map(|v| v.to_string())),
        ("--lines", args.lines.map(|v| v.to_string())),
        ("--files", args.files.map(|v| v.to_string())),
        ("--cold", args.cold.map(|v| v.to_string())),
        (
            "--telo",
            args.telo.as_ref().map(|p| p.display().to_string()),
        ),
        (
            "--examples",
            args.examples.as_ref().map(|p| p.display().to_string()),
        ),
    ] {
        if let Some(value) = value {
            cmd.push_str(&format!(" {flag} {value}"));
        }
    }
    if args.door == scenarios::start_latency::Door::App {
        cmd.push_str(" --door app");
    }
    if let Some(w) = args.workloads {
        cmd.push_str(match w {
            Workloads::Processes => " --workloads processes",
            Workloads::Virtual => " --workloads virtual",
        });
    }
    if args.inspect {
        cmd.push_str(" --inspect");
    }
    if args.kernel == KernelKind::Real {
        cmd.push_str(" --kernel real");
    }
    if args.backend == BackendKind::Local {
        cmd.push_str(" --backend local");
    }
    if let Some(sizes) = &args.pool_sizes {
        let sizes: Vec<String> = sizes.iter().map(ToString::to_string).collect();
        cmd.push_str(&format!(" --pool-sizes {}", sizes.join(",")));
    }
    if args.runtime == scenarios::warm_pool::SimRuntime::Docker {
        cmd.push_str(" --runtime docker");
    }
    if let Some(surge) = args.surge {
        cmd.push_str(&format!(" --surge {surge}"));
    }
    if let Some(modules) = &args.warm_pool_modules {
        cmd.push_str(&format!(" --warm-pool-modules {modules}"));
    }

    if let Ok(nice) = std::env::var("BENCH_SIM_NICE") {
        cmd = format!("BENCH_SIM_NICE={nice} {cmd}");
    }
    if let Ok(sandbox) = std::env::var("RUNNER_LOCAL_SANDBOX") {
        cmd = format!("RUNNER_LOCAL_SANDBOX={sandbox} {cmd}");
    }
    cmd
}

fn docs_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks.md")
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.kernel == KernelKind::Real && args.scenario != Scenario::WatchReload {
        anyhow::bail!(
            "--kernel applies to watch-reload only (real-kernel always runs the real kernel)"
        );
    }
    let bins = Binaries::locate(args.bin_dir.as_deref(), !args.no_build)?;
    let scenarios = match args.scenario {
        Scenario::All => vec![
            Scenario::StartLatency,
            Scenario::RelayThroughput,
            Scenario::Fanout,
            Scenario::Footprint,
            Scenario::ApiserverLoad,
            Scenario::RealKernel,
            Scenario::StartOutput,
            Scenario::BigBundles,
        ],
        one => vec![one],
    };
    let machine = report::machine();
    for scenario in scenarios {
        let ctx = Ctx {
            bins: bins.clone(),
            backend: args.backend,
            sessions: args.sessions,
            concurrency: args.concurrency,
            bytes: args.bytes,
            requests: args.requests,
            websockets: args.websockets,
            wakes: args.wakes,
            lines: args.lines,
            files: args.files,
            workloads: args.workloads,
            door: args.door,
            cold: args.cold,
            kernel: args.kernel,
            telo: args.telo.clone(),
            examples: args.examples.clone(),
            inspect: args.inspect,
            command: command_line(&args, scenario),
            label: args.label.clone(),
            pool_sizes: args.pool_sizes.clone(),
            runtime: args.runtime,
            surge: args.surge,
            warm_pool_modules: args.warm_pool_modules.clone(),
        };
        let report = match scenario {
            Scenario::StartLatency => scenarios::start_latency::run(&ctx).await?,
            Scenario::RelayThroughput => scenarios::relay::run(&ctx).await?,
            Scenario::Fanout => scenarios::fanout::run(&ctx).await?,
            Scenario::Footprint => scenarios::footprint::run(&ctx).await?,
            Scenario::ApiserverLoad => scenarios::apiserver_load::run(&ctx).await?,
            Scenario::RealKernel => scenarios::real_kernel::run(&ctx).await?,
            Scenario::StartOutput => scenarios::start_output::run(&ctx).await?,
            Scenario::BigBundles => scenarios::big_bundles::run(&ctx).await?,
            Scenario::WatchReload => scenarios::watch_reload::run(&ctx).await?,
            Scenario::WatchSuspend => scenarios::watch_suspend::run(&ctx).await?,
            Scenario::WarmPool => scenarios::warm_pool::run(&ctx).await?,
            Scenario::WatchPool => scenarios::watch_pool::run(&ctx).await?,
            Scenario::ConnectionPressure => scenarios::conn_pressure::run(&ctx).await?,
            Scenario::Access => scenarios::access::run(&ctx).await?,
            Scenario::Edge => scenarios::edge::run(&ctx).await?,
            Scenario::Replicas => scenarios::replicas::run(&ctx).await?,
            Scenario::All => unreachable!("expanded above"),
        };
        if !args.json {
            print!("{}", report.table());
        }
        println!("{}", report.json_line());
        if args.write_docs {
            let date = today();
            report::write_docs(&docs_path(), &report, &machine, &date)?;
        }
    }
    Ok(())
}

/// Today's date (UTC), for the docs.
fn today() -> String {
    time::OffsetDateTime::now_utc().date().to_string()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("could not start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("telo-runner-bench: {err:#}");
            ExitCode::FAILURE
        }
    }
}
