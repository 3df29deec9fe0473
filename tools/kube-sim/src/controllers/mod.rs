//! Simulated controllers: garbage collection, namespace deletion, quota
//! accounting (its admission and usage live in `storage::quota`), and the
//! Ingress and Gateway API controllers, and the Deployment and ReplicaSet
//! controllers.

pub mod gateway;
pub mod gc;
pub mod ingress;
pub mod namespace;
pub mod workloads;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// An on/off switch a controller loop watches.
#[derive(Default)]
pub struct Switch {
    on: AtomicBool,
    changed: Notify,
}

impl Switch {
    pub fn new(on: bool) -> Arc<Self> {
        Arc::new(Self {
            on: AtomicBool::new(on),
            changed: Notify::new(),
        })
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    pub async fn changed(&self) {
        self.changed.notified().await
    }
}
