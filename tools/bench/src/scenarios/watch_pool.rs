//! Watch pools on the Kubernetes backend: POST → `running` and POST →
//! first output of one-app watch sessions (the editor's everyday session)
//! on a claimed pooled watch pod (`RUNNER_WARM_POOL_WATCH`) and on a new
//! `telo-watch-<id>` pod, on a kube-sim whose starts take as long as a
//! cluster's (`--latency-profile cluster`), kube-sim's pods as processes
//! and fake-telo as the kernel. Sessions start one at a time, each stopped
//! before the next, the pool (when there is one) whole before each.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use crate::clients;
use crate::procs::Stack;
use crate::report::{Report, Samples, ms};
use crate::scenarios::Ctx;
use crate::scenarios::warm_pool::{first_output, warm_and_running};

const IMAGE: &str = "telorun/node:0-slim";
/// How long the pool may take to fill or refill.
const FILL_WAIT: Duration = Duration::from_secs(180);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(20);
    let mut report = ctx.report(
        "watch-pool",
        json!({"sessions": n, "concurrency": 1, "runtime": "process", "latency_profile": "cluster", "pool": 1}),
    );
    let mut medians = Vec::new();
    for pooled in [false, true] {
        let (running, output, warm) = measure(ctx, pooled, n).await?;
        let label = if pooled { "pooled" } else { "cold" };
        report.row(
            format!("{label}: started on a pooled pod"),
            format!("{warm} of {n}"),
        );
        report.row(format!("{label}: POST → `running`"), pct(&running));
        report.row(format!("{label}: POST → first output"), pct(&output));
        report.result(
            label,
            json!({"warm": warm, "running": running.json(), "output": output.json()}),
        );
        medians.push(running.percentile(50.0));
    }
    if let [cold, pooled] = medians[..] {
        report.target(
            "pooled POST → `running` p50 vs cold",
            "faster",
            format!("{:.1} ms vs {:.1} ms", ms(pooled), ms(cold)),
            pooled < cold,
        );
    }
    Ok(report)
}

/// `n` one-app watch sessions, one at a time, with a pool of one (waited
/// whole before each start) or none.
async fn measure(ctx: &Ctx, pooled: bool, n: usize) -> anyhow::Result<(Samples, Samples, usize)> {
    let mut env = vec![
        ("RUNNER_IMAGE", IMAGE.to_owned()),
        ("RUNNER_WATCH_SESSIONS", "true".to_owned()),
    ];
    if pooled {
        env.push(("RUNNER_WARM_POOL_WATCH", format!("{IMAGE}=1")));
    }
    let sim_args = vec!["--latency-profile".to_owned(), "cluster".to_owned()];
    let stack = Stack::start_sim_with(&ctx.bins, &env, &sim_args).await?;
    let mut body = clients::start_body(&json!({"stdout": ["ready"]}));
    body["mode"] = json!("watch");
    body["config"]["image"] = json!(IMAGE);
    let (mut running, mut output, mut warm) = (Samples::default(), Samples::default(), 0);
    for _ in 0..n {
        if pooled {
            until_ready(&stack).await?;
        }
        let created = clients::create_with(&stack, &body).await?;
        let (started, first) = tokio::join!(
            warm_and_running(&stack, &created.id),
            first_output(&stack, &created.id)
        );
        let (was_warm, running_us) = started?;
        warm += usize::from(was_warm);
        running.push(running_us.saturating_sub(created.sent_us));
        output.push(first?.saturating_sub(created.sent_us));
        clients::delete(&stack, &created.id).await?;
    }
    stack.stop().await?;
    Ok((running, output, warm))
}

/// Waits until the runner reports its watch pod ready.
async fn until_ready(stack: &Stack) -> anyhow::Result<()> {
    let line = format!("telo_runner_warm_pods{{pool=\"watch:{IMAGE}\",state=\"ready\"}} 1");
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
            bail!("the watch pool never held a ready pod");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pct(samples: &Samples) -> String {
    format!(
        "p50 {:.1} ms / p99 {:.1} ms (n = {})",
        ms(samples.percentile(50.0)),
        ms(samples.percentile(99.0)),
        samples.len()
    )
}
