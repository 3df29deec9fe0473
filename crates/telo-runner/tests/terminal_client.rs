//! The terminal client (`telo-runner run | attach | logs | sessions | stop`),
//! driven as a user would: the real binary in a pseudo-terminal or on pipes,
//! against an in-process runner (the local backend, or the Kubernetes one on
//! kube-sim where a restart must leave sessions running) with fake-telo as
//! the kernel.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Backend, Runner};
use portable_pty::{ChildKiller, CommandBuilder, PtySize, native_pty_system};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_telo-runner");
const WAIT: Duration = Duration::from_secs(20);

/// The client running in a pseudo-terminal; killed if the test ends first.
struct Terminal {
    output: String,
    chunks: mpsc::Receiver<Vec<u8>>,
    exit: mpsc::Receiver<u32>,
    writer: Box<dyn Write + Send>,
    master: Box<dyn portable_pty::MasterPty + Send>,
    killer: Box<dyn ChildKiller + Send + Sync>,
}

impl Terminal {
    fn spawn(args: &[&str], size: (u16, u16)) -> Terminal {
        let pair = native_pty_system()
            .openpty(pty_size(size))
            .expect("open a pty");
        let mut command = CommandBuilder::new(BIN);
        command.args(args);
        command.env("TERM", "xterm-256color");
        command.env_remove("TELO_RUNNER_URL");
        let mut child = pair.slave.spawn_command(command).expect("spawn the client");
        drop(pair.slave);
        let killer = child.clone_killer();
        let (exit_sender, exit) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(status) = child.wait() {
                let _ = exit_sender.send(status.exit_code());
            }
        });
        let mut reader = pair.master.try_clone_reader().expect("pty reader");
        let (chunk_sender, chunks) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buffer) {
                if n == 0 || chunk_sender.send(buffer[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        let writer = pair.master.take_writer().expect("pty writer");
        Terminal {
            output: String::new(),
            chunks,
            exit,
            writer,
            master: pair.master,
            killer,
        }
    }

    /// Reads until `done` holds for everything shown so far.
    fn wait_until(&mut self, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(&self.output) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.output.push_str(&String::from_utf8_lossy(&chunk)),
                Err(_) => panic!(
                    "timed out waiting for {what}; the terminal shows:\n{}",
                    self.output
                ),
            }
        }
    }

    fn wait_for(&mut self, needle: &str) {
        self.wait_until(needle, |output| output.contains(needle));
    }

    fn type_bytes(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
        self.writer.flush().unwrap();
    }

    fn resize(&self, size: (u16, u16)) {
        self.master.resize(pty_size(size)).unwrap();
    }

    /// The client's exit code, once it exited.
    fn exit_code(&mut self) -> u32 {
        let code = self
            .exit
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("the client did not exit; it shows:\n{}", self.output));
        // Whatever was printed last is still in the pty; the reader ends at
        // its end-of-file, which follows the client's exit.
        while let Ok(chunk) = self.chunks.recv_timeout(WAIT) {
            self.output.push_str(&String::from_utf8_lossy(&chunk));
        }
        code
    }

    /// The id the client announced (`session <id> starting`).
    fn session_id(&mut self) -> String {
        self.wait_for(" starting");
        let line = self
            .output
            .lines()
            .find(|line| line.contains("telo-runner: session ") && line.contains(" starting"))
            .unwrap();
        line.split_whitespace().nth(2).unwrap().to_owned()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.killer.kill();
    }
}

/// Which pipe a chunk of a [`Piped`] client's output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pipe {
    Stdout,
    Stderr,
}

/// The client as a plain process: no terminal, stdin closed, stdout and
/// stderr read as they come; killed if the test ends first.
struct Piped {
    child: std::process::Child,
    stdout: String,
    stderr: String,
    chunks: mpsc::Receiver<(Pipe, Vec<u8>)>,
}

impl Piped {
    fn spawn(args: &[&str]) -> Piped {
        let mut child = Command::new(BIN)
            .args(args)
            .env_remove("TELO_RUNNER_URL")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the client");
        let (sender, chunks) = mpsc::channel();
        fn pump(
            mut from: impl Read + Send + 'static,
            pipe: Pipe,
            to: mpsc::Sender<(Pipe, Vec<u8>)>,
        ) {
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n) = from.read(&mut buffer) {
                    if n == 0 || to.send((pipe, buffer[..n].to_vec())).is_err() {
                        return;
                    }
                }
            });
        }
        pump(child.stdout.take().unwrap(), Pipe::Stdout, sender.clone());
        pump(child.stderr.take().unwrap(), Pipe::Stderr, sender);
        Piped {
            child,
            stdout: String::new(),
            stderr: String::new(),
            chunks,
        }
    }

    fn take(&mut self, (pipe, chunk): (Pipe, Vec<u8>)) {
        let text = String::from_utf8_lossy(&chunk);
        match pipe {
            Pipe::Stdout => self.stdout.push_str(&text),
            Pipe::Stderr => self.stderr.push_str(&text),
        }
    }

    /// Reads until `done` holds for (stdout, stderr) so far.
    fn wait_until(&mut self, what: &str, done: impl Fn(&str, &str) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(&self.stdout, &self.stderr) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.take(chunk),
                Err(_) => panic!(
                    "timed out waiting for {what}; stdout:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                ),
            }
        }
    }

    fn wait_stdout(&mut self, needle: &str) {
        self.wait_until(needle, |stdout, _| stdout.contains(needle));
    }

    /// Everything the client printed, once both pipes closed, and its exit code.
    fn exit_code(&mut self) -> i32 {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.take(chunk),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "the client did not exit; stdout:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                ),
            }
        }
        let status = self.child.wait().unwrap();
        status
            .code()
            .expect("the client exited, not killed by a signal")
    }

    /// Whether stderr has exactly this line.
    fn said(&self, line: &str) -> bool {
        self.stderr.lines().any(|said| said == line)
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the client writes into a pipe for the session's output: the
/// terminal's line ends as the application's.
fn plain(output: &str) -> String {
    output.replace("\r\n", "\n")
}

fn pty_size((cols, rows): (u16, u16)) -> PtySize {
    PtySize {
        rows,
        cols,
        pixel_width: 0,
        pixel_height: 0,
    }
}

/// An application directory whose entry scripts fake-telo with `script`.
fn app_dir(script: Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("telo.yaml"),
        format!("kind: Telo.Application\nmetadata: {{ name: test }}\nfakeTelo: {script}\n"),
    )
    .unwrap();
    dir
}

fn run_in_terminal(runner: &Runner, app: &Path, size: (u16, u16)) -> Terminal {
    Terminal::spawn(
        &["run", app.to_str().unwrap(), "--runner", &runner.base],
        size,
    )
}

async fn session_kind(runner: &Runner, id: &str) -> String {
    let (_, body) = runner.get(&format!("/v1/sessions/{id}")).await;
    body["status"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Waits on the session's event stream until its status is `running`.
async fn until_running(runner: &Runner, id: &str) {
    let mut events = runner.events(id, &[]).await;
    events
        .events_until(|frame| {
            frame.event.as_deref() == Some("status") && frame.json()["status"]["kind"] == "running"
        })
        .await;
}

/// A running echo session that printed `line` (exiting with `exit_code` on
/// `exit`), and a terminal socket that has seen the line.
async fn echo_session_that_printed(
    runner: &Runner,
    line: &str,
    exit_code: i64,
) -> (String, test_support::ws::Socket) {
    let id = runner
        .create(json!({ "stdout": [line], "echo": true, "exitCode": exit_code }))
        .await;
    let mut socket = runner.io(&id, "").await;
    test_support::ws::read_until_output(&mut socket, line).await;
    until_running(runner, &id).await;
    (id, socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_shows_live_and_the_exit_code_is_returned() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["first line", "second line"], "exitCode": 7 }));
    let mut terminal = run_in_terminal(&runner, app.path(), (80, 24));
    terminal.wait_for("second line");
    assert_eq!(terminal.exit_code(), 7, "{}", terminal.output);
    assert!(terminal.output.contains("first line"));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn typing_reaches_the_workload_in_raw_mode() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["ready"], "echo": true, "exitCode": 5 }));
    let mut terminal = run_in_terminal(&runner, app.path(), (80, 24));
    terminal.wait_for("ready");
    terminal.type_bytes(b"hello-there\r");
    // Once by the workload's terminal echo, once by the workload itself; the
    // client's own terminal is raw, so it adds no echo of its own.
    terminal.wait_until("the echoed line", |output| {
        output.matches("hello-there").count() >= 2
    });
    terminal.type_bytes(b"exit\r");
    assert_eq!(terminal.exit_code(), 5, "{}", terminal.output);
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminal_resize_reaches_the_workload() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "printSize": true, "echo": true }));
    let mut terminal = run_in_terminal(&runner, app.path(), (91, 21));
    // The initial size, sent right after connecting.
    terminal.wait_for("size 91x21");
    terminal.resize((120, 40));
    terminal.wait_for("size 120x40");
    terminal.type_bytes(b"exit\r");
    assert_eq!(terminal.exit_code(), 0, "{}", terminal.output);
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ctrl_c_twice_stops_the_session() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["ready"], "echo": true }));
    let mut terminal = run_in_terminal(&runner, app.path(), (80, 24));
    let id = terminal.session_id();
    terminal.wait_for("ready");
    terminal.type_bytes(b"\x03\x03");
    assert_eq!(terminal.exit_code(), 130, "{}", terminal.output);
    assert_eq!(runner.wait_terminal(&id).await["kind"], "stopped");
    assert_eq!(session_kind(&runner, &id).await, "stopped");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bundle_over_the_limit_is_refused_before_any_session_is_created() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["never"] }));
    std::fs::write(app.path().join("big.txt"), "a".repeat(1_200_000)).unwrap();
    let output = Command::new(BIN)
        .args([
            "run",
            app.path().to_str().unwrap(),
            "--runner",
            &runner.base,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bytes over the runner's limit"), "{stderr}");
    assert!(stderr.contains("big.txt"), "{stderr}");
    let (_, listed) = runner.get("/v1/sessions").await;
    assert_eq!(listed["sessions"], json!([]), "no session was created");
    runner.stop().await;
}

/// Into a pipe the client writes the application's own text: the session
/// terminal's `\r\n` line ends become `\n`, a lone `\r` stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn piped_output_is_the_applications_own_text() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["first line", "second\rline"], "exitCode": 0 }));
    let output = Command::new(BIN)
        .args([
            "run",
            app.path().to_str().unwrap(),
            "--runner",
            &runner.base,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("first line\nsecond\rline\n"), "{stdout:?}");
    assert!(!stdout.contains("\r\n"), "{stdout:?}");
    runner.stop().await;
}

/// No runner where the client looks: it says so and how to start one. A
/// `host:port` without a scheme is a runner URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_absent_runner_is_explained_and_a_url_may_leave_out_the_scheme() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let output = Command::new(BIN)
        .args(["sessions", "--runner", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "couldn't reach the runner at http://127.0.0.1:{port}: nothing answers there ("
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("Start a runner with `telo-runner serve`"),
        "{stderr}"
    );
    assert!(!stderr.contains("error sending request"), "{stderr}");

    let runner = Runner::start().await;
    let listed = Command::new(BIN)
        .args([
            "sessions",
            "--runner",
            runner.base.trim_start_matches("http://"),
        ])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let bad = Command::new(BIN)
        .args(["sessions", "--runner", "ftp://runner"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("expected a runner URL such as http://127.0.0.1:8061, got 'ftp://runner'"),
        "{bad:?}"
    );
    runner.stop().await;
}

/// `attach` puts a terminal on a session started elsewhere: what it printed
/// so far once, then live output and typing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attach_joins_a_running_session_with_its_output_once() {
    let runner = Runner::start().await;
    let (id, _early) = echo_session_that_printed(&runner, "printed before the attach", 9).await;
    let mut terminal = Terminal::spawn(&["attach", &id, "--runner", &runner.base], (80, 24));
    terminal.wait_for("printed before the attach");
    terminal.type_bytes(b"typed-after-attach\r");
    terminal.wait_until("the echoed line", |output| {
        output.matches("typed-after-attach").count() >= 2
    });
    terminal.type_bytes(b"exit\r");
    assert_eq!(terminal.exit_code(), 9, "{}", terminal.output);
    assert_eq!(
        terminal.output.matches("printed before the attach").count(),
        1,
        "{}",
        terminal.output
    );
    let unknown = Command::new(BIN)
        .args(["attach", "nosuchsession", "--runner", &runner.base])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("not in registry"));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_prints_json_and_completions_are_generated() {
    let runner = Runner::start().await;
    let id = runner.create(json!({ "echo": true })).await;
    let listed = Command::new(BIN)
        .args(["sessions", "-o", "json", "--runner", &runner.base])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let parsed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(parsed["sessions"][0]["sessionId"], json!(id));
    for shell in ["bash", "zsh", "fish"] {
        let script = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(script.status.success(), "{script:?}");
        let text = String::from_utf8_lossy(&script.stdout);
        assert!(
            text.contains("telo-runner") && text.contains("attach"),
            "{shell}: {text}"
        );
    }
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_lists_and_stop_stops() {
    let runner = Runner::start().await;
    let id = runner.create(json!({ "echo": true })).await;

    let listed = Command::new(BIN)
        .args(["sessions", "--runner", &runner.base])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(table.starts_with("SESSION"), "{table}");
    assert!(table.contains(&id), "{table}");

    let stopped = Command::new(BIN)
        .args(["stop", &id, "--runner", &runner.base])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&stopped.stdout);
    assert!(stopped.status.success(), "{stopped:?}");
    assert!(said.contains(&format!("session {id} stopped")), "{said}");
    assert_eq!(session_kind(&runner, &id).await, "stopped");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopping_an_unknown_session_says_so() {
    let runner = Runner::start().await;
    let output = Command::new(BIN)
        .args(["stop", "nosuchsession", "--runner", &runner.base])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not in registry"));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terms_are_shown_and_must_be_accepted_with_y() {
    let runner = Runner::start_with(&[
        ("RUNNER_TERMS_BODY", "Be nice to the runner."),
        ("RUNNER_TERMS_VERSION", "2026-01"),
    ])
    .await;
    let app = app_dir(json!({ "stdout": ["accepted and ran"] }));
    let mut terminal = run_in_terminal(&runner, app.path(), (80, 24));
    terminal.wait_for("Be nice to the runner.");
    terminal.wait_for("[y/N]");
    terminal.type_bytes(b"y\r");
    terminal.wait_for("accepted and ran");
    assert_eq!(terminal.exit_code(), 0, "{}", terminal.output);

    // Without a terminal to ask on, the flag is the only way in.
    let refused = Command::new(BIN)
        .args([
            "run",
            app.path().to_str().unwrap(),
            "--runner",
            &runner.base,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--accept-terms 2026-01"), "{stderr}");
    let accepted = Command::new(BIN)
        .args([
            "run",
            app.path().to_str().unwrap(),
            "--runner",
            &runner.base,
        ])
        .args(["--accept-terms", "2026-01"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(accepted.status.success(), "{accepted:?}");
    assert!(String::from_utf8_lossy(&accepted.stdout).contains("accepted and ran"));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn examples_hello_runs_to_exit_code_0() {
    let runner = Runner::start().await;
    let hello = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello");
    let mut terminal = run_in_terminal(&runner, &hello, (80, 24));
    terminal.wait_for("Hello from Telo!");
    assert_eq!(terminal.exit_code(), 0, "{}", terminal.output);
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_that_requires_a_token_is_driven_with_one() {
    let tokens = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tokens.path(), "s3cret-token\n").unwrap();
    let runner =
        Runner::start_with(&[("RUNNER_AUTH_TOKENS_FILE", tokens.path().to_str().unwrap())]).await;
    let app = app_dir(json!({ "stdout": ["with a token"], "echo": true }));

    let refused = Command::new(BIN)
        .args([
            "run",
            app.path().to_str().unwrap(),
            "--runner",
            &runner.base,
        ])
        .env_remove("TELO_RUNNER_TOKEN")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--token"), "{stderr}");

    let mut terminal = Terminal::spawn(
        &[
            "run",
            app.path().to_str().unwrap(),
            "--runner",
            &runner.base,
            "--token",
            "s3cret-token",
        ],
        (80, 24),
    );
    terminal.wait_for("with a token");
    terminal.type_bytes(b"typed with a token\r");
    terminal.wait_until("the echoed line", |output| {
        output.matches("typed with a token").count() >= 2
    });
    terminal.type_bytes(b"exit\r");
    assert_eq!(terminal.exit_code(), 0, "{}", terminal.output);
    runner.stop().await;
}

/// `logs` of a finished session prints its output, as the application wrote
/// it, and exits 0 whatever the session's own exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_replays_a_finished_sessions_output() {
    let runner = Runner::start().await;
    let id = runner
        .create(json!({ "stdout": ["first line", "second line"], "exitCode": 3 }))
        .await;
    assert_eq!(runner.wait_terminal(&id).await["kind"], "exited");
    let mut logs = Piped::spawn(&["logs", &id, "--runner", &runner.base]);
    assert_eq!(logs.exit_code(), 0, "{}", logs.stderr);
    assert_eq!(logs.stdout, plain(&runner.full_output(&id).await));
    assert!(
        logs.stdout.contains("first line\nsecond line\n"),
        "{:?}",
        logs.stdout
    );
    assert_eq!(logs.stderr, "");
    runner.stop().await;
}

/// A runner that serves only named browser origins still serves the
/// terminal client, which sends no `Origin`: its io socket is not a page's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_work_under_a_narrowed_origin_list() {
    let runner = Runner::start_with(&[("RUNNER_CORS_ORIGINS", "https://editor.example")]).await;
    let id = runner
        .create(json!({ "stdout": ["only the editor's origin"], "exitCode": 0 }))
        .await;
    runner.wait_terminal(&id).await;
    let mut logs = Piped::spawn(&["logs", &id, "--runner", &runner.base]);
    assert_eq!(logs.exit_code(), 0, "{}", logs.stderr);
    assert!(
        logs.stdout.contains("only the editor's origin\n"),
        "stdout {:?}, stderr {:?}",
        logs.stdout,
        logs.stderr
    );
    runner.stop().await;
}

/// Without `--follow`, a running session's output so far; the session is
/// left running and gets no input from the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_of_a_running_session_prints_its_output_so_far_and_leaves_it_running() {
    let runner = Runner::start().await;
    let (id, _socket) = echo_session_that_printed(&runner, "printed so far", 0).await;
    let mut logs = Piped::spawn(&["logs", &id, "--runner", &runner.base]);
    assert_eq!(logs.exit_code(), 0, "{}", logs.stderr);
    assert_eq!(logs.stdout, "printed so far\n");
    assert_eq!(session_kind(&runner, &id).await, "running");
    runner.stop().await;
}

/// `logs -f` prints what came before it started, then each live line once
/// and in order, and leaves with the application's exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_follow_prints_live_output_once_in_order_and_returns_the_exit_code() {
    let runner = Runner::start().await;
    let (id, mut socket) = echo_session_that_printed(&runner, "before the client", 6).await;
    let mut logs = Piped::spawn(&["logs", &id, "-f", "--runner", &runner.base]);
    logs.wait_stdout("before the client\n");
    for line in ["live-one", "live-two", "live-three"] {
        test_support::ws::send_stdin(&mut socket, format!("{line}\n").as_bytes()).await;
        logs.wait_stdout(&format!("{line}\n{line}\n"));
    }
    test_support::ws::send_stdin(&mut socket, b"exit\n").await;
    assert_eq!(logs.exit_code(), 6, "{}", logs.stderr);
    // Exactly the session's output: nothing repeated, nothing missing.
    assert_eq!(logs.stdout, plain(&runner.full_output(&id).await));
    let first = logs.stdout.find("live-one").unwrap();
    let second = logs.stdout.find("live-two").unwrap();
    let third = logs.stdout.find("live-three").unwrap();
    assert!(first < second && second < third, "{:?}", logs.stdout);
    assert_eq!(logs.stderr, "");
    runner.stop().await;
}

/// Ctrl-C ends `logs -f`, not the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ctrl_c_ends_logs_follow_and_leaves_the_session_running() {
    let runner = Runner::start().await;
    let id = runner
        .create(json!({ "stdout": ["still running"], "echo": true }))
        .await;
    until_running(&runner, &id).await;
    let mut logs = Piped::spawn(&["logs", "-f", &id, "--runner", &runner.base]);
    logs.wait_stdout("still running\n");
    let pid = nix::unistd::Pid::from_raw(logs.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    assert_eq!(logs.exit_code(), 130, "{}", logs.stderr);
    assert_eq!(session_kind(&runner, &id).await, "running");
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_of_an_unknown_session_names_it_and_where_to_look() {
    let runner = Runner::start().await;
    for args in [
        &["logs", "nosuchsession"][..],
        &["logs", "-f", "nosuchsession"],
    ] {
        let mut logs = Piped::spawn(&[args, &["--runner", &runner.base]].concat());
        assert_eq!(logs.exit_code(), 1);
        assert_eq!(
            logs.stderr,
            format!(
                "telo-runner: the runner at {} has no session 'nosuchsession'; `telo-runner sessions` lists the ones it has\n",
                runner.base
            )
        );
        assert_eq!(logs.stdout, "");
    }
    runner.stop().await;
}

fn stopped_elsewhere_line(id: &str) -> String {
    format!(
        "telo-runner: session {id} was stopped elsewhere (another client or the runner's operator stopped it)"
    )
}

/// A session stopped by another client's `telo-runner stop` or a DELETE:
/// the attached client says so, and still exits 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_stopped_elsewhere_is_said_so() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["ready"], "echo": true }));
    let mut run = Piped::spawn(&[
        "run",
        app.path().to_str().unwrap(),
        "--runner",
        &runner.base,
    ]);
    run.wait_stdout("ready");
    let id = run
        .stderr
        .lines()
        .find_map(|line| {
            line.strip_prefix("telo-runner: session ")?
                .strip_suffix(" starting")
        })
        .unwrap()
        .to_owned();
    let stopped = Command::new(BIN)
        .args(["stop", &id, "--runner", &runner.base])
        .output()
        .unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    assert_eq!(run.exit_code(), 130, "{}", run.stderr);
    assert!(run.said(&stopped_elsewhere_line(&id)), "{}", run.stderr);

    let id = runner
        .create(json!({ "stdout": ["attached"], "echo": true }))
        .await;
    let mut attach = Piped::spawn(&["attach", &id, "--runner", &runner.base]);
    attach.wait_stdout("attached");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(attach.exit_code(), 130, "{}", attach.stderr);
    assert!(
        attach.said(&stopped_elsewhere_line(&id)),
        "{}",
        attach.stderr
    );
    runner.stop().await;
}

/// The user's own double Ctrl-C is not a stop from elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ctrl_c_twice_is_not_reported_as_a_stop_from_elsewhere() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["ready"], "echo": true }));
    let mut terminal = run_in_terminal(&runner, app.path(), (80, 24));
    let id = terminal.session_id();
    terminal.wait_for("ready");
    terminal.type_bytes(b"\x03\x03");
    assert_eq!(terminal.exit_code(), 130, "{}", terminal.output);
    assert!(
        terminal
            .output
            .contains(&format!("telo-runner: session {id} stopped"))
    );
    assert!(
        !terminal.output.contains("stopped elsewhere"),
        "{}",
        terminal.output
    );
    runner.stop().await;
}

/// A runner restart (a graceful one, whose successor adopts live sessions)
/// closes the terminal socket with 1001: the attached client says the
/// runner went away and how to reattach, as does `logs -f`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_that_goes_away_is_said_so_with_how_to_reattach() {
    let runner = Runner::start_on(Backend::Kubernetes, &[]).await;
    let id = runner
        .create(json!({ "stdout": ["before the restart"], "echo": true }))
        .await;
    let mut attach = Piped::spawn(&["attach", &id, "--runner", &runner.base]);
    let mut logs = Piped::spawn(&["logs", "--follow", &id, "--runner", &runner.base]);
    attach.wait_stdout("before the restart");
    logs.wait_stdout("before the restart");
    runner.stop().await;
    let gone = format!(
        "telo-runner: the runner went away (restarting or shutting down) while session {id} was still running; reattach with `telo-runner attach {id}`"
    );
    assert_eq!(attach.exit_code(), 1, "{}", attach.stderr);
    assert!(attach.said(&gone), "{}", attach.stderr);
    assert_eq!(logs.exit_code(), 1, "{}", logs.stderr);
    assert!(logs.said(&gone), "{}", logs.stderr);
}

/// `run` leaves out what `.gitignore` and `.teloignore` ignore, and says
/// what: an ignored big file does not count against the request limit and
/// an ignored binary file is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_leaves_out_ignored_files_and_says_so() {
    let runner = Runner::start().await;
    let app = app_dir(json!({ "stdout": ["ran without them"] }));
    std::fs::write(app.path().join(".gitignore"), "dist/\nsecrets.env\n").unwrap();
    std::fs::write(app.path().join(".teloignore"), "logo.png\n").unwrap();
    std::fs::create_dir(app.path().join("dist")).unwrap();
    std::fs::write(app.path().join("dist/big.txt"), "a".repeat(1_200_000)).unwrap();
    std::fs::write(app.path().join("secrets.env"), "TOKEN=x\n").unwrap();
    std::fs::write(app.path().join("logo.png"), [0x89, 0x50, 0xff, 0xfe]).unwrap();
    let output = Command::new(BIN)
        .args([
            "run",
            app.path().to_str().unwrap(),
            "--runner",
            &runner.base,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("ran without them"));
    assert!(
        stderr.lines().any(|line| line
            == "telo-runner: left out 3 paths ignored by .gitignore/.teloignore: dist/, logo.png, secrets.env"),
        "{stderr}"
    );
    runner.stop().await;
}

/// `logs -f` in a terminal: the output as the application wrote it, once,
/// then the session's exit code; typing in that terminal goes nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_follow_in_a_terminal_shows_the_output_once_and_returns_the_exit_code() {
    let runner = Runner::start().await;
    let (id, mut io) = echo_session_that_printed(&runner, "written before logs", 4).await;
    let mut terminal = Terminal::spawn(&["logs", "-f", &id, "--runner", &runner.base], (80, 24));
    terminal.wait_for("written before logs");
    // Read-only: what is typed here never reaches the session.
    terminal.type_bytes(b"typed-into-logs\r");
    test_support::ws::send_stdin(&mut io, b"typed-into-the-session\r").await;
    terminal.wait_for("typed-into-the-session");
    test_support::ws::send_stdin(&mut io, b"exit\r").await;
    assert_eq!(terminal.exit_code(), 4, "{}", terminal.output);
    assert_eq!(
        terminal.output.matches("written before logs").count(),
        1,
        "{}",
        terminal.output
    );
    let replay = runner.full_output(&id).await;
    assert!(!replay.contains("typed-into-logs"), "{replay}");
    runner.stop().await;
}
