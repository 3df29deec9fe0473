//! What the cluster can route with, asked once at boot
//! (docs/contract.md §9.13), and the boot-time resolution that uses it.
//!
//! Both probes fail soft: a discovery error reads as "Gateway API not
//! served", a failed IngressClass list is kept as a failure so the refusal can
//! say it was a permission problem rather than an empty cluster.

use k8s_openapi::api::networking::v1::IngressClass;
use kube::api::ListParams;
use kube::{Api, Client};
use runner_core::config::ConfigError;
use tracing::{info, warn};

use super::mode::{
    DEFAULT_INGRESS_CLASS_ANNOTATION, GATEWAY_API_GROUP, IngressClassSummary, ResolvedRouting,
    RoutingSupport, decide, needs_detection, pick_gateway_version,
};
use crate::cluster::api_error::api_reason;
use crate::config::RoutingConfig;

/// Ask the cluster which routing layers it offers.
pub async fn detect_routing_support(client: &Client) -> RoutingSupport {
    RoutingSupport {
        gateway_api_version: gateway_api_version(client).await,
        ingress_classes: ingress_classes(client).await,
    }
}

async fn gateway_api_version(client: &Client) -> Option<String> {
    let groups = match client.list_api_groups().await {
        Ok(groups) => groups,
        Err(err) => {
            warn!(error = %err, "API discovery failed; treating the Gateway API as not served");
            return None;
        }
    };
    let group = groups
        .groups
        .into_iter()
        .find(|group| group.name == GATEWAY_API_GROUP)?;
    let served: Vec<String> = group
        .versions
        .iter()
        .map(|version| version.version.clone())
        .collect();
    let preferred = group.preferred_version.map(|version| version.version);
    pick_gateway_version(&served, preferred.as_deref())
}

async fn ingress_classes(client: &Client) -> Result<IngressClassSummary, String> {
    let classes: Api<IngressClass> = Api::all(client.clone());
    match classes.list(&ListParams::default()).await {
        Ok(list) => Ok(IngressClassSummary {
            count: list.items.len(),
            has_default: list.items.iter().any(|class| {
                class
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|annotations| annotations.get(DEFAULT_INGRESS_CLASS_ANNOTATION))
                    .is_some_and(|value| value == "true")
            }),
        }),
        Err(err) => {
            warn!(error = %err, "listing IngressClasses failed");
            Err(api_reason(&err))
        }
    }
}

/// Resolve the routing layer: the cluster is asked only when a host can be
/// built at all; refusals are configuration errors (exit 2).
pub async fn resolve_routing(
    client: &Client,
    config: &RoutingConfig,
    session_namespace: &str,
) -> Result<ResolvedRouting, ConfigError> {
    let support = if needs_detection(config) {
        detect_routing_support(client).await
    } else {
        RoutingSupport {
            gateway_api_version: None,
            ingress_classes: Ok(IngressClassSummary::default()),
        }
    };
    decide(config, &support, session_namespace)
}

/// Say once, at boot, how sessions are routed.
pub fn log_resolution(resolved: &ResolvedRouting, base_domain: Option<&str>) {
    let base_domain = base_domain.unwrap_or_default();
    match resolved {
        ResolvedRouting::None { reason } => {
            warn!(reason = %reason, "session routing disabled (logs-only)");
        }
        ResolvedRouting::Ingress { class } => info!(
            layer = "ingress",
            ingress_class = class.as_deref().unwrap_or("(cluster default)"),
            base_domain,
            "session routing resolved"
        ),
        ResolvedRouting::Gateway {
            api_version,
            parent,
        } => info!(
            layer = "gateway",
            api_version = %api_version,
            gateway = %format!("{}/{}", parent.namespace, parent.name),
            base_domain,
            "session routing resolved"
        ),
    }
}
