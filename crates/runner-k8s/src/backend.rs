//! `KubeBackend`: the runner-core `Backend` on a Kubernetes cluster.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::base_images::BaseImageCatalog;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use runner_core::capabilities::{SchemaOptions, session_config_schema};
use runner_core::metrics::Metrics;
use runner_core::types::{AvailabilityReport, PullPolicy, SessionConfig};
use runner_core::{
    Backend, BackendCapabilities, BackendSession, InvalidSessionConfig, ProbeConfig, Readiness,
    RecoveredSession, SessionSink, StartError, StartSpec, StartStage,
};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api_error::{api_failure, is_not_found, is_transient};
use crate::bundle_store::BundleStore;
use crate::config::{K8sConfig, OrphanPolicy};
use crate::event_watcher::EventWatcher;
use crate::limits::clamp_limits;
use crate::pod_spec::{
    AppPodInput, PodSettings, Resources, RunPodInput, SessionKind, SessionRecord, build_app_pod,
    build_session_pod, session_record_from_pod,
};
use crate::pod_status;
use crate::pod_watcher::PodWatcher;
use crate::routing::SessionRouter;
use crate::routing::mode::ResolvedRouting;
use crate::session::{SessionContext, SessionShape, bring_up, delete_pod, watch_session};

/// How many times a session was taken over by a restarted runner.
pub const GENERATION_ANNOTATION: &str = "telo.run/generation";

pub struct KubeBackend {
    config: Arc<K8sConfig>,
    client: Client,
    ctx: Arc<SessionContext>,
    settings: PodSettings,
    catalog: Option<Arc<BaseImageCatalog>>,
    /// Sessions found at boot, kept until `resume` takes them.
    recovered: Mutex<HashMap<String, SessionRecord>>,
    stop: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl KubeBackend {
    /// Wire the backend to a cluster: start the shared watches. `routing` is
    /// the layer resolved at boot ([`crate::routing::detect::resolve_routing`]).
    pub fn new(
        config: K8sConfig,
        client: Client,
        bundles: Arc<BundleStore>,
        catalog: Option<Arc<BaseImageCatalog>>,
        routing: ResolvedRouting,
        metrics: &Metrics,
    ) -> Self {
        let stop = CancellationToken::new();
        let namespace = config.session_namespace.clone();
        let (pod_watcher, pod_task) = PodWatcher::spawn(
            client.clone(),
            &namespace,
            &config.managed_by,
            metrics.watch_restarts("pods"),
            stop.clone(),
        );
        let (event_watcher, event_task) = EventWatcher::spawn(
            client.clone(),
            &namespace,
            metrics.watch_restarts("events"),
            stop.clone(),
        );
        let http = runner_core::http_client::client_builder()
            .no_proxy()
            .build()
            .unwrap_or_else(|_| runner_core::http_client::client());
        let mut tasks = vec![pod_task, event_task];
        let router = SessionRouter::spawn(
            client.clone(),
            &config,
            routing,
            metrics.watch_restarts("routes"),
            stop.clone(),
        )
        .map(|(router, task)| {
            tasks.push(task);
            router
        });
        let ctx = Arc::new(SessionContext {
            pods: Api::namespaced(client.clone(), &namespace),
            pod_watcher,
            event_watcher,
            bundles,
            http,
            start_deadline: config.start_deadline,
            stop_grace: config.core.stop_grace,
            router,
        });
        if let Some(catalog) = &catalog {
            tasks.push(
                catalog
                    .clone()
                    .spawn_refresher(config.base_image_catalog.refresh_interval, stop.clone()),
            );
        }
        let settings = PodSettings {
            namespace,
            managed_by: config.managed_by.clone(),
            init_image: config.init_image.clone(),
            default_image: config.default_image.clone(),
            image_pull_secret: config.image_pull_secret.clone(),
            runtime_class: config.runtime_class.clone(),
            termination_grace_seconds: i64::try_from(config.core.stop_grace.as_secs())
                .unwrap_or(i64::MAX),
        };
        Self {
            config: Arc::new(config),
            client,
            ctx,
            settings,
            catalog,
            recovered: Mutex::new(HashMap::new()),
            stop,
            tasks: Mutex::new(tasks),
        }
    }

    pub fn pod_watcher(&self) -> &Arc<PodWatcher> {
        &self.ctx.pod_watcher
    }

    fn resources(&self, app: bool) -> Resources {
        let ceilings = if app {
            &self.config.app_limits
        } else {
            &self.config.limits
        };
        let limits = clamp_limits(ceilings, None);
        Resources {
            cpu: limits.cpu,
            memory: limits.memory,
            ephemeral_storage: limits.ephemeral_storage,
            ttl_seconds: u32::try_from(limits.ttl_seconds).unwrap_or(u32::MAX),
        }
    }

    fn build_pod(&self, spec: &StartSpec) -> Result<Pod, StartError> {
        match &spec.app {
            Some(app) => Ok(build_app_pod(
                &self.settings,
                &AppPodInput {
                    session_id: &spec.session_id,
                    created_at: &spec.created_at,
                    app_name: &app.name,
                    image: &app.image,
                    pull_policy: app.pull_policy,
                    env: &spec.env,
                    ports: &spec.ports,
                    inspect: spec.inspect,
                    resources: &self.resources(true),
                },
            )),
            None => {
                let bundle_url = self
                    .ctx
                    .bundles
                    .stage(&spec.session_id, &spec.bundle)
                    .map_err(|err| StartError::new(StartStage::Bundle, err.to_string()))?;
                Ok(build_session_pod(
                    &self.settings,
                    &RunPodInput {
                        session_id: &spec.session_id,
                        created_at: &spec.created_at,
                        bundle_url: &bundle_url,
                        entry_relative_path: &spec.entry_relative_path,
                        image: &spec.config.image,
                        pull_policy: spec.config.pull_policy,
                        env: &spec.env,
                        ports: &spec.ports,
                        inspect: spec.inspect,
                        resources: &self.resources(false),
                    },
                ))
            }
        }
    }

    /// Stop the shared watches (runner shutdown).
    pub fn shutdown(&self) {
        self.stop.cancel();
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[async_trait]
impl Backend for KubeBackend {
    fn readiness(&self) -> Readiness {
        let mut waiting: Vec<String> = self
            .ctx
            .pod_watcher
            .not_ready_reason()
            .into_iter()
            .collect();
        if let Some(router) = &self.ctx.router {
            waiting.extend(router.not_ready_reason());
        }
        Readiness { waiting }
    }

    fn capabilities(&self) -> BackendCapabilities {
        let image_enum = self
            .catalog
            .as_ref()
            .map(|catalog| catalog.current())
            .unwrap_or_default();
        BackendCapabilities {
            display_name: self.config.display_name.clone(),
            description: self.config.description.clone(),
            config_schema: session_config_schema(&SchemaOptions {
                image_default: self.config.default_image.clone(),
                enforced: true,
                image_enum,
                registry_url: false,
                pull_policy_default: PullPolicy::Missing,
                pull_policy_description: Some(
                    "Kernel-image freshness, applied as the Pod's imagePullPolicy. `missing` pulls on first use; `always` pulls every run; `never` fails if the node lacks the image."
                        .to_owned(),
                ),
            }),
            features: json!({ "io": true, "ports": true }),
        }
    }

    async fn probe(&self, _config: &ProbeConfig) -> AvailabilityReport {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let namespace = &self.config.session_namespace;
        if namespaces.get(namespace).await.is_ok() {
            return AvailabilityReport::Ready;
        }
        if namespaces.list(&Default::default()).await.is_err() {
            return AvailabilityReport::Unavailable {
                message: "Kubernetes API server not reachable from the runner.".into(),
                remediation: Some("Check the runner's in-cluster ServiceAccount and RBAC.".into()),
            };
        }
        AvailabilityReport::Unavailable {
            message: format!("Session namespace '{namespace}' does not exist."),
            remediation: Some(format!(
                "Install the runner's Helm chart, which provisions the '{namespace}' namespace."
            )),
        }
    }

    fn validate_config(&self, config: &SessionConfig) -> Result<(), InvalidSessionConfig> {
        match &self.catalog {
            Some(catalog) if !catalog.is_allowed(&config.image) => {
                Err(catalog.allowlist_error(&config.image))
            }
            _ => Ok(()),
        }
    }

    async fn start(
        &self,
        spec: StartSpec,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        let pod = self.build_pod(&spec)?;
        let watching = watch_session(&self.ctx, &spec.session_id);
        if let Err(err) = self.ctx.pods.create(&PostParams::default(), &pod).await {
            self.ctx.bundles.drop_bundle(&spec.session_id);
            return Err(api_failure(
                err,
                StartStage::Create,
                "could not create the session pod",
            ));
        }
        let shape = SessionShape {
            session_id: spec.session_id.clone(),
            ports: spec.ports.clone(),
            inspect: spec.inspect && !spec.self_contained(),
        };
        bring_up(self.ctx.clone(), shape, sink, watching).await
    }

    async fn recover(&self) -> Vec<RecoveredSession> {
        self.ctx.pod_watcher.wait_synced().await;
        let mut recovered = Vec::new();
        for pod in self.ctx.pod_watcher.pods() {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let finished = pod_status::is_finished(&pod);
            let record = session_record_from_pod(&pod);
            // A session that finished while no runner was up is adopted as
            // finished (its exit code and log), unless it finished longer
            // ago than a finished session is kept.
            let expired = finished && finished_longer_ago_than(&pod, self.config.core.exit_ttl);
            let adoptable = self.config.orphan_policy == OrphanPolicy::Adopt && !expired;
            match record {
                Ok(record) if adoptable => {
                    let generation = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(GENERATION_ANNOTATION))
                        .and_then(|g| g.parse::<u32>().ok())
                        .unwrap_or(0)
                        .saturating_add(1);
                    // Recorded on the pod so a later restart continues past
                    // this generation's ids.
                    match record_adoption(&self.ctx.pods, &name, generation).await {
                        Ok(()) => {}
                        Err(err) if is_not_found(&err) => continue,
                        // A live session is never deleted for bookkeeping:
                        // it is adopted, and only a later restart may hand
                        // out ids that overlap this generation's.
                        Err(err) => {
                            warn!(pod = %name, error = %err, "could not record the adoption on the pod; adopting it anyway");
                        }
                    }
                    recovered.push(RecoveredSession {
                        session_id: record.session_id.clone(),
                        created_at: record.created_at.clone(),
                        generation,
                    });
                    self.recovered
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(record.session_id.clone(), record);
                }
                other => {
                    let why = match &other {
                        Err(err) => err.to_string(),
                        Ok(_) if expired => {
                            "finished longer ago than RUNNER_EXIT_TTL_MS".to_owned()
                        }
                        Ok(_) => "orphan policy is reap".to_owned(),
                    };
                    info!(pod = %name, reason = %why, "deleting a session pod left by a previous runner");
                    if let Err(err) = delete_pod(&self.ctx.pods, &name).await {
                        warn!(pod = %name, error = %err, "could not delete a leftover session pod");
                    }
                }
            }
        }
        recovered
    }

    async fn resume(
        &self,
        session: RecoveredSession,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        let record = self
            .recovered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&session.session_id)
            .ok_or_else(|| {
                StartError::new(StartStage::Resume, "the session's pod record was lost")
            })?;
        let watching = watch_session(&self.ctx, &record.session_id);
        let shape = SessionShape {
            session_id: record.session_id.clone(),
            ports: record.ports.clone(),
            inspect: record.inspect && record.kind == SessionKind::Run,
        };
        bring_up(self.ctx.clone(), shape, sink, watching).await
    }

    fn release(&self, session_id: &str) {
        self.ctx.bundles.drop_bundle(session_id);
    }

    /// With the adopt policy the next runner takes the pods over, so a
    /// restart (every `helm upgrade`) keeps every session.
    fn leaves_sessions_on_shutdown(&self) -> bool {
        self.config.orphan_policy == OrphanPolicy::Adopt
    }
}

/// Whether the pod's session container finished more than `ttl` ago; a pod
/// without a finish time counts as finished long ago.
fn finished_longer_ago_than(pod: &Pod, ttl: std::time::Duration) -> bool {
    let finished_at = pod
        .status
        .as_ref()
        .and_then(|status| status.container_statuses.as_ref())
        .and_then(|statuses| statuses.first())
        .and_then(|status| status.state.as_ref())
        .and_then(|state| state.terminated.as_ref())
        .and_then(|terminated| terminated.finished_at.as_ref());
    let Some(finished_at) = finished_at else {
        return true;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(finished_at.0);
    age.as_secs_f64() > ttl.as_secs_f64()
}

/// Attempts at recording an adoption when the apiserver fails transiently.
const ADOPTION_PATCH_ATTEMPTS: u32 = 5;

/// Records the adoption's generation on the pod, so a later restart
/// continues past this generation's ids; transient failures are retried.
async fn record_adoption(pods: &Api<Pod>, name: &str, generation: u32) -> Result<(), kube::Error> {
    let patch =
        json!({"metadata": {"annotations": {GENERATION_ANNOTATION: generation.to_string()}}});
    let mut attempt = 1;
    loop {
        match pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(err) if attempt < ADOPTION_PATCH_ATTEMPTS && is_transient(&err) => {
                debug!(pod = name, error = %err, attempt, "recording the adoption failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(100) * attempt).await;
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}
