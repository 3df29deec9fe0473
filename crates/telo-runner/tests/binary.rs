//! The `telo-runner` executable: configuration refusals, `--help`, and graceful
//! shutdown on a signal.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use rstest::rstest;
use serde_json::json;
use test_support::fake_telo::fake_telo_path;
use test_support::sse::SseStream;

const BIN: &str = env!("CARGO_BIN_EXE_telo-runner");
static WORK_ROOTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Kills the child if the test ends before it exited.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve_command(vars: &[(&str, &str)]) -> Command {
    // Each runner sweeps its work root at boot, so every test gets its own.
    let work_root = std::env::temp_dir().join(format!(
        "telo-runner-binary-test-{}-{}",
        std::process::id(),
        WORK_ROOTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUNNER_LOCAL_TELO", fake_telo_path())
        .env("RUNNER_LOCAL_WORK_DIR", &work_root)
        .stdin(Stdio::null());
    for (key, value) in vars {
        command.env(key, value);
    }
    command
}

/// Spawns the runner and waits for its `listening on <base>` line.
async fn serving(mut command: Command) -> (ChildGuard, String) {
    let mut child = ChildGuard(
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn telo-runner"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .expect("first line names the address")
        .to_owned();
    (child, base)
}

#[rstest]
#[case(&[("RUNNER_MAX_SESSIONS", "abc")], "RUNNER_MAX_SESSIONS must be a positive integer, got 'abc'.")]
#[case(&[("RUNNER_EXIT_TTL_MS", "0")], "RUNNER_EXIT_TTL_MS must be a positive integer, got '0'.")]
#[case(&[("RUNNER_REPLAY_BUFFER_BYTES", "-5")], "RUNNER_REPLAY_BUFFER_BYTES must be a positive integer, got '-5'.")]
#[case(&[("PORT", "")], "PORT must be an integer in 1..65535, got ''.")]
#[case(&[("PORT", "70000")], "PORT must be an integer in 1..65535, got '70000'.")]
#[case(&[("RUNNER_APPS", "[1]")], "RUNNER_APPS must be a JSON object mapping app name → app config.")]
#[case(&[("RUNNER_APPS", r#"{"a":{}}"#)], "RUNNER_APPS entry 'a' needs a non-empty string 'image'.")]
#[case(&[("RUNNER_TERMS_FILE", "/nonexistent/terms.md")], "RUNNER_TERMS_FILE could not be read at '/nonexistent/terms.md': ")]
#[case(&[("RUNNER_AUTH_TOKENS_FILE", "/nonexistent/tokens")], "RUNNER_AUTH_TOKENS_FILE '/nonexistent/tokens' could not be read: ")]
#[case(&[("RUNNER_AUTH_TOKENS_FILE", "/dev/null")], "RUNNER_AUTH_TOKENS_FILE '/dev/null' holds no token (one per line; blank lines and # comments are ignored).")]
#[case(&[("RUNNER_STOP_GRACE_SECONDS", "-1")], "RUNNER_STOP_GRACE_SECONDS must be a non-negative integer, got '-1'.")]
#[case(&[("RUNNER_STOP_GRACE_SECONDS", "2.5")], "RUNNER_STOP_GRACE_SECONDS must be a non-negative integer, got '2.5'.")]
#[case(&[("RUNNER_BACKEND", "docker")], "RUNNER_BACKEND must be one of local | kubernetes (got 'docker').")]
#[case(&[("RUNNER_LOCAL_SANDBOX", "off")], "RUNNER_LOCAL_SANDBOX must be one of bubblewrap | none (got 'off').")]
#[case(&[("RUNNER_LOCAL_SANDBOX_READ_ONLY", "/opt/node:node_modules")], "RUNNER_LOCAL_SANDBOX_READ_ONLY must list absolute paths separated by ':', got 'node_modules'.")]
#[case(&[("RUNNER_LOCAL_MAX_MEMORY", "1.5Gi")], "RUNNER_LOCAL_MAX_MEMORY must be a byte size such as 512Mi, 1Gi or 1073741824, got '1.5Gi'.")]
#[case(&[("RUNNER_LOCAL_MAX_DISK", "0")], "RUNNER_LOCAL_MAX_DISK must be a byte size such as 512Mi, 1Gi or 1073741824, got '0'.")]
#[case(&[("RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES", "lots")], "RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES must be a byte size such as 512Mi, 1Gi or 1073741824, got 'lots'.")]
#[case(&[("RUNNER_LOCAL_KERNEL_CACHE_WARM_UP", "warm-up.yaml")], "RUNNER_LOCAL_KERNEL_CACHE_WARM_UP must be an absolute path, got 'warm-up.yaml'.")]
#[case(&[("RUNNER_LOCAL_MAX_CPU", "two")], "RUNNER_LOCAL_MAX_CPU must be a number of CPUs such as 1, 0.5 or 500m, got 'two'.")]
#[case(&[("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "none")], "RUNNER_MAX_CONNECTIONS_PER_CLIENT must be a positive integer, got 'none'.")]
#[case(&[("RUNNER_TRUSTED_PROXIES", "10.0.0.0/8, ingress.internal")], "RUNNER_TRUSTED_PROXIES must be a comma-separated list of IP addresses and CIDR ranges ('ingress.internal' is neither), got '10.0.0.0/8, ingress.internal'.")]
#[case(&[("LOG_FORMAT", "xml")], "LOG_FORMAT must be one of json | pretty (got 'xml').")]
#[case(&[("LOG_LEVEL", "loud")], "LOG_LEVEL must be one of trace | debug | info | warn | error | off, or a filter such as 'info,runner_k8s=debug' (got 'loud').")]
#[case(&[("RUNNER_BACKEND", "kubernetes")], "RUNNER_SELF_URL env var is required. Set it to the runner's in-cluster base URL (e.g. http://k8s-runner.telo-runner.svc:8062) so session initContainers can fetch the bundle.")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("RUNNER_WARM_POOL_SURGE", "0")], "RUNNER_WARM_POOL_SURGE must be a whole number of pods from 1 to 100, got '0'.")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("RUNNER_WATCH_SESSIONS", "true"), ("RUNNER_WARM_POOL_WATCH", "telorun/node:0-slim")], "RUNNER_WARM_POOL_WATCH must be a comma-separated list of <image>=<count>, each image once, counts 0 to 100, got 'telorun/node:0-slim'.")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("RUNNER_WARM_POOL_WATCH", "telorun/node:0-slim=1")], "RUNNER_WARM_POOL_WATCH must be empty unless RUNNER_WATCH_SESSIONS is true, got 'telorun/node:0-slim=1'.")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("RUNNER_WARM_POOL_MODULES", "Http-Server")], "RUNNER_WARM_POOL_MODULES must be none or a comma-separated list of at most 32 module names (lowercase letters and digits, words joined by single dashes), each once, got 'Http-Server'.")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("RUNNER_PEER_TOKEN_FILE", "/nonexistent/peer-token")], "RUNNER_PEER_TOKEN_FILE '/nonexistent/peer-token' could not be read: ")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("RUNNER_LEASE_DURATION_SECONDS", "1")], "RUNNER_LEASE_DURATION_SECONDS must be a whole number of seconds from 3, got '1'.")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("SESSION_ROUTING_MODE", "Ingress")], "SESSION_ROUTING_MODE must be one of auto | ingress | gateway | none (got 'Ingress').")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("SESSION_INGRESS_ANNOTATIONS", "[1]")], "SESSION_INGRESS_ANNOTATIONS is not a JSON object of annotation names to strings: invalid type: sequence, expected a map at line 1 column 0")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("SESSION_INGRESS_ANNOTATIONS", r#"{"auth url": "x"}"#)], "SESSION_INGRESS_ANNOTATIONS must name each annotation as Kubernetes does ([prefix/]name: a DNS subdomain prefix, a name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit), got 'auth url'.")]
#[case(&[("RUNNER_BACKEND", "kubernetes"), ("RUNNER_SELF_URL", "http://runner:8062"), ("SESSION_ROUTING_MODE", "gateway"), ("SESSION_GATEWAY_NAME", "public"), ("SESSION_INGRESS_ANNOTATIONS", r#"{"a/b": "c"}"#)], "SESSION_INGRESS_ANNOTATIONS is set but session routing is Gateway API, which makes no Ingress to carry them (the token check they configure would be silently missing). Configure the check on the Gateway, or set SESSION_ROUTING_MODE=ingress.")]
fn bad_configuration_exits_2_with_the_exact_message(
    #[case] vars: &[(&str, &str)],
    #[case] message: &str,
) {
    let output = serve_command(vars).output().expect("run telo-runner");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(message),
        "stderr: {stderr:?}\nwanted: {message:?}"
    );
    assert!(output.stdout.is_empty(), "nothing was served");
}

#[test]
fn help_documents_every_environment_variable() {
    let output = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for var in runner_core::config::CORE_SETTINGS
        .iter()
        .chain(runner_local::LOCAL_SETTINGS)
        .chain(runner_k8s::config::K8S_SETTINGS)
        .chain(telo_runner::cli::BINARY_SETTINGS)
    {
        assert!(help.contains(var.name), "--help misses {}", var.name);
    }
}

#[tokio::test]
async fn sigterm_stops_live_sessions_reports_them_stopped_and_exits_0() {
    let (mut child, base) = serving(serve_command(&[])).await;

    let client = runner_core::http_client::client();
    let created: serde_json::Value = client
        .post(format!("{base}/v1/sessions"))
        .json(&test_support::bundle::start_body(json!({"echo": true})))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap();
    let mut events = SseStream::connect(&format!("{base}/v1/sessions/{id}/events"), &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    // Terminal sockets get a close frame, never a dropped connection (which
    // the editor reads as a network error).
    let ws_base = base.replacen("http", "ws", 1);
    let mut sockets = Vec::new();
    for _ in 0..20 {
        sockets
            .push(test_support::ws::connect(&format!("{ws_base}/v1/sessions/{id}/io"), None).await);
    }
    for socket in &mut sockets {
        test_support::ws::next_frame(socket)
            .await
            .expect("the seq frame");
    }

    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();

    let rest = events.events_until_end().await;
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    for socket in &mut sockets {
        let frames = test_support::ws::read_until_close(socket).await;
        assert_eq!(
            frames.last(),
            Some(&test_support::ws::IoFrame::Close {
                code: 1000,
                reason: "session terminal".into()
            })
        );
    }
    let status = tokio::task::spawn_blocking(move || child.0.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn a_second_local_runner_on_the_same_work_dir_exits_2_and_leaves_the_first_alone() {
    let work_root = tempfile::tempdir().unwrap();
    let root = work_root.path().to_string_lossy().into_owned();
    let (mut first, _) = serving(serve_command(&[("RUNNER_LOCAL_WORK_DIR", &root)])).await;
    let output = serve_command(&[("RUNNER_LOCAL_WORK_DIR", &root)])
        .output()
        .expect("run a second telo-runner");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(&format!(
            "RUNNER_LOCAL_WORK_DIR '{root}' is in use by another telo-runner; give each runner its own work directory."
        )),
        "{stderr}"
    );
    assert!(first.0.try_wait().unwrap().is_none(), "the first runs on");
}

/// Logs written to a pipe or a file are plain text: no colour sequences.
#[test]
fn logs_into_a_pipe_carry_no_colour() {
    let mut child = ChildGuard(
        serve_command(&[])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn telo-runner"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    // The boot lines, up to the one that says it serves.
    let mut stderr = String::new();
    let mut lines = BufReader::new(child.0.stderr.take().unwrap());
    while !stderr.contains("serving") {
        let mut line = String::new();
        assert!(lines.read_line(&mut line).unwrap() > 0, "{stderr}");
        stderr.push_str(&line);
    }
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

#[test]
fn a_missing_kernel_is_reported_at_boot_with_what_to_do() {
    let mut child = ChildGuard(
        serve_command(&[("RUNNER_LOCAL_TELO", "/nonexistent/bin/telo")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn telo-runner"),
    );
    let (lines, seen) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.0.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = String::new();
    let warning = loop {
        let line = seen
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no boot warning about the kernel in:\n{log}"));
        log.push_str(&line);
        log.push('\n');
        if line.contains("was not found") {
            break line;
        }
    };
    assert!(warning.contains(" WARN "), "{warning}");
    assert!(
        warning.contains(
            "the Telo CLI '/nonexistent/bin/telo' was not found; Telo sessions will fail until it is there. Install the Telo CLI, or set RUNNER_LOCAL_TELO to the path of its executable."
        ),
        "{warning}"
    );
}
