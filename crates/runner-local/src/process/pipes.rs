//! Starting a process whose stdout and stderr are two pipes rather than one
//! terminal (an app with `io: "streams"`): what it writes to each arrives
//! apart, tagged as it was written. Its stdin is a pipe too.
//!
//! Like a terminal session, the process leads a process group of its own
//! (every child it forks joins it, and a stop signals the group); in a
//! sandbox it is `bwrap`, whose workload starts a session of its own inside,
//! with no controlling terminal.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use nix::unistd::Pid;
use portable_pty::{Child, MasterPty};
use runner_api::watch::StreamTag;

use crate::process::args_file::ArgsFile;
use crate::process::plan::SpawnPlan;
use crate::process::pty::PtyProcess;

/// A started process, however its output is connected: its output streams
/// (one tagged `tty` from a terminal, or `stdout` and `stderr` from pipes),
/// its input, and the terminal when it has one (for resizes).
pub struct Started {
    pub pid: Pid,
    pub child: Box<dyn Child + Send + Sync>,
    pub terminal: Option<Box<dyn MasterPty + Send>>,
    pub outputs: Vec<(StreamTag, Box<dyn Read + Send>)>,
    pub input: Box<dyn Write + Send>,
    /// Kept open for the process's life (see [`SpawnPlan::args_file`]).
    pub args_file: Option<ArgsFile>,
}

impl From<PtyProcess> for Started {
    fn from(process: PtyProcess) -> Self {
        Self {
            pid: process.pid,
            child: process.child,
            terminal: Some(process.master),
            outputs: vec![(StreamTag::Tty, process.output)],
            input: process.input,
            args_file: process.args_file,
        }
    }
}

/// Starts `plan` with its stdin, stdout and stderr on pipes, leading a new
/// process group. Must run on the spawner thread (see `spawner`).
pub fn spawn_with_pipes(plan: SpawnPlan) -> std::io::Result<Started> {
    let Some((program, args)) = plan.argv.split_first() else {
        return Err(std::io::Error::other("empty command line"));
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(plan.env.iter().map(|(name, value)| (name, value)))
        .current_dir(&plan.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn()?;
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let pid = i32::try_from(child.id()).ok();
    let (Some(pid), (Some(stdin), Some(stdout), Some(stderr))) = (pid, pipes) else {
        if let Some(pid) = pid {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = child.wait();
        return Err(std::io::Error::other(
            "the started process has no usable id or pipes",
        ));
    };
    Ok(Started {
        pid: Pid::from_raw(pid),
        child: Box::new(child),
        terminal: None,
        outputs: vec![
            (StreamTag::Stdout, Box::new(stdout)),
            (StreamTag::Stderr, Box::new(stderr)),
        ],
        input: Box::new(stdin),
        args_file: plan.args_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::group::Members;

    #[test]
    fn stdout_and_stderr_arrive_apart_and_stdin_reaches_the_process() {
        let plan = SpawnPlan {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "read line; echo \"out:$line\"; echo err >&2".into(),
            ],
            cwd: std::env::temp_dir(),
            env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
            controlling_tty: false,
            members: Members::Group,
            args_file: None,
        };
        let Started {
            mut child,
            terminal,
            outputs,
            mut input,
            ..
        } = spawn_with_pipes(plan).unwrap();
        assert!(terminal.is_none());
        input.write_all(b"hi\n").unwrap();
        drop(input);
        let mut read = Vec::new();
        for (tag, mut output) in outputs {
            let mut text = String::new();
            output.read_to_string(&mut text).unwrap();
            read.push((tag, text));
        }
        assert_eq!(
            read,
            [
                (StreamTag::Stdout, "out:hi\n".to_owned()),
                (StreamTag::Stderr, "err\n".to_owned())
            ]
        );
        assert!(child.wait().unwrap().success());
    }
}
