//! One watch session edited N times: each edit is a change-set POST
//! rewriting the entry so that its next generation prints a new numbered
//! line. Measured per edit: the POST's own time (the runner writing the
//! files: on the local backend itself, on Kubernetes through the watch pod's
//! `workspace` container), POST → the next generation's `run started`, POST
//! → the first new output byte, and POST → the new generation's line.
//!
//! The kernel is fake-telo (its change watch debounces 75 ms) or the real
//! Telo CLI (`--kernel real`: the example hello-world, whose line is
//! renumbered per edit). The kernel's own reload time cannot be seen from
//! outside the session, so the same kernel is also run with no runner
//! (`run --watch` in a directory of its own, output to a pipe) and given the
//! same edits as files written the way the runner writes them (a temporary
//! file renamed over the entry): write → the new line there is the kernel's
//! share, and the runner's share is inferred as the difference of medians.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::clients::{self, Io, IoFrame, STEP, Sse, now_us};
use crate::procs::{BackendKind, KernelKind, Stack};
use crate::report::{Report, Samples, ms};
use crate::scenarios::Ctx;
use crate::telo_fixture::{
    BundleFile, Kernel, SessionOptions, default_examples_dir, load_example, session_body,
    strip_ansi,
};

const DEFAULT_EDITS_FAKE: usize = 50;
const DEFAULT_EDITS_REAL: usize = 20;
/// The line hello-world prints, replaced by the numbered one.
const HELLO_LINE: &str = "Hello from Telo!";

/// What generation `n` prints.
fn needle(generation: usize) -> String {
    format!("generation {generation} up")
}

/// The kernel under test and the entry it is given per generation.
enum Subject {
    Fake {
        program: PathBuf,
    },
    Real {
        kernel: Kernel,
        files: Vec<BundleFile>,
    },
}

impl Subject {
    fn program(&self) -> &Path {
        match self {
            Subject::Fake { program } => program,
            Subject::Real { kernel, .. } => &kernel.telo,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Subject::Fake { .. } => "fake-telo",
            Subject::Real { .. } => "the real kernel (hello-world)",
        }
    }

    /// The entry (`telo.yaml`) whose generation prints [`needle`].
    fn entry(&self, generation: usize) -> anyhow::Result<String> {
        match self {
            Subject::Fake { .. } => Ok(format!(
                "kind: Telo.Application\nmetadata: {{ name: bench }}\nfakeTelo: {}\n",
                json!({"stdout": [needle(generation)]})
            )),
            Subject::Real { files, .. } => {
                let entry = files
                    .iter()
                    .find(|f| f.relative_path == "telo.yaml")
                    .context("hello-world has no telo.yaml")?;
                anyhow::ensure!(
                    entry.contents.contains(HELLO_LINE),
                    "hello-world's telo.yaml no longer prints {HELLO_LINE:?}"
                );
                Ok(entry.contents.replace(HELLO_LINE, &needle(generation)))
            }
        }
    }

    /// The bundle of generation 1, every file but the entry as the example has it.
    fn files(&self) -> anyhow::Result<Vec<BundleFile>> {
        let entry = BundleFile {
            relative_path: "telo.yaml".into(),
            contents: self.entry(1)?,
        };
        let mut files = match self {
            Subject::Fake { .. } => Vec::new(),
            Subject::Real { files, .. } => files
                .iter()
                .filter(|f| f.relative_path != "telo.yaml")
                .cloned()
                .collect(),
        };
        files.push(entry);
        Ok(files)
    }
}

/// The docs section of a run, one per backend and kernel.
fn section(backend: BackendKind, kernel: KernelKind) -> &'static str {
    match (backend, kernel) {
        (BackendKind::Local, KernelKind::FakeTelo) => "watch-reload",
        (BackendKind::Kubernetes, KernelKind::FakeTelo) => "watch-reload:kubernetes",
        (BackendKind::Local, KernelKind::Real) => "watch-reload:real-local",
        (BackendKind::Kubernetes, KernelKind::Real) => "watch-reload:real-kubernetes",
    }
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
        if matches!(event.status_kind(), Some("exited" | "failed" | "stopped")) {
            bail!(
                "the session ended before generation {generation}: {}",
                event.data
            );
        }
    }
    bail!("the event stream ended before generation {generation}")
}

/// When output first showed something other than white space, and when
/// `needle` appeared in it.
struct Seen {
    first_byte: u64,
    line: u64,
}

/// Reads the terminal until `needle` appears (escape sequences removed).
async fn output(io: &mut Io, needle: &str) -> anyhow::Result<Seen> {
    let mut seen = Vec::new();
    let mut first_byte = None;
    loop {
        match io.next().await? {
            IoFrame::Output { bytes } => {
                seen.extend_from_slice(&bytes);
                let text = strip_ansi(&String::from_utf8_lossy(&seen));
                if !text.trim().is_empty() {
                    first_byte.get_or_insert_with(now_us);
                }
                if text.contains(needle) {
                    let line = now_us();
                    return Ok(Seen {
                        first_byte: first_byte.unwrap_or(line),
                        line,
                    });
                }
            }
            IoFrame::Gap => {}
            IoFrame::Closed => bail!(
                "the terminal closed before {needle:?}; it showed {:?}",
                strip_ansi(&String::from_utf8_lossy(&seen))
            ),
        }
    }
}

/// The samples of one run, in microseconds.
#[derive(Default)]
struct Through {
    post: Samples,
    to_started: Samples,
    to_first_byte: Samples,
    to_line: Samples,
    answered_to_started: Samples,
}

/// The same kernel with no runner: write → first new line, → the new
/// generation's line.
#[derive(Default)]
struct Alone {
    to_first_line: Samples,
    to_line: Samples,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let subject = match ctx.kernel {
        KernelKind::FakeTelo => Subject::Fake {
            program: ctx.bins.fake_telo.clone(),
        },
        KernelKind::Real => {
            let kernel = Kernel::locate(ctx.telo.as_deref())?;
            let examples = ctx.examples.clone().unwrap_or_else(default_examples_dir);
            let files = load_example(&examples.join("hello-world"), &kernel.modules)?;
            Subject::Real { kernel, files }
        }
    };
    let edits = ctx.sessions.unwrap_or(match ctx.kernel {
        KernelKind::FakeTelo => DEFAULT_EDITS_FAKE,
        KernelKind::Real => DEFAULT_EDITS_REAL,
    });
    let mut report = ctx.report(
        "watch-reload",
        json!({"edits": edits, "backend": ctx.backend, "kernel": ctx.kernel}),
    );
    if ctx.label.is_none() {
        report.section = section(ctx.backend, ctx.kernel).to_owned();
    }

    let (through, wall_s) = through_runner(ctx, &subject, edits)
        .await
        .with_context(|| format!("{} through the runner", subject.name()))?;
    let alone = kernel_alone(&subject, edits)
        .await
        .with_context(|| format!("{} run with no runner", subject.name()))?;

    report.row(
        format!("edits (one watch session, {})", subject.name()),
        format!("{edits} in {wall_s:.1} s"),
    );
    let write_by = match ctx.backend {
        BackendKind::Local => "the runner writes the files",
        BackendKind::Kubernetes => {
            "the runner has the watch pod's `workspace` container write the files"
        }
    };
    report.row(
        format!("change-set POST answered ({write_by})"),
        through.post.summary(),
    );
    report.row(
        "POST → `run started` of the next generation",
        through.to_started.summary(),
    );
    report.row(
        "POST → first new output byte",
        through.to_first_byte.summary(),
    );
    report.row(
        "POST → the new generation's line",
        through.to_line.summary(),
    );
    report.row(
        "POST answered → `run started` (the kernel's reload, plus one relayed frame)",
        through.answered_to_started.summary(),
    );
    let first_line = match ctx.kernel {
        KernelKind::FakeTelo => "first new line (the new generation's)",
        KernelKind::Real => "first new line (`[watch] change detected`)",
    };
    report.row(
        format!("kernel alone, no runner: file write → {first_line}"),
        alone.to_first_line.summary(),
    );
    report.row(
        "kernel alone, no runner: file write → the new generation's line (the kernel's share)",
        alone.to_line.summary(),
    );
    let share_us = i64::try_from(through.to_line.percentile(50.0))?
        - i64::try_from(alone.to_line.percentile(50.0))?;
    report.row(
        "the runner's share, inferred: POST → line through the runner minus the kernel alone (p50 − p50)",
        format!("{:.2} ms", share_us as f64 / 1000.0),
    );

    report.result("post", through.post.json());
    report.result("to_started", through.to_started.json());
    report.result("to_first_byte", through.to_first_byte.json());
    report.result("to_output", through.to_line.json());
    report.result("kernel", through.answered_to_started.json());
    report.result(
        "kernel_alone",
        json!({
            "to_first_line": alone.to_first_line.json(),
            "to_line": alone.to_line.json(),
        }),
    );
    report.result("runner_share_p50_ms", Value::from(share_us as f64 / 1000.0));
    report.result("wall_s", json!(wall_s));
    let p99 = through.post.percentile(99.0);
    report.target(
        "the runner adds < 20 ms p99 to a reload (the change-set write)",
        "< 20 ms",
        format!("{:.1} ms", ms(p99)),
        p99 < 20_000,
    );
    Ok(report)
}

/// One watch session through the runner, edited `edits` times.
async fn through_runner(
    ctx: &Ctx,
    subject: &Subject,
    edits: usize,
) -> anyhow::Result<(Through, f64)> {
    let env = [
        ("RUNNER_WATCH_SESSIONS", "true".to_owned()),
        ("RUNNER_WATCH_RELOAD_LIMIT", (edits + 10).to_string()),
    ];
    let stack = Stack::start_kernel_with(&ctx.bins, ctx.backend, &env, subject.program()).await?;
    let measured = edit_session(&stack, subject, edits).await;
    let stopped = stack.stop().await;
    let measured = measured?;
    stopped?;
    Ok(measured)
}

async fn edit_session(
    stack: &Stack,
    subject: &Subject,
    edits: usize,
) -> anyhow::Result<(Through, f64)> {
    let options = SessionOptions {
        image: "telorun/node:0-slim".into(),
        ..SessionOptions::default()
    };
    let mut body = session_body(&subject.files()?, &options);
    body["mode"] = json!("watch");
    let created = clients::create_with(stack, &body).await?;
    let mut sse = Sse::connect(stack, &created.id).await?;
    let mut io = Io::connect(stack, &created.id).await?;
    let first = needle(1);
    tokio::try_join!(started(&mut sse, 1), output(&mut io, &first)).context("generation 1")?;

    let mut through = Through::default();
    let url = stack.url(&format!("/v1/sessions/{}/workspace", created.id));
    let began = Instant::now();
    for edit in 0..edits {
        let generation = edit + 2;
        let change =
            json!({"write": [{"path": "telo.yaml", "content": subject.entry(generation)?}]});
        let line = needle(generation);
        let sent = now_us();
        let posted = async {
            let response = tokio::time::timeout(STEP, stack.http.post(&url).json(&change).send())
                .await
                .map_err(|_| anyhow!("the change set was not answered within {STEP:?}"))??;
            let answered = now_us();
            if !response.status().is_success() {
                let status = response.status();
                bail!(
                    "the change set answered {status}: {}",
                    response.text().await.unwrap_or_default()
                );
            }
            Ok(answered)
        };
        let watched = async {
            tokio::time::timeout(STEP, async {
                tokio::try_join!(started(&mut sse, generation), output(&mut io, &line))
            })
            .await
            .map_err(|_| anyhow!("generation {generation} did not show within {STEP:?}"))?
        };
        let (answered, (started_at, seen)) = tokio::try_join!(posted, watched)
            .with_context(|| format!("edit {} (generation {generation})", edit + 1))?;
        through.post.push(answered - sent);
        through.to_started.push(started_at - sent);
        through.to_first_byte.push(seen.first_byte - sent);
        through.to_line.push(seen.line - sent);
        through
            .answered_to_started
            .push(started_at.saturating_sub(answered));
    }
    let wall_s = began.elapsed().as_secs_f64();
    clients::delete(stack, &created.id).await?;
    Ok((through, wall_s))
}

/// The kernel run as `run --watch ./telo.yaml` in a directory of its own
/// (a fresh HOME, output to a pipe), edited `edits` times as the runner
/// edits: the entry written to a temporary file beside it, renamed over it.
async fn kernel_alone(subject: &Subject, edits: usize) -> anyhow::Result<Alone> {
    let dir = tempfile::tempdir()?;
    let app = dir.path().join("app");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home)?;
    crate::telo_fixture::write_bundle(&subject.files()?, &app)?;
    let mut child = Command::new(subject.program())
        .args(["run", "--watch", "./telo.yaml"])
        .current_dir(&app)
        .env("HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", subject.program().display()))?;
    // Both streams, as a terminal would show them, each line timed as it
    // arrives.
    let (lines_tx, mut lines) = mpsc::unbounded_channel::<(u64, String)>();
    let stdout = child.stdout.take().context("the kernel's stdout")?;
    let stderr = child.stderr.take().context("the kernel's stderr")?;
    tokio::spawn(timed_lines(stdout, lines_tx.clone()));
    tokio::spawn(timed_lines(stderr, lines_tx));
    let mut wait_for = async |needle: &str, since: u64| -> anyhow::Result<(u64, u64)> {
        let mut first = None;
        loop {
            let (at, line) = tokio::time::timeout(STEP, lines.recv())
                .await
                .map_err(|_| anyhow!("no {needle:?} within {STEP:?}"))?
                .with_context(|| format!("the kernel's output ended before {needle:?}"))?;
            if at < since || line.trim().is_empty() {
                continue;
            }
            first.get_or_insert(at);
            if line.contains(needle) {
                return Ok((first.unwrap_or(at), at));
            }
        }
    };
    wait_for(&needle(1), 0).await.context("generation 1")?;
    let entry = app.join("telo.yaml");
    // Named as the runner names its temporary files.
    let temp = app.join(".telo-write-bench.tmp");
    let mut alone = Alone::default();
    for edit in 0..edits {
        let generation = edit + 2;
        let text = subject.entry(generation)?;
        let written = now_us();
        std::fs::write(&temp, text)?;
        std::fs::rename(&temp, &entry)?;
        let (first, line) = wait_for(&needle(generation), written)
            .await
            .with_context(|| format!("edit {} (generation {generation})", edit + 1))?;
        alone.to_first_line.push(first - written);
        alone.to_line.push(line - written);
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(alone)
}

/// Sends each line of `stream` with when it arrived, escape sequences removed.
async fn timed_lines(
    stream: impl tokio::io::AsyncRead + Unpin,
    lines: mpsc::UnboundedSender<(u64, String)>,
) {
    let mut reader = BufReader::new(stream).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        if lines.send((now_us(), strip_ansi(&line))).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_and_kernel_has_its_own_section() {
        let mut names = Vec::new();
        for backend in [BackendKind::Local, BackendKind::Kubernetes] {
            for kernel in [KernelKind::FakeTelo, KernelKind::Real] {
                names.push(section(backend, kernel));
            }
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 4);
        assert!(names.contains(&"watch-reload"));
    }

    #[test]
    fn a_fake_entry_prints_its_generation() {
        let subject = Subject::Fake {
            program: PathBuf::from("fake-telo"),
        };
        let entry = subject.entry(7).unwrap();
        assert!(entry.contains("generation 7 up"), "{entry}");
        assert_eq!(subject.files().unwrap().len(), 1);
    }
}
