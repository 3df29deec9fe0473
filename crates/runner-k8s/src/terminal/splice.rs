//! Where a terminal's live attach stream joins the container log, so that
//! every byte the container wrote reaches the session exactly once.
//!
//! What a real cluster guarantees, and what it does not:
//!
//! * An attach delivers what the container writes from the moment the
//!   runtime hooks the stream up — and that moment is *after* the client got
//!   its `101 Switching Protocols`: the apiserver answers the upgrade, then
//!   dials the kubelet, which asks the runtime to attach. Nothing marks that
//!   moment in the stream (the first, empty frame is sent before it). So a
//!   log read made right after the upgrade may end before the attach begins
//!   (bytes in between are in neither) or after it (bytes in both).
//! * The log holds everything, but its lines are written by the runtime after
//!   it read them: containerd stores each line without its `\r\n` / `\n` and
//!   reads it back with `\n`, and keeps a line that has no end yet until it
//!   gets one (or fills its buffer, or the container exits). Timestamps are
//!   per line and from the node's clock, so they cannot tell where, inside a
//!   line, an attach began, nor be compared with the runner's clock.
//! * A log read *issued after* some attach bytes arrived holds those bytes
//!   (they were written before they were sent), except an unfinished last
//!   line.
//!
//! So the runner never guesses from timing. Until the attach's first bytes
//! are placed in the log, the log is the source of output: it is read once
//! the attach is open, once more a moment later, and at the end. When attach
//! bytes arrive, a log read issued after them is searched for them — from
//! where the output delivered before this attach ended, since that came
//! before the attach was asked for. Line ends are compared the way the log
//! keeps them (`\r`s before a `\n` dropped), and an unfinished last line may
//! be missing from the log. When exactly one position fits, the attach's
//! place is known: the log is relayed up to it, the attach from it, and the
//! live stream from then on. While several fit (output that repeats itself)
//! the log stays the source and the search is retried with more attach
//! bytes; only when that keeps failing does the runner pick the last
//! position that fits, which can repeat output but never drops it.

use bytes::Bytes;

/// How much of the delivered output's end is kept to find it again in a log
/// read that does not start where the first one did (a rotated log).
const DELIVERED_TAIL_BYTES: usize = 256;
/// Searches for the attach's place before the last position that fits is
/// taken (each costs one log read).
pub const PLACEMENT_ATTEMPTS: u32 = 6;
/// Attach bytes past which more of them are not expected to single out one
/// position: output this long that fits in several places repeats itself.
const DECISIVE_WINDOW_BYTES: usize = 64 * 1024;
/// Attach bytes held while unplaced before they are relayed anyway.
pub const MAX_WINDOW_BYTES: usize = 4 * 1024 * 1024;

/// What reached the session so far — as much of it as is needed to find
/// where it ends in a fresh read of the container log.
#[derive(Debug, Default)]
pub struct Delivered {
    count: usize,
    tail: Vec<u8>,
}

impl Delivered {
    pub fn record(&mut self, bytes: &[u8]) {
        self.count += bytes.len();
        self.tail
            .extend_from_slice(&bytes[bytes.len().saturating_sub(DELIVERED_TAIL_BYTES)..]);
        let excess = self.tail.len().saturating_sub(DELIVERED_TAIL_BYTES);
        self.tail.drain(..excess);
    }

    /// Whether nothing was delivered yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The last bytes delivered.
    pub fn tail(&self) -> &[u8] {
        &self.tail
    }

    /// Where in `log` (the container's whole output, as read) the delivered
    /// output ends: after as many bytes as were delivered when the log
    /// agrees (the usual case), else after the last place its tail appears,
    /// line ends compared as the log keeps them (output relayed from an
    /// attach carries the `\r`s a CRI log drops, and a rotated log starts
    /// later). `None` when the tail is nowhere in it.
    pub fn position_in(&self, log: &[u8]) -> Option<usize> {
        if self.count == 0 {
            return Some(0);
        }
        if self.count <= log.len() && log[..self.count].ends_with(&self.tail) {
            return Some(self.count);
        }
        let pattern = normalize(&self.tail);
        if pattern.is_empty() {
            return None;
        }
        let failure = failure_function(&pattern);
        let mut matched = 0;
        let mut end = None;
        for symbol in Symbols::new(log) {
            matched = advance(&pattern, &failure, matched, symbol.byte);
            if matched == pattern.len() {
                end = Some(symbol.end);
                matched = failure[matched - 1];
            }
        }
        // `\r`s that ended the tail were delivered too; in the log they come
        // right after the match (or are absent from a CRI log).
        let pending = trailing_crs(&self.tail);
        end.map(|end| end + leading_crs(&log[end..]).min(pending))
    }
}

/// Where the attach stream stands in the output.
#[derive(Debug)]
enum State {
    /// Its place in the log is not known yet: the log is the source, and
    /// what arrived live waits in `window`.
    Unplaced,
    /// Placed: live bytes pass, less what the log already delivered.
    Placed(Skip),
}

/// One attach's join with the log.
#[derive(Debug)]
pub struct Splice {
    /// Where the output delivered before this attach was asked for ends in
    /// the log: the attach cannot start before it.
    floor: Option<usize>,
    /// Every byte the attach delivered, while it is unplaced.
    window: Vec<u8>,
    state: State,
    attempts: u32,
    /// Window length at the last search: a search with no more bytes would
    /// find what the last one found.
    searched: usize,
    /// Whether the place was taken as the last that fits rather than found.
    guessed: bool,
    /// Whether the last search found the attach maybe wholly in a line the
    /// log has not written yet.
    beyond: bool,
    /// How many bytes of what the last call returned came from the window
    /// (its last part): live bytes rather than the log's.
    window_relayed: usize,
}

impl Default for Splice {
    fn default() -> Self {
        Self {
            floor: None,
            window: Vec::new(),
            state: State::Unplaced,
            attempts: 0,
            searched: 0,
            guessed: false,
            beyond: false,
            window_relayed: 0,
        }
    }
}

impl Splice {
    pub fn is_placed(&self) -> bool {
        matches!(self.state, State::Placed(_))
    }

    /// Whether the attach's place was taken as the last position that fits
    /// (output that repeats itself), not found.
    pub fn guessed(&self) -> bool {
        self.guessed
    }

    /// Whether the attach may have begun in a line the log holds back until
    /// it ends (a prompt): only more output, or giving up, places it.
    pub fn awaits_unfinished_line(&self) -> bool {
        !self.is_placed() && self.beyond
    }

    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How many bytes at the end of what was last returned (by
    /// [`Splice::log_read`], [`Splice::finish`] or [`Splice::place_unseen`])
    /// are the attach's own — the end of its window, passed on when it was
    /// placed — rather than the log's; then zero until the next placement.
    pub fn take_window_relayed(&mut self) -> usize {
        std::mem::take(&mut self.window_relayed)
    }

    /// Attach bytes waiting to be placed.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Whether a log read now could place the attach: it is unplaced and
    /// more of it arrived since the last search.
    pub fn wants_search(&self) -> bool {
        !self.is_placed() && self.window.len() > self.searched
    }

    /// Live output from the attach: what passes on once placed (nothing
    /// while unplaced: it waits to be placed).
    pub fn attach_output(&mut self, chunk: Bytes) -> Option<Bytes> {
        match &mut self.state {
            State::Placed(skip) => skip.pass(chunk),
            State::Unplaced => {
                self.window.extend_from_slice(&chunk);
                None
            }
        }
    }

    /// A read of the whole log, issued once `window_at_issue` attach bytes
    /// had arrived (0: the read after the upgrade, a settling read or the
    /// last one). `decide`: the attach has waited long enough — take the
    /// last place that fits if none is certain. Returns what to relay, in
    /// order.
    pub fn log_read(
        &mut self,
        log: &[u8],
        delivered: &Delivered,
        window_at_issue: usize,
        decide: bool,
    ) -> Vec<Bytes> {
        if self.is_placed() {
            return Vec::new();
        }
        let at = delivered.position_in(log);
        // The first read of this attach: nothing was relayed since the
        // attach was asked for, so what was relayed precedes it.
        let floor = *self.floor.get_or_insert(at.unwrap_or(log.len()));
        let window_at_issue = window_at_issue.min(self.window.len());
        if window_at_issue > self.searched || (decide && window_at_issue > 0) {
            self.attempts += 1;
            self.searched = window_at_issue;
            let last_try = decide
                || self.attempts >= PLACEMENT_ATTEMPTS
                || window_at_issue >= DECISIVE_WINDOW_BYTES;
            let located = locate(log, floor.min(log.len()), &self.window[..window_at_issue]);
            self.beyond = matches!(located, Located::Beyond { .. });
            match located {
                Located::Unique(start) => return self.place(log, start, at),
                Located::Ambiguous { last } | Located::Beyond { end: last } if last_try => {
                    self.guessed = true;
                    return self.place(log, last, at);
                }
                Located::Nowhere if last_try => {
                    // The log does not hold what the attach delivered (it
                    // was rotated away): the attach is all there is.
                    self.guessed = true;
                    let after = at.unwrap_or(log.len());
                    return self.place(log, after, Some(after));
                }
                Located::Ambiguous { .. } | Located::Beyond { .. } | Located::Nowhere => {}
            }
        }
        match at {
            Some(at) if at < log.len() => vec![Bytes::copy_from_slice(&log[at..])],
            _ => Vec::new(),
        }
    }

    /// The attach stream is over; `log` is a read made after it (`None`: it
    /// could not be read). Relays what is left: the log's rest when it
    /// holds what came live, else — the pod and its log are gone (a stopped
    /// session), or the log lost it — what came live, less the stretch of
    /// it that the relayed output already ends with.
    pub fn finish(&mut self, log: Option<&[u8]>, delivered: &Delivered) -> Vec<Bytes> {
        if self.is_placed() {
            return Vec::new();
        }
        if let Some(log) = log.filter(|log| !log.is_empty()) {
            let at = delivered.position_in(log);
            let floor = *self.floor.get_or_insert(at.unwrap_or(log.len()));
            if self.window.is_empty() {
                return self.log_read(log, delivered, 0, false);
            }
            match locate(log, floor.min(log.len()), &self.window) {
                Located::Unique(start) => return self.place(log, start, at),
                // The log holds it all (the rest of an unfinished line comes
                // with the next read, after a re-attach).
                Located::Ambiguous { .. } | Located::Beyond { .. } => {
                    return self.log_read(log, delivered, 0, false);
                }
                Located::Nowhere => {}
            }
        }
        if self.window.is_empty() {
            return Vec::new();
        }
        self.guessed = true;
        let tail = delivered.tail();
        let overlap = longest_overlap(tail, &self.window);
        self.state = State::Placed(Skip::new(overlap, trailing_crs(tail)));
        self.take_window().into_iter().collect()
    }

    /// No log to place the attach in (it cannot be read, or too much
    /// arrived live meanwhile): what arrived live is relayed as it is, after
    /// what was relayed.
    pub fn place_unseen(&mut self) -> Vec<Bytes> {
        if self.is_placed() {
            return Vec::new();
        }
        self.guessed = true;
        self.state = State::Placed(Skip::default());
        self.take_window().into_iter().collect()
    }

    /// The attach starts at `start` in `log`; what was relayed ends at `at`.
    fn place(&mut self, log: &[u8], start: usize, at: Option<usize>) -> Vec<Bytes> {
        // The attach may begin between the `\r` and the `\n` of a line end
        // that the log holds whole.
        let start = start + leading_crs(&log[start..]).saturating_sub(leading_crs(&self.window));
        let at = at.unwrap_or(start);
        let mut out = Vec::new();
        let skip = if at <= start {
            if at < start {
                out.push(Bytes::copy_from_slice(&log[at..start]));
            }
            Skip::default()
        } else {
            let relayed = &log[start..at];
            Skip::new(Symbols::new(relayed).count(), trailing_crs(relayed))
        };
        self.state = State::Placed(skip);
        out.extend(self.take_window());
        out
    }

    fn take_window(&mut self) -> Option<Bytes> {
        let window = Bytes::from(std::mem::take(&mut self.window));
        let passed = match &mut self.state {
            State::Placed(skip) if !window.is_empty() => skip.pass(window),
            _ => None,
        };
        self.window_relayed = passed.as_ref().map_or(0, Bytes::len);
        passed
    }
}

/// Where the attach's first bytes are in a log.
#[derive(Debug, PartialEq, Eq)]
pub enum Located {
    /// At this offset, and nowhere else.
    Unique(usize),
    /// In several places (or in one, and maybe past the log's end); `last`
    /// is the last of them.
    Ambiguous {
        last: usize,
    },
    /// Maybe past the log's end, in the line it has not written yet: where
    /// in that line the attach began cannot be told. `end` is the log's end.
    Beyond {
        end: usize,
    },
    Nowhere,
}

/// Where in `log`, at `floor` or later, `window` (what an attach delivered
/// from its start) begins. Line ends are compared as a CRI log keeps them.
/// A log that ends with a complete line may hold back an unfinished one, so
/// the window may also run past the log's end by a stretch with no line end
/// in it: after a part that ends the log (then it is placed), or wholly
/// (then only more output can tell where).
pub fn locate(log: &[u8], floor: usize, window: &[u8]) -> Located {
    let pattern = normalize(window);
    let text = &log[floor..];
    if pattern.is_empty() {
        return Located::Beyond { end: log.len() };
    }
    let failure = failure_function(&pattern);
    let mut matched = 0;
    let mut symbols = 0;
    let mut candidates = 0usize;
    let mut first = None;
    let mut last = None;
    for symbol in Symbols::new(text) {
        matched = advance(&pattern, &failure, matched, symbol.byte);
        symbols += 1;
        if matched == pattern.len() {
            candidates += 1;
            first.get_or_insert(symbols - pattern.len());
            last = Some(symbols - pattern.len());
            matched = failure[matched - 1];
        }
    }
    let mut beyond = false;
    if log.last() == Some(&b'\n') {
        // Its first `overlap` symbols end the log; the rest is the line the
        // log has not written yet (so no line end in it), which then began
        // after the attach did.
        let mut overlap = matched;
        while overlap > 0 {
            if !pattern[overlap..].contains(&b'\n') {
                candidates += 1;
                // Later than any full match, and later for a shorter overlap.
                let start = symbols - overlap;
                first.get_or_insert(start);
                last = Some(start);
            }
            overlap = failure[overlap - 1];
        }
        // Or all of it is in that line.
        beyond = !pattern.contains(&b'\n');
    }
    let offset = |symbol: usize| floor + symbol_offset(text, symbol);
    match (candidates, beyond, first, last) {
        (0, true, _, _) => Located::Beyond { end: log.len() },
        (1, false, Some(only), _) => Located::Unique(offset(only)),
        (_, true, _, _) => Located::Ambiguous { last: log.len() },
        (_, false, _, Some(last)) => Located::Ambiguous { last: offset(last) },
        _ => Located::Nowhere,
    }
}

/// How many symbols (as a CRI log counts them) of `window`'s start `tail`
/// ends with, the longest such stretch.
fn longest_overlap(tail: &[u8], window: &[u8]) -> usize {
    let pattern = normalize(window);
    if pattern.is_empty() {
        return 0;
    }
    let failure = failure_function(&pattern);
    let mut matched = 0;
    let mut symbols = Symbols::new(tail).peekable();
    while let Some(symbol) = symbols.next() {
        matched = advance(&pattern, &failure, matched, symbol.byte);
        if matched == pattern.len() {
            if symbols.peek().is_none() {
                return matched;
            }
            matched = failure[matched - 1];
        }
    }
    matched
}

/// Drops what the log already relayed from the start of the live stream:
/// `symbols` bytes as the log counts them, then up to `crs` `\r`s (the log
/// relayed a line end's `\r` without its `\n`).
#[derive(Debug, Default)]
struct Skip {
    symbols: usize,
    crs: usize,
    /// `\r`s seen while skipping whose meaning waits on the next byte.
    held: usize,
}

impl Skip {
    fn new(symbols: usize, crs: usize) -> Self {
        Self {
            symbols,
            crs,
            held: 0,
        }
    }

    fn done(&self) -> bool {
        self.symbols == 0 && self.crs == 0 && self.held == 0
    }

    fn pass(&mut self, chunk: Bytes) -> Option<Bytes> {
        if self.done() {
            return (!chunk.is_empty()).then_some(chunk);
        }
        let mut kept: Vec<u8> = Vec::new();
        for (i, &byte) in chunk.iter().enumerate() {
            if self.symbols > 0 {
                match byte {
                    b'\r' => self.held += 1,
                    // A line end: its `\r`s and the `\n` are one symbol.
                    b'\n' => {
                        self.held = 0;
                        self.symbols -= 1;
                    }
                    _ => {
                        let count = self.held + 1;
                        if self.symbols >= count {
                            self.symbols -= count;
                            self.held = 0;
                        } else {
                            // Skipping ends among the held `\r`s.
                            let left = self.held - self.symbols;
                            let kept_crs = left - left.min(self.crs);
                            kept.extend(std::iter::repeat_n(b'\r', kept_crs));
                            self.symbols = 0;
                            self.crs = 0;
                            self.held = 0;
                            kept.extend_from_slice(&chunk[i..]);
                            return Some(Bytes::from(kept));
                        }
                    }
                }
                continue;
            }
            if byte == b'\r' && self.crs > 0 {
                self.crs -= 1;
                continue;
            }
            self.crs = 0;
            if kept.is_empty() {
                return Some(chunk.slice(i..));
            }
            kept.extend_from_slice(&chunk[i..]);
            return Some(Bytes::from(kept));
        }
        (!kept.is_empty()).then(|| Bytes::from(kept))
    }
}

/// One byte of output as a CRI log keeps it, and the raw bytes it stands
/// for.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    byte: u8,
    start: usize,
    end: usize,
}

/// The bytes of `raw` as a CRI log keeps them: `\r`s right before a `\n`
/// dropped. `\r`s at the very end are left out, since a `\n` may follow.
struct Symbols<'a> {
    raw: &'a [u8],
    at: usize,
    /// `\r`s of a run known not to end a line, still to yield.
    crs: usize,
}

impl<'a> Symbols<'a> {
    fn new(raw: &'a [u8]) -> Self {
        Self { raw, at: 0, crs: 0 }
    }
}

impl Iterator for Symbols<'_> {
    type Item = Symbol;

    fn next(&mut self) -> Option<Symbol> {
        let start = self.at;
        if self.crs > 0 {
            self.crs -= 1;
            self.at += 1;
            return Some(Symbol {
                byte: b'\r',
                start,
                end: self.at,
            });
        }
        let byte = *self.raw.get(start)?;
        if byte != b'\r' {
            self.at += 1;
            return Some(Symbol {
                byte,
                start,
                end: self.at,
            });
        }
        let run = leading_crs(&self.raw[start..]);
        match self.raw.get(start + run) {
            None => None,
            Some(b'\n') => {
                self.at = start + run + 1;
                Some(Symbol {
                    byte: b'\n',
                    start,
                    end: self.at,
                })
            }
            Some(_) => {
                self.crs = run - 1;
                self.at += 1;
                Some(Symbol {
                    byte: b'\r',
                    start,
                    end: self.at,
                })
            }
        }
    }
}

fn normalize(raw: &[u8]) -> Vec<u8> {
    Symbols::new(raw).map(|symbol| symbol.byte).collect()
}

/// The raw offset in `raw` where its `symbol`-th symbol starts (its end when
/// there are no more).
fn symbol_offset(raw: &[u8], symbol: usize) -> usize {
    let mut end = 0;
    for (index, s) in Symbols::new(raw).enumerate() {
        if index == symbol {
            return s.start;
        }
        end = s.end;
    }
    end
}

fn leading_crs(bytes: &[u8]) -> usize {
    bytes.iter().take_while(|&&b| b == b'\r').count()
}

fn trailing_crs(bytes: &[u8]) -> usize {
    bytes.iter().rev().take_while(|&&b| b == b'\r').count()
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

/// One Knuth–Morris–Pratt step: how much of `pattern` is matched after
/// `byte`, `matched` (less than the whole) having been before.
fn advance(pattern: &[u8], failure: &[usize], mut matched: usize, byte: u8) -> usize {
    while matched > 0 && byte != pattern[matched] {
        matched = failure[matched - 1];
    }
    if byte == pattern[matched] {
        matched += 1;
    }
    matched
}

#[cfg(test)]
mod tests;
