//! The session's byte channels over WebSocket (docs/contract.md §5), as
//! frames: what the runner sends (a `seq` text frame first, maybe a
//! `gap`, then binary output frames), what a client sends back (binary stdin,
//! a `resize` text frame), and the close codes that end it.
//!
//! Output frames come in two layouts ([`FrameFormat`]): the tagged
//! `[seq: u32 big-endian][stream: u8][bytes]` of runner-core 0.9 and later,
//! and the 0.8 `[seq: u32 big-endian][bytes]` an older editor reads.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::Value;

use crate::js::js_number_of_value;
use crate::watch::{IoMode, StreamTag};

pub const CLOSE_NORMAL: u16 = 1000;
/// The service is going away while the session lives on (RFC 6455, section 7.4.1).
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// No close frame was received (RFC 6455, section 7.1.5), as clients report it.
pub const CLOSE_NO_STATUS: u16 = 1005;
pub const CLOSE_UNAUTHORIZED: u16 = 4401;
pub const CLOSE_FORBIDDEN_ORIGIN: u16 = 4403;
pub const CLOSE_SESSION_NOT_FOUND: u16 = 4404;
/// The session ended and the runner holds no output of it to replay.
pub const CLOSE_NOTHING_TO_REPLAY: u16 = 4410;

/// Close codes after which reconnecting cannot help: the editor's list, plus
/// 4401 (a missing or wrong token stays wrong).
pub fn is_final_close(code: u16) -> bool {
    matches!(
        code,
        CLOSE_NORMAL
            | CLOSE_GOING_AWAY
            | CLOSE_NO_STATUS
            | CLOSE_UNAUTHORIZED
            | CLOSE_FORBIDDEN_ORIGIN
            | CLOSE_SESSION_NOT_FOUND
            | CLOSE_NOTHING_TO_REPLAY
    )
}

/// The largest terminal side a resize is clamped to.
pub const MAX_TERMINAL_DIMENSION: u16 = 10_000;

/// The layout of binary output frames, one per runner (`RUNNER_IO_FRAMES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FrameFormat {
    /// `[seq][stream][bytes]`, `features.io` a list of io modes.
    #[default]
    Tagged,
    /// `[seq][bytes]`, `features.io: true`: the 0.8 wire.
    Legacy,
}

impl FrameFormat {
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "tagged" => Some(Self::Tagged),
            "legacy" => Some(Self::Legacy),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tagged => "tagged",
            Self::Legacy => "legacy",
        }
    }

    /// The format a runner's capabilities announce: a list for `io` means
    /// tagged frames, the 0.8 boolean means the legacy ones.
    pub fn of_features(features: &serde_json::Map<String, Value>) -> Self {
        match features.get("io") {
            Some(Value::Array(_)) => Self::Tagged,
            _ => Self::Legacy,
        }
    }

    fn header_len(self) -> usize {
        match self {
            Self::Tagged => 5,
            Self::Legacy => 4,
        }
    }
}

/// The app a connection is bound to, as its `seq` frame names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLabel<'a> {
    pub app: &'a str,
    pub io: IoMode,
}

/// The first frame of every connection: the seq the replay continues after
/// and, in the tagged wire, the app and its io mode.
pub fn seq_message(last_seq: u64, channel: Option<ChannelLabel<'_>>) -> String {
    match channel {
        None => format!(r#"{{"type":"seq","seq":{last_seq}}}"#),
        Some(ChannelLabel { app, io }) => serde_json::json!({
            "type": "seq",
            "seq": last_seq,
            "app": app,
            "io": io.as_str(),
        })
        .to_string(),
    }
}

/// Sent before a replay that lost output to the buffer's eviction.
pub const GAP_MESSAGE: &str = r#"{"type":"gap","reason":"buffer_evicted"}"#;

/// The answer to a resize on an app without a terminal.
pub fn resize_unsupported_message(io: IoMode) -> String {
    format!(
        r#"{{"type":"error","error":"resize_unsupported","io":"{}"}}"#,
        io.as_str()
    )
}

/// One output frame in `format`; the legacy layout has no stream tag.
pub fn output_frame(format: FrameFormat, seq: u64, tag: StreamTag, chunk: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(format.header_len() + chunk.len());
    // The wire field is 32 bits; 2^32 chunks is far beyond any session.
    frame.put_u32(seq as u32);
    if format == FrameFormat::Tagged {
        frame.put_u8(tag as u8);
    }
    frame.put_slice(chunk);
    frame.freeze()
}

/// An output frame as a client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputFrame<'a> {
    pub seq: u32,
    pub stream: StreamTag,
    pub payload: &'a [u8],
}

/// The parts of an output frame in `format`; `None` for a frame shorter
/// than its header.
pub fn split_output_frame(format: FrameFormat, frame: &[u8]) -> Option<OutputFrame<'_>> {
    let header: [u8; 4] = frame.get(..4)?.try_into().ok()?;
    let seq = u32::from_be_bytes(header);
    match format {
        FrameFormat::Legacy => Some(OutputFrame {
            seq,
            stream: StreamTag::Tty,
            payload: &frame[4..],
        }),
        FrameFormat::Tagged => Some(OutputFrame {
            seq,
            stream: StreamTag::from_code(*frame.get(4)?),
            payload: &frame[5..],
        }),
    }
}

/// What a server text frame says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMessage {
    /// `{"type":"seq","seq":n}`.
    Seq(u64),
    /// `{"type":"gap",…}`: output before the replay was lost.
    Gap,
    /// Anything else (clients ignore what they do not know).
    Other,
}

pub fn parse_server_message(text: &str) -> ServerMessage {
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return ServerMessage::Other;
    };
    match value.get("type").and_then(Value::as_str) {
        Some("seq") => value
            .get("seq")
            .and_then(Value::as_u64)
            .map_or(ServerMessage::Other, ServerMessage::Seq),
        Some("gap") => ServerMessage::Gap,
        _ => ServerMessage::Other,
    }
}

/// The client's `{"type":"resize","cols":C,"rows":R}` frame.
pub fn resize_message(cols: u16, rows: u16) -> String {
    format!(r#"{{"type":"resize","cols":{cols},"rows":{rows}}}"#)
}

/// A resize frame as the runner reads it: values coerced like JavaScript's
/// `Number()`, floored, at least 1, clamped to [`MAX_TERMINAL_DIMENSION`].
/// Anything else is ignored (`None`).
pub fn parse_resize(text: &str) -> Option<(u16, u16)> {
    let value: Value = serde_json::from_str(text).ok()?;
    if value.get("type")?.as_str()? != "resize" {
        return None;
    }
    let dimension = |key: &str| -> Option<u16> {
        let n = js_number_of_value(value.get(key)?)?.floor();
        if !n.is_finite() || n < 1.0 {
            return None;
        }
        Some(n.min(f64::from(MAX_TERMINAL_DIMENSION)) as u16)
    };
    Some((dimension("cols")?, dimension("rows")?))
}

#[cfg(test)]
mod tests;
