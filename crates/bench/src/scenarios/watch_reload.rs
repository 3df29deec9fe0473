//! One watch session on the local backend, edited N times: each edit is a
//! change-set POST rewriting the entry with a new numbered line. Measured
//! per edit: the POST's own time (the runner writing the files), POST → the
//! next generation's `run started`, and POST → its first new output byte.
//! The kernel's share is what lies between the POST's answer and `run
//! started` (fake-telo: its change watch with a 75 ms debounce, the re-read
//! of the manifest, the debug frame); the runner's share is the POST itself
//! plus relaying the frame and the output, which the last two figures carry.

use std::time::Instant;

use anyhow::{anyhow, bail};
use serde_json::json;

use crate::clients::{self, Io, IoFrame, STEP, Sse, now_us};
use crate::procs::{BackendKind, Stack};
use crate::report::{Report, Samples};
use crate::scenarios::Ctx;

fn manifest(generation: usize) -> String {
    format!(
        "kind: Telo.Application\nmetadata: {{ name: bench }}\nfakeTelo: {}\n",
        json!({"stdout": [format!("generation {generation} up")]})
    )
}

/// Reads events until `run started` of `generation`; when it arrived.
async fn started(sse: &mut Sse, generation: usize) -> anyhow::Result<u64> {
    while let Some(event) = sse.next().await? {
        if event.event == "run"
            && event.data["phase"] == "started"
            && event.data["generation"] == generation as u64
        {
            return Ok(now_us());
        }
    }
    bail!("the event stream ended before generation {generation}")
}

/// Reads output until `needle` appears; when its last byte arrived.
async fn output(io: &mut Io, needle: &str, seen: &mut Vec<u8>) -> anyhow::Result<u64> {
    loop {
        match io.next().await? {
            IoFrame::Output { bytes } => {
                seen.extend_from_slice(&bytes);
                if let Some(at) = String::from_utf8_lossy(seen).find(needle) {
                    seen.drain(..at + needle.len());
                    return Ok(now_us());
                }
            }
            IoFrame::Gap => {}
            IoFrame::Closed => bail!("the terminal closed before {needle:?}"),
        }
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    if ctx.backend != BackendKind::Local {
        bail!("watch-reload runs on the local backend (--backend local)");
    }
    let edits = ctx.sessions.unwrap_or(50);
    let mut report = ctx.report(
        "watch-reload",
        json!({"edits": edits, "backend": ctx.backend, "kernel": "fake-telo"}),
    );
    let env = [
        ("RUNNER_WATCH_SESSIONS", "true".to_owned()),
        ("RUNNER_WATCH_RELOAD_LIMIT", (edits + 10).to_string()),
    ];
    let stack = Stack::start(&ctx.bins, ctx.backend, &env).await?;
    let mut body = clients::start_body(&json!({"stdout": ["generation 1 up"]}));
    body["mode"] = json!("watch");
    let created = clients::create_with(&stack, &body).await?;
    let mut sse = Sse::connect(&stack, &created.id).await?;
    let mut io = Io::connect(&stack, &created.id).await?;
    started(&mut sse, 1).await?;
    let mut seen = Vec::new();
    output(&mut io, "generation 1 up", &mut seen).await?;

    let (mut post, mut to_started, mut to_output, mut kernel) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    let url = stack.url(&format!("/v1/sessions/{}/workspace", created.id));
    let began = Instant::now();
    for edit in 0..edits {
        let generation = edit + 2;
        let change = json!({"write": [{"path": "telo.yaml", "content": manifest(generation)}]});
        let sent = now_us();
        let response = tokio::time::timeout(STEP, stack.http.post(&url).json(&change).send())
            .await
            .map_err(|_| anyhow!("the change set was not answered within {STEP:?}"))??;
        let answered = now_us();
        if !response.status().is_success() {
            bail!("the change set answered {}", response.status());
        }
        let started_at = started(&mut sse, generation).await?;
        let output_at = output(&mut io, &format!("generation {generation} up"), &mut seen).await?;
        post.push(answered - sent);
        to_started.push(started_at - sent);
        to_output.push(output_at.max(started_at) - sent);
        kernel.push(started_at - answered);
    }
    let wall_s = began.elapsed().as_secs_f64();
    clients::delete(&stack, &created.id).await?;
    report.row(
        "edits (one watch session, fake-telo)",
        format!("{edits} in {wall_s:.1} s"),
    );
    report.row(
        "change-set POST answered (runner writes the files)",
        post.summary(),
    );
    report.row(
        "POST → `run started` of the next generation",
        to_started.summary(),
    );
    report.row("POST → its first new output", to_output.summary());
    report.row(
        "POST answered → `run started` (the kernel's reload, plus one relayed frame)",
        kernel.summary(),
    );
    report.result("post", post.json());
    report.result("to_started", to_started.json());
    report.result("to_output", to_output.json());
    report.result("kernel", kernel.json());
    report.result("wall_s", json!(wall_s));
    let p99 = post.percentile(99.0);
    report.target(
        "the runner adds < 20 ms p99 to a reload (the change-set write)",
        "< 20 ms",
        format!("{:.1} ms", p99 as f64 / 1000.0),
        p99 < 20_000,
    );
    stack.stop().await?;
    Ok(report)
}
