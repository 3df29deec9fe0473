//! The real Telo kernel, where one is given, and the example applications
//! the real-kernel tests run.
//!
//! No Telo CLI ships with telo-runner: CI runs every test on fake-telo, and
//! the tests that need the real kernel are `#[ignore]`d with
//! [`NEEDS_REAL_KERNEL`] as their reason. They run when a developer points
//! `TELO_REAL_KERNEL_DIR` at a Telo CLI layout (`bin/telo`, and `modules/`
//! for the examples that import std modules) and asks for ignored tests
//! (`.ci/run` does both when the variable is set). Asked to run without a
//! kernel, they fail saying what is missing: they never pass vacuously.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

/// The variable that names a Telo CLI layout.
pub const KERNEL_DIR_ENV: &str = "TELO_REAL_KERNEL_DIR";

/// Why a real-kernel test is left out of a default run (its `#[ignore]`
/// reason: keep the two in step).
pub const NEEDS_REAL_KERNEL: &str =
    "needs the real Telo kernel: set TELO_REAL_KERNEL_DIR to a Telo CLI layout (bin/telo)";

/// How long a real-kernel test waits for the kernel before it fails. A cold
/// start takes a few seconds on a quiet 2-core machine and many times that
/// while builds share it; this bounds a hang, it measures nothing.
pub const KERNEL_WAIT: Duration = Duration::from_secs(90);

/// The given kernel's layout, when `TELO_REAL_KERNEL_DIR` names one that
/// holds `bin/telo`.
pub fn given_kernel_dir() -> Option<PathBuf> {
    std::env::var_os(KERNEL_DIR_ENV)
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .filter(|dir| dir.join("bin/telo").is_file())
}

/// The given kernel's layout: `bin/telo` (a wrapper that runs the CLI on
/// Node.js 24), `modules/`. Panics, saying what to set, without one.
pub fn fixture_dir() -> PathBuf {
    given_kernel_dir().unwrap_or_else(|| {
        panic!(
            "this test needs the real Telo kernel: set {KERNEL_DIR_ENV} to a Telo CLI layout \
             holding bin/telo (and modules/ for the examples that import std modules); \
             it is {:?}",
            std::env::var_os(KERNEL_DIR_ENV)
        )
    })
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

/// A self-contained bundle: the application imports a module of its own
/// (`./greeter`, inside the bundle) whose controller is a plain JavaScript
/// file, and prints `Hello from a self-contained Telo bundle!` with it. No
/// std module, no absolute path, no npm: it runs wherever the kernel does.
pub fn self_contained_bundle() -> Value {
    bundle_of(vec![
        ("telo.yaml".to_owned(), SELF_CONTAINED_APP.to_owned()),
        ("greeter/telo.yaml".to_owned(), GREETER_MODULE.to_owned()),
        ("greeter/say.mjs".to_owned(), GREETER_CONTROLLER.to_owned()),
    ])
}

const SELF_CONTAINED_APP: &str = r#"kind: Telo.Application
metadata:
  name: SelfContainedHello
  version: 1.0.0
imports:
  Greeter: ./greeter
targets:
  - invoke: !ref hello
---
kind: Greeter.Say
metadata:
  name: hello
message: "Hello from a self-contained Telo bundle!"
"#;

/// A module of telo-runner's own making: one invocable kind, `Say`.
const GREETER_MODULE: &str = r#"kind: Telo.Library
metadata:
  name: Greeter
  version: 1.0.0
exports:
  kinds:
    - Say
---
kind: Telo.Definition
metadata:
  name: Say
capability: Telo.Invocable
controllers:
  - pkg:telo/local/js?path=./say.mjs#Say
schema:
  type: object
  properties:
    message: { type: string }
  required: [message]
  additionalProperties: false
inputType:
  kind: Telo.JsonSchema
  schema:
    type: object
    properties:
      message: { type: string }
    additionalProperties: false
outputType:
  kind: Telo.JsonSchema
  schema:
    type: object
    properties:
      line: { type: string }
    required: [line]
    additionalProperties: false
"#;

/// The `Say` controller: the kernel imports it as it is (no build step) and
/// calls `create`; the instance's `invoke` writes the message as one line.
const GREETER_CONTROLLER: &str = r#"export const Say = {
  async create(resource, ctx) {
    return {
      async invoke(inputs) {
        const line = String(inputs?.message ?? resource.message);
        ctx.stdout.write(line + "\n");
        return { line };
      },
    };
  },
};
"#;

fn bundle_of(files: Vec<(String, String)>) -> Value {
    let files: Vec<Value> = files
        .into_iter()
        .map(|(path, contents)| json!({ "relativePath": path, "contents": contents }))
        .collect();
    json!({ "entryRelativePath": "telo.yaml", "files": files })
}
