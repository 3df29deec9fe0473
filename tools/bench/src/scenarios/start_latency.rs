//! N sessions started C at a time; per session: POST → 201, POST → pod
//! created (kube-sim's clock), pod Running (kube-sim) → `running` on SSE.
//! `running` is announced once the workload printed its first line, so
//! POST → `running` is also POST → first output. `--door app` starts them
//! as an operator catalog app instead of a bundle: the app-session path,
//! its pod's environment stored in a Secret first.

use std::sync::Arc;

use anyhow::Context;
use futures_util::future::try_join_all;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::clients::{self, Sse};
use crate::procs::{BackendKind, Stack, Workloads};
use crate::report::{Report, Samples, ms};
use crate::scenarios::Ctx;

/// How sessions are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Door {
    /// `POST /v1/sessions` with a bundle.
    Session,
    /// `POST /v1/apps/bench/sessions`: a catalog app running fake-telo.
    App,
}

/// The catalog app `--door app` starts: fake-telo as a process (kube-sim
/// runs an unknown image's command on the host) on a manifest of its own,
/// with one operator env value.
const APP_NAME: &str = "bench";

struct Started {
    id: String,
    sent_us: u64,
    answered_us: u64,
    running_seen_us: u64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(500);
    let c = ctx.concurrency.unwrap_or(50).max(1);
    let door = ctx.door;
    let workloads = match door {
        Door::Session => ctx.workloads.unwrap_or(Workloads::Virtual),
        Door::App => Workloads::Processes,
    };
    let mut params =
        json!({"sessions": n, "concurrency": c, "backend": ctx.backend, "workloads": workloads});
    if door == Door::App {
        params["door"] = json!(door);
    }
    let mut report = ctx.report("start-latency", params);
    // A workload that prints a line and stays up until it is stopped.
    let script = json!({"stdout": ["ready"], "echo": true});
    let app_dir = tempfile::tempdir()?;
    let mut extra_env = Vec::new();
    if door == Door::App {
        let manifest = app_dir.path().join("app.yaml");
        std::fs::write(
            &manifest,
            format!(
                "kind: Telo.Application\nmetadata: {{ name: {APP_NAME} }}\nfakeTelo: {script}\n"
            ),
        )?;
        let catalog = json!({APP_NAME: {
            "image": "acme/bench-app:1",
            "env": {"API_KEY": "operator-value"},
            "command": [ctx.bins.fake_telo.to_string_lossy(), "run", manifest.to_string_lossy()],
        }});
        extra_env.push(("RUNNER_APPS", catalog.to_string()));
    }
    let stack = Arc::new(match (door, ctx.backend) {
        // kube-sim runs the app image's command as a host process.
        (Door::App, BackendKind::Kubernetes) => {
            let sim_args = ["--image".to_string(), "acme/bench-app:1=host".to_string()];
            Stack::start_sim_with(&ctx.bins, &extra_env, &sim_args).await?
        }
        _ => Stack::start_with(&ctx.bins, ctx.backend, &extra_env, workloads).await?,
    });
    let cpu_before = stack.cpu()?;
    let began = std::time::Instant::now();
    let gate = Arc::new(Semaphore::new(c));
    let tasks = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        let script = script.clone();
        async move {
            let _permit = gate.acquire().await?;
            let created = match door {
                Door::Session => clients::create(&stack, &script).await?,
                Door::App => clients::create_app(&stack, APP_NAME).await?,
            };
            let mut sse = Sse::connect(&stack, &created.id).await?;
            let running_seen_us = sse.wait_status("running").await?;
            anyhow::Ok(Started {
                id: created.id,
                sent_us: created.sent_us,
                answered_us: created.answered_us,
                running_seen_us,
            })
        }
    });
    let started = try_join_all(tasks).await?;
    let wall = began.elapsed().as_secs_f64();
    let cpu_after = stack.cpu()?;
    let [runner_cpu, sim_cpu, bench_cpu] = [0, 1, 2].map(|i| cpu_after[i] - cpu_before[i]);
    report.row(
        "CPU used while starting: runner / kube-sim / harness",
        format!(
            "{runner_cpu:.1} s / {sim_cpu:.1} s / {bench_cpu:.1} s in {wall:.1} s wall ({:.2} ms runner CPU per start)",
            runner_cpu * 1000.0 / n.max(1) as f64
        ),
    );
    report.result(
        "cpu_s",
        json!({"runner": runner_cpu, "kube_sim": sim_cpu, "harness": bench_cpu, "wall": wall}),
    );

    let mut post_201 = Samples::default();
    let mut post_to_running = Samples::default();
    for s in &started {
        post_201.push(s.answered_us.saturating_sub(s.sent_us));
        post_to_running.push(s.running_seen_us.saturating_sub(s.sent_us));
    }
    report.row("POST → 201 (p50 / p90 / p99 / max)", post_201.summary());
    report.result("post_201", post_201.json());
    // The first C requests open their connections at the same instant; the
    // rest reuse them, as an editor's browser does.
    let mut by_send: Vec<&Started> = started.iter().collect();
    by_send.sort_by_key(|s| s.sent_us);
    let mut warm = Samples::default();
    for s in by_send.iter().skip(c) {
        warm.push(s.answered_us.saturating_sub(s.sent_us));
    }
    if warm.len() > 0 {
        report.row(
            format!("POST → 201 after the first {c} (connections open)"),
            warm.summary(),
        );
        report.result("post_201_warm", warm.json());
    }
    if ctx.backend == BackendKind::Kubernetes {
        let timeline = stack.sim_timeline().await?;
        let mut post_to_created = Samples::default();
        let mut created_to_running = Samples::default();
        let mut running_to_sse = Samples::default();
        for s in &started {
            let pod = timeline
                .get(&format!("telo-run-{}", s.id))
                .with_context(|| format!("kube-sim has no timeline for session {}", s.id))?;
            let created = pod["createdUs"].as_u64().context("pod created time")?;
            let running = pod["runningUs"].as_u64().context("pod running time")?;
            post_to_created.push(created.saturating_sub(s.sent_us));
            created_to_running.push(running.saturating_sub(created));
            running_to_sse.push(s.running_seen_us.saturating_sub(running));
        }
        report.row("POST → pod created in kube-sim", post_to_created.summary());
        report.row(
            "pod created → pod Running (kube-sim: init container, bundle fetch, start)",
            created_to_running.summary(),
        );
        report.row(
            "pod Running → SSE `running` received",
            running_to_sse.summary(),
        );
        report.result("post_to_pod_created", post_to_created.json());
        report.result("pod_created_to_running", created_to_running.json());
        report.result("pod_running_to_sse_running", running_to_sse.json());
        let p99 = running_to_sse.percentile(99.0);
        report.target(
            &format!("pod Running → SSE `running`, p99 at N = {n}"),
            "< 10 ms",
            format!("{:.2} ms", ms(p99)),
            p99 < 10_000,
        );
    }
    report.row("POST → SSE `running` received", post_to_running.summary());
    report.result("post_to_sse_running", post_to_running.json());
    let p99 = post_201.percentile(99.0);
    report.target(
        &format!("POST → 201, p99 at C = {c}"),
        "< 5 ms",
        format!("{:.2} ms", ms(p99)),
        p99 < 5_000,
    );
    let stack = Arc::into_inner(stack).context("stack still shared")?;
    stack.stop().await?;
    Ok(report)
}
