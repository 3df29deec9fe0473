//! Helm's own library against the kube-sim binary: runs
//! `tests/helm/test_helm_install.py` (install, read back, list, uninstall of
//! `tests/helm/smoke-chart`) with pytest. Needs Python with `helm-sdkpy` and
//! `pytest`; without them the test fails and says what to install.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

const INSTALL_HINT: &str = "pip install --ignore-requires-python helm-sdkpy pytest";

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn helm_installs_lists_and_uninstalls_a_chart() {
    for module in ["helm_sdkpy", "pytest"] {
        assert!(
            python_has(module),
            "python3 cannot import {module}: this test drives Helm's library through \
             helm-sdkpy and pytest; install them with `{INSTALL_HINT}`"
        );
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helm");
    let status = Command::new("python3")
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q"])
        .arg(dir.join("test_helm_install.py"))
        .current_dir(&dir)
        .env("KUBE_SIM_BIN", env!("CARGO_BIN_EXE_kube-sim"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .status()
        .expect("python3 runs");
    assert!(status.success(), "pytest {status}; see its output above");
}
