//! The namespace controller: a namespace being deleted has its content
//! deleted, then goes itself.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::kinds;
use crate::meta;
use crate::storage::registry::{DeleteOptions, Registry};

/// How often a terminating namespace is re-checked for leftover content.
const RECHECK: Duration = Duration::from_millis(200);

pub async fn run(registry: Arc<Registry>, shutdown: CancellationToken) {
    let store = registry.store.clone();
    let namespaces = kinds::id("namespaces");
    let mut changes = store.subscribe(namespaces);
    loop {
        let (all, _) = store.snapshot(namespaces, None);
        let terminating: Vec<String> = all
            .iter()
            .filter(|n| meta::deletion_timestamp(&n.value).is_some())
            .map(|n| n.name().to_string())
            .collect();
        for ns in &terminating {
            let mut left = 0usize;
            for res in kinds::all() {
                if !res.info().namespaced {
                    continue;
                }
                let (objs, _) = store.snapshot(res, Some(ns));
                left += objs.len();
                for o in objs {
                    if meta::deletion_timestamp(&o.value).is_none() {
                        let _ = registry.delete(res, ns, o.name(), &DeleteOptions::default());
                    }
                }
            }
            if left == 0
                && let Some(n) = store.get(namespaces, "", ns)
            {
                registry.remove_now(namespaces, "", ns, n.uid());
            }
        }
        let recheck = async {
            if terminating.is_empty() {
                std::future::pending::<()>().await
            } else {
                tokio::time::sleep(RECHECK).await
            }
        };
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = recheck => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
