//! A byte-capped ring of numbered entries: what a (re)connecting client replays.

use std::collections::VecDeque;

/// Entries numbered from 1, never reused. The oldest are evicted once the sum of
/// entry sizes exceeds the cap, but the newest entry is always kept, even when it
/// alone is larger than the cap: a client must always be able to read the last
/// thing that happened.
#[derive(Debug)]
pub struct ReplayBuffer<T> {
    entries: VecDeque<Entry<T>>,
    total_bytes: usize,
    cap_bytes: usize,
    next_id: u64,
    first_id: u64,
}

#[derive(Debug)]
struct Entry<T> {
    id: u64,
    size: usize,
    item: T,
}

/// What a client resuming after `after` gets.
#[derive(Debug, PartialEq, Eq)]
pub struct Replay<T> {
    pub entries: Vec<(u64, T)>,
    /// Entries the client has not seen were evicted before it asked.
    pub has_gap: bool,
}

impl<T> Replay<T> {
    pub fn empty() -> Self {
        Self {
            entries: Vec::new(),
            has_gap: false,
        }
    }
}

impl<T: Clone> ReplayBuffer<T> {
    pub fn new(cap_bytes: usize) -> Self {
        Self::starting_at(cap_bytes, 1)
    }

    /// A buffer whose first entry gets `first_id` (a session adopted after a
    /// runner restart continues past every id the previous runner handed out).
    pub fn starting_at(cap_bytes: usize, first_id: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            total_bytes: 0,
            cap_bytes,
            next_id: first_id.max(1),
            first_id: first_id.max(1),
        }
    }

    /// Append an entry of `size` bytes; returns its id.
    pub fn push(&mut self, item: T, size: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push_back(Entry { id, size, item });
        self.total_bytes += size;
        while self.total_bytes > self.cap_bytes && self.entries.len() > 1 {
            if let Some(evicted) = self.entries.pop_front() {
                self.total_bytes -= evicted.size;
            }
        }
        id
    }

    /// Records that something was lost here: the id is used up without an
    /// entry, so every reader whose cursor is before it — a full replay
    /// included — is told of a gap.
    pub fn leave_hole(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The id the buffer's first entry got (or will get).
    pub fn first_id(&self) -> u64 {
        self.first_id
    }

    /// The id the next entry will get.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The id of the newest entry, or 0 when nothing was ever pushed.
    pub fn last_id(&self) -> u64 {
        self.next_id - 1
    }

    /// The oldest id still held (the next id when empty).
    pub fn oldest_id(&self) -> u64 {
        self.entries.front().map_or(self.next_id, |e| e.id)
    }

    /// Entries with an id greater than `after`.
    pub fn replay(&self, after: u64) -> Replay<T> {
        let oldest = self.oldest_id();
        // `0` asks for everything: it only missed something if entries were
        // evicted. Any other cursor below what is held missed what lies between.
        let has_gap = if after == 0 {
            oldest > self.first_id
        } else {
            after.saturating_add(1) < oldest
        };
        // Ids are contiguous, so the first wanted entry's index is computable.
        let skip = after.saturating_sub(oldest.saturating_sub(1)) as usize;
        let entries = self
            .entries
            .iter()
            .skip(skip)
            .map(|e| (e.id, e.item.clone()))
            .collect();
        Replay { entries, has_gap }
    }

    /// Gives back the ring's spare slots (a session that went quiet keeps
    /// what it recorded, not the room it grew to while busy).
    pub fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
    }

    /// The entry slots the ring holds memory for, resident or spare.
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// The bytes those slots take, beside what the entries point to.
    pub fn slot_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry<T>>()
    }

    pub fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    /// The entries held, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = (u64, &T)> {
        self.entries.iter().rev().map(|e| (e.id, &e.item))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_start_at_one_and_replay_from_zero_is_everything() {
        let mut buf = ReplayBuffer::new(100);
        assert_eq!(buf.push("a", 1), 1);
        assert_eq!(buf.push("b", 1), 2);
        let replay = buf.replay(0);
        assert_eq!(replay.entries, vec![(1, "a"), (2, "b")]);
        assert!(!replay.has_gap);
        assert_eq!(buf.replay(1).entries, vec![(2, "b")]);
        assert!(buf.replay(2).entries.is_empty());
        assert!(buf.replay(99).entries.is_empty());
    }

    #[test]
    fn oldest_entries_are_evicted_and_a_gap_reported() {
        let mut buf = ReplayBuffer::new(10);
        for i in 0..5 {
            buf.push(i, 4);
        }
        // 5 entries of 4 bytes under a 10-byte cap: only the last two remain.
        assert_eq!(buf.len(), 2);
        assert_eq!(buf.oldest_id(), 4);
        let replay = buf.replay(0);
        assert!(replay.has_gap);
        assert_eq!(replay.entries, vec![(4, 3), (5, 4)]);
        let replay = buf.replay(3);
        assert!(!replay.has_gap, "the client has everything up to 3");
        assert_eq!(replay.entries.len(), 2);
    }

    #[test]
    fn the_newest_entry_is_kept_even_above_the_cap() {
        let mut buf = ReplayBuffer::new(10);
        buf.push("small", 2);
        buf.push("huge", 50);
        assert_eq!(buf.len(), 1);
        assert_eq!(buf.replay(0).entries, vec![(2, "huge")]);
        assert!(buf.replay(0).has_gap);
    }

    #[test]
    fn a_buffer_can_continue_past_earlier_ids() {
        let mut buf = ReplayBuffer::starting_at(100, 1_000);
        assert_eq!(buf.push("a", 1), 1_000);
        let replay = buf.replay(5);
        assert!(
            replay.has_gap,
            "a client from before the restart missed something"
        );
        assert_eq!(replay.entries, vec![(1_000, "a")]);
        assert!(!buf.replay(999).has_gap);
        assert!(
            !buf.replay(0).has_gap,
            "a client asking for everything gets everything"
        );
    }

    #[test]
    fn an_empty_buffer_has_no_gap() {
        let buf: ReplayBuffer<u8> = ReplayBuffer::new(10);
        assert_eq!(buf.oldest_id(), 1);
        assert!(!buf.replay(0).has_gap);
    }

    proptest! {
        #[test]
        fn replay_returns_exactly_the_resident_entries_after_the_cursor(
            sizes in proptest::collection::vec(0usize..40, 0..60),
            cap in 1usize..100,
            after in 0u64..70,
        ) {
            let mut buf = ReplayBuffer::new(cap);
            for (i, size) in sizes.iter().enumerate() {
                buf.push(i as u64 + 1, *size);
            }
            prop_assert!(buf.total_bytes() <= cap || buf.len() == 1);
            let replay = buf.replay(after);
            let expected: Vec<u64> = (buf.oldest_id()..buf.next_id()).filter(|id| *id > after).collect();
            let got: Vec<u64> = replay.entries.iter().map(|(id, item)| { assert_eq!(id, item); *id }).collect();
            prop_assert_eq!(got, expected);
            prop_assert_eq!(replay.has_gap, after + 1 < buf.oldest_id());
        }

        #[test]
        fn from_zero_there_is_a_gap_only_after_an_eviction(
            sizes in proptest::collection::vec(1usize..40, 0..60),
            cap in 1usize..100,
            first in 1u64..1_000,
        ) {
            let mut buf = ReplayBuffer::starting_at(cap, first);
            for size in &sizes {
                buf.push((), *size);
            }
            let evicted = buf.len() < sizes.len();
            prop_assert_eq!(buf.replay(0).has_gap, evicted);
        }
    }
}
