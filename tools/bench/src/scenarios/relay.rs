//! One session whose workload writes `spewBytes` as fast as it can, read by
//! one and then by ten WebSocket clients: bytes per second reaching each
//! client, and the runner's CPU time per GB it relayed.

use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use futures_util::future::try_join_all;
use serde_json::json;

use crate::clients::{self, Io, IoFrame, Sse};
use crate::procs::{BackendKind, Stack};
use crate::report::{Report, mib};
use crate::scenarios::Ctx;

/// What one client saw.
struct Received {
    bytes: u64,
    gaps: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// Bytes per second from the first to the last frame a client got.
fn mb_s(r: &Received) -> f64 {
    match (r.first, r.last) {
        (Some(a), Some(b)) if b > a => r.bytes as f64 / 1e6 / (b - a).as_secs_f64(),
        _ => 0.0,
    }
}

/// Reads `total` bytes of replay (the session is still live, so the socket
/// stays open).
async fn read_replay(mut io: Io, total: u64) -> anyhow::Result<Received> {
    let mut got = Received {
        bytes: 0,
        gaps: 0,
        first: None,
        last: None,
    };
    while got.bytes < total {
        match io.next().await? {
            IoFrame::Output { bytes, .. } => {
                let now = Instant::now();
                got.first.get_or_insert(now);
                got.last = Some(now);
                got.bytes += bytes.len() as u64;
            }
            IoFrame::Gap => got.gaps += 1,
            IoFrame::Closed => bail!("the socket closed after {} of {total} bytes", got.bytes),
        }
    }
    Ok(got)
}

/// The kernel's PTY throughput on this machine: fake-telo spewing into a
/// PTY read by one thread, with no runner involved.
fn pty_ceiling(fake_telo: &std::path::Path, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Read;
    let dir = tempfile::tempdir()?;
    let entry = dir.path().join("telo.yaml");
    std::fs::write(&entry, format!("fakeTelo: {{spewBytes: {bytes}}}\n"))?;
    let pty = nix::pty::openpty(None, None)?;
    let mut child = std::process::Command::new(fake_telo)
        .arg("run")
        .arg(&entry)
        .stdin(std::process::Stdio::null())
        .stdout(pty.slave.try_clone()?)
        .stderr(pty.slave.try_clone()?)
        .spawn()?;
    drop(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    let mut first = None;
    let mut last = Instant::now();
    loop {
        match master.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                total += n as u64;
            }
        }
    }
    child.wait()?;
    let first = first.ok_or_else(|| anyhow::anyhow!("nothing came out of the PTY"))?;
    Ok(total as f64 / 1e6 / (last - first).as_secs_f64().max(1e-9))
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let bytes = ctx.bytes.unwrap_or(256 * 1024 * 1024);
    let mut report = ctx.report(
        "relay-throughput",
        json!({"spew_bytes": bytes, "backend": ctx.backend}),
    );
    // The replay buffer holds the whole spew, so late clients get all of it
    // from the runner's memory at the runner's own speed.
    let buffer = (bytes * 11 / 10 + (1 << 20)).to_string();
    let stack = Arc::new(
        Stack::start(
            &ctx.bins,
            ctx.backend,
            &[("RUNNER_REPLAY_BUFFER_BYTES", buffer)],
        )
        .await?,
    );
    let ceiling = pty_ceiling(&ctx.bins.fake_telo, bytes)?;

    // Live: the workload's output crosses a PTY (and, on Kubernetes,
    // kube-sim's attach stream) before the runner relays it.
    let script = json!({"waitForInput": true, "spewBytes": bytes, "echo": true});
    let created = clients::create(&stack, &script).await?;
    let mut sse = Sse::connect(&stack, &created.id).await?;
    sse.wait_status("running").await?;
    let mut live = Io::connect(&stack, &created.id).await?;
    let sim_cpu_before = match &stack.sim {
        Some(sim) => sim.cpu_seconds()?,
        None => 0.0,
    };
    let cpu_before = stack.runner.cpu_seconds()?;
    // `go` releases the spew; `end` is echoed by the workload only once the
    // spew is written, so it marks the end of the output.
    live.send_stdin(b"go\nend\n").await?;
    let mut got = Received {
        bytes: 0,
        gaps: 0,
        first: None,
        last: None,
    };
    let mut tail: Vec<u8> = Vec::new();
    while !(got.bytes > bytes && tail.ends_with(b"end\r\n")) {
        match live.next().await? {
            IoFrame::Output { bytes, .. } => {
                let now = Instant::now();
                got.first.get_or_insert(now);
                got.last = Some(now);
                got.bytes += bytes.len() as u64;
                tail.extend_from_slice(&bytes[bytes.len().saturating_sub(8)..]);
                let cut = tail.len().saturating_sub(8);
                tail.drain(..cut);
            }
            IoFrame::Gap => got.gaps += 1,
            IoFrame::Closed => bail!("the session closed its socket mid-spew"),
        }
    }
    let live_cpu = stack.runner.cpu_seconds()? - cpu_before;
    let sim_cpu = match &stack.sim {
        Some(sim) => sim.cpu_seconds()? - sim_cpu_before,
        None => 0.0,
    };
    let live_mb_s = mb_s(&got);
    let total = got.bytes;
    report.row(
        "PTY ceiling: fake-telo → PTY → one reader, no runner",
        format!("{ceiling:.0} MB/s"),
    );
    report.row(
        "live, workload → PTY → runner → 1 WS client",
        format!(
            "{live_mb_s:.0} MB/s ({:.1} MiB, {} gap frames; runner CPU {:.2} s per GB)",
            mib(total),
            got.gaps,
            live_cpu / (total as f64 / 1e9)
        ),
    );
    if ctx.backend == BackendKind::Kubernetes {
        report.row(
            "kube-sim CPU while live (PTY, log, attach stream)",
            format!(
                "{sim_cpu:.2} s ({:.2} s per GB)",
                sim_cpu / (total as f64 / 1e9)
            ),
        );
    }

    // From the runner's buffer: what the runner itself can push.
    let mut phases = Vec::new();
    for clients_n in [1usize, 10] {
        let mut sockets = Vec::with_capacity(clients_n);
        for _ in 0..clients_n {
            sockets.push(Io::connect(&stack, &created.id).await?);
        }
        let cpu_before = stack.runner.cpu_seconds()?;
        let started = Instant::now();
        let readers = sockets
            .into_iter()
            .map(|io| tokio::spawn(read_replay(io, total)));
        let results: Vec<Received> = try_join_all(readers)
            .await?
            .into_iter()
            .collect::<anyhow::Result<_>>()?;
        let wall = started.elapsed().as_secs_f64();
        let cpu = stack.runner.cpu_seconds()? - cpu_before;
        let rates: Vec<f64> = results.iter().map(mb_s).collect();
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let sent: u64 = results.iter().map(|r| r.bytes).sum();
        let aggregate = sent as f64 / 1e6 / wall;
        let cpu_per_gb = cpu / (sent as f64 / 1e9);
        report.row(
            format!("from the runner's buffer to {clients_n} WS client(s)"),
            format!(
                "{min:.0} MB/s per client (slowest), {aggregate:.0} MB/s in all; runner CPU {cpu_per_gb:.2} s per GB sent"
            ),
        );
        phases.push(json!({
            "clients": clients_n,
            "mb_s_per_client_min": min,
            "mb_s_aggregate": aggregate,
            "runner_cpu_s": cpu,
            "runner_cpu_s_per_gb_sent": cpu_per_gb,
        }));
    }
    clients::delete(&stack, &created.id).await?;
    sse.wait_end().await?;
    report.result("pty_ceiling_mb_s", json!(ceiling));
    report.result(
        "live",
        json!({"mb_s": live_mb_s, "bytes": total, "gaps": got.gaps, "runner_cpu_s": live_cpu, "kube_sim_cpu_s": sim_cpu}),
    );
    report.result("from_buffer", json!(phases));
    let one = phases[0]["mb_s_per_client_min"].as_f64().unwrap_or(0.0);
    report.target(
        "relay to 1 WS client (runner's buffer → client)",
        "≥ 200 MB/s",
        format!(
            "{one:.0} MB/s (live through a PTY: {live_mb_s:.0} MB/s, PTY ceiling {ceiling:.0} MB/s)"
        ),
        one >= 200.0,
    );
    let stack = Arc::into_inner(stack).ok_or_else(|| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await?;
    Ok(report)
}
