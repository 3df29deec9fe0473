//! The mark stream between replicas (`session::shipping` says why): each
//! replica keeps one upgraded connection to every live peer
//! (`GET /internal/replica/marks`, `Upgrade: telo-marks`, the peer token)
//! and writes its sessions' output marks on it, a JSON line per app and
//! batch, before it publishes the frames they mark. Each replica reads its
//! peers' streams into its [`PeerMarks`].
//!
//! A peer that cannot take a batch within [`WRITE_BOUND`] is dropped from
//! the stream (and dialled again later): output never waits on a slow peer
//! for longer, and that peer only lacks some marks, so a client resuming
//! there after a crash may be told of a gap.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use http::StatusCode;
use http::header::{self, HeaderName, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::mpsc;
use tracing::debug;

use crate::edge::RequestBody;
use crate::replicas::{PEER_TOKEN_HEADER, Replicas};
use crate::session::shipping::{PeerMarks, Shipment};
use crate::tasks::OwnedTasks;

/// Where a peer opens its mark stream to this replica.
pub(crate) const MARKS_PATH: &str = "/internal/replica/marks";
const PROTOCOL: &str = "telo-marks";
/// How long one batch may take to reach a peer's socket.
const WRITE_BOUND: Duration = Duration::from_millis(250);
/// How long after a failed dial a peer is dialled again.
const REDIAL_AFTER: Duration = Duration::from_secs(1);
/// The longest line a stream may carry.
const LINE_LIMIT: usize = 1 << 20;
/// Shipments taken into one batch, at most.
const BATCH: usize = 1024;
/// How often the peers are looked at when no output flows.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);

/// One line of the stream: the marks of one app's newest frames. Written
/// borrowing the shipment's fields, read owning them.
#[derive(Serialize, Deserialize)]
struct Line<'a> {
    /// The session.
    #[serde(borrow)]
    s: Cow<'a, str>,
    /// The app.
    #[serde(borrow)]
    a: Cow<'a, str>,
    /// `(seq, end)` of each frame, ascending.
    p: Cow<'a, [(u64, u64)]>,
    /// The bytes before the last end, hex.
    t: String,
}

type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// The mark streams this replica writes to, one per live peer.
struct Streams {
    open: HashMap<String, Upgraded>,
    /// Peers being dialled (`None`), or when a failed one is dialled again.
    dialling: HashMap<String, Option<tokio::time::Instant>>,
    /// The dials under way, owned here.
    dials: tokio::task::JoinSet<(String, Option<Upgraded>)>,
}

impl Streams {
    /// Drops streams of peers that are gone and dials live peers there is
    /// no stream to yet.
    fn reconcile(&mut self, replicas: &Arc<dyn Replicas>, client: &PeerClient) {
        let live = replicas.peers();
        self.open
            .retain(|id, _| live.iter().any(|peer| peer.id == *id));
        let now = tokio::time::Instant::now();
        for peer in live {
            if self.open.contains_key(&peer.id) {
                continue;
            }
            let due = match self.dialling.get(&peer.id) {
                None => true,
                Some(Some(again)) => *again <= now,
                Some(None) => false,
            };
            if !due {
                continue;
            }
            self.dialling.insert(peer.id.clone(), None);
            let client = client.clone();
            let token = replicas.peer_token().as_str().to_owned();
            self.dials.spawn(async move {
                let stream = dial(&client, &peer.url, &token).await;
                (peer.id, stream)
            });
        }
    }

    fn dialled(&mut self, peer: String, stream: Option<Upgraded>) {
        match stream {
            Some(stream) => {
                self.dialling.remove(&peer);
                self.open.insert(peer, stream);
            }
            None => {
                self.dialling
                    .insert(peer, Some(tokio::time::Instant::now() + REDIAL_AFTER));
            }
        }
    }

    /// Writes the marks of `batch` to every open stream; one that does not
    /// take them within [`WRITE_BOUND`] is dropped (and dialled again
    /// later). Nothing is encoded while no stream is open.
    async fn write(&mut self, batch: &[Shipment]) {
        if self.open.is_empty() {
            return;
        }
        let lines = encode(batch);
        if lines.is_empty() {
            return;
        }
        let lines = &lines[..];
        let writes = self.open.iter_mut().map(|(id, stream)| async move {
            let written = tokio::time::timeout(WRITE_BOUND, stream.write_all(lines)).await;
            (id.clone(), matches!(written, Ok(Ok(()))))
        });
        let failed: Vec<String> = join_all(writes)
            .await
            .into_iter()
            .filter(|(_, ok)| !ok)
            .map(|(id, _)| id)
            .collect();
        for id in failed {
            debug!(peer = %id, "a peer's mark stream fell behind; dropped");
            self.open.remove(&id);
            self.dialling
                .insert(id, Some(tokio::time::Instant::now() + REDIAL_AFTER));
        }
    }
}

type PeerClient = Client<HttpConnector, RequestBody<Body>>;

/// The sender: takes shipments, writes their marks to every peer's
/// stream, then publishes them. Runs until `shipments` closes.
pub(crate) async fn ship(
    mut shipments: mpsc::UnboundedReceiver<Shipment>,
    replicas: Arc<dyn Replicas>,
    client: PeerClient,
) {
    let mut streams = Streams {
        open: HashMap::new(),
        dialling: HashMap::new(),
        dials: tokio::task::JoinSet::new(),
    };
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            received = shipments.recv_many(&mut batch, BATCH) => {
                if received == 0 {
                    return;
                }
            }
            Some(Ok((peer, stream))) = streams.dials.join_next(), if !streams.dials.is_empty() => {
                streams.dialled(peer, stream);
                continue;
            }
            _ = reconcile.tick() => {
                streams.reconcile(&replicas, &client);
                continue;
            }
        }
        streams.write(&batch).await;
        for shipment in batch.drain(..) {
            shipment.publish();
        }
    }
}

/// The marks of `batch`, one line per shipment that has any.
fn encode(batch: &[Shipment]) -> Vec<u8> {
    let mut out = Vec::new();
    for shipment in batch {
        if shipment.points.is_empty() {
            continue;
        }
        let line = Line {
            s: Cow::Borrowed(&shipment.session),
            a: Cow::Borrowed(&shipment.app),
            p: Cow::Borrowed(&shipment.points),
            t: hex::encode(&shipment.tail),
        };
        if serde_json::to_writer(&mut out, &line).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// Opens a mark stream to the peer at `url`.
async fn dial(client: &PeerClient, url: &str, token: &str) -> Option<Upgraded> {
    let uri: http::Uri = format!("{}{MARKS_PATH}", url.trim_end_matches('/'))
        .parse()
        .ok()?;
    let mut request = http::Request::get(uri)
        .body(RequestBody::new(Body::empty()).0)
        .ok()?;
    let headers = request.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(PROTOCOL));
    headers.insert(
        HeaderName::from_static(PEER_TOKEN_HEADER),
        HeaderValue::from_str(token).ok()?,
    );
    let response = tokio::time::timeout(REDIAL_AFTER * 2, client.request(request))
        .await
        .ok()?
        .ok()?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        debug!(status = %response.status(), "a peer refused the mark stream");
        return None;
    }
    let upgraded = hyper::upgrade::on(response).await.ok()?;
    Some(TokioIo::new(upgraded))
}

/// A peer's `GET` of [`MARKS_PATH`] (the caller checked the peer token):
/// upgraded, its lines read into `marks` until it closes.
pub(crate) fn accept(mut request: Request, marks: Arc<PeerMarks>, tasks: &OwnedTasks) -> Response {
    let asks = request
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|protocol| {
            protocol
                .as_bytes()
                .eq_ignore_ascii_case(PROTOCOL.as_bytes())
        });
    if !asks {
        return StatusCode::BAD_REQUEST.into_response();
    }
    let upgrade = hyper::upgrade::on(&mut request);
    tasks.spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        debug!("a peer opened its mark stream");
        read_marks(TokioIo::new(upgraded), &marks).await;
        debug!("a peer's mark stream ended");
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(PROTOCOL));
    response
}

/// Reads a mark stream's lines into `marks` until it ends (or sends a line
/// longer than [`LINE_LIMIT`]).
async fn read_marks(stream: impl tokio::io::AsyncRead + Unpin, marks: &PeerMarks) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut reader)
            .take(LINE_LIMIT as u64)
            .read_until(b'\n', &mut line)
            .await;
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) if line.last() != Some(&b'\n') => return,
            Ok(_) => {}
        }
        let Ok(parsed) = serde_json::from_slice::<Line>(&line) else {
            continue;
        };
        let tail = hex::decode(&parsed.t).unwrap_or_default();
        marks.record(&parsed.s, &parsed.a, &parsed.p, &tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipment(points: Vec<(u64, u64)>) -> Shipment {
        Shipment {
            session: Arc::from("s1"),
            app: Arc::from("main"),
            points,
            tail: b"ab\n".to_vec(),
            seq: Arc::new(tokio::sync::watch::Sender::new(0)),
            publish: 2,
        }
    }

    #[tokio::test]
    async fn lines_written_are_the_marks_read() {
        let lines = encode(&[shipment(vec![(1, 10), (2, 25)]), shipment(Vec::new())]);
        let marks = PeerMarks::default();
        read_marks(&lines[..], &marks).await;
        let kept = marks.marks_of("s1");
        assert_eq!(kept[0].points, vec![(1, 10), (2, 25)]);
        assert_eq!(kept[0].tail, b"ab\n");
    }

    #[tokio::test]
    async fn a_line_cut_short_is_not_taken() {
        let mut lines = encode(&[shipment(vec![(1, 10)])]);
        lines.extend_from_slice(b"{\"s\":\"s1\",\"a\":\"main\",\"p\":[[2,");
        let marks = PeerMarks::default();
        read_marks(&lines[..], &marks).await;
        assert_eq!(marks.marks_of("s1")[0].points, vec![(1, 10)]);
    }
}
