//! `io: "streams"`, black-box over real sockets on both backends (the local
//! one, and Kubernetes on kube-sim) with fake-telo's watch mode as the
//! kernel: a watch session running a `streams` app beside a `tty` one. The
//! streams app's stdout and stderr reach its `/io` channel apart (tags 1
//! and 2), with no terminal and no forced colour, its stdin still reaches
//! it, and a resize is answered `resize_unsupported` on a socket that stays
//! open; the tty app is unchanged (tag 0, resizes reach it). A run session
//! is refused `streams`.

mod common;

use std::collections::HashMap;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use runner_api::watch::StreamTag;
use serde_json::{Value, json};
use test_support::sse::SseStream;
use test_support::ws::{self, IoFrame, Socket};

const WATCH: &[(&str, &str)] = &[("RUNNER_WATCH_SESSIONS", "true")];

fn manifest(fake_telo: Value) -> String {
    format!("kind: Telo.Application\nmetadata: {{ name: test }}\nfakeTelo: {fake_telo}\n")
}

/// A watch session of `web` (tty, `web.yaml`) and `worker` (streams,
/// `worker.yaml`); no other test runs entries of these names.
fn two_apps_body() -> Value {
    let web = json!({"stdout": ["web says hello"], "printEnv": ["CLICOLOR_FORCE"], "printSize": true, "echo": true});
    let worker = json!({
        "stdout": ["worker starts"],
        "stderr": ["worker complains"],
        "printEnv": ["CLICOLOR_FORCE", "FORCE_COLOR"],
        "printSize": true,
        "echo": true,
        "echoStderr": true,
    });
    let mut body = test_support::bundle::start_body(json!({}));
    body["mode"] = json!("watch");
    body["bundle"] = json!({
        "entryRelativePath": "web.yaml",
        "files": [
            {"relativePath": "web.yaml", "contents": manifest(web)},
            {"relativePath": "worker.yaml", "contents": manifest(worker)},
        ],
    });
    body["apps"] = json!([
        {"name": "web", "entryRelativePath": "web.yaml"},
        {"name": "worker", "entryRelativePath": "worker.yaml", "io": "streams"},
    ]);
    body
}

/// Reads events until every app of `apps` started its first generation.
async fn first_generation(events: &mut SseStream, apps: &[&str]) {
    let mut started: Vec<String> = Vec::new();
    events
        .events_until(|f| {
            if f.event.as_deref() == Some("run")
                && f.json()["phase"] == "started"
                && f.json()["generation"] == 1
                && let Some(app) = f.json()["app"].as_str()
            {
                started.push(app.to_owned());
            }
            apps.iter().all(|app| started.iter().any(|s| s == app))
        })
        .await;
}

/// What `frames` carried, per stream tag.
fn by_tag(frames: &[IoFrame]) -> HashMap<StreamTag, String> {
    let mut text: HashMap<StreamTag, Vec<u8>> = HashMap::new();
    for frame in frames {
        if let IoFrame::Output { stream, bytes, .. } = frame {
            text.entry(*stream).or_default().extend_from_slice(bytes);
        }
    }
    text.into_iter()
        .map(|(tag, bytes)| (tag, String::from_utf8_lossy(&bytes).into_owned()))
        .collect()
}

/// Reads until every one of `needles` showed up in the output.
async fn read_until_all(socket: &mut Socket, needles: &[&str]) -> Vec<IoFrame> {
    let mut frames = Vec::new();
    loop {
        let all: String = by_tag(&frames).into_values().collect();
        if needles.iter().all(|needle| all.contains(needle)) {
            return frames;
        }
        match ws::next_frame(socket).await {
            Some(frame @ IoFrame::Close { .. }) | Some(frame @ IoFrame::Text(_)) => {
                panic!("{frame:?} before {needles:?}; output so far {all:?}")
            }
            Some(frame) => frames.push(frame),
            None => panic!("the socket ended before {needles:?}; output so far {all:?}"),
        }
    }
}

/// One echo round on the streams app: `line` goes to its stdin, and comes
/// back on stdout, and as `stderr: <line>` on stderr. Returns what each tag
/// carried.
async fn echo_round(socket: &mut Socket, line: &str) -> HashMap<StreamTag, String> {
    ws::send_stdin(socket, format!("{line}\n").as_bytes()).await;
    let mut frames = Vec::new();
    let echoed = format!("{line}\n");
    // Both copies: the stdout one and the one inside `stderr: <line>`.
    while by_tag(&frames)
        .values()
        .map(|text| text.matches(&echoed).count())
        .sum::<usize>()
        < 2
    {
        match ws::next_frame(socket).await {
            Some(frame @ IoFrame::Output { .. }) => frames.push(frame),
            other => panic!("{other:?} before the echo of {line:?}: {frames:?}"),
        }
    }
    by_tag(&frames)
}

fn tagged_apart(tags: &HashMap<StreamTag, String>, line: &str) -> bool {
    let stdout = tags.get(&StreamTag::Stdout).cloned().unwrap_or_default();
    let stderr = tags.get(&StreamTag::Stderr).cloned().unwrap_or_default();
    stdout.contains(&format!("{line}\n"))
        && !stdout.contains("stderr:")
        && stderr.contains(&format!("stderr: {line}\n"))
        && !tags.contains_key(&StreamTag::Tty)
}

/// Echo rounds until one came back tagged apart, at most `rounds`.
async fn echoes_apart(socket: &mut Socket, rounds: u32) {
    for round in 1..=rounds {
        let line = format!("ping-{round}");
        let tags = echo_round(socket, &line).await;
        if tagged_apart(&tags, &line) {
            return;
        }
        assert!(round < rounds, "never tagged apart: {tags:?}");
    }
}

/// What `/proc/<pid>/stat` says of a process that matters here.
#[derive(Debug)]
struct ProcStat {
    comm: String,
    ppid: i32,
    session: i32,
    tty_nr: i32,
}

fn proc_stat(pid: i32) -> ProcStat {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let (head, rest) = stat.rsplit_once(')').expect("stat has a comm");
    let comm = head.split_once('(').expect("stat has a comm").1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields[i].parse().expect("a number");
    ProcStat {
        comm,
        ppid: field(1),
        session: field(3),
        tty_nr: field(4),
    }
}

/// The pid of the local fake-telo process running `entry`.
fn local_workload(entry: &str) -> i32 {
    let kernel = test_support::fake_telo::fake_telo_path();
    let kernel = kernel.to_string_lossy();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.first().is_some_and(|a| a == kernel.as_ref()) && args.iter().any(|a| a == entry)
        })
        .unwrap_or_else(|| panic!("no process runs {entry}"))
}

fn has_bwrap_ancestor(pid: i32) -> bool {
    let mut pid = pid;
    for _ in 0..8 {
        let stat = proc_stat(pid);
        if stat.comm == "bwrap" {
            return true;
        }
        if stat.ppid <= 1 {
            return false;
        }
        pid = stat.ppid;
    }
    false
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_app_keeps_stdout_and_stderr_apart_beside_a_tty_app(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, WATCH).await;
    let (_, capabilities) = runner.get("/v1/capabilities").await;
    assert_eq!(capabilities["features"]["io"], json!(["tty", "streams"]));

    let id = runner.create_body(two_apps_body()).await;
    let mut events = runner.events(&id, &[]).await;
    first_generation(&mut events, &["web", "worker"]).await;
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(
        snapshot["apps"],
        json!([
            {"name": "web", "io": "tty", "generation": 1, "ports": []},
            {"name": "worker", "io": "streams", "generation": 1, "ports": []},
        ])
    );
    if let Some(sim) = &runner.sim {
        // The streams app's container has no TTY but keeps its stdin; only
        // the tty app is told to force colour.
        let pod = sim
            .get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
            .expect("the watch pod");
        let container = |name: &str| {
            pod["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("no container {name}: {pod}"))
        };
        let forced = |c: &Value| {
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "CLICOLOR_FORCE")
        };
        let (web, worker) = (container("app-web"), container("app-worker"));
        assert_eq!(
            (web["tty"].clone(), web["stdin"].clone()),
            (json!(true), json!(true))
        );
        assert_eq!(
            (worker["tty"].clone(), worker["stdin"].clone()),
            (json!(false), json!(true))
        );
        assert!(forced(&web) && !forced(&worker));
    }

    if backend == Backend::Local {
        // Sandboxed as a tty app is, in a session of its own with no
        // controlling terminal.
        let workload = local_workload("./worker.yaml");
        let stat = proc_stat(workload);
        assert_eq!(stat.session, workload, "{stat:?}");
        assert_eq!(stat.tty_nr, 0, "{stat:?}");
        assert!(has_bwrap_ancestor(workload), "{stat:?}");
        let web = proc_stat(local_workload("./web.yaml"));
        assert_ne!(web.tty_nr, 0, "{web:?}");
    }

    // The streams app: its channel says so, and it runs on pipes, with no
    // forced colour.
    let mut worker = runner.io(&id, "?app=worker").await;
    let Some(IoFrame::Text(seq)) = ws::next_frame(&mut worker).await else {
        panic!("no seq frame first");
    };
    assert_eq!(
        (&seq["type"], &seq["app"], &seq["io"]),
        (&json!("seq"), &json!("worker"), &json!("streams")),
        "{seq}"
    );
    let start = read_until_all(
        &mut worker,
        &[
            "worker starts\n",
            "worker complains\n",
            "CLICOLOR_FORCE=<unset>\n",
            "FORCE_COLOR=<unset>\n",
            "size unknown\n",
        ],
    )
    .await;
    let start = by_tag(&start);
    assert!(!start.contains_key(&StreamTag::Tty), "{start:?}");
    if backend == Backend::Local {
        // Straight from the pipes. (On Kubernetes what the container wrote
        // before the attach joined the log comes from the log, which does
        // not tell the streams apart: it is stdout.)
        assert!(
            start[&StreamTag::Stdout].contains("worker starts\n")
                && !start[&StreamTag::Stdout].contains("worker complains")
                && start[&StreamTag::Stderr].contains("worker complains\n"),
            "{start:?}"
        );
    }

    // A resize is refused, and the socket stays open for stdin and output.
    ws::send_text(&mut worker, r#"{"type":"resize","cols":100,"rows":30}"#).await;
    assert_eq!(
        ws::next_frame(&mut worker).await,
        Some(IoFrame::Text(
            json!({"type": "error", "error": "resize_unsupported", "io": "streams"})
        ))
    );
    // Stdin reaches it; the echo comes back on stdout and stderr, apart.
    // Live output is relayed with its stream at once on the local backend;
    // on Kubernetes, once the attach found its place in the container log
    // (the first live bytes place it, so a second round at the latest).
    echoes_apart(&mut worker, if backend == Backend::Local { 1 } else { 3 }).await;

    // The tty app is as it always was: one terminal, tag 0, resizable.
    let mut web = runner.io(&id, "?app=web").await;
    let Some(IoFrame::Text(seq)) = ws::next_frame(&mut web).await else {
        panic!("no seq frame first");
    };
    assert_eq!((&seq["app"], &seq["io"]), (&json!("web"), &json!("tty")));
    let frames = read_until_all(
        &mut web,
        &["web says hello", "CLICOLOR_FORCE=1", "size 80x24"],
    )
    .await;
    ws::send_text(&mut web, r#"{"type":"resize","cols":100,"rows":30}"#).await;
    let mut frames = [frames, read_until_all(&mut web, &["size 100x30"]).await].concat();
    ws::send_stdin(&mut web, b"web echo\n").await;
    frames.extend(read_until_all(&mut web, &["web echo"]).await);
    let tags = by_tag(&frames);
    assert_eq!(
        tags.keys().collect::<Vec<_>>(),
        [&StreamTag::Tty],
        "{tags:?}"
    );

    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    events.events_until_end().await;
    drop((worker, web));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_session_is_refused_streams_and_a_watch_session_accepts_them() {
    let runner = Runner::start_on(Backend::Local, WATCH).await;
    let mut body = test_support::bundle::start_body(json!({}));
    body["apps"] = json!([{"name": "app", "entryRelativePath": "telo.yaml", "io": "streams"}]);
    let (status, refused) = runner.post("/v1/sessions", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused["error"], "io_unsupported");
    assert_eq!(
        refused["message"],
        "app 'app' asks for io 'streams', which this runner offers to watch sessions only (`mode: \"watch\"`); a run session runs on a terminal (io 'tty')"
    );
    // Saying `tty` is fine.
    body["apps"][0]["io"] = json!("tty");
    let (status, created) = runner.post("/v1/sessions", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");

    // A watch session changes its app set to a streams app.
    let mut watch = test_support::bundle::start_body(json!({"stdout": ["up"]}));
    watch["mode"] = json!("watch");
    let id = runner.create_body(watch).await;
    let mut events = runner.events(&id, &[]).await;
    first_generation(&mut events, &["app"]).await;
    let response = runner
        .client
        .put(runner.url(&format!("/v1/sessions/{id}/apps")))
        .json(
            &json!({"apps": [{"name": "app", "entryRelativePath": "telo.yaml", "io": "streams"}]}),
        )
        .send()
        .await
        .expect("PUT");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(snapshot["apps"][0]["io"], "streams", "{snapshot}");
    let mut socket = runner.io(&id, "").await;
    let Some(IoFrame::Text(seq)) = ws::next_frame(&mut socket).await else {
        panic!("no seq frame first");
    };
    assert_eq!(seq["io"], "streams");
    // The new process is on pipes: its output comes tagged stdout (the
    // replay before it is the old terminal's).
    loop {
        match ws::next_frame(&mut socket).await {
            Some(IoFrame::Output {
                stream: StreamTag::Stdout,
                bytes,
                ..
            }) if String::from_utf8_lossy(&bytes).contains("up\n") => break,
            Some(IoFrame::Output { .. }) => {}
            other => panic!("no stdout output from the new process: {other:?}"),
        }
    }
    drop(socket);
    runner.stop().await;
}

/// A runner SIGKILLed while a streams app runs on Kubernetes: the next one
/// adopts the pod and attaches again, stdout and stderr apart. What the app
/// wrote before comes from the container log, which interleaves both with
/// no mark of which is which: it is relayed as stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_streams_app_is_attached_again_with_its_streams_apart() {
    use common::RunnerProcess;
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .expect("kube-sim starts");
    let mut body = test_support::bundle::start_body(json!({
        "stdout": ["worker starts"],
        "stderr": ["worker complains"],
        "echo": true,
        "echoStderr": true,
    }));
    body["mode"] = json!("watch");
    body["apps"] = json!([{"name": "worker", "entryRelativePath": "telo.yaml", "io": "streams"}]);
    let mut first = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), WATCH).await;
    let client = runner_core::http_client::client();
    let created: Value = client
        .post(format!("{}/v1/sessions", first.base))
        .json(&body)
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON");
    let id = created["sessionId"].as_str().expect("sessionId").to_owned();
    let mut events =
        SseStream::connect(&format!("{}/v1/sessions/{id}/events", first.base), &[]).await;
    first_generation(&mut events, &["worker"]).await;
    let mut socket = ws::connect(&format!("{}/v1/sessions/{id}/io", first.ws_base()), None).await;
    assert!(matches!(
        ws::next_frame(&mut socket).await,
        Some(IoFrame::Text(_))
    ));
    read_until_all(&mut socket, &["worker starts\n", "worker complains\n"]).await;
    drop((events, socket));
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");

    let second = RunnerProcess::spawn(Backend::Kubernetes, dir.path(), Some(&sim), WATCH).await;
    let snapshot_url = format!("{}/v1/sessions/{id}", second.base);
    let deadline = std::time::Instant::now() + test_support::WAIT;
    loop {
        let snapshot: Option<Value> = match client.get(&snapshot_url).send().await {
            Ok(response) => response.json().await.ok(),
            Err(_) => None,
        };
        if snapshot
            .as_ref()
            .is_some_and(|s| s["status"]["kind"] == "running")
        {
            assert_eq!(snapshot.unwrap()["apps"][0]["io"], "streams");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never adopted running: {snapshot:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut socket = ws::connect(&format!("{}/v1/sessions/{id}/io", second.ws_base()), None).await;
    let Some(IoFrame::Text(seq)) = ws::next_frame(&mut socket).await else {
        panic!("no seq frame first");
    };
    assert_eq!(seq["io"], "streams");
    let history =
        by_tag(&read_until_all(&mut socket, &["worker starts\n", "worker complains\n"]).await);
    assert!(!history.contains_key(&StreamTag::Tty), "{history:?}");
    echoes_apart(&mut socket, 3).await;
    let response = client.delete(&snapshot_url).send().await.expect("DELETE");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    drop((second, socket));
    sim.shutdown().await;
}
