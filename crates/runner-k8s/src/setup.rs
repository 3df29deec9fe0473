//! Assemble the backend from configuration: client, bundle store, base-image
//! catalog, shared informers, and the bundle route the init containers fetch.

use std::sync::Arc;

use crate::images::base::{BaseImageCatalog, CatalogOptions, TagFilter};
use runner_core::config::{ConfigError, Env};
use runner_core::metrics::Metrics;
use tracing::warn;

use crate::backend::KubeBackend;
use crate::bundle_store::{self, BundleStore};
use crate::cluster::client::kube_client;
use crate::config::K8sConfig;
use crate::routing::detect::{log_resolution, resolve_routing};

pub struct KubeSetup {
    pub backend: Arc<KubeBackend>,
    /// Routes the backend adds to the runner (`/internal/bundles/:id`).
    pub routes: axum::Router,
}

/// `metrics` receives the apiserver requests and watch restarts.
pub async fn build(
    config: K8sConfig,
    env: &Env,
    metrics: Arc<Metrics>,
) -> Result<KubeSetup, ConfigError> {
    let client = kube_client(env, metrics.clone()).await?;
    // Before anything else starts: an unusable routing configuration refuses
    // to boot rather than publish routes nothing serves.
    let routing = resolve_routing(&client, &config.routing, &config.session_namespace).await?;
    log_resolution(&routing, config.routing.base_domain.as_deref());
    // A bundle is staged in the memory of the replica that starts the
    // session: with several, the pod fetches it from that replica itself,
    // not through the Service, which may answer from another.
    let bundle_base = match &config.replication {
        Some(replication) => replication.url.clone(),
        None => config.self_url.clone(),
    };
    let bundles = Arc::new(BundleStore::new(bundle_base));
    let catalog = if config.base_image_catalog.enabled {
        Some(catalog(&config).await?)
    } else {
        None
    };
    let backend = Arc::new(KubeBackend::new(
        config,
        client,
        bundles.clone(),
        catalog,
        routing,
        &metrics,
    ));
    Ok(KubeSetup {
        backend,
        routes: bundle_store::router(bundles),
    })
}

async fn catalog(config: &K8sConfig) -> Result<Arc<BaseImageCatalog>, ConfigError> {
    let settings = &config.base_image_catalog;
    let compile = |source: &Option<String>| -> Result<Vec<regex::Regex>, ConfigError> {
        source
            .iter()
            .map(|s| regex::Regex::new(s).map_err(ConfigError::refused))
            .collect()
    };
    let client = runner_core::http_client::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|err| ConfigError::setup("build the HTTP client", err))?;
    let mut options = CatalogOptions::new(&settings.repository, &config.default_image, client);
    options.filter = TagFilter {
        pinned_only: settings.filter.pinned_only,
        exclude_sha: settings.filter.exclude_sha,
        exclude_prerelease: settings.filter.exclude_prerelease,
        include: compile(&settings.filter.include)?,
        exclude: compile(&settings.filter.exclude)?,
    };
    options.limit = settings.limit;
    options.hub_url = settings.hub_url.clone();
    let catalog = Arc::new(BaseImageCatalog::new(options).map_err(ConfigError::refused)?);
    if let Err(err) = catalog.refresh().await {
        warn!(error = %err, "initial base-image catalog refresh failed; serving the default image only");
    }
    Ok(catalog)
}
