//! The local terminal: raw mode that is restored on every way out (drop,
//! panic), and notices on stderr that stay readable while raw mode is on.

use std::io::Write;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether raw mode is on, so the panic hook and notices know.
static RAW: AtomicBool = AtomicBool::new(false);

/// Raw mode for as long as this lives. Signals that end the client are
/// handled in the run loop, which drops the guard before exiting.
pub struct RawMode(());

impl RawMode {
    /// `None` when stdin is not a terminal (piped input): nothing to switch.
    pub fn enable() -> std::io::Result<Option<RawMode>> {
        use std::io::IsTerminal;
        if !std::io::stdin().is_terminal() {
            return Ok(None);
        }
        install_panic_hook();
        crossterm::terminal::enable_raw_mode()?;
        RAW.store(true, Ordering::SeqCst);
        Ok(Some(RawMode(())))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

fn restore() {
    if RAW.swap(false, Ordering::SeqCst) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// A panic while raw mode is on would leave the user's shell unusable; restore
/// first so the panic message prints on a sane terminal.
fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// Prints one line on stderr; in raw mode `\n` no longer returns the carriage,
/// so lines are ended with `\r\n` and start on a fresh line.
pub fn notice(message: &str) {
    let mut stderr = std::io::stderr().lock();
    if RAW.load(Ordering::SeqCst) {
        let text = message.replace('\n', "\r\n");
        let _ = write!(stderr, "\r\n{text}\r\n");
    } else {
        let _ = writeln!(stderr, "{message}");
    }
    let _ = stderr.flush();
}

/// The terminal size as (cols, rows), if stdout or stdin is a terminal.
pub fn size() -> Option<(u16, u16)> {
    crossterm::terminal::size()
        .ok()
        .filter(|(cols, rows)| *cols > 0 && *rows > 0)
}
