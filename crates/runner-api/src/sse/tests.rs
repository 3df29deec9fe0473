use super::*;

fn data_of(frames: Vec<SseFrame>) -> Vec<String> {
    frames.into_iter().filter_map(|frame| frame.data).collect()
}

#[test]
fn frames_split_across_chunks_are_joined() {
    let mut parser = SseParser::new(1024 * 1024);
    assert!(parser.push(b"data: {\"a\":").is_empty());
    assert_eq!(
        data_of(parser.push(b"1}\n\n: comment\n\ndata: 2\n")),
        vec!["{\"a\":1}"]
    );
    assert_eq!(data_of(parser.push(b"\n")), vec!["2"]);
}

#[test]
fn a_terminator_split_across_pushes_is_found() {
    let mut parser = SseParser::new(1024 * 1024);
    assert!(parser.push(b"data: a\r\n\r").is_empty());
    assert_eq!(data_of(parser.push(b"\n")), vec!["a"]);
    assert!(parser.push(b"data: b\n").is_empty());
    assert_eq!(data_of(parser.push(b"\ndata: c\n\n")), vec!["b", "c"]);
}

#[test]
fn a_frame_that_never_ends_is_dropped_and_memory_stays_bounded() {
    const LIMIT: usize = 1024 * 1024;
    let mut parser = SseParser::new(LIMIT);
    assert!(parser.push(b"data: ").is_empty());
    let chunk = vec![b'x'; 64 * 1024];
    for _ in 0..64 {
        assert!(parser.push(&chunk).is_empty());
        assert!(parser.pending_bytes() <= LIMIT + chunk.len());
    }
    // The oversized frame ends; it is dropped, and the next one is whole.
    assert!(parser.push(b"\n\n").is_empty());
    assert_eq!(
        data_of(parser.push(b"data: {\"ok\":1}\n\n")),
        vec!["{\"ok\":1}"]
    );
}

#[test]
fn multi_line_data_is_joined_with_newlines() {
    let mut parser = SseParser::new(1024 * 1024);
    assert_eq!(
        data_of(parser.push(b"event: x\ndata: a\ndata: b\r\n\r\n")),
        vec!["a\nb"]
    );
}

#[test]
fn ids_events_comments_and_unexpected_lines_are_kept_apart() {
    let mut parser = SseParser::new(1024 * 1024);
    assert!(parser.push(b"id: 1\nevent: status\nda").is_empty());
    let frames = parser.push(b"ta: {\"a\":1}\n\n: heartbeat\n\nevent: gap\ndata: {}\nretry: 5\n\n");
    assert_eq!(
        frames,
        [
            SseFrame {
                id: Some(1),
                event: Some("status".into()),
                data: Some("{\"a\":1}".into()),
                ..SseFrame::default()
            },
            SseFrame {
                comments: vec!["heartbeat".into()],
                ..SseFrame::default()
            },
            SseFrame {
                event: Some("gap".into()),
                data: Some("{}".into()),
                unexpected: vec!["retry: 5".into()],
                ..SseFrame::default()
            },
        ]
    );
    assert!(frames[0].is_event() && !frames[1].is_event());
}

#[test]
fn what_the_runner_writes_the_parser_reads_back() {
    let mut out = Vec::new();
    put_event(&mut out, 7, "status", b"{\"type\":\"status\"}");
    out.extend_from_slice(HEARTBEAT_FRAME);
    out.extend_from_slice(GAP_FRAME);
    let frames = SseParser::new(1024).push(&out);
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[0].id, Some(7));
    assert_eq!(frames[0].data.as_deref(), Some("{\"type\":\"status\"}"));
    assert_eq!(frames[1].comments, ["heartbeat"]);
    assert_eq!(frames[2].event.as_deref(), Some("gap"));
    assert_eq!(frames[2].id, None);
}

#[test]
fn resume_ids_parse_like_parse_int() {
    assert_eq!(parse_resume_id("12"), Some(12));
    assert_eq!(parse_resume_id("  7abc"), Some(7));
    assert_eq!(parse_resume_id("0"), Some(0));
    assert_eq!(parse_resume_id("-0"), Some(0));
    assert_eq!(parse_resume_id("-3"), None);
    assert_eq!(parse_resume_id("abc"), None);
    assert_eq!(parse_resume_id(""), None);
    assert_eq!(parse_resume_id("99999999999999999999999"), Some(u64::MAX));
}

/// Found by `resume_ids_follow_parse_int`: a `?lastEventId=%C2%855`
/// resumed from 5 (Rust trims U+0085, `parseInt` does not), and
/// `%EF%BB%BF5` replayed everything (`parseInt` trims U+FEFF).
#[test]
fn resume_ids_skip_javascript_whitespace_only() {
    assert_eq!(parse_resume_id("\u{85}5"), None);
    assert_eq!(parse_resume_id("\u{FEFF}5"), Some(5));
    assert_eq!(parse_resume_id("\u{3000}\u{A0}-0x"), Some(0));
}

/// `parseInt(raw, 10)`, then "finite and non-negative", written
/// independently of the implementation.
fn parse_int_model(raw: &str) -> Option<u64> {
    const JS_WHITESPACE: &str = "\u{9}\u{A}\u{B}\u{C}\u{D} \u{A0}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200A}\u{2028}\u{2029}\u{202F}\u{205F}\u{3000}\u{FEFF}";
    let rest: String = raw
        .chars()
        .skip_while(|c| JS_WHITESPACE.contains(*c))
        .collect();
    let (sign, rest) = match rest.chars().next() {
        Some(c @ ('-' | '+')) => (c, rest[1..].to_owned()),
        _ => ('+', rest),
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() {
        return None;
    }
    let value = digits.parse::<u64>().unwrap_or(u64::MAX);
    (sign == '+' || value == 0).then_some(value)
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(4096)
    ))]

    #[test]
    fn resume_ids_follow_parse_int(
        raw in "[ \t\u{85}\u{A0}\u{FEFF}\u{3000}\u{2028}]{0,3}[-+]{0,2}[0-9]{0,25}[a-z.e,\u{FF10}-\u{FF19}]{0,3}|\\PC*",
    ) {
        proptest::prop_assert_eq!(parse_resume_id(&raw), parse_int_model(&raw));
    }
}
