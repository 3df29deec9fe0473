//! Where the workspace's binaries are: next to the test executable's target
//! directory (`target/<profile>/`), built on demand when a single crate's
//! tests run alone and nothing has built them yet.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The `fake-telo` stand-in kernel.
pub fn fake_telo_path() -> PathBuf {
    workspace_binary("fake-telo")
}

/// The binary `name` of the workspace package of the same name, in this test
/// build's profile directory.
pub fn workspace_binary(name: &str) -> PathBuf {
    static FOUND: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut found = FOUND
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = found.get(name) {
        return path.clone();
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile directory")
        .to_path_buf();
    let candidate = profile_dir.join(name);
    if !candidate.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", name, "--bin", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap_or_else(|err| panic!("run cargo build for {name}: {err}"));
        assert!(status.success(), "building {name} failed");
    }
    assert!(
        candidate.is_file(),
        "{name} not found at {}",
        candidate.display()
    );
    found.insert(name.to_owned(), candidate.clone());
    candidate
}
