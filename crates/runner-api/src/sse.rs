//! Server-sent events as the `/v1` contract uses them (docs/contract.md §4): how the runner
//! writes a frame, the resume point a client sends back, and the one parser
//! every reader uses — the terminal client, the tests, the benchmarks, and
//! the runner itself when it reads a kernel's debug stream.

use bytes::BufMut;

use crate::js::is_js_whitespace;

/// Sent before a replay that lost events to the buffer's eviction; it has no
/// id, so a client's resume point stays where it was.
pub const GAP_FRAME: &[u8] = b"event: gap\ndata: {\"reason\":\"buffer_evicted\"}\n\n";
/// Keeps idle streams open through proxies that close silent connections.
pub const HEARTBEAT_FRAME: &[u8] = b": heartbeat\n\n";

/// Appends one event frame. `data` is a single line (compact JSON).
pub fn put_event(out: &mut impl BufMut, id: u64, event: &str, data: &[u8]) {
    out.put_slice(format!("id: {id}\nevent: {event}\ndata: ").as_bytes());
    out.put_slice(data);
    out.put_slice(b"\n\n");
}

/// The resume point of a `Last-Event-ID` header or `lastEventId` query:
/// `parseInt(value, 10)` accepted only when finite and non-negative; anything
/// else (`None`) falls through to the next source of a resume point.
pub fn parse_resume_id(raw: &str) -> Option<u64> {
    // JavaScript's whitespace, not Rust's: `parseInt` skips U+FEFF but not
    // U+0085.
    let trimmed = raw.trim_start_matches(is_js_whitespace);
    let (negative, digits) = match trimmed.as_bytes().first() {
        Some(b'-') => (true, &trimmed[1..]),
        Some(b'+') => (false, &trimmed[1..]),
        _ => (false, trimmed),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    let value: u64 = digits[..end].parse().unwrap_or(u64::MAX);
    if negative && value != 0 {
        return None;
    }
    Some(value)
}

/// One blank-line-terminated block of a stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseFrame {
    /// The `id:` field, when it is a number (the only ids the runner sends).
    pub id: Option<u64>,
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`; `None` when the block had none.
    pub data: Option<String>,
    /// Comment lines (`: heartbeat`), without the colon and leading spaces.
    pub comments: Vec<String>,
    /// Lines the contract never sends (unknown fields, a non-numeric id), as
    /// received. Readers ignore them, as the SSE standard says; tests can
    /// insist there are none.
    pub unexpected: Vec<String>,
}

impl SseFrame {
    /// Whether the block carried an event rather than only comments.
    pub fn is_event(&self) -> bool {
        self.event.is_some() || self.data.is_some()
    }

    /// The data as JSON, when it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_str(self.data.as_deref()?).ok()
    }

    /// `status.kind` of a `status` event (`running`, `exited`, …).
    pub fn status_kind(&self) -> Option<String> {
        if self.event.as_deref() != Some("status") {
            return None;
        }
        self.json()?["status"]["kind"].as_str().map(str::to_owned)
    }
}

/// Splits an SSE byte stream into frames, whatever the chunking. Linear in
/// the bytes pushed (each byte is scanned for a frame end once), and bounded:
/// a frame growing past its limit is dropped whole and the parser skips to
/// the next frame boundary, so a hostile stream cannot take memory or CPU
/// without bound.
#[derive(Debug)]
pub struct SseParser {
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no frame end.
    scanned: usize,
    /// Inside a frame that grew past `max_frame_bytes`: its bytes are thrown
    /// away until it ends.
    discarding: bool,
    max_frame_bytes: usize,
}

impl SseParser {
    /// A parser that drops frames larger than `max_frame_bytes`.
    pub fn new(max_frame_bytes: usize) -> Self {
        Self {
            pending: Vec::new(),
            scanned: 0,
            discarding: false,
            max_frame_bytes,
        }
    }

    /// The frames `bytes` completes, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseFrame> {
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        loop {
            // A terminator may straddle the previous push: look back 3 bytes.
            let from = self.scanned.saturating_sub(3);
            let Some((at, len)) = find_frame_end(&self.pending[from..]) else {
                self.scanned = self.pending.len();
                if self.pending.len() > self.max_frame_bytes {
                    // Keep the tail a terminator could start in.
                    let keep = self.pending.len().min(3);
                    self.pending.drain(..self.pending.len() - keep);
                    self.scanned = self.pending.len();
                    self.discarding = true;
                }
                return frames;
            };
            let end = from + at;
            let block: Vec<u8> = self.pending.drain(..end + len).collect();
            self.scanned = 0;
            if std::mem::take(&mut self.discarding) {
                continue;
            }
            if let Some(frame) = parse_block(&String::from_utf8_lossy(&block[..end])) {
                frames.push(frame);
            }
        }
    }

    /// Bytes held for a frame not yet complete.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }
}

/// Position and length of the first blank-line frame terminator.
fn find_frame_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The fields of one block; `None` for a block with no lines at all.
fn parse_block(block: &str) -> Option<SseFrame> {
    let mut frame = SseFrame::default();
    let mut any = false;
    for line in block.lines() {
        any = true;
        if let Some(comment) = line.strip_prefix(':') {
            frame.comments.push(comment.trim_start().to_owned());
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        // The standard strips exactly one space after the colon.
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => match value.parse() {
                Ok(id) => frame.id = Some(id),
                Err(_) => frame.unexpected.push(line.to_owned()),
            },
            "event" => frame.event = Some(value.to_owned()),
            "data" => match &mut frame.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => frame.data = Some(value.to_owned()),
            },
            _ => frame.unexpected.push(line.to_owned()),
        }
    }
    any.then_some(frame)
}

#[cfg(test)]
mod tests;
