//! When a scripted run ends. Pure: derived from the script alone, so the rule
//! the README states is the rule these tests check.

use std::time::Duration;

use crate::script::Script;

/// How long the process lives once its start output is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Nothing asks the process to stay: it exits right after the start output.
    Batch,
    /// It runs until the first ending that is armed here fires, or until it is
    /// killed. With no ending armed (a server without `exitAfterMs`/`echo`) it
    /// runs until killed.
    Running {
        exit_after: Option<Duration>,
        /// `echo` is on: a line `exit` or end of stdin ends the run.
        echo_ends: bool,
        /// Printing the last periodic line ends the run.
        last_line_ends: bool,
    },
}

/// Why a running process is ending. Every normal ending uses `exitCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    ExitAfterElapsed,
    EchoReadExit,
    EchoStdinClosed,
    LastLinePrinted,
}

impl Lifetime {
    pub fn of(script: &Script) -> Self {
        let serves = !script.listen.is_empty() || !script.debug_events.is_empty();
        let prints_lines = script.line_every_ms.is_some();
        if script.exit_after_ms.is_none() && !script.echo && !serves && !prints_lines {
            return Lifetime::Batch;
        }
        // The periodic lines end the run only when nothing else was asked to
        // keep it going: with a server, echo or a timer they are just output.
        let last_line_ends = prints_lines
            && script.lines.is_some()
            && script.exit_after_ms.is_none()
            && !script.echo
            && !serves;
        Lifetime::Running {
            exit_after: script.exit_after_ms.map(Duration::from_millis),
            echo_ends: script.echo,
            last_line_ends,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(exit_after_ms: Option<u64>, echo_ends: bool, last_line_ends: bool) -> Lifetime {
        Lifetime::Running {
            exit_after: exit_after_ms.map(Duration::from_millis),
            echo_ends,
            last_line_ends,
        }
    }

    #[test]
    fn the_lifetime_follows_the_documented_rule() {
        let base = Script::default;
        let cases: Vec<(&str, Script, Lifetime)> = vec![
            ("empty script is a batch", base(), Lifetime::Batch),
            (
                "output-only script is a batch",
                Script {
                    stdout: vec!["hi".into()],
                    spew_bytes: 10,
                    print_size: true,
                    exit_code: 3,
                    ..base()
                },
                Lifetime::Batch,
            ),
            (
                "timer alone",
                Script {
                    exit_after_ms: Some(50),
                    ..base()
                },
                running(Some(50), false, false),
            ),
            (
                "echo alone",
                Script {
                    echo: true,
                    ..base()
                },
                running(None, true, false),
            ),
            (
                "listener runs until killed",
                Script {
                    listen: vec![0],
                    ..base()
                },
                running(None, false, false),
            ),
            (
                "debug events run until killed",
                Script {
                    debug_events: vec!["Kernel.Started".into()],
                    ..base()
                },
                running(None, false, false),
            ),
            (
                "listener with a timer",
                Script {
                    listen: vec![0],
                    exit_after_ms: Some(10),
                    ..base()
                },
                running(Some(10), false, false),
            ),
            (
                "periodic lines alone end after the last one",
                Script {
                    line_every_ms: Some(5),
                    lines: Some(3),
                    ..base()
                },
                running(None, false, true),
            ),
            (
                "endless periodic lines run until killed",
                Script {
                    line_every_ms: Some(5),
                    ..base()
                },
                running(None, false, false),
            ),
            (
                "periodic lines next to a listener do not end the run",
                Script {
                    line_every_ms: Some(5),
                    lines: Some(3),
                    listen: vec![0],
                    ..base()
                },
                running(None, false, false),
            ),
            (
                "periodic lines next to a timer leave the ending to the timer",
                Script {
                    line_every_ms: Some(5),
                    lines: Some(3),
                    exit_after_ms: Some(100),
                    ..base()
                },
                running(Some(100), false, false),
            ),
            (
                "periodic lines next to echo leave the ending to echo",
                Script {
                    line_every_ms: Some(5),
                    lines: Some(3),
                    echo: true,
                    ..base()
                },
                running(None, true, false),
            ),
            (
                "an empty listen list is no listener",
                Script {
                    listen: vec![],
                    debug_events: vec![],
                    ..base()
                },
                Lifetime::Batch,
            ),
        ];
        for (name, script, expected) in cases {
            assert_eq!(Lifetime::of(&script), expected, "{name}");
        }
    }
}
