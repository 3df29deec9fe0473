//! Writing the workload's output. Lines are written whole under the stdout
//! lock and flushed at once, so the echo, periodic-line and resize threads
//! never interleave mid-line and the runner sees each line as it happens.
//!
//! Write errors are ignored: a workload whose reader went away keeps doing
//! what its script says (and is killed by the runner), like a Node process
//! that ignores EPIPE on its stdout.

use std::io::{self, Write};

/// Spewed output has a newline every this many bytes (79 printable + `\n`).
pub const SPEW_LINE_BYTES: usize = 80;
/// Spew is written in blocks of this many whole lines (~64 KiB) so the pipe
/// or PTY, not fake-telo, is the bottleneck a benchmark measures.
const SPEW_BLOCK_LINES: usize = 819;
const PRINTABLE_FIRST: u8 = b'!';
const PRINTABLE_COUNT: usize = 94; // '!'..='~'

pub fn stdout_line(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Writes `bytes` verbatim (no newline) and flushes.
pub fn stdout_bytes(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(bytes).and_then(|()| out.flush());
}

/// An echoed stdin line (with its own line ending, if any) to stdout and,
/// with `to_stderr`, as `stderr: <line>` to stderr after it.
pub fn echo_line(line: &[u8], to_stderr: bool) {
    {
        let mut out = io::stdout().lock();
        let _ = out.write_all(line).and_then(|()| out.flush());
    }
    if to_stderr {
        let mut err = io::stderr().lock();
        let _ = err
            .write_all(b"stderr: ")
            .and_then(|()| err.write_all(line))
            .and_then(|()| err.flush());
    }
}

pub fn stderr_line(line: &str) {
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "{line}").and_then(|()| err.flush());
}

/// One block of the spew pattern: lines of printable ASCII, each shifted by
/// one character from the last so a dropped or repeated line is visible.
pub fn spew_block() -> Vec<u8> {
    let mut block = Vec::with_capacity(SPEW_BLOCK_LINES * SPEW_LINE_BYTES);
    for line in 0..SPEW_BLOCK_LINES {
        for column in 0..SPEW_LINE_BYTES - 1 {
            let offset = (line + column) % PRINTABLE_COUNT;
            block.push(PRINTABLE_FIRST + offset as u8);
        }
        block.push(b'\n');
    }
    block
}

/// Writes exactly `total` bytes of the spew pattern to stdout, then flushes.
/// The last line is cut short when `total` is not a multiple of the line length.
pub fn spew(total: u64) {
    let block = spew_block();
    let mut out = io::stdout().lock();
    let mut remaining = total;
    while remaining > 0 {
        let take = usize::try_from(remaining).map_or(block.len(), |left| left.min(block.len()));
        if out.write_all(&block[..take]).is_err() {
            return;
        }
        remaining -= take as u64;
    }
    let _ = out.flush();
}

/// Joins an error with its sources, so "cannot read entry" also says *why*.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spew_lines_are_printable_and_newline_terminated_every_80_bytes() {
        let block = spew_block();
        assert_eq!(block.len() % SPEW_LINE_BYTES, 0);
        for line in block.chunks(SPEW_LINE_BYTES) {
            let (text, newline) = line.split_at(SPEW_LINE_BYTES - 1);
            assert_eq!(newline, b"\n");
            assert!(text.iter().all(|byte| byte.is_ascii_graphic()));
        }
    }

    #[test]
    fn consecutive_spew_lines_differ() {
        let block = spew_block();
        let mut lines = block.chunks(SPEW_LINE_BYTES);
        let first = lines.next().unwrap();
        let second = lines.next().unwrap();
        assert_ne!(first, second);
        assert_eq!(first[1], second[0]);
    }
}
