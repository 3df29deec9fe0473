//! The local backend with the real Telo CLI: the self-check's verdict on
//! Node.js 20 and 24, the shared kernel cache, and a graceful stop of a
//! serving app.
//!
//! Every test here is `#[ignore]`d: it runs only where a kernel is given
//! (`TELO_REAL_KERNEL_DIR` naming a Telo CLI layout, and `--run-ignored`),
//! and fails saying so when asked to run without one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};

use runner_core::StartSpec;
use runner_core::types::{
    AvailabilityReport, BundleFile, PortMapping, PortProtocol, PullPolicy, ReachabilityState,
    RunBundle, RunEvent, RunStatus,
};
use runner_core::{Backend, ProbeConfig};
use runner_local::kernel_check::NODE_REMEDIATION;
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
    let telo = telo.to_string_lossy().into_owned();
    Harness::with(
        move |c| {
            c.telo = telo;
            c.path = SYSTEM_PATH.to_owned();
        },
        limits(),
    )
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
async fn a_second_hello_world_session_builds_no_controller_from_source() {
    let harness = real_harness(&fixture().join("bin/telo"));
    let mut outputs = Vec::new();
    for _ in 0..2 {
        let session = harness.start(example_spec("hello-world"));
        assert_eq!(
            Events::of(&session).within(KERNEL_WAIT).terminal().await,
            RunStatus::Exited { code: 0 }
        );
        let output = output_now(&session);
        assert!(output.contains("Hello from Telo!"), "{output:?}");
        outputs.push(output);
    }
    // The first session of a fresh work root fills the cache (the self-check
    // imports nothing), the second finds its controller there.
    assert!(outputs[0].contains("source-build"), "{:?}", outputs[0]);
    assert!(!outputs[1].contains("source-build"), "{:?}", outputs[1]);
}

#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_real_server_lets_it_log_stopped_listening_before_stopped() {
    let harness = real_harness(&fixture().join("bin/telo"));
    let port = free_port();
    let mut spec = with_ports(
        example_spec("http-hello"),
        &[PortMapping {
            port,
            protocol: PortProtocol::Tcp,
        }],
    );
    spec.env = vec![("PORT".to_owned(), port.to_string())];
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
