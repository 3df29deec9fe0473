//! Each scenario once at a small size: the harness still starts its
//! processes, drives them and prints its figures. The figures themselves are
//! not judged here (benchmarks never assert on time).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use rstest::rstest;
use serde_json::Value;

/// The directory holding telo-runner, kube-sim and fake-telo of this build
/// profile, brought up to date first (a no-op after `cargo test --workspace`
/// built them; needed when this crate's tests run alone).
fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_BIN_EXE_telo-runner-bench"))
            .parent()
            .unwrap()
            .to_path_buf();
        let missing = ["telo-runner", "kube-sim", "fake-telo"]
            .iter()
            .any(|name| !dir.join(name).is_file());
        if missing {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args([
                    "build",
                    "-p",
                    "telo-runner",
                    "-p",
                    "kube-sim",
                    "-p",
                    "fake-telo",
                ])
                .args([
                    "--bin",
                    "telo-runner",
                    "--bin",
                    "kube-sim",
                    "--bin",
                    "fake-telo",
                ])
                .status()
                .unwrap();
            assert!(status.success(), "building the benchmarked programs failed");
        }
        dir
    })
    .clone()
}

#[rstest]
#[case::start_latency(&["start-latency", "--sessions", "4", "--concurrency", "2"])]
#[case::start_latency_processes(&["start-latency", "--sessions", "2", "--workloads", "processes"])]
#[case::relay_throughput(&["relay-throughput", "--bytes", "262144"])]
#[case::relay_throughput_local(&["relay-throughput", "--bytes", "262144", "--backend", "local"])]
#[case::fanout(&["fanout", "--sessions", "3", "--lines", "5"])]
#[case::footprint(&["footprint", "--sessions", "2"])]
#[case::apiserver_load(&["apiserver-load", "--sessions", "3"])]
#[case::start_output(&["start-output", "--sessions", "4", "--concurrency", "2"])]
#[case::start_output_local(&["start-output", "--sessions", "2", "--backend", "local"])]
#[case::big_bundles_local(&["big-bundles", "--sessions", "2", "--files", "200", "--backend", "local"])]
#[case::watch_reload_local(&["watch-reload", "--sessions", "3", "--backend", "local"])]
#[case::watch_reload_kubernetes(&["watch-reload", "--sessions", "3"])]
#[case::watch_reload_real_local(&["watch-reload", "--sessions", "2", "--kernel", "real", "--backend", "local"])]
#[case::watch_reload_real_kubernetes(&["watch-reload", "--sessions", "2", "--kernel", "real"])]
#[case::watch_suspend_local(&["watch-suspend", "--sessions", "2", "--backend", "local"])]
#[case::real_kernel_local(&["real-kernel", "--cold", "1", "--sessions", "1", "--backend", "local"])]
#[case::real_kernel_kubernetes(&["real-kernel", "--cold", "1", "--sessions", "1"])]
#[case::warm_pool(&["warm-pool", "--sessions", "2", "--pool-sizes", "0,1"])]
fn the_scenario_runs_and_prints_its_figures(#[case] args: &[&str]) {
    if args[0] == "real-kernel" || args.contains(&"real") {
        assert_real_kernel_installed();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_telo-runner-bench"))
        .args(args)
        .args(["--json", "--no-build", "--bin-dir"])
        .arg(bin_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?} failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().expect("a JSON line");
    let report: Value = serde_json::from_str(line).unwrap();
    assert_eq!(report["scenario"], args[0]);
    assert!(report["results"].as_object().is_some_and(|r| !r.is_empty()));
}

/// The real-kernel scenario needs the Telo CLI fixture (CI installs it at
/// `~/.cache/telo-real`); without it the case fails here, saying how to get it.
fn assert_real_kernel_installed() {
    let dir = std::env::var("TELO_REAL_KERNEL_DIR")
        .ok()
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var("HOME")
                .ok()
                .map(|h| PathBuf::from(h).join(".cache/telo-real"))
        })
        .expect("HOME or TELO_REAL_KERNEL_DIR is set");
    let telo = dir.join("bin/telo");
    assert!(
        telo.is_file(),
        "the real Telo kernel fixture is not installed: {} does not exist. Install it with \
         `bash ../shared/telo/install.sh ~/.cache/telo-real` from the repository root \
         (or set TELO_REAL_KERNEL_DIR to where it is installed).",
        telo.display()
    );
}
