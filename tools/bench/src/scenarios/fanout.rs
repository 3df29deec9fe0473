//! N live sessions each printing a line every 100 ms, with one SSE and one
//! WebSocket subscriber each: every line must arrive, in order, with no gap;
//! the delay from the workload's clock to the client's is measured.

use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use futures_util::future::try_join_all;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::clients::{self, Io, IoFrame, Sse, now_us};
use crate::procs::Stack;
use crate::report::{Report, Samples, mib};
use crate::scenarios::Ctx;

const EVERY_MS: u64 = 100;

struct Ready {
    sse: Sse,
    io: Io,
}

/// What one session's subscribers saw.
struct Seen {
    lines: u64,
    in_order: bool,
    gaps: u64,
    delays_us: Vec<u64>,
    end: Option<String>,
}

/// Reads the session's output to the end, checking `line <i> <millis>`.
async fn follow(mut ready: Ready, lines: u64) -> anyhow::Result<Seen> {
    ready.io.send_stdin(b"go\n").await?;
    let mut seen = Seen {
        lines: 0,
        in_order: true,
        gaps: 0,
        delays_us: Vec::with_capacity(lines as usize),
        end: None,
    };
    let mut pending: Vec<u8> = Vec::new();
    loop {
        match ready.io.next().await? {
            IoFrame::Output { bytes, .. } => {
                let at = now_us();
                pending.extend_from_slice(&bytes);
                while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=nl).collect();
                    let text = String::from_utf8_lossy(&line);
                    let mut parts = text.trim_end().split(' ');
                    if parts.next() != Some("line") {
                        continue;
                    }
                    let index: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                    let printed_ms: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                    if index != seen.lines + 1 {
                        seen.in_order = false;
                    }
                    seen.lines = seen.lines.max(index);
                    seen.delays_us.push(at.saturating_sub(printed_ms * 1000));
                }
            }
            IoFrame::Gap => seen.gaps += 1,
            IoFrame::Closed => break,
        }
    }
    seen.end = ready.sse.wait_end().await?;
    Ok(seen)
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(2000);
    let c = ctx.concurrency.unwrap_or(50).max(1);
    let lines = ctx.lines.unwrap_or(100);
    let mut report = ctx.report(
        "fanout",
        json!({"sessions": n, "concurrency": c, "lines": lines, "every_ms": EVERY_MS, "backend": ctx.backend}),
    );
    let stack = Arc::new(Stack::start(&ctx.bins, ctx.backend, &[]).await?);
    let script = json!({"waitForInput": true, "lineEveryMs": EVERY_MS, "lines": lines});
    let gate = Arc::new(Semaphore::new(c));
    let start_began = Instant::now();
    let starts = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        let script = script.clone();
        async move {
            let _permit = gate.acquire().await?;
            let created = clients::create(&stack, &script).await?;
            let mut sse = Sse::connect(&stack, &created.id).await?;
            sse.wait_status("running").await?;
            let io = Io::connect(&stack, &created.id).await?;
            anyhow::Ok(Ready { sse, io })
        }
    });
    let ready = try_join_all(starts).await?;
    let start_s = start_began.elapsed().as_secs_f64();
    let rss_live_idle = stack.runner.rss_bytes()?;
    let cpu_before = stack.runner.cpu_seconds()?;
    let stream_began = Instant::now();
    // Every session is live and subscribed; now they all start printing.
    let followers = ready.into_iter().map(|r| tokio::spawn(follow(r, lines)));
    let seen: Vec<Seen> = try_join_all(followers)
        .await?
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let stream_s = stream_began.elapsed().as_secs_f64();
    let cpu = stack.runner.cpu_seconds()? - cpu_before;
    let peak = stack.runner.peak_rss_bytes()?;

    let mut delays = Samples::default();
    let mut lost_sessions = 0usize;
    let mut lost_lines = 0u64;
    let mut gaps = 0u64;
    let mut bad_ends = 0usize;
    for s in &seen {
        for &d in &s.delays_us {
            delays.push(d);
        }
        gaps += s.gaps;
        if s.lines != lines || !s.in_order || s.gaps > 0 {
            lost_sessions += 1;
            lost_lines += lines.saturating_sub(s.delays_us.len() as u64);
        }
        if s.end.as_deref() != Some("exited") {
            bad_ends += 1;
        }
    }
    let delivered = delays.len() as u64;
    report.row(
        "sessions live and subscribed (SSE + WS each)",
        format!("{n} (all started in {start_s:.1} s)"),
    );
    report.row(
        "lines delivered / expected",
        format!("{delivered} / {}", n as u64 * lines),
    );
    report.row(
        "sessions with a lost, reordered or gapped line",
        format!("{lost_sessions} ({lost_lines} lines missing, {gaps} gap frames)"),
    );
    report.row(
        "sessions whose SSE did not end `exited`",
        bad_ends.to_string(),
    );
    report.row(
        "delivery delay, workload clock → client (p50 / p90 / p99 / max)",
        delays.summary(),
    );
    report.row(
        "runner while streaming: CPU, RSS before / peak",
        format!(
            "{cpu:.1} s CPU in {stream_s:.1} s, {:.1} MiB / {:.1} MiB",
            mib(rss_live_idle),
            mib(peak)
        ),
    );
    report.result("delivery_delay", delays.json());
    report.result("lines_delivered", json!(delivered));
    report.result("lines_expected", json!(n as u64 * lines));
    report.result("sessions_with_loss", json!(lost_sessions));
    report.result("gap_frames", json!(gaps));
    report.result("bad_ends", json!(bad_ends));
    report.result("runner_cpu_s", json!(cpu));
    report.result("stream_s", json!(stream_s));
    report.result("runner_peak_rss_bytes", json!(peak));
    report.target(
        "live streaming sessions in one runner, no frame lost",
        "2,000",
        format!("{n}, {lost_sessions} with loss"),
        n >= 2000 && lost_sessions == 0 && bad_ends == 0,
    );
    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    if lost_sessions > 0 || bad_ends > 0 {
        eprintln!("{}", report.table());
        bail!("{lost_sessions} session(s) lost output, {bad_ends} ended wrongly");
    }
    Ok(report)
}
