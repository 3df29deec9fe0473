//! A spawned process wired to its session: the thread that reaps it, the
//! threads that copy its output out and its input in, and the
//! [`LocalSession`] that stops it. Run sessions, watch apps and agents all
//! start their processes through here.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use runner_api::watch::StreamTag;
use runner_core::{StartError, StartStage};
use tokio::sync::oneshot;

use crate::process::group::{Members, ProcessGroup};
use crate::process::pipes::Started;
use crate::process::pty::{pump_input, pump_output_to};
use crate::session::LocalSession;

/// Stdin chunks queued for a session before further input is dropped.
pub const STDIN_QUEUE_CHUNKS: usize = 256;

/// A started process with its waiter and terminal threads running.
pub(crate) struct WiredProcess {
    pub session: Arc<LocalSession>,
    /// The exit code, once the process ended and was reaped.
    pub exited: oneshot::Receiver<i64>,
    /// Fires once all of its output was delivered.
    pub output_drained: oneshot::Receiver<()>,
}

/// Fires its channel when the last output thread holding it is done.
struct DrainNotice(Option<oneshot::Sender<()>>);

impl Drop for DrainNotice {
    fn drop(&mut self) {
        if let Some(drained) = self.0.take() {
            let _ = drained.send(());
        }
    }
}

/// Starts the waiter, output and input threads of a freshly spawned process;
/// its output goes to `emit`, each chunk with the stream it came from. On
/// failure the process group is killed.
pub(crate) fn wire_process(
    id: &str,
    process: Started,
    members: Members,
    emit: impl Fn(StreamTag, Bytes) + Send + Sync + 'static,
    stop_grace: Duration,
) -> Result<WiredProcess, StartError> {
    let Started {
        pid,
        child,
        terminal,
        outputs,
        input,
        args_file,
    } = process;
    let group = Arc::new(ProcessGroup::new(pid, members));
    let thread_error = |err: std::io::Error| {
        StartError::new(
            StartStage::Start,
            format!("could not start a session thread: {err}"),
        )
        .with_source(err)
    };

    let (exited_tx, exited) = oneshot::channel();
    let waiter = group.clone();
    std::thread::Builder::new()
        .name(format!("wait-{id}"))
        .spawn(move || {
            let _ = exited_tx.send(waiter.wait(child));
        })
        .map_err(|err| {
            // Without a waiter nobody would reap it: kill it, and let the
            // dropped child handle leave a zombie only until the runner exits.
            let _ = group.kill();
            thread_error(err)
        })?;

    let (drained_tx, output_drained) = oneshot::channel();
    let drained = Arc::new(DrainNotice(Some(drained_tx)));
    let emit = Arc::new(emit);
    let (input_queue, input_rx) = std::sync::mpsc::sync_channel(STDIN_QUEUE_CHUNKS);
    let mut threads = Ok(());
    for (tag, output) in outputs {
        let session_id = id.to_owned();
        let emit = emit.clone();
        let drained = drained.clone();
        threads = threads.and_then(|()| {
            std::thread::Builder::new()
                .name(format!("out-{id}"))
                .spawn(move || {
                    pump_output_to(output, &session_id, |bytes| emit(tag, bytes));
                    drop(drained);
                })
                .map(drop)
        });
    }
    drop(drained);
    let threads = threads.and_then(|()| {
        std::thread::Builder::new()
            .name(format!("in-{id}"))
            .spawn(move || pump_input(input, input_rx))
            .map(drop)
    });
    if let Err(err) = threads {
        let _ = group.kill();
        return Err(thread_error(err));
    }

    let session = Arc::new(LocalSession::new(
        id.to_owned(),
        group,
        stop_grace,
        terminal,
        input_queue,
        args_file,
    ));
    Ok(WiredProcess {
        session,
        exited,
        output_drained,
    })
}

/// A loopback port that was free a moment ago, for the CLI's `--inspect`.
pub(crate) fn free_loopback_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}
