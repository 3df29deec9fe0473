//! The real Telo CLI test fixture (0.81, installed by `shared/telo/install.sh`)
//! and its example applications, for the `real_kernel` test targets.
//!
//! Those targets need the installed fixture and fail, saying how to install
//! it, when it is missing. Its location: `$TELO_REAL_KERNEL_DIR`, else
//! `~/.cache/telo-real` (where `.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

/// How long a real-kernel test waits for the kernel before it fails. A cold
/// start takes a few seconds on a quiet 2-core machine and many times that
/// while builds share it; this bounds a hang, it measures nothing.
pub const KERNEL_WAIT: Duration = Duration::from_secs(90);

/// The installed fixture: `bin/telo` (the wrapper, on Node.js 24),
/// `telo-cli/`, `modules/`.
pub fn fixture_dir() -> PathBuf {
    let dir = std::env::var_os("TELO_REAL_KERNEL_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/telo-real")))
        .expect("neither TELO_REAL_KERNEL_DIR nor HOME is set");
    assert!(
        dir.join("bin/telo").is_file(),
        "the real Telo CLI fixture is not installed at {}: install it with \
         `bash ../shared/telo/install.sh ~/.cache/telo-real` (from the repository root; needs npm), \
         or set TELO_REAL_KERNEL_DIR to where it is installed",
        dir.display()
    );
    dir
}

/// The real kernel's executable (the fixture's wrapper).
pub fn telo_path() -> PathBuf {
    fixture_dir().join("bin/telo")
}

/// The fixture's example applications (`shared/telo/examples`), found above
/// the workspace or at `$TELO_EXAMPLES_DIR`.
pub fn examples_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TELO_EXAMPLES_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/telo/examples"))
        .find(|dir| dir.is_dir())
        .expect("the Telo fixture's examples (shared/telo/examples) were not found above the workspace; set TELO_EXAMPLES_DIR")
}

/// Every file of example `name` as `(relative path, contents)`, sorted, with
/// `@TELO_MODULES@` pointed at the installed modules.
pub fn example_files(name: &str) -> Vec<(String, String)> {
    let modules = fixture_dir().join("modules");
    example_files_with_modules(name, &modules.to_string_lossy())
}

/// [`example_files`] with `@TELO_MODULES@` pointed at `modules`: where an
/// image keeps them, for an example that runs inside it.
pub fn example_files_with_modules(name: &str, modules: &str) -> Vec<(String, String)> {
    let root = examples_dir().join(name);
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|(path, contents)| (path, contents.replace("@TELO_MODULES@", modules)))
        .collect()
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("cannot read example dir {}: {err}", dir.display()));
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            collect(root, &path, files);
        } else {
            let relative = path
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .into_owned();
            let contents = std::fs::read_to_string(&path)
                .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
            files.push((relative, contents));
        }
    }
}

/// The `bundle` of a `POST /v1/sessions` body running example `name`.
pub fn example_bundle(name: &str) -> Value {
    bundle_of(example_files(name))
}

/// The bundle of an example rendered for the session image's modules
/// directory (it runs inside that image).
pub fn example_bundle_in_image(name: &str, modules: &str) -> Value {
    bundle_of(example_files_with_modules(name, modules))
}

fn bundle_of(files: Vec<(String, String)>) -> Value {
    let files: Vec<Value> = files
        .into_iter()
        .map(|(path, contents)| json!({ "relativePath": path, "contents": contents }))
        .collect();
    json!({ "entryRelativePath": "telo.yaml", "files": files })
}
