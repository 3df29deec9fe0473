//! N sessions, C starting at a time, each printing three numbered lines in
//! its first moments and exiting: every line must reach a client exactly
//! once, although they are written while the runner attaches the terminal.
//! The lines are spaced `1 + 5 * (k % 20)` ms apart in session `k`, so
//! across the sessions they fall before, while and after the attach. A
//! WebSocket client connects as soon as the session is created; the delay
//! from the workload's clock to that client's is measured per line.

use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use futures_util::future::try_join_all;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::clients::{self, Io, IoFrame, now_us};
use crate::procs::{BackendKind, Stack};
use crate::report::{Report, Samples};
use crate::scenarios::Ctx;

const LINES: u64 = 3;

/// What one session's client saw.
struct Seen {
    /// How often each of the lines 1..=LINES arrived.
    counts: [u32; LINES as usize],
    delays_us: Vec<u64>,
    gaps: u64,
    session_us: u64,
}

fn script(k: usize) -> Value {
    let every_ms = 1 + 5 * (k % 20) as u64;
    json!({"lineEveryMs": every_ms, "lines": LINES, "exitAfterMs": every_ms * LINES + 50})
}

async fn one_session(stack: &Stack, k: usize) -> anyhow::Result<Seen> {
    let began = Instant::now();
    let created = clients::create(stack, &script(k)).await?;
    let mut io = Io::connect(stack, &created.id).await?;
    let mut seen = Seen {
        counts: [0; LINES as usize],
        delays_us: Vec::new(),
        gaps: 0,
        session_us: 0,
    };
    let mut pending: Vec<u8> = Vec::new();
    loop {
        match io.next().await? {
            IoFrame::Output { bytes } => {
                let at = now_us();
                pending.extend_from_slice(&bytes);
                while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=nl).collect();
                    let text = String::from_utf8_lossy(&line);
                    let mut parts = text.trim_end().split(' ');
                    if parts.next() != Some("line") {
                        continue;
                    }
                    let index: usize = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                    let printed_ms: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                    if let Some(count) = index.checked_sub(1).and_then(|i| seen.counts.get_mut(i)) {
                        *count += 1;
                        seen.delays_us.push(at.saturating_sub(printed_ms * 1000));
                    }
                }
            }
            IoFrame::Gap => seen.gaps += 1,
            IoFrame::Closed => break,
        }
    }
    seen.session_us = began.elapsed().as_micros() as u64;
    Ok(seen)
}

/// `get pods/log` requests so far.
async fn log_reads(stack: &Stack) -> anyhow::Result<u64> {
    let stats = stack.sim_stats().await?;
    Ok(stats["requests"]["get"]["pods/log"].as_u64().unwrap_or(0))
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(500);
    let c = ctx.concurrency.unwrap_or(5).max(1);
    let mut report = ctx.report(
        "start-output",
        json!({"sessions": n, "concurrency": c, "lines": LINES, "backend": ctx.backend}),
    );
    let stack = Arc::new(Stack::start(&ctx.bins, ctx.backend, &[]).await?);
    let kube = ctx.backend == BackendKind::Kubernetes;
    let reads_before = if kube { log_reads(&stack).await? } else { 0 };
    let gate = Arc::new(Semaphore::new(c));
    let began = Instant::now();
    let sessions = (0..n).map(|k| {
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            one_session(&stack, k).await
        }
    });
    let seen = try_join_all(sessions).await?;
    let wall_s = began.elapsed().as_secs_f64();
    let reads = if kube {
        log_reads(&stack).await? - reads_before
    } else {
        0
    };

    let mut delays = Samples::default();
    let mut durations = Samples::default();
    let (mut duplicated, mut lost, mut gaps) = (0u64, 0u64, 0u64);
    let (mut sessions_duplicated, mut sessions_lost) = (0usize, 0usize);
    for s in &seen {
        for &d in &s.delays_us {
            delays.push(d);
        }
        durations.push(s.session_us);
        gaps += s.gaps;
        let extra: u64 = s
            .counts
            .iter()
            .map(|&c| u64::from(c.saturating_sub(1)))
            .sum();
        let missing = s.counts.iter().filter(|&&c| c == 0).count() as u64;
        duplicated += extra;
        lost += missing;
        sessions_duplicated += usize::from(extra > 0);
        sessions_lost += usize::from(missing > 0);
    }
    report.row(
        "sessions (3 lines each, C at a time)",
        format!("{n} at C = {c}, in {wall_s:.1} s"),
    );
    report.row(
        "lines shown twice or more (sessions)",
        format!("{duplicated} ({sessions_duplicated})"),
    );
    report.row(
        "lines lost (sessions)",
        format!("{lost} ({sessions_lost}); {gaps} gap frames"),
    );
    report.row(
        "line printed → client (p50 / p90 / p99 / max)",
        delays.summary(),
    );
    report.row(
        "POST → the session's socket closes (p50 / p90 / p99 / max)",
        durations.summary(),
    );
    if kube {
        report.row(
            "container log reads per session",
            format!("{:.2}", reads as f64 / n.max(1) as f64),
        );
    }
    report.result("lines_duplicated", json!(duplicated));
    report.result("sessions_with_duplicates", json!(sessions_duplicated));
    report.result("lines_lost", json!(lost));
    report.result("sessions_with_loss", json!(sessions_lost));
    report.result("gap_frames", json!(gaps));
    report.result("delivery_delay", delays.json());
    report.result("session", durations.json());
    report.result("log_reads", json!(reads));
    report.result("wall_s", json!(wall_s));
    report.target(
        "start output shown exactly once",
        "0 duplicated, 0 lost",
        format!("{duplicated} duplicated, {lost} lost over {n} sessions"),
        duplicated == 0 && lost == 0 && gaps == 0,
    );
    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    if duplicated > 0 || lost > 0 {
        eprintln!("{}", report.table());
        bail!("{duplicated} line(s) shown twice, {lost} lost");
    }
    Ok(report)
}
