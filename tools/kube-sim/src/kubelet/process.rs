//! Container processes: spawned in their own process group (or session, in
//! a PTY), wired to the container's streams, and tracked so that deletion,
//! shutdown and `Drop` can kill every one of them.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::streams::{ContainerStreams, StdinMsg, StreamKind};

/// Process groups of every live container process.
#[derive(Default)]
pub struct ProcessRegistry {
    groups: Mutex<HashSet<i32>>,
}

impl ProcessRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<i32>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, pgid: i32) {
        self.lock().insert(pgid);
    }

    fn remove(&self, pgid: i32) {
        self.lock().remove(&pgid);
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// SIGKILLs every process group still alive (shutdown, `Drop`).
    pub fn kill_all(&self) {
        let groups: Vec<i32> = self.lock().drain().collect();
        for g in groups {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
    }
}

#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub tty: bool,
    pub stdin: bool,
    pub stdin_once: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("failed to start {program}: {source}")]
    Start {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to open a pseudo-terminal: {0}")]
    Pty(String),
}

/// A running container process.
pub struct Running {
    pub pgid: i32,
    pub exit: oneshot::Receiver<i32>,
}

/// `128 + signal` for a signal death, as container runtimes report it.
fn exit_code_of(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

pub fn spawn(
    spec: &SpawnSpec,
    streams: Arc<ContainerStreams>,
    registry: Arc<ProcessRegistry>,
) -> Result<Running, SpawnError> {
    if spec.tty {
        spawn_pty(spec, streams, registry)
    } else {
        spawn_piped(spec, streams, registry)
    }
}

fn spawn_piped(
    spec: &SpawnSpec,
    streams: Arc<ContainerStreams>,
    registry: Arc<ProcessRegistry>,
) -> Result<Running, SpawnError> {
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .process_group(0)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(if spec.stdin {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        });
    let mut child = cmd.spawn().map_err(|source| SpawnError::Start {
        program: spec.program.to_string_lossy().into_owned(),
        source,
    })?;
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    registry.add(pgid);
    for (pipe, kind) in [
        (
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            StreamKind::Stdout,
        ),
        (
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            StreamKind::Stderr,
        ),
    ] {
        if let Some(mut pipe) = pipe {
            let streams = streams.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match pipe.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => streams.push(kind, Bytes::copy_from_slice(&buf[..n])),
                    }
                }
            });
        }
    }
    if let Some(mut stdin) = child.stdin.take() {
        let (tx, mut rx) = mpsc::channel::<StdinMsg>(STDIN_QUEUE);
        streams.set_stdin(tx);
        let stdin_once = spec.stdin_once;
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                match msg {
                    StdinMsg::Data(d) => {
                        if stdin.write_all(&d).await.is_err() {
                            break;
                        }
                        let _ = stdin.flush().await;
                    }
                    StdinMsg::Close if stdin_once => break,
                    StdinMsg::Close => {}
                }
            }
        });
    }
    let (exit_tx, exit_rx) = oneshot::channel();
    tokio::spawn(async move {
        let code = match child.wait().await {
            Ok(status) => exit_code_of(&status),
            Err(_) => 255,
        };
        registry.remove(pgid);
        let _ = exit_tx.send(code);
    });
    Ok(Running {
        pgid,
        exit: exit_rx,
    })
}

/// Input frames queued for a container before its writer is held back.
const STDIN_QUEUE: usize = 8;

fn signal_number(name: &str) -> i32 {
    match name {
        "Hangup" => 1,
        "Interrupt" => 2,
        "Quit" => 3,
        "Aborted" => 6,
        "Killed" => 9,
        "Segmentation fault" => 11,
        "Broken pipe" => 13,
        "Terminated" => 15,
        _ => 1,
    }
}

fn spawn_pty(
    spec: &SpawnSpec,
    streams: Arc<ContainerStreams>,
    registry: Arc<ProcessRegistry>,
) -> Result<Running, SpawnError> {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let pty = native_pty_system()
        .openpty(PtySize {
            rows: 24,
            cols: 80,
            pixel_width: 0,
            pixel_height: 0,
        })
        .map_err(|e| SpawnError::Pty(e.to_string()))?;
    let mut cmd = CommandBuilder::new(&spec.program);
    cmd.args(&spec.args);
    cmd.env_clear();
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    cmd.cwd(&spec.cwd);
    let mut child = pty
        .slave
        .spawn_command(cmd)
        .map_err(|e| SpawnError::Start {
            program: spec.program.to_string_lossy().into_owned(),
            source: std::io::Error::other(e.to_string()),
        })?;
    drop(pty.slave);
    let pgid = child.process_id().map(|p| p as i32).unwrap_or(0);
    registry.add(pgid);
    let master = pty.master;
    let mut reader = master
        .try_clone_reader()
        .map_err(|e| SpawnError::Pty(e.to_string()))?;
    let mut writer = master
        .take_writer()
        .map_err(|e| SpawnError::Pty(e.to_string()))?;
    {
        let streams = streams.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => streams.push(StreamKind::Stdout, Bytes::copy_from_slice(&buf[..n])),
                }
            }
        });
    }
    if spec.stdin {
        let (tx, mut rx) = mpsc::channel::<StdinMsg>(STDIN_QUEUE);
        streams.set_stdin(tx);
        let stdin_once = spec.stdin_once;
        std::thread::spawn(move || {
            while let Some(msg) = rx.blocking_recv() {
                match msg {
                    StdinMsg::Data(d) => {
                        if writer.write_all(&d).and_then(|_| writer.flush()).is_err() {
                            break;
                        }
                    }
                    StdinMsg::Close if stdin_once => break,
                    StdinMsg::Close => {}
                }
            }
        });
    }
    let (resize_tx, mut resize_rx) = mpsc::unbounded_channel::<(u16, u16)>();
    streams.set_resize(resize_tx);
    std::thread::spawn(move || {
        // Owns the master: the PTY stays open until the container exits
        // (the resize sender is dropped by `ContainerStreams::close`).
        while let Some((cols, rows)) = resize_rx.blocking_recv() {
            let _ = master.resize(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            });
        }
    });
    let (exit_tx, exit_rx) = oneshot::channel();
    std::thread::spawn(move || {
        let code = match child.wait() {
            Ok(status) => match status.signal() {
                Some(sig) => 128 + signal_number(sig),
                None => status.exit_code() as i32,
            },
            Err(_) => 255,
        };
        registry.remove(pgid);
        let _ = exit_tx.send(code);
    });
    Ok(Running {
        pgid,
        exit: exit_rx,
    })
}

/// Sends `signal` to a container's process group.
pub fn signal(pgid: i32, signal: Signal) {
    if pgid > 0 {
        let _ = killpg(Pid::from_raw(pgid), signal);
    }
}

/// The grace period before SIGKILL when a container is stopped.
pub fn grace(seconds: i64) -> Duration {
    Duration::from_secs(seconds.max(0) as u64)
}
