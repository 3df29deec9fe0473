//! What a watch session keeps beside its record: its workload (absent while
//! starting or suspended), its launch description (what resume and
//! `PUT /apps` start again), its reload budget and the supervisor's
//! bookkeeping.

use std::sync::Arc;

use runner_api::watch::AppSpec;
use tokio::time::Instant;

use crate::backend_session::WatchWorkload;
use crate::launch::WatchSpec;
use crate::watch::ReloadBudget;

pub struct WatchState {
    pub(crate) workload: Option<Arc<dyn WatchWorkload>>,
    pub(crate) spec: WatchSpec,
    /// Since when it is suspended, as a time and as the ISO text eviction
    /// compares.
    pub(crate) suspended_at: Option<(Instant, String)>,
    pub(crate) checkpointed_at: Option<Instant>,
    /// Checkpoints (and the suspends that need one) that failed in a row,
    /// and when the next may be tried: a failure is retried after a
    /// checkpoint period, doubling, never at every supervisor round.
    pub(crate) checkpoint_failures: u32,
    pub(crate) checkpoint_retry_at: Option<Instant>,
    /// The failure the session's clients were last told of.
    pub(crate) checkpoint_failure_told: Option<String>,
    /// Its clients were told it stays running, idle, because the runner
    /// keeps as many suspended sessions as it may.
    pub(crate) kept_running_told: bool,
    /// When the running workload started (its lifetime limit counts from it).
    pub(crate) started_at: Option<Instant>,
    /// A checkpoint, suspend, resume or app change is under way: the
    /// supervisor leaves the session alone.
    pub(crate) busy: bool,
    pub(crate) budget: Arc<ReloadBudget>,
    /// Held through an app-set change, a resume, a suspend or a checkpoint:
    /// one at a time per session. Concurrent `PUT /apps` calls each started
    /// a new set of kernels, and the channels they left listed none.
    pub(crate) lifecycle: Arc<tokio::sync::Mutex<()>>,
}

impl WatchState {
    pub(crate) fn new(spec: WatchSpec) -> Self {
        Self {
            workload: None,
            spec,
            suspended_at: None,
            checkpointed_at: None,
            checkpoint_failures: 0,
            checkpoint_retry_at: None,
            checkpoint_failure_told: None,
            kept_running_told: false,
            started_at: None,
            busy: false,
            budget: Arc::new(ReloadBudget::default()),
            lifecycle: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    pub fn apps(&self) -> &[AppSpec] {
        &self.spec.apps
    }
}
