//! The owner of a backend's background tasks: the shared informers, and each
//! session's supervision, probes and relays. Every task spawned here stops
//! when the owner shuts down, and [`OwnedTasks::shutdown`] waits for them,
//! so no task outlives the backend that started it.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tracing::warn;

#[derive(Clone, Default)]
pub struct OwnedTasks {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl OwnedTasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `work` until it ends or the owner shuts down, whichever is first.
    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// Takes a task that stops on [`Self::stopping`] by itself (a shared
    /// watch), so that shutdown waits for it too.
    pub fn adopt(&self, task: JoinHandle<()>) {
        self.tracker.spawn(async move {
            let _ = task.await;
        });
    }

    /// Fires when the owner shuts down.
    pub fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Stops every task without waiting (a backend dropped without shutdown).
    pub fn stop(&self) {
        self.stop.cancel();
        self.tracker.close();
    }

    /// Stops every task and waits for them, at most `bound`; a task still
    /// running after that is named in a warning and left to the runtime.
    pub async fn shutdown(&self, bound: Duration) {
        self.stop();
        if tokio::time::timeout(bound, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                running = self.tracker.len(),
                "background tasks still running after shutdown"
            );
        }
    }
}

/// Runs `work` on `runtime` and waits for it from wherever this is awaited
/// (a connection thread): what `work` spawns belongs to `runtime`. The
/// work is aborted if this future is dropped first, as it would be were it
/// polled here; a panic in it is resumed here. `None` when `runtime` shut
/// down under it.
pub async fn run_on<T: Send + 'static>(
    runtime: &Handle,
    work: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    match AbortOnDropHandle::new(runtime.spawn(work)).await {
        Ok(done) => Some(done),
        Err(err) => match err.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_run_on_a_runtime_answers_and_is_aborted_with_its_waiter() {
        let runtime = Handle::current();
        assert_eq!(run_on(&runtime, async { 7 }).await, Some(7));
        let (mut held, dropped) = tokio::sync::oneshot::channel::<()>();
        let waiting = run_on(&runtime, async move {
            let _dropped = dropped;
            std::future::pending::<()>().await;
        });
        // The waiter gives up: the work is dropped, not left running, so
        // its receiver goes with it.
        assert!(
            tokio::time::timeout(Duration::from_millis(1), waiting)
                .await
                .is_err()
        );
        tokio::time::timeout(Duration::from_secs(10), held.closed())
            .await
            .expect("the aborted work was dropped");
    }

    #[tokio::test]
    async fn shutdown_stops_and_joins_every_task() {
        let tasks = OwnedTasks::new();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn(async move {
            std::future::pending::<()>().await;
            drop(done_tx);
        });
        let stopping = tasks.stopping();
        tasks.adopt(tokio::spawn(async move { stopping.cancelled().await }));
        tasks.shutdown(Duration::from_secs(10)).await;
        assert!(tasks.tracker.is_empty());
        // The spawned work was dropped, not left running.
        assert!(done_rx.await.is_err());
    }
}
