//! The runner's resident memory: idle, with N idle sessions, and with N
//! sessions streaming output.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::clients::{self, Io, Sse};
use crate::procs::Stack;
use crate::report::{Report, mib};
use crate::scenarios::Ctx;

/// Starts `n` sessions running `script` and waits until each is `running`.
async fn start_all(
    stack: &Arc<Stack>,
    n: usize,
    c: usize,
    script: &Value,
) -> anyhow::Result<Vec<String>> {
    let gate = Arc::new(Semaphore::new(c));
    let tasks = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        let script = script.clone();
        async move {
            let _permit = gate.acquire().await?;
            let created = clients::create(&stack, &script).await?;
            Sse::connect(&stack, &created.id)
                .await?
                .wait_status("running")
                .await?;
            anyhow::Ok(created.id)
        }
    });
    try_join_all(tasks).await
}

/// Stops the sessions and waits until each event stream ended.
async fn stop_all(stack: &Arc<Stack>, ids: Vec<String>, c: usize) -> anyhow::Result<()> {
    let gate = Arc::new(Semaphore::new(c));
    let tasks = ids.into_iter().map(|id| {
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            let mut sse = Sse::connect(&stack, &id).await?;
            clients::delete(&stack, &id).await?;
            sse.wait_end().await?;
            anyhow::Ok(())
        }
    });
    try_join_all(tasks).await?;
    Ok(())
}

/// The highest RSS seen over `window`, sampled every 100 ms.
async fn rss_over(stack: &Stack, window: Duration) -> anyhow::Result<u64> {
    let mut max = stack.runner.rss_bytes()?;
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        max = max.max(stack.runner.rss_bytes()?);
    }
    Ok(max)
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(500);
    let c = ctx.concurrency.unwrap_or(50).max(1);
    let mut report = ctx.report("footprint", json!({"sessions": n, "backend": ctx.backend}));
    let stack = Arc::new(Stack::start(&ctx.bins, ctx.backend, &[]).await?);
    let idle = rss_over(&stack, Duration::from_secs(1)).await?;
    report.row(
        "runner RSS idle (ready, watches synced)",
        format!("{:.1} MiB", mib(idle)),
    );

    // Idle sessions print nothing, so their replay buffers are empty and
    // what they add is the per-session bookkeeping alone.
    let ids = start_all(&stack, n, c, &json!({"echo": true})).await?;
    let with_idle = rss_over(&stack, Duration::from_secs(1)).await?;
    let per_idle = with_idle.saturating_sub(idle) / n.max(1) as u64;
    report.row(
        format!("runner RSS with {n} idle sessions"),
        format!(
            "{:.1} MiB ({:.1} KiB per session)",
            mib(with_idle),
            per_idle as f64 / 1024.0
        ),
    );
    // One WebSocket subscriber per idle session, as an open editor tab has.
    let mut sockets = Vec::with_capacity(ids.len());
    for id in &ids {
        sockets.push(Io::connect(&stack, id).await?);
    }
    let with_subscribers = rss_over(&stack, Duration::from_secs(1)).await?;
    let per_subscriber = with_subscribers.saturating_sub(with_idle) / n.max(1) as u64;
    report.row(
        "runner RSS with one WebSocket subscriber on each",
        format!(
            "{:.1} MiB ({:.1} KiB per subscriber)",
            mib(with_subscribers),
            per_subscriber as f64 / 1024.0
        ),
    );
    report.result("per_websocket_subscriber_bytes", json!(per_subscriber));
    drop(sockets);
    stop_all(&stack, ids, c).await?;
    let after_idle = rss_over(&stack, Duration::from_secs(1)).await?;
    report.row(
        "runner RSS after they stopped",
        format!("{:.1} MiB", mib(after_idle)),
    );

    let streaming_script = json!({"lineEveryMs": 100});
    let ids = start_all(&stack, n, c, &streaming_script).await?;
    let with_streaming = rss_over(&stack, Duration::from_secs(3)).await?;
    report.row(
        format!("runner RSS with {n} sessions printing a line every 100 ms"),
        format!(
            "{:.1} MiB ({:.1} KiB per session, replay buffers included)",
            mib(with_streaming),
            with_streaming.saturating_sub(idle) as f64 / n.max(1) as f64 / 1024.0
        ),
    );
    stop_all(&stack, ids, c).await?;
    report.result("rss_idle_bytes", json!(idle));
    report.result("rss_with_idle_sessions_bytes", json!(with_idle));
    report.result("per_idle_session_bytes", json!(per_idle));
    report.result("rss_after_stop_bytes", json!(after_idle));
    report.result("rss_with_streaming_sessions_bytes", json!(with_streaming));
    report.target(
        "runner RSS idle",
        "< 20 MB",
        format!("{:.1} MB", idle as f64 / 1e6),
        idle < 20_000_000,
    );
    report.target(
        "per idle session, excluding replay buffers",
        "< 64 KiB",
        format!("{:.1} KiB", per_idle as f64 / 1024.0),
        per_idle < 64 * 1024,
    );
    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    Ok(report)
}
