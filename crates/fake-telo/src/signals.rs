//! How the process takes SIGTERM/SIGINT, as scripted: the default (killed,
//! as a shell reports 143/130), a graceful stop that prints a line and exits 0
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
