use super::*;

/// A CRI log of `output` as far as it was written: line ends kept as
/// `\n`, an unfinished last line held back.
fn cri_log(output: &[u8]) -> Vec<u8> {
    let complete = output
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let mut log = Vec::new();
    for line in output[..complete].split_inclusive(|&b| b == b'\n') {
        let body = &line[..line.len() - 1];
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        log.extend_from_slice(body);
        log.push(b'\n');
    }
    log
}

#[test]
fn the_log_keeps_line_ends_without_their_carriage_returns() {
    assert_eq!(normalize(b"a\r\nb\nc\rd\r\r\ne\r"), b"a\nb\nc\rd\ne");
    assert_eq!(cri_log(b"a\r\nb\r\r\nc"), b"a\nb\r\n");
    assert_eq!(symbol_offset(b"a\r\nb", 1), 1);
    assert_eq!(symbol_offset(b"a\r\nb", 2), 3);
    assert_eq!(symbol_offset(b"a\r\nb", 3), 4);
}

#[test]
fn distinct_output_is_found_once() {
    let log = b"line 1\r\nline 2\r\nline 3\r\n";
    assert_eq!(locate(log, 0, b"line 2\r\n"), Located::Unique(8));
    assert_eq!(locate(log, 0, b"line 1\r\nline 2"), Located::Unique(0));
    // As a CRI log keeps it.
    assert_eq!(locate(&cri_log(log), 0, b"line 3\r\n"), Located::Unique(14));
}

#[test]
fn repeated_output_is_ambiguous_unless_the_floor_rules_it_out() {
    let log = b"> \r\n> \r\n> ";
    assert_eq!(locate(log, 0, b"> "), Located::Ambiguous { last: 8 });
    assert_eq!(locate(log, 5, b"> "), Located::Unique(8));
}

#[test]
fn an_unfinished_line_may_be_missing_from_a_log_that_ends_a_line() {
    // The attach got the prompt; the CRI log has not written it.
    // Where in that line it began cannot be told.
    assert_eq!(
        locate(b"banner\n", 0, b"prompt> "),
        Located::Beyond { end: 7 }
    );
    // Unless part of it ends the log.
    assert_eq!(locate(b"banner\n", 0, b"ner\nprompt> "), Located::Unique(3));
    // A log that shows an unfinished line holds nothing back.
    assert_eq!(
        locate(b"banner\r\nprompt> ", 0, b"prompt> "),
        Located::Unique(8)
    );
    // Output with a line end cannot be held back whole.
    assert_eq!(locate(b"banner\n", 0, b"next\r\n"), Located::Nowhere);
}

#[test]
fn the_delivered_output_is_found_in_a_log_that_dropped_its_carriage_returns() {
    let mut delivered = Delivered::default();
    delivered.record(b"line 1\r\nline 2\r\n");
    assert_eq!(delivered.position_in(b"line 1\r\nline 2\r\nmore"), Some(16));
    assert_eq!(delivered.position_in(b"line 1\nline 2\nmore"), Some(14));
    assert_eq!(delivered.position_in(b"other"), None);
    let mut half = Delivered::default();
    half.record(b"line 1\r");
    assert_eq!(half.position_in(b"line 1\r\nx"), Some(7));
    assert_eq!(half.position_in(b"line 1\nx"), Some(6));
}

fn apply(parts: Vec<Bytes>, out: &mut Vec<u8>, delivered: &mut Delivered) {
    for part in parts {
        delivered.record(&part);
        out.extend_from_slice(&part);
    }
}

/// The relay of one attach over `output` written in `chunks`, the attach
/// hooked up from chunk `attached`, the first log read made after chunk
/// `first_read`, and each attach chunk searched for in a log read made
/// `lag[i]` chunks after it arrived. Returns what was relayed and
/// whether the place was guessed.
fn relay(
    chunks: &[Vec<u8>],
    attached: usize,
    first_read: usize,
    lag: &[usize],
    cri: bool,
) -> (Vec<u8>, bool) {
    // The log after `n` chunks; at the end (the container exited) a CRI
    // log writes its unfinished last line too.
    let log_after = |n: usize| {
        let written: Vec<u8> = chunks[..n.min(chunks.len())].concat();
        match (cri, n >= chunks.len()) {
            (false, _) => written,
            (true, false) => cri_log(&written),
            (true, true) => {
                let complete = written
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                [cri_log(&written), written[complete..].to_vec()].concat()
            }
        }
    };
    let mut delivered = Delivered::default();
    let mut out = Vec::new();
    let mut splice = Splice::default();
    // Reads are made one after the other: none sees less than the last.
    let mut last_read = first_read;
    let parts = splice.log_read(&log_after(first_read), &delivered, 0, false);
    apply(parts, &mut out, &mut delivered);
    for (i, chunk) in chunks.iter().enumerate().skip(attached) {
        if let Some(live) = splice.attach_output(Bytes::from(chunk.clone())) {
            apply(vec![live], &mut out, &mut delivered);
        }
        if splice.wants_search() {
            last_read = last_read.max(i + 1 + lag.get(i).copied().unwrap_or(0));
            let read = last_read;
            let n = splice.window_len();
            let parts = splice.log_read(&log_after(read), &delivered, n, false);
            apply(parts, &mut out, &mut delivered);
        }
    }
    if !splice.is_placed() {
        let parts = splice.finish(Some(&log_after(chunks.len())), &delivered);
        apply(parts, &mut out, &mut delivered);
    }
    (out, splice.guessed())
}

#[test]
fn start_output_racing_the_attach_is_relayed_once() {
    let chunks: Vec<Vec<u8>> = (1..=3)
        .map(|n| format!("line {n}\r\n").into_bytes())
        .collect();
    let whole = chunks.concat();
    for attached in 0..=3 {
        for first_read in 0..=3 {
            for lag in 0..3 {
                for cri in [false, true] {
                    let (out, guessed) = relay(&chunks, attached, first_read, &[lag; 3], cri);
                    assert!(!guessed);
                    if cri {
                        assert_eq!(
                            normalize(&out),
                            normalize(&whole),
                            "{attached} {first_read} {lag}"
                        );
                    } else {
                        assert_eq!(out, whole, "{attached} {first_read} {lag}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_pod_gone_before_the_attach_was_placed_still_relays_what_came_live() {
    let mut delivered = Delivered::default();
    let mut splice = Splice::default();
    let parts = splice.log_read(b"up\r\n", &delivered, 0, false);
    for part in &parts {
        delivered.record(part);
    }
    splice.attach_output(Bytes::from_static(b"up\r\nStopped listening\r\n"));
    // The stop deleted the pod: its log is gone.
    let rest = splice.finish(Some(b""), &delivered);
    assert_eq!(rest.concat(), b"Stopped listening\r\n");
    let mut other = Splice::default();
    other.log_read(b"up\r\n", &Delivered::default(), 0, false);
    other.attach_output(Bytes::from_static(b"bye\r\n"));
    assert_eq!(other.finish(None, &delivered).concat(), b"bye\r\n");
}

#[test]
fn what_a_placement_passes_on_from_the_window_is_told_apart_from_the_log() {
    let mut delivered = Delivered::default();
    let mut splice = Splice::default();
    let parts = splice.log_read(b"a\n", &delivered, 0, false);
    assert_eq!(splice.take_window_relayed(), 0);
    for part in &parts {
        delivered.record(part);
    }
    splice.attach_output(Bytes::from_static(b"out\n"));
    splice.attach_output(Bytes::from_static(b"err\n"));
    // The log holds the attach's start once: the log up to it, then the
    // window less what the log already relayed.
    let parts = splice.log_read(b"a\nb\nout\nerr\n", &delivered, 8, false);
    assert!(splice.is_placed());
    assert_eq!(parts.concat(), b"b\nout\nerr\n");
    assert_eq!(splice.take_window_relayed(), 8);
    assert_eq!(parts.last().map(Bytes::len), Some(8));
    assert_eq!(splice.take_window_relayed(), 0);
    // A window the log had already relayed whole passes nothing on.
    let mut delivered = Delivered::default();
    let mut splice = Splice::default();
    for part in splice.log_read(b"x\ny\n", &delivered, 0, false) {
        delivered.record(&part);
    }
    splice.attach_output(Bytes::from_static(b"y\n"));
    let parts = splice.log_read(b"x\ny\n", &delivered, 2, true);
    assert!(splice.is_placed());
    assert!(parts.is_empty());
    assert_eq!(splice.take_window_relayed(), 0);
}

#[test]
fn at_the_end_a_log_that_holds_everything_is_relayed_from() {
    let mut delivered = Delivered::default();
    let mut splice = Splice::default();
    for part in splice.log_read(b"> ", &delivered, 0, false) {
        delivered.record(&part);
    }
    // Ambiguous: "> " is in the log twice past the floor.
    splice.attach_output(Bytes::from_static(b"> "));
    let rest = splice.finish(Some(b"> > > "), &delivered);
    assert_eq!(rest.concat(), b"> > ");
}

#[test]
fn skipping_the_relayed_part_handles_a_line_end_cut_in_two() {
    let mut skip = Skip::new(1, 1);
    // "a" then "\r" were relayed from the log; the live stream repeats
    // them and goes on with "\n".
    assert_eq!(skip.pass(Bytes::from_static(b"a\r")), None);
    assert_eq!(
        skip.pass(Bytes::from_static(b"\nb")).as_deref(),
        Some(&b"\nb"[..])
    );
    let mut across = Skip::new(3, 0);
    assert_eq!(across.pass(Bytes::from_static(b"x\r")), None);
    assert_eq!(
        across.pass(Bytes::from_static(b"\nyz")).as_deref(),
        Some(&b"z"[..])
    );
}

/// Everything happens in an order `steps` picks: the workload writes a
/// chunk, the attach delivers the next chunk it carries (those from
/// `attached` on), a log read is issued (the first one right after the
/// upgrade, the others to place the attach, once it delivered more), or
/// the read in flight returns the log as it is then.
fn relay_in_order(chunks: &[Vec<u8>], attached: usize, steps: &[u8], cri: bool) -> (Vec<u8>, bool) {
    let log_of = |written: usize, exited: bool| {
        let written: Vec<u8> = chunks[..written].concat();
        if !cri {
            return written;
        }
        let complete = written
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let tail = if exited {
            written[complete..].to_vec()
        } else {
            Vec::new()
        };
        [cri_log(&written), tail].concat()
    };
    let mut delivered = Delivered::default();
    let mut out = Vec::new();
    let mut splice = Splice::default();
    let (mut written, mut arrived) = (0, attached);
    let mut first_read_done = false;
    let mut in_flight: Option<usize> = None;
    for &step in steps {
        match step % 4 {
            0 if written < chunks.len() => written += 1,
            1 if arrived < written => {
                if let Some(live) = splice.attach_output(Bytes::from(chunks[arrived].clone())) {
                    apply(vec![live], &mut out, &mut delivered);
                }
                arrived += 1;
            }
            2 if in_flight.is_none() && (!first_read_done || splice.wants_search()) => {
                in_flight = Some(if first_read_done {
                    splice.window_len()
                } else {
                    0
                });
                first_read_done = true;
            }
            3 => {
                if let Some(window) = in_flight.take() {
                    let parts = splice.log_read(&log_of(written, false), &delivered, window, false);
                    apply(parts, &mut out, &mut delivered);
                }
            }
            _ => {}
        }
    }
    if let Some(window) = in_flight.take() {
        let parts = splice.log_read(&log_of(written, false), &delivered, window, false);
        apply(parts, &mut out, &mut delivered);
    }
    // The container writes the rest and exits; the attach delivers it.
    written = chunks.len();
    while arrived < written {
        if let Some(live) = splice.attach_output(Bytes::from(chunks[arrived].clone())) {
            apply(vec![live], &mut out, &mut delivered);
        }
        arrived += 1;
    }
    if !splice.is_placed() {
        let parts = splice.finish(Some(&log_of(written, true)), &delivered);
        apply(parts, &mut out, &mut delivered);
    }
    (out, splice.guessed())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Whatever the output (repeats, line ends, carriage returns), the
    /// timing of the attach and of the log reads: a place that was found
    /// relays every byte exactly once.
    #[test]
    fn a_found_place_relays_everything_once(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', b'\r', b'\n']), 1..6), 1..12),
        attached in 0usize..12,
        first_read in 0usize..12,
        lag in proptest::collection::vec(0usize..4, 12),
        cri in proptest::bool::ANY,
    ) {
        let attached = attached.min(chunks.len());
        let whole = chunks.concat();
        let (out, guessed) = relay(&chunks, attached, first_read, &lag, cri);
        if !guessed {
            if cri {
                // What came from the log has its line ends as the log
                // keeps them.
                proptest::prop_assert_eq!(normalize(&out), normalize(&whole));
            } else {
                proptest::prop_assert_eq!(out, whole);
            }
        }
    }

    /// The same, with reads and attach bytes interleaved every way.
    #[test]
    fn a_found_place_relays_everything_once_in_any_order(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', b'\r', b'\n']), 1..6), 1..10),
        attached in 0usize..10,
        steps in proptest::collection::vec(0u8..4, 0..60),
        cri in proptest::bool::ANY,
    ) {
        let attached = attached.min(chunks.len());
        let whole = chunks.concat();
        let (out, guessed) = relay_in_order(&chunks, attached, &steps, cri);
        if !guessed {
            if cri {
                proptest::prop_assert_eq!(normalize(&out), normalize(&whole));
            } else {
                proptest::prop_assert_eq!(out, whole);
            }
        }
    }

    /// Numbered lines never need a guess.
    #[test]
    fn numbered_lines_are_always_placed(
        lines in 1usize..8,
        attached in 0usize..8,
        first_read in 0usize..8,
        lag in proptest::collection::vec(0usize..4, 8),
        steps in proptest::collection::vec(0u8..4, 0..40),
        cri in proptest::bool::ANY,
    ) {
        let chunks: Vec<Vec<u8>> = (1..=lines).map(|n| format!("line {n}\r\n").into_bytes()).collect();
        let whole = chunks.concat();
        for (out, guessed) in [
            relay(&chunks, attached.min(lines), first_read, &lag, cri),
            relay_in_order(&chunks, attached.min(lines), &steps, cri),
        ] {
            proptest::prop_assert!(!guessed);
            if cri {
                proptest::prop_assert_eq!(normalize(&out), normalize(&whole));
            } else {
                proptest::prop_assert_eq!(&out, &whole);
            }
        }
    }
}
