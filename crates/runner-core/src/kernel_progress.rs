//! The kernel's own account of what its start is waiting for, read off its
//! terminal.
//!
//! Before a Telo kernel loads an application it resolves the application's
//! controllers: a `pkg:telo/local/js` controller is built from its sources,
//! a `pkg:npm` one is installed, each once per kernel cache. On a terminal it
//! says so, one line per controller, redrawn in place when done:
//!
//! ```text
//!   ⬇ npm:@telorun/http-server@0.28.0#http-server-api npm-install…
//!   ✓ npm:@telorun/http-server@0.28.0#http-server-api (local, 866ms)
//! ```
//!
//! (coloured, the `✓` line preceded by cursor-up and erase-line sequences,
//! and the `⬇` line sometimes drawn twice). An npm install takes seconds, so
//! the editor is told: each controller whose resolution starts becomes a
//! `progress` event (`Resolving http-server (npm)…`) and each that ends
//! another (`Resolved http-server (npm, 866ms)`, `done`).
//!
//! These lines are the kernel at work, not the application: they do not
//! count as the workload's first output for the start gate (see
//! [`crate::start_gate`]). The bytes themselves reach the terminal
//! unchanged; only the events are added.

/// The longest unfinished line kept while waiting for its end. A resolution
/// line is a package URL and a few words; anything longer is the
/// application's output.
const MAX_PARTIAL_LINE: usize = 1024;

/// What one controller's resolution did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The kernel started resolving `name` (`kind`: `npm`, `build`, …).
    Started { name: String, kind: String },
    /// It finished (`took` as the kernel printed it).
    Finished {
        name: String,
        kind: String,
        took: Option<String>,
    },
    /// It failed.
    Failed { name: String, kind: String },
}

impl Resolution {
    /// The `progress` message for it.
    pub fn message(&self) -> String {
        match self {
            Resolution::Started { name, kind } => format!("Resolving {name} ({kind})…"),
            Resolution::Finished {
                name,
                kind,
                took: Some(took),
            } => format!("Resolved {name} ({kind}, {took})"),
            Resolution::Finished {
                name,
                kind,
                took: None,
            } => format!("Resolved {name} ({kind})"),
            Resolution::Failed { name, kind } => format!("Could not resolve {name} ({kind})"),
        }
    }

    /// Whether the event closes a step (`done` on the `progress` event).
    pub fn done(&self) -> Option<bool> {
        match self {
            Resolution::Started { .. } => None,
            Resolution::Finished { .. } => Some(true),
            Resolution::Failed { .. } => Some(false),
        }
    }
}

/// What a chunk of output held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Resolutions started or ended, in order.
    pub resolutions: Vec<Resolution>,
    /// Whether anything in it is the application's own output (text that is
    /// neither a resolution line nor terminal control sequences).
    pub app_output: bool,
}

/// Reads one terminal stream, line by line across chunks.
#[derive(Debug, Default)]
pub struct ResolutionScanner {
    /// The unfinished last line of what was read so far.
    partial: Vec<u8>,
    /// Controllers being resolved, by their key (`kind` + `name`): a line
    /// redrawn does not start a second one.
    in_flight: Vec<(String, String)>,
}

impl ResolutionScanner {
    /// Reads `bytes`, the next chunk of the stream.
    pub fn feed(&mut self, bytes: &[u8]) -> Scan {
        let mut scan = Scan::default();
        let mut rest = bytes;
        while let Some(end) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let (line, tail) = rest.split_at(end);
            rest = &tail[1..];
            if self.partial.is_empty() {
                self.read_line(line, &mut scan);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.read_line(&whole, &mut scan);
            }
        }
        if !rest.is_empty() {
            if self.partial.len() + rest.len() > MAX_PARTIAL_LINE {
                // Too long to be a resolution line: whatever it is, it is
                // the application's.
                self.partial.clear();
                scan.app_output |= !visible_text(rest).trim().is_empty();
            } else {
                self.partial.extend_from_slice(rest);
                // A character cut by the chunk's end is read with the next.
                let whole = match std::str::from_utf8(&self.partial) {
                    Err(err) if err.error_len().is_none() => &self.partial[..err.valid_up_to()],
                    _ => &self.partial[..],
                };
                let text = visible_text(whole);
                let text = text.trim_start();
                // A line that may yet turn out a resolution line is not
                // counted until it ends.
                if !text.is_empty() && !starts_with_marker(text) {
                    scan.app_output = true;
                }
            }
        }
        scan
    }

    fn read_line(&mut self, line: &[u8], scan: &mut Scan) {
        // Most lines are the application's: without a marker a line is no
        // resolution, and once a chunk is known to hold output its other
        // lines need not be read at all.
        if !has_marker(line) {
            if !scan.app_output {
                scan.app_output = !visible_text(line).trim().is_empty();
            }
            return;
        }
        let text = visible_text(line);
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        match parse_line(text) {
            Some(Line::Working { name, kind }) => {
                let key = (kind.clone(), name.clone());
                if !self.in_flight.contains(&key) {
                    self.in_flight.push(key);
                    scan.resolutions.push(Resolution::Started { name, kind });
                }
            }
            Some(Line::Done { name, kind, took }) => {
                self.settle(&kind, &name);
                scan.resolutions
                    .push(Resolution::Finished { name, kind, took });
            }
            Some(Line::Failed { name, kind }) => {
                self.settle(&kind, &name);
                scan.resolutions.push(Resolution::Failed { name, kind });
            }
            None => scan.app_output = true,
        }
    }

    fn settle(&mut self, kind: &str, name: &str) {
        self.in_flight.retain(|(k, n)| k != kind || n != name);
    }

    /// Whether a resolution started and has not ended.
    pub fn is_resolving(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Gives back spare memory (an idle session's).
    pub fn release_spare_capacity(&mut self) {
        self.partial.shrink_to_fit();
        self.in_flight.shrink_to_fit();
    }
}

/// Whether `bytes` hold anything that is not a resolution line, nor blank,
/// nor terminal control: what a reader of the stream that keeps no state
/// sees as the application having written something.
pub fn holds_app_output(bytes: &[u8]) -> bool {
    ResolutionScanner::default().feed(bytes).app_output
}

enum Line {
    Working {
        name: String,
        kind: String,
    },
    Done {
        name: String,
        kind: String,
        took: Option<String>,
    },
    Failed {
        name: String,
        kind: String,
    },
}

const WORKING: char = '⬇';
const DONE: char = '✓';
const FAILED: char = '✗';

/// Whether `bytes` hold one of the markers' UTF-8 encodings.
fn has_marker(bytes: &[u8]) -> bool {
    const MARKERS: [&[u8]; 3] = ["⬇".as_bytes(), "✓".as_bytes(), "✗".as_bytes()];
    bytes.windows(3).any(|window| MARKERS.contains(&window))
}

fn starts_with_marker(text: &str) -> bool {
    text.starts_with([WORKING, DONE, FAILED])
}

/// `⬇ <purl> <work>…`, `✓ <purl> (<where>, <took>)`, `✗ <purl>`.
fn parse_line(text: &str) -> Option<Line> {
    let mut chars = text.chars();
    let marker = chars.next()?;
    let body = chars.as_str();
    if !body.starts_with(char::is_whitespace) {
        return None;
    }
    let mut words = body.split_whitespace();
    let purl = words.next()?;
    let (name, kind) = controller_name(purl)?;
    match marker {
        WORKING => {
            let work = words.next()?.trim_end_matches('…').trim_end_matches("...");
            if words.next().is_some() {
                return None;
            }
            let kind = match work {
                "npm-install" => "npm".to_owned(),
                "source-build" => "build".to_owned(),
                other if !other.is_empty() => other.to_owned(),
                _ => kind,
            };
            Some(Line::Working { name, kind })
        }
        DONE => {
            let rest: Vec<&str> = words.collect();
            let rest = rest.join(" ");
            let took = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|inner| inner.rsplit_once(", "))
                .map(|(_, took)| took.to_owned())
                .filter(|took| is_duration(took));
            if !rest.is_empty() && !rest.starts_with('(') {
                return None;
            }
            Some(Line::Done { name, kind, took })
        }
        FAILED => Some(Line::Failed { name, kind }),
        _ => None,
    }
}

/// A controller's display name and the kind of work its scheme implies:
/// `npm:@telorun/http-server@0.28.0#http-server-api` → `http-server`,
/// `npm`; `telo:local/js#WritelineController` → `WritelineController`,
/// `build`. The `pkg:` forms `telo install` prints are read the same way.
fn controller_name(purl: &str) -> Option<(String, String)> {
    let purl = purl.strip_prefix("pkg:").unwrap_or(purl);
    let (scheme, rest) = purl.split_once([':', '/'])?;
    let (location, fragment) = match rest.split_once('#') {
        Some((location, fragment)) => (location, Some(fragment)),
        None => (rest, None),
    };
    let location = location.split('?').next().unwrap_or(location);
    match scheme {
        "npm" => {
            // `@scope/name@version` or `name@version`.
            let unversioned = match location.strip_prefix('@') {
                Some(scoped) => scoped.split_once('@').map_or(scoped, |(name, _)| name),
                None => location.split_once('@').map_or(location, |(name, _)| name),
            };
            let name = unversioned.rsplit('/').next().unwrap_or(unversioned);
            (!name.is_empty()).then(|| (name.to_owned(), "npm".to_owned()))
        }
        _ => {
            let name = fragment
                .filter(|f| !f.is_empty())
                .unwrap_or_else(|| location.rsplit('/').next().unwrap_or(location));
            (!name.is_empty()).then(|| (name.to_owned(), "build".to_owned()))
        }
    }
}

/// `57ms`, `1.3s`.
fn is_duration(text: &str) -> bool {
    let number = text
        .strip_suffix("ms")
        .or_else(|| text.strip_suffix('s'))
        .unwrap_or_default();
    !number.is_empty() && number.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// What of `bytes` a terminal shows as text: escape sequences and other
/// control characters removed, invalid UTF-8 replaced.
fn visible_text(bytes: &[u8]) -> String {
    strip_escapes(&String::from_utf8_lossy(bytes))
        .chars()
        .filter(|c| !c.is_control() || *c == '\t')
        .collect()
}

/// Removes terminal escape sequences (colours, cursor moves, titles) and
/// carriage returns from `text`; other characters stay.
pub fn strip_escapes(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                // CSI: parameters, then one final byte in '@'..='~'.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC: up to BEL or ESC '\'.
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\r' => {}
            c => plain.push(c),
        }
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the real kernel (0.81) printed on a terminal for a cold start
    /// of an HTTP app, byte for byte.
    const REAL_COLD_HTTP: &[u8] = b"  \x1b[2m\xe2\xac\x87\x1b[0m telo:local/js#Value \x1b[2msource-build\xe2\x80\xa6\x1b[0m\r\n\
\x1b[1A\x1b[1G\x1b[2K  \x1b[32m\xe2\x9c\x93\x1b[0m telo:local/js#Value \x1b[2m(local, 35ms)\x1b[0m\r\n\
  \x1b[2m\xe2\xac\x87\x1b[0m npm:@telorun/http-server@0.28.0#http-server-api \x1b[2mnpm-install\xe2\x80\xa6\x1b[0m\r\n\
\x1b[1A\x1b[1G\x1b[2K  \x1b[2m\xe2\xac\x87\x1b[0m npm:@telorun/http-server@0.28.0#http-server-api \x1b[2mnpm-install\xe2\x80\xa6\x1b[0m\r\n\
\x1b[1A\x1b[1G\x1b[2K  \x1b[32m\xe2\x9c\x93\x1b[0m npm:@telorun/http-server@0.28.0#http-server-api \x1b[2m(local, 866ms)\x1b[0m\r\n";

    fn started(name: &str, kind: &str) -> Resolution {
        Resolution::Started {
            name: name.into(),
            kind: kind.into(),
        }
    }

    fn finished(name: &str, kind: &str, took: &str) -> Resolution {
        Resolution::Finished {
            name: name.into(),
            kind: kind.into(),
            took: Some(took.into()),
        }
    }

    #[test]
    fn the_real_kernels_cold_start_lines_are_resolutions_not_output() {
        let scan = ResolutionScanner::default().feed(REAL_COLD_HTTP);
        assert_eq!(
            scan.resolutions,
            vec![
                started("Value", "build"),
                finished("Value", "build", "35ms"),
                started("http-server", "npm"),
                finished("http-server", "npm", "866ms"),
            ]
        );
        assert!(!scan.app_output);
        let messages: Vec<String> = scan.resolutions.iter().map(Resolution::message).collect();
        assert_eq!(
            messages,
            [
                "Resolving Value (build)…",
                "Resolved Value (build, 35ms)",
                "Resolving http-server (npm)…",
                "Resolved http-server (npm, 866ms)",
            ]
        );
    }

    #[test]
    fn the_same_lines_split_anywhere_read_the_same() {
        let whole = ResolutionScanner::default().feed(REAL_COLD_HTTP);
        for split in 1..REAL_COLD_HTTP.len() {
            let mut scanner = ResolutionScanner::default();
            let first = scanner.feed(&REAL_COLD_HTTP[..split]);
            let second = scanner.feed(&REAL_COLD_HTTP[split..]);
            assert!(!first.app_output && !second.app_output, "split at {split}");
            let mut resolutions = first.resolutions;
            resolutions.extend(second.resolutions);
            assert_eq!(resolutions, whole.resolutions, "split at {split}");
        }
    }

    #[test]
    fn application_output_is_output_even_mid_line() {
        let mut scanner = ResolutionScanner::default();
        assert!(scanner.feed(b"Name: ").app_output);
        assert!(scanner.feed(b"\r\n").resolutions.is_empty());
        let scan = ResolutionScanner::default().feed(
            "  ⬇ telo:local/js#WritelineController source-build…\r\nHello from Telo!\r\n"
                .as_bytes(),
        );
        assert!(scan.app_output);
        assert_eq!(
            scan.resolutions,
            vec![started("WritelineController", "build")]
        );
        // Colour and blank lines alone are not output.
        assert!(!holds_app_output(b"\x1b[0m\r\n  \r\n"));
        assert!(holds_app_output("✓ is a tick\n".as_bytes()));
    }

    #[test]
    fn a_long_line_is_output_and_not_kept() {
        let mut scanner = ResolutionScanner::default();
        let long = vec![b'x'; MAX_PARTIAL_LINE + 1];
        assert!(scanner.feed(&long).app_output);
        assert!(scanner.partial.is_empty());
        let spaces = vec![b' '; MAX_PARTIAL_LINE + 1];
        assert!(!scanner.feed(&spaces).app_output);
    }

    #[test]
    fn fake_telos_lines_and_install_lines_are_read_too() {
        let scan = ResolutionScanner::default().feed(
            "  ⬇ npm:x@1#y npm-install…\n  ✓ npm:x@1#y (local, 1.3s)\n  ✗  pkg:telo/local/js?path=./run.mjs#Choice\n  ✓  pkg:npm/@telorun/http-server@0.28.0?local_path=./nodejs#http-server\n"
                .as_bytes(),
        );
        assert_eq!(
            scan.resolutions,
            vec![
                started("x", "npm"),
                finished("x", "npm", "1.3s"),
                Resolution::Failed {
                    name: "Choice".into(),
                    kind: "build".into()
                },
                Resolution::Finished {
                    name: "http-server".into(),
                    kind: "npm".into(),
                    took: None
                },
            ]
        );
        assert!(!scan.app_output);
    }

    #[test]
    fn resolving_lasts_from_the_first_line_to_its_end() {
        let mut scanner = ResolutionScanner::default();
        scanner.feed("  ⬇ npm:x@1#y npm-install…\r\n".as_bytes());
        assert!(scanner.is_resolving());
        scanner.feed("  ✓ npm:x@1#y (local, 2.0s)\r\n".as_bytes());
        assert!(!scanner.is_resolving());
    }
}
