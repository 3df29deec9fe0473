//! The README's configuration section is generated from the same tables as
//! `serve --help`, so the two cannot drift. Run with `UPDATE_README=1` to
//! rewrite the section after changing a variable. The quick start's
//! walkthroughs are run as written.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rstest::rstest;
use test_support::free_port;

const BEGIN: &str =
    "<!-- env:begin (generated from the configuration tables; see tests/readme.rs) -->";
const END: &str = "<!-- env:end -->";

#[test]
fn the_readme_documents_every_environment_variable_as_help_does() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme.find(BEGIN).expect("README has the env:begin marker") + BEGIN.len();
    let end = readme.find(END).expect("README has the env:end marker");
    let generated = telo_runner::cli::env_markdown();
    let current = &readme[start..end];
    if current.trim() == generated.trim() {
        return;
    }
    if std::env::var_os("UPDATE_README").is_some() {
        let updated = format!(
            "{}\n{}\n{}",
            &readme[..start],
            generated.trim(),
            &readme[end..]
        );
        std::fs::write(&path, updated).unwrap();
        return;
    }
    panic!(
        "README's configuration section is stale; run `UPDATE_README=1 cargo test -p telo-runner --test readme`"
    );
}

/// A walkthrough of the README: the commands of the `sh` block after
/// `<!-- readme-walkthrough: NAME -->`, and the output of its last command
/// as the `text` block after `<!-- readme-output: NAME -->` shows it.
#[derive(Debug)]
struct Walkthrough {
    commands: Vec<String>,
    output: String,
}

fn fenced_block_after<'a>(readme: &'a str, marker: &str) -> &'a str {
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("README has no {marker}"));
    let rest = &readme[at + marker.len()..];
    let open = rest.find("```").expect("a fenced block after the marker");
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    &body[..body.find("```").expect("closing fence")]
}

fn walkthrough(readme: &str, name: &str) -> Walkthrough {
    let commands = fenced_block_after(readme, &format!("<!-- readme-walkthrough: {name} -->"))
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let output = fenced_block_after(readme, &format!("<!-- readme-output: {name} -->")).to_owned();
    Walkthrough { commands, output }
}

/// Kills the process (and waits for it) unless it was already reaped.
struct Spawned(Option<Child>);

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Lines of a child's stdout, as they come, kept for the end.
fn forward_lines(out: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    seen
}

/// Runs a README walkthrough as written, from a directory laid out like the
/// repository after its `cargo build --release`: `target/release` holds this
/// test build's binaries and `examples` is the repository's. The `cargo`
/// line is that build, so it is skipped; a line ending in `&` is a service,
/// started and waited for until it serves; the last line's stdout must be the
/// README's output block, and it must exit 0. The services get a free port
/// (`PORT`) and the client finds them there (`TELO_RUNNER_URL`), as the
/// README's defaults would on a quiet machine.
#[rstest]
#[case::local("local")]
#[case::kubernetes("kubernetes")]
fn the_readme_walkthrough_works_as_written(#[case] name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let walk = walkthrough(&readme, name);
    assert_eq!(
        walk.commands.first().map(String::as_str),
        Some("cargo build --release"),
        "{walk:?}"
    );
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_telo-runner"))
        .parent()
        .unwrap()
        .to_owned();
    for companion in ["fake-telo", "kube-sim"] {
        test_support::fake_telo::workspace_binary(companion);
    }
    let clone = tempfile::tempdir().unwrap();
    std::fs::create_dir(clone.path().join("target")).unwrap();
    std::os::unix::fs::symlink(&bin_dir, clone.path().join("target/release")).unwrap();
    std::os::unix::fs::symlink(
        root.join("examples").canonicalize().unwrap(),
        clone.path().join("examples"),
    )
    .unwrap();
    let port = free_port().to_string();
    let shell = |command: &str| {
        let mut shell = Command::new("bash");
        shell
            .args(["-c", &format!("exec {command}")])
            .current_dir(clone.path())
            .env("PORT", &port)
            .env("TELO_RUNNER_URL", format!("http://127.0.0.1:{port}"))
            .env_remove("LOG_LEVEL")
            .env_remove("RUNNER_BACKEND")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        shell
    };
    let mut services = Vec::new();
    let mut last = None;
    for command in &walk.commands[1..] {
        if let Some(service) = command.strip_suffix('&') {
            let mut child = shell(service.trim()).spawn().unwrap();
            let lines = forward_lines(child.stdout.take().unwrap());
            let mut said = Vec::new();
            // Serving once it printed what to run next.
            loop {
                let line = lines
                    .recv_timeout(Duration::from_secs(60))
                    .unwrap_or_else(|_| panic!("`{service}` did not come up; it said {said:#?}"));
                let done = line.starts_with("Next, in another terminal:");
                said.push(line);
                if done {
                    break;
                }
            }
            services.push((Spawned(Some(child)), said));
        } else {
            let mut child = shell(command).spawn().unwrap();
            let stdout = child.stdout.take().unwrap();
            let (done, finished) = mpsc::channel();
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = BufReader::new(stdout).read_to_string(&mut text);
                let _ = done.send(text);
            });
            let text = finished
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("`{command}` did not finish"));
            let status = child.wait().unwrap();
            last = Some((command.clone(), status, text));
        }
    }
    let (command, status, text) = last.expect("the walkthrough runs a client command");
    assert_eq!(text, walk.output, "stdout of `{command}`");
    assert!(status.success(), "`{command}` exited {status}");
    // The services stop on SIGTERM, and what they started stops with them.
    for (mut service, said) in services {
        let mut child = service.0.take().unwrap();
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        let (exited, exit) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = exited.send(child.wait());
        });
        let status = exit
            .recv_timeout(Duration::from_secs(30))
            .expect("the service stops on SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}; it said {said:#?}");
        if let Some(kubeconfig) = said.iter().find_map(|line| {
            line.split_once(", kubeconfig ")
                .map(|(_, path)| path.trim().to_owned())
        }) {
            assert!(
                !Path::new(&kubeconfig).exists(),
                "kube-sim's files are removed with it: {kubeconfig}"
            );
            assert!(
                !std::fs::read_dir("/proc")
                    .unwrap()
                    .filter_map(Result::ok)
                    .any(|entry| {
                        std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| {
                            String::from_utf8_lossy(&cmdline).contains(&kubeconfig)
                        })
                    }),
                "kube-sim still runs"
            );
        }
    }
}

/// The packages `cargo build -p telo-runner` builds, each with its features.
fn resolved(selection: &[&str]) -> std::collections::BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--offline", "-e", "normal,build"])
        .args(["--prefix", "none", "-f", "{p} [{f}]"])
        .args(selection)
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (package, features) = line.trim_end_matches(" (*)").rsplit_once(" [")?;
            Some((
                package.to_owned(),
                features.trim_end_matches(']').to_owned(),
            ))
        })
        .collect()
}

/// The quick start builds the workspace and then runs `telo-runner`; `cargo
/// run -p telo-runner` after it must not build again, so every package
/// telo-runner uses gets the same features in both builds (Cargo unifies
/// features over what a build selects). A member that turns on a feature
/// telo-runner's tree lacks fails this; give it to telo-runner's tree too, or
/// keep it to the member's dev-dependencies.
#[test]
fn a_package_build_and_a_workspace_build_resolve_the_same_features() {
    let package = resolved(&["-p", "telo-runner"]);
    let workspace = resolved(&["--workspace"]);
    let differing: Vec<String> = package
        .iter()
        .filter_map(|(name, features)| {
            let unified = workspace.get(name)?;
            (unified != features).then(|| format!("{name}: [{features}] vs [{unified}]"))
        })
        .collect();
    assert!(differing.is_empty(), "{differing:#?}");
}
