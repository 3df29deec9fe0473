//! Output written while a session's terminal is being attached, on the
//! Kubernetes backend: a workload that prints the moment its container starts
//! races the attach, and what it printed must reach clients exactly once.
//! The same sessions check that the start progress reads in the order the pod
//! went through it, although it comes from two watches (the pod's status and
//! the Events about it) that race each other.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Runner;
use futures_util::future::join_all;
use serde_json::json;
use tokio::sync::Semaphore;

/// Like the sessions of the report that found the duplicates: 100 sessions,
/// five starting at a time.
const SESSIONS: usize = 100;
const CONCURRENCY: usize = 5;
const LINES: usize = 3;

/// fake-telo's periodic lines read `line <n> <unix-millis>`.
fn start_line(n: usize) -> String {
    format!("line {n} ")
}

/// Where a progress line belongs in a session pod's start: scheduled, the
/// bundle fetcher's image (busybox) pulled, the bundle delivered, the kernel
/// image pulled, the container created.
fn stage_of(message: &str) -> u8 {
    let pulled = message.starts_with("Successfully pulled")
        || message.ends_with("already present on machine");
    match message {
        "Scheduling" => 0,
        m if m.starts_with("Pulling image \"busybox") => 1,
        m if pulled && m.contains("\"busybox") => 2,
        "Delivering application" => 3,
        m if m.starts_with("Pulling image \"telorun/node") => 4,
        m if pulled && m.contains("\"telorun/node") => 5,
        "Creating container" => 6,
        other => panic!("unexpected progress line {other:?}"),
    }
}

/// What one session showed its clients.
struct Seen {
    id: String,
    output: String,
    progress: Vec<String>,
}

/// Session `k` prints its lines `5 + 5 * (k % 20)` ms apart from its start
/// (the runner attaches some 10–300 ms after the container starts), so
/// across the sessions they land before, while and after the terminal is
/// attached.
async fn one_session(runner: &Runner, k: usize) -> Seen {
    let every_ms = 5 + 5 * (k % 20);
    let id = runner
        .create(
            json!({"lineEveryMs": every_ms, "lines": LINES, "exitAfterMs": every_ms * LINES + 100}),
        )
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events.events_until_end().await;
    let last = frames.last().unwrap().json();
    assert_eq!(last["status"], json!({"kind": "exited", "code": 0}), "{id}");
    let progress = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("progress"))
        .map(|f| f.json()["message"].as_str().unwrap().to_owned())
        .collect();
    let output = runner.full_output(&id).await;
    Seen {
        id,
        output,
        progress,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_around_the_attach_arrives_once_and_progress_reads_in_start_order() {
    // An attach carries output only from some moment after its upgrade was
    // answered (the apiserver dials the kubelet after): up to 25 ms here.
    let sim = common::cluster().attach_delay(Duration::from_millis(25));
    let runner = Arc::new(Runner::start_kube(sim, &[]).await);
    let gate = Arc::new(Semaphore::new(CONCURRENCY));
    let sessions = (0..SESSIONS).map(|k| {
        let runner = runner.clone();
        let gate = gate.clone();
        tokio::spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            one_session(&runner, k).await
        })
    });
    let seen: Vec<Seen> = join_all(sessions)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut duplicated = Vec::new();
    let mut lost = Vec::new();
    for session in &seen {
        for n in 1..=LINES {
            match session.output.matches(&start_line(n)).count() {
                1 => {}
                0 => lost.push(format!("{}: line {n} in {:?}", session.id, session.output)),
                _ => duplicated.push(format!("{}: line {n} in {:?}", session.id, session.output)),
            }
        }
    }
    eprintln!(
        "{} sessions: {} lines duplicated, {} lost",
        seen.len(),
        duplicated.len(),
        lost.len()
    );
    assert!(duplicated.is_empty(), "duplicated: {duplicated:#?}");
    assert!(lost.is_empty(), "lost: {lost:#?}");

    // Progress reads in the order the pod went through it, every time.
    let out_of_order: Vec<&Seen> = seen
        .iter()
        .filter(|session| {
            let stages: Vec<u8> = session.progress.iter().map(|m| stage_of(m)).collect();
            stages.first() != Some(&0) || stages.windows(2).any(|pair| pair[0] > pair[1])
        })
        .collect();
    for session in out_of_order.iter().take(5) {
        eprintln!("out of order, {}: {:#?}", session.id, session.progress);
    }
    assert!(
        out_of_order.is_empty(),
        "{} of {} sessions showed their progress out of order",
        out_of_order.len(),
        seen.len()
    );
    Arc::into_inner(runner).unwrap().stop().await;
}
