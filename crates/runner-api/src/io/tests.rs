use super::*;
use proptest::prelude::*;

#[test]
fn resize_frames_are_coerced_floored_and_clamped() {
    assert_eq!(
        parse_resize(r#"{"type":"resize","cols":80,"rows":24}"#),
        Some((80, 24))
    );
    assert_eq!(
        parse_resize(r#"{"type":"resize","cols":"80","rows":24.9}"#),
        Some((80, 24))
    );
    assert_eq!(
        parse_resize(r#"{"type":"resize","cols":99999,"rows":1}"#),
        Some((10_000, 1))
    );
    assert_eq!(
        parse_resize(r#"{"type":"resize","cols":0,"rows":24}"#),
        None
    );
    assert_eq!(
        parse_resize(r#"{"type":"resize","cols":"x","rows":24}"#),
        None
    );
    assert_eq!(parse_resize(r#"{"type":"resize","cols":80}"#), None);
    assert_eq!(
        parse_resize(r#"{"type":"other","cols":80,"rows":24}"#),
        None
    );
    assert_eq!(parse_resize("not json"), None);
}

fn dimension() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<f64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-5i32..20_005).prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null),
        "[ 0-9a-fx.eE+-]{0,12}|Infinity|-Infinity|NaN|\\PC{0,8}".prop_map(Value::from),
        Just(serde_json::json!([80])),
        Just(serde_json::json!({})),
    ]
    .boxed()
}

fn control_frame() -> BoxedStrategy<String> {
    let resize = (
        dimension(),
        dimension(),
        prop::sample::select(&["resize", "stdin", "Resize"][..]),
    )
        .prop_map(|(cols, rows, kind)| {
            serde_json::json!({"type": kind, "cols": cols, "rows": rows}).to_string()
        });
    prop_oneof![any::<String>(), resize].boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2048)
    ))]

    /// Control frames of any shape: never a panic, and an accepted resize
    /// is always a usable terminal size.
    #[test]
    fn control_frames_never_panic_and_sizes_stay_in_range(frame in control_frame()) {
        if let Some((cols, rows)) = parse_resize(&frame) {
            prop_assert!((1..=MAX_TERMINAL_DIMENSION).contains(&cols));
            prop_assert!((1..=MAX_TERMINAL_DIMENSION).contains(&rows));
        }
    }
}

#[test]
fn output_frames_carry_a_big_endian_sequence_prefix() {
    assert_eq!(
        &output_frame(FrameFormat::Legacy, 258, StreamTag::Stdout, b"hi")[..],
        &[0, 0, 1, 2, b'h', b'i']
    );
    assert_eq!(
        &output_frame(FrameFormat::Tagged, 258, StreamTag::Stderr, b"hi")[..],
        &[0, 0, 1, 2, 2, b'h', b'i']
    );
}

#[test]
fn frames_split_back_into_their_parts() {
    let tagged = output_frame(FrameFormat::Tagged, 7, StreamTag::Stdout, b"out");
    let frame = split_output_frame(FrameFormat::Tagged, &tagged).unwrap();
    assert_eq!(
        (frame.seq, frame.stream, frame.payload),
        (7, StreamTag::Stdout, &b"out"[..])
    );
    let legacy = output_frame(FrameFormat::Legacy, 7, StreamTag::Stdout, b"out");
    let frame = split_output_frame(FrameFormat::Legacy, &legacy).unwrap();
    assert_eq!(
        (frame.seq, frame.stream, frame.payload),
        (7, StreamTag::Tty, &b"out"[..])
    );
    assert_eq!(split_output_frame(FrameFormat::Tagged, &[0, 0, 0, 1]), None);
    assert_eq!(split_output_frame(FrameFormat::Legacy, &[0, 0, 1]), None);
}

#[test]
fn the_seq_frame_names_the_app_in_the_tagged_wire_only() {
    assert_eq!(seq_message(3, None), r#"{"type":"seq","seq":3}"#);
    assert_eq!(
        seq_message(
            3,
            Some(ChannelLabel {
                app: "api",
                io: IoMode::Streams
            })
        ),
        r#"{"type":"seq","seq":3,"app":"api","io":"streams"}"#
    );
    assert_eq!(
        resize_unsupported_message(IoMode::Streams),
        r#"{"type":"error","error":"resize_unsupported","io":"streams"}"#
    );
}

#[test]
fn the_frame_format_follows_the_io_feature() {
    let tagged = serde_json::json!({"io": ["tty"]});
    let legacy = serde_json::json!({"io": true});
    assert_eq!(
        FrameFormat::of_features(tagged.as_object().unwrap()),
        FrameFormat::Tagged
    );
    assert_eq!(
        FrameFormat::of_features(legacy.as_object().unwrap()),
        FrameFormat::Legacy
    );
}

#[test]
fn server_text_frames_are_told_apart() {
    assert_eq!(
        parse_server_message(&seq_message(7, None)),
        ServerMessage::Seq(7)
    );
    let labelled = seq_message(
        7,
        Some(ChannelLabel {
            app: "app",
            io: IoMode::Tty,
        }),
    );
    assert_eq!(parse_server_message(&labelled), ServerMessage::Seq(7));
    assert_eq!(parse_server_message(GAP_MESSAGE), ServerMessage::Gap);
    assert_eq!(parse_server_message("{}"), ServerMessage::Other);
    assert_eq!(parse_server_message("nope"), ServerMessage::Other);
}

#[test]
fn the_clients_resize_frame_is_the_one_the_runner_reads() {
    assert_eq!(parse_resize(&resize_message(120, 40)), Some((120, 40)));
}

#[test]
fn only_abnormal_closes_are_retried() {
    for code in [1000, 4401, 4403, 4404, 4410] {
        assert!(is_final_close(code));
    }
    assert!(!is_final_close(1006));
    assert!(!is_final_close(1011));
}
