//! The local backend end to end: a real registry, real processes (`fake-telo`
//! as the Telo CLI, `sh` for app commands) in real PTYs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use runner_core::types::{
    AvailabilityReport, PortMapping, PortProtocol, PullPolicy, ReachabilityState, RunEvent,
    RunStatus, RunnerEndpoint,
};
use runner_core::{Backend, ProbeConfig, RegistryLimits};
use serde_json::json;
use support::{Events, Harness, Output, app_spec, bundle_spec, limits, output_now, with_ports};
use test_support::free_port;

fn probe_config() -> ProbeConfig {
    ProbeConfig {
        image: "local".to_owned(),
        pull_policy: PullPolicy::Missing,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_reaches_the_buffer_before_the_exit_code_is_reported() {
    let harness = Harness::new();
    let session = harness.start(bundle_spec(json!({
        "stdout": ["hello from the workload"],
        "exitCode": 3,
    })));
    let mut events = Events::of(&session);
    assert_eq!(
        events.running().await,
        RunStatus::Running {
            endpoints: Some(vec![]),
            inspect_url: None,
            agent: None,
        }
    );
    assert_eq!(events.terminal().await, RunStatus::Exited { code: 3 });
    // Everything the process wrote is in the buffer by the time it is
    // reported finished: a client that attaches now sees it all.
    assert!(output_now(&session).contains("hello from the workload\r\n"));
    assert_eq!(
        events.seen[0],
        RunEvent::Status {
            status: RunStatus::Starting
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_sees_only_the_session_env_and_its_own_home() {
    // Whatever the runner's own environment holds (beyond what the workload
    // gets on purpose) must not reach the workload.
    let given = [
        "SESSION_VAR",
        "HOME",
        "TELO_CACHE_DIR",
        "npm_config_cache",
        "PATH",
        "FORCE_COLOR",
        "TERM",
        "SHELL",
    ];
    let runner_only: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            !given.contains(&name.as_str())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
        .take(8)
        .collect();
    assert!(
        !runner_only.is_empty(),
        "the test process has no environment to leak"
    );
    let harness = Harness::new();
    let mut print_env: Vec<String> = given.iter().map(|name| (*name).to_owned()).collect();
    print_env.extend(runner_only.iter().cloned());
    let mut spec = bundle_spec(json!({ "printEnv": print_env }));
    spec.env = vec![("SESSION_VAR".to_owned(), "from the session".to_owned())];
    let session = harness.start(spec);
    let mut events = Events::of(&session);
    assert_eq!(events.terminal().await, RunStatus::Exited { code: 0 });
    let home = harness.session_dir(&session).join("home");
    // Its own kernel cache, where every sandboxed kernel sees its own.
    let mut expected = format!(
        "SESSION_VAR=from the session\r\nHOME={}\r\nTELO_CACHE_DIR=/var/cache/telo-kernel/telo\r\nnpm_config_cache=/var/cache/telo-kernel/npm\r\nPATH={}\r\nFORCE_COLOR=1\r\nTERM=xterm-256color\r\nSHELL=/bin/sh\r\n",
        home.display(),
        harness.config.path,
    );
    for name in &runner_only {
        expected.push_str(&format!("{name}=<unset>\r\n"));
    }
    assert_eq!(output_now(&session), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_reaches_the_workload_and_its_answer_comes_back() {
    let harness = Harness::new();
    let session = harness.start(bundle_spec(json!({ "echo": true })));
    let mut events = Events::of(&session);
    events.running().await;
    let handle = support::handle_of(&session).await;
    let mut output = Output::of(&session);
    handle.write_stdin("ping\n".into());
    // Once echoed by the terminal, once by the workload.
    output.until_count("ping\r\n", 2).await;
    handle.write_stdin("exit\n".into());
    assert_eq!(events.terminal().await, RunStatus::Exited { code: 0 });
    support::wait_until_threads_end(&session).await;
    // Input after the end is ignored, not an error.
    handle.write_stdin("late\n".into());
    handle.resize(100, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_reaches_the_workloads_terminal() {
    let harness = Harness::new();
    let session = harness.start(bundle_spec(json!({ "printSize": true, "echo": true })));
    let mut output = Output::of(&session);
    output.until("size 80x24").await;
    support::handle_of(&session).await.resize(132, 43);
    output.until("size 132x43").await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_reports_stopped_and_kills_the_whole_process_group() {
    let harness = Harness::new();
    let marker = support::marker("child");
    let session = harness.start(support::with_env(
        app_spec(Some(&[
            "sh",
            "-c",
            "sh -c 'sleep 300; :' \"$MARKER\" & echo started; wait",
        ])),
        &[("MARKER", &marker)],
    ));
    Output::of(&session).until("started").await;
    support::wait_for_marker(&marker).await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
    support::wait_until_marker_gone(&marker).await;
    support::wait_until_threads_end(&session).await;
    // Stopping again is a no-op.
    harness.registry.stop(session.id()).await.unwrap();
    support::handle_of(&session).await.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_children_do_not_outlive_a_workload_that_exited() {
    let harness = Harness::new();
    let marker = support::marker("child");
    // The child says it runs (a file in the shared directory) before the
    // workload exits.
    let session = harness.start(support::with_env(
        app_spec(Some(&[
            "sh",
            "-c",
            "sh -c 'touch up; sleep 300; :' \"$MARKER\" & while [ ! -e up ]; do sleep 0.01; done; echo started",
        ])),
        &[("MARKER", &marker)],
    ));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert!(output_now(&session).contains("started"));
    support::wait_until_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_killed_by_a_signal_exits_with_128_plus_the_signal() {
    let harness = Harness::new();
    let session = harness.start(app_spec(Some(&["sh", "-c", "kill -TERM $$"])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 128 + 15 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_lifetime_fails_saying_so() {
    let harness = Harness::with(|c| c.max_ttl = Duration::from_secs(1), limits());
    let session = harness.start(bundle_spec(json!({ "echo": true })));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::failed("session exceeded its maximum lifetime of 1 s and was stopped")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_telo_cli_makes_the_probe_unavailable_and_starts_fail() {
    let harness = Harness::with(|c| c.telo = "/nonexistent/bin/telo".to_owned(), limits());
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Unavailable {
            message: "Telo CLI '/nonexistent/bin/telo' was not found on this runner's host."
                .to_owned(),
            remediation: Some(
                "Install the Telo CLI, or set RUNNER_LOCAL_TELO to the path of its executable."
                    .to_owned()
            ),
        }
    );
    let session = harness.start(bundle_spec(json!({})));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::failed(
            "start: Telo CLI '/nonexistent/bin/telo' was not found on this runner's host. Install the Telo CLI, or set RUNNER_LOCAL_TELO to the path of its executable."
        )
    );
    assert!(!harness.session_dir(&session).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telo_cli_on_the_path_is_found_by_name() {
    let telo = test_support::fake_telo::fake_telo_path();
    let harness = Harness::with(
        |c| {
            c.telo = "fake-telo".to_owned();
            c.path = format!("/nonexistent:{}", telo.parent().unwrap().display());
        },
        limits(),
    );
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Ready
    );
    let session = harness.start(bundle_spec(json!({ "stdout": ["found"] })));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert!(output_now(&session).contains("found"));
}

/// A finished session's directory goes when it ends (its output stays in
/// memory: `a_finished_sessions_directory_is_removed_at_once`), and eviction
/// finds nothing of it left on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_session_leaves_no_work_directory() {
    let harness = Harness::with(
        |_| {},
        RegistryLimits {
            max_sessions: 1,
            ..limits()
        },
    );
    let first = harness.start(bundle_spec(json!({})));
    assert_eq!(
        Events::of(&first).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    let dir = harness.session_dir(&first);
    // Admitting a second session evicts the finished first one.
    let second = harness.start(bundle_spec(json!({})));
    assert!(harness.registry.get(first.id()).is_none());
    assert!(!dir.exists());
    Events::of(&second).terminal().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_boot_sweep_removes_leftover_session_directories_only() {
    let harness = Harness::new();
    let root = &harness.config.work_root;
    std::fs::create_dir_all(root.join("abcdefgh2345/app")).unwrap();
    std::fs::write(root.join("abcdefgh2345/app/x.yaml"), "x").unwrap();
    std::fs::create_dir_all(root.join("operator-notes")).unwrap();
    assert_eq!(harness.backend.sweep_work_root(), 1);
    assert!(!root.join("abcdefgh2345").exists());
    assert!(root.join("operator-notes").is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_session_runs_its_command_in_an_empty_private_directory() {
    let harness = Harness::new();
    let session = harness.start(app_spec(Some(&[
        "sh",
        "-c",
        "echo \"cwd=$PWD files=$(ls -A | wc -l)\"",
    ])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    let app_dir = harness.session_dir(&session).join("app");
    assert_eq!(
        output_now(&session).trim(),
        format!("cwd={} files=0", app_dir.display())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_without_a_command_fails_to_start() {
    let harness = Harness::new();
    let session = harness.start(app_spec(None));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::failed("start: app 'agent' has no 'command' configured for the local backend")
    );
    assert!(!harness.session_dir(&session).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_that_cannot_be_written_fails_at_create_and_leaves_nothing() {
    let harness = Harness::new();
    let mut spec = bundle_spec(json!({}));
    let file = spec.bundle.files[0].clone();
    // `app/telo.yaml` is a file, so it cannot also be a directory.
    spec.bundle.files.push(runner_core::types::BundleFile {
        relative_path: "app/telo.yaml/inner.yaml".to_owned(),
        ..file
    });
    let session = harness.start(spec);
    match Events::of(&session).terminal().await {
        RunStatus::Failed { message } => assert!(
            message.starts_with("create: could not write bundle file 'app/telo.yaml/inner.yaml': "),
            "{message}"
        ),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(!harness.session_dir(&session).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_ports_are_endpoints_and_are_probed_for_reachability() {
    let harness = Harness::new();
    let port = free_port();
    let session = harness.start(with_ports(
        bundle_spec(json!({ "listen": [port] })),
        &[
            PortMapping {
                port,
                protocol: PortProtocol::Tcp,
            },
            PortMapping {
                port: 5353,
                protocol: PortProtocol::Udp,
            },
        ],
    ));
    let mut events = Events::of(&session);
    assert_eq!(
        events.running().await,
        RunStatus::Running {
            endpoints: Some(vec![
                RunnerEndpoint {
                    host: String::new(),
                    port,
                    protocol: PortProtocol::Tcp,
                    url: None,
                    token: None,
                },
                RunnerEndpoint {
                    host: String::new(),
                    port: 5353,
                    protocol: PortProtocol::Udp,
                    url: None,
                    token: None,
                },
            ]),
            inspect_url: None,
            agent: None,
        }
    );
    events
        .until("reachable", |e| {
            *e == RunEvent::Reachability {
                app: Some("app".into()),
                port,
                state: ReachabilityState::Reachable,
            }
        })
        .await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(events.terminal().await, RunStatus::Stopped);
    // Only tcp ports are probed.
    assert!(
        !events
            .seen
            .iter()
            .any(|e| matches!(e, RunEvent::Reachability { port: 5353, .. }))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_relays_the_kernels_event_frames_only() {
    let harness = Harness::new();
    let mut spec = bundle_spec(json!({ "debugEvents": ["Kernel.Starting", "Kernel.Started"] }));
    spec.inspect = true;
    let session = harness.start(spec);
    let mut events = Events::of(&session);
    let is_event = |name: &'static str| move |e: &RunEvent| matches!(e, RunEvent::Debug { frame, .. } if frame["event"] == name);
    events
        .until("Kernel.Starting", is_event("Kernel.Starting"))
        .await;
    events
        .until("Kernel.Started", is_event("Kernel.Started"))
        .await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(events.terminal().await, RunStatus::Stopped);
    let debug_kinds: Vec<_> = events
        .seen
        .iter()
        .filter_map(|e| match e {
            RunEvent::Debug { frame, .. } => Some(frame["kind"].clone()),
            _ => None,
        })
        .collect();
    assert_eq!(debug_kinds, [json!("event"), json!("event")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_describe_a_fixed_local_image() {
    let harness = Harness::new();
    let capabilities = harness.backend.capabilities();
    assert_eq!(capabilities.display_name, "Local runner");
    assert_eq!(
        json!(capabilities.features),
        json!({ "io": ["tty", "streams"], "ports": true })
    );
    let image = &capabilities.config_schema["properties"]["image"];
    assert_eq!(image["default"], json!("local"));
    assert_eq!(image["readOnly"], json!(true));
    assert!(capabilities.config_schema["properties"]["registryUrl"].is_object());
}

/// Says `ready`, then runs until signalled; on SIGTERM says `bye` and exits 0.
const POLITE: &str = "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.1; done";
/// Says `ready`, then runs until SIGKILLed; SIGTERM is ignored (by its
/// children too, who inherit the ignored disposition).
const DEAF: &str = "trap '' TERM; echo ready; while :; do sleep 0.1; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_lets_the_workload_shut_down_and_its_last_words_arrive_before_stopped() {
    let harness = Harness::new();
    let session = harness.start(app_spec(Some(&["sh", "-c", POLITE])));
    Output::of(&session).until("ready").await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
    assert!(
        output_now(&session).contains("bye\r\n"),
        "{:?}",
        output_now(&session)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_that_ignores_sigterm_is_killed_once_the_grace_period_is_over() {
    let harness = Harness::with(|c| c.stop_grace = Duration::from_secs(2), limits());
    let session = harness.start(app_spec(Some(&["sh", "-c", DEAF])));
    Output::of(&session).until("ready").await;
    harness.registry.stop(session.id()).await.unwrap();
    // The stop returned without waiting for the grace period: the deaf
    // workload cannot have ended yet.
    assert!(!session.is_terminal());
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_during_the_grace_period_sends_no_second_signal() {
    let harness = Harness::with(|c| c.stop_grace = Duration::from_secs(2), limits());
    let session = harness.start(app_spec(Some(&[
        "sh",
        "-c",
        "n=0; trap 'n=$((n+1)); echo \"term $n\"' TERM; echo ready; while :; do sleep 0.1; done",
    ])));
    let mut output = Output::of(&session);
    output.until("ready").await;
    harness.registry.stop(session.id()).await.unwrap();
    output.until("term 1").await;
    harness.registry.stop(session.id()).await.unwrap();
    support::handle_of(&session).await.stop().await.unwrap();
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
    assert!(!output_now(&session).contains("term 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_grace_period_stop_kills_at_once() {
    let harness = Harness::with(|c| c.stop_grace = Duration::ZERO, limits());
    let session = harness.start(app_spec(Some(&["sh", "-c", POLITE])));
    Output::of(&session).until("ready").await;
    harness.registry.stop(session.id()).await.unwrap();
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
    assert!(!output_now(&session).contains("bye"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_lifetime_is_asked_to_stop_before_it_is_killed() {
    let harness = Harness::with(|c| c.max_ttl = Duration::from_secs(1), limits());
    let session = harness.start(app_spec(Some(&["sh", "-c", POLITE])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::failed("session exceeded its maximum lifetime of 1 s and was stopped")
    );
    assert!(output_now(&session).contains("bye\r\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_lifetime_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let harness = Harness::with(
        |c| {
            c.max_ttl = Duration::from_secs(1);
            c.stop_grace = Duration::from_secs(1);
        },
        limits(),
    );
    let session = harness.start(app_spec(Some(&["sh", "-c", DEAF])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::failed("session exceeded its maximum lifetime of 1 s and was stopped")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_sessions_gracefully() {
    let harness = Harness::new();
    let session = harness.start(app_spec(Some(&["sh", "-c", POLITE])));
    Output::of(&session).until("ready").await;
    harness.registry.shutdown(Duration::from_secs(10)).await;
    assert_eq!(Events::of(&session).terminal().await, RunStatus::Stopped);
    assert!(output_now(&session).contains("bye\r\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_warm_up_every_telo_session_starts_its_kernel_cache_empty_and_shares_none_of_it()
{
    let harness = Harness::new();
    let controllers = json!({
        "controllers": [{ "purl": "telo:local/js#Say", "coldMs": 1 }],
        "stdout": ["done"],
    });
    for _ in 0..2 {
        let session = harness.start(bundle_spec(controllers.clone()));
        assert_eq!(
            Events::of(&session).terminal().await,
            RunStatus::Exited { code: 0 }
        );
        // Built from source each time: nothing the first one built was
        // left for the second.
        let output = output_now(&session);
        assert!(
            output.contains("source-build") && output.ends_with("done\r\n"),
            "{output:?}"
        );
    }
    let shared: Vec<_> = std::fs::read_dir(harness.config.work_root.join(".kernel-cache"))
        .unwrap()
        .collect();
    assert!(shared.is_empty(), "{shared:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_env_cannot_move_the_kernel_cache() {
    let harness = Harness::new();
    let mut spec = bundle_spec(json!({ "printEnv": ["TELO_CACHE_DIR"] }));
    spec.env = vec![("TELO_CACHE_DIR".to_owned(), "/tmp/elsewhere".to_owned())];
    let session = harness.start(spec);
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert_eq!(
        output_now(&session),
        "TELO_CACHE_DIR=/var/cache/telo-kernel/telo\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_session_gets_no_kernel_cache() {
    let harness = Harness::new();
    let session = harness.start(app_spec(Some(&[
        "sh",
        "-c",
        "echo \"telo=${TELO_CACHE_DIR-unset} npm=${npm_config_cache-unset}\"",
    ])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert_eq!(output_now(&session), "telo=unset npm=unset\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sessions_directory_is_removed_at_once() {
    let harness = Harness::new();
    let session = harness.start(app_spec(Some(&["sh", "-c", "echo kept > file; echo done"])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    // Its output stays with the session; its files do not.
    assert!(output_now(&session).contains("done"));
    let dir = harness.session_dir(&session);
    let removed = tokio::time::timeout(test_support::WAIT, async {
        let mut poll = tokio::time::interval(Duration::from_millis(10));
        while dir.exists() {
            poll.tick().await;
        }
    })
    .await;
    assert!(removed.is_ok(), "{} is still there", dir.display());
    assert!(harness.registry.get(session.id()).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_directory_outgrows_its_disk_bound_is_stopped_and_fails() {
    let harness = Harness::with(|c| c.limits.disk_bytes = 1 << 20, limits());
    // Each file within the bound, all of them past it.
    let session = harness.start(app_spec(Some(&[
        "sh",
        "-c",
        "for i in 1 2 3 4 5 6; do head -c 524288 /dev/urandom > f$i; done; echo wrote; while :; do sleep 0.1; done",
    ])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::failed(
            "the session's directory grew past its disk bound of 1 MiB (RUNNER_LOCAL_MAX_DISK) and the session was stopped"
        )
    );
}
