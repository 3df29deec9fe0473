//! One thread, alive as long as the runner, that starts every session and
//! check process.
//!
//! `bwrap --die-with-parent` ends the sandbox when its parent dies — and
//! Linux means the parent *thread*: a sandbox started from a thread of
//! Tokio's blocking pool (which retires idle threads after seconds) would be
//! killed with that thread. Starting them all here ties each sandbox to the
//! runner process itself.

use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

#[derive(Debug, thiserror::Error)]
pub enum SpawnerError {
    #[error("could not start the thread that starts session processes: {0}")]
    Thread(String),
    #[error("the thread that starts session processes is gone")]
    Gone,
}

/// The job queue needs no bound of its own: every job is a caller awaiting
/// its reply ([`on_spawner_thread`]), so it holds at most one job per start
/// the registry admitted.
fn spawner() -> Result<&'static Sender<Job>, SpawnerError> {
    static SPAWNER: OnceLock<Result<Sender<Job>, String>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (jobs, queue) = channel::<Job>();
            std::thread::Builder::new()
                .name("spawner".to_owned())
                .spawn(move || {
                    for job in queue {
                        // A job that panicked must not take the thread, and
                        // every later start, with it; its caller sees the
                        // reply channel closed.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map(|_| jobs)
                .map_err(|err| err.to_string())
        })
        .as_ref()
        .map_err(|err| SpawnerError::Thread(err.clone()))
}

/// Runs `start` on the spawner thread and returns what it returned.
pub async fn on_spawner_thread<T: Send + 'static>(
    start: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SpawnerError> {
    let (done, result) = oneshot::channel();
    spawner()?
        .send(Box::new(move || {
            let _ = done.send(start());
        }))
        .map_err(|_| SpawnerError::Gone)?;
    result.await.map_err(|_| SpawnerError::Gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_one_long_lived_thread() {
        let first = on_spawner_thread(|| std::thread::current().id())
            .await
            .unwrap();
        let second = on_spawner_thread(|| std::thread::current().id())
            .await
            .unwrap();
        assert_eq!(first, second);
        assert_ne!(first, std::thread::current().id());
        let name = on_spawner_thread(|| std::thread::current().name().map(str::to_owned))
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("spawner"));
    }
}
