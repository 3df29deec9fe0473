//! `fake-telo`: a stand-in for the `telo` CLI whose behaviour is scripted by a
//! `fakeTelo:` block in the entry manifest (see the crate README).
//!
//! This file only wires: parse the command line, load the script, run it, and
//! turn each failure into the exit code a CLI user would expect.

#![forbid(unsafe_code)]

mod cli;
mod debug_stream;
mod http;
mod lifetime;
mod listen;
mod live_stream;
mod net;
mod output;
mod run;
mod script;
mod signals;
mod terminal;
mod watch;
mod watcher;

use std::process::ExitCode;

use cli::{Command, UsageError};

/// Exit code for command-line misuse, as with most CLIs (and clap).
const EXIT_USAGE: u8 = 2;
/// Exit code when the entry cannot be read or its script is invalid, or a port
/// cannot be bound — the real CLI fails the same way on a broken bundle.
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let command = match cli::parse(std::env::args_os().skip(1)) {
        Ok(command) => command,
        Err(error) => return usage_error(&error),
    };
    match command {
        Command::Version => {
            output::stdout_line(&format!("fake-telo {}", env!("CARGO_PKG_VERSION")));
            ExitCode::SUCCESS
        }
        Command::Help => {
            output::stdout_line(cli::USAGE);
            ExitCode::SUCCESS
        }
        Command::Run(options) => match run::run(&options) {
            Ok(code) => ExitCode::from(code),
            Err(error) => {
                output::stderr_line(&format!("fake-telo: {}", error_chain(&error)));
                ExitCode::from(EXIT_FAILURE)
            }
        },
    }
}

fn usage_error(error: &UsageError) -> ExitCode {
    output::stderr_line(&format!("fake-telo: {error}\n{}", cli::USAGE));
    ExitCode::from(EXIT_USAGE)
}

/// Joins an error with its sources, so "cannot read entry" also says *why*.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
