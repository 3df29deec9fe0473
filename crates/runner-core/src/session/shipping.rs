//! Output marks sent ahead to the other replicas, so that a client resumes
//! exactly even after its session's owner was killed.
//!
//! A hand-over (SIGTERM) writes the leaving owner's marks on the session's
//! objects ([`super::carry`]). A replica that is killed writes nothing, so
//! with several replicas each frame's mark — the byte of the workload's
//! output at which it ends — is sent to every peer *before* the frame is
//! published to subscribers: a frame a client has read is one whose mark
//! sits at least in the kernel's buffer of the connection to each peer, and
//! that survives the process. The replica that adopts the session after a
//! crash carries the marks it received, as it would a hand-over's.
//!
//! This module holds the two ends the core sees: [`OutputShipper`], where
//! a session hands its frames' marks (and the publishing of their seqs) to
//! the replica's sender, and [`PeerMarks`], what this replica received from
//! its peers. The stream between replicas is `http::peer_marks`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, watch};

use super::carry::CHECKED_BYTES;
use crate::backend_session::OutputMarks;

/// One recorded piece of an app's output, to be published once its marks
/// are on their way to the peers.
pub struct Shipment {
    pub session: Arc<str>,
    pub app: Arc<str>,
    /// `(seq, end)` of each frame recorded; empty when the app's byte count
    /// is not exact (nothing to mark, only to publish in order).
    pub points: Vec<(u64, u64)>,
    /// The bytes just before the last point's end.
    pub tail: Vec<u8>,
    /// The app's newest published seq, and what to publish.
    pub seq: Arc<watch::Sender<u64>>,
    pub publish: u64,
}

impl Shipment {
    /// Makes its frames visible to subscribers.
    pub fn publish(&self) {
        self.seq.send_replace(self.publish);
    }
}

/// Where sessions hand their output's marks to this replica's sender.
#[derive(Clone)]
pub struct OutputShipper(mpsc::UnboundedSender<Shipment>);

impl OutputShipper {
    /// A shipper and the receiving end its sender task reads.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Shipment>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self(tx), rx)
    }

    /// The shipper of session `id`.
    pub(crate) fn for_session(&self, id: &str) -> SessionShipper {
        SessionShipper {
            tx: self.0.clone(),
            session: Arc::from(id),
        }
    }
}

/// One session's way to the shipper, its id shared by every shipment.
pub(crate) struct SessionShipper {
    tx: mpsc::UnboundedSender<Shipment>,
    pub(crate) session: Arc<str>,
}

impl SessionShipper {
    /// Hands `shipment` over; published at once when the sender is gone.
    pub(crate) fn ship(&self, shipment: Shipment) {
        if let Err(mpsc::error::SendError(shipment)) = self.tx.send(shipment) {
            shipment.publish();
        }
    }
}

/// Marks kept per app: a client that was reading along is at most this
/// many frames behind its session's newest (about a second of a stream of
/// a thousand frames a second). A hand-over marks fewer: it happens while
/// clients are connected and caught up.
pub const PEER_MARKED_FRAMES: usize = 1024;
/// Sessions whose marks are kept, at most: past it the one updated longest
/// ago is forgotten. With the per-app bound, at most 16 MiB per app a
/// session runs (16 bytes a mark), reached only by sessions that all
/// stream.
const KEPT_SESSIONS: usize = 1024;

#[derive(Default)]
struct Ring {
    points: VecDeque<(u64, u64)>,
    tail: Vec<u8>,
}

#[derive(Default)]
struct Kept {
    apps: HashMap<String, Ring>,
    /// When it was last updated, in updates received.
    touched: u64,
}

/// The marks this replica received from its peers, per session and app:
/// the newest [`PEER_MARKED_FRAMES`] of each.
#[derive(Default)]
pub struct PeerMarks {
    sessions: Mutex<(HashMap<String, Kept>, u64)>,
}

impl PeerMarks {
    /// Takes the marks of `points` (ascending) for `app` of `session`, and
    /// the bytes before the last one. Points that start below the newest
    /// kept one begin a new count (an owner that rebuilt the output from
    /// its first byte): the older ones are dropped.
    pub fn record(&self, session: &str, app: &str, points: &[(u64, u64)], tail: &[u8]) {
        let Some(&(_, first_end)) = points.first() else {
            return;
        };
        let mut guard = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        let (sessions, clock) = &mut *guard;
        *clock += 1;
        if !sessions.contains_key(session) && sessions.len() >= KEPT_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, kept)| kept.touched)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                sessions.remove(&oldest);
            }
        }
        let kept = sessions.entry(session.to_owned()).or_default();
        kept.touched = *clock;
        let ring = kept.apps.entry(app.to_owned()).or_default();
        if ring
            .points
            .back()
            .is_some_and(|&(seq, end)| first_end <= end || points[0].0 <= seq)
        {
            ring.points.clear();
        }
        ring.points.extend(points.iter().copied());
        while ring.points.len() > PEER_MARKED_FRAMES {
            ring.points.pop_front();
        }
        let keep = tail.len().min(CHECKED_BYTES);
        ring.tail = tail[tail.len() - keep..].to_vec();
    }

    /// Forgets `session` (it ended).
    pub fn forget(&self, session: &str) {
        let mut guard = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        guard.0.remove(session);
    }

    /// The marks kept for `session`, one per app.
    pub fn marks_of(&self, session: &str) -> Vec<OutputMarks> {
        let guard = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(kept) = guard.0.get(session) else {
            return Vec::new();
        };
        kept.apps
            .iter()
            .filter(|(_, ring)| !ring.points.is_empty())
            .map(|(app, ring)| OutputMarks {
                app: app.clone(),
                points: ring.points.iter().copied().collect(),
                tail: ring.tail.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_marks_of_each_app_are_kept() {
        let marks = PeerMarks::default();
        let points: Vec<(u64, u64)> = (1..=1100).map(|n| (n, n * 10)).collect();
        marks.record("s1", "main", &points[..600], b"x");
        marks.record("s1", "main", &points[600..], b"tail");
        let kept = marks.marks_of("s1");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].points.len(), PEER_MARKED_FRAMES);
        assert_eq!(kept[0].points.first(), Some(&(77, 770)));
        assert_eq!(kept[0].points.last(), Some(&(1100, 11000)));
        assert_eq!(kept[0].tail, b"tail");
        assert!(marks.marks_of("s2").is_empty());
        marks.forget("s1");
        assert!(marks.marks_of("s1").is_empty());
    }

    #[test]
    fn an_owner_that_rebuilt_the_output_starts_the_marks_again() {
        let marks = PeerMarks::default();
        marks.record("s1", "main", &[(1, 100), (2, 200)], b"a");
        // The next owner's frames: later seqs, counted from the first byte.
        marks.record("s1", "main", &[(1_000_001, 50)], b"b");
        assert_eq!(marks.marks_of("s1")[0].points, vec![(1_000_001, 50)]);
    }

    #[test]
    fn only_the_checked_bytes_of_a_tail_are_kept() {
        let marks = PeerMarks::default();
        let tail = vec![7_u8; 200];
        marks.record("s1", "main", &[(1, 200)], &tail);
        assert_eq!(marks.marks_of("s1")[0].tail.len(), CHECKED_BYTES);
    }
}
