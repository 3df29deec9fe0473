//! `fake-telo`: a stand-in for the `telo` CLI whose behaviour is scripted by a
//! `fakeTelo:` block in the entry manifest (see the crate README).
//!
//! This file only wires: parse the command line, load the script, run it, and
//! turn each failure into the exit code a CLI user would expect.

#![forbid(unsafe_code)]

mod cli;
mod controllers;
mod debug_frames;
mod debug_stream;
mod http;
mod lifetime;
mod listen;
mod live_stream;
mod modules;
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
        Command::Install(paths) => match run::install(&paths) {
            Ok(code) => ExitCode::from(code),
            Err(error) => {
                output::stderr_line(&format!("fake-telo: {}", output::error_chain(&error)));
                ExitCode::from(EXIT_FAILURE)
            }
        },
        Command::Run(options) => match run_entry(&options) {
            Ok(code) => ExitCode::from(code),
            Err(error) => {
                output::stderr_line(&format!("fake-telo: {}", output::error_chain(&error)));
                ExitCode::from(EXIT_FAILURE)
            }
        },
    }
}

fn usage_error(error: &UsageError) -> ExitCode {
    output::stderr_line(&format!("fake-telo: {error}\n{}", cli::USAGE));
    ExitCode::from(EXIT_USAGE)
}

/// A plain run, or under `--watch` a series of generations.
fn run_entry(options: &cli::RunOptions) -> Result<u8, run::RunError> {
    if options.watch {
        watch::run(options)
    } else {
        run::run(options)
    }
}
