//! Watch streams: `{"type":…,"object":…}` lines replayed from the watch
//! cache from a resourceVersion, selector-aware (an object that stops
//! matching is sent as `DELETED`), with bookmarks, `sendInitialEvents`,
//! `410 Expired` for a compacted resourceVersion, and closure on timeout,
//! fault injection or shutdown.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream_shim::ReceiverStream;

use super::ApiContext;
use crate::errors::ApiError;
use crate::kinds::ResourceId;
use crate::meta;
use crate::storage::selectors::{FieldSelector, LabelSelector};
use crate::storage::store::{EventKind, ObjRef};

/// How often a watch that asked for bookmarks gets one.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(15);
/// A watch without `timeoutSeconds` ends after this long, like the
/// apiserver's `--min-request-timeout` window.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Buffered lines per watcher before the producer waits for the client.
const WATCH_CHANNEL_LINES: usize = 256;

pub struct WatchRequest {
    pub res: ResourceId,
    pub version: String,
    pub namespace: Option<String>,
    pub resource_version: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    pub table: bool,
    pub include_object: String,
}

/// Encodes objects for one watch: version conversion and Table rendering.
struct Encoder {
    res: ResourceId,
    version: String,
    table: bool,
    include_object: String,
}

impl Encoder {
    fn object_bytes(&self, obj: &ObjRef) -> Bytes {
        let info = self.res.info();
        if self.table {
            let t = super::table::table(
                info,
                std::iter::once(&obj.value),
                obj.rv,
                &self.include_object,
            );
            return Bytes::from(t.to_string());
        }
        if self.version != info.storage_version() {
            let mut v = obj.value.clone();
            if let Some(o) = v.as_object_mut() {
                o.insert("apiVersion".into(), json!(info.api_version(&self.version)));
            }
            return Bytes::from(v.to_string());
        }
        obj.json.clone()
    }

    fn line(&self, kind: &str, object: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(object.len() + 32);
        b.put_slice(b"{\"type\":\"");
        b.put_slice(kind.as_bytes());
        b.put_slice(b"\",\"object\":");
        b.put_slice(object);
        b.put_slice(b"}\n");
        b.freeze()
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let info = self.res.info();
        let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": info.kind, "apiVersion": info.api_version(&self.version), "metadata": metadata});
        self.line("BOOKMARK", obj.to_string().as_bytes())
    }
}

fn matches(req: &WatchRequest, obj: &serde_json::Value) -> bool {
    if let Some(ns) = &req.namespace
        && meta::namespace(obj) != ns
    {
        return false;
    }
    req.labels.matches(obj) && req.fields.matches(obj)
}

/// Starts a watch and returns the receiving half of its line stream.
pub fn start(ctx: Arc<ApiContext>, req: WatchRequest) -> Result<ReceiverStream, ApiError> {
    let start_rv = match req.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v:?}")))?,
        ),
    };
    if req.send_initial_events && !req.bookmarks {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[crate::errors::FieldError::forbidden(
                "allowWatchBookmarks",
                "allowWatchBookmarks required when sendInitialEvents is true",
            )],
        ));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(WATCH_CHANNEL_LINES);
    let guard = ctx.stats.open_watch(req.res.info().plural);
    tokio::spawn(async move {
        let _guard = guard;
        run(ctx, req, start_rv, tx).await;
    });
    Ok(ReceiverStream::new(rx))
}

async fn run(
    ctx: Arc<ApiContext>,
    req: WatchRequest,
    start_rv: Option<u64>,
    tx: mpsc::Sender<Bytes>,
) {
    let enc = Encoder {
        res: req.res,
        version: req.version.clone(),
        table: req.table,
        include_object: req.include_object.clone(),
    };
    let mut changes = ctx.store.subscribe(req.res);
    let mut watch_epoch = ctx.faults.watch_epoch();
    let shutdown = ctx.shutdown.clone();
    let mut cursor = match start_rv {
        Some(rv) if !req.send_initial_events => rv,
        _ => {
            // Synthetic ADDED events for the current state, then changes.
            let (objects, rv) = ctx.store.snapshot(req.res, req.namespace.as_deref());
            for o in objects.iter().filter(|o| matches(&req, &o.value)) {
                if tx
                    .send(enc.line("ADDED", &enc.object_bytes(o)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if req.send_initial_events && tx.send(enc.bookmark(rv, true)).await.is_err() {
                return;
            }
            rv
        }
    };
    let deadline = tokio::time::sleep(req.timeout.unwrap_or(DEFAULT_WATCH_TIMEOUT));
    tokio::pin!(deadline);
    let mut bookmark_timer = tokio::time::interval(ctx.bookmark_interval);
    bookmark_timer.tick().await;
    let mut safe_rv = cursor;
    loop {
        match ctx.store.events_since_with_rv(req.res, cursor) {
            Err(too_old) => {
                let err = ApiError::expired(format!(
                    "too old resource version: {} ({})",
                    too_old.requested, too_old.oldest
                ));
                let _ = tx
                    .send(enc.line("ERROR", err.to_status().to_string().as_bytes()))
                    .await;
                return;
            }
            Ok((events, now_rv)) => {
                for ev in events {
                    cursor = ev.rv;
                    let cur = matches(&req, &ev.obj.value);
                    let prev = ev.prev.as_ref().map(|p| matches(&req, &p.value));
                    let line = match (ev.kind, prev, cur) {
                        (EventKind::Added, _, true) => {
                            Some(enc.line("ADDED", &enc.object_bytes(&ev.obj)))
                        }
                        (EventKind::Modified, Some(true), true) => {
                            Some(enc.line("MODIFIED", &enc.object_bytes(&ev.obj)))
                        }
                        (EventKind::Modified, Some(false) | None, true) => {
                            Some(enc.line("ADDED", &enc.object_bytes(&ev.obj)))
                        }
                        (EventKind::Modified, Some(true), false) => {
                            // The previous state, at this event's version.
                            let prev = ev
                                .prev
                                .as_ref()
                                .map(|p| p.value.clone())
                                .unwrap_or(Value::Null);
                            let mut v = prev;
                            meta::metadata_mut(&mut v)
                                .insert("resourceVersion".into(), json!(ev.rv.to_string()));
                            let obj = Arc::new(crate::storage::store::Obj {
                                json: Bytes::from(v.to_string()),
                                value: v,
                                rv: ev.rv,
                            });
                            Some(enc.line("DELETED", &enc.object_bytes(&obj)))
                        }
                        (EventKind::Deleted, _, true) => {
                            Some(enc.line("DELETED", &enc.object_bytes(&ev.obj)))
                        }
                        _ => None,
                    };
                    if let Some(line) = line
                        && tx.send(line).await.is_err()
                    {
                        return;
                    }
                }
                safe_rv = safe_rv.max(now_rv).max(cursor);
            }
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() { return; }
            }
            _ = bookmark_timer.tick(), if req.bookmarks => {
                if tx.send(enc.bookmark(safe_rv, false)).await.is_err() {
                    return;
                }
            }
            _ = watch_epoch.changed() => return,
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return,
            _ = &mut deadline => return,
        }
    }
}

/// A minimal `Stream` over an mpsc receiver (keeps the dependency list short).
pub mod tokio_stream_shim {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use tokio::sync::mpsc;

    pub struct ReceiverStream {
        rx: mpsc::Receiver<Bytes>,
    }

    impl ReceiverStream {
        pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
            Self { rx }
        }
    }

    impl futures_util::Stream for ReceiverStream {
        type Item = Result<Bytes, std::io::Error>;

        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.rx.poll_recv(cx).map(|o| o.map(Ok))
        }
    }
}
