//! The real Telo kernel (a Telo CLI someone gives) behind the runner, cold and warm.
//!
//! Cold: an app's first session on a freshly started runner — an empty work
//! directory on the local backend, a fresh kube-sim on Kubernetes. Warm: the
//! sessions of the same app that follow on that runner. Per session: POST →
//! 201, → SSE `running`, → first output byte on the WebSocket; hello-world's
//! line and its `exited`; http-hello's `reachable` and its first HTTP 200,
//! asked through the session edge. Beside them, both apps run by the kernel directly, with no runner.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::process::Command;

use crate::clients::{self, Io, IoFrame, STEP, Sse, now_us};
use crate::procs::{BackendKind, Stack, free_port, http_client};
use crate::report::{Report, Samples};
use crate::scenarios::Ctx;
use crate::telo_fixture::{
    BundleFile, Kernel, SessionOptions, default_examples_dir, load_example, session_body,
    strip_ansi, write_bundle,
};

/// What hello-world prints.
const HELLO_LINE: &str = "Hello from Telo!";
/// What http-hello answers to `GET /v1/hello?name=World`.
const HTTP_GREETING: &str = "Hello World!!";
/// The session edge's base host (`RUNNER_PREVIEW_BASE_URL`).
const PREVIEW_HOST: &str = "preview.bench";
/// How often the harness asks http-hello whether it answers yet. The
/// runner's own reachability probe retries once a second, so its
/// `reachable` can trail the app by up to that much; this is the finer clock.
const HTTP_POLL_INTERVAL: Duration = Duration::from_millis(10);
const HTTP_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// A serving app exits within milliseconds of SIGTERM.
const DIRECT_STOP: Duration = Duration::from_secs(10);
const DEFAULT_COLD_SAMPLES: usize = 3;
const DEFAULT_WARM_SESSIONS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum App {
    /// A batch app: prints one line, exits 0.
    HelloWorld,
    /// An HTTP server on `$PORT`, until it is stopped.
    HttpHello,
}

impl App {
    const ALL: [App; 2] = [App::HelloWorld, App::HttpHello];

    /// The example's directory name, and the app's name in the figures.
    fn name(self) -> &'static str {
        match self {
            App::HelloWorld => "hello-world",
            App::HttpHello => "http-hello",
        }
    }
}

/// One session's milestones, in microseconds after its POST was sent.
#[derive(Debug, Default)]
struct Milestones {
    answered: u64,
    running: u64,
    first_output: u64,
    line: Option<u64>,
    exited: Option<u64>,
    reachable: Option<u64>,
    http_200: Option<u64>,
}

/// The samples of one app at one temperature (cold or warm).
#[derive(Debug, Default)]
struct Figures {
    post_201: Samples,
    running: Samples,
    first_output: Samples,
    line: Samples,
    exited: Samples,
    reachable: Samples,
    http_200: Samples,
}

impl Figures {
    fn add(&mut self, m: &Milestones) {
        self.post_201.push(m.answered);
        self.running.push(m.running);
        self.first_output.push(m.first_output);
        for (samples, value) in [
            (&mut self.line, m.line),
            (&mut self.exited, m.exited),
            (&mut self.reachable, m.reachable),
            (&mut self.http_200, m.http_200),
        ] {
            if let Some(us) = value {
                samples.push(us);
            }
        }
    }

    /// `(figure, JSON key, samples)` for every metric `app` has; a batch
    /// app has an exit unless the kernel holds it open (`--inspect`).
    fn metrics(&self, app: App, exits: bool) -> Vec<(&'static str, &'static str, &Samples)> {
        let mut metrics = vec![
            ("POST → 201", "post_201", &self.post_201),
            ("POST → SSE `running`", "post_to_running", &self.running),
            (
                "POST → first output byte on the WebSocket",
                "post_to_first_output",
                &self.first_output,
            ),
        ];
        match app {
            App::HelloWorld => {
                metrics.push((
                    "POST → `Hello from Telo!` on the WebSocket",
                    "post_to_line",
                    &self.line,
                ));
                if exits {
                    metrics.push((
                        "POST → SSE `exited` (code 0)",
                        "post_to_exited",
                        &self.exited,
                    ));
                }
            }
            App::HttpHello => {
                metrics.push((
                    "POST → SSE `reachability` reachable",
                    "post_to_reachable",
                    &self.reachable,
                ));
                metrics.push((
                    "POST → first HTTP 200 from the app",
                    "post_to_http_200",
                    &self.http_200,
                ));
            }
        }
        metrics
    }
}

/// What a cold sample means on `backend`, for the table.
fn cold_meaning(backend: BackendKind) -> &'static str {
    match backend {
        BackendKind::Local => {
            "the first session of its app on a runner just started with an empty work directory"
        }
        BackendKind::Kubernetes => {
            "the first session of its app on a runner and a kube-sim just started"
        }
    }
}

fn image(backend: BackendKind) -> &'static str {
    match backend {
        BackendKind::Local => "local",
        BackendKind::Kubernetes => "telorun/node:latest-slim",
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let kernel = Kernel::locate(ctx.telo.as_deref())?;
    let version = kernel_version(&kernel.telo).await?;
    let examples = ctx.examples.clone().unwrap_or_else(default_examples_dir);
    let cold = ctx.cold.unwrap_or(DEFAULT_COLD_SAMPLES).max(1);
    let warm = ctx.sessions.unwrap_or(DEFAULT_WARM_SESSIONS);
    let mut report = ctx.report(
        "real-kernel",
        json!({
            "backend": ctx.backend, "cold": cold, "warm": warm,
            "inspect": ctx.inspect, "kernel": version,
        }),
    );
    report.row(
        "samples (figures are min / median / max)",
        format!(
            "cold: {cold} per app, each {}; warm: the {warm} sessions of the app that follow on the last of those runners",
            cold_meaning(ctx.backend)
        ),
    );
    let mut results = serde_json::Map::new();
    for app in App::ALL {
        let files = load_example(&examples.join(app.name()), &kernel.modules)?;
        let (cold_figures, warm_figures) = measure_app(ctx, &kernel, app, &files, cold, warm)
            .await
            .with_context(|| format!("{} on the {:?} backend", app.name(), ctx.backend))?;
        let mut by_temperature = json!({"cold": {}, "warm": {}});
        let exits = !ctx.inspect;
        for ((figure, key, cold), (_, _, warm)) in cold_figures
            .metrics(app, exits)
            .into_iter()
            .zip(warm_figures.metrics(app, exits))
        {
            report.row(
                format!("{}: {figure}", app.name()),
                format!("cold {} · warm {}", cold.spread(), warm.spread()),
            );
            by_temperature["cold"][key] = cold.spread_json();
            by_temperature["warm"][key] = warm.spread_json();
        }
        let (direct_cold, direct_warm) =
            run_directly(&kernel, app, &files, cold, warm, &http_client()?)
                .await
                .with_context(|| format!("{} run directly", app.name()))?;
        let (figure, key) = match app {
            App::HelloWorld => ("start → exit 0", "start_to_exit"),
            App::HttpHello => ("start → first HTTP 200", "start_to_http_200"),
        };
        report.row(
            format!(
                "{}: run directly (`telo run`, no runner, output to a pipe): {figure}",
                app.name()
            ),
            format!(
                "cold {} · warm {}",
                direct_cold.spread(),
                direct_warm.spread()
            ),
        );
        by_temperature["direct"] = json!({
            key: {"cold": direct_cold.spread_json(), "warm": direct_warm.spread_json()},
        });
        results.insert(app.name().into(), by_temperature);
    }
    for (key, value) in results {
        report.result(&key, value);
    }
    Ok(report)
}

/// `cold` runners, each started fresh for one session of `app`; the last
/// one then runs `warm` more.
async fn measure_app(
    ctx: &Ctx,
    kernel: &Kernel,
    app: App,
    files: &[BundleFile],
    cold: usize,
    warm: usize,
) -> anyhow::Result<(Figures, Figures)> {
    let mut cold_figures = Figures::default();
    let mut warm_figures = Figures::default();
    // Sessions on the warm pod of a pool of one, when asked.
    let pooled = ctx
        .warm_pool_modules
        .as_ref()
        .filter(|_| ctx.backend == BackendKind::Kubernetes);
    // The app is asked through the session edge, as a browser asks it: a
    // local session listens in a network namespace of its own, a pod on its
    // pod IP.
    let mut env: Vec<(&str, String)> = vec![
        ("RUNNER_PREVIEW_BASE_URL", format!("http://{PREVIEW_HOST}")),
        ("RUNNER_PREVIEW_ACCESS", "public".to_owned()),
    ];
    if let Some(modules) = pooled {
        env.push(("RUNNER_WARM_POOL", format!("{}=1", image(ctx.backend))));
        env.push(("RUNNER_WARM_POOL_MODULES", modules.clone()));
    }
    for sample in 1..=cold {
        let stack = Stack::start_kernel_with(&ctx.bins, ctx.backend, &env, &kernel.telo).await?;
        let sessions = async {
            until_pod(&stack, ctx.backend, pooled.is_some()).await?;
            let first = session(&stack, ctx.backend, app, files, ctx.inspect)
                .await
                .with_context(|| format!("cold session {sample}"))?;
            cold_figures.add(&first);
            if sample == cold {
                for n in 1..=warm {
                    until_pod(&stack, ctx.backend, pooled.is_some()).await?;
                    let next = session(&stack, ctx.backend, app, files, ctx.inspect)
                        .await
                        .with_context(|| format!("warm session {n}"))?;
                    warm_figures.add(&next);
                }
            }
            anyhow::Ok(())
        }
        .await;
        let stopped = stack.stop().await;
        sessions?;
        stopped?;
    }
    Ok((cold_figures, warm_figures))
}

/// With a pool (`pooled`), waits for its pod to be ready to claim.
async fn until_pod(stack: &Stack, backend: BackendKind, pooled: bool) -> anyhow::Result<()> {
    if pooled {
        crate::scenarios::warm_pool::until_ready(stack, image(backend), 1).await?;
    }
    Ok(())
}

/// One session of `app` from POST to its end (exit, or stop by DELETE).
async fn session(
    stack: &Stack,
    backend: BackendKind,
    app: App,
    files: &[BundleFile],
    inspect: bool,
) -> anyhow::Result<Milestones> {
    let port = match app {
        App::HttpHello => Some(free_port()?),
        App::HelloWorld => None,
    };
    let options = SessionOptions {
        image: image(backend).into(),
        env: port
            .map(|p| vec![("PORT".to_string(), p.to_string())])
            .unwrap_or_default(),
        tcp_ports: port.into_iter().collect(),
        inspect,
    };
    let created = clients::create_with(stack, &session_body(files, &options)).await?;
    let since = |us: u64| us.saturating_sub(created.sent_us);
    let (mut sse, mut io) = tokio::try_join!(
        Sse::connect(stack, &created.id),
        Io::connect(stack, &created.id)
    )?;
    let mut m = Milestones {
        answered: since(created.answered_us),
        ..Milestones::default()
    };
    match app {
        App::HelloWorld => {
            let (events, output) = tokio::try_join!(
                batch_events(&mut sse, !inspect),
                read_until(&mut io, HELLO_LINE)
            )?;
            m.running = since(events.running);
            m.exited = events.exited.map(since);
            m.first_output = since(output.first_byte);
            m.line = Some(since(output.line));
            if inspect {
                stop(stack, &created.id, &mut sse).await?;
            }
        }
        App::HttpHello => {
            let port = port.context("http-hello was given no port")?;
            let url = stack.url("/v1/hello?name=World");
            let host = format!("{port}-{}.{PREVIEW_HOST}", created.id);
            let (events, first_byte, http_200) = tokio::try_join!(
                until_reachable(&mut sse, port),
                first_output(&mut io),
                first_http_200(&stack.http, &url, Some(&host))
            )?;
            m.running = since(events.running);
            m.reachable = Some(since(events.reachable));
            m.first_output = since(first_byte);
            m.http_200 = Some(since(http_200));
            stop(stack, &created.id, &mut sse).await?;
        }
    }
    Ok(m)
}

struct BatchEvents {
    running: u64,
    exited: Option<u64>,
}

/// `running`, then (when `until_exit`) `exited` with code 0.
async fn batch_events(sse: &mut Sse, until_exit: bool) -> anyhow::Result<BatchEvents> {
    let mut running = None;
    while let Some(event) = sse.next().await? {
        match event.status_kind() {
            Some("running") => {
                running = Some(now_us());
                if !until_exit {
                    break;
                }
            }
            Some("exited") => {
                let code = event.data["status"]["code"].as_i64();
                ensure!(code == Some(0), "the app exited with {code:?}, not 0");
                return Ok(BatchEvents {
                    running: running.context("`exited` came without `running`")?,
                    exited: Some(now_us()),
                });
            }
            Some(kind @ ("failed" | "stopped")) => {
                bail!("the session ended {kind}: {}", event.data)
            }
            _ => {}
        }
    }
    match running {
        Some(running) if !until_exit => Ok(BatchEvents {
            running,
            exited: None,
        }),
        _ => bail!("the event stream ended before the app exited"),
    }
}

struct ServerEvents {
    running: u64,
    reachable: u64,
}

/// `running`, then `reachability` `reachable` for `port`.
async fn until_reachable(sse: &mut Sse, port: u16) -> anyhow::Result<ServerEvents> {
    let mut running = None;
    while let Some(event) = sse.next().await? {
        if event.event == "reachability"
            && event.data["port"].as_u64() == Some(u64::from(port))
            && event.data["state"] == "reachable"
        {
            return Ok(ServerEvents {
                running: running.context("`reachable` came before `running`")?,
                reachable: now_us(),
            });
        }
        match event.status_kind() {
            Some("running") => running = Some(now_us()),
            Some(kind @ ("exited" | "failed" | "stopped")) => {
                bail!(
                    "the app ended {kind} before it was reachable: {}",
                    event.data
                )
            }
            _ => {}
        }
    }
    bail!("the event stream ended before port {port} was reachable")
}

struct Output {
    first_byte: u64,
    line: u64,
}

/// Reads the terminal until `line` has been printed.
async fn read_until(io: &mut Io, line: &str) -> anyhow::Result<Output> {
    let mut first_byte = None;
    let mut seen = Vec::new();
    loop {
        match io.next().await? {
            IoFrame::Output { bytes } if !bytes.is_empty() => {
                first_byte.get_or_insert_with(now_us);
                seen.extend_from_slice(&bytes);
                if strip_ansi(&String::from_utf8_lossy(&seen)).contains(line) {
                    return Ok(Output {
                        first_byte: first_byte.unwrap_or_else(now_us),
                        line: now_us(),
                    });
                }
            }
            IoFrame::Output { .. } | IoFrame::Gap => {}
            IoFrame::Closed => bail!(
                "the terminal closed before {line:?}; it showed: {:?}",
                strip_ansi(&String::from_utf8_lossy(&seen))
            ),
        }
    }
}

/// When the first output byte arrived.
async fn first_output(io: &mut Io) -> anyhow::Result<u64> {
    loop {
        match io.next().await? {
            IoFrame::Output { bytes } if !bytes.is_empty() => return Ok(now_us()),
            IoFrame::Output { .. } | IoFrame::Gap => {}
            IoFrame::Closed => bail!("the terminal closed before any output"),
        }
    }
}

/// Asks `url` every [`HTTP_POLL_INTERVAL`] until it answers 200 with the
/// greeting; when that answer arrived.
async fn first_http_200(
    http: &reqwest::Client,
    url: &str,
    host: Option<&str>,
) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let mut request = http.get(url);
        if let Some(host) = host {
            request = request.header(reqwest::header::HOST, host);
        }
        if let Ok(Ok(resp)) = tokio::time::timeout(HTTP_ATTEMPT_TIMEOUT, request.send()).await
            && resp.status().as_u16() == 200
        {
            let answered = now_us();
            let body = resp.text().await?;
            ensure!(
                body.contains(HTTP_GREETING),
                "{url} answered 200 with {body:?}, not the greeting"
            );
            return Ok(answered);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{url} did not answer 200 within {STEP:?}");
        }
        tokio::time::sleep(HTTP_POLL_INTERVAL).await;
    }
}

/// DELETE, then the event stream's end, which must say `stopped`.
async fn stop(stack: &Stack, id: &str, sse: &mut Sse) -> anyhow::Result<()> {
    clients::delete(stack, id).await?;
    match sse.wait_end().await?.as_deref() {
        Some("stopped") => Ok(()),
        other => bail!("after DELETE the session ended {other:?}, not stopped"),
    }
}

/// `telo --version`: also proves the kernel runs at all (Node 24 present).
async fn kernel_version(telo: &Path) -> anyhow::Result<String> {
    let out = tokio::time::timeout(
        STEP,
        Command::new(telo)
            .arg("--version")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{} --version timed out", telo.display()))?
    .with_context(|| format!("running {} --version", telo.display()))?;
    ensure!(
        out.status.success(),
        "{} --version failed ({}): {}",
        telo.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `app` run by the kernel itself: `cold` times from a fresh directory (no
/// `.telo/` cache, a fresh HOME, as a session gets), then `warm` more times
/// in the last of those directories.
async fn run_directly(
    kernel: &Kernel,
    app: App,
    files: &[BundleFile],
    cold: usize,
    warm: usize,
    http: &reqwest::Client,
) -> anyhow::Result<(Samples, Samples)> {
    let mut cold_samples = Samples::default();
    let mut warm_samples = Samples::default();
    for sample in 1..=cold {
        let dir = tempfile::tempdir()?;
        let work = DirectRun {
            telo: &kernel.telo,
            app: dir.path().join("app"),
            home: dir.path().join("home"),
        };
        write_bundle(files, &work.app)?;
        std::fs::create_dir_all(&work.home)?;
        cold_samples.push(work.run(app, http).await?);
        if sample == cold {
            for _ in 0..warm {
                warm_samples.push(work.run(app, http).await?);
            }
        }
    }
    Ok((cold_samples, warm_samples))
}

/// `telo run ./telo.yaml` in `app`, with `home` as HOME.
struct DirectRun<'a> {
    telo: &'a Path,
    app: PathBuf,
    home: PathBuf,
}

impl DirectRun<'_> {
    fn command(&self) -> Command {
        let mut cmd = Command::new(self.telo);
        cmd.args(["run", "./telo.yaml"])
            .current_dir(&self.app)
            .env("HOME", &self.home)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Microseconds from spawn to hello-world's exit, or to http-hello's
    /// first HTTP 200 (then it is stopped with SIGTERM).
    async fn run(&self, app: App, http: &reqwest::Client) -> anyhow::Result<u64> {
        match app {
            App::HelloWorld => self.until_exit().await,
            App::HttpHello => self.until_http_200(http).await,
        }
    }

    async fn until_exit(&self) -> anyhow::Result<u64> {
        let started = now_us();
        let out = tokio::time::timeout(STEP, self.command().output())
            .await
            .context("it did not exit in time")??;
        let exited = now_us();
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && strip_ansi(&stdout).contains(HELLO_LINE),
            "in {} it ended {} with stdout {stdout:?}, stderr {:?}",
            self.app.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(exited.saturating_sub(started))
    }

    async fn until_http_200(&self, http: &reqwest::Client) -> anyhow::Result<u64> {
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}/v1/hello?name=World");
        let started = now_us();
        let mut child = self
            .command()
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let answered = tokio::select! {
            answered = first_http_200(http, &url, None) => answered?,
            status = child.wait() => bail!("it exited ({}) before it answered", status?),
        };
        let pid = child.id().context("the server's pid")?;
        kill(Pid::from_raw(i32::try_from(pid)?), Signal::SIGTERM)?;
        let status = tokio::time::timeout(DIRECT_STOP, child.wait())
            .await
            .with_context(|| format!("it did not exit within {DIRECT_STOP:?} of SIGTERM"))??;
        ensure!(status.success(), "it exited {status} on SIGTERM");
        Ok(answered.saturating_sub(started))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The figures as one JSON object, keyed as in the report.
    fn metrics_json(figures: &Figures, app: App, exits: bool) -> Value {
        figures
            .metrics(app, exits)
            .into_iter()
            .map(|(_, key, s)| (key.to_string(), s.spread_json()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    #[test]
    fn a_batch_app_reports_its_exit_and_a_server_its_reachability() {
        let mut figures = Figures::default();
        figures.add(&Milestones {
            answered: 1_000,
            running: 2_000,
            first_output: 300_000,
            line: Some(400_000),
            exited: Some(500_000),
            ..Milestones::default()
        });
        let hello = metrics_json(&figures, App::HelloWorld, true);
        assert_eq!(hello["post_to_exited"]["median_ms"], 500.0);
        assert!(hello.get("post_to_http_200").is_none());
        let server = metrics_json(&figures, App::HttpHello, true);
        assert!(server.get("post_to_exited").is_none());
        assert_eq!(server["post_to_http_200"]["n"], 0);
    }

    #[test]
    fn a_held_open_batch_app_has_no_exit_figure() {
        let mut figures = Figures::default();
        figures.add(&Milestones {
            line: Some(400_000),
            ..Milestones::default()
        });
        let hello = metrics_json(&figures, App::HelloWorld, false);
        assert!(hello.get("post_to_exited").is_none());
        assert_eq!(hello["post_to_line"]["n"], 1);
    }
}
