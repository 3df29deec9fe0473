//! The registry as one replica of several: it takes over the sessions a
//! replica left (its Lease lapsed, or it handed them over on shutdown) the
//! way a restarted runner adopts its predecessor's, and lets go of all of
//! its own when it may no longer act on them (it could not renew its
//! Lease in time), so that no two replicas ever drive one session.

use std::sync::Arc;

use tracing::{info, warn};

use super::{SessionRegistry, lock};
use crate::replicas::Replicas;

impl SessionRegistry {
    /// Adopts what the backend offers beyond what this registry holds:
    /// the sessions this replica now owns. Returns how many.
    pub async fn take_over(&self) -> usize {
        let _adopting = self.inner.adopting.lock().await;
        self.adopt_left_sessions().await
    }

    /// Lets go of every session: each is left as it runs for the replica
    /// that takes it over, its open streams end (a terminal socket with
    /// 1001, an event stream by ending) so clients reconnect, and it leaves
    /// the registry. Nothing of it is stopped or deleted. Returns how many.
    pub async fn let_go(&self) -> usize {
        let _adopting = self.inner.adopting.lock().await;
        let sessions: Vec<_> = lock(&self.inner.sessions)
            .drain()
            .map(|(_, session)| session)
            .collect();
        for session in &sessions {
            let handle = {
                let mut state = lock(&session.state);
                state.handed_over = true;
                state.handle.clone()
            };
            if let Some(handle) = handle {
                handle.detach();
            }
            session.moved.cancel();
            session.ended.cancel();
        }
        sessions.len()
    }

    /// Follows `replicas` until shutdown: takes sessions over when a peer's
    /// Lease lapses, lets go of all when this replica may not act, and
    /// adopts its own again once it may.
    pub(super) fn follow_replicas(&self, replicas: Arc<dyn Replicas>) {
        let Some(mut changes) = replicas.changes() else {
            return;
        };
        let registry = self.clone();
        let shutdown = self.inner.shutdown.clone();
        self.inner.tasks.spawn(async move {
            let mut acting = true;
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = shutdown.cancelled() => return,
                }
                changes.mark_unchanged();
                if replicas.may_act() {
                    let adopted = registry.take_over().await;
                    if adopted > 0 {
                        info!(
                            sessions = adopted,
                            replica = replicas.replica_id(),
                            "took sessions over"
                        );
                        registry.inner.metrics.count_takeovers(adopted);
                    }
                    acting = true;
                } else if acting {
                    let left = registry.let_go().await;
                    warn!(
                        sessions = left,
                        replica = replicas.replica_id(),
                        "let go of every session until the Lease is renewed"
                    );
                    acting = false;
                }
            }
        });
    }
}
