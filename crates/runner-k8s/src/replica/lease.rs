//! A replica's own Lease: created at boot, renewed every third of its
//! duration with writes conditional on its resourceVersion, deleted when
//! the replica hands its sessions over on shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, PostParams};
use runner_core::sync::lock;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::KubeReplicas;
use crate::cluster::api_error::{is_conflict, is_not_found};
use crate::pod::labels::MANAGED_BY_LABEL;

/// A replica's Lease is `telo-runner-replica-<replica id>`.
pub(crate) const LEASE_PREFIX: &str = "telo-runner-replica-";
/// Marks the Leases that are replicas' (not the refiller election's).
pub(crate) const ROLE_LABEL: &str = "telo.run/role";
pub(crate) const ROLE_REPLICA: &str = "replica";
/// Where a replica's Lease says how peers reach it.
pub(crate) const URL_ANNOTATION: &str = "telo.run/replica-url";

fn lease_name(replicas: &KubeReplicas) -> String {
    format!("{LEASE_PREFIX}{}", replicas.id)
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn lease_of(replicas: &KubeReplicas, resource_version: Option<String>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(replicas)),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), replicas.managed_by.clone()),
                (super::ROLE_LABEL.to_owned(), ROLE_REPLICA.to_owned()),
            ])),
            annotations: Some(BTreeMap::from([(
                URL_ANNOTATION.to_owned(),
                replicas.url.clone(),
            )])),
            resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(replicas.id.clone()),
            lease_duration_seconds: i32::try_from(replicas.duration.as_secs()).ok(),
            renew_time: Some(now()),
            ..LeaseSpec::default()
        }),
    }
}

/// One renewal: the Lease replaced as last written (or created, or taken
/// back from what a previous process of this replica left).
async fn renew(replicas: &KubeReplicas, version: &mut Option<String>) -> Result<(), kube::Error> {
    let name = lease_name(replicas);
    let params = PostParams::default();
    let written = match version.clone() {
        Some(current) => {
            match replicas
                .leases
                .replace(&name, &params, &lease_of(replicas, Some(current)))
                .await
            {
                Err(err) if is_conflict(&err) || is_not_found(&err) => {
                    // Edited or deleted by someone else: start again from
                    // what the apiserver has.
                    *version = None;
                    return Err(err);
                }
                other => other?,
            }
        }
        None => match replicas.leases.get_opt(&name).await? {
            Some(existing) => {
                let mut lease = lease_of(replicas, existing.metadata.resource_version.clone());
                if let (Some(spec), Some(old)) = (lease.spec.as_mut(), existing.spec.as_ref()) {
                    spec.acquire_time = old.acquire_time.clone();
                }
                replicas.leases.replace(&name, &params, &lease).await?
            }
            None => {
                let mut lease = lease_of(replicas, None);
                if let Some(spec) = lease.spec.as_mut() {
                    spec.acquire_time = Some(now());
                }
                replicas.leases.create(&params, &lease).await?
            }
        },
    };
    *version = written.metadata.resource_version;
    Ok(())
}

/// Renews the Lease every third of its duration until `stop`.
pub(super) async fn renew_until(replicas: Arc<KubeReplicas>, stop: CancellationToken) {
    let every = replicas.duration / 3;
    let mut version = None;
    loop {
        let started = Instant::now();
        let renewed = {
            let _renewal = replicas.renewing.lock().await;
            if replicas.released.is_cancelled() {
                return;
            }
            // A slow answer still counts: giving up at the next period
            // would fence, under a busy apiserver, a replica whose every
            // renewal lands. While acting, it is waited for until this
            // replica would stop acting anyway; while not, for as long as
            // its landing would let this replica act again.
            let patience = match lock(&replicas.state).renewed {
                Some(at) if replicas.may_act_at_renewal(at, started) => (at
                    + replicas.acting_for())
                .duration_since(started)
                .max(every),
                _ => replicas.acting_for(),
            };
            let attempt = tokio::time::timeout(patience, renew(&replicas, &mut version));
            tokio::select! {
                renewed = attempt => renewed,
                () = stop.cancelled() => return,
            }
        };
        match renewed {
            Ok(Ok(())) => {
                lock(&replicas.state).renewed = Some(started);
                debug!(replica = %replicas.id, "renewed the replica Lease");
            }
            Ok(Err(err)) => {
                warn!(replica = %replicas.id, error = %err, "could not renew the replica Lease");
            }
            Err(_) => {
                warn!(replica = %replicas.id, "renewing the replica Lease timed out");
            }
        }
        // After a failure, try again sooner: a short outage should not
        // cost the Lease.
        let wait = match lock(&replicas.state).renewed {
            Some(at) if at == started => every.saturating_sub(started.elapsed()),
            _ => Duration::from_millis(500),
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
            () = replicas.released.cancelled() => return,
        }
    }
}

pub(super) async fn delete_own(replicas: &KubeReplicas) {
    match replicas
        .leases
        .delete(&lease_name(replicas), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => {}
        Err(err) => {
            warn!(replica = %replicas.id, error = %err, "could not delete the replica Lease; peers take its sessions over once it lapses")
        }
    }
}
