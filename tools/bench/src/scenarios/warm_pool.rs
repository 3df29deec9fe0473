//! Warm pools on the Kubernetes backend: POST → `running` and POST → first
//! output of run sessions, warm (a claimed pool pod) and cold (a new pod),
//! at pool sizes 0 / 5 / 20 and C = 1 and 10, on a kube-sim whose starts
//! take as long as a cluster's (`--latency-profile cluster`). Also: how
//! fast the pool refills, and the apiserver requests a start costs.
//!
//! `--runtime docker` runs the pods as real containers; their kernel is a
//! stand-in image (the Debian base with a `telo` that prints a line and
//! waits), so the figures are the platform's, not a kernel's.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::future::try_join_all;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::clients::{self, Io, IoFrame, Sse, now_us};
use crate::procs::Stack;
use crate::report::{Report, Samples, ms};
use crate::scenarios::Ctx;
use crate::scenarios::apiserver_load::{delta, describe, requests};

/// The kernel image sessions run and the pool keeps (process runtime).
const IMAGE: &str = "telorun/node:0-slim";
/// The stand-in kernel image of the docker runtime, built here.
const STAND_IN: &str = "telo-runner-bench/stand-in:1";
/// How long a pool may take to fill or refill.
const FILL_WAIT: Duration = Duration::from_secs(180);

/// Which runtime kube-sim runs the pods in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SimRuntime {
    Process,
    Docker,
}

struct Started {
    warm: bool,
    to_running_us: u64,
    to_output_us: u64,
}

struct Run {
    size: usize,
    concurrency: usize,
    started: Vec<Started>,
    /// Seconds from the burst's end until the pool was whole again (one
    /// cold start, `during_refill_us`, came while it refilled).
    refill_s: Option<f64>,
    /// POST → `running` of a cold start posted once the refill had pods
    /// starting: what it costs a session to arrive during a refill.
    during_refill_us: Option<u64>,
    requests: String,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(20);
    let sizes = ctx.pool_sizes.clone().unwrap_or_else(|| vec![0, 5, 20]);
    let runtime = ctx.runtime;
    let mut report = ctx.report(
        "warm-pool",
        json!({"sessions": n, "pool_sizes": sizes, "concurrency": [1, 10], "runtime": runtime, "latency_profile": "cluster", "surge": ctx.surge}),
    );
    let image = match runtime {
        SimRuntime::Process => IMAGE.to_owned(),
        SimRuntime::Docker => build_stand_in()?,
    };
    let mut runs = Vec::new();
    for &size in &sizes {
        for concurrency in [1, 10] {
            runs.push(measure(ctx, &image, size, concurrency, n).await?);
        }
    }
    let mut warm_running_all = Samples::default();
    for run in &runs {
        let label = format!("pool {}, C = {}", run.size, run.concurrency);
        let (mut warm_running, mut warm_output) = (Samples::default(), Samples::default());
        let (mut cold_running, mut cold_output) = (Samples::default(), Samples::default());
        for s in &run.started {
            if s.warm {
                warm_running.push(s.to_running_us);
                warm_output.push(s.to_output_us);
                warm_running_all.push(s.to_running_us);
            } else {
                cold_running.push(s.to_running_us);
                cold_output.push(s.to_output_us);
            }
        }
        report.row(
            format!("{label}: warm starts"),
            format!("{} of {}", warm_running.len(), run.started.len()),
        );
        for (what, samples) in [
            ("warm POST → `running`", &warm_running),
            ("warm POST → first output", &warm_output),
            ("cold POST → `running`", &cold_running),
            ("cold POST → first output", &cold_output),
        ] {
            if samples.len() > 0 {
                report.row(format!("{label}: {what}"), pct(samples));
            }
        }
        if let Some(during) = run.during_refill_us {
            report.row(
                format!("{label}: cold POST → `running` during the refill"),
                format!("{:.1} ms", ms(during)),
            );
        }
        if let Some(refill) = run.refill_s {
            let claimed = warm_running.len();
            report.row(
                format!("{label}: refill"),
                format!(
                    "{claimed} pods in {refill:.2} s ({:.1} pods/s)",
                    claimed as f64 / refill.max(1e-3)
                ),
            );
        }
        report.row(
            format!("{label}: apiserver requests per session start"),
            run.requests.clone(),
        );
        report.result(
            &format!("pool_{}_c_{}", run.size, run.concurrency),
            json!({
                "warm": warm_running.len(),
                "warm_running": warm_running.json(),
                "warm_output": warm_output.json(),
                "cold_running": cold_running.json(),
                "cold_output": cold_output.json(),
                "refill_s": run.refill_s,
                "during_refill_ms": run.during_refill_us.map(ms),
            }),
        );
    }
    if warm_running_all.len() > 0 {
        let p50 = warm_running_all.percentile(50.0);
        let p99 = warm_running_all.percentile(99.0);
        report.target(
            "warm POST → `running`, p50 (pool not drained)",
            "< 100 ms",
            format!("{:.1} ms", ms(p50)),
            p50 < 100_000,
        );
        report.target(
            "warm POST → `running`, p99 (pool not drained)",
            "< 250 ms",
            format!("{:.1} ms", ms(p99)),
            p99 < 250_000,
        );
    }
    // Drained, a pool must cost a cold start nothing: its cold starts
    // against those of the same C without a pool.
    for concurrency in [1, 10] {
        let cold_of = |size: usize| {
            let mut samples = Samples::default();
            for run in runs
                .iter()
                .filter(|r| r.size == size && r.concurrency == concurrency)
            {
                for s in run.started.iter().filter(|s| !s.warm) {
                    samples.push(s.to_running_us);
                }
            }
            samples
        };
        let without = cold_of(0);
        for &size in sizes.iter().filter(|&&s| s > 0) {
            let with = cold_of(size);
            if without.len() == 0 || with.len() == 0 {
                continue;
            }
            let (a, b) = (with.percentile(50.0), without.percentile(50.0));
            report.target(
                &format!("cold POST → `running` p50 with pool {size} drained vs no pool, C = {concurrency}"),
                "never worse (within 10 %)",
                format!("{:.0} ms vs {:.0} ms", ms(a), ms(b)),
                a <= b + b / 10,
            );
        }
    }
    Ok(report)
}

fn pct(samples: &Samples) -> String {
    format!(
        "p50 {:.1} ms / p99 {:.1} ms (n = {})",
        ms(samples.percentile(50.0)),
        ms(samples.percentile(99.0)),
        samples.len()
    )
}

/// One stack: a pool of `size`, `n` sessions started `concurrency` at a time.
async fn measure(
    ctx: &Ctx,
    image: &str,
    size: usize,
    concurrency: usize,
    n: usize,
) -> anyhow::Result<Run> {
    let mut env = vec![("RUNNER_IMAGE", image.to_owned())];
    if size > 0 {
        env.push(("RUNNER_WARM_POOL", format!("{image}={size}")));
    }
    if let Some(surge) = ctx.surge {
        env.push(("RUNNER_WARM_POOL_SURGE", surge.to_string()));
    }
    let mut sim_args = vec!["--latency-profile".to_owned(), "cluster".to_owned()];
    if ctx.runtime == SimRuntime::Docker {
        sim_args.extend(["--runtime".to_owned(), "docker".to_owned()]);
        env.push(("RUNNER_WORKSPACE_IMAGE", "telo-runner:dev".to_owned()));
        env.push(("RUNNER_INIT_IMAGE", "busybox:stable".to_owned()));
    }
    let stack = Arc::new(Stack::start_sim_with(&ctx.bins, &env, &sim_args).await?);
    if size > 0 {
        until_ready(&stack, image, size).await?;
    }
    let before = stack.sim_stats().await?;
    // The pool's image, named as a client names it (the session's kernel
    // image is what a pool is matched by).
    let mut body = clients::start_body(&json!({"stdout": ["ready"], "echo": true}));
    body["config"]["image"] = json!(image);
    let body = Arc::new(body);
    let gate = Arc::new(Semaphore::new(concurrency));
    let tasks = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        let body = body.clone();
        async move {
            let _permit = gate.acquire().await?;
            let created = clients::create_with(&stack, &body).await?;
            let (running, output) = tokio::join!(
                warm_and_running(&stack, &created.id),
                first_output(&stack, &created.id)
            );
            let (warm, running_us) = running?;
            let output_us = output?;
            anyhow::Ok((
                created.id,
                Started {
                    warm,
                    to_running_us: running_us.saturating_sub(created.sent_us),
                    to_output_us: output_us.saturating_sub(created.sent_us),
                },
            ))
        }
    });
    let done = try_join_all(tasks).await?;
    let burst_end = Instant::now();
    let after = stack.sim_stats().await?;
    let requests = describe(&delta(&requests(&after), &requests(&before)), n);
    let (refill_s, during_refill) = if size > 0 {
        // A session that needs a new pod (`always` never starts warm),
        // posted once the refill has pods starting.
        until_starting(&stack, image).await?;
        let mut cold = (*body).clone();
        cold["config"]["pullPolicy"] = json!("always");
        let created = clients::create_with(&stack, &cold).await?;
        let (_, running_us) = warm_and_running(&stack, &created.id).await?;
        until_ready(&stack, image, size).await?;
        let refill_s = burst_end.elapsed().as_secs_f64();
        clients::delete(&stack, &created.id).await?;
        (
            Some(refill_s),
            Some(running_us.saturating_sub(created.sent_us)),
        )
    } else {
        (None, None)
    };
    for (id, _) in &done {
        clients::delete(&stack, id).await?;
    }
    let stack = Arc::into_inner(stack).context("stack still shared")?;
    stack.stop().await?;
    Ok(Run {
        size,
        concurrency,
        started: done.into_iter().map(|(_, s)| s).collect(),
        refill_s,
        during_refill_us: during_refill,
        requests,
    })
}

/// Whether the session started on a warm pod (its progress says so), and
/// when its `running` arrived.
pub(crate) async fn warm_and_running(stack: &Stack, id: &str) -> anyhow::Result<(bool, u64)> {
    let mut sse = Sse::connect(stack, id).await?;
    let mut warm = false;
    while let Some(event) = sse.next().await? {
        if event.event == "progress" && event.data["message"] == "Starting on a warm pod" {
            warm = true;
        }
        match event.status_kind() {
            Some("running") => return Ok((warm, now_us())),
            Some("failed" | "exited" | "stopped") => bail!("session {id} ended: {}", event.data),
            _ => {}
        }
    }
    bail!("session {id}'s events ended before `running`")
}

/// When the session's first output arrived on its terminal.
pub(crate) async fn first_output(stack: &Stack, id: &str) -> anyhow::Result<u64> {
    let mut io = Io::connect(stack, id).await?;
    loop {
        match io.next().await? {
            IoFrame::Output { bytes } if !bytes.is_empty() => return Ok(now_us()),
            IoFrame::Closed => bail!("session {id}'s terminal closed before any output"),
            _ => {}
        }
    }
}

/// Waits until the runner reports `size` warm pods of `image` ready.
pub(crate) async fn until_ready(stack: &Stack, image: &str, size: usize) -> anyhow::Result<()> {
    let line = format!("telo_runner_warm_pods{{pool=\"{image}\",state=\"ready\"}} {size}");
    let deadline = Instant::now() + FILL_WAIT;
    loop {
        let metrics = stack
            .http
            .get(stack.url("/metrics"))
            .send()
            .await?
            .text()
            .await?;
        if metrics.lines().any(|l| l == line) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the warm pool never held {size} ready pods");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the runner reports a pod of `image`'s pool starting.
async fn until_starting(stack: &Stack, image: &str) -> anyhow::Result<()> {
    let prefix = format!("telo_runner_warm_pods{{pool=\"{image}\",state=\"starting\"}} ");
    let deadline = Instant::now() + FILL_WAIT;
    loop {
        let metrics = stack
            .http
            .get(stack.url("/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let starting = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse::<u64>().ok());
        if starting.is_some_and(|n| n > 0) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the warm pool never began to refill");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The docker runtime's kernel stand-in: the Debian base with a `telo` that
/// prints a line and waits until it is stopped.
fn build_stand_in() -> anyhow::Result<String> {
    let client =
        std::env::var("TELO_RUNNER_CONTAINER_ENGINE").unwrap_or_else(|_| "docker".to_owned());
    let base = std::env::var("TELO_RUNNER_IMAGE_BASE")
        .unwrap_or_else(|_| "telo-runner/debian:bookworm".to_owned());
    let context = tempfile::tempdir()?;
    std::fs::write(
        context.path().join("Dockerfile"),
        format!("FROM {base}\nCOPY telo /usr/local/bin/telo\nUSER 1000:1000\n"),
    )?;
    let telo = context.path().join("telo");
    std::fs::write(&telo, "#!/bin/sh\necho ready\nexec sleep 3600\n")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&telo, std::fs::Permissions::from_mode(0o755))?;
    let out = Command::new(&client)
        .args(["build", "-q", "-t", STAND_IN])
        .arg(context.path())
        .output()
        .with_context(|| format!("run {client} build"))?;
    if !out.status.success() {
        bail!(
            "building {STAND_IN}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(STAND_IN.to_owned())
}
