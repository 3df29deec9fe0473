//! Starting a session process in a fresh pseudo-terminal, and the blocking
//! threads that move bytes between that terminal and the session.
//!
//! PTY file descriptors only offer blocking reads and writes here, so each
//! direction gets a dedicated thread rather than a slot in the async runtime's
//! blocking pool, which a few long sessions could otherwise exhaust.

use std::io::{Read, Write};
use std::sync::mpsc::{Receiver, SyncSender};

use bytes::Bytes;
use nix::unistd::Pid;
use portable_pty::{Child, CommandBuilder, MasterPty, PtySize, native_pty_system};
use tracing::debug;

use crate::process::args_file::ArgsFile;
use crate::process::plan::SpawnPlan;

/// The terminal size a session starts with, until a client resizes it.
pub const INITIAL_SIZE: PtySize = PtySize {
    rows: 24,
    cols: 80,
    pixel_width: 0,
    pixel_height: 0,
};

/// Largest chunk read from the terminal in one go.
pub const OUTPUT_CHUNK_BYTES: usize = 64 * 1024;

/// The PTY library reports errors as `anyhow` values, which are not
/// `std::error::Error`; their text is kept instead.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("could not open a terminal: {0}")]
    Open(String),
    #[error("{0}")]
    Spawn(String),
    #[error("the started process has no id")]
    NoPid,
    #[error("could not connect to the terminal: {0}")]
    Connect(String),
}

/// A running session process and its terminal.
pub struct PtyProcess {
    pub pid: Pid,
    pub child: Box<dyn Child + Send + Sync>,
    /// Kept for resizing; its descriptor closes when it is dropped.
    pub master: Box<dyn MasterPty + Send>,
    pub output: Box<dyn Read + Send>,
    pub input: Box<dyn Write + Send>,
    /// Kept open for the session's life (see [`SpawnPlan::args_file`]).
    pub args_file: Option<ArgsFile>,
}

/// Starts `plan` as the leader of a new session on a new PTY — its
/// controlling terminal unless the plan's sandbox hands it on. Must run on
/// the spawner thread (see `spawner`).
pub fn spawn_in_pty(plan: SpawnPlan) -> Result<PtyProcess, PtyError> {
    let pair = native_pty_system()
        .openpty(INITIAL_SIZE)
        .map_err(|err| PtyError::Open(format!("{err:#}")))?;
    let mut command = CommandBuilder::from_argv(plan.argv.clone());
    command.env_clear();
    for (name, value) in &plan.env {
        command.env(name, value);
    }
    command.cwd(&plan.cwd);
    command.set_controlling_tty(plan.controlling_tty);
    let child = pair
        .slave
        .spawn_command(command)
        .map_err(|err| PtyError::Spawn(format!("{err:#}")))?;
    // Our copy of the slave must go, or reading the master would never see
    // end-of-file after the session's processes are gone.
    drop(pair.slave);
    let master = pair.master;
    let pid = child.process_id().and_then(|pid| i32::try_from(pid).ok());
    let connect = || -> Result<_, PtyError> {
        let output = master
            .try_clone_reader()
            .map_err(|err| PtyError::Connect(format!("{err:#}")))?;
        let input = master
            .take_writer()
            .map_err(|err| PtyError::Connect(format!("{err:#}")))?;
        Ok((output, input))
    };
    let connected = pid
        .ok_or(PtyError::NoPid)
        .and_then(|pid| Ok((pid, connect()?)));
    match connected {
        Ok((pid, (output, input))) => Ok(PtyProcess {
            pid: Pid::from_raw(pid),
            child,
            master,
            output,
            input,
            args_file: plan.args_file,
        }),
        Err(err) => {
            abandon(child);
            Err(err)
        }
    }
}

/// Kills and reaps a process we cannot use.
fn abandon(mut child: Box<dyn Child + Send + Sync>) {
    if let Some(pid) = child.process_id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = nix::sys::signal::killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.wait();
}

/// Copies output (of a terminal, or a pipe) into `emit` until end-of-file,
/// which arrives once every process holding it open is gone.
pub fn pump_output_to(
    mut output: Box<dyn Read + Send>,
    session_id: &str,
    mut emit: impl FnMut(Bytes),
) {
    let mut buf = vec![0u8; OUTPUT_CHUNK_BYTES];
    loop {
        match output.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => emit(Bytes::copy_from_slice(&buf[..n])),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                debug!(session_id, error = %err, "terminal output ended with an error");
                break;
            }
        }
    }
}

/// Writes queued stdin chunks to the terminal until the queue is closed (the
/// session ended) or the terminal refuses a write.
pub fn pump_input(mut input: Box<dyn Write + Send>, queue: Receiver<Bytes>) {
    for chunk in queue {
        if let Err(err) = input.write_all(&chunk).and_then(|()| input.flush()) {
            debug!(error = %err, "terminal input closed");
            break;
        }
    }
}

/// The sending half of a session's stdin queue.
pub type InputQueue = SyncSender<Bytes>;
