//! The Helm chart, installed with Helm's own library into kube-sim.
//!
//! The chart's tests are Python (`chart/tests`), because Helm's library is
//! reachable from Python through `helm-sdkpy`; this test runs them with the
//! workspace's kube-sim so `cargo test --workspace` covers the chart too.
//! Missing Python packages fail the test with the command that installs them
//! (`common::helm`).

use std::process::Command;

mod common;

use common::helm::{assert_python_packages_present, python, workspace_root};

#[test]
fn helm_installs_the_chart_into_kube_sim_with_every_value_set() {
    assert_python_packages_present();
    let kube_sim = test_support::fake_telo::workspace_binary("kube-sim");
    let root = workspace_root();
    let run = Command::new(python())
        .args([
            "-m",
            "pytest",
            "chart/tests",
            "-q",
            "-p",
            "no:cacheprovider",
        ])
        .current_dir(&root)
        .env("KUBE_SIM_BIN", &kube_sim)
        // Keep the source tree clean of __pycache__ directories.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3 -m pytest");
    assert!(
        run.status.success(),
        "chart tests failed (KUBE_SIM_BIN={} python3 -m pytest chart/tests -q):\n{}\n{}",
        kube_sim.display(),
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}
