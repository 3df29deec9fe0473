//! The telo releases a local runner can run by version
//! (`RUNNER_LOCAL_TELO_VERSIONS`): a directory the operator fills with one
//! kernel per release, at `<dir>/<version>/bin/telo`.
//!
//! The directory's names are the operator's word for what each kernel is,
//! as an image tag is on Kubernetes; a kernel that says otherwise on its
//! debug stream is reported as what it says. The directory is read at each
//! request, so a release installed while the runner runs is offered at once.

use std::path::{Path, PathBuf};

use runner_api::telo::TeloVersion;
use runner_core::TeloUnavailable;

/// Where a release's kernel lives under the versions directory.
pub fn kernel_path(dir: &Path, version: &TeloVersion) -> PathBuf {
    dir.join(version.as_str()).join("bin").join("telo")
}

/// The releases the directory holds, oldest first: entries named like a
/// version with an executable `bin/telo`.
pub fn available(dir: &Path) -> Vec<TeloVersion> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut versions: Vec<TeloVersion> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| TeloVersion::parse(entry.file_name().to_str()?))
        .filter(|version| is_executable(&kernel_path(dir, version)))
        .collect();
    versions.sort_by(|a, b| a.cmp_core(b).then_with(|| a.as_str().cmp(b.as_str())));
    versions
}

/// The kernel of `version`, or the reason there is none (naming what the
/// runner has, so a client can pick one).
pub fn supply(dir: &Path, version: &TeloVersion) -> Result<PathBuf, TeloUnavailable> {
    let path = kernel_path(dir, version);
    if is_executable(&path) {
        return Ok(path);
    }
    let have: Vec<String> = available(dir).iter().map(ToString::to_string).collect();
    let version = version.to_string();
    Err(if have.is_empty() {
        TeloUnavailable::NoReleases { version }
    } else {
        TeloUnavailable::NotInstalled { version, have }
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn install(dir: &Path, name: &str, mode: u32) {
        let bin = dir.join(name).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let telo = bin.join("telo");
        std::fs::write(&telo, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&telo, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn only_version_named_executable_kernels_are_offered_in_order() {
        let dir = tempfile::tempdir().unwrap();
        install(dir.path(), "0.100.0", 0o755);
        install(dir.path(), "0.96.0", 0o755);
        install(dir.path(), "latest", 0o755);
        install(dir.path(), "0.97.0", 0o644);
        std::fs::create_dir_all(dir.path().join("0.98.0")).unwrap();
        let names: Vec<String> = available(dir.path())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["0.96.0", "0.100.0"]);
    }

    #[test]
    fn a_missing_release_names_what_the_runner_has() {
        let dir = tempfile::tempdir().unwrap();
        let wanted = TeloVersion::parse("0.99.0").unwrap();
        assert_eq!(
            supply(dir.path(), &wanted).unwrap_err().to_string(),
            "this runner has no telo 0.99.0, and no chosen release at all"
        );
        install(dir.path(), "0.96.0", 0o755);
        assert_eq!(
            supply(dir.path(), &wanted).unwrap_err().to_string(),
            "this runner has no telo 0.99.0 \u{2014} it has 0.96.0"
        );
        let have = TeloVersion::parse("0.96.0").unwrap();
        assert_eq!(
            supply(dir.path(), &have).unwrap(),
            kernel_path(dir.path(), &have)
        );
    }
}
