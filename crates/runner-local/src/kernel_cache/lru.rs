//! Which warmed caches go when together they hold more than their bound:
//! the least recently used first, never one a session is being started
//! from.

use std::time::SystemTime;

/// One warmed cache as the runner last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryUse {
    pub name: String,
    /// When a session last started from it (or it was made), as the runner
    /// recorded it.
    pub last_used: SystemTime,
    pub bytes: u64,
}

/// The names to remove, least recently used first, so that what is left
/// holds at most `max_bytes` — or as little as it can while `busy` entries
/// stay whatever they cost.
pub fn evictions(entries: &[EntryUse], max_bytes: u64, busy: impl Fn(&str) -> bool) -> Vec<String> {
    let mut by_age: Vec<&EntryUse> = entries.iter().collect();
    by_age.sort_by(|a, b| {
        a.last_used
            .cmp(&b.last_used)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut total: u64 = entries.iter().map(|entry| entry.bytes).sum();
    let mut evicted = Vec::new();
    for entry in by_age {
        if total <= max_bytes {
            break;
        }
        if busy(&entry.name) {
            continue;
        }
        total = total.saturating_sub(entry.bytes);
        evicted.push(entry.name.clone());
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(name: &str, age_secs: u64, bytes: u64) -> EntryUse {
        EntryUse {
            name: name.to_owned(),
            last_used: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 - age_secs),
            bytes,
        }
    }

    #[test]
    fn nothing_goes_while_everything_fits() {
        let entries = [entry("a", 10, 40), entry("b", 5, 60)];
        assert!(evictions(&entries, 100, |_| false).is_empty());
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_rest_fits() {
        let entries = [
            entry("recent", 1, 40),
            entry("oldest", 30, 40),
            entry("older", 20, 40),
        ];
        assert_eq!(evictions(&entries, 80, |_| false), ["oldest"]);
        assert_eq!(evictions(&entries, 40, |_| false), ["oldest", "older"]);
        assert_eq!(
            evictions(&entries, 0, |_| false),
            ["oldest", "older", "recent"]
        );
    }

    #[test]
    fn an_entry_in_use_is_kept_and_the_next_oldest_goes_instead() {
        let entries = [
            entry("recent", 1, 40),
            entry("oldest", 30, 40),
            entry("older", 20, 40),
        ];
        assert_eq!(evictions(&entries, 80, |name| name == "oldest"), ["older"]);
        // Over the bound with nothing left that may go: as close as it gets.
        assert_eq!(evictions(&entries, 0, |name| name != "older"), ["older"]);
    }
}
