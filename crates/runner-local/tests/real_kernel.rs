//! The local backend with the real Telo CLI: the self-check's verdict on
//! Node.js 20 and 24, the warmed kernel cache sessions start from, and a
//! graceful stop of a serving app.
//!
//! Every test here is `#[ignore]`d: it runs only where a kernel is given
//! (`TELO_REAL_KERNEL_DIR` naming a Telo CLI layout, and `--run-ignored`),
//! and fails saying so when asked to run without one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};

use runner_core::StartSpec;
use runner_core::registry::Session;
use runner_core::types::{
    AvailabilityReport, BundleFile, PortMapping, PortProtocol, PullPolicy, ReachabilityState,
    RunBundle, RunEvent, RunStatus,
};
use runner_core::{Backend, ProbeConfig};
use runner_local::kernel::check::NODE_REMEDIATION;
use serde_json::Value;
use support::{Events, Harness, Output, bundle_spec, limits, output_now, with_ports};
use test_support::free_port;
use test_support::real_kernel::KERNEL_WAIT;

/// The workload `PATH`: the system's, whose `node` is whatever the machine
/// has (the fixture's wrapper brings its own Node.js 24).
const SYSTEM_PATH: &str = "/usr/bin:/bin";
const SYSTEM_NODE: &str = "/usr/bin/node";

fn fixture() -> PathBuf {
    test_support::real_kernel::fixture_dir()
}

/// A session of example `name`, its imports pointed at the installed modules.
fn example_spec(name: &str) -> StartSpec {
    let files = test_support::real_kernel::example_files(name)
        .into_iter()
        .map(|(relative_path, contents)| BundleFile {
            relative_path,
            contents,
        })
        .collect();
    StartSpec {
        bundle: RunBundle {
            entry_relative_path: "telo.yaml".to_owned(),
            files,
        },
        entry_relative_path: "telo.yaml".to_owned(),
        ..bundle_spec(Value::Null)
    }
}

fn real_harness(telo: &Path) -> Harness {
    real_harness_with(telo, |_| {})
}

fn real_harness_with(telo: &Path, adjust: impl FnOnce(&mut runner_local::LocalConfig)) -> Harness {
    let telo = telo.to_string_lossy().into_owned();
    Harness::with(
        move |c| {
            c.telo = telo;
            c.path = SYSTEM_PATH.to_owned();
            adjust(c);
        },
        limits(),
    )
}

/// A warm-up manifest loading every controller the examples below use:
/// console, run and javascript built from source, the HTTP server's API
/// installed with npm (whose server shares its package). It exits once
/// they are loaded.
fn warm_up_manifest(dir: &Path) -> PathBuf {
    let modules = fixture().join("modules");
    let modules = modules.display();
    let manifest = format!(
        r#"kind: Telo.Application
metadata:
  name: RunnerKernelCacheWarmUp
  version: 1.0.0
imports:
  Console: "{modules}/console"
  JavaScript: "{modules}/javascript"
  Run: "{modules}/run"
  Http: "{modules}/http-server"
targets:
  - invoke: !ref Console.writeLine
    inputs:
      output: "warm"
---
kind: JavaScript.Script
metadata:
  name: noop
code: |
  function main() {{ return {{}} }}
---
kind: Run.Value
metadata:
  name: value
value:
  message: "x"
---
kind: Http.Api
metadata:
  name: api
routes:
  - request:
      path: /x
      method: GET
    handler: !ref value
    returns:
      - status: 200
        content:
          application/json:
            schema: {{ type: object }}
            body: {{}}
"#
    );
    let path = dir.join("warm-up.yaml");
    std::fs::write(&path, manifest).unwrap();
    path
}

/// Every file under `dir` (symlinks as links), with its size and time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                files.push((entry.path(), meta.len(), meta.modified().unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// http-hello on a free port, as a session.
fn http_hello_spec() -> (StartSpec, u16) {
    let port = free_port();
    let mut spec = with_ports(
        example_spec("http-hello"),
        &[PortMapping {
            port,
            protocol: PortProtocol::Tcp,
        }],
    );
    spec.env = vec![("PORT".to_owned(), port.to_string())];
    (spec, port)
}

/// Whether `GET /v1/hello?name=World` on `port` of the session answers
/// `200`, asked where the runner dials the session's ports (inside its
/// network namespace).
async fn hello_answers(session: &Session, port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(reach) = session.reach() else {
        return false;
    };
    let Ok(mut stream) = reach.connect(port).await else {
        return false;
    };
    let request =
        "GET /v1/hello?name=World HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    answer.starts_with(b"HTTP/1.1 200 ")
}

/// Starts http-hello and returns how long its first `200` took (polled
/// every 10 ms), the session, and its output by then.
async fn time_http_hello(harness: &Harness) -> (std::time::Duration, String) {
    let (spec, port) = http_hello_spec();
    let started = std::time::Instant::now();
    let session = harness.start(spec);
    let answered = tokio::time::timeout(KERNEL_WAIT, async {
        let mut poll = tokio::time::interval(std::time::Duration::from_millis(10));
        loop {
            poll.tick().await;
            if hello_answers(&session, port).await {
                return started.elapsed();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("http-hello never answered: {:?}", output_now(&session)));
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(
        Events::of(&session).within(KERNEL_WAIT).terminal().await,
        RunStatus::Stopped
    );
    (answered, output_now(&session))
}

fn probe_config() -> ProbeConfig {
    ProbeConfig {
        image: "local".to_owned(),
        pull_policy: PullPolicy::Missing,
    }
}

fn system_node_version() -> Option<String> {
    let output = std::process::Command::new(SYSTEM_NODE)
        .arg("--version")
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn major(version: &str) -> Option<u32> {
    version.strip_prefix('v')?.split('.').next()?.parse().ok()
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_cli_on_node_20_is_unavailable_and_says_to_install_node_24() {
    let fixture = fixture();
    let Some(version) = system_node_version() else {
        eprintln!("note: skipped, {SYSTEM_NODE} cannot be run");
        return;
    };
    if major(&version).is_none_or(|major| major >= 24) {
        eprintln!("note: skipped, {SYSTEM_NODE} is {version}, which the real CLI accepts");
        return;
    }
    let scripts = tempfile::tempdir().unwrap();
    let telo = scripts.path().join("telo");
    support::install_script(
        &telo,
        &format!(
            "#!/bin/sh\nexec {SYSTEM_NODE} {}/telo-cli/bin/telo.mjs \"$@\"\n",
            fixture.display()
        ),
    );
    // The wrapper runs the fixture's CLI, which lies outside its own
    // directory: the sandbox is told to show it.
    let cli = fixture.join("telo-cli");
    let telo_path = telo.to_string_lossy().into_owned();
    let harness = Harness::with(
        move |c| {
            c.telo = telo_path;
            c.path = SYSTEM_PATH.to_owned();
            if let runner_local::SandboxConfig::Bubblewrap(sandbox) = &mut c.sandbox {
                sandbox.read_only.push(cli);
            }
        },
        limits(),
    );
    let message = format!(
        "The Telo CLI '{}' cannot run on this runner's Node.js ({version}): Telo requires Node.js 24 or newer.",
        telo.display()
    );
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Unavailable {
            message: message.clone(),
            remediation: Some(NODE_REMEDIATION.to_owned()),
        }
    );
    let session = harness.start(example_spec("hello-world"));
    assert_eq!(
        Events::of(&session).within(KERNEL_WAIT).terminal().await,
        RunStatus::failed(format!("start: {message} {NODE_REMEDIATION}"))
    );
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_cli_wrapper_is_ready() {
    let harness = real_harness(&fixture().join("bin/telo"));
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Ready
    );
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_warm_up_every_hello_world_session_builds_its_controller_itself() {
    let harness = real_harness(&fixture().join("bin/telo"));
    for _ in 0..2 {
        let session = harness.start(example_spec("hello-world"));
        assert_eq!(
            Events::of(&session).within(KERNEL_WAIT).terminal().await,
            RunStatus::Exited { code: 0 }
        );
        let output = output_now(&session);
        assert!(output.contains("Hello from Telo!"), "{output:?}");
        // Nothing the first one built reached the second.
        assert!(output.contains("source-build"), "{output:?}");
    }
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_sessions_start_warm_from_the_runners_cache_and_never_change_it() {
    let config = tempfile::tempdir().unwrap();
    let manifest = warm_up_manifest(config.path());
    let harness = real_harness_with(&fixture().join("bin/telo"), |c| {
        c.kernel_cache.warm_up = Some(manifest);
    });
    let key = harness.backend.warm_kernel_cache(None).await.unwrap();
    let entry = harness
        .config
        .work_root
        .join(".kernel-cache")
        .join(key.as_str());
    let before = snapshot(&entry);
    assert!(!before.is_empty());

    for example in ["hello-world", "javascript"] {
        let session = harness.start(example_spec(example));
        assert_eq!(
            Events::of(&session).within(KERNEL_WAIT).terminal().await,
            RunStatus::Exited { code: 0 },
            "{example}: {:?}",
            output_now(&session)
        );
        let output = output_now(&session);
        assert!(!output.contains('⬇'), "{example}: {output:?}");
    }
    // The npm install root too: the session sees its copy where the
    // warm-up saw the original.
    let (_, output) = time_http_hello(&harness).await;
    assert!(output.contains("Listening"), "{output:?}");
    assert!(!output.contains('⬇'), "{output:?}");
    assert_eq!(snapshot(&entry), before);
}

/// Not a check but a measurement (`--no-capture` shows it): http-hello's
/// first `200`, started cold (no warm-up) and warm (from the warmed cache).
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kernel_http_hello_cold_and_warm_start_times() {
    const SAMPLES: usize = 5;
    let config = tempfile::tempdir().unwrap();
    let manifest = warm_up_manifest(config.path());
    let cold = real_harness(&fixture().join("bin/telo"));
    let warm = real_harness_with(&fixture().join("bin/telo"), |c| {
        c.kernel_cache.warm_up = Some(manifest);
    });
    assert_eq!(
        cold.backend.kernel_health().await,
        runner_local::KernelHealth::Usable
    );
    warm.backend.warm_kernel_cache(None).await.unwrap();
    let mut times = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        let (took, output) = time_http_hello(&cold).await;
        assert!(output.contains("npm-install"), "{output:?}");
        times.0.push(took);
        let (took, output) = time_http_hello(&warm).await;
        assert!(!output.contains('⬇'), "{output:?}");
        times.1.push(took);
    }
    for (name, samples) in [("cold", &mut times.0), ("warm", &mut times.1)] {
        samples.sort();
        eprintln!(
            "http-hello first 200, {name}: min {:?} / median {:?} / max {:?}",
            samples[0],
            samples[SAMPLES / 2],
            samples[SAMPLES - 1]
        );
    }
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_real_server_lets_it_log_stopped_listening_before_stopped() {
    let harness = real_harness(&fixture().join("bin/telo"));
    let (spec, port) = http_hello_spec();
    let session = harness.start(spec);
    let mut events = Events::of(&session).within(KERNEL_WAIT);
    events
        .until("the server to be reachable", |e| {
            *e == RunEvent::Reachability {
                app: Some("app".into()),
                port,
                state: ReachabilityState::Reachable,
            }
        })
        .await;
    Output::of(&session)
        .within(KERNEL_WAIT)
        .until("Listening")
        .await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(events.terminal().await, RunStatus::Stopped);
    let output = output_now(&session);
    assert!(output.contains("Stopped listening"), "{output:?}");
}
