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

use bytes::Bytes;
use futures_util::AsyncReadExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess, LogParams, TerminalSize};
use runner_core::SessionSink;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::api_error::api_reason;
use crate::pod_spec::SESSION_CONTAINER;

/// kube's attach pipes default to 1 KiB, which turns a fast workload's output
/// into a stream of tiny frames; these sizes keep throughput up.
const PIPE_BUFFER_BYTES: usize = 256 * 1024;
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Stdin chunks queued for a workload that is not reading; beyond this, input
/// is dropped rather than letting a client grow the runner's memory.
const STDIN_QUEUE: usize = 256;
/// How much of the log is read at most to rebuild the history. The replay
/// buffer keeps far less; this only bounds a pathological log.
const MAX_HISTORY_BYTES: usize = 64 * 1024 * 1024;

/// The live half of a session's terminal.
pub struct Terminal {
    stdin: mpsc::Sender<Bytes>,
    resize: std::sync::Mutex<Option<futures_channel::mpsc::Sender<TerminalSize>>>,
    /// Resolves when the container's output stream ended.
    pub output_done: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Terminal {
    pub fn write_stdin(&self, bytes: Bytes) {
        if let Err(mpsc::error::TrySendError::Full(dropped)) = self.stdin.try_send(bytes) {
            warn!(bytes = dropped.len(), "stdin queue full, input dropped");
        }
    }

    pub fn resize(&self, cols: u16, rows: u16) {
        let mut resize = self.resize.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = resize.as_mut() {
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

/// Attach to the session container and stream its output — history first —
/// into `sink`. A failure to attach is reported in the output, not fatal: the
/// status still flows.
pub async fn attach(pods: &Api<Pod>, pod_name: &str, sink: &SessionSink) -> Option<Terminal> {
    let params = AttachParams::interactive_tty()
        .container(SESSION_CONTAINER)
        .max_stdin_buf_size(PIPE_BUFFER_BYTES)
        .max_stdout_buf_size(PIPE_BUFFER_BYTES);
    let mut attached: AttachedProcess = match pods.attach(pod_name, &params).await {
        Ok(attached) => attached,
        Err(err) => {
            warn!(pod = pod_name, error = %err, "attach failed");
            sink.output(Bytes::from(format!(
                "\r\n[runner] failed to attach PTY: {}\r\n",
                api_reason(&err)
            )));
            return None;
        }
    };
    let stdout = attached.stdout();
    let stdin_pipe = attached.stdin();
    let resize = attached.terminal_size();

    // Live output is held until the history is known, then released minus
    // what the history already holds.
    let (live_tx, live_rx) = mpsc::unbounded_channel::<Bytes>();
    let (done_tx, done_rx) = oneshot::channel();
    let mut tasks = Vec::new();
    if let Some(mut stdout) = stdout {
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![0u8; READ_CHUNK_BYTES];
            loop {
                match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if live_tx.send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                            break;
                        }
                    }
                }
            }
        }));
    }
    // The log is read once the attach is in place, so together they hold
    // everything; reading it does not hold up the caller (`running` is
    // announced meanwhile, and the live output waits for the history).
    tasks.push(tokio::spawn(forward_output(
        pods.clone(),
        pod_name.to_owned(),
        live_rx,
        sink.clone(),
        done_tx,
    )));

    let (stdin_tx, mut stdin_rx) = mpsc::channel::<Bytes>(STDIN_QUEUE);
    if let Some(mut stdin_pipe) = stdin_pipe {
        tasks.push(tokio::spawn(async move {
            while let Some(bytes) = stdin_rx.recv().await {
                if stdin_pipe.write_all(&bytes).await.is_err() {
                    break;
                }
                let _ = stdin_pipe.flush().await;
            }
        }));
    }
    // The attach connection itself ends with the container. The status
    // receiver is held while the connection runs: kube drops the output pipe
    // without closing it when nobody takes the final status, and the output
    // would then never reach its end.
    let status = attached.take_status();
    tasks.push(tokio::spawn(async move {
        let status = async move {
            match status {
                Some(status) => status.await,
                None => None,
            }
        };
        let (joined, status) = tokio::join!(attached.join(), status);
        if let Err(err) = joined {
            debug!(error = %err, "attach stream ended with an error");
        }
        debug!(?status, "attach stream ended");
    }));
    Some(Terminal {
        stdin: stdin_tx,
        resize: std::sync::Mutex::new(resize),
        output_done: std::sync::Mutex::new(Some(done_rx)),
        tasks,
    })
}

/// The container's output so far, from its log (empty when unreadable).
pub async fn read_history(pods: &Api<Pod>, pod_name: &str) -> Vec<u8> {
    let params = LogParams {
        container: Some(SESSION_CONTAINER.to_owned()),
        ..LogParams::default()
    };
    let stream = match pods.log_stream(pod_name, &params).await {
        Ok(stream) => stream,
        Err(err) => {
            debug!(pod = pod_name, error = %err, "container log unavailable");
            return Vec::new();
        }
    };
    let mut history = Vec::new();
    let mut limited = stream.take(MAX_HISTORY_BYTES as u64);
    if let Err(err) = limited.read_to_end(&mut history).await {
        debug!(pod = pod_name, error = %err, "container log read failed");
    }
    history
}

async fn forward_output(
    pods: Api<Pod>,
    pod_name: String,
    mut live: mpsc::UnboundedReceiver<Bytes>,
    sink: SessionSink,
    done: oneshot::Sender<()>,
) {
    let history = read_history(&pods, &pod_name).await;
    // Whatever arrived live since the attach may overlap the log's tail.
    let mut early = Vec::new();
    while let Ok(chunk) = live.try_recv() {
        early.extend_from_slice(&chunk);
    }
    let overlap = history_overlap(&history, &early);
    if !history.is_empty() {
        sink.output(Bytes::from(history));
    }
    if early.len() > overlap {
        sink.output(Bytes::from(early).slice(overlap..));
    }
    while let Some(chunk) = live.recv().await {
        sink.output(chunk);
    }
    let _ = done.send(());
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
