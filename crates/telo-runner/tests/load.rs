//! Client faults and load on one session, on the local backend (subscribers
//! are the core's business, the same for every backend): a thousand sockets
//! and a few event streams get identical, complete output; clients that
//! never read slow nobody down and cost bounded memory; thousands of
//! connect-and-drop cycles leak no subscriber; an event stream resumed after
//! any id gets exactly the events after it.
//!
//! Sizes (chosen to run in a few seconds on two cores): 1,000 WebSockets and
//! 20 SSE streams on one session; 8 stalled sockets against 16 MiB of
//! output; 10,000 connect-and-drop cycles (5,000 WebSocket, 5,000 SSE).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Backend, Runner, RunnerProcess};
use futures_util::future::join_all;
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::sse::{SseFrame, SseStream};
use test_support::ws;

const SSE_GAUGE: &str = r#"telo_runner_subscribers{transport="sse"}"#;
const WS_GAUGE: &str = r#"telo_runner_subscribers{transport="websocket"}"#;

async fn running(base: &str, id: &str) {
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
}

/// One sample of `/metrics`.
async fn metric(base: &str, sample: &str) -> f64 {
    let text = runner_core::http_client::client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Polls `/metrics` (no event announces a subscriber leaving) until both
/// subscriber gauges read 0.
async fn subscribers_drop_to_zero(base: &str) {
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let (sse, ws) = (metric(base, SSE_GAUGE).await, metric(base, WS_GAUGE).await);
        if sse == 0.0 && ws == 0.0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "subscribers left: {sse} SSE, {ws} WebSocket"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const WS_CLIENTS: usize = 1000;
const SSE_CLIENTS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sockets_and_event_streams_get_identical_complete_output() {
    // One client fanning out to a thousand subscribers of one session:
    // past the default caps, which this test is not about.
    let runner = Runner::start_on(
        Backend::Local,
        &[
            ("RUNNER_MAX_SUBSCRIBERS_PER_SESSION", "2000"),
            ("RUNNER_MAX_SUBSCRIBERS_PER_CLIENT", "2000"),
            ("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "2000"),
        ],
    )
    .await;
    let base = runner.base.clone();
    // Holds its output until told to start, so every client is there first.
    let id = runner
        .create(json!({"waitForInput": true, "lineEveryMs": 2, "lines": 300, "exitCode": 0}))
        .await;
    running(&base, &id).await;
    let started = tokio::time::Instant::now();
    let mut sockets = Vec::with_capacity(WS_CLIENTS);
    for _ in 0..WS_CLIENTS / 50 {
        sockets.extend(join_all((0..50).map(|_| runner.io(&id, "?lastSeq=0"))).await);
    }
    let streams = join_all((0..SSE_CLIENTS).map(|_| runner.events(&id, &[]))).await;
    let connected = started.elapsed();
    ws::send_stdin(&mut sockets[0], b"go\n").await;
    let readers: Vec<_> = sockets
        .into_iter()
        .map(|mut socket| {
            tokio::spawn(async move {
                let frames = ws::read_until_close(&mut socket).await;
                assert!(
                    matches!(frames.last(), Some(ws::IoFrame::Close { code: 1000, .. })),
                    "{:?}",
                    frames.last()
                );
                ws::output_of(&frames)
            })
        })
        .collect();
    let watchers: Vec<_> = streams
        .into_iter()
        .map(|mut stream| tokio::spawn(async move { stream.events_until_end().await }))
        .collect();
    let outputs: Vec<Vec<u8>> = join_all(readers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let events: Vec<Vec<SseFrame>> = join_all(watchers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    eprintln!(
        "{WS_CLIENTS} sockets + {SSE_CLIENTS} streams connected in {connected:?}, all done in {:?}",
        started.elapsed()
    );

    let full = runner.full_output(&id).await.into_bytes();
    assert!(String::from_utf8_lossy(&full).contains("line 300 "));
    for (index, output) in outputs.iter().enumerate() {
        assert!(output == &full, "socket {index} got different output");
    }
    let all_events = runner.events(&id, &[]).await.events_until_end().await;
    assert_eq!(
        all_events.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 0})
    );
    for (index, stream) in events.iter().enumerate() {
        assert_eq!(stream, &all_events, "stream {index}");
    }
    subscribers_drop_to_zero(&base).await;
    runner.stop().await;
}

const STALLED_CLIENTS: usize = 8;
const SPEW_LINES: usize = 200_000; // 16 MB of output, 80 bytes a line

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_slow_nobody_and_cost_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    // The replay buffer holds the whole output, so the reading client gets
    // every byte however the machine schedules it; what is tested is that
    // the stalled clients hold nobody up and cost bounded memory.
    let runner = RunnerProcess::spawn(
        Backend::Local,
        dir.path(),
        None,
        &[("RUNNER_REPLAY_BUFFER_BYTES", "33554432")],
    )
    .await;
    let base = runner.base.clone();
    let response = runner_core::http_client::client()
        .post(format!("{base}/v1/sessions"))
        .json(&test_support::bundle::start_body(json!({
            "waitForInput": true,
            "spewBytes": SPEW_LINES * 80,
            "exitCode": 0,
        })))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let id = response.json::<Value>().await.unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    running(&base, &id).await;
    let url = format!("{}/v1/sessions/{id}/io?lastSeq=0", runner.ws_base());
    // Connected, then never read again.
    let stalled = join_all((0..STALLED_CLIENTS).map(|_| ws::connect(&url, None))).await;
    let mut reader = ws::connect(&url, None).await;
    let before = runner.rss_bytes();
    let started = tokio::time::Instant::now();
    ws::send_stdin(&mut reader, b"go\n").await;
    let mut received = 0usize;
    let mut peak = before;
    loop {
        match ws::next_frame(&mut reader).await.unwrap() {
            ws::IoFrame::Output { bytes, .. } => received += bytes.len(),
            ws::IoFrame::Close { code, .. } => {
                assert_eq!(code, 1000);
                break;
            }
            ws::IoFrame::Text(text) => {
                assert_eq!(
                    text["type"],
                    json!("seq"),
                    "the reading client missed nothing"
                );
            }
        }
        peak = peak.max(runner.rss_bytes());
    }
    let took = started.elapsed();
    eprintln!(
        "read {received} bytes in {took:?} past {STALLED_CLIENTS} stalled clients; runner RSS {} -> peak {} MiB",
        before >> 20,
        peak >> 20
    );
    // Every line, each `\r\n`-terminated by the terminal, after the echo.
    assert_eq!(received, "go\r\n".len() + SPEW_LINES * 81);
    assert!(
        peak.saturating_sub(before) < 96 << 20,
        "runner grew from {before} to {peak} bytes"
    );
    // A stalled client is released when its connection goes.
    drop(stalled);
    drop(reader);
    subscribers_drop_to_zero(&base).await;
}

const CYCLES: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connect_and_drop_cycles_leak_no_subscriber() {
    let runner = Runner::start_on(Backend::Local, &[]).await;
    let base = runner.base.clone();
    let id = runner
        .create(json!({"stdout": ["alive"], "echo": true}))
        .await;
    running(&base, &id).await;
    let io_url = runner.ws_url(&format!("/v1/sessions/{id}/io?lastSeq=0"));
    let events_url = runner.url(&format!("/v1/sessions/{id}/events"));
    let started = tokio::time::Instant::now();
    let client = runner.client.clone();
    let cycle = |n: usize| {
        let io_url = io_url.clone();
        let events = client
            .get(&events_url)
            .header("accept", "text/event-stream");
        async move {
            match n % 4 {
                // A socket closed properly after its first frame.
                0 => {
                    let mut socket = ws::connect(&io_url, None).await;
                    ws::next_frame(&mut socket).await.unwrap();
                    let _ = socket.close(None).await;
                }
                // A socket dropped without a close (the TCP connection goes).
                1 => drop(ws::connect(&io_url, None).await),
                // An event stream read once, then dropped.
                2 => {
                    let mut response = events.send().await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    assert!(response.chunk().await.unwrap().is_some());
                }
                // An event stream dropped before anything was read.
                _ => drop(events.send().await.unwrap()),
            }
        }
    };
    const PARALLEL: usize = 50;
    for batch in 0..CYCLES / PARALLEL {
        join_all((0..PARALLEL).map(|i| cycle(batch * PARALLEL + i))).await;
    }
    eprintln!(
        "{CYCLES} connect-and-drop cycles in {:?}",
        started.elapsed()
    );
    subscribers_drop_to_zero(&base).await;
    // The session never noticed.
    let mut socket = runner.io(&id, "").await;
    ws::send_stdin(&mut socket, b"still here\n").await;
    ws::read_until_output(&mut socket, "still here").await;
    drop(socket);
    subscribers_drop_to_zero(&base).await;
    runner.stop().await;
}

/// For an event stream of K events, resuming after each id i (the header, as
/// an `EventSource` does) gives exactly events i+1..K.
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn resuming_after_every_event_id_gives_exactly_the_rest(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"stdout": ["hello"], "exitAfterMs": 300, "exitCode": 3}))
        .await;
    let all = runner.events(&id, &[]).await.events_until_end().await;
    assert!(all.len() >= 3, "{all:?}");
    let ids: Vec<u64> = all.iter().map(|f| f.id.unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for (index, &after) in std::iter::once(&0).chain(&ids).enumerate() {
        let header = after.to_string();
        let rest = runner
            .events(&id, &[("last-event-id", header.as_str())])
            .await
            .events_until_end()
            .await;
        assert_eq!(rest, all[index..], "after {after}");
    }
    runner.stop().await;
}
