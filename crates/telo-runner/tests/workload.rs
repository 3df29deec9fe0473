//! Workload faults, on both backends: a workload that exits while its client
//! keeps reconnecting, one that never reads its stdin while a client floods
//! it, and output that is not UTF-8 (or cuts escape sequences in half).
//!
//! Already covered elsewhere: output written while no client is connected is
//! resumed without loss or repeat
//! (`contract_io.rs::reconnecting_with_last_seq_neither_loses_nor_repeats_a_byte`).
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner, RunnerProcess};
use futures_util::SinkExt;
use kube_sim::KubeSim;
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::sse::SseStream;
use test_support::ws::{self, IoFrame};
use tokio_tungstenite::tungstenite::{Bytes, Message};

/// A client that drops its socket every few frames and resumes from the last
/// sequence number it saw, while the workload prints and exits: it ends up
/// with exactly the full output, no byte lost or repeated, and a close.
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_workload_exiting_while_its_client_reconnects_loses_nothing(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"lineEveryMs": 10, "lines": 60, "exitCode": 7}))
        .await;
    let mut seen = Vec::new();
    let mut last_seq = 0;
    let mut reconnects = 0;
    let close = 'client: loop {
        let mut socket = runner.io(&id, &format!("?lastSeq={last_seq}")).await;
        reconnects += 1;
        // A few frames, then away again.
        let mut outputs = 0;
        while outputs < 3 {
            let Some(frame) = ws::next_frame(&mut socket).await else {
                break;
            };
            match frame {
                IoFrame::Output { seq, bytes, .. } => {
                    assert!(seq > last_seq, "{seq} repeats {last_seq}");
                    last_seq = seq;
                    seen.extend_from_slice(&bytes);
                    outputs += 1;
                }
                IoFrame::Close { code, reason } => break 'client (code, reason),
                IoFrame::Text(text) => {
                    assert_ne!(text["type"], json!("gap"), "nothing was evicted");
                }
            }
        }
    };
    assert!(reconnects > 5, "{reconnects}");
    // Closed normally at the end, or, resuming after the end with nothing
    // left to send, told so.
    assert!(
        close == (1000, "session terminal".to_owned())
            || close == (4410, "session terminal, nothing to replay".to_owned()),
        "{close:?}"
    );
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 7})
    );
    let mut full = runner.io(&id, "?lastSeq=0").await;
    let everything = ws::output_of(&ws::read_until_close(&mut full).await);
    assert_eq!(
        String::from_utf8_lossy(&seen),
        String::from_utf8_lossy(&everything)
    );
    assert!(String::from_utf8_lossy(&seen).contains("line 60 "));
    runner.stop().await;
}

/// A runner process (its memory is measured) and, for Kubernetes, its sim.
async fn runner_process(backend: Backend) -> (RunnerProcess, Option<KubeSim>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster_for(backend).await;
    let runner = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), &[]).await;
    (runner, sim, dir)
}

async fn create(base: &str, fake_telo: Value) -> String {
    let response = runner_core::http_client::client()
        .post(format!("{base}/v1/sessions"))
        .json(&test_support::bundle::start_body(fake_telo))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.unwrap();
    created["sessionId"].as_str().unwrap().to_owned()
}

async fn running(base: &str, id: &str) {
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
}

/// Stdin bytes a client floods a deaf workload with.
const FLOOD_BYTES: usize = 160 << 20;
const FLOOD_FRAME: usize = 64 << 10;
/// What the runner may grow by meanwhile: its stdin queue (256 chunks of up
/// to 64 KiB), transport buffers and the allocator's slack — well under the
/// flood (measured: 25–63 MiB, the same for 24 MiB as for 384 MiB of input).
const GROWTH_LIMIT: u64 = 96 << 20;

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_that_never_reads_stdin_cannot_grow_the_runner(#[case] backend: Backend) {
    let (runner, sim, _dir) = runner_process(backend).await;
    let base = runner.base.clone();
    let deaf = create(&base, json!({"stdout": ["deaf"], "exitAfterMs": 120_000})).await;
    let other = create(&base, json!({"stdout": ["other"], "echo": true})).await;
    running(&base, &deaf).await;
    running(&base, &other).await;
    let mut other_socket = ws::connect(
        &format!("{}/v1/sessions/{other}/io", runner.ws_base()),
        None,
    )
    .await;
    ws::send_stdin(&mut other_socket, b"warm up\n").await;
    ws::read_until_output(&mut other_socket, "warm up").await;
    let before = runner.rss_bytes();

    let mut flood = ws::connect(&format!("{}/v1/sessions/{deaf}/io", runner.ws_base()), None).await;
    let frame = Bytes::from(vec![b'x'; FLOOD_FRAME]);
    let started = tokio::time::Instant::now();
    let flooding = async {
        for _ in 0..FLOOD_BYTES / FLOOD_FRAME {
            flood
                .feed(Message::Binary(frame.clone()))
                .await
                .expect("the runner keeps reading");
        }
        flood.flush().await.unwrap();
    };
    // The other session answers while the flood is on.
    let other_answers = async {
        ws::send_stdin(&mut other_socket, b"during the flood\n").await;
        ws::read_until_output(&mut other_socket, "during the flood").await;
    };
    tokio::join!(flooding, other_answers);
    let flood_took = started.elapsed();
    let after = runner.rss_bytes();
    eprintln!(
        "flooded {} MiB in {flood_took:?}; runner RSS {} -> {} MiB",
        FLOOD_BYTES >> 20,
        before >> 20,
        after >> 20
    );
    assert!(
        after.saturating_sub(before) < GROWTH_LIMIT,
        "runner grew from {before} to {after} bytes"
    );

    // Still stoppable, promptly; the other session is untouched.
    let response = runner_core::http_client::client()
        .delete(format!("{base}/v1/sessions/{deaf}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{deaf}/events"), &[]).await;
    let last = events.events_until_end().await;
    assert_eq!(
        last.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    ws::send_stdin(&mut other_socket, b"after the flood\n").await;
    ws::read_until_output(&mut other_socket, "after the flood").await;
    drop(flood);
    drop(runner);
    if let Some(sim) = sim {
        sim.shutdown().await;
    }
}

/// Bytes that are not UTF-8, split so that a UTF-8 sequence, a CSI and an
/// OSC escape sequence each straddle two writes, ending on a lone ESC. No
/// `\n` (a terminal would turn it into `\r\n`).
const RAW: &[&str] = &[
    "ff fe 00 c3",
    "28 e2 82",
    "ac 1b 5b 33",
    "31 6d 1b 5d 30 3b 74",
    "69 74 6c 65 07 f0 9f 98",
    "80 c0 af ed a0 80 1b",
];

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn output_that_is_not_utf8_is_relayed_byte_exact(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let expected: Vec<u8> = RAW
        .iter()
        .flat_map(|hex| {
            hex.split(' ')
                .map(|b| u8::from_str_radix(b, 16).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    // Live: a client attached before the bytes are written gets them as is.
    let id = runner
        .create(json!({"waitForInput": true, "stdoutHex": RAW, "echo": true}))
        .await;
    let mut socket = runner.io(&id, "?lastSeq=0").await;
    // Sent once the terminal is there (the start waits for this line).
    let mut events = runner.events(&id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    ws::send_stdin(&mut socket, b"go\n").await;
    let mut live = Vec::new();
    while !live.ends_with(&expected) {
        match ws::next_frame(&mut socket).await.unwrap() {
            IoFrame::Output { bytes, .. } => live.extend_from_slice(&bytes),
            IoFrame::Close { code, reason } => panic!("closed {code} {reason}: {live:?}"),
            IoFrame::Text(_) => {}
        }
    }
    assert_eq!(live, [b"go\r\n".as_slice(), &expected].concat());
    ws::send_stdin(&mut socket, b"exit\n").await;
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 0})
    );
    // Replayed: the history holds the same bytes.
    let mut replay = runner.io(&id, "?lastSeq=0").await;
    let replayed = ws::output_of(&ws::read_until_close(&mut replay).await);
    assert!(
        replayed.starts_with(&[b"go\r\n".as_slice(), &expected].concat()),
        "{replayed:?}"
    );
    // The event stream is not broken by them.
    let frames = runner.events(&id, &[]).await.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 0})
    );

    // A batch that wrote them around the time the terminal was attached:
    // replayed byte-exact, once.
    let batch = runner.create(json!({"stdoutHex": RAW})).await;
    runner.wait_terminal(&batch).await;
    let mut replay = runner.io(&batch, "?lastSeq=0").await;
    let replayed = ws::output_of(&ws::read_until_close(&mut replay).await);
    assert_eq!(replayed, expected, "{replayed:x?} vs {expected:x?}");
    runner.stop().await;
}
