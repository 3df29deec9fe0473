//! The `/v1` terminal channel, black-box over real sockets, on both backends:
//! the `/io` WebSocket carries stdin, resizes and output, resumes from
//! `lastSeq`, and refuses with close codes after the handshake.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::json;
use test_support::ws::{self, IoFrame};

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn stdin_typed_into_the_socket_reaches_the_workload(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"stdout": ["ready"], "echo": true}))
        .await;
    let mut socket = runner.io(&id, "").await;
    ws::read_until_output(&mut socket, "ready").await;
    ws::send_stdin(&mut socket, b"ping-123\n").await;
    ws::read_until_output(&mut socket, "ping-123").await;
    ws::send_stdin(&mut socket, b"exit\n").await;
    let frames = ws::read_until_close(&mut socket).await;
    assert_eq!(
        frames.last().unwrap(),
        &IoFrame::Close {
            code: 1000,
            reason: "session terminal".into()
        }
    );
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 0})
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_resize_reaches_the_terminal_and_bursts_collapse_to_the_last(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"printSize": true, "echo": true}))
        .await;
    let mut socket = runner.io(&id, "").await;
    ws::read_until_output(&mut socket, "size 80x24").await;
    ws::send_text(&mut socket, r#"{"type":"resize","cols":100,"rows":30}"#).await;
    ws::send_text(&mut socket, r#"{"type":"resize","cols":"132","rows":43.7}"#).await;
    ws::send_text(&mut socket, "not json").await;
    ws::send_text(&mut socket, r#"{"type":"resize","cols":0,"rows":10}"#).await;
    ws::read_until_output(&mut socket, "size 132x43").await;
    runner.delete(&format!("/v1/sessions/{id}")).await;
    let frames = ws::read_until_close(&mut socket).await;
    assert!(
        !String::from_utf8_lossy(&ws::output_of(&frames)).contains("size 100x30"),
        "the first resize of the burst was superseded"
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn reconnecting_with_last_seq_neither_loses_nor_repeats_a_byte(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"stdout": ["first"], "echo": true}))
        .await;
    let mut socket = runner.io(&id, "").await;
    let frames = ws::read_until_output(&mut socket, "first").await;
    let last_seq = ws::last_seq(&frames).unwrap();
    drop(socket);
    let mut seen = ws::output_of(&frames);

    // Output produced while no client is connected.
    let mut writer = runner.io(&id, &format!("?lastSeq={last_seq}")).await;
    assert_eq!(
        ws::next_frame(&mut writer).await.unwrap(),
        IoFrame::Text(json!({"type": "seq", "seq": last_seq, "app": "app", "io": "tty"}))
    );
    ws::send_stdin(&mut writer, b"second\n").await;
    ws::read_until_output(&mut writer, "second").await;
    ws::send_stdin(&mut writer, b"exit\n").await;
    ws::read_until_close(&mut writer).await;

    let mut resumed = runner.io(&id, &format!("?lastSeq={last_seq}")).await;
    let rest = ws::read_until_close(&mut resumed).await;
    let mut seqs = vec![last_seq];
    for frame in &rest {
        if let IoFrame::Output { seq, .. } = frame {
            assert!(
                *seq > *seqs.last().unwrap(),
                "seq strictly increases past the resume point"
            );
            seqs.push(*seq);
        }
    }
    seen.extend(ws::output_of(&rest));

    let mut full = runner.io(&id, "?lastSeq=0").await;
    let everything = ws::output_of(&ws::read_until_close(&mut full).await);
    assert_eq!(seen, everything, "resumed output equals the full replay");
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn large_output_is_split_into_chunks_of_at_most_64_kib(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"spewBytes": 500000, "exitCode": 0}))
        .await;
    runner.wait_terminal(&id).await;
    let mut socket = runner.io(&id, "?lastSeq=0").await;
    let frames = ws::read_until_close(&mut socket).await;
    let mut total = 0;
    for frame in &frames {
        if let IoFrame::Output { bytes, .. } = frame {
            assert!(bytes.len() <= 64 * 1024);
            total += bytes.len();
        }
    }
    // The PTY turns each "\n" into "\r\n", so there is at least as much.
    assert!(total >= 500000, "{total}");
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn websocket_rejections_are_close_codes_after_the_handshake(#[case] backend: Backend) {
    let runner = Runner::start_on(
        backend,
        &[("RUNNER_CORS_ORIGINS", "https://editor.example, *")],
    )
    .await;
    // Unknown session (allowed origin).
    let mut socket = ws::connect(
        &runner.ws_url("/v1/sessions/nope/io"),
        Some("https://editor.example"),
    )
    .await;
    assert_eq!(
        ws::next_frame(&mut socket).await.unwrap(),
        IoFrame::Close {
            code: 4404,
            reason: "session not found".into()
        }
    );
    // Origin outside the list; `*` in a list is literal here.
    let mut socket = ws::connect(
        &runner.ws_url("/v1/sessions/nope/io"),
        Some("https://evil.example"),
    )
    .await;
    assert_eq!(
        ws::next_frame(&mut socket).await.unwrap(),
        IoFrame::Close {
            code: 4403,
            reason: "forbidden_origin".into()
        }
    );
    // No origin is not a browser page: it passes the origin check, as on
    // every other route, and meets the unknown id.
    let mut socket = ws::connect(&runner.ws_url("/v1/sessions/nope/io"), None).await;
    assert_eq!(
        ws::next_frame(&mut socket).await.unwrap(),
        IoFrame::Close {
            code: 4404,
            reason: "session not found".into()
        }
    );
    // A plain GET is not an upgrade.
    let response = runner
        .client
        .get(runner.url("/v1/sessions/nope/io"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_finished_session_with_nothing_to_replay_closes_4410(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner.create(json!({"stdout": ["x"], "exitCode": 0})).await;
    runner.wait_terminal(&id).await;
    let mut socket = runner.io(&id, "?lastSeq=999999").await;
    assert_eq!(
        ws::next_frame(&mut socket).await.unwrap(),
        IoFrame::Close {
            code: 4410,
            reason: "session terminal, nothing to replay".into()
        }
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn many_sockets_share_one_session(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner.create(json!({"echo": true})).await;
    let mut sockets = Vec::new();
    for _ in 0..5 {
        sockets.push(runner.io(&id, "").await);
    }
    ws::send_stdin(&mut sockets[2], b"shared-line\n").await;
    for socket in &mut sockets {
        ws::read_until_output(socket, "shared-line").await;
    }
    runner.stop().await;
}
