//! The controllers a script loads go through the kernel cache as the real
//! kernel's do: a cold load writes the cache (and, on a terminal, shows its
//! progress), a warm one finds it there and says nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

const APP: &str = "kind: Telo.Application\n\
metadata: { name: cached }\n\
fakeTelo:\n  \
  stdout: [\"app output\"]\n  \
  controllers:\n    \
    - { purl: \"telo:local/js#Say\", coldMs: 5 }\n    \
    - { purl: \"npm:@telorun/http-server@0.28.0#http-server-api\", work: npmInstall, coldMs: 5 }\n";

/// Runs `fake-telo run app.yaml` in `dir` with `env`; on a terminal
/// (util-linux `script` gives it one) when `tty`. Returns its output.
fn run_in(dir: &Path, env: &[(&str, &str)], tty: bool) -> String {
    let fake_telo = env!("CARGO_BIN_EXE_fake-telo");
    let mut command = if tty {
        let mut script = Command::new("script");
        script.args(["-qec", &format!("{fake_telo} run app.yaml"), "/dev/null"]);
        script
    } else {
        let mut direct = Command::new(fake_telo);
        direct.args(["run", "app.yaml"]);
        direct
    };
    command.current_dir(dir).env_remove("TELO_CACHE_DIR");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("run fake-telo");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cache_files(cache: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for kind in ["controller-src", "npm"] {
        for entry in std::fs::read_dir(cache.join(kind)).into_iter().flatten() {
            for file in std::fs::read_dir(entry.unwrap().path()).unwrap() {
                let path = file.unwrap().path();
                files.push(path.strip_prefix(cache).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn a_cold_start_fills_the_cache_beside_the_entry_and_a_warm_one_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.yaml"), APP).unwrap();
    let cold = run_in(dir.path(), &[], true);
    assert!(
        cold.contains("⬇ telo:local/js#Say source-build…"),
        "{cold:?}"
    );
    assert!(cold.contains("✓ telo:local/js#Say (local, "), "{cold:?}");
    assert!(
        cold.contains("⬇ npm:@telorun/http-server@0.28.0#http-server-api npm-install…"),
        "{cold:?}"
    );
    // The progress comes before the application's own output.
    assert!(
        cold.find("✓ telo:local/js#Say").unwrap() < cold.find("app output").unwrap(),
        "{cold:?}"
    );
    let cache = dir.path().join(".telo");
    let files = cache_files(&cache);
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files[0].starts_with("controller-src/") && files[0].ends_with("/bundle.mjs"));
    assert!(files[1].starts_with("npm/") && files[1].ends_with("/.telo-state.json"));

    let warm = run_in(dir.path(), &[], true);
    assert!(!warm.contains('⬇') && !warm.contains('✓'), "{warm:?}");
    assert!(warm.contains("app output"), "{warm:?}");
}

#[test]
fn off_a_terminal_nothing_is_shown_and_telo_cache_dir_moves_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.yaml"), APP).unwrap();
    let cache_var = cache.path().to_string_lossy().into_owned();
    let output = run_in(dir.path(), &[("TELO_CACHE_DIR", &cache_var)], false);
    assert_eq!(output, "app output\n");
    assert_eq!(cache_files(cache.path()).len(), 2);
    assert!(!dir.path().join(".telo").exists());
}

#[test]
fn a_cache_that_cannot_be_written_fails_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.yaml"), APP).unwrap();
    // A file where the cache directory should be.
    let blocked = dir.path().join("cache-is-a-file");
    std::fs::write(&blocked, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fake-telo"))
        .args(["run", "app.yaml"])
        .current_dir(dir.path())
        .env("TELO_CACHE_DIR", &blocked)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot write the kernel cache at {}",
            blocked.display()
        )),
        "{stderr}"
    );
}

#[test]
fn a_cache_moved_to_another_depth_misses_its_npm_installs_but_not_its_builds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.yaml"), APP).unwrap();
    let first = dir.path().join("a/cache");
    let cache_var = first.to_string_lossy().into_owned();
    run_in(dir.path(), &[("TELO_CACHE_DIR", &cache_var)], true);
    // The same place again, and a copy as deep elsewhere: warm.
    let again = run_in(dir.path(), &[("TELO_CACHE_DIR", &cache_var)], true);
    assert!(!again.contains('⬇'), "{again:?}");
    let sibling = dir.path().join("b/cache");
    copy_dir(&first, &sibling);
    let sibling_var = sibling.to_string_lossy().into_owned();
    let beside = run_in(dir.path(), &[("TELO_CACHE_DIR", &sibling_var)], true);
    assert!(!beside.contains('⬇'), "{beside:?}");
    // Deeper: the npm install root is keyed by where the cache sits
    // relative to the kernel, as the real kernel's is.
    let deeper = dir.path().join("c/d/e/cache");
    copy_dir(&first, &deeper);
    let deeper_var = deeper.to_string_lossy().into_owned();
    let moved = run_in(dir.path(), &[("TELO_CACHE_DIR", &deeper_var)], true);
    assert!(
        moved.contains("⬇ npm:@telorun/http-server@0.28.0#http-server-api npm-install…"),
        "{moved:?}"
    );
    assert!(!moved.contains("source-build"), "{moved:?}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// What a warm pod's warm-up runs, as the real kernel (0.81) behaves:
/// `install` npm-installs the imported modules' `pkg:npm` controllers and
/// exits 1 over the source-built ones; a `run` of a manifest declaring
/// resources builds theirs; an application using the same modules then
/// loads every controller from the cache.
#[test]
fn install_then_a_run_of_the_warm_up_leaves_an_application_nothing_to_do() {
    let fake_telo = env!("CARGO_BIN_EXE_fake-telo");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let warm_up = dir.path().join("warm-up");
    std::fs::create_dir(&warm_up).unwrap();
    let imports = "imports:\n  Http: \"/opt/telo/modules/http-server\"\n  \
                   Run: \"/opt/telo/modules/run\"\n  Console: \"/opt/telo/modules/console\"\n";
    std::fs::write(
        warm_up.join("telo.yaml"),
        format!(
            "kind: Telo.Application\nmetadata: {{ name: WarmUp }}\n{imports}\
             targets:\n  - invoke: !ref Console.writeLine\n  - invoke: !ref v\n---\n\
             kind: Run.Value\nmetadata: {{ name: v }}\nvalue: {{}}\n"
        ),
    )
    .unwrap();
    let install = Command::new(fake_telo)
        .args(["install", "./telo.yaml"])
        .current_dir(&warm_up)
        .env("TELO_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&install.stdout);
    assert_eq!(install.status.code(), Some(1), "{install:?}");
    assert!(said.contains("2 failed, 1 installed in "), "{said:?}");
    assert_eq!(cache_files(&cache).len(), 1, "{:?}", cache_files(&cache));
    assert!(cache_files(&cache)[0].starts_with("npm/"));

    let app = dir.path().join("app");
    std::fs::create_dir(&app).unwrap();
    std::fs::write(
        app.join("app.yaml"),
        format!(
            "kind: Telo.Application\nmetadata: {{ name: Hello }}\n{imports}---\n\
             kind: Http.Server\nmetadata: {{ name: s }}\n---\n\
             kind: Run.Value\nmetadata: {{ name: hello }}\nvalue: {{}}\n"
        ),
    )
    .unwrap();
    let cache_var = cache.to_str().unwrap();
    // The application alone after the install: its Value is built.
    let after_install = run_in(&app, &[("TELO_CACHE_DIR", cache_var)], true);
    assert!(
        after_install.contains("⬇ telo:local/js#Value source-build…")
            && !after_install.contains("npm-install"),
        "{after_install:?}"
    );
    std::fs::remove_dir_all(cache.join("controller-src")).unwrap();

    let run = Command::new("script")
        .args(["-qec", &format!("{fake_telo} run ./telo.yaml"), "/dev/null"])
        .current_dir(&warm_up)
        .env("TELO_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let ran = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(
        ran.contains("⬇ telo:local/js#WritelineController source-build…")
            && ran.contains("⬇ telo:local/js#Value source-build…")
            && !ran.contains("npm-install"),
        "{ran:?}"
    );
    let warm = run_in(&app, &[("TELO_CACHE_DIR", cache_var)], true);
    assert!(!warm.contains('⬇'), "{warm:?}");

    // And with no warm-up at all, the application does the work.
    let cold = run_in(
        &app,
        &[("TELO_CACHE_DIR", dir.path().join("fresh").to_str().unwrap())],
        true,
    );
    assert!(
        cold.contains("npm-install…") && cold.contains("source-build…"),
        "{cold:?}"
    );
}
