//! The probe tells the truth about the kernel: stand-in kernels written by
//! each test (small shell scripts) fail or pass the self-check the way the
//! real Telo CLI does, and the backend answers from what they did.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};

use runner_core::types::{AvailabilityReport, PullPolicy, RunStatus};
use runner_core::{Backend, ProbeConfig};
use runner_local::KernelHealth;
use serde_json::json;
use support::{Events, Harness, bundle_spec, limits, output_now};
use tempfile::TempDir;

const NODE_REMEDIATION: &str = "Install Node.js 24 or newer, or set RUNNER_LOCAL_PATH so that the first node on it is version 24 or newer.";

/// What the real CLI prints on Node.js 20, before exiting 1.
const NODE_TOO_OLD: &str = r#"#!/bin/sh
echo "telo.yaml  error  JSON.rawJSON is unavailable, so a CEL integer (int64) cannot be serialized exactly. Telo requires Node.js >= 24 or Bun >= 1.3."
echo
echo "1 error"
exit 1
"#;

const WORKS: &str = "#!/bin/sh\necho \"kernel ran $*\"\nexit 0\n";

fn probe_config() -> ProbeConfig {
    ProbeConfig {
        image: "local".to_owned(),
        pull_policy: PullPolicy::Missing,
    }
}

/// A directory of stand-in programs that is the sessions' whole `PATH`
/// (plus `/bin` for the shell), with a `node` that reports `v20.0.0-test`.
struct Kernel {
    dir: TempDir,
}

impl Kernel {
    fn new(telo_script: &str) -> Self {
        let kernel = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        kernel.install("node", "#!/bin/sh\necho v20.0.0-test\n");
        kernel.install("telo", telo_script);
        kernel
    }

    fn telo(&self) -> PathBuf {
        self.dir.path().join("telo")
    }

    fn search_path(&self) -> String {
        format!("{}:/bin:/usr/bin", self.dir.path().display())
    }

    fn install(&self, name: &str, script: &str) {
        support::install_script(&self.dir.path().join(name), script);
    }

    fn harness(&self) -> Harness {
        let telo = self.telo().to_string_lossy().into_owned();
        let path = self.search_path();
        Harness::with(
            move |c| {
                c.telo = telo;
                c.path = path;
            },
            limits(),
        )
    }
}

fn node_problem(telo: &Path) -> AvailabilityReport {
    AvailabilityReport::Unavailable {
        message: format!(
            "The Telo CLI '{}' cannot run on this runner's Node.js (v20.0.0-test): Telo requires Node.js 24 or newer.",
            telo.display()
        ),
        remediation: Some(NODE_REMEDIATION.to_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_that_needs_a_newer_node_makes_the_probe_unavailable_with_the_fix() {
    let kernel = Kernel::new(NODE_TOO_OLD);
    let harness = kernel.harness();
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        node_problem(&kernel.telo())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_an_unusable_kernel_fails_at_once_saying_why_and_what_to_do() {
    let kernel = Kernel::new(NODE_TOO_OLD);
    let harness = kernel.harness();
    let session = harness.start(bundle_spec(json!({})));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::failed(format!(
            "start: The Telo CLI '{}' cannot run on this runner's Node.js (v20.0.0-test): Telo requires Node.js 24 or newer. {NODE_REMEDIATION}",
            kernel.telo().display()
        ))
    );
    assert!(!harness.session_dir(&session).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_kernel_makes_the_probe_ready_and_runs_sessions() {
    let kernel = Kernel::new(WORKS);
    let harness = kernel.harness();
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Ready
    );
    let session = harness.start(bundle_spec(json!({})));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert!(output_now(&session).contains("kernel ran run ./app/telo.yaml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_the_kernel_changes_the_answer_without_a_restart() {
    let kernel = Kernel::new(NODE_TOO_OLD);
    let harness = kernel.harness();
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        node_problem(&kernel.telo())
    );
    kernel.install("telo", WORKS);
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Ready
    );
    let session = harness.start(bundle_spec(json!({})));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    kernel.install("telo", NODE_TOO_OLD);
    let session = harness.start(bundle_spec(json!({})));
    match Events::of(&session).terminal().await {
        RunStatus::Failed { message } => {
            assert!(message.contains("Telo requires Node.js 24"), "{message}");
        }
        other => panic!("expected a start failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_failure_names_its_last_error_line_and_exit_code() {
    let kernel = Kernel::new(
        "#!/bin/sh\necho loading\necho 'telo.yaml  error  Cannot find module @telorun/sdk' >&2\necho '1 error' >&2\nexit 3\n",
    );
    let harness = kernel.harness();
    match harness.backend.probe(&probe_config()).await {
        AvailabilityReport::Unavailable {
            message,
            remediation,
        } => {
            assert_eq!(
                message,
                format!(
                    "The Telo CLI '{}' failed its self-check with exit code 3: telo.yaml  error  Cannot find module @telorun/sdk.",
                    kernel.telo().display()
                )
            );
            let remediation = remediation.unwrap();
            assert!(remediation.contains("RUNNER_LOCAL_TELO"), "{remediation}");
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_self_check_runs_like_a_session_and_cleans_up_after_itself() {
    // The check runs sandboxed, with a kernel cache of its own in its
    // scratch directory: it records what it got there, then waits for the
    // test to have read it (the scratch goes with the check).
    let kernel = Kernel::new(
        "#!/bin/sh
log=\"$TELO_CACHE_DIR/../check.log\"\n{ echo \"argv=$*\"; echo \"cwd=$PWD\"; echo \"HOME=$HOME\"; echo \"PATH=$PATH\"; echo \"TELO_CACHE_DIR=$TELO_CACHE_DIR\"; echo \"npm_config_cache=$npm_config_cache\"; cat telo.yaml; } > \"$log.tmp\" && mv \"$log.tmp\" \"$log\"\nwhile [ ! -e released ]; do sleep 0.05; done\n",
    );
    let harness = kernel.harness();
    let root = harness.config.work_root.clone();
    let scratch = root.join(".kernel-check");
    let backend = harness.backend.clone();
    let health = tokio::spawn(async move { backend.kernel_health().await });
    let log = scratch.join("cache/check.log");
    let recorded = tokio::time::timeout(test_support::WAIT, async {
        let mut poll = tokio::time::interval(std::time::Duration::from_millis(10));
        loop {
            if let Ok(text) = std::fs::read_to_string(&log) {
                return text;
            }
            poll.tick().await;
        }
    })
    .await
    .expect("the self-check never recorded what it got");
    std::fs::write(scratch.join("app/released"), "").unwrap();
    assert_eq!(health.await.unwrap(), KernelHealth::Usable);
    assert_eq!(
        recorded,
        format!(
            "argv=run ./telo.yaml\ncwd={}\nHOME={}\nPATH={}\nTELO_CACHE_DIR=/var/cache/telo-kernel/telo\nnpm_config_cache=/var/cache/telo-kernel/npm\nkind: Telo.Application\nmetadata:\n  name: RunnerSelfCheck\n  version: 1.0.0\n",
            scratch.join("app").display(),
            scratch.join("home").display(),
            kernel.search_path(),
        )
    );
    assert!(!scratch.exists(), "the scratch directory is left behind");
    // Nothing of the check is left where sessions' caches come from.
    let shared: Vec<_> = std::fs::read_dir(root.join(".kernel-cache"))
        .unwrap()
        .collect();
    assert!(shared.is_empty(), "{shared:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_probes_and_starts_share_one_check_and_it_is_not_repeated() {
    // Slow enough that the probes below arrive while it runs; each check
    // knocks once on a loopback port of the test (the sandbox shares the
    // network, and no check may write anything that outlives it).
    let knocks = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = knocks.local_addr().unwrap().port();
    let kernel = Kernel::new(&format!(
        "#!/bin/bash\nif [ \"$2\" = ./telo.yaml ]; then echo run > /dev/tcp/127.0.0.1/{port}; sleep 0.5; fi\nexit 0\n"
    ));
    let harness = kernel.harness();
    let config = probe_config();
    let probe = || harness.backend.probe(&config);
    let reports = tokio::join!(probe(), probe(), probe(), probe());
    let reports = [reports.0, reports.1, reports.2, reports.3];
    assert_eq!(
        reports,
        [
            AvailabilityReport::Ready,
            AvailabilityReport::Ready,
            AvailabilityReport::Ready,
            AvailabilityReport::Ready
        ]
    );
    let session = harness.start(bundle_spec(json!({})));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert_eq!(
        harness.backend.probe(&probe_config()).await,
        AvailabilityReport::Ready
    );
    // The boot check was the only one: one knock is queued.
    knocks.set_nonblocking(true).unwrap();
    let mut count = 0;
    while knocks.accept().is_ok() {
        count += 1;
    }
    assert_eq!(count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_could_not_run_is_not_remembered() {
    let kernel = Kernel::new(WORKS);
    let root = tempfile::tempdir().unwrap();
    let work_root = root.path().join("sessions");
    // A file where the check's scratch directory goes.
    std::fs::create_dir_all(&work_root).unwrap();
    std::fs::write(work_root.join(".kernel-check"), "in the way").unwrap();
    let telo = kernel.telo().to_string_lossy().into_owned();
    let path = kernel.search_path();
    let backend = runner_local::LocalBackend::new(runner_local::LocalConfig {
        telo,
        work_root: work_root.clone(),
        path,
        ..support::config(&root)
    })
    .unwrap();
    match backend.probe(&probe_config()).await {
        AvailabilityReport::Unavailable {
            message,
            remediation,
        } => {
            assert!(
                message.starts_with(
                    "The runner could not prepare the Telo CLI self-check in its work directory: "
                ),
                "{message}"
            );
            assert_eq!(
                remediation.as_deref(),
                Some("Set RUNNER_LOCAL_WORK_DIR to a directory the runner can write to.")
            );
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    std::fs::remove_file(work_root.join(".kernel-check")).unwrap();
    assert_eq!(
        backend.probe(&probe_config()).await,
        AvailabilityReport::Ready
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_is_not_ready_until_the_boot_check_has_a_verdict() {
    // A kernel whose run waits for a file beside it (its directory is
    // visible in the sandbox): the boot check is under way until the test
    // lets it finish.
    let kernel = Kernel::new(WORKS);
    let go = kernel.dir.path().join("go");
    kernel.install(
        "telo",
        &format!(
            "#!/bin/sh\nwhile [ ! -e '{}' ]; do sleep 0.01; done\nexit 0\n",
            go.display()
        ),
    );
    let harness = kernel.harness();
    assert_eq!(
        harness.backend.readiness().waiting,
        ["the Telo CLI self-check"]
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(harness.backend.kernel_health().await, KernelHealth::Usable);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !harness.backend.readiness().is_ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still waiting: {:?}",
            harness.backend.readiness().waiting
        );
        tokio::task::yield_now().await;
    }
}
