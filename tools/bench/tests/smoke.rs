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
#[case::start_latency_app_door(&["start-latency", "--sessions", "2", "--door", "app"])]
#[case::start_latency_app_door_local(&["start-latency", "--sessions", "2", "--door", "app", "--backend", "local"])]
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
#[case::watch_suspend_local(&["watch-suspend", "--sessions", "2", "--backend", "local"])]
#[case::warm_pool(&["warm-pool", "--sessions", "2", "--pool-sizes", "0,1"])]
#[case::access_local(&["access", "--sessions", "20", "--backend", "local"])]
#[case::edge_local(&["edge", "--requests", "50", "--bytes", "1048576", "--websockets", "20", "--wakes", "2", "--backend", "local"])]
fn the_scenario_runs_and_prints_its_figures(#[case] args: &[&str]) {
    scenario_prints_its_figures(args);
}

/// The scenarios that run the real Telo kernel: only where one is given.
#[rstest]
#[case::watch_reload_real_local(&["watch-reload", "--sessions", "2", "--kernel", "real", "--backend", "local"])]
#[case::watch_reload_real_kubernetes(&["watch-reload", "--sessions", "2", "--kernel", "real"])]
#[case::real_kernel_local(&["real-kernel", "--cold", "1", "--sessions", "1", "--backend", "local"])]
#[case::real_kernel_kubernetes(&["real-kernel", "--cold", "1", "--sessions", "1"])]
#[ignore = "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)"]
fn the_real_kernel_scenario_runs_and_prints_its_figures(#[case] args: &[&str]) {
    assert_real_kernel_given();
    scenario_prints_its_figures(args);
}

fn scenario_prints_its_figures(args: &[&str]) {
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
    if args[0] == "edge" {
        // The plain hyper proxy (built with this package) is measured
        // beside the edge.
        let hyper = &report["results"]["small"]["1"]["hyper"];
        assert!(hyper["requests_per_s"].as_f64().is_some(), "{line}");
    }
}

/// The real-kernel scenarios need a kernel someone gave: without one they
/// fail here, saying what to set.
fn assert_real_kernel_given() {
    let telo = std::env::var("TELO_REAL_KERNEL_DIR")
        .ok()
        .filter(|d| !d.is_empty())
        .map(|dir| PathBuf::from(dir).join("bin/telo"));
    assert!(
        telo.as_ref().is_some_and(|t| t.is_file()),
        "no real Telo kernel given: set TELO_REAL_KERNEL_DIR to a Telo CLI layout holding \
         bin/telo (it names {telo:?})"
    );
}
