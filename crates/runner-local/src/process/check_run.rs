//! A short run of a process to its end, for the checks and the kernel
//! cache's warm-up: stdout and stderr on one pipe, the tail of it kept, in a
//! process group of its own, bounded by a timeout; and reading what its
//! output says went wrong.

use std::io::Read;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner_core::sync::lock;

use super::OUTPUT_DRAIN_TIMEOUT;
use super::group::ProcessGroup;
use super::plan::SpawnPlan;
use super::spawner;

/// How much of the check's output is kept: the end, where errors are.
pub const CHECK_OUTPUT_BYTES: usize = 16 * 1024;
/// Longest error line quoted in a probe answer.
pub const QUOTED_LINE_CHARS: usize = 300;
/// How long a failed check's verdict stands while the kernel is unchanged.
/// Long enough that a broken kernel costs one check a minute, not one per
/// probe or start.
pub const RECHECK_FAILED_AFTER: Duration = Duration::from_secs(60);

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

#[cfg(test)]
mod tests {
    use super::*;

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
