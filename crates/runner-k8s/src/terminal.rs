//! The session's terminal over the pod `attach` subresource: output into the
//! session, stdin and resizes out of it.
//!
//! Attaching shows only what the container writes from then on, and a
//! container starts writing the moment it runs — before any attach can be in
//! place. So the terminal is attached first and the container log, which
//! holds everything written so far, is read next (in the background: the
//! session is announced `running` as soon as the attach is in place); the
//! part of the live stream that the log already contains is cut off where the
//! two overlap. Nothing written before the attach is lost.
//!
//! An attach that fails is retried, and one whose stream drops while the
//! container still runs (an apiserver restart, a proxy timeout) is attached
//! again, the output written meanwhile taken from the log: the terminal lives
//! as long as the container. A container that ended before it could be
//! attached to still has its output read from the log.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::AsyncReadExt as _;
use futures_util::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{LogParams, TerminalSize};
use runner_core::SessionSink;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::api_error::api_reason;
use crate::attach::{self, Incoming, Socket};
use crate::pod_spec::SESSION_CONTAINER;

/// Stdin chunks queued for a workload that is not reading; beyond this, input
/// is dropped rather than letting a client grow the runner's memory.
const STDIN_QUEUE: usize = 256;
/// How much of the log is read at most to rebuild the history. The replay
/// buffer keeps far less; this only bounds a pathological log.
const MAX_HISTORY_BYTES: usize = 64 * 1024 * 1024;
/// Attempts at an attach before the terminal is given up on (the output is
/// still read from the log); a blip of the apiserver costs a retry, not the
/// session's terminal.
const ATTACH_ATTEMPTS: u32 = 4;
/// The wait before the n-th retry is n times this.
const ATTACH_RETRY_DELAY: Duration = Duration::from_millis(100);
/// How much of the relayed output's end is kept to find where a log read
/// after a re-attach continues it.
const RELAYED_TAIL_BYTES: usize = 256;

/// The live half of a session's terminal.
pub struct Terminal {
    stdin: mpsc::Sender<Bytes>,
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
    pub fn write_stdin(&self, bytes: Bytes) {
        if let Err(mpsc::error::TrySendError::Full(dropped)) = self.stdin.try_send(bytes) {
            warn!(bytes = dropped.len(), "stdin queue full, input dropped");
        }
    }

    pub fn resize(&self, cols: u16, rows: u16) {
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
    let first = attach_with_retries(pods, pod_name, sink).await;
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(STDIN_QUEUE);
    let resize = Arc::new(Mutex::new(Resize::default()));
    let (done_tx, done_rx) = oneshot::channel();
    let relay = tokio::spawn(relay_terminal(
        pods.clone(),
        pod_name.to_owned(),
        sink.clone(),
        first,
        stdin_rx,
        resize.clone(),
        done_tx,
    ));
    Terminal {
        stdin: stdin_tx,
        resize,
        output_done: Mutex::new(Some(done_rx)),
        tasks: vec![relay],
    }
}

/// An attach, retried while the container may still be running.
async fn attach_with_retries(
    pods: &Api<Pod>,
    pod_name: &str,
    sink: &SessionSink,
) -> Option<Socket> {
    let mut attempt = 1;
    loop {
        match attach::attach(pods, pod_name).await {
            Ok(attached) => return Some(attached),
            // An ended container cannot be attached to; its log has it all.
            Err(err) if !container_may_run(pods, pod_name).await => {
                debug!(pod = pod_name, error = %err, "not attached: the container has ended");
                return None;
            }
            Err(err) if attempt >= ATTACH_ATTEMPTS => {
                warn!(pod = pod_name, error = %err, "attach failed");
                sink.output(Bytes::from(format!(
                    "\r\n[runner] failed to attach PTY: {}\r\n",
                    api_reason(&err)
                )));
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
async fn container_may_run(pods: &Api<Pod>, pod_name: &str) -> bool {
    let pod = match pods.get(pod_name).await {
        Ok(pod) => pod,
        Err(err) if crate::api_error::is_not_found(&err) => return false,
        Err(_) => return true,
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    pod.status
        .and_then(|status| status.container_statuses)
        .into_iter()
        .flatten()
        .find(|c| c.name == SESSION_CONTAINER)
        .and_then(|c| c.state)
        .is_some_and(|state| state.running.is_some())
}

/// Relays attach after attach until the container ended, then signals `done`.
async fn relay_terminal(
    pods: Api<Pod>,
    pod_name: String,
    sink: SessionSink,
    mut attached: Option<Socket>,
    stdin: mpsc::Receiver<Bytes>,
    resize: Arc<Mutex<Resize>>,
    done: oneshot::Sender<()>,
) {
    let stdin = Arc::new(tokio::sync::Mutex::new(stdin));
    let mut relayed = Relayed::default();
    loop {
        let Some(process) = attached.take() else {
            // Not attached (any more): the log holds what there is to show.
            let log = read_history(&pods, &pod_name, &sink).await;
            relayed.forward_rest_of(&log, &sink);
            break;
        };
        let container_ended = relay_one_attach(
            &pods,
            &pod_name,
            process,
            &sink,
            &mut relayed,
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
    sink: &SessionSink,
    relayed: &mut Relayed,
    stdin: &Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>,
    resize: &Arc<Mutex<Resize>>,
) -> bool {
    let mut tasks = AbortOnDrop::default();
    // Live output is held until the log is read, then released minus what
    // the log already holds.
    let (live_tx, mut live) = mpsc::unbounded_channel::<Bytes>();
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
    // One task moves the stream: output out, stdin and resizes in. It tells
    // whether the container ended (its final status arrived) or the stream
    // dropped under it.
    let stdin = stdin.clone();
    let (ended_tx, ended_rx) = oneshot::channel();
    tasks.0.push(tokio::spawn(async move {
        let mut stdin = stdin.lock().await;
        let mut stdin_open = true;
        let mut resize_open = true;
        let ended = loop {
            tokio::select! {
                message = rx.next() => match attach::incoming(message) {
                    Incoming::Output(bytes) => {
                        if live_tx.send(bytes).is_err() {
                            break false;
                        }
                    }
                    Incoming::Ended => break true,
                    Incoming::Other => {}
                    Incoming::Closed => break false,
                },
                bytes = stdin.recv(), if stdin_open => match bytes {
                    Some(bytes) => {
                        if tx.send(attach::stdin_frame(&bytes)).await.is_err() {
                            break false;
                        }
                    }
                    None => stdin_open = false,
                },
                size = resize_rx.next(), if resize_open => match size {
                    Some(size) => {
                        if tx.send(attach::resize_frame(size.width, size.height)).await.is_err() {
                            break false;
                        }
                    }
                    None => resize_open = false,
                },
            }
        };
        debug!(ended, "attach stream ended");
        drop(live_tx);
        let _ = ended_tx.send(ended);
    }));

    // The log is read once the attach is in place, so together they hold
    // everything.
    let log = read_history(pods, pod_name, sink).await;
    // Whatever arrived live since the attach may overlap the log's tail.
    let mut early = Vec::new();
    while let Ok(chunk) = live.try_recv() {
        early.extend_from_slice(&chunk);
    }
    relayed.forward_rest_of(&log, sink);
    let overlap = history_overlap(&log, &early);
    if early.len() > overlap {
        relayed.forward(Bytes::from(early).slice(overlap..), sink);
    }
    while let Some(chunk) = live.recv().await {
        relayed.forward(chunk, sink);
    }
    ended_rx.await.unwrap_or(false)
}

/// How much output reached the session, and how it ended.
#[derive(Default)]
struct Relayed {
    count: usize,
    tail: Vec<u8>,
}

impl Relayed {
    fn forward(&mut self, bytes: Bytes, sink: &SessionSink) {
        if bytes.is_empty() {
            return;
        }
        self.count += bytes.len();
        self.tail
            .extend_from_slice(&bytes[bytes.len().saturating_sub(RELAYED_TAIL_BYTES)..]);
        let excess = self.tail.len().saturating_sub(RELAYED_TAIL_BYTES);
        self.tail.drain(..excess);
        sink.output(bytes);
    }

    /// Relays what of `log` (the container's whole output) was not relayed.
    fn forward_rest_of(&mut self, log: &[u8], sink: &SessionSink) {
        let from = self.position_in(log);
        if from < log.len() {
            self.forward(Bytes::copy_from_slice(&log[from..]), sink);
        }
    }

    /// Where in `log` the relayed output ends: after as many bytes as were
    /// relayed when the log agrees (the usual case), else after the last
    /// place the relayed tail appears (an overlap that was left uncut
    /// repeated a few bytes); nowhere (the end) when it does not appear.
    fn position_in(&self, log: &[u8]) -> usize {
        if self.count == 0 {
            return 0;
        }
        if self.count <= log.len() && log[..self.count].ends_with(&self.tail) {
            return self.count;
        }
        log.windows(self.tail.len())
            .rposition(|window| window == self.tail.as_slice())
            .map_or(log.len(), |start| start + self.tail.len())
    }
}

/// Attempts at reading the container log when the apiserver fails.
const HISTORY_ATTEMPTS: u32 = 4;

/// The container's output so far, from its log. A log that cannot be read
/// (after retries) is reported to the session as lost output — its clients
/// get a `gap` — and counts as empty.
pub async fn read_history(pods: &Api<Pod>, pod_name: &str, sink: &SessionSink) -> Vec<u8> {
    match read_log(pods, pod_name).await {
        Some(history) => history,
        None => {
            warn!(
                pod = pod_name,
                "the container log could not be read; clients are told output is missing"
            );
            sink.output_lost();
            Vec::new()
        }
    }
}

/// `None` when the log could not be read; an absent pod or container has an
/// empty log.
async fn read_log(pods: &Api<Pod>, pod_name: &str) -> Option<Vec<u8>> {
    let params = LogParams {
        container: Some(SESSION_CONTAINER.to_owned()),
        ..LogParams::default()
    };
    let mut attempt = 1;
    loop {
        let failure = match pods.log_stream(pod_name, &params).await {
            Ok(stream) => {
                let mut history = Vec::new();
                let mut limited = stream.take(MAX_HISTORY_BYTES as u64);
                match limited.read_to_end(&mut history).await {
                    Ok(_) => return Some(history),
                    Err(err) => err.to_string(),
                }
            }
            Err(err) if crate::api_error::is_not_found(&err) => return Some(Vec::new()),
            Err(err) if !crate::api_error::is_transient(&err) => {
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

/// Overlaps shorter than this are too likely to be coincidence (a line end, a
/// prompt) to cut on.
const MIN_OVERLAP_BYTES: usize = 16;

/// How many leading bytes of the live stream the log already holds.
///
/// Every length at which the log's tail equals the live stream's head is a
/// candidate. Nothing in the streams marks where the attach began, so only an
/// unambiguous candidate is cut: exactly one, and long enough not to be a
/// coincidence. Output that repeats itself (a spinner, a generated pattern)
/// has several candidates, the true one possibly zero — cutting any of them
/// could drop output the client never sees, so nothing is cut and at worst a
/// stretch written while the terminal was being attached shows twice.
pub fn history_overlap(history: &[u8], live: &[u8]) -> usize {
    match overlap_lengths(history, live).as_slice() {
        [only] if *only >= MIN_OVERLAP_BYTES => *only,
        _ => 0,
    }
}

/// Every `n` for which the last `n` bytes of `history` equal the first `n`
/// bytes of `live`, longest first (the chain of borders Knuth–Morris–Pratt
/// leaves after scanning `history` for `live`).
pub fn overlap_lengths(history: &[u8], live: &[u8]) -> Vec<usize> {
    let pattern = &live[..live.len().min(history.len())];
    if pattern.is_empty() {
        return Vec::new();
    }
    let failure = failure_function(pattern);
    let mut matched = scan(history, pattern, &failure);
    let mut lengths = Vec::new();
    while matched > 0 {
        lengths.push(matched);
        matched = failure[matched - 1];
    }
    lengths
}

fn failure_function(pattern: &[u8]) -> Vec<usize> {
    let mut failure = vec![0usize; pattern.len()];
    let mut k = 0;
    for i in 1..pattern.len() {
        while k > 0 && pattern[i] != pattern[k] {
            k = failure[k - 1];
        }
        if pattern[i] == pattern[k] {
            k += 1;
        }
        failure[i] = k;
    }
    failure
}

/// The length of the longest prefix of `pattern` that ends `history`.
fn scan(history: &[u8], pattern: &[u8], failure: &[usize]) -> usize {
    let mut matched = 0;
    for &byte in &history[history.len() - pattern.len()..] {
        while matched > 0 && (matched == pattern.len() || byte != pattern[matched]) {
            matched = failure[matched - 1];
        }
        if byte == pattern[matched] {
            matched += 1;
        }
    }
    matched
}

/// The length of the longest suffix of `history` that is a prefix of `live`.
pub fn overlap_len(history: &[u8], live: &[u8]) -> usize {
    overlap_lengths(history, live).first().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlap_is_the_longest_suffix_that_starts_the_live_stream() {
        assert_eq!(overlap_len(b"hello world", b"world and more"), 5);
        assert_eq!(overlap_len(b"abc", b"xyz"), 0);
        assert_eq!(overlap_len(b"", b"abc"), 0);
        assert_eq!(overlap_len(b"abc", b""), 0);
        assert_eq!(overlap_len(b"aaaa", b"aaab"), 3);
        assert_eq!(overlap_len(b"same", b"same"), 4);
        assert_eq!(overlap_len(b"xabab", b"ababc"), 4);
    }

    #[test]
    fn only_an_unambiguous_overlap_is_cut() {
        // "abab" ends the log; the live stream starts "ababab…": 2 and 4 both
        // fit, and 0 may be the truth: cut nothing.
        assert_eq!(overlap_lengths(b"xxabab", b"ababab"), vec![4, 2]);
        assert_eq!(history_overlap(b"xxabab", b"ababab"), 0);
        // A short match may be a coincidence.
        assert_eq!(history_overlap(b"hello", b"lo world"), 0);
        // One long match is the overlap.
        assert_eq!(
            history_overlap(
                b"banner line one\r\nbanner line two\r\n",
                b"banner line two\r\nprompt> "
            ),
            17
        );
        assert_eq!(
            history_overlap(b"hello", b"world"),
            0,
            "nothing fits: cut nothing"
        );
    }

    proptest::proptest! {
        #[test]
        fn matches_the_quadratic_definition(history in proptest::collection::vec(0u8..3, 0..40), live in proptest::collection::vec(0u8..3, 0..40)) {
            let max = history.len().min(live.len());
            let expected = (1..=max).rev().find(|&n| history[history.len() - n..] == live[..n]).unwrap_or(0);
            proptest::prop_assert_eq!(overlap_len(&history, &live), expected);
            let all: Vec<usize> = (1..=max).rev().filter(|&n| history[history.len() - n..] == live[..n]).collect();
            proptest::prop_assert_eq!(overlap_lengths(&history, &live), all);
        }
    }
}
