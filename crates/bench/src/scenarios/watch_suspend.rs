//! N watch sessions on the local backend, each started, seen running, then
//! left alone until it suspends (`RUNNER_WATCH_IDLE_SECONDS=1`): the
//! runner's resident memory per suspended session, then resume → `running`
//! for each of them.

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
        ("RUNNER_WATCH_MAX_SESSIONS", n.to_string()),
        ("RUNNER_MAX_SESSIONS", (n + 10).to_string()),
    ];
    let stack = Arc::new(Stack::start(&ctx.bins, ctx.backend, &env).await?);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = stack.runner.rss_bytes()?;

    let gate = Arc::new(Semaphore::new(c));
    let started = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            let id = start_one(&stack).await?;
            suspended(&stack, &id).await?;
            anyhow::Ok(id)
        }
    });
    let ids = try_join_all(started).await?;
    // Let the allocator settle after the live phase.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let with_suspended = stack.runner.rss_bytes()?;
    let per_session = with_suspended.saturating_sub(idle) / n.max(1) as u64;

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

    report.row("runner RSS idle", format!("{:.1} MiB", mib(idle)));
    report.row(
        format!("runner RSS with {n} suspended watch sessions"),
        format!("{:.1} MiB", mib(with_suspended)),
    );
    report.row(
        "per suspended session (RSS delta / N, after each ran once)",
        format!("{:.1} KiB", per_session as f64 / 1024.0),
    );
    report.row(
        "resume → `running` (p50 / p90 / p99 / max)",
        resume.summary(),
    );
    report.result("rss_idle_bytes", json!(idle));
    report.result("rss_suspended_bytes", json!(with_suspended));
    report.result("per_suspended_session_bytes", json!(per_session));
    report.result("resume_to_running", resume.json());
    report.target(
        "a suspended session costs < 16 KiB of runner memory",
        "< 16 KiB",
        format!("{:.1} KiB", per_session as f64 / 1024.0),
        per_session < 16 * 1024,
    );
    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    Ok(report)
}
