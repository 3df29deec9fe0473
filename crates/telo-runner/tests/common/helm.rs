//! Helm's own library, reached from Python through `helm-sdkpy`: the
//! chart's pytest suite and releases a Rust test drives itself
//! (`chart/tests/release.py`). Missing Python packages fail the test with
//! the command that installs them: a chart that silently goes untested is
//! the failure this prevents.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// What `.ci/run` installs; on Python < 3.12 helm-sdkpy's declared floor is
/// higher than it needs, hence `--ignore-requires-python`.
const PIP_INSTALL: &str =
    "python3 -m pip install --ignore-requires-python helm-sdkpy==0.1.32 pytest pyyaml";

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/telo-runner sits two levels below the workspace root")
        .to_path_buf()
}

pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

pub fn assert_python_packages_present() {
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

/// `helm install` (with `--create-namespace`) or `helm upgrade` of the
/// chart as release `release` in `namespace` with `values`, through
/// `kubeconfig`; panics with Helm's message when it fails.
pub fn release(action: &str, kubeconfig: &Path, namespace: &str, release: &str, values: &Value) {
    assert_python_packages_present();
    let script = workspace_root().join("chart/tests/release.py");
    let run = Command::new(python())
        .arg(&script)
        .arg(action)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", namespace, "--release", release])
        .arg("--values")
        .arg(values.to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run chart/tests/release.py");
    assert!(
        run.status.success(),
        "helm {action} failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}
