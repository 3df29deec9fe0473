//! `telo-runner dev` as a user starts it: the real binary on a free port,
//! driven over real sockets. A dev runner has no token, so which browser
//! pages it serves, and what it says about who can drive it, is the
//! security boundary these tests hold.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::bundle::start_body;

const BIN: &str = env!("CARGO_BIN_EXE_telo-runner");
const START_BOUND: Duration = Duration::from_secs(60);
const STOP_BOUND: Duration = Duration::from_secs(30);

/// A running `telo-runner dev`, stopped with SIGTERM (killed if the test
/// ends first), with what it printed up to its next steps.
struct Dev {
    child: Option<Child>,
    said: Vec<String>,
    base: String,
    /// Its own sessions' directory: two local runners may not share one,
    /// and tests run side by side.
    _work: tempfile::TempDir,
}

impl Dev {
    fn start(args: &[&str]) -> Dev {
        for companion in ["fake-telo", "kube-sim"] {
            test_support::fake_telo::workspace_binary(companion);
        }
        Self::start_command(dev_command(args))
    }

    fn start_command(mut command: Command) -> Dev {
        let work = tempfile::tempdir().unwrap();
        let mut child = command
            .env("RUNNER_LOCAL_WORK_DIR", work.path().join("sessions"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (lines, seen) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut said = Vec::new();
        loop {
            let line = seen
                .recv_timeout(START_BOUND)
                .unwrap_or_else(|_| panic!("dev did not come up; it said {said:#?}"));
            let done = line.starts_with("Next, in another terminal:");
            said.push(line);
            if done {
                break;
            }
        }
        let base = said
            .iter()
            .find_map(|line| line.strip_prefix("listening on "))
            .expect("dev says where it listens")
            .trim()
            .to_owned();
        Dev {
            child: Some(child),
            said,
            base,
            _work: work,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn said_line(&self, line: &str) -> bool {
        self.said.iter().any(|said| said == line)
    }

    /// SIGTERM, and it stops with what it started.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        let (exited, exit) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = exited.send(child.wait());
        });
        let status = exit.recv_timeout(STOP_BOUND).unwrap().unwrap();
        assert!(status.success(), "{status}");
    }
}

impl Drop for Dev {
    /// A test that failed before `stop`: SIGTERM first, so dev stops what
    /// it started (a SIGKILL would leave its kube-sim running), then a kill
    /// if it does not exit in time.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = std::time::Instant::now() + STOP_BOUND;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn dev_command(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg("dev")
        .args(["--port", "0"])
        .args(args)
        .env_remove("PORT")
        .env_remove("RUNNER_CORS_ORIGINS")
        .env_remove("RUNNER_AUTH_TOKENS_FILE")
        .env_remove("RUNNER_BACKEND")
        .env_remove("LOG_LEVEL")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    command
}

async fn preflight(client: &reqwest::Client, dev: &Dev, origin: &str) -> reqwest::Response {
    client
        .request(reqwest::Method::OPTIONS, dev.url("/v1/sessions"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap()
}

async fn start_from(client: &reqwest::Client, dev: &Dev, origin: &str) -> reqwest::Response {
    client
        .post(dev.url("/v1/sessions"))
        .header("origin", origin)
        .json(&start_body(json!({"stdout": ["hi"], "exitCode": 0})))
        .send()
        .await
        .unwrap()
}

const LOOPBACK_LINE: &str = "  browser  pages from http://localhost:*, http://127.0.0.1:*, http://[::1]:* only (--allow-origin ORIGIN admits another, e.g. a hosted editor's); any other page is refused";
const OPEN_LINE: &str = "  access   open, no token: every program and user on this machine that can reach loopback can start sessions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_refuses_a_foreign_page_and_serves_loopback_pages() {
    let dev = Dev::start(&[]);
    assert!(dev.said_line(LOOPBACK_LINE), "{:#?}", dev.said);
    assert!(dev.said_line(OPEN_LINE), "{:#?}", dev.said);
    let client = test_support::http_client();

    let refused = preflight(&client, &dev, "https://evil.example").await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(
        refused
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    assert_eq!(
        refused.json::<Value>().await.unwrap()["error"],
        "origin_not_allowed"
    );
    let refused = start_from(&client, &dev, "https://evil.example").await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        refused.json::<Value>().await.unwrap()["error"],
        "origin_not_allowed"
    );
    // A look-alike of loopback is a foreign host.
    let refused = start_from(&client, &dev, "http://localhost.evil.example").await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let listed: Value = client
        .get(dev.url("/v1/sessions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["sessions"], json!([]), "no page started a session");

    let admitted = preflight(&client, &dev, "http://localhost:5173").await;
    assert_eq!(admitted.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        admitted.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );
    let created = start_from(&client, &dev, "http://127.0.0.1:3000").await;
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_eq!(
        created.headers()["access-control-allow-origin"],
        "http://127.0.0.1:3000"
    );
    dev.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_admits_a_named_origin_and_warns_when_every_origin_is_let_in() {
    let client = test_support::http_client();
    let named = Dev::start(&["--allow-origin", "https://editor.example"]);
    let admitted = preflight(&client, &named, "https://editor.example").await;
    assert_eq!(admitted.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        preflight(&client, &named, "https://evil.example")
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    named.stop();

    let any = Dev::start(&["--any-origin"]);
    assert!(
        any.said_line("warning: --any-origin: every web page open in a browser on this machine can start sessions on this runner and run what it sends"),
        "{:#?}",
        any.said
    );
    assert_eq!(
        preflight(&client, &any, "https://evil.example")
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    any.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_on_kubernetes_warns_that_pods_are_host_processes() {
    let dev = Dev::start(&["--kubernetes"]);
    let uid = nix::unistd::geteuid().as_raw();
    let who = if uid == 0 {
        "as root, with the whole machine in reach".to_owned()
    } else {
        format!("as this user (uid {uid})")
    };
    let warning = format!(
        "warning: --kubernetes: kube-sim runs each session pod as a plain process on this host, {who}, with no container and no sandbox; run only applications you trust"
    );
    assert!(dev.said_line(&warning), "{:#?}", dev.said);
    assert!(dev.said_line(LOOPBACK_LINE), "{:#?}", dev.said);
    dev.stop();
}

#[test]
fn dev_refuses_origins_it_cannot_honour_with_exit_2() {
    for (args, env, message) in [
        (
            &["--allow-origin", "https://editor.example/app"][..],
            None,
            "telo-runner dev: --allow-origin 'https://editor.example/app': expected a browser origin such as https://editor.example (scheme://host[:port], no path); --any-origin admits every origin\n",
        ),
        (
            &[][..],
            Some("*"),
            "telo-runner dev: RUNNER_CORS_ORIGINS is set, but dev decides the browser origins itself: unset it and pass --allow-origin ORIGIN (repeatable) or --any-origin\n",
        ),
    ] {
        let mut command = dev_command(args);
        if let Some(value) = env {
            command.env("RUNNER_CORS_ORIGINS", value);
        }
        let output = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        assert_eq!(String::from_utf8_lossy(&output.stderr), message);
    }
}

/// The page headless Chromium shows for `url` (its DOM), as a browser
/// opens a preview link: `*.localhost` resolved to loopback by the browser
/// itself, redirects followed, cookies kept.
fn chromium_page(url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--dump-dom", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium runs (.ci/run installs Debian's chromium)");
    let stdout = child.stdout.take().unwrap();
    let (done, page) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut text);
        let _ = done.send(text);
    });
    let text = page.recv_timeout(START_BOUND);
    let _ = child.kill();
    let _ = child.wait();
    text.expect("chromium printed the page in time")
}

#[rstest::rstest]
#[case::local(&[], "public")]
#[case::kubernetes_private(&["--kubernetes"], "private")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_link_from_dev_opens_in_a_real_browser(
    #[case] args: &[&str],
    #[case] access: &str,
) {
    for companion in ["fake-telo", "kube-sim"] {
        test_support::fake_telo::workspace_binary(companion);
    }
    let mut command = dev_command(args);
    command.env("RUNNER_PREVIEW_ACCESS", access);
    let dev = Dev::start_command(command);
    let client = runner_core::http_client::client();
    let port = test_support::free_port();
    let mut body = start_body(json!({"listen": [port], "stdout": ["up"]}));
    body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
    let created: Value = client
        .post(dev.url("/v1/sessions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events =
        test_support::sse::SseStream::connect(&dev.url(&format!("/v1/sessions/{id}/events")), &[])
            .await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let url = frames.last().unwrap().json()["status"]["endpoints"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let dev_port = dev.base.rsplit(':').next().unwrap().to_owned();
    let origin = format!("http://{port}-{id}.localhost:{dev_port}");
    assert!(url.starts_with(&origin), "{url}");
    assert_eq!(url.contains("telo_access="), access == "private", "{url}");
    // The app may take a moment to listen after `running`: a browser's
    // reload, bounded.
    let deadline = std::time::Instant::now() + START_BOUND;
    let page = loop {
        let url = url.clone();
        let page = tokio::task::spawn_blocking(move || chromium_page(&url))
            .await
            .unwrap();
        if page.contains(&format!("ok {port}")) {
            break page;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(page.contains(&format!("ok {port}")), "{page}");
    client
        .delete(dev.url(&format!("/v1/sessions/{id}")))
        .send()
        .await
        .unwrap();
    events.events_until_end().await;
    dev.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_client_prints_the_preview_link_dev_serves() {
    let dev = Dev::start(&[]);
    let app = tempfile::tempdir().unwrap();
    std::fs::write(
        app.path().join("telo.yaml"),
        "kind: Telo.Application\nmetadata: { name: test }\nfakeTelo: {\"stdout\": [\"up\"], \"exitCode\": 0}\n",
    )
    .unwrap();
    let port = test_support::free_port();
    let output = Command::new(BIN)
        .args([
            "run",
            app.path().to_str().unwrap(),
            "--port",
            &port.to_string(),
            "--runner",
            &dev.base,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let dev_port = dev.base.rsplit(':').next().unwrap();
    let line = said
        .lines()
        .find(|line| line.starts_with("telo-runner: endpoint "))
        .unwrap_or_else(|| panic!("no endpoint line in {said}"));
    let link = line.trim_start_matches("telo-runner: endpoint ");
    assert!(
        link.starts_with(&format!("http://{port}-"))
            && link.ends_with(&format!(".localhost:{dev_port}/")),
        "{link}"
    );
    dev.stop();
}
