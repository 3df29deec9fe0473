//! Three runner replicas against kube-sim, behind a round-robin relay that
//! stands in for their Service: a killed replica's sessions are taken over
//! by the survivors, one owner each; a replica that is stopped hands its
//! sessions over at once, its clients told to reconnect.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube_sim::KubeSim;
use serde_json::{Value, json};
use test_support::relay::Relay;
use test_support::sse::SseStream;
use test_support::ws::{self, IoFrame};

mod common;

use common::{Backend, RunnerProcess};

const NAMESPACE: &str = "telo-sessions";
const LEASE_SECONDS: u64 = 3;

struct Installation {
    sim: KubeSim,
    dir: tempfile::TempDir,
    token_file: String,
    replicas: Vec<Option<RunnerProcess>>,
    ids: Vec<String>,
    relay: Relay,
}

impl Installation {
    async fn start(count: usize) -> Installation {
        Self::start_with(count, &[]).await
    }

    async fn start_with(count: usize, extra: &[(&str, &str)]) -> Installation {
        let sim = common::cluster_for(Backend::Kubernetes).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("peer-token");
        std::fs::write(&token_file, "p".repeat(48)).unwrap();
        let token_file = token_file.to_str().unwrap().to_owned();
        let mut replicas = Vec::new();
        let mut ids = Vec::new();
        for index in 0..count {
            let id = format!("replica-{index}");
            replicas.push(Some(spawn(&sim, &dir, &token_file, &id, extra).await));
            ids.push(id);
        }
        let mut relay_targets = Vec::new();
        for replica in replicas.iter().flatten() {
            wait_ready(&replica.base).await;
            relay_targets.push(address_of(&replica.base));
        }
        let relay = Relay::start(sim.node_ip().into(), relay_targets).await;
        Installation {
            sim,
            dir,
            token_file,
            replicas,
            ids,
            relay,
        }
    }

    /// Stops every replica (the relay first, so nothing reconnects), then
    /// the simulator with what it runs.
    async fn shut_down(self) {
        let Installation {
            sim,
            dir,
            replicas,
            relay,
            ..
        } = self;
        drop(relay);
        drop(replicas);
        sim.shutdown().await;
        drop(dir);
    }

    fn base(&self, index: usize) -> String {
        self.replicas[index].as_ref().unwrap().base.clone()
    }

    fn pod(&self, session_id: &str) -> Pod {
        self.sim
            .get(NAMESPACE, &format!("telo-run-{session_id}"))
            .unwrap_or_else(|| panic!("no pod for session {session_id}"))
    }

    fn owner(&self, session_id: &str) -> String {
        annotation(&self.pod(session_id), "telo.run/replica")
    }

    /// The replica a watch session's record names.
    fn watch_owner(&self, session_id: &str) -> String {
        let secret: k8s_openapi::api::core::v1::Secret = self
            .sim
            .get(NAMESPACE, &format!("telo-watch-{session_id}"))
            .unwrap();
        secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("telo.run/replica"))
            .cloned()
            .unwrap_or_default()
    }

    /// The index of the replica `session_id`'s pod names.
    fn owner_index(&self, session_id: &str) -> usize {
        let owner = self.owner(session_id);
        self.ids.iter().position(|id| *id == owner).unwrap()
    }

    /// Waits until a live replica other than `not` owns `session_id` and
    /// serves it `running`; returns its index.
    async fn served_again(&self, session_id: &str, not: usize) -> usize {
        let client = runner_core::http_client::client();
        tokio::time::timeout(test_support::WAIT, async {
            loop {
                let owner = self.owner_index(session_id);
                if owner != not
                    && let Some(replica) = &self.replicas[owner]
                {
                    let answer = client
                        .get(format!("{}/v1/sessions/{session_id}", replica.base))
                        .send()
                        .await;
                    if let Ok(answer) = answer
                        && answer.status().is_success()
                    {
                        let body: Value = answer.json().await.unwrap();
                        if body["status"]["kind"] == "running" {
                            return owner;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("session {session_id} was never served again"))
    }
}

fn annotation(pod: &Pod, key: &str) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .cloned()
        .unwrap_or_default()
}

fn address_of(base: &str) -> std::net::SocketAddr {
    base.trim_start_matches("http://").parse().unwrap()
}

async fn spawn(
    sim: &KubeSim,
    dir: &tempfile::TempDir,
    token_file: &str,
    id: &str,
    extra: &[(&str, &str)],
) -> RunnerProcess {
    let lease = LEASE_SECONDS.to_string();
    let mut vars = vec![
        ("RUNNER_PEER_TOKEN_FILE", token_file),
        ("RUNNER_REPLICA_ID", id),
        ("RUNNER_LEASE_DURATION_SECONDS", lease.as_str()),
    ];
    vars.extend_from_slice(extra);
    RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(sim), &vars).await
}

async fn wait_ready(base: &str) {
    let client = runner_core::http_client::client();
    tokio::time::timeout(test_support::WAIT, async {
        loop {
            let ready = client
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{base} never became ready"));
}

async fn create(base: &str, fake_telo: Value) -> String {
    let created: Value = runner_core::http_client::client()
        .post(format!("{base}/v1/sessions"))
        .json(&test_support::bundle::start_body(fake_telo))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["sessionId"].as_str().unwrap().to_owned()
}

async fn until_running(base: &str, id: &str) {
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
}

/// A watch session of `script` started at `base`, running.
async fn watch_session(base: &str, script: Value) -> String {
    let client = runner_core::http_client::client();
    let (status, created) = common::watch::request_at(
        &client,
        base,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(common::watch::watch_body(script)),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    until_running(base, &id).await;
    id
}

/// Writes `notes.txt` ("kept") into watch session `id`'s workspace, as
/// its user would.
async fn write_notes(base: &str, id: &str) {
    let (status, written) = common::watch::request_at(
        &runner_core::http_client::client(),
        base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "notes.txt", "content": "kept"}]})),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{written}");
}

/// Reads back what [`write_notes`] wrote, from watch session `id` at
/// `base`.
async fn read_notes(base: &str, id: &str) -> (reqwest::StatusCode, Value) {
    common::watch::request_at(
        &runner_core::http_client::client(),
        base,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=notes.txt"),
        None,
    )
    .await
}

/// A session of `script` started at `base`, running, with a terminal
/// client attached that has seen `first`.
async fn attached(base: &str, script: Value, first: &str) -> (String, ws::Socket) {
    let id = create(base, script).await;
    until_running(base, &id).await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    ws::read_until_output(&mut socket, first).await;
    (id, socket)
}

/// Reads `socket` to its end, which must be a close frame saying 1001
/// "going away" (never a dropped connection).
async fn closed_going_away(socket: &mut ws::Socket) {
    let frames = ws::read_until_close(socket).await;
    assert_eq!(
        frames.last(),
        Some(&IoFrame::Close {
            code: 1001,
            reason: "going away".into()
        }),
        "the socket ended without its close frame"
    );
}

fn signal(process: &RunnerProcess, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(process.child.id() as i32);
    nix::sys::signal::kill(pid, signal).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_sessions_are_taken_over_once_each_by_the_survivors() {
    let mut install = Installation::start_with(
        3,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_MAX_SESSIONS", "100"),
            // Room for the whole history of the fast stream below.
            ("RUNNER_REPLAY_BUFFER_BYTES", "67108864"),
        ],
    )
    .await;
    // Sixty sessions, twenty on each replica; on each, a third of them
    // print a line every 20 ms for as long as they run.
    let starts = (0..60).map(|index| {
        let base = install.base(index % 3);
        async move {
            let script = if (index / 3) % 3 == 0 {
                json!({"stdout": [format!("hello {index}")], "lineEveryMs": 20, "echo": true})
            } else {
                json!({"stdout": [format!("hello {index}")], "echo": true})
            };
            let id = create(&base, script).await;
            until_running(&base, &id).await;
            id
        }
    });
    let sessions = futures_util::future::join_all(starts).await;
    for (index, id) in sessions.iter().enumerate() {
        assert_eq!(install.owner(id), install.ids[index % 3]);
    }
    // A session on the replica that will be killed streams about 1 MB/s to
    // a client reading all of it.
    let mut fast = Vec::new();
    for _ in 0..1 {
        let base = install.base(0);
        let id = create(
            &base,
            json!({"stdout": ["fast"], "lineEveryMs": 1, "linePadding": 1000, "echo": true}),
        )
        .await;
        until_running(&base, &id).await;
        let ws_base = base.replacen("http", "ws", 1);
        let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
        let first = ws::read_until_output(&mut socket, "line 100 ").await;
        let reader = tokio::spawn(async move {
            let mut frames = first;
            frames.extend(ws::read_until_close(&mut socket).await);
            frames
        });
        fast.push((id, reader));
    }
    // A watch session on the replica that will be killed, with a file its
    // user just wrote.
    let watch_base = install.base(0);
    let client = runner_core::http_client::client();
    let watch_id = watch_session(&watch_base, json!({"stdout": ["watching"], "echo": true})).await;
    write_notes(&watch_base, &watch_id).await;
    assert_eq!(install.watch_owner(&watch_id), "replica-0");

    let victim = 0;
    let mut killed = install.replicas[victim].take().unwrap();
    signal(&killed, nix::sys::signal::Signal::SIGKILL);
    let _ = killed.child.wait();

    for (index, id) in sessions.iter().enumerate() {
        let owner = install.served_again(id, victim).await;
        if index % 3 == victim {
            // Adopted as a restarted runner adopts: a new generation.
            assert_eq!(annotation(&install.pod(id), "telo.run/generation"), "1");
        } else {
            assert_eq!(owner, index % 3, "a live replica's session moved");
        }
        // Only the owner holds it.
        for (other, replica) in install.replicas.iter().enumerate() {
            let Some(replica) = replica else { continue };
            if other == owner {
                continue;
            }
            let held = runner_core::http_client::client()
                .get(format!("{}/v1/sessions", replica.base))
                .header(runner_core::replicas::PEER_TOKEN_HEADER, "p".repeat(48))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap();
            let listed = held["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["sessionId"] == id.as_str());
            assert!(!listed, "{id} is held by {other} and by its owner {owner}");
        }
        // Interactive where it runs now, with its output.
        let ws_base = install.base(owner).replacen("http", "ws", 1);
        let mut socket =
            ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
        ws::read_until_output(&mut socket, &format!("hello {index}")).await;
        ws::send_stdin(&mut socket, format!("typed {index}\n").as_bytes()).await;
        ws::read_until_output(&mut socket, &format!("typed {index}")).await;
    }

    // The fast stream's client, cut off by the crash, resumes through the
    // Service with its last seq. Every frame's mark went to the peers
    // before the client could read the frame, so the survivor that adopted
    // the session knows where that seq ended in the output: no gap, every
    // line once.
    let service = install.relay.base();
    for (id, reader) in fast {
        let frames = reader.await.unwrap();
        let seen = line_numbers(&String::from_utf8_lossy(&ws::output_of(&frames)));
        let last = *seen.last().unwrap();
        assert_eq!(
            seen,
            (1..=last).collect::<Vec<_>>(),
            "lost before the crash"
        );
        install.served_again(&id, victim).await;
        let (_, text) = resume_exactly(&service, &id, frames).await;
        assert!(text.starts_with("fast"), "the history from its start");
    }

    // The watch session runs on where it was, its newest file with it.
    let owner = tokio::time::timeout(test_support::WAIT, async {
        loop {
            let owner = install.watch_owner(&watch_id);
            if let Some(index) = install.ids.iter().position(|id| *id == owner)
                && index != victim
            {
                let (status, file) = read_notes(&install.base(index), &watch_id).await;
                if status == reqwest::StatusCode::OK {
                    assert_eq!(file["content"], "kept");
                    return index;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("the watch session is served again");
    let (_, session) = common::watch::request_at(
        &client,
        &install.base(owner),
        reqwest::Method::GET,
        &format!("/v1/sessions/{watch_id}"),
        None,
    )
    .await;
    assert_eq!(session["status"]["kind"], "running", "{session}");

    install.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_hands_its_sessions_over_and_its_clients_resume_exactly() {
    let mut install = Installation::start(2).await;
    let base = install.base(0);
    let id = create(
        &base,
        json!({"stdout": ["before the hand-over"], "lineEveryMs": 10, "echo": true}),
    )
    .await;
    until_running(&base, &id).await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    let mut frames = ws::read_until_output(&mut socket, "line 20 ").await;

    let stopping = install.replicas[0].take().unwrap();
    signal(&stopping, nix::sys::signal::Signal::SIGTERM);
    frames.extend(ws::read_until_close(&mut socket).await);
    assert_eq!(
        frames.last(),
        Some(&IoFrame::Close {
            code: 1001,
            reason: "going away".into()
        }),
        "the socket ended without its close frame"
    );
    // The Lease is deleted on the way out: the peer takes the session over
    // without waiting for it to lapse.
    let owner = install.served_again(&id, 0).await;
    assert_eq!(owner, 1);
    let (mut resumed, text) = resume_exactly(&install.base(1), &id, frames).await;
    assert!(text.starts_with("before the hand-over"));
    ws::send_stdin(&mut resumed, b"typed after\n").await;
    ws::read_until_output(&mut resumed, "typed after").await;
    drop(stopping);
    install.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sessions_client_resumes_exactly_after_its_replica_hands_it_over() {
    let mut install = Installation::start_with(2, &[("RUNNER_WATCH_SESSIONS", "true")]).await;
    let client = runner_core::http_client::client();
    let base = install.base(0);
    let id = watch_session(
        &base,
        json!({"stdout": ["watching"], "lineEveryMs": 10, "echo": true}),
    )
    .await;
    let ws_base = base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    let mut frames = ws::read_until_output(&mut socket, "line 20 ").await;

    let stopping = install.replicas[0].take().unwrap();
    signal(&stopping, nix::sys::signal::Signal::SIGTERM);
    frames.extend(ws::read_until_close(&mut socket).await);
    // The peer claims the record and takes the pod over as it runs.
    let survivor = install.base(1);
    tokio::time::timeout(test_support::WAIT, async {
        loop {
            if install.watch_owner(&id) == "replica-1" {
                let (status, session) = common::watch::request_at(
                    &client,
                    &survivor,
                    reqwest::Method::GET,
                    &format!("/v1/sessions/{id}"),
                    None,
                )
                .await;
                if status == reqwest::StatusCode::OK && session["status"]["kind"] == "running" {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("the peer serves the watch session");
    resume_exactly(&survivor, &id, frames).await;
    drop(stopping);
    install.shut_down().await;
}

/// A client that read `frames` of session `id` before its replica handed
/// it over (or was killed) resumes at `base` with its last seq, as the
/// editor does: it
/// must be told of no gap, and get every line once, none missing. Returns
/// its socket and all the output it has.
async fn resume_exactly(base: &str, id: &str, mut frames: Vec<IoFrame>) -> (ws::Socket, String) {
    let last_seq = ws::last_seq(&frames).expect("output before the hand-over");
    let before = String::from_utf8_lossy(&ws::output_of(&frames)).into_owned();
    let last_line = line_numbers(&before).last().copied().unwrap();
    let ws_base = base.replacen("http", "ws", 1);
    let mut resumed = ws::connect(
        &format!("{ws_base}/v1/sessions/{id}/io?lastSeq={last_seq}"),
        None,
    )
    .await;
    let after = ws::read_until_output(&mut resumed, &format!("line {} ", last_line + 30)).await;
    assert!(
        !after
            .iter()
            .any(|f| matches!(f, IoFrame::Text(t) if t["type"] == "gap")),
        "told of a gap: {after:?}"
    );
    frames.extend(after);
    let text = String::from_utf8_lossy(&ws::output_of(&frames)).into_owned();
    let numbers = line_numbers(&text);
    let expected: Vec<u64> = (numbers[0]..numbers[0] + numbers.len() as u64).collect();
    assert_eq!(
        numbers, expected,
        "lines lost or repeated across the hand-over"
    );
    (resumed, text)
}

/// The numbers of the `line <n> <millis>` lines in `text`.
fn line_numbers(text: &str) -> Vec<u64> {
    text.split("\n")
        .filter_map(|line| line.trim().strip_prefix("line "))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_request_is_charged_to_the_clients_rate_once() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice-token name=alice\n").unwrap();
    let tiers = dir.path().join("tiers.json");
    std::fs::write(
        &tiers,
        r#"{"tiers": {"default": {"requestsPerMinute": 6}}}"#,
    )
    .unwrap();
    let install = Installation::start_with(
        2,
        &[
            ("RUNNER_AUTH_TOKENS_FILE", tokens.to_str().unwrap()),
            ("RUNNER_TIERS_FILE", tiers.to_str().unwrap()),
        ],
    )
    .await;
    let client = runner_core::http_client::client();
    let created: Value = client
        .post(format!("{}/v1/sessions", install.base(0)))
        .bearer_auth("alice-token")
        .json(&test_support::bundle::start_body(json!({"echo": true})))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let read_at = |index: usize| {
        client
            .get(format!("{}/v1/sessions/{id}", install.base(index)))
            .bearer_auth("alice-token")
            .send()
    };
    // Six reads of the session on the replica that does not own it, each
    // forwarded: that replica's whole budget for her.
    for _ in 0..6 {
        assert_eq!(read_at(1).await.unwrap().status(), reqwest::StatusCode::OK);
    }
    // The owner charged none of them (before, it charged each again, and
    // this read was her eighth there): she has five left there.
    assert_eq!(read_at(0).await.unwrap().status(), reqwest::StatusCode::OK);
    assert_eq!(
        read_at(1).await.unwrap().status(),
        reqwest::StatusCode::TOO_MANY_REQUESTS
    );
    install.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_suspended_session_is_kept_and_resumed_by_a_survivor() {
    let mut install = Installation::start_with(
        2,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WATCH_IDLE_SECONDS", "1"),
        ],
    )
    .await;
    let client = runner_core::http_client::client();
    let base = install.base(0);
    let id = watch_session(&base, json!({"stdout": ["watching"], "echo": true})).await;
    write_notes(&base, &id).await;
    // Nobody follows it: it is suspended, its files checkpointed.
    let status_at = |base: String| {
        let client = client.clone();
        let id = id.clone();
        async move {
            let (status, session) = common::watch::request_at(
                &client,
                &base,
                reqwest::Method::GET,
                &format!("/v1/sessions/{id}"),
                None,
            )
            .await;
            (
                status,
                session["status"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        }
    };
    tokio::time::timeout(test_support::WAIT, async {
        while status_at(base.clone()).await.1 != "suspended" {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the idle watch session was suspended");

    let mut killed = install.replicas[0].take().unwrap();
    signal(&killed, nix::sys::signal::Signal::SIGKILL);
    let _ = killed.child.wait();
    // The survivor takes its record over once the Lease lapses, and keeps
    // it suspended.
    let survivor = install.base(1);
    tokio::time::timeout(test_support::WAIT, async {
        while install.watch_owner(&id) != "replica-1"
            || status_at(survivor.clone()).await != (reqwest::StatusCode::OK, "suspended".into())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the survivor keeps the suspended session");
    let (status, resumed) = common::watch::request_at(
        &client,
        &survivor,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{resumed}");
    // Followed from here on, so it is not suspended again meanwhile.
    let mut events = SseStream::connect(&format!("{survivor}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let (status, file) = read_notes(&survivor, &id).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{file}");
    assert_eq!(file["content"], "kept");
    drop(events);
    install.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_limit_holds_for_the_installation() {
    let install = Installation::start_with(2, &[("RUNNER_MAX_SESSIONS", "2")]).await;
    let client = runner_core::http_client::client();
    for index in 0..2 {
        let base = install.base(index);
        let id = create(&base, json!({"stdout": ["up"], "echo": true})).await;
        until_running(&base, &id).await;
    }
    // Each replica holds one: the installation is full on both.
    for index in 0..2 {
        let refused = client
            .post(format!("{}/v1/sessions", install.base(index)))
            .json(&test_support::bundle::start_body(json!({"echo": true})))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), reqwest::StatusCode::CONFLICT);
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["error"], "too_many_sessions", "{body}");
    }
    install.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_a_spewing_session_gets_a_close_frame_when_its_replica_stops() {
    let mut install = Installation::start(2).await;
    let (id, mut socket) = attached(
        &install.base(0),
        json!({"stdout": ["spewing"], "lineEveryMs": 1, "ignoreSigterm": true, "echo": true}),
        "spewing",
    )
    .await;

    let stopping = install.replicas[0].take().unwrap();
    signal(&stopping, nix::sys::signal::Signal::SIGTERM);
    closed_going_away(&mut socket).await;
    // It spews on at its new owner.
    let owner = install.served_again(&id, 0).await;
    let ws_base = install.base(owner).replacen("http", "ws", 1);
    let mut fresh = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    ws::send_stdin(&mut fresh, b"still here\n").await;
    ws::read_until_output(&mut fresh, "still here").await;
    drop(stopping);
    install.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_joins_leaves_its_peers_sessions_alone() {
    let mut install = Installation::start(1).await;
    let base = install.base(0);
    let mut sessions = Vec::new();
    for index in 0..3 {
        let id = create(
            &base,
            json!({"stdout": [format!("kept {index}")], "echo": true}),
        )
        .await;
        until_running(&base, &id).await;
        sessions.push(id);
    }
    // A second replica boots (a rolling update's surge pod): its recovery
    // finds the sessions, owned by a live peer, and takes none.
    let joined = spawn(
        &install.sim,
        &install.dir,
        &install.token_file,
        "replica-1",
        &[],
    )
    .await;
    wait_ready(&joined.base).await;
    install.replicas.push(Some(joined));
    install.ids.push("replica-1".to_owned());
    for id in &sessions {
        assert_eq!(install.owner(id), "replica-0");
        assert_eq!(annotation(&install.pod(id), "telo.run/generation"), "");
    }
    let ws_base = base.replacen("http", "ws", 1);
    for (index, id) in sessions.iter().enumerate() {
        let mut socket =
            ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
        ws::read_until_output(&mut socket, &format!("kept {index}")).await;
        ws::send_stdin(&mut socket, b"still mine\n").await;
        ws::read_until_output(&mut socket, "still mine").await;
    }
    install.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_apiserver_lets_go_before_its_peer_claims() {
    let sim = common::cluster_for(Backend::Kubernetes).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("peer-token");
    std::fs::write(&token_file, "p".repeat(48)).unwrap();
    let token_file = token_file.to_str().unwrap().to_owned();
    // The first replica reaches the apiserver through a relay the test cuts.
    let link = Relay::start(sim.addr().ip(), vec![sim.addr()]).await;
    let kubeconfig = dir.path().join("kubeconfig-via-link");
    sim.write_kubeconfig_via(&kubeconfig, link.addr()).unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap().to_owned();
    let cut_off = spawn(
        &sim,
        &dir,
        &token_file,
        "replica-0",
        &[("KUBECONFIG", kubeconfig.as_str())],
    )
    .await;
    let peer = spawn(&sim, &dir, &token_file, "replica-1", &[]).await;
    wait_ready(&cut_off.base).await;
    wait_ready(&peer.base).await;

    let id = create(
        &cut_off.base,
        json!({"stdout": ["streaming"], "lineEveryMs": 5, "echo": true}),
    )
    .await;
    until_running(&cut_off.base, &id).await;
    let ws_base = cut_off.base.replacen("http", "ws", 1);
    let mut socket = ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await;
    ws::read_until_output(&mut socket, "streaming").await;

    link.cut();
    // The cut-off replica stops acting: its client is told to reconnect,
    // while the pod still names it (no peer has claimed yet).
    closed_going_away(&mut socket).await;
    let pod: Pod = sim.get(NAMESPACE, &format!("telo-run-{id}")).unwrap();
    assert_eq!(
        annotation(&pod, "telo.run/replica"),
        "replica-0",
        "a peer claimed the session before its owner let go"
    );
    // Then the Lease lapses and the peer serves it.
    let client = runner_core::http_client::client();
    tokio::time::timeout(test_support::WAIT, async {
        loop {
            let pod: Pod = sim.get(NAMESPACE, &format!("telo-run-{id}")).unwrap();
            if annotation(&pod, "telo.run/replica") == "replica-1" {
                let answer = client
                    .get(format!("{}/v1/sessions/{id}", peer.base))
                    .send()
                    .await
                    .unwrap();
                if answer.status().is_success() {
                    let body: Value = answer.json().await.unwrap();
                    if body["status"]["kind"] == "running" {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("the peer serves the session");
    // Reconnected, the first replica is ready again and holds nothing.
    link.restore();
    wait_ready(&cut_off.base).await;
    let held: Value = client
        .get(format!("{}/v1/sessions", cut_off.base))
        .header(runner_core::replicas::PEER_TOKEN_HEADER, "p".repeat(48))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(held["sessions"], json!([]), "{held}");
    drop((cut_off, peer));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_serves_any_session_through_the_service() {
    let install = Installation::start_with(
        3,
        &[
            ("RUNNER_PREVIEW_BASE_URL", "http://preview.test"),
            ("RUNNER_WATCH_SESSIONS", "true"),
        ],
    )
    .await;
    let client = runner_core::http_client::client();
    // A new connection per create, as separate editors would make: the
    // Service spreads connections, not requests.
    let unpooled = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let service = install.relay.base();
    // Three sessions created through the Service land on three replicas.
    let mut sessions = Vec::new();
    for index in 0..3 {
        let port = test_support::free_port();
        let mut body = test_support::bundle::start_body(
            json!({"stdout": [format!("hello {index}")], "listen": [port], "echo": true}),
        );
        body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
        let created: Value = unpooled
            .post(format!("{service}/v1/sessions"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = created["sessionId"].as_str().unwrap().to_owned();
        until_running(&service, &id).await;
        sessions.push((id, port));
    }
    let mut owners: Vec<String> = sessions.iter().map(|(id, _)| install.owner(id)).collect();
    owners.sort();
    assert_eq!(owners, install.ids);

    for (index, (id, port)) in sessions.iter().enumerate() {
        // Every replica answers for it, and says who owns it.
        for replica in install.replicas.iter().flatten() {
            let session: Value = client
                .get(format!("{}/v1/sessions/{id}", replica.base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(session["replica"], install.owner(id).as_str(), "{session}");
            assert_eq!(session["status"]["kind"], "running");
            // Its port, through any replica's edge.
            let answer = client
                .get(format!("{}/", replica.base))
                .header("host", format!("{port}-{id}.preview.test"))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), reqwest::StatusCode::OK);
            assert_eq!(answer.text().await.unwrap(), format!("ok {port}"));
        }
        // Its terminal, through the Service, both ways.
        let ws_base = service.replacen("http", "ws", 1);
        let mut socket =
            ws::connect(&format!("{ws_base}/v1/sessions/{id}/io?lastSeq=0"), None).await;
        ws::read_until_output(&mut socket, &format!("hello {index}")).await;
        ws::send_stdin(&mut socket, format!("typed {index}\n").as_bytes()).await;
        ws::read_until_output(&mut socket, &format!("typed {index}")).await;
    }
    // The list is the installation's, from any replica.
    for replica in install.replicas.iter().flatten() {
        let listed: Value = client
            .get(format!("{}/v1/sessions", replica.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let mut ids: Vec<&str> = listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["sessionId"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        let mut expected: Vec<&str> = sessions.iter().map(|(id, _)| id.as_str()).collect();
        expected.sort_unstable();
        assert_eq!(ids, expected);
    }
    // A stop through any replica stops it where it runs; its event stream,
    // opened at the owner before, ends with `stopped`.
    let mut streams = Vec::new();
    for (id, _) in &sessions {
        let owner = install.owner_index(id);
        streams.push(
            SseStream::connect(
                &format!("{}/v1/sessions/{id}/events", install.base(owner)),
                &[],
            )
            .await,
        );
    }
    for (id, _) in &sessions {
        let stopped = client
            .delete(format!("{service}/v1/sessions/{id}"))
            .send()
            .await
            .unwrap();
        assert!(stopped.status().is_success());
    }
    for mut events in streams {
        let rest = events.events_until_end().await;
        assert_eq!(rest.last().unwrap().json()["status"]["kind"], "stopped");
    }
    install.shut_down().await;
}

/// What went wrong for the steady load's clients.
#[derive(Clone, Default)]
struct Failures(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Failures {
    fn record(&self, what: impl Into<String>) {
        self.0.lock().unwrap().push(what.into());
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// One request of the steady load: retried only after a 503 that says
/// when (`Retry-After`), as a client is told to.
async fn with_retries(
    send: impl Fn() -> reqwest::RequestBuilder,
    failures: &Failures,
) -> Option<reqwest::Response> {
    for _ in 0..100 {
        match send().send().await {
            Ok(answer)
                if answer.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE
                    && answer.headers().contains_key("retry-after") =>
            {
                // The client waits as it is told, then tries again.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(answer) => return Some(answer),
            Err(err) => {
                failures.record(format!("request failed: {err}"));
                return None;
            }
        }
    }
    failures.record("503 for too long");
    None
}

/// Clients starting, polling and stopping sessions through `service`
/// until `stop`, each on a connection per request (the Service spreads
/// connections); what goes wrong is in `failures`, each finished round
/// counted in `completed`.
fn steady_load(
    service: &str,
    workers: usize,
    failures: &Failures,
    stop: &tokio_util::sync::CancellationToken,
    completed: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinSet<()> {
    let mut load = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let (service, failures, stop, completed) = (
            service.to_owned(),
            failures.clone(),
            stop.clone(),
            completed.clone(),
        );
        load.spawn(async move {
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            let mut round = 0;
            while !stop.is_cancelled() {
                round += 1;
                let body = test_support::bundle::start_body(
                    json!({"stdout": [format!("w{worker} r{round}")], "echo": true}),
                );
                let Some(created) = with_retries(
                    || client.post(format!("{service}/v1/sessions")).json(&body),
                    &failures,
                )
                .await
                else {
                    continue;
                };
                if created.status() != reqwest::StatusCode::CREATED {
                    failures.record(format!("create: {}", created.status()));
                    continue;
                }
                let id = created.json::<Value>().await.unwrap()["sessionId"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                // Until it runs, as a client polling its status sees it.
                let deadline = tokio::time::Instant::now() + test_support::WAIT;
                loop {
                    let Some(answer) = with_retries(
                        || client.get(format!("{service}/v1/sessions/{id}")),
                        &failures,
                    )
                    .await
                    else {
                        break;
                    };
                    if answer.status() != reqwest::StatusCode::OK {
                        failures.record(format!("get {id}: {}", answer.status()));
                        break;
                    }
                    let session: Value = answer.json().await.unwrap();
                    if session["status"]["kind"] == "running" {
                        break;
                    }
                    if tokio::time::Instant::now() > deadline {
                        failures.record(format!("{id} never ran: {session}"));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                match with_retries(
                    || client.delete(format!("{service}/v1/sessions/{id}")),
                    &failures,
                )
                .await
                {
                    Some(answer) if answer.status().is_success() => {
                        completed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Some(answer) => {
                        failures.record(format!("delete {id}: {}", answer.status()));
                    }
                    None => {}
                }
            }
        });
    }
    load
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_steady_load_fails_no_request() {
    let mut install = Installation::start(3).await;
    let service = install.relay.base();
    let failures = Failures::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let completed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut load = steady_load(&service, 3, &failures, &stop, &completed);
    // Each replica in turn is replaced by a new one, as a rolling update
    // with maxUnavailable 0 does: the new pod first, then the old one
    // stopped.
    for index in 0..3 {
        let id = format!("replica-{}", index + 3);
        let fresh = spawn(&install.sim, &install.dir, &install.token_file, &id, &[]).await;
        wait_ready(&fresh.base).await;
        install.replicas.push(Some(fresh));
        install.ids.push(id);
        let old = install.replicas[index].take().unwrap();
        install.relay.set_targets(
            install
                .replicas
                .iter()
                .flatten()
                .map(|replica| address_of(&replica.base))
                .collect(),
        );
        signal(&old, nix::sys::signal::Signal::SIGTERM);
        let mut old = old;
        let status = tokio::task::spawn_blocking(move || old.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status}");
    }
    stop.cancel();
    while load.join_next().await.is_some() {}
    let failures = failures.all();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(completed.load(std::sync::atomic::Ordering::Relaxed) > 0);
    install.shut_down().await;
}

/// The chart's release namespace, its runner Deployment and port.
const RELEASE_NAMESPACE: &str = "telo-runner";
const DEPLOYMENT: &str = "telo-k8s-runner";
const RUNNER_PORT: u16 = 8062;
/// The image the chart is told to run: the runner binary under test.
const CHART_IMAGE: &str = "registry.test/telo-runner";

/// Keeps `relay`'s targets to the ready, not terminating runner pods, as a
/// Service's endpoints follow a Deployment's pods. Runs until aborted.
fn follow_endpoints(sim: &KubeSim, relay: &Relay) -> tokio::task::JoinHandle<()> {
    use futures_util::StreamExt as _;
    use kube::runtime::watcher;
    let pods: kube::Api<Pod> = kube::Api::namespaced(sim.client(), RELEASE_NAMESPACE);
    let config = watcher::Config::default().labels(&format!("app.kubernetes.io/name={DEPLOYMENT}"));
    let targets = relay.targets();
    tokio::spawn(async move {
        let mut seen: std::collections::HashMap<String, Pod> = Default::default();
        let mut listed = false;
        let mut stream = std::pin::pin!(watcher(pods, config));
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    seen.insert(pod.metadata.name.clone().unwrap(), pod);
                }
                Ok(watcher::Event::Delete(pod)) => {
                    seen.remove(pod.metadata.name.as_ref().unwrap());
                }
                Ok(watcher::Event::Init) => seen.clear(),
                Ok(watcher::Event::InitDone) => listed = true,
                Err(_) => continue,
            }
            if !listed {
                continue;
            }
            let ready = seen
                .values()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_is_ready(p))
                .filter_map(|p| p.status.as_ref()?.pod_ip.as_deref()?.parse().ok())
                .map(|ip: std::net::IpAddr| std::net::SocketAddr::new(ip, RUNNER_PORT))
                .collect();
            targets.set(ready);
        }
    })
}

/// Each runner pod's state and the end of its log, for a failure message.
async fn runner_pods_report(sim: &KubeSim) -> String {
    let pods: kube::Api<Pod> = kube::Api::namespaced(sim.client(), RELEASE_NAMESPACE);
    let mut report = String::new();
    for pod in pods.list(&Default::default()).await.unwrap().items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone());
        let log = pods
            .logs(
                &name,
                &kube::api::LogParams {
                    tail_lines: Some(15),
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|err| format!("(no log: {err})"));
        report.push_str(&format!(
            "pod {name}: ready {}, deleting {:?}\n{statuses:?}\n{log}\n",
            pod_is_ready(&pod),
            pod.metadata.deletion_timestamp
        ));
    }
    report
}

fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the runner Deployment has rolled out `generation` on
/// `replicas` ready pods and no pod of an older template is left.
async fn rolled_out(sim: &KubeSim, generation: i64, replicas: i32) {
    use k8s_openapi::api::apps::v1::Deployment;
    let rollout = test_support::WAIT * 6;
    let waited = sim
        .wait_for::<Deployment>(
            RELEASE_NAMESPACE,
            DEPLOYMENT,
            |d| {
                let status = d.status.clone().unwrap_or_default();
                status.observed_generation == Some(generation)
                    && status.updated_replicas == Some(replicas)
                    && status.replicas == Some(replicas)
                    && status.available_replicas == Some(replicas)
            },
            rollout,
        )
        .await;
    let deployment = match waited {
        Ok(deployment) => deployment,
        Err(err) => panic!(
            "the runner Deployment did not roll out: {err}\n{}",
            runner_pods_report(sim).await
        ),
    };
    let pods: kube::Api<Pod> = kube::Api::namespaced(sim.client(), RELEASE_NAMESPACE);
    let current = deployment.status.unwrap_or_default();
    tokio::time::timeout(rollout, async {
        loop {
            let listed = pods
                .list(
                    &kube::api::ListParams::default()
                        .labels(&format!("app.kubernetes.io/name={DEPLOYMENT}")),
                )
                .await
                .unwrap()
                .items;
            if listed.len() == usize::try_from(replicas).unwrap() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("old runner pods were never gone ({current:?})"));
}

/// How far a [`follow_output`] client has read, and how far it is to read.
#[derive(Clone)]
struct Progress {
    /// The last line number read.
    read: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Stop once this line was read.
    until: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Progress {
    fn new() -> Self {
        Self {
            read: Default::default(),
            until: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
        }
    }

    /// Asks for `more` lines past what was read so far.
    fn read_more(&self, more: u64) {
        let read = self.read.load(std::sync::atomic::Ordering::SeqCst);
        self.until
            .store(read + more, std::sync::atomic::Ordering::SeqCst);
    }

    fn done(&self) -> bool {
        self.read.load(std::sync::atomic::Ordering::SeqCst)
            >= self.until.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A terminal client of session `id` through `service` that reconnects
/// with its last seq whenever its socket is closed, until it has read the
/// line `progress` asks for. Returns every frame it read and how many
/// times its connection ended without a close frame.
async fn follow_output(service: String, id: String, progress: Progress) -> (Vec<IoFrame>, usize) {
    let ws_base = service.replacen("http", "ws", 1);
    let mut frames = Vec::new();
    let mut dropped = 0;
    loop {
        let url = match ws::last_seq(&frames) {
            Some(seq) => format!("{ws_base}/v1/sessions/{id}/io?lastSeq={seq}"),
            None => format!("{ws_base}/v1/sessions/{id}/io"),
        };
        let mut socket = ws::connect_when_served(&url).await;
        loop {
            match ws::next_frame(&mut socket).await {
                Some(frame @ IoFrame::Close { .. }) => {
                    frames.push(frame);
                    break;
                }
                Some(frame) => {
                    if let IoFrame::Output { bytes, .. } = &frame
                        && let Some(last) = line_numbers(&String::from_utf8_lossy(bytes)).last()
                    {
                        progress
                            .read
                            .store(*last, std::sync::atomic::Ordering::SeqCst);
                    }
                    frames.push(frame);
                    if progress.done() {
                        return (frames, dropped);
                    }
                }
                None => {
                    dropped += 1;
                    break;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_upgrade_of_three_replicas_under_load_loses_nothing() {
    common::helm::assert_python_packages_present();
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .pod_network(kube_sim::PodNetwork::Isolated)
        .image(
            &format!("{CHART_IMAGE}:*"),
            kube_sim::ImageBehaviour::Entrypoint(env!("CARGO_BIN_EXE_telo-runner").into()),
        )
        .start()
        .await
        .expect("kube-sim starts with a pod network of its own (run as root)");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    // The Service: the ready runner pods, as their endpoints.
    let relay = Relay::start(sim.node_ip().into(), Vec::new()).await;
    let endpoints = follow_endpoints(&sim, &relay);
    let service = relay.base();
    let mut values = json!({
        "replicaCount": 3,
        "image": {"repository": CHART_IMAGE, "tag": "1"},
        "runner": {"selfUrl": service, "maxSessions": 100},
        "session": {"baseImages": {"enabled": false}},
        "replication": {"leaseDurationSeconds": 5},
    });
    common::helm::release("install", &kubeconfig, RELEASE_NAMESPACE, "telo", &values);
    rolled_out(&sim, 1, 3).await;

    // Two sessions printing 100 lines a second, each followed by a client
    // that reconnects with its last seq as the editor does.
    let mut followers = Vec::new();
    let mut streaming = Vec::new();
    for index in 0..2 {
        let id = create(
            &service,
            json!({"stdout": [format!("stream {index}")], "lineEveryMs": 10, "echo": true}),
        )
        .await;
        until_running(&service, &id).await;
        let progress = Progress::new();
        followers.push((
            progress.clone(),
            tokio::spawn(follow_output(service.clone(), id.clone(), progress)),
        ));
        streaming.push(id);
    }
    let failures = Failures::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let completed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut load = steady_load(&service, 3, &failures, &stop, &completed);
    let until_completed = |count: usize| {
        let completed = completed.clone();
        async move {
            tokio::time::timeout(test_support::WAIT * 3, async {
                while completed.load(std::sync::atomic::Ordering::Relaxed) < count {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("the steady load makes progress");
        }
    };
    until_completed(3).await;
    let old_pods: Vec<String> = streaming.iter().map(|id| install_owner(&sim, id)).collect();

    // A new revision of the pod template: every replica is replaced.
    values["runner"]["logLevel"] = json!("debug");
    common::helm::release("upgrade", &kubeconfig, RELEASE_NAMESPACE, "telo", &values);
    rolled_out(&sim, 2, 3).await;
    let after = completed.load(std::sync::atomic::Ordering::Relaxed);
    until_completed(after + 3).await;
    stop.cancel();
    while load.join_next().await.is_some() {}

    let failures = failures.all();
    assert!(failures.is_empty(), "{failures:#?}");
    // The streaming sessions live on, now owned by pods of the new
    // revision, and their clients have every line once.
    for (id, old_pod) in streaming.iter().zip(&old_pods) {
        let owner = install_owner(&sim, id);
        assert_ne!(&owner, old_pod, "session {id} was never handed over");
        let pod: Pod = sim.get(RELEASE_NAMESPACE, &owner).unwrap();
        assert!(pod.metadata.deletion_timestamp.is_none());
    }
    // Some more output after the last hand-over, then the clients stop.
    for (progress, _) in &followers {
        progress.read_more(50);
    }
    for (_, follower) in followers {
        let (frames, dropped) = follower.await.unwrap();
        assert_eq!(dropped, 0, "a connection ended without a close frame");
        for frame in &frames {
            match frame {
                IoFrame::Close { code, .. } => assert_eq!(*code, 1001, "{frame:?}"),
                IoFrame::Text(text) => assert_ne!(text["type"], "gap", "told of a gap"),
                IoFrame::Output { .. } => {}
            }
        }
        let closes = frames
            .iter()
            .filter(|f| matches!(f, IoFrame::Close { .. }))
            .count();
        assert!(closes >= 1, "the client was never handed over");
        let text = String::from_utf8_lossy(&ws::output_of(&frames)).into_owned();
        let numbers = line_numbers(&text);
        let expected: Vec<u64> = (1..=numbers.len() as u64).collect();
        assert_eq!(
            numbers, expected,
            "lines lost or repeated across the upgrade"
        );
    }
    endpoints.abort();
    let _ = endpoints.await;
    drop(relay);
    sim.shutdown().await;
}

/// The runner pod that owns run session `id`.
fn install_owner(sim: &KubeSim, id: &str) -> String {
    let pod: Pod = sim
        .get(NAMESPACE, &format!("telo-run-{id}"))
        .unwrap_or_else(|| panic!("no pod for session {id}"));
    annotation(&pod, "telo.run/replica")
}
