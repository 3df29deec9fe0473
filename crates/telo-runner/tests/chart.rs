//! The Helm chart, installed with Helm's own library into kube-sim.
//!
//! The chart's tests are Python (`chart/tests`), because Helm's library is
//! reachable from Python through `helm-sdkpy`; this test runs them with the
//! workspace's kube-sim so `cargo test --workspace` covers the chart too.
//! Missing Python packages fail the test with the command that installs them:
//! a chart that silently goes untested is the failure this prevents.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What `.ci/run` installs; on Python < 3.12 helm-sdkpy's declared floor is
/// higher than it needs, hence `--ignore-requires-python`.
const PIP_INSTALL: &str =
    "python3 -m pip install --ignore-requires-python helm-sdkpy==0.1.32 pytest pyyaml";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/telo-runner sits two levels below the workspace root")
        .to_path_buf()
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn assert_python_packages_present() {
    let probe = Command::new(python())
        .args(["-c", "import helm_sdkpy, pytest, yaml"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "the chart tests need the Python packages helm-sdkpy, pytest and pyyaml, \
             which are not importable by {}:\n{}\nInstall them with:\n    {PIP_INSTALL}",
            python(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(err) => panic!(
            "the chart tests need Python 3 ({} could not be run: {err}); then:\n    {PIP_INSTALL}",
            python()
        ),
    }
}

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
