//! The kernel self-check: run a minimal application the way a session would
//! and read what its end says about the kernel.
//!
//! Finding the Telo CLI is not the same as being able to run it: on Node.js
//! older than 24 the real CLI fails every run at once (`JSON.rawJSON is
//! unavailable ... Telo requires Node.js >= 24`), and `telo check` does not
//! notice. Only a run does, so the probe's answer comes from one.
//!
//! [`diagnose`] and the output helpers are pure; [`run_check`] and
//! [`node_version`] do the process work.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::launch::SpawnPlan;
use crate::process::group::ProcessGroup;
use crate::process::spawner;
use crate::session::OUTPUT_DRAIN_TIMEOUT;

use runner_core::sync::lock;

/// The smallest application the kernel accepts: loading it exercises the
/// CLI, the kernel and the JavaScript runtime, and nothing else.
pub const SELF_CHECK_MANIFEST: &str =
    "kind: Telo.Application\nmetadata:\n  name: RunnerSelfCheck\n  version: 1.0.0\n";
/// The entry the check runs, relative to its scratch app directory.
pub const SELF_CHECK_ENTRY: &str = "telo.yaml";
/// A healthy kernel finishes in ~1.4 s; this only bounds a hung one.
pub const SELF_CHECK_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of the check's output is kept: the end, where errors are.
pub const CHECK_OUTPUT_BYTES: usize = 16 * 1024;
/// Longest error line quoted in a probe answer.
pub const QUOTED_LINE_CHARS: usize = 300;
/// How long a failed check's verdict stands while the kernel is unchanged.
/// Long enough that a broken kernel costs one check a minute, not one per
/// probe or start.
pub const RECHECK_FAILED_AFTER: Duration = Duration::from_secs(60);

const NODE_VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// `telo --version` starts Node.js and the CLI: ~0.3 s on a quiet machine.
const TELO_VERSION_TIMEOUT: Duration = Duration::from_secs(20);

/// How a check run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckEnd {
    /// The exit code (`128 + signal` when a signal ended it).
    Exited(i64),
    TimedOut(Duration),
    /// The process could not be started at all.
    SpawnFailed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRun {
    pub end: CheckEnd,
    /// The last [`CHECK_OUTPUT_BYTES`] of stdout and stderr, interleaved.
    pub output: String,
}

/// Why sessions cannot run, in the probe's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelProblem {
    /// Names the cause.
    pub message: String,
    /// Says what the operator can do about it.
    pub remediation: String,
}

impl KernelProblem {
    /// Both, as one text for a session's start failure.
    pub fn sentence(&self) -> String {
        format!("{} {}", self.message, self.remediation)
    }
}

pub const TELO_NOT_FOUND_REMEDIATION: &str =
    "Install the Telo CLI, or set RUNNER_LOCAL_TELO to the path of its executable.";

pub const NODE_REMEDIATION: &str = "Install Node.js 24 or newer, or set RUNNER_LOCAL_PATH so that the first node on it is version 24 or newer.";

/// What a finished check says about the kernel: `None` when it is usable.
/// `telo` is the CLI as configured, `node_version` what the first `node` on
/// the workload `PATH` reports (only read for a Node.js failure).
pub fn diagnose(run: &CheckRun, telo: &str, node_version: Option<&str>) -> Option<KernelProblem> {
    let generic = || {
        format!(
            "Run '{telo} run ./telo.yaml' with a minimal Telo.Application manifest on the runner's host to see the whole error, then repair the Telo CLI installation or set RUNNER_LOCAL_TELO to a working one."
        )
    };
    let problem = match &run.end {
        CheckEnd::Exited(0) => return None,
        CheckEnd::Exited(_) if needs_newer_node(&run.output) => KernelProblem {
            message: match node_version {
                Some(version) => format!(
                    "The Telo CLI '{telo}' cannot run on this runner's Node.js ({version}): Telo requires Node.js 24 or newer."
                ),
                None => format!(
                    "The Telo CLI '{telo}' cannot run on this runner's Node.js: Telo requires Node.js 24 or newer."
                ),
            },
            remediation: NODE_REMEDIATION.to_owned(),
        },
        CheckEnd::Exited(code) => KernelProblem {
            message: match last_error_line(&run.output) {
                Some(line) => format!(
                    "The Telo CLI '{telo}' failed its self-check with exit code {code}: {}",
                    with_period(&line)
                ),
                None => format!(
                    "The Telo CLI '{telo}' failed its self-check with exit code {code} and printed nothing."
                ),
            },
            remediation: generic(),
        },
        CheckEnd::TimedOut(after) => KernelProblem {
            message: format!(
                "The Telo CLI '{telo}' did not finish its self-check (a minimal application) within {} s.",
                after.as_secs()
            ),
            remediation: generic(),
        },
        CheckEnd::SpawnFailed(error) => KernelProblem {
            message: format!(
                "The Telo CLI '{telo}' could not be started: {}",
                with_period(error)
            ),
            remediation: generic(),
        },
    };
    Some(problem)
}

/// Whether the kernel refused the JavaScript runtime it runs on.
pub fn needs_newer_node(output: &str) -> bool {
    output.contains("Node.js >= 24") || output.contains("JSON.rawJSON")
}

fn with_period(text: &str) -> String {
    if text.ends_with(['.', '!', '?']) {
        text.to_owned()
    } else {
        format!("{text}.")
    }
}

/// The line of `output` that best says what went wrong: the last one that
/// mentions an error, else the last one at all — never a closing tally
/// like `1 error`. Colours are removed and the line is cut to
/// [`QUOTED_LINE_CHARS`].
pub fn last_error_line(output: &str) -> Option<String> {
    let plain = strip_ansi(output);
    let lines: Vec<&str> = plain
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !is_tally(line))
        .collect();
    let line = lines
        .iter()
        .rev()
        .find(|line| line.to_ascii_lowercase().contains("error"))
        .or(lines.last())?;
    Some(cut(line, QUOTED_LINE_CHARS))
}

/// `1 error`, `2 errors, 1 warning`: a summary, not a cause.
fn is_tally(line: &str) -> bool {
    line.split(',').all(|part| {
        let mut words = part.split_whitespace();
        matches!(
            (words.next(), words.next(), words.next()),
            (Some(count), Some("error" | "errors" | "warning" | "warnings"), None)
                if count.bytes().all(|b| b.is_ascii_digit())
        )
    })
}

fn cut(line: &str, max_chars: usize) -> String {
    match line.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    }
}

/// Removes terminal escape sequences (colours, cursor moves, titles) and
/// carriage returns: the kernel colours its output when `FORCE_COLOR` is set,
/// as it is for sessions.
pub fn strip_ansi(text: &str) -> String {
    runner_core::kernel_progress::strip_escapes(text)
}

/// The end of a stream, at most `limit` bytes of it.
#[derive(Debug, Default)]
struct Tail {
    bytes: Vec<u8>,
    limit: usize,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > self.limit {
            let excess = self.bytes.len() - self.limit;
            self.bytes.drain(..excess);
        }
    }
}

/// Kills the check's processes when the check is abandoned (the backend
/// shutting down mid-check); a no-op once the leader was reaped.
struct KillOnDrop(Arc<ProcessGroup>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
    }
}

/// Runs `plan` with stdout and stderr on one pipe (no terminal: the check
/// needs none), in its own process group, for at most `timeout`; whatever
/// is left of the group when the leader exits is killed, as for a session.
pub async fn run_check(plan: SpawnPlan, timeout: Duration) -> CheckRun {
    let spawn_failed = |err: std::io::Error| CheckRun {
        end: CheckEnd::SpawnFailed(err.to_string()),
        output: String::new(),
    };
    let SpawnPlan {
        argv,
        cwd,
        env,
        members,
        args_file,
        controlling_tty: _,
    } = plan;
    // Readable until the check is over.
    let _args_file = args_file;
    let (reader, writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(err) => return spawn_failed(err),
    };
    let stderr = match writer.try_clone() {
        Ok(stderr) => stderr,
        Err(err) => return spawn_failed(err),
    };
    let spawned = spawner::on_spawner_thread(move || {
        let Some((program, args)) = argv.split_first() else {
            return Err(std::io::Error::other("empty command line"));
        };
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(name, value)| (name, value)))
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(stderr);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        // The command, holding our copies of the pipe's write end, is
        // dropped on return: the read below then sees end-of-file.
        command.spawn()
    })
    .await
    .map_err(std::io::Error::other)
    .flatten();
    let child = match spawned {
        Ok(child) => child,
        Err(err) => return spawn_failed(err),
    };
    let Some(pid) = i32::try_from(child.id()).ok() else {
        return spawn_failed(std::io::Error::other(
            "the started process has no usable id",
        ));
    };
    let group = Arc::new(ProcessGroup::new(nix::unistd::Pid::from_raw(pid), members));
    let _kill_on_drop = KillOnDrop(group.clone());

    let tail = Arc::new(Mutex::new(Tail {
        bytes: Vec::new(),
        limit: CHECK_OUTPUT_BYTES,
    }));
    let mut reading = {
        let tail = tail.clone();
        tokio::task::spawn_blocking(move || read_into(reader, &tail))
    };
    let mut waiting = {
        let group = group.clone();
        tokio::task::spawn_blocking(move || group.wait(Box::new(child)))
    };
    let end = match tokio::time::timeout(timeout, &mut waiting).await {
        Ok(Ok(code)) => CheckEnd::Exited(code),
        Ok(Err(join)) => CheckEnd::SpawnFailed(format!("lost track of the process: {join}")),
        Err(_) => {
            let _ = group.kill();
            let _ = waiting.await;
            CheckEnd::TimedOut(timeout)
        }
    };
    // A process that escaped the group may hold the pipe open: take what
    // arrived so far rather than wait for it.
    let _ = tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, &mut reading).await;
    let output = String::from_utf8_lossy(&lock(&tail).bytes).into_owned();
    CheckRun { end, output }
}

fn read_into(mut reader: impl Read, tail: &Mutex<Tail>) {
    let mut buf = [0u8; 4096];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => lock(tail).push(&buf[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// What `node --version` prints (`v20.20.2`), or `None` when it does not
/// answer like Node.js.
pub async fn node_version(node: &Path, search_path: &str) -> Option<String> {
    let version = version_output(node, search_path, NODE_VERSION_TIMEOUT).await?;
    (version.starts_with('v') && version.len() < 40).then_some(version)
}

/// What `program --version` printed (trimmed) when it succeeded in time,
/// run with nothing of the runner's environment but `PATH`.
async fn version_output(program: &Path, search_path: &str, timeout: Duration) -> Option<String> {
    let output = tokio::process::Command::new(program)
        .arg("--version")
        .env_clear()
        .env("PATH", search_path)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(timeout, output).await.ok()?.ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The release a Telo CLI says it is (`telo --version` prints it bare, e.g.
/// `0.81.0`); `None` when it prints anything else or fails.
pub async fn telo_version(telo: &Path, search_path: &str) -> Option<String> {
    parse_telo_version(&version_output(telo, search_path, TELO_VERSION_TIMEOUT).await?)
}

/// The version in `telo --version`'s output: one line that is a version.
pub fn parse_telo_version(output: &str) -> Option<String> {
    let line = output.trim();
    runner_api::telo::TeloVersion::parse(line).map(|version| version.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_telo_version_is_a_bare_version_line() {
        assert_eq!(parse_telo_version("0.81.0\n").as_deref(), Some("0.81.0"));
        assert_eq!(parse_telo_version("fake-telo 0.1.0\n"), None);
        assert_eq!(parse_telo_version(""), None);
    }

    const NODE_20_OUTPUT: &str = "telo.yaml  error  JSON.rawJSON is unavailable, so a CEL integer (int64) cannot be serialized exactly. Telo requires Node.js >= 24 or Bun >= 1.3.\n\n1 error\n";

    fn exited(code: i64, output: &str) -> CheckRun {
        CheckRun {
            end: CheckEnd::Exited(code),
            output: output.to_owned(),
        }
    }

    #[test]
    fn a_clean_exit_is_a_usable_kernel_whatever_it_printed() {
        assert_eq!(diagnose(&exited(0, "some warning\n"), "telo", None), None);
    }

    #[test]
    fn a_node_that_is_too_old_is_named_with_its_version_and_the_fix() {
        let problem = diagnose(&exited(1, NODE_20_OUTPUT), "/opt/telo", Some("v20.20.2")).unwrap();
        assert_eq!(
            problem,
            KernelProblem {
                message: "The Telo CLI '/opt/telo' cannot run on this runner's Node.js (v20.20.2): Telo requires Node.js 24 or newer.".to_owned(),
                remediation: "Install Node.js 24 or newer, or set RUNNER_LOCAL_PATH so that the first node on it is version 24 or newer.".to_owned(),
            }
        );
    }

    #[test]
    fn a_too_old_node_is_recognised_by_either_phrase_even_coloured() {
        let coloured = "\u{1b}[31mtelo.yaml  error\u{1b}[0m  JSON.rawJSON is unavailable\n";
        let problem = diagnose(&exited(1, coloured), "telo", None).unwrap();
        assert_eq!(
            problem.message,
            "The Telo CLI 'telo' cannot run on this runner's Node.js: Telo requires Node.js 24 or newer."
        );
        assert!(needs_newer_node(
            "Telo requires Node.js >= 24 or Bun >= 1.3."
        ));
        assert!(!needs_newer_node("Node.js 22 deprecation warning"));
    }

    #[test]
    fn another_failure_quotes_its_last_error_line_and_exit_code() {
        let output = "loading\n\u{1b}[31mtelo.yaml  error  Cannot find package 'yaml'\u{1b}[0m\r\n  at somewhere\n\n2 errors, 1 warning\n";
        let problem = diagnose(&exited(3, output), "telo", None).unwrap();
        assert_eq!(
            problem.message,
            "The Telo CLI 'telo' failed its self-check with exit code 3: telo.yaml  error  Cannot find package 'yaml'."
        );
        assert!(
            problem.remediation.contains("RUNNER_LOCAL_TELO"),
            "{}",
            problem.remediation
        );
        assert!(
            problem.remediation.contains("'telo run ./telo.yaml'"),
            "{}",
            problem.remediation
        );
    }

    #[test]
    fn without_an_error_line_the_last_line_is_quoted() {
        let problem = diagnose(&exited(127, "sh: 1: node: not found\n"), "telo", None).unwrap();
        assert_eq!(
            problem.message,
            "The Telo CLI 'telo' failed its self-check with exit code 127: sh: 1: node: not found."
        );
        let silent = diagnose(&exited(1, "\n \n"), "telo", None).unwrap();
        assert_eq!(
            silent.message,
            "The Telo CLI 'telo' failed its self-check with exit code 1 and printed nothing."
        );
    }

    #[test]
    fn a_hung_or_unstartable_kernel_says_so() {
        let hung = CheckRun {
            end: CheckEnd::TimedOut(Duration::from_secs(60)),
            output: String::new(),
        };
        assert_eq!(
            diagnose(&hung, "telo", None).unwrap().message,
            "The Telo CLI 'telo' did not finish its self-check (a minimal application) within 60 s."
        );
        let unstartable = CheckRun {
            end: CheckEnd::SpawnFailed("Permission denied (os error 13)".to_owned()),
            output: String::new(),
        };
        assert_eq!(
            diagnose(&unstartable, "telo", None).unwrap().message,
            "The Telo CLI 'telo' could not be started: Permission denied (os error 13)."
        );
    }

    #[test]
    fn a_long_error_line_is_cut() {
        let long = format!("error {}\n", "é".repeat(1000));
        let line = last_error_line(&long).unwrap();
        assert_eq!(line.chars().count(), QUOTED_LINE_CHARS + 1);
        assert!(line.ends_with('…'));
    }

    #[test]
    fn tallies_are_not_causes() {
        for tally in ["1 error", "2 errors", "3 errors, 1 warning", "1 warning"] {
            assert!(is_tally(tally), "{tally}");
        }
        for line in ["error: boom", "1 error occurred", "errors"] {
            assert!(!is_tally(line), "{line}");
        }
    }

    #[test]
    fn escape_sequences_and_carriage_returns_are_removed() {
        assert_eq!(
            strip_ansi("\u{1b}[1;31mred\u{1b}[0m\r\n\u{1b}]0;title\u{7}x\u{1b}]8;;u\u{1b}\\y"),
            "red\nxy"
        );
    }

    #[test]
    fn the_tail_keeps_the_end() {
        let mut tail = Tail {
            bytes: Vec::new(),
            limit: 4,
        };
        tail.push(b"abc");
        tail.push(b"def");
        assert_eq!(tail.bytes, b"cdef");
    }
}
