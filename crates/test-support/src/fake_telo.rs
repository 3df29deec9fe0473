//! Where the `fake-telo` binary is: next to the test executable's target
//! directory, built on demand when a single crate's tests run alone.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

pub fn fake_telo_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> → target/<profile>/fake-telo
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("target profile directory")
            .to_path_buf();
        let candidate = profile_dir.join("fake-telo");
        if !candidate.is_file() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "-p", "fake-telo", "--bin", "fake-telo"])
                .status()
                .expect("run cargo build for fake-telo");
            assert!(status.success(), "building fake-telo failed");
        }
        assert!(
            candidate.is_file(),
            "fake-telo not found at {}",
            candidate.display()
        );
        candidate
    })
    .clone()
}
