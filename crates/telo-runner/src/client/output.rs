//! Where the session's output goes: this process's stdout, as the
//! application's own bytes.

use std::io::{IsTerminal, Write};

/// The session's output on our stdout, converted by [`PlainLineEnds`] when
/// stdout is not a terminal. `run`, `attach` and `logs` all write through it,
/// so piped output reads the same whichever command produced it.
#[derive(Debug)]
pub struct Output {
    plain: Option<PlainLineEnds>,
}

impl Output {
    pub fn stdout() -> Output {
        Output {
            plain: (!std::io::stdout().is_terminal()).then(PlainLineEnds::default),
        }
    }

    pub fn write(&mut self, payload: &[u8]) {
        match self.plain.as_mut() {
            Some(plain) => write_stdout(&plain.convert(payload)),
            None => write_stdout(payload),
        }
    }

    /// Writes what a line-end conversion still holds; call once, at the end.
    pub fn finish(&mut self) {
        if let Some(plain) = self.plain.as_mut() {
            write_stdout(plain.finish());
        }
    }
}

pub fn write_stdout(bytes: &[u8]) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(bytes);
    let _ = stdout.flush();
}

/// The session's terminal output as written to our stdout. On a terminal it
/// is passed through; into a pipe or a file the terminal's line ends
/// (`\r\n`, added by the session's PTY) become the `\n` the application
/// wrote, so what is saved or piped on is the application's own text.
#[derive(Debug, Default)]
pub struct PlainLineEnds {
    /// A `\r` that ended the last chunk, held until the next byte shows
    /// whether it starts a line end.
    held_cr: bool,
}

impl PlainLineEnds {
    pub fn convert(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len() + 1);
        let mut bytes = chunk.iter().copied().peekable();
        if std::mem::take(&mut self.held_cr) && bytes.peek() != Some(&b'\n') {
            out.push(b'\r');
        }
        while let Some(byte) = bytes.next() {
            if byte == b'\r' {
                match bytes.peek() {
                    Some(b'\n') => continue,
                    None => {
                        self.held_cr = true;
                        continue;
                    }
                    Some(_) => {}
                }
            }
            out.push(byte);
        }
        out
    }

    /// What is still held when the output ends.
    pub fn finish(&mut self) -> &'static [u8] {
        if std::mem::take(&mut self.held_cr) {
            b"\r"
        } else {
            b""
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PlainLineEnds;

    #[test]
    fn terminal_line_ends_become_newlines_across_chunks() {
        let mut plain = PlainLineEnds::default();
        let mut out = plain.convert(b"one\r\ntwo\r");
        out.extend(plain.convert(b"\nthree\rbar\r"));
        out.extend(plain.convert(b"x"));
        out.extend(plain.convert(b"\r"));
        out.extend_from_slice(plain.finish());
        assert_eq!(out, b"one\ntwo\nthree\rbar\rx\r");
    }
}
