//! The loop every informer ([`crate::cluster::informer`]: pods, events,
//! routing objects) runs: apply each event; on an error, count it, tell the
//! owner, wait (doubling while it keeps failing) and start over with a fresh
//! list.
//!
//! A watch that merely resumes after an error says nothing until an object
//! changes, so on a quiet cluster the error — and `/readyz` — would stand
//! long after the apiserver is back; a fresh list ends with `InitDone`, which
//! tells the owner the informer is sound again.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use kube::runtime::watcher::{Error, Event};
use runner_core::metrics::Counter;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The wait before re-listing after a failed watch, doubling while it keeps
/// failing.
pub const RELIST_BACKOFF_MIN: Duration = Duration::from_millis(500);
pub const RELIST_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Runs until `stop` fires. `start` opens a fresh watch (list, then watch).
pub async fn follow<K, S>(
    what: &'static str,
    start: S,
    restarts: Counter,
    stop: CancellationToken,
    mut on_event: impl FnMut(Event<K>),
    mut on_error: impl FnMut(&Error),
) where
    S: Fn() -> BoxStream<'static, Result<Event<K>, Error>>,
{
    let mut events = start();
    let mut backoff = RELIST_BACKOFF_MIN;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(event)) => {
                    backoff = RELIST_BACKOFF_MIN;
                    on_event(event);
                }
                Some(Err(err)) => {
                    restarts.inc();
                    on_error(&err);
                    warn!(watch = what, error = %err, "watch interrupted; re-listing");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RELIST_BACKOFF_MAX);
                    events = start();
                }
                None => return,
            }
        }
    }
}
