//! Does the runner stay responsive while it stages big bundles? N bundles of
//! F files each are started at once (default 6 × 23,500), while a prober
//! asks `/livez` every 5 ms; reported: how long `/livez` took while the
//! bundles were written, and how long each start took to `running`.
//!
//! Writing a bundle is thousands of file system calls; done on the async
//! runtime it stalled every other request of the runner.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::future::try_join_all;
use serde_json::{Value, json};

use crate::clients::{self, Sse};
use crate::procs::Stack;
use crate::report::{Report, Samples, ms};
use crate::scenarios::Ctx;

const PROBE_EVERY: Duration = Duration::from_millis(5);

/// A fake-telo bundle whose entry prints `ready` and exits, beside `files`
/// small files in 100 directories.
fn bundle(files: usize) -> Value {
    let mut body = clients::start_body(&json!({"stdout": ["ready"]}));
    let mut list = body["bundle"]["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for n in 1..files {
        list.push(json!({
            "relativePath": format!("lib/d{:02}/f{n}.yaml", n % 100),
            "contents": format!("n: {n}\n"),
        }));
    }
    body["bundle"]["files"] = Value::Array(list);
    body
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(6);
    let files = ctx.files.unwrap_or(23_500);
    let body = Arc::new(bundle(files));
    let body_bytes = serde_json::to_vec(body.as_ref())?.len();
    let mut report = ctx.report(
        "big-bundles",
        json!({"bundles": n, "files": files, "body_bytes": body_bytes, "backend": ctx.backend}),
    );
    let stack = Arc::new(
        Stack::start(
            &ctx.bins,
            ctx.backend,
            &[("RUNNER_MAX_BODY_BYTES", (body_bytes * 2).to_string())],
        )
        .await?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let stack = stack.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let url = stack.url("/livez");
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let ok = stack
                    .http
                    .get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                took.push((sent, sent.elapsed(), ok));
                tokio::time::sleep(PROBE_EVERY).await;
            }
            took
        })
    };
    let began = Instant::now();
    let tasks = (0..n).map(|_| {
        let stack = stack.clone();
        let body = body.clone();
        async move {
            let created = clients::create_with(&stack, &body).await?;
            let mut sse = Sse::connect(&stack, &created.id).await?;
            let end = sse.wait_end().await?;
            anyhow::Ok((created, clients::now_us(), end))
        }
    });
    let ended = try_join_all(tasks).await?;
    let burst = began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let probes = prober.await.context("the /livez prober")?;

    let mut livez = Samples::default();
    let mut failed = 0;
    for (sent, took, ok) in &probes {
        if sent.duration_since(began) <= burst {
            livez.push(took.as_micros() as u64);
            if !ok {
                failed += 1;
            }
        }
    }
    let mut post_to_end = Samples::default();
    for (created, ended_us, end) in &ended {
        if end.as_deref() != Some("exited") {
            anyhow::bail!("session {} ended {end:?}, not exited", created.id);
        }
        post_to_end.push(ended_us.saturating_sub(created.sent_us));
    }
    report.row(
        format!(
            "{n} bundles of {files} files ({:.1} MB each) started at once",
            body_bytes as f64 / 1e6
        ),
        format!("all exited after {:.2} s", burst.as_secs_f64()),
    );
    report.row(
        "POST → session ended (p50 / p90 / p99 / max)",
        post_to_end.summary(),
    );
    report.row(
        format!(
            "`/livez` during the burst ({} probes, {failed} failed; p50 / p90 / p99 / max)",
            livez.len()
        ),
        livez.summary(),
    );
    report.result("post_to_end", post_to_end.json());
    report.result("livez", livez.json());
    report.result("livez_failed", json!(failed));
    let worst = livez.max();
    report.target(
        "`/livez` while big bundles are staged, max",
        "< 100 ms",
        format!("{:.1} ms", ms(worst)),
        worst < 100_000,
    );
    let stack = Arc::into_inner(stack).context("stack still shared")?;
    stack.stop().await?;
    Ok(report)
}
