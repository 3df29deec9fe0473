//! N watch sessions on the local backend, each started, seen running, then
//! left alone until it suspends (`RUNNER_WATCH_IDLE_SECONDS=1`): the
//! runner's resident memory per suspended session, then resume → `running`
//! for each of them. A second runner, whose sessions never go idle long
//! enough to suspend, gives the memory of an idle live watch session.
//!
//! Memory per session is measured past a warm-up wave: the first sessions a
//! runner ever runs also page in the code they use and give each thread
//! that touched the heap its allocator arena, costs paid once per process
//! whatever the number of sessions. Dividing those by N would make the
//! figure depend on N; the warm-up pays them before the measurement starts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::future::try_join_all;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::clients::{self, Sse, now_us};
use crate::procs::{BackendKind, Stack};
use crate::report::{Report, Samples, mib};
use crate::scenarios::Ctx;

/// Reads events until the status is `kind`.
async fn until_status(sse: &mut Sse, kind: &str) -> anyhow::Result<u64> {
    sse.wait_status(kind).await
}

/// Starts one watch session, waits until it runs, and leaves it.
async fn start_one(stack: &Stack) -> anyhow::Result<String> {
    let mut body = clients::start_body(&json!({"stdout": ["up"]}));
    body["mode"] = json!("watch");
    let created = clients::create_with(stack, &body).await?;
    let mut sse = Sse::connect(stack, &created.id).await?;
    until_status(&mut sse, "running").await?;
    Ok(created.id)
}

/// Polls `GET /v1/sessions/:id` until it is suspended (no stream is open,
/// so it can go idle).
async fn suspended(stack: &Stack, id: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let snapshot: serde_json::Value = stack
            .http
            .get(stack.url(&format!("/v1/sessions/{id}")))
            .send()
            .await?
            .json()
            .await?;
        if snapshot["status"]["kind"] == "suspended" {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("session {id} never suspended: {snapshot}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sessions started (and suspended) before the measured wave.
const WARMUP_SESSIONS: usize = 20;

/// Starts `n` sessions, `c` at a time; with `suspend`, each is also waited
/// for until it suspended.
async fn start_wave(
    stack: &Arc<Stack>,
    n: usize,
    c: usize,
    suspend: bool,
) -> anyhow::Result<Vec<String>> {
    let gate = Arc::new(Semaphore::new(c));
    let started = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            let id = start_one(&stack).await?;
            if suspend {
                suspended(&stack, &id).await?;
            }
            anyhow::Ok(id)
        }
    });
    try_join_all(started).await
}

/// A runner's resident memory once the allocator settled.
async fn settled_rss(stack: &Stack) -> anyhow::Result<u64> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    stack.runner.rss_bytes()
}

/// Runner memory per idle live watch session: `n` sessions started and
/// left running unwatched under an idle timeout they never reach.
async fn idle_live_per_session(ctx: &Ctx, n: usize, c: usize) -> anyhow::Result<u64> {
    let env = [
        ("RUNNER_WATCH_SESSIONS", "true".to_owned()),
        ("RUNNER_WATCH_IDLE_SECONDS", "3600".to_owned()),
        (
            "RUNNER_WATCH_MAX_SESSIONS",
            (n + WARMUP_SESSIONS).to_string(),
        ),
        (
            "RUNNER_MAX_SESSIONS",
            (n + WARMUP_SESSIONS + 10).to_string(),
        ),
    ];
    let stack = Arc::new(Stack::start(&ctx.bins, ctx.backend, &env).await?);
    start_wave(&stack, WARMUP_SESSIONS, c, false).await?;
    let warm = settled_rss(&stack).await?;
    start_wave(&stack, n, c, false).await?;
    let live = settled_rss(&stack).await?;
    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    Ok(live.saturating_sub(warm) / n.max(1) as u64)
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    if ctx.backend != BackendKind::Local {
        bail!("watch-suspend runs on the local backend (--backend local)");
    }
    let n = ctx.sessions.unwrap_or(200);
    let c = ctx.concurrency.unwrap_or(10).max(1);
    let mut report = ctx.report(
        "watch-suspend",
        json!({"sessions": n, "concurrency": c, "backend": ctx.backend, "kernel": "fake-telo"}),
    );
    let env = [
        ("RUNNER_WATCH_SESSIONS", "true".to_owned()),
        ("RUNNER_WATCH_IDLE_SECONDS", "1".to_owned()),
        (
            "RUNNER_WATCH_MAX_SESSIONS",
            (n + WARMUP_SESSIONS).to_string(),
        ),
        (
            "RUNNER_MAX_SESSIONS",
            (n + WARMUP_SESSIONS + 10).to_string(),
        ),
    ];
    let stack = Arc::new(Stack::start(&ctx.bins, ctx.backend, &env).await?);
    let idle = settled_rss(&stack).await?;
    let mut ids = start_wave(&stack, WARMUP_SESSIONS, c, true).await?;
    let warm = settled_rss(&stack).await?;
    ids.extend(start_wave(&stack, n, c, true).await?);
    let with_suspended = settled_rss(&stack).await?;
    let per_session = with_suspended.saturating_sub(warm) / n.max(1) as u64;
    let from_idle = with_suspended.saturating_sub(idle) / ids.len().max(1) as u64;

    let mut resume = Samples::default();
    for id in &ids {
        let mut sse = Sse::connect(&stack, id).await?;
        // The replay ends with `suspended`; the `running` after it is the
        // resumed workload's.
        until_status(&mut sse, "suspended").await?;
        let sent = now_us();
        let response = stack
            .http
            .post(stack.url(&format!("/v1/sessions/{id}/resume")))
            .send()
            .await?;
        if response.status() != reqwest::StatusCode::ACCEPTED {
            bail!("resume answered {}", response.status());
        }
        let running = until_status(&mut sse, "running").await?;
        resume.push(running.saturating_sub(sent));
        clients::delete(&stack, id).await?;
        sse.wait_end().await?;
    }

    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    let live_n = (n / 4).max(1);
    let idle_live = idle_live_per_session(ctx, live_n, c).await?;

    let kib = |bytes: u64| format!("{:.1} KiB", bytes as f64 / 1024.0);
    report.row("runner RSS idle", format!("{:.1} MiB", mib(idle)));
    report.row(
        format!("runner RSS after {WARMUP_SESSIONS} warm-up sessions suspended"),
        format!("{:.1} MiB", mib(warm)),
    );
    report.row(
        format!(
            "runner RSS with {} suspended watch sessions",
            n + WARMUP_SESSIONS
        ),
        format!("{:.1} MiB", mib(with_suspended)),
    );
    report.row(
        format!("per suspended session (RSS delta / N over the {n} after the warm-up)"),
        kib(per_session),
    );
    report.row(
        "per suspended session counting the runner's first sessions (RSS delta from idle / all)",
        kib(from_idle),
    );
    report.row(
        format!("per idle live watch session (runner only, {live_n} running unwatched)"),
        kib(idle_live),
    );
    report.row(
        "resume → `running` (p50 / p90 / p99 / max)",
        resume.summary(),
    );
    report.result("rss_idle_bytes", json!(idle));
    report.result("rss_warm_bytes", json!(warm));
    report.result("rss_suspended_bytes", json!(with_suspended));
    report.result("per_suspended_session_bytes", json!(per_session));
    report.result("per_suspended_session_from_idle_bytes", json!(from_idle));
    report.result("per_idle_live_session_bytes", json!(idle_live));
    report.result("resume_to_running", resume.json());
    report.target(
        "a suspended session costs < 16 KiB of runner memory",
        "< 16 KiB",
        kib(per_session),
        per_session < 16 * 1024,
    );
    Ok(report)
}
