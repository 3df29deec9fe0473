//! A container's I/O as the kubelet exposes it: the log (kept after the
//! container exits, like the CRI log file) and the live attach hub (output
//! fan-out, stdin, terminal resize).

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::{broadcast, mpsc, watch};

/// The kubelet's default `containerLogMaxSize`: older output is dropped.
pub const LOG_BYTES_PER_CONTAINER: usize = 10 * 1024 * 1024;
/// Output chunks buffered per attached client before it is considered lagging.
const ATTACH_FANOUT_CHUNKS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone)]
pub struct LogChunk {
    /// RFC 3339 with nanoseconds, as `kubectl logs --timestamps` prints.
    pub timestamp: String,
    pub unix_nanos: i128,
    pub stream: StreamKind,
    pub data: Bytes,
}

#[derive(Default)]
struct LogBuf {
    chunks: VecDeque<LogChunk>,
    bytes: usize,
    /// Sequence number of `chunks[0]`.
    first_seq: u64,
    closed: bool,
}

/// What a client sends into a container's stdin.
#[derive(Debug)]
pub enum StdinMsg {
    Data(Bytes),
    /// The attaching client closed its stdin (only `stdinOnce` honours it).
    Close,
}

pub struct ContainerStreams {
    pub tty: bool,
    pub stdin_open: bool,
    log: Mutex<LogBuf>,
    log_seq: watch::Sender<u64>,
    output: broadcast::Sender<(StreamKind, Bytes)>,
    stdin: Mutex<Option<mpsc::Sender<StdinMsg>>>,
    resize: Mutex<Option<mpsc::UnboundedSender<(u16, u16)>>>,
}

impl ContainerStreams {
    pub fn new(tty: bool, stdin_open: bool) -> Self {
        Self {
            tty,
            stdin_open,
            log: Mutex::new(LogBuf::default()),
            log_seq: watch::channel(0).0,
            output: broadcast::channel(ATTACH_FANOUT_CHUNKS).0,
            stdin: Mutex::new(None),
            resize: Mutex::new(None),
        }
    }

    fn log_lock(&self) -> std::sync::MutexGuard<'_, LogBuf> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records output: into the log and out to every attached client.
    pub fn push(&self, stream: StreamKind, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let now = time::OffsetDateTime::now_utc();
        let timestamp = now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let seq = {
            let mut log = self.log_lock();
            log.bytes += data.len();
            log.chunks.push_back(LogChunk {
                timestamp,
                unix_nanos: now.unix_timestamp_nanos(),
                stream,
                data: data.clone(),
            });
            while log.bytes > LOG_BYTES_PER_CONTAINER {
                match log.chunks.pop_front() {
                    Some(c) => {
                        log.bytes -= c.data.len();
                        log.first_seq += 1;
                    }
                    None => break,
                }
            }
            log.first_seq + log.chunks.len() as u64
        };
        let _ = self.output.send((stream, data));
        self.log_seq.send_replace(seq);
    }

    /// Marks the container as exited: followers end, attach clients get
    /// their final status.
    pub fn close(&self) {
        self.log_lock().closed = true;
        self.stdin.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.resize.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.log_seq.send_modify(|s| *s += 0);
    }

    pub fn is_closed(&self) -> bool {
        self.log_lock().closed
    }

    /// Chunks from sequence `from` on, the next sequence, and whether the
    /// container has exited.
    pub fn read_from(&self, from: u64) -> (Vec<LogChunk>, u64, bool) {
        let log = self.log_lock();
        let start = from.max(log.first_seq);
        let skip = (start - log.first_seq) as usize;
        let chunks: Vec<LogChunk> = log.chunks.iter().skip(skip).cloned().collect();
        let next = log.first_seq + log.chunks.len() as u64;
        (chunks, next, log.closed)
    }

    pub fn first_seq(&self) -> u64 {
        self.log_lock().first_seq
    }

    pub fn subscribe_log(&self) -> watch::Receiver<u64> {
        self.log_seq.subscribe()
    }

    pub fn subscribe_output(&self) -> broadcast::Receiver<(StreamKind, Bytes)> {
        self.output.subscribe()
    }

    pub fn set_stdin(&self, tx: mpsc::Sender<StdinMsg>) {
        *self.stdin.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    }

    pub fn set_resize(&self, tx: mpsc::UnboundedSender<(u16, u16)>) {
        *self.resize.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    }

    /// Takes the terminal's resize sender, to put another in front of it.
    pub fn take_resize(&self) -> Option<mpsc::UnboundedSender<(u16, u16)>> {
        self.resize.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Queues input for the container, waiting while its queue is full: a
    /// container that does not read its stdin holds the writer back, as a
    /// runtime's pipe does, instead of the input piling up here.
    pub async fn write_stdin(&self, msg: StdinMsg) {
        let tx = self.stdin.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(tx) = tx {
            let _ = tx.send(msg).await;
        }
    }

    pub fn resize(&self, cols: u16, rows: u16) {
        if let Some(tx) = self
            .resize
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = tx.send((cols, rows));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_output_after_close() {
        let s = ContainerStreams::new(false, false);
        s.push(StreamKind::Stdout, Bytes::from_static(b"a\n"));
        s.push(StreamKind::Stderr, Bytes::from_static(b"b\n"));
        s.close();
        let (chunks, next, closed) = s.read_from(0);
        assert_eq!(chunks.len(), 2);
        assert_eq!(next, 2);
        assert!(closed);
        let (rest, _, _) = s.read_from(1);
        assert_eq!(rest[0].data, Bytes::from_static(b"b\n"));
    }
}
