//! An app's output carried from one owner of a session to the next, so a
//! client that resumes after a hand-over (a rolling upgrade, a replica
//! leaving) gets every byte once.
//!
//! Sequence numbers are an owner's own: the next one numbers the same
//! output afresh, in a later generation. What both owners share is the
//! workload's output itself, counted in bytes from its first byte (a pod's
//! container log). So the owner that leaves records, for its newest
//! frames, the byte at which each ended ([`OutputMarks`]), and the owner
//! that takes over cuts the output it rebuilds at those bytes: its frame
//! ending at the same byte stands for the old frame, and a client that says
//! it has the old one is served from there. The bytes just before the last
//! mark travel too, and the marks count only if this owner's output has
//! the same bytes there; otherwise (a rotated log, output the previous
//! owner never saw) a resuming client is told of a gap as before.

use super::channel::{AppChannel, Carried};
pub use crate::backend_session::OutputMarks;

/// How many of its newest frames an owner leaving marks: a client that was
/// keeping up has one of them.
pub const MARKED_FRAMES: usize = 64;
/// How many bytes before the last mark are compared.
pub const CHECKED_BYTES: usize = 64;

/// Where a subscriber that asked for output after a given seq starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeAt {
    /// After this seq of the current numbering.
    After(u64),
    /// Not known yet: the output the resume point lies in is still being
    /// rebuilt.
    Pending,
}

impl AppChannel {
    /// The end of the next mark past what was recorded, while lining up.
    pub(super) fn next_mark_end(&self) -> Option<u64> {
        match &self.carried {
            Carried::LiningUp { marks, .. } => marks
                .points
                .iter()
                .map(|&(_, end)| end)
                .find(|&end| end > self.written),
            _ => None,
        }
    }

    /// After a frame `id` was recorded (ending at `self.written`): pairs it
    /// with the old frame that ended at the same byte, and once the last
    /// mark is passed, checks the bytes before it.
    pub(super) fn line_up(&mut self, id: u64) {
        let written = self.written;
        let Carried::LiningUp { marks, found } = &mut self.carried else {
            return;
        };
        for &(seq, end) in &marks.points {
            if end == written {
                found.push((seq, id));
            }
        }
        let last = marks.points.last().map_or(0, |&(_, end)| end);
        if written < last {
            return;
        }
        let tail = marks.tail.clone();
        let lined_up = written == last && self.exact && newest_bytes(self, tail.len()) == tail;
        if !lined_up {
            tracing::debug!(
                app = %self.name,
                written,
                last,
                exact = self.exact,
                "the previous owner's marks do not line up with the output rebuilt here"
            );
        }
        self.carried = match std::mem::take(&mut self.carried) {
            Carried::LiningUp { found, .. } if lined_up => Carried::LinedUp(found),
            _ => Carried::Failed,
        };
    }

    /// Where a subscriber asking for output after `after` starts: a seq of
    /// the previous owner's is translated through the marks.
    pub(crate) fn resume_at(&self, after: u64) -> ResumeAt {
        if after == 0 || after >= self.output_first_id() {
            return ResumeAt::After(after);
        }
        match &self.carried {
            Carried::LiningUp { marks, .. } if marks.points.iter().any(|&(s, _)| s == after) => {
                ResumeAt::Pending
            }
            Carried::LinedUp(pairs) => match pairs.iter().find(|&&(old, _)| old == after) {
                Some(&(_, new)) => ResumeAt::After(new),
                None => ResumeAt::After(after),
            },
            _ => ResumeAt::After(after),
        }
    }

    /// Marks of the newest frames, for the next owner; `None` when this
    /// channel's byte count is not the output's (something was lost, or
    /// the runner wrote into it).
    pub(crate) fn marks(&self) -> Option<OutputMarks> {
        if !self.exact || self.written == 0 {
            return None;
        }
        let mut points: Vec<_> = self.points_newest_first().take(MARKED_FRAMES).collect();
        points.reverse();
        Some(OutputMarks {
            app: self.name.clone(),
            points,
            tail: newest_bytes(self, CHECKED_BYTES),
        })
    }

    /// The newest frame's seq (the one before the first when none).
    pub(crate) fn newest_seq(&self) -> u64 {
        self.output.last_id()
    }

    /// `(seq, end)` of the frames recorded after seq `after`, ascending;
    /// none when this channel's byte count is not the output's.
    pub(crate) fn points_after(&self, after: u64) -> Vec<(u64, u64)> {
        if !self.exact {
            return Vec::new();
        }
        let mut points: Vec<_> = self
            .points_newest_first()
            .take_while(|&(id, _)| id > after)
            .collect();
        points.reverse();
        points
    }

    /// `(seq, end)` of the frames held, newest first: each frame's seq and
    /// the byte of the output at which it ends.
    fn points_newest_first(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut end = self.written;
        self.output.newest_first().map(move |(id, chunk)| {
            let point = (id, end);
            end -= chunk.bytes.len() as u64;
            point
        })
    }

    /// The bytes a mark's check compares: the newest [`CHECKED_BYTES`].
    pub(crate) fn checked_tail(&self) -> Vec<u8> {
        newest_bytes(self, CHECKED_BYTES)
    }
}

/// The newest `want` bytes the channel holds (fewer if it holds fewer).
fn newest_bytes(channel: &AppChannel, want: usize) -> Vec<u8> {
    let mut pieces = Vec::new();
    let mut have = 0;
    for (_, chunk) in channel.output.newest_first() {
        if have >= want {
            break;
        }
        let take = (want - have).min(chunk.bytes.len());
        pieces.push(&chunk.bytes[chunk.bytes.len() - take..]);
        have += take;
    }
    pieces
        .iter()
        .rev()
        .flat_map(|p| p.iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use runner_api::watch::StreamTag;

    use super::*;
    use crate::session::{OUTPUT_SEQ_GENERATION, SessionApp};

    fn channel(generation: u64) -> AppChannel {
        AppChannel::new(
            &SessionApp::default_app(Vec::new()),
            1 << 20,
            generation * OUTPUT_SEQ_GENERATION + 1,
        )
    }

    fn record(channel: &mut AppChannel, text: &str) -> u64 {
        channel.record(StreamTag::Tty, Bytes::from(text.to_owned()))
    }

    /// A session with nothing recorded yet.
    fn session() -> std::sync::Arc<crate::session::Session> {
        std::sync::Arc::new(crate::session::Session::new(
            "s1".into(),
            "2026-01-01T00:00:00Z".into(),
            1 << 20,
            1,
            None,
            std::sync::Arc::new(crate::metrics::Metrics::new()),
        ))
    }

    /// What a client that has `after` reads from `channel`.
    fn resumed(channel: &AppChannel, after: u64) -> (bool, String) {
        let ResumeAt::After(position) = channel.resume_at(after) else {
            panic!("still pending");
        };
        let replay = channel.output.replay(position);
        let text = replay
            .entries
            .iter()
            .map(|(_, chunk)| String::from_utf8_lossy(&chunk.bytes).into_owned())
            .collect();
        (replay.has_gap, text)
    }

    #[test]
    fn a_client_resuming_from_the_previous_owners_frame_gets_every_byte_once() {
        let mut before = channel(0);
        record(&mut before, "one\r\n");
        let kept = record(&mut before, "two\r\n");
        record(&mut before, "three\r\n");
        let marks = before.marks().unwrap();
        assert_eq!(marks.points, vec![(1, 5), (2, 10), (3, 17)]);

        let mut after = channel(1);
        after.carry(marks);
        assert_eq!(after.resume_at(kept), ResumeAt::Pending);
        // The log, read whole, then what the workload writes next.
        record(&mut after, "one\r\ntwo\r\nthree\r\nfo");
        record(&mut after, "ur\r\n");
        assert_eq!(resumed(&after, kept), (false, "three\r\nfour\r\n".into()));
        assert_eq!(resumed(&after, 3), (false, "four\r\n".into()));
        // A client that asks for everything gets everything.
        let (gap, text) = resumed(&after, 0);
        assert!(!gap);
        assert_eq!(text, "one\r\ntwo\r\nthree\r\nfour\r\n");
    }

    #[test]
    fn marks_that_do_not_fit_the_output_leave_a_gap() {
        let mut before = channel(0);
        record(&mut before, "one\r\n");
        let kept = record(&mut before, "two\r\n");
        let marks = before.marks().unwrap();
        // A log that was rotated: other bytes where the marks point.
        let mut after = channel(1);
        after.carry(marks);
        record(&mut after, "xxxxx\r\nyyy\r\n");
        assert!(matches!(after.carried, Carried::Failed));
        let (gap, text) = resumed(&after, kept);
        assert!(gap, "a client the marks cannot place is told");
        assert_eq!(text, "xxxxx\r\nyyy\r\n");
    }

    #[test]
    fn a_channel_that_lost_output_or_carries_the_runners_text_has_no_marks() {
        let mut lost = channel(0);
        record(&mut lost, "one\r\n");
        lost.lose_count();
        assert!(lost.marks().is_none());
        assert!(
            channel(0).marks().is_none(),
            "nothing recorded, nothing marked"
        );
    }

    /// A session carrying a previous owner's mark at seq 5 (byte 100), and
    /// a cursor on that seq, before any output is rebuilt.
    fn on_a_seq_past_the_marks() -> (
        std::sync::Arc<crate::session::Session>,
        crate::session::Cursor<crate::session::OutputChunk>,
    ) {
        let session = session();
        session.carry_output(vec![OutputMarks {
            app: runner_api::watch::DEFAULT_APP_NAME.into(),
            points: vec![(5, 100)],
            tail: Vec::new(),
        }]);
        let cursor = session.subscribe_output(5);
        (session, cursor)
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_point_the_output_never_reaches_is_given_up_with_a_gap() {
        let (session, mut cursor) = on_a_seq_past_the_marks();
        let first = cursor.try_next();
        assert!(
            !first.gap && first.entries.is_empty(),
            "waits for the history"
        );
        // A log shorter than the marks say (rotated, say): it never gets there.
        session.push_output(None, StreamTag::Tty, Bytes::from_static(b"short"));
        let batch = cursor.next().await;
        assert!(batch.gap);
        assert_eq!(&batch.entries[0].1.bytes[..], b"short");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_subscriber_of_a_silent_session_is_greeted_without_waiting() {
        use futures_util::FutureExt;

        let session = session();
        let mut cursor = session.subscribe_output(0);
        let greeting = cursor
            .settled()
            .now_or_never()
            .expect("nothing to rebuild, so nothing to wait for");
        assert!(!greeting.gap && greeting.entries.is_empty());
        // Output written later is what it waits for next.
        session.push_output(None, StreamTag::Tty, Bytes::from_static(b"hi"));
        let batch = cursor.next().now_or_never().expect("output is there");
        assert_eq!(&batch.entries[0].1.bytes[..], b"hi");
        // One that has seen all of it is greeted with nothing, at once.
        let mut caught_up = session.subscribe_output(cursor.position());
        let greeting = caught_up.settled().now_or_never().expect("no wait");
        assert!(!greeting.gap && greeting.entries.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscriber_on_the_previous_owners_seq_is_greeted_once_it_is_placed() {
        let session = session();
        let mut before = channel(0);
        record(&mut before, "one\r\n");
        let kept = record(&mut before, "two\r\n");
        session.carry_output(vec![before.marks().unwrap()]);
        let mut cursor = session.subscribe_output(kept);
        let start = tokio::time::Instant::now();
        let settling = tokio::spawn(async move { cursor.settled().await });
        tokio::task::yield_now().await;
        assert!(!settling.is_finished(), "the history is not rebuilt yet");
        // The log, read whole, then what the workload writes next.
        session.push_output(
            None,
            StreamTag::Tty,
            Bytes::from_static(b"one\r\ntwo\r\nthr"),
        );
        let greeting = settling.await.unwrap();
        assert_eq!(
            tokio::time::Instant::now(),
            start,
            "placed before the deadline"
        );
        assert!(!greeting.gap);
        let text: Vec<_> = greeting.entries.iter().map(|(_, c)| &c.bytes[..]).collect();
        assert_eq!(text, [&b"thr"[..]], "what follows its frame, once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscriber_that_cannot_be_placed_is_greeted_at_the_deadline() {
        let (_session, mut cursor) = on_a_seq_past_the_marks();
        let start = tokio::time::Instant::now();
        let greeting = cursor.settled().await;
        assert_eq!(
            tokio::time::Instant::now() - start,
            crate::session::SETTLE_WITHIN
        );
        assert!(greeting.entries.is_empty());
    }

    #[test]
    fn only_the_newest_frames_are_marked_and_large_output_is_still_split() {
        let mut before = channel(0);
        for n in 0..(MARKED_FRAMES + 10) {
            record(&mut before, &format!("line {n}\n"));
        }
        let marks = before.marks().unwrap();
        assert_eq!(marks.points.len(), MARKED_FRAMES);
        assert_eq!(marks.points.last().unwrap().1, before.written);
        assert_eq!(marks.tail.len(), CHECKED_BYTES);

        let mut big = channel(0);
        let last = big.record(
            StreamTag::Tty,
            Bytes::from(vec![b'x'; crate::session::MAX_OUTPUT_CHUNK_BYTES * 2 + 1]),
        );
        assert_eq!(last, 3);
    }
}
