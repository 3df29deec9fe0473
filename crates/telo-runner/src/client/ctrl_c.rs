//! Ctrl-C in raw mode is a byte for the workload; pressing it twice quickly
//! is the user asking the client to stop the session.

use std::time::{Duration, Instant};

/// Two presses closer than this stop the session.
pub const DOUBLE_PRESS_WINDOW: Duration = Duration::from_secs(1);

const CTRL_C: u8 = 0x03;

#[derive(Debug, Default)]
pub struct DoubleCtrlC {
    last_press: Option<Instant>,
}

impl DoubleCtrlC {
    /// Feeds stdin bytes read at `now`; true when they complete a double press.
    pub fn observe(&mut self, bytes: &[u8], now: Instant) -> bool {
        for byte in bytes {
            if *byte != CTRL_C {
                continue;
            }
            if self
                .last_press
                .is_some_and(|last| now.duration_since(last) <= DOUBLE_PRESS_WINDOW)
            {
                return true;
            }
            self.last_press = Some(now);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_presses_within_a_second_stop() {
        let start = Instant::now();
        let mut watch = DoubleCtrlC::default();
        assert!(!watch.observe(b"\x03", start));
        assert!(watch.observe(b"\x03", start + Duration::from_millis(500)));
    }

    #[test]
    fn both_presses_in_one_read_stop() {
        assert!(DoubleCtrlC::default().observe(b"\x03\x03", Instant::now()));
    }

    #[test]
    fn presses_further_apart_are_just_bytes() {
        let start = Instant::now();
        let mut watch = DoubleCtrlC::default();
        assert!(!watch.observe(b"\x03", start));
        assert!(!watch.observe(b"abc\x03", start + Duration::from_secs(2)));
    }
}
