//! The kernel self-check: run a minimal application the way a session would
//! and read what its end says about the kernel.
//!
//! Finding the Telo CLI is not the same as being able to run it: on Node.js
//! older than 24 the real CLI fails every run at once (`JSON.rawJSON is
//! unavailable ... Telo requires Node.js >= 24`), and `telo check` does not
//! notice. Only a run does, so the probe's answer comes from one.
//!
//! [`diagnose`] is pure; [`node_version`] and [`telo_version`] do the
//! process work, and `process::check_run` runs the check itself.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::process::check_run::{CheckEnd, CheckRun, last_error_line};

/// The smallest application the kernel accepts: loading it exercises the
/// CLI, the kernel and the JavaScript runtime, and nothing else.
pub const SELF_CHECK_MANIFEST: &str =
    "kind: Telo.Application\nmetadata:\n  name: RunnerSelfCheck\n  version: 1.0.0\n";
/// The entry the check runs, relative to its scratch app directory.
pub const SELF_CHECK_ENTRY: &str = "telo.yaml";
/// A healthy kernel finishes in ~1.4 s; this only bounds a hung one.
pub const SELF_CHECK_TIMEOUT: Duration = Duration::from_secs(60);
const NODE_VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// `telo --version` starts Node.js and the CLI: ~0.3 s on a quiet machine.
const TELO_VERSION_TIMEOUT: Duration = Duration::from_secs(20);

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
}
