//! Drives the real `fake-telo` binary as a black box: spawns it on a manifest
//! in a temporary directory and waits on its output, never on the clock.
#![allow(dead_code)] // each test file uses a different part of this harness

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Generous: a loaded CI machine may be slow, and a passing test never waits this long.
pub const OUTPUT_TIMEOUT: Duration = Duration::from_secs(20);
pub const ENTRY_FILE: &str = "app.yaml";

/// A running `fake-telo`, killed and reaped when dropped so no test leaves a
/// process behind, whatever assertion fails first.
pub struct FakeTelo {
    child: Child,
    pub stdin: Option<ChildStdin>,
    stdout_chunks: Receiver<Vec<u8>>,
    stdout_buffer: Vec<u8>,
    stdout_closed: bool,
    stderr: Option<Receiver<Vec<u8>>>,
    dir: TempDir,
}

pub struct Launch<'a> {
    manifest: &'a str,
    args: Vec<String>,
    env: Vec<(String, Option<String>)>,
    ignore_stop_signals: bool,
}

/// `fake-telo run app.yaml` with `manifest` as the entry and `HOST` cleared, so
/// the test machine's environment cannot change what is bound.
pub fn launch(manifest: &str) -> Launch<'_> {
    Launch {
        manifest,
        args: vec!["run".to_owned(), ENTRY_FILE.to_owned()],
        env: vec![("HOST".to_owned(), None)],
        ignore_stop_signals: false,
    }
}

impl Launch<'_> {
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|&arg| arg.to_owned()).collect();
        self
    }

    pub fn env(mut self, name: &str, value: Option<&str>) -> Self {
        self.env.push((name.to_owned(), value.map(str::to_owned)));
        self
    }

    /// Launched the way `nohup … &` does: SIGINT and SIGTERM ignored.
    pub fn with_stop_signals_ignored(mut self) -> Self {
        self.ignore_stop_signals = true;
        self
    }

    pub fn spawn(self) -> FakeTelo {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join(ENTRY_FILE), self.manifest).expect("write the entry");
        spawn_in(dir, &self.args, &self.env, self.ignore_stop_signals)
    }
}

fn spawn_in(
    dir: TempDir,
    args: &[String],
    env: &[(String, Option<String>)],
    ignore_stop_signals: bool,
) -> FakeTelo {
    let fake_telo = env!("CARGO_BIN_EXE_fake-telo");
    let mut command = if ignore_stop_signals {
        // The shell ignores both, then becomes fake-telo, which inherits that.
        let mut shell = Command::new("/bin/sh");
        shell.args(["-c", "trap '' INT TERM; exec \"$0\" \"$@\"", fake_telo]);
        shell
    } else {
        Command::new(fake_telo)
    };
    command
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    let mut child = command.spawn().expect("spawn fake-telo");
    let stdout_chunks = pipe_reader(child.stdout.take().expect("stdout"));
    let stderr = pipe_to_end(child.stderr.take().expect("stderr"));
    FakeTelo {
        stdin: child.stdin.take(),
        child,
        stdout_chunks,
        stdout_buffer: Vec::new(),
        stdout_closed: false,
        stderr: Some(stderr),
        dir,
    }
}

fn pipe_reader(mut pipe: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (chunks, received) = mpsc::channel();
    thread::spawn(move || {
        let mut buffer = vec![0_u8; 64 * 1024];
        while let Ok(read @ 1..) = pipe.read(&mut buffer) {
            if chunks.send(buffer[..read].to_vec()).is_err() {
                return;
            }
        }
    });
    received
}

fn pipe_to_end(mut pipe: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (all, received) = mpsc::channel();
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = all.send(bytes);
    });
    received
}

impl FakeTelo {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn child(&self) -> &Child {
        &self.child
    }

    /// The directory holding the entry; also the process's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits for more stdout; false once stdout is closed. Panics on timeout.
    fn receive_stdout(&mut self, deadline: Instant) -> bool {
        if self.stdout_closed {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.stdout_chunks.recv_timeout(left) {
            Ok(chunk) => {
                self.stdout_buffer.extend_from_slice(&chunk);
                true
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.stdout_closed = true;
                false
            }
            Err(RecvTimeoutError::Timeout) => panic!(
                "timed out waiting for fake-telo output; so far: {:?}",
                String::from_utf8_lossy(&self.stdout_buffer)
            ),
        }
    }

    /// The next complete stdout line (without its `\n`). Panics on timeout or EOF.
    pub fn next_line(&mut self) -> String {
        let deadline = Instant::now() + OUTPUT_TIMEOUT;
        loop {
            if let Some(end) = self.stdout_buffer.iter().position(|&byte| byte == b'\n') {
                let line: Vec<u8> = self.stdout_buffer.drain(..=end).collect();
                return String::from_utf8_lossy(&line[..end]).into_owned();
            }
            if !self.receive_stdout(deadline) {
                let stderr = self.stderr_text();
                panic!(
                    "stdout closed before a full line; rest: {:?}; stderr: {stderr}",
                    String::from_utf8_lossy(&self.stdout_buffer),
                );
            }
        }
    }

    /// Skips lines until one starts with `prefix` and returns the rest of it.
    pub fn line_after(&mut self, prefix: &str) -> String {
        loop {
            let line = self.next_line();
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }

    /// Reads stdout to its end (the process closed it, i.e. exited) and
    /// returns everything not consumed yet.
    pub fn rest_of_stdout(&mut self) -> Vec<u8> {
        let deadline = Instant::now() + OUTPUT_TIMEOUT;
        while self.receive_stdout(deadline) {}
        std::mem::take(&mut self.stdout_buffer)
    }

    /// Everything written to stderr; blocks until stderr closes.
    pub fn stderr_text(&mut self) -> String {
        let Some(stderr) = self.stderr.take() else {
            return String::new();
        };
        let bytes = stderr.recv_timeout(OUTPUT_TIMEOUT).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Waits for the process to exit on its own and returns its status with
    /// the unread stdout. Closing stdout is the exit signal: fake-telo spawns
    /// no children that could hold it open.
    pub fn wait_for_exit(&mut self) -> (ExitStatus, String) {
        let rest = self.rest_of_stdout();
        let status = self.child.wait().expect("reap fake-telo");
        (status, String::from_utf8_lossy(&rest).into_owned())
    }

    pub fn write_stdin(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(text.as_bytes()).expect("write stdin");
        stdin.flush().expect("flush stdin");
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }
}

impl Drop for FakeTelo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `fake-telo` with `args` in a fresh directory and waits for it to exit:
/// for invocations that never start a workload.
pub fn run_to_exit(args: &[&str]) -> (ExitStatus, String, String) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let args: Vec<String> = args.iter().map(|&arg| arg.to_owned()).collect();
    let mut fake = spawn_in(dir, &args, &[], false);
    let (status, stdout) = fake.wait_for_exit();
    (status, stdout, fake.stderr_text())
}

/// One HTTP/1.1 request over a fresh connection; returns (status line, body).
pub fn http_get(address: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(OUTPUT_TIMEOUT))
        .expect("read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {response:?}"));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

/// Opens `GET /events` and returns the reader positioned after the headers.
pub fn open_events(address: &str) -> (String, BufReader<TcpStream>) {
    let mut stream = TcpStream::connect(address).expect("connect to inspect");
    stream
        .set_read_timeout(Some(OUTPUT_TIMEOUT))
        .expect("read timeout");
    write!(
        stream,
        "GET /events HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .expect("send request");
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("read response head");
        if line == "\r\n" || line.is_empty() {
            return (head, reader);
        }
        head.push_str(&line);
    }
}

/// Reads one SSE frame (up to the blank line) and decodes its JSON data;
/// keep-alive comments are skipped.
pub fn next_frame(reader: &mut BufReader<TcpStream>) -> serde_json::Value {
    let mut data = String::new();
    loop {
        let mut line = String::new();
        assert_ne!(
            reader.read_line(&mut line).expect("read frame"),
            0,
            "stream ended"
        );
        if line.starts_with(':') {
            continue;
        }
        if line == "\n" {
            if data.is_empty() {
                continue;
            }
            return serde_json::from_str(&data).expect("frame data is JSON");
        }
        let payload = line.strip_prefix("data: ").expect("a data line");
        data.push_str(payload.trim_end_matches('\n'));
    }
}
