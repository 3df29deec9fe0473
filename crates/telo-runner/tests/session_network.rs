//! Local sessions' networks (`RUNNER_LOCAL_NETWORK`): by default each
//! session runs in a network namespace of its own. Two sessions listen on
//! one port without colliding and are each served through the edge; a
//! workload reaches neither the runner's nor the host's loopback services
//! nor another session, but does reach the host's network; the namespaces
//! of a killed runner are removed by the next one; and a host that cannot
//! isolate sessions is refused at boot, naming the way out.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Backend, Runner, RunnerProcess, namespaces_of};
use reqwest::StatusCode;
use serde_json::{Value, json};

const BASE: &str = "http://preview.test";

/// Starts a session of `fake_telo` publishing `port`; returns its id once
/// it runs.
async fn running(runner: &Runner, fake_telo: Value, port: Option<u16>) -> String {
    let mut body = test_support::bundle::start_body(fake_telo);
    if let Some(port) = port {
        body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
    }
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    id
}

/// `GET /` of `port` of session `id` through the edge, once the app
/// listens (bounded).
async fn through_edge(runner: &Runner, id: &str, port: u16) -> (StatusCode, String) {
    let deadline = Instant::now() + test_support::WAIT;
    loop {
        let response = runner
            .client
            .get(runner.url("/"))
            .header("host", format!("{port}-{id}.preview.test"))
            .header("accept", "application/json")
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        if status != StatusCode::BAD_GATEWAY || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A network the test makes beside the host's: a namespace joined to the
/// host by a veth pair, holding a listener. Removed when dropped.
struct Outside {
    name: String,
    listener: std::net::TcpListener,
}

fn ip(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|status| status.success())
}

impl Outside {
    fn new() -> Outside {
        let tag = std::process::id() % 100_000;
        let name = format!("tr-outside-{tag}");
        let (host_if, peer_if) = (format!("tro{tag}"), format!("tri{tag}"));
        assert!(ip(&["netns", "add", &name]), "ip netns add");
        let outside = |address: u8| format!("10.213.{}.{address}", tag % 250);
        assert!(ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", &name
        ]));
        assert!(ip(&[
            "addr",
            "add",
            &format!("{}/30", outside(1)),
            "dev",
            &host_if
        ]));
        assert!(ip(&["link", "set", &host_if, "up"]));
        let inside = format!("{}/30", outside(2));
        for args in [
            ["addr", "add", inside.as_str(), "dev", peer_if.as_str()],
            ["link", "set", peer_if.as_str(), "up", ""],
            ["link", "set", "lo", "up", ""],
        ] {
            let mut all = vec!["-n", name.as_str()];
            all.extend(args.iter().copied().filter(|arg| !arg.is_empty()));
            assert!(ip(&all), "{all:?}");
        }
        // A socket lives in the namespace of the thread that made it.
        let path = format!("/run/netns/{name}");
        let address = outside(2);
        let listener = std::thread::spawn(move || {
            let namespace = std::fs::File::open(path).unwrap();
            nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            std::net::TcpListener::bind((address.as_str(), 0)).unwrap()
        })
        .join()
        .unwrap();
        Outside { name, listener }
    }

    fn address(&self) -> std::net::SocketAddr {
        self.listener.local_addr().unwrap()
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        // The veth pair goes with the namespace.
        ip(&["netns", "delete", &self.name]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_listen_on_one_port_and_each_is_served() {
    let runner = Runner::start_on(Backend::Local, &[("RUNNER_PREVIEW_BASE_URL", BASE)]).await;
    // One port for both: on a shared network the second could not listen.
    let port = test_support::free_port();
    let first = running(&runner, json!({"listen": [port], "echo": true}), Some(port)).await;
    let second = running(&runner, json!({"listen": [port], "echo": true}), Some(port)).await;
    for id in [&first, &second] {
        assert_eq!(
            through_edge(&runner, id, port).await,
            (StatusCode::OK, format!("ok {port}")),
            "{id}"
        );
    }
    // Neither listens on the host's own loopback.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_reaches_the_hosts_network_but_no_loopback_service_or_other_session() {
    let runner = Runner::start_on(Backend::Local, &[("RUNNER_PREVIEW_BASE_URL", BASE)]).await;
    // A service on the host's loopback, and another session's port.
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let loopback_port = loopback.local_addr().unwrap().port();
    let runner_port: u16 = runner.base.rsplit(':').next().unwrap().parse().unwrap();
    let other_port = test_support::free_port();
    let other = running(
        &runner,
        json!({"listen": [other_port], "echo": true}),
        Some(other_port),
    )
    .await;
    assert_eq!(
        through_edge(&runner, &other, other_port).await.0,
        StatusCode::OK
    );
    // A network beyond the host, as the internet would be.
    let outside = Outside::new();
    let dial = vec![
        format!("127.0.0.1:{loopback_port}"),
        format!("127.0.0.1:{runner_port}"),
        format!("127.0.0.1:{other_port}"),
        outside.address().to_string(),
    ];
    // It dials, prints what it reached and exits.
    let id = running(&runner, json!({"dial": dial}), None).await;
    let output = runner.full_output(&id).await;
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim_end)
        .filter(|line| line.starts_with("dial "))
        .collect();
    assert_eq!(lines.len(), dial.len(), "{output}");
    for (line, address) in lines.iter().zip(&dial[..3]) {
        assert!(
            line.starts_with(&format!("dial {address}: closed")),
            "{line}"
        );
    }
    assert_eq!(lines[3], format!("dial {}: open", outside.address()));
    drop(loopback);
    runner.stop().await;
}

/// Starts a session of `body` on `runner` and waits until it runs with
/// namespaces of the runner's in place.
async fn start_until_running(runner: &RunnerProcess, body: Value) {
    let client = test_support::http_client();
    let (_, created) = common::watch::request_at(
        &client,
        &runner.base,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(body),
    )
    .await;
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + test_support::WAIT;
    let status = format!("{}/v1/sessions/{id}", runner.base);
    loop {
        let session: Value = client
            .get(&status)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if session["status"]["kind"] == "running" && !namespaces_of(runner.child.id()).is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{session}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespaces_of_a_killed_runner_are_removed_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let mut killed = RunnerProcess::spawn(Backend::Local, dir.path(), None, &[]).await;
    start_until_running(
        &killed,
        test_support::bundle::start_body(json!({"echo": true})),
    )
    .await;
    let pid = killed.child.id();
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    assert!(!namespaces_of(pid).is_empty(), "a SIGKILL leaves them");

    let next_dir = tempfile::tempdir().unwrap();
    let next = RunnerProcess::spawn(Backend::Local, next_dir.path(), None, &[]).await;
    assert_eq!(namespaces_of(pid), Vec::<String>::new());
    drop(next);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_stopped_with_a_watch_session_kept_leaves_no_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let mut runner = RunnerProcess::spawn(
        Backend::Local,
        dir.path(),
        None,
        &[("RUNNER_WATCH_SESSIONS", "true")],
    )
    .await;
    let mut body = test_support::bundle::start_body(json!({"listen": [0]}));
    body["mode"] = json!("watch");
    start_until_running(&runner, body).await;
    let pid = runner.child.id();
    // SIGTERM: the watch session is suspended for the next runner, and
    // neither its network nor the ones kept ready for new sessions stay.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exited = tokio::task::spawn_blocking(move || {
        let status = runner.child.wait().unwrap();
        (runner, status)
    });
    let (_runner, status) = tokio::time::timeout(test_support::WAIT, exited)
        .await
        .expect("the runner exits on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(namespaces_of(pid), Vec::<String>::new());
}

#[test]
fn a_host_that_cannot_isolate_sessions_is_refused_naming_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_telo-runner"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_clear()
        // Nothing on PATH: no nsenter, setpriv or pasta.
        .env("PATH", dir.path())
        .env("RUNNER_BACKEND", "local")
        .env("RUNNER_LOCAL_WORK_DIR", dir.path().join("sessions"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "RUNNER_LOCAL_NETWORK=isolated needs `nsenter` on the runner's PATH or in /usr/sbin; install it (Debian: util-linux), or set RUNNER_LOCAL_NETWORK=host"
        ),
        "{stderr}"
    );
}
