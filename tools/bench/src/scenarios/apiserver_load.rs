//! What the runner costs the apiserver: watches held, and requests made per
//! session start and stop, as kube-sim counts them.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::bail;
use futures_util::future::try_join_all;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::clients::{self, Sse};
use crate::procs::{BackendKind, Stack, Workloads};
use crate::report::Report;
use crate::scenarios::Ctx;

type Counts = BTreeMap<String, u64>;

/// `verb resource → count` from a kube-sim stats document.
pub(crate) fn requests(stats: &Value) -> Counts {
    let mut out = Counts::new();
    if let Some(verbs) = stats["requests"].as_object() {
        for (verb, resources) in verbs {
            if let Some(resources) = resources.as_object() {
                for (resource, n) in resources {
                    out.insert(format!("{verb} {resource}"), n.as_u64().unwrap_or(0));
                }
            }
        }
    }
    out
}

pub(crate) fn delta(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn watches(stats: &Value) -> u64 {
    stats["watches"]
        .as_object()
        .map_or(0, |w| w.values().filter_map(Value::as_u64).sum())
}

pub(crate) fn describe(counts: &Counts, per: usize) -> String {
    counts
        .iter()
        .map(|(k, v)| format!("{k} {}", fmt_per(*v, per)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fmt_per(v: u64, per: usize) -> String {
    let x = v as f64 / per.max(1) as f64;
    if (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    if ctx.backend != BackendKind::Kubernetes {
        bail!("apiserver-load needs the kubernetes backend");
    }
    let n = ctx.sessions.unwrap_or(500);
    let c = ctx.concurrency.unwrap_or(50).max(1);
    let mut report = ctx.report("apiserver-load", json!({"sessions": n, "concurrency": c, "workloads": ctx.workloads.unwrap_or(Workloads::Virtual)}));
    let stack = Arc::new(
        Stack::start_with(
            &ctx.bins,
            ctx.backend,
            &[],
            ctx.workloads.unwrap_or(Workloads::Virtual),
        )
        .await?,
    );
    let at_boot = stack.sim_stats().await?;
    let gate = Arc::new(Semaphore::new(c));
    let starts = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            let created =
                clients::create(&stack, &json!({"stdout": ["ready"], "echo": true})).await?;
            let mut sse = Sse::connect(&stack, &created.id).await?;
            sse.wait_status("running").await?;
            anyhow::Ok((created.id, sse))
        }
    });
    let live = try_join_all(starts).await?;
    let all_running = stack.sim_stats().await?;
    let stops = live.into_iter().map(|(id, mut sse)| {
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            clients::delete(&stack, &id).await?;
            sse.wait_end().await?;
            anyhow::Ok(())
        }
    });
    try_join_all(stops).await?;
    let all_stopped = stack.sim_stats().await?;

    let boot = requests(&at_boot);
    let start = delta(&requests(&all_running), &boot);
    let stop = delta(&requests(&all_stopped), &requests(&all_running));
    let per_start: u64 = start.values().sum();
    let watches_boot = watches(&at_boot);
    let watches_running = watches(&all_running);
    let watches_stopped = watches(&all_stopped);
    report.row(
        "requests at boot (list + watch per kind)",
        describe(&boot, 1),
    );
    report.row("requests per session start", describe(&start, n));
    report.row("requests per session stop", describe(&stop, n));
    report.row(
        format!("requests for {n} starts + stops"),
        (per_start + stop.values().sum::<u64>()).to_string(),
    );
    report.row(
        "watch connections: at boot / with N running / after stop",
        format!("{watches_boot} / {watches_running} / {watches_stopped}"),
    );
    report.row(
        "watches by resource with N running",
        all_running["watches"].to_string(),
    );
    report.result("requests_at_boot", json!(boot));
    report.result("requests_for_starts", json!(start));
    report.result("requests_for_stops", json!(stop));
    report.result(
        "watches",
        json!({"boot": watches_boot, "running": watches_running, "stopped": watches_stopped}),
    );
    let per = per_start as f64 / n.max(1) as f64;
    report.target(
        "API requests per run-session start without ports",
        "≤ 2 (create pod, + attach)",
        format!("{per:.2} ({})", describe(&start, n)),
        per <= 2.0,
    );
    let max_watches = watches_boot.max(watches_running).max(watches_stopped);
    report.target(
        &format!("watch connections to the apiserver at N = {n}"),
        "constant (≤ 4)",
        format!("{max_watches}"),
        max_watches <= 4 && watches_boot == watches_running,
    );
    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    Ok(report)
}
