//! One module per scenario; each returns a [`Report`].

pub mod access;
pub mod apiserver_load;
pub mod big_bundles;
pub mod conn_pressure;
pub mod edge;
pub mod fanout;
pub mod footprint;
pub mod real_kernel;
pub mod relay;
pub mod replicas;
pub mod start_latency;
pub mod start_output;
pub mod warm_pool;
pub mod watch_pool;
pub mod watch_reload;
pub mod watch_suspend;

use std::path::PathBuf;

use serde_json::Value;

use crate::procs::{BackendKind, Binaries, KernelKind, Workloads};
use crate::report::Report;

/// What every scenario gets from the command line.
pub struct Ctx {
    pub bins: Binaries,
    pub backend: BackendKind,
    pub sessions: Option<usize>,
    pub concurrency: Option<usize>,
    pub bytes: Option<u64>,
    /// edge: `GET /small` requests per proxy and client count.
    pub requests: Option<usize>,
    /// edge: idle WebSockets held through each proxy.
    pub websockets: Option<usize>,
    /// edge: wakes of a suspended session by a request.
    pub wakes: Option<usize>,
    pub lines: Option<u64>,
    /// big-bundles: files in each bundle.
    pub files: Option<usize>,
    /// start-latency / apiserver-load: what the session containers run.
    pub workloads: Option<Workloads>,
    /// start-latency: a bundle session or a catalog app session.
    pub door: start_latency::Door,
    /// real-kernel: cold samples per app, each on a freshly started runner.
    pub cold: Option<usize>,
    /// watch-reload: fake-telo or the real Telo CLI.
    pub kernel: KernelKind,
    /// real-kernel, watch-reload: the Telo CLI to run (default: `$TELO_REAL_KERNEL_DIR/bin/telo`).
    pub telo: Option<PathBuf>,
    /// real-kernel: the example apps (`../shared/telo/examples`).
    pub examples: Option<PathBuf>,
    /// real-kernel: start sessions with `inspect: true`.
    pub inspect: bool,
    /// The command line that reproduces this run, for the docs.
    pub command: String,
    /// Names this run's section of the docs when one scenario has several.
    pub label: Option<String>,
    /// warm-pool: the pool sizes to measure (default 0, 5, 20).
    pub pool_sizes: Option<Vec<usize>>,
    /// warm-pool: the runtime kube-sim runs pods in.
    pub runtime: warm_pool::SimRuntime,
    /// warm-pool: the pools' surge (`None`: the runner's default).
    pub surge: Option<usize>,
    /// real-kernel: sessions on warm pods warmed with these modules.
    pub warm_pool_modules: Option<String>,
}

impl Ctx {
    pub fn report(&self, scenario: &'static str, params: Value) -> Report {
        let mut report = Report::new(scenario, self.command.clone(), params);
        if let Some(label) = &self.label {
            report.section = format!("{scenario}:{label}");
        }
        report
    }
}
