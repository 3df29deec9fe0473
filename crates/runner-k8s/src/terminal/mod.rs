//! The session's terminal over the pod `attach` subresource: output into the
//! session, stdin and resizes out of it.
//!
//! Attaching shows only what the container writes once the runtime has
//! hooked the stream up — which, on a real cluster, is some time after the
//! upgrade was answered — and a container starts writing the moment it
//! runs. So the container log, which holds everything written so far, is
//! read as soon as the attach is open (in the background: the session is
//! announced `running` as soon as the attach is in place), and the live
//! stream is joined to it where it fits: `splice` explains how, and why
//! that places every byte exactly once. Nothing written before the attach
//! is lost, and nothing written around it shows twice.
//!
//! An attach that fails is retried, and one whose stream drops while the
//! container still runs (an apiserver restart, a proxy timeout) is attached
//! again, the output written meanwhile taken from the log: the terminal lives
//! as long as the container. A container that ended before it could be
//! attached to still has its output read from the log.
//!
//! A container without a TTY (an app with `io: "streams"`) is attached with
//! stdout and stderr apart, and its live output keeps the stream it came
//! on. Its log interleaves both with no mark of which is which (the log API
//! does not say), so what only the log holds — output from before the live
//! stream was placed in it, from a re-attach's gap, or from before a
//! runner restart — is relayed as stdout.

pub(crate) mod attach;
pub(crate) mod splice;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::AsyncReadExt as _;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{LogParams, TerminalSize};
use runner_core::SessionSink;
use runner_core::backend_session::InputDrops;
use runner_core::watch_types::{IoMode, StreamTag};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::cluster::api_error::api_reason;
use crate::pod::spec::SESSION_CONTAINER;
use attach::{Incoming, Socket};
use splice::{Delivered, MAX_WINDOW_BYTES, Splice};

/// Stdin chunks queued for a workload that is not reading; beyond this, input
/// is dropped rather than letting a client grow the runner's memory.
/// Live output chunks queued for the splice at most (each at most one
/// attach frame).
const LIVE_QUEUE_CHUNKS: usize = 256;
const STDIN_QUEUE: usize = 256;
/// How much of the log is read at most to rebuild the history. The replay
/// buffer keeps far less; this only bounds a pathological log.
const MAX_HISTORY_BYTES: usize = 64 * 1024 * 1024;
/// The buffer a log is read into, a read at a time.
const LOG_READ_BYTES: usize = 64 * 1024;
/// Attempts at an attach before the terminal is given up on (the output is
/// still read from the log); a blip of the apiserver costs a retry, not the
/// session's terminal.
const ATTACH_ATTEMPTS: u32 = 4;
/// The wait before the n-th retry is n times this.
const ATTACH_RETRY_DELAY: Duration = Duration::from_millis(100);
/// When the log is read once more after an attach opened that has shown
/// nothing: output written before the runtime hooked the stream up, and
/// none after, is in no attach — only in the log. A runtime takes hold of
/// the stream well within this (kube-sim: 5 ms; a cluster: a round trip to
/// the kubelet), so an attach that stayed silent after this read needs no
/// other.
const SETTLE_READ_AFTER: Duration = Duration::from_millis(500);
/// While a session has shown no output at all, the log is also read at
/// these offsets after the attach opened (before the settling read), so a
/// first line written while the runtime was hooking the stream up is shown
/// within milliseconds instead of at the settling read: the session's
/// `running` waits for its first output. Each is one small log read, made
/// only by a start whose workload printed nothing yet.
pub const EARLY_READS_AFTER: [Duration; 4] = [
    Duration::from_millis(5),
    Duration::from_millis(15),
    Duration::from_millis(50),
    Duration::from_millis(150),
];
/// The wait before searching the log again for where the attach begins,
/// doubling with each search (output that repeats itself).
const PLACEMENT_RETRY: Duration = Duration::from_millis(20);
/// How long live output that may sit in a line the log holds back (a prompt
/// on a real cluster's CRI log) waits before it is shown anyway.
const PLACEMENT_PATIENCE: Duration = Duration::from_millis(300);

/// Where one container's output goes: the session's (first) app, or one
/// app of a watch session, with the container it comes from.
#[derive(Clone)]
pub struct Output {
    sink: SessionSink,
    app: Option<String>,
    container: String,
    /// Whether the container has a TTY (`tty`) or stdout and stderr apart.
    io: IoMode,
}

impl Output {
    /// A run or app session's `session` container.
    pub fn session(sink: SessionSink) -> Self {
        Self {
            sink,
            app: None,
            container: SESSION_CONTAINER.to_owned(),
            io: IoMode::Tty,
        }
    }

    /// App `app` of a watch session, from container `container`, which
    /// runs with `io`.
    pub fn app(sink: SessionSink, app: &str, container: String, io: IoMode) -> Self {
        Self {
            sink,
            app: Some(app.to_owned()),
            container,
            io,
        }
    }

    fn tty(&self) -> bool {
        self.io == IoMode::Tty
    }

    /// What output from `stream` (of the attach, or the log's
    /// [`StreamTag::Stdout`]) is tagged in the session: all of it `tty` on
    /// a TTY.
    fn tag(&self, stream: StreamTag) -> StreamTag {
        session_tag(self.io, stream)
    }

    fn output(&self, stream: StreamTag, bytes: Bytes) {
        match &self.app {
            None => self.sink.output(bytes),
            Some(app) => self.sink.app_output(app, self.tag(stream), bytes),
        }
    }

    /// A note of the runner's own: on the terminal, or stderr.
    fn note(&self, text: String) {
        self.sink.note(
            self.app.as_deref(),
            self.tag(StreamTag::Stderr),
            Bytes::from(text),
        );
    }

    fn output_lost(&self) {
        self.sink.app_output_lost(self.app.as_deref());
    }
}

/// The live half of a session's terminal.
pub struct Terminal {
    stdin: mpsc::Sender<Bytes>,
    /// The pod, as logs name it.
    pod: String,
    input_drops: InputDrops,
    /// Whether the first attach opened (else only the log is read).
    attached: bool,
    /// A container without a TTY has no size to set.
    tty: bool,
    resize: Arc<Mutex<Resize>>,
    /// Resolves when the container's output stream ended.
    pub output_done: Mutex<Option<oneshot::Receiver<()>>>,
    tasks: Vec<JoinHandle<()>>,
}

/// The resize channel of the current attach, and the last size asked for
/// (sent again to a new attach).
#[derive(Default)]
struct Resize {
    tx: Option<futures_channel::mpsc::Sender<TerminalSize>>,
    last: Option<(u16, u16)>,
}

impl Terminal {
    /// Whether the first attach opened.
    pub fn is_attached(&self) -> bool {
        self.attached
    }

    pub fn write_stdin(&self, bytes: Bytes) {
        match self.stdin.try_send(bytes) {
            Ok(()) => self.input_drops.delivered(&self.pod),
            Err(mpsc::error::TrySendError::Full(dropped)) => {
                self.input_drops.dropped(&self.pod, dropped.len());
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    pub fn resize(&self, cols: u16, rows: u16) {
        if !self.tty {
            return;
        }
        let mut resize = self.resize.lock().unwrap_or_else(|p| p.into_inner());
        resize.last = Some((cols, rows));
        if let Some(tx) = resize.tx.as_mut() {
            let _ = tx.try_send(TerminalSize {
                width: cols,
                height: rows,
            });
        }
    }

    /// Wait until every byte the container wrote reached the session.
    pub async fn wait_output_done(&self) {
        let done = self
            .output_done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(done) = done {
            let _ = done.await;
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Aborts the tasks of one attach when it is over (or its relay is dropped).
#[derive(Default)]
struct AbortOnDrop(Vec<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Attach to the session container and stream its output — history first —
/// into `sink`. Returns once the first attach is in place (or given up on), so
/// input sent from then on reaches the workload. A failure to attach is
/// reported in the output, not fatal: the status still flows, and so does the
/// output, from the log.
pub async fn attach(pods: &Api<Pod>, pod_name: &str, sink: &SessionSink) -> Terminal {
    attach_output(pods, pod_name, Output::session(sink.clone())).await
}

/// Like [`attach`], for any container and output channel: a watch pod's
/// `app-<name>` container into that app's channel.
pub async fn attach_output(pods: &Api<Pod>, pod_name: &str, output: Output) -> Terminal {
    let sink = &output;
    let first = attach_with_retries(pods, pod_name, sink).await;
    let attached = first.is_some();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(STDIN_QUEUE);
    let resize = Arc::new(Mutex::new(Resize::default()));
    let (done_tx, done_rx) = oneshot::channel();
    let relay = tokio::spawn(relay_terminal(
        pods.clone(),
        pod_name.to_owned(),
        output.clone(),
        first,
        stdin_rx,
        resize.clone(),
        done_tx,
    ));
    Terminal {
        stdin: stdin_tx,
        pod: pod_name.to_owned(),
        input_drops: InputDrops::default(),
        attached,
        tty: output.tty(),
        resize,
        output_done: Mutex::new(Some(done_rx)),
        tasks: vec![relay],
    }
}

/// An attach, retried while the container may still be running.
async fn attach_with_retries(pods: &Api<Pod>, pod_name: &str, sink: &Output) -> Option<Socket> {
    let mut attempt = 1;
    loop {
        match attach::attach(pods, pod_name, &sink.container, sink.tty()).await {
            Ok(attached) => return Some(attached),
            // An ended container cannot be attached to; its log has it all.
            Err(err) if !container_may_run(pods, pod_name, &sink.container).await => {
                debug!(pod = pod_name, error = %err, "not attached: the container has ended");
                return None;
            }
            Err(err) if attempt >= ATTACH_ATTEMPTS => {
                warn!(pod = pod_name, error = %err, "attach failed");
                let what = if sink.tty() { "attach PTY" } else { "attach" };
                sink.note(format!(
                    "\r\n[runner] failed to {what}: {}\r\n",
                    api_reason(&err)
                ));
                return None;
            }
            Err(err) => {
                debug!(pod = pod_name, error = %err, attempt, "attach failed; retrying");
                tokio::time::sleep(ATTACH_RETRY_DELAY * attempt).await;
                attempt += 1;
            }
        }
    }
}

/// Whether the session container may still be running: `false` only when the
/// apiserver says it is not (a pod that cannot be read may still run).
/// Boxed, like [`read_log`].
fn container_may_run<'a>(
    pods: &'a Api<Pod>,
    pod_name: &'a str,
    container: &'a str,
) -> BoxFuture<'a, bool> {
    container_may_run_inline(pods, pod_name, container).boxed()
}

async fn container_may_run_inline(pods: &Api<Pod>, pod_name: &str, container: &str) -> bool {
    let pod = match pods.get(pod_name).await {
        Ok(pod) => pod,
        Err(err) if crate::cluster::api_error::is_not_found(&err) => return false,
        Err(_) => return true,
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    pod.status
        .and_then(|status| status.container_statuses)
        .into_iter()
        .flatten()
        .find(|c| c.name == container)
        .and_then(|c| c.state)
        .is_some_and(|state| state.running.is_some())
}

/// Relays attach after attach until the container ended, then signals `done`.
async fn relay_terminal(
    pods: Api<Pod>,
    pod_name: String,
    sink: Output,
    mut attached: Option<Socket>,
    stdin: mpsc::Receiver<Bytes>,
    resize: Arc<Mutex<Resize>>,
    done: oneshot::Sender<()>,
) {
    let stdin = Arc::new(tokio::sync::Mutex::new(stdin));
    let mut delivered = Delivered::default();
    loop {
        let Some(process) = attached.take() else {
            // Not attached (any more): the log holds what there is to show.
            if let Some(log) = read_log_or_gap(&pods, &pod_name, &sink).await {
                let rest = delivered
                    .position_in(&log)
                    .filter(|&at| at < log.len())
                    .map(|at| Bytes::copy_from_slice(&log[at..]));
                relay(rest.map(from_log), &mut delivered, &sink);
            }
            break;
        };
        let container_ended = relay_one_attach(
            &pods,
            &pod_name,
            process,
            &sink,
            &mut delivered,
            &stdin,
            &resize,
        )
        .await;
        if container_ended {
            break;
        }
        debug!(pod = %pod_name, "attach stream dropped while the container may run; attaching again");
        tokio::time::sleep(ATTACH_RETRY_DELAY).await;
        attached = attach_with_retries(&pods, &pod_name, &sink).await;
    }
    let _ = done.send(());
}

/// Relays one attach: the log up to it (what was not relayed yet), then its
/// live output, while stdin and resizes go to it. Returns whether the
/// container ended (the attach reported its final status), as opposed to the
/// stream dropping under it.
async fn relay_one_attach(
    pods: &Api<Pod>,
    pod_name: &str,
    attached: Socket,
    sink: &Output,
    delivered: &mut Delivered,
    stdin: &Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>,
    resize: &Arc<Mutex<Resize>>,
) -> bool {
    let opened = Instant::now();
    let mut tasks = AbortOnDrop::default();
    // Live output is held until its place in the log is known. The queue is
    // bounded: while the first log read runs, a workload writing faster than
    // it is relayed is held back by the attach stream's flow control instead
    // of growing the runner's memory.
    let (live_tx, mut live) = mpsc::channel::<(StreamTag, Bytes)>(LIVE_QUEUE_CHUNKS);
    let (mut tx, mut rx) = attached.split();
    let (resize_tx, mut resize_rx) = futures_channel::mpsc::channel::<TerminalSize>(8);
    {
        let mut resize = resize.lock().unwrap_or_else(|p| p.into_inner());
        resize.tx = Some(resize_tx);
        let last = resize.last;
        if let (Some(tx), Some((width, height))) = (resize.tx.as_mut(), last) {
            let _ = tx.try_send(TerminalSize { width, height });
        }
    }
    // Output and input move in tasks of their own: a workload that does not
    // read its stdin holds back the input side only, never the output (a
    // single loop would stop reading output while a stdin frame waits, and
    // a stream the workload echoes into would stall both ways). The output
    // task tells whether the container ended (its final status arrived) or
    // the stream dropped under it.
    let stdin = stdin.clone();
    tasks.0.push(tokio::spawn(async move {
        let mut stdin = stdin.lock().await;
        let mut stdin_open = true;
        let mut resize_open = true;
        while stdin_open || resize_open {
            let frame = tokio::select! {
                bytes = stdin.recv(), if stdin_open => match bytes {
                    Some(bytes) => attach::stdin_frame(&bytes),
                    None => {
                        stdin_open = false;
                        continue;
                    }
                },
                size = resize_rx.next(), if resize_open => match size {
                    Some(size) => attach::resize_frame(size.width, size.height),
                    None => {
                        resize_open = false;
                        continue;
                    }
                },
            };
            if tx.send(frame).await.is_err() {
                break;
            }
        }
    }));
    let (ended_tx, ended_rx) = oneshot::channel();
    tasks.0.push(tokio::spawn(async move {
        let ended = loop {
            match attach::incoming(rx.next().await) {
                Incoming::Output(stream, bytes) => {
                    if live_tx.send((stream, bytes)).await.is_err() {
                        break false;
                    }
                }
                Incoming::Ended => break true,
                Incoming::Other => {}
                Incoming::Closed => break false,
            }
        };
        debug!(ended, "attach stream ended");
        drop(live_tx);
        let _ = ended_tx.send(ended);
    }));

    let mut splice = Splice::default();
    // The streams of the live bytes the splice holds until it is placed.
    let mut window = WindowStreams::default();
    // What the container wrote up to about now; the first read also tells
    // where the output relayed before this attach ends in the log.
    if let Some(log) = read_log_or_gap(pods, pod_name, sink).await {
        if !log.is_empty() {
            // Some of it may wait to be placed (up to the settling read):
            // the workload has started all the same.
            sink.sink.output_pending(&log);
        }
        let parts = splice.log_read(&log, delivered, 0, false);
        relay(window.tag(parts, &mut splice), delivered, sink);
    }
    // One log read at a time.
    let mut reading: Option<BoxFuture<'_, LogRead>> = None;
    let mut settle_at = Some(opened + SETTLE_READ_AFTER);
    // Whether the settling read was made (with nothing live yet).
    let mut settled = false;
    // Reads made early for a first output; none once anything was shown.
    let mut early_reads: VecDeque<Instant> = EARLY_READS_AFTER
        .iter()
        .map(|after| opened + *after)
        .collect();
    let mut retry_at = opened;
    let mut first_live_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let patience_over = first_live_at
            .is_some_and(|at| splice.awaits_unfinished_line() && now >= at + PLACEMENT_PATIENCE);
        let mut wake = None;
        if reading.is_none() && !splice.is_placed() {
            let read = if patience_over {
                Some((splice.window_len(), true))
            } else if splice.wants_search() && now >= retry_at {
                Some((splice.window_len(), false))
            } else if splice.window_len() == 0 && settle_at.is_some_and(|at| now >= at) {
                settle_at = None;
                settled = true;
                Some((0, false))
            } else if splice.window_len() == 0
                && delivered.is_empty()
                && early_reads.front().is_some_and(|at| now >= *at)
            {
                // This read also stands for the offsets already past.
                early_reads.retain(|at| *at > now);
                Some((0, false))
            } else {
                None
            };
            if let Some((window, decide)) = read {
                reading = Some(
                    read_log_or_gap(pods, pod_name, sink)
                        .map(move |log| LogRead {
                            log,
                            window,
                            decide,
                        })
                        .boxed(),
                );
            } else {
                wake = [
                    splice.wants_search().then_some(retry_at),
                    first_live_at
                        .filter(|_| splice.awaits_unfinished_line())
                        .map(|at| at + PLACEMENT_PATIENCE),
                    settle_at.filter(|_| splice.window_len() == 0),
                    early_reads
                        .front()
                        .copied()
                        .filter(|_| splice.window_len() == 0 && delivered.is_empty()),
                ]
                .into_iter()
                .flatten()
                .min();
            }
        }
        tokio::select! {
            chunk = live.recv() => match chunk {
                Some((stream, chunk)) => {
                    first_live_at.get_or_insert(Instant::now());
                    if !splice.is_placed() {
                        window.push(stream, chunk.len());
                    }
                    // Once placed, what passes is the end of this chunk.
                    relay(splice.attach_output(chunk).map(|part| (stream, part)), delivered, sink);
                    if splice.window_len() > MAX_WINDOW_BYTES {
                        warn!(pod = pod_name, "live output could not be placed in the container log; relaying it as it came");
                        let parts = splice.place_unseen();
                        relay(window.tag(parts, &mut splice), delivered, sink);
                    }
                }
                None => break,
            },
            read = async { reading.as_mut().expect("guarded").await }, if reading.is_some() => {
                reading = None;
                let was_placed = splice.is_placed();
                let searched = read.log.is_some();
                let parts = match read.log {
                    Some(log) => splice.log_read(&log, delivered, read.window, read.decide),
                    // No log to place it in: what came live is all there is.
                    None if read.window > 0 => splice.place_unseen(),
                    None => Vec::new(),
                };
                relay(window.tag(parts, &mut splice), delivered, sink);
                if !was_placed && searched && splice.guessed() {
                    warn!(pod = pod_name, attempts = splice.attempts(), "live output fits the container log in several places; joined at the last (output may show twice)");
                }
                retry_at = Instant::now() + PLACEMENT_RETRY * 2u32.pow(splice.attempts().min(6));
            },
            () = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
    let settle_read_done = settled && reading.is_none();
    drop(reading);
    // The stream is over: the log now holds everything it carried. Unless
    // it carried nothing since before the settling read, which had all of
    // it.
    let relayed_all = splice.is_placed() || (settle_read_done && splice.window_len() == 0);
    if !relayed_all {
        let log = read_log_or_gap(pods, pod_name, sink).await;
        let parts = splice.finish(log.as_deref(), delivered);
        relay(window.tag(parts, &mut splice), delivered, sink);
    }
    ended_rx.await.unwrap_or(false)
}

/// A log read made while an attach is open.
struct LogRead {
    /// `None`: it could not be read.
    log: Option<Vec<u8>>,
    /// How much live output had arrived when it was asked for.
    window: usize,
    /// Whether to settle the attach's place with it, found or not.
    decide: bool,
}

/// Relays output to the session, each part with the stream it came from,
/// counting it.
fn relay(
    parts: impl IntoIterator<Item = (StreamTag, Bytes)>,
    delivered: &mut Delivered,
    sink: &Output,
) {
    for (stream, part) in parts {
        if !part.is_empty() {
            delivered.record(&part);
            sink.output(stream, part);
        }
    }
}

/// How output from `stream` is tagged for an app with `io`.
fn session_tag(io: IoMode, stream: StreamTag) -> StreamTag {
    match io {
        IoMode::Tty => StreamTag::Tty,
        IoMode::Streams => stream,
    }
}

/// Output read from the log, which does not say which stream it came on.
fn from_log(bytes: Bytes) -> (StreamTag, Bytes) {
    (StreamTag::Stdout, bytes)
}

/// The stream of every live byte the splice holds while unplaced, as runs
/// in arrival order, so that the part of them a placement passes on (their
/// end) is relayed with the streams they came on.
#[derive(Debug, Default)]
struct WindowStreams(VecDeque<(StreamTag, usize)>);

impl WindowStreams {
    fn push(&mut self, stream: StreamTag, len: usize) {
        match self.0.back_mut() {
            Some((last, run)) if *last == stream => *run += len,
            _ if len > 0 => self.0.push_back((stream, len)),
            _ => {}
        }
    }

    /// `parts`, as the splice returned them: the log's (stdout), except
    /// that the last part is the window's end when the splice says so.
    fn tag(&mut self, parts: Vec<Bytes>, splice: &mut Splice) -> Vec<(StreamTag, Bytes)> {
        let from_window = splice.take_window_relayed();
        if splice.is_placed() {
            // The window is spent: what it held was passed on or skipped.
            let held = std::mem::take(&mut self.0);
            return tag_parts(parts, from_window, &held);
        }
        parts.into_iter().map(from_log).collect()
    }
}

/// `parts` tagged: the last part, when `from_window` is its length, split
/// by the streams of the end of `held` (the window's runs, in order); every
/// other part is the log's.
fn tag_parts(
    mut parts: Vec<Bytes>,
    from_window: usize,
    held: &VecDeque<(StreamTag, usize)>,
) -> Vec<(StreamTag, Bytes)> {
    let window_part = match parts.last() {
        Some(last) if from_window > 0 && last.len() == from_window => parts.pop(),
        _ => None,
    };
    let mut tagged: Vec<(StreamTag, Bytes)> = parts.into_iter().map(from_log).collect();
    if let Some(part) = window_part {
        // The part is the last `len` bytes of the window: walk its runs
        // back from the end to find whose they are.
        let mut runs: Vec<(StreamTag, usize)> = Vec::new();
        let mut left = part.len();
        for &(stream, run) in held.iter().rev() {
            if left == 0 {
                break;
            }
            let take = run.min(left);
            runs.push((stream, take));
            left -= take;
        }
        if left > 0 {
            // More than the window held (it cannot be): the rest as stdout.
            runs.push((StreamTag::Stdout, left));
        }
        let mut at = 0;
        for (stream, len) in runs.into_iter().rev() {
            tagged.push((stream, part.slice(at..at + len)));
            at += len;
        }
    }
    tagged
}

/// Attempts at reading the container log when the apiserver fails.
const HISTORY_ATTEMPTS: u32 = 4;

/// The container's output so far, from its log. A log that cannot be read
/// (after retries) is reported to the session as lost output — its clients
/// get a `gap` — and counts as empty.
pub async fn read_history(pods: &Api<Pod>, pod_name: &str, sink: &SessionSink) -> Vec<u8> {
    read_log_or_gap(pods, pod_name, &Output::session(sink.clone()))
        .await
        .unwrap_or_default()
}

/// The container log, or `None` (and a `gap` for the session's clients)
/// when it cannot be read.
async fn read_log_or_gap(pods: &Api<Pod>, pod_name: &str, sink: &Output) -> Option<Vec<u8>> {
    let log = read_log(pods, pod_name, &sink.container).await;
    if log.is_none() {
        warn!(
            pod = pod_name,
            "the container log could not be read; clients are told output is missing"
        );
        sink.output_lost();
    }
    log
}

/// `None` when the log could not be read; an absent pod or container has an
/// empty log.
///
/// Boxed: the terminal relay lives as long as its session and awaits this
/// from its own state, which would otherwise keep room for a whole
/// apiserver request (kilobytes) in every idle session.
fn read_log<'a>(
    pods: &'a Api<Pod>,
    pod_name: &'a str,
    container: &'a str,
) -> BoxFuture<'a, Option<Vec<u8>>> {
    read_log_inline(pods, pod_name, container).boxed()
}

async fn read_log_inline(pods: &Api<Pod>, pod_name: &str, container: &str) -> Option<Vec<u8>> {
    let params = LogParams {
        container: Some(container.to_owned()),
        ..LogParams::default()
    };
    let mut attempt = 1;
    loop {
        let failure = match pods.log_stream(pod_name, &params).await {
            Ok(stream) => match read_log_bytes(stream).await {
                Ok(history) => return Some(history),
                Err(err) => err.to_string(),
            },
            Err(err) if crate::cluster::api_error::is_not_found(&err) => return Some(Vec::new()),
            Err(err) if !crate::cluster::api_error::is_transient(&err) => {
                debug!(pod = pod_name, error = %err, "container log unavailable");
                return None;
            }
            Err(err) => err.to_string(),
        };
        if attempt >= HISTORY_ATTEMPTS {
            debug!(pod = pod_name, error = %failure, "container log read failed");
            return None;
        }
        debug!(pod = pod_name, error = %failure, attempt, "container log read failed; retrying");
        tokio::time::sleep(ATTACH_RETRY_DELAY * attempt).await;
        attempt += 1;
    }
}

/// A log's bytes, up to [`MAX_HISTORY_BYTES`], read a [`LOG_READ_BYTES`]
/// buffer at a time. Not `read_to_end`: each time the stream has nothing
/// ready, it zero-fills the whole spare capacity of its buffer again, and a
/// fast stream's log arrives a line per chunk — a few megabytes took tens
/// of seconds.
async fn read_log_bytes(stream: impl futures_util::AsyncRead) -> std::io::Result<Vec<u8>> {
    let mut limited = std::pin::pin!(stream.take(MAX_HISTORY_BYTES as u64));
    let mut history = Vec::new();
    let mut buf = vec![0_u8; LOG_READ_BYTES];
    loop {
        let n = limited.read(&mut buf).await?;
        if n == 0 {
            return Ok(history);
        }
        history.extend_from_slice(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pods API on a client that is never called: only the sizes of the
    /// futures built on it are looked at.
    fn idle_pods() -> Api<Pod> {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, std::io::Error>(std::io::Error::other(
                "not sent",
            ))
        });
        Api::namespaced(kube::Client::new(service, "sessions"), "sessions")
    }

    /// A session's long-lived tasks (its terminal relay, its pod follower)
    /// hold room for every future they await, for as long as the session
    /// lives: an apiserver request built inline there costs each idle
    /// session its whole state, kilobytes, though it runs once or twice.
    #[tokio::test]
    async fn apiserver_calls_of_the_per_session_tasks_stay_small_inline() {
        const MAX_INLINE_BYTES: usize = 512;
        let pods = idle_pods();
        let sizes = [
            (
                "read_log",
                std::mem::size_of_val(&read_log(&pods, "p", "c")),
            ),
            (
                "container_may_run",
                std::mem::size_of_val(&container_may_run(&pods, "p", "c")),
            ),
            (
                "attach",
                std::mem::size_of_val(&attach::attach(&pods, "p", "c", true)),
            ),
            (
                "delete_pod",
                std::mem::size_of_val(&crate::session::delete_pod(&pods, "p")),
            ),
        ];
        let large: Vec<String> = sizes
            .iter()
            .filter(|(_, size)| *size > MAX_INLINE_BYTES)
            .map(|(call, size)| format!("{call}: {size} bytes"))
            .collect();
        assert!(
            large.is_empty(),
            "futures larger than {MAX_INLINE_BYTES} bytes inline: {}",
            large.join(", ")
        );
    }

    fn tagged(parts: &[(StreamTag, &'static [u8])]) -> Vec<(StreamTag, Bytes)> {
        parts
            .iter()
            .map(|(stream, bytes)| (*stream, Bytes::from_static(bytes)))
            .collect()
    }

    #[test]
    fn the_window_part_of_a_placement_keeps_the_streams_it_came_on() {
        let mut window = WindowStreams::default();
        window.push(StreamTag::Stdout, 4);
        window.push(StreamTag::Stdout, 2);
        window.push(StreamTag::Stderr, 4);
        window.push(StreamTag::Stdout, 0);
        window.push(StreamTag::Stdout, 3);
        assert_eq!(
            window.0,
            [
                (StreamTag::Stdout, 6),
                (StreamTag::Stderr, 4),
                (StreamTag::Stdout, 3)
            ]
        );
        // The log up to the attach, then the window less its first 4 bytes
        // (which the log had relayed already).
        let parts = vec![
            Bytes::from_static(b"log\n"),
            Bytes::from_static(b"o\nerr\nok\n"),
        ];
        assert_eq!(
            tag_parts(parts, 9, &window.0),
            tagged(&[
                (StreamTag::Stdout, b"log\n"),
                (StreamTag::Stdout, b"o\n"),
                (StreamTag::Stderr, b"err\n"),
                (StreamTag::Stdout, b"ok\n"),
            ])
        );
    }

    #[test]
    fn parts_from_the_log_alone_are_stdout() {
        let held = VecDeque::from([(StreamTag::Stderr, 4)]);
        // Nothing came from the window: the one part is the log's, even
        // when its length happens to be the window's.
        assert_eq!(
            tag_parts(vec![Bytes::from_static(b"err\n")], 0, &held),
            tagged(&[(StreamTag::Stdout, b"err\n")])
        );
        assert_eq!(
            tag_parts(vec![Bytes::from_static(b"err\n")], 4, &held),
            tagged(&[(StreamTag::Stderr, b"err\n")])
        );
    }

    #[test]
    fn a_tty_tags_everything_tty_and_streams_keep_theirs() {
        assert_eq!(session_tag(IoMode::Tty, StreamTag::Stderr), StreamTag::Tty);
        assert_eq!(session_tag(IoMode::Tty, StreamTag::Stdout), StreamTag::Tty);
        assert_eq!(
            session_tag(IoMode::Streams, StreamTag::Stderr),
            StreamTag::Stderr
        );
        assert_eq!(
            session_tag(IoMode::Streams, StreamTag::Stdout),
            StreamTag::Stdout
        );
    }
}
