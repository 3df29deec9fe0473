//! `printSize`: report the terminal size at start and after every resize, so
//! a test can prove the runner's resize messages reach the workload's PTY.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use signal_hook::consts::signal::SIGWINCH;
use signal_hook::iterator::Signals;

use crate::output;

pub fn size_line(size: Option<(u16, u16)>) -> String {
    match size {
        Some((cols, rows)) => format!("size {cols}x{rows}"),
        None => "size unknown".to_owned(),
    }
}

/// `(cols, rows)` of the terminal on stdout; `None` when stdout is no tty.
fn stdout_size() -> Option<(u16, u16)> {
    rustix::termios::tcgetwinsize(io::stdout())
        .ok()
        .map(|size| (size.ws_col, size.ws_row))
}

/// Prints the current size, then again on every SIGWINCH for the rest of the
/// process's life. The handler is installed before the first print so a
/// resize racing the start is reported rather than lost.
pub fn print_size_and_follow_resizes() -> io::Result<()> {
    let mut resizes = Signals::new([SIGWINCH])?;
    output::stdout_line(&size_line(stdout_size()));
    thread::Builder::new()
        .name("resize".to_owned())
        .spawn(move || {
            for _ in resizes.forever() {
                output::stdout_line(&size_line(stdout_size()));
            }
        })?;
    Ok(())
}

/// Prints the current size once.
pub fn print_size() {
    output::stdout_line(&size_line(stdout_size()));
}

/// Prints the size on every SIGWINCH while `active` is set, for the rest of
/// the process's life: `--watch` installs it once and each generation with
/// `printSize` turns it on.
pub fn follow_resizes_while(active: Arc<AtomicBool>) -> io::Result<()> {
    let mut resizes = Signals::new([SIGWINCH])?;
    thread::Builder::new()
        .name("resize".to_owned())
        .spawn(move || {
            for _ in resizes.forever() {
                if active.load(Ordering::SeqCst) {
                    print_size();
                }
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_printed_as_cols_by_rows() {
        assert_eq!(size_line(Some((120, 40))), "size 120x40");
        assert_eq!(size_line(None), "size unknown");
    }
}
