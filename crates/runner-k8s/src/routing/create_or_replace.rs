//! Create-or-replace (docs/contract.md §9.15): publishing a session's routing
//! objects again — after an adoption, or over a leftover of the same name —
//! must converge instead of failing on `409 AlreadyExists`.

use std::fmt::Debug;

use kube::api::PostParams;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cluster::api_error::{is_conflict, is_not_found};

/// Create `desired`; if an object of that name exists, replace it.
///
/// The replacement always starts from the live object's `resourceVersion`,
/// so a concurrent writer makes it fail with a conflict rather than be
/// silently overwritten. `keep_allocated` copies fields the apiserver
/// allocated and will not let a replace change (a Service's `clusterIP`).
pub async fn create_or_replace<K>(
    api: &Api<K>,
    desired: &K,
    keep_allocated: impl Fn(&K, &mut K),
) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let params = PostParams::default();
    match api.create(&params, desired).await {
        Ok(created) => return Ok(created),
        Err(err) if !is_conflict(&err) => return Err(err),
        Err(_) => {}
    }
    let name = desired.meta().name.clone().unwrap_or_default();
    let live = match api.get(&name).await {
        Ok(live) => live,
        // Gone between the two calls — typically collected with the pod that
        // owned it before: there is nothing left to replace.
        Err(err) if is_not_found(&err) => return api.create(&params, desired).await,
        Err(err) => return Err(err),
    };
    let mut replacement = desired.clone();
    replacement.meta_mut().resource_version = live.meta().resource_version.clone();
    keep_allocated(&live, &mut replacement);
    api.replace(&name, &params, &replacement).await
}

/// For objects the apiserver allocates nothing in.
pub fn nothing_allocated<K>(_live: &K, _replacement: &mut K) {}
