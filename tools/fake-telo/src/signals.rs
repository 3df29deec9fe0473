//! How the process takes SIGTERM/SIGINT, as scripted: the default (killed,
//! as a shell reports 143/130; also when launched with them ignored), a graceful stop that prints a line and exits 0
//! (`stopLine`, as a real kernel's teardown does), or SIGTERM ignored
//! (`ignoreSigterm`, so only a kill ends it).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread;

use signal_hook::consts::signal::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::output;
use crate::script::Script;

pub fn install(script: &Script) -> std::io::Result<()> {
    if script.stop_line.is_none() && !script.ignore_sigterm {
        return take_default_stops();
    }
    if script.ignore_sigterm {
        // A registered flag replaces the default action, so SIGTERM no
        // longer ends the process; nothing ever reads the flag.
        signal_hook::flag::register(SIGTERM, Arc::new(AtomicBool::new(false)))?;
    }
    if let Some(line) = script.stop_line.clone() {
        let watched: &[i32] = if script.ignore_sigterm {
            &[SIGINT]
        } else {
            &[SIGTERM, SIGINT]
        };
        let mut signals = Signals::new(watched)?;
        thread::Builder::new()
            .name("stop".to_owned())
            .spawn(move || {
                if signals.forever().next().is_some() {
                    output::stdout_line(&line);
                    std::process::exit(0);
                }
            })?;
    }
    Ok(())
}

/// Under `--watch`: SIGTERM and SIGINT are handed to `on_signal` (the
/// session stops the generation and exits 0, as the real kernel does), each
/// time one arrives.
pub fn forward_stops(on_signal: impl Fn(i32) + Send + 'static) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    thread::Builder::new()
        .name("stop".to_owned())
        .spawn(move || {
            for signal in signals.forever() {
                on_signal(signal);
            }
        })?;
    Ok(())
}

/// SIGTERM and SIGINT end the process as their default action does (it is
/// reported killed by the signal) — even when whoever launched it left them
/// ignored, as a shell does for `nohup … &`. A real program the runner starts
/// expects those defaults, and so do the tests that signal fake-telo.
fn take_default_stops() -> std::io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    thread::Builder::new()
        .name("stop".to_owned())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                // Restores the default action and raises the signal again.
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}
