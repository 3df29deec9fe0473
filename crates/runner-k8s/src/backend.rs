//! `KubeBackend`: the runner-core `Backend` on a Kubernetes cluster.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

use crate::images::base::BaseImageCatalog;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{Api, Client};
use runner_api::telo::TeloVersion;
use runner_api::watch::IoMode;
use runner_api::watch::SessionMode;
use runner_core::backend::SessionResources;
use runner_core::capabilities::{SchemaOptions, session_config_schema};
use runner_core::metrics::Metrics;
use runner_core::tasks::OwnedTasks;
use runner_core::types::{AvailabilityReport, PullPolicy, SessionConfig};
use runner_core::{
    Backend, BackendCapabilities, BackendFeatures, BackendSession, HeldSessions,
    InvalidSessionConfig, ProbeConfig, Readiness, RecoveredSession, SessionSink, StartError,
    StartSpec, StartStage, SuspendedSession, TeloUnavailable, TeloVersions, WatchSessions,
    WatchSpec, WatchStart, WatchWorkload,
};

use crate::bundle_store::BundleStore;
use crate::config::{K8sConfig, OrphanPolicy};
use crate::images::telo::{TeloPin, TeloPins};
use crate::pod::env_secret::{EnvSecrets, PodEnvSecret};
use crate::pod::event_informer::EventInformer;
use crate::pod::informer::PodInformer;
use crate::pod::limits::clamp_limits;
use crate::pod::pooled_watch::WatchPoolShared;
use crate::pod::session_record::{SessionKind, SessionRecord, record_annotations};
use crate::pod::spec::{
    AppPodInput, PodSettings, Resources, RunPodInput, SESSION_CONTAINER, build_app_pod,
    build_session_pod, image_or_default,
};
use crate::pod::warm::{GO_AHEAD, LAUNCH_FILE, launch_file};
use crate::replica::KubeReplicas;
use crate::routing::SessionRouter;
use crate::routing::mode::ResolvedRouting;
use crate::session::adoption::Adoption;
use crate::session::{
    SessionContext, SessionShape, bring_up, delete_pod, subscribe_pod, subscribe_session,
};
use crate::warm_pool::watch_pods::create_pod_giving_way;
use crate::warm_pool::{Shared as WarmShared, Starting, WarmPools};
use crate::watch::WatchContext;
use crate::watch::checkpoint::Checkpoints;
use runner_api::types::RunPhase;
use runner_api::watch::{WorkspaceChangeSet, WorkspaceWrite};

pub struct KubeBackend {
    config: Arc<K8sConfig>,
    client: Client,
    ctx: Arc<SessionContext>,
    settings: PodSettings,
    catalog: Option<Arc<BaseImageCatalog>>,
    /// Sessions found at boot, kept until `resume` takes them.
    adoption: Adoption,
    /// The shared informers, the catalog refresher and every session's
    /// background work.
    tasks: OwnedTasks,
    /// Set when the operator enabled watch sessions.
    watch: Option<Arc<WatchContext>>,
    /// Set when the operator configured warm pools.
    warm: Option<Arc<WarmPools>>,
    /// Set when this runner is one of several replicas.
    replicas: Option<Arc<KubeReplicas>>,
}

impl KubeBackend {
    /// Wire the backend to a cluster: start the shared informers. `routing` is
    /// the layer resolved at boot ([`crate::routing::detect::resolve_routing`]).
    pub fn new(
        config: K8sConfig,
        client: Client,
        bundles: Arc<BundleStore>,
        catalog: Option<Arc<BaseImageCatalog>>,
        routing: ResolvedRouting,
        metrics: &Metrics,
    ) -> Self {
        let tasks = OwnedTasks::new();
        let stop = tasks.stopping();
        let namespace = config.session_namespace.clone();
        let (pod_informer, pod_task) = PodInformer::spawn(
            client.clone(),
            &namespace,
            &config.managed_by,
            metrics.watch_restarts("pods"),
            stop.clone(),
        );
        let (event_informer, event_task) = EventInformer::spawn(
            client.clone(),
            &namespace,
            metrics.watch_restarts("events"),
            stop.clone(),
        );
        // Pods' workspace services close a connection idle past their
        // header deadline; a pooled connection is dropped here well before,
        // so a request never goes out on one the service is closing.
        let http = runner_core::http_client::client_builder()
            .no_proxy()
            .pool_idle_timeout(WORKSPACE_POOL_IDLE)
            .build()
            .unwrap_or_else(|_| runner_core::http_client::client());
        tasks.adopt(pod_task);
        tasks.adopt(event_task);
        let router = SessionRouter::spawn(
            client.clone(),
            &config,
            routing,
            metrics.watch_restarts("routes"),
            &tasks,
        );
        let ctx = Arc::new(SessionContext {
            pods: Api::namespaced(client.clone(), &namespace),
            env_secrets: EnvSecrets::new(
                Api::namespaced(client.clone(), &namespace),
                Api::namespaced(client.clone(), &namespace),
                config.managed_by.clone(),
            ),
            pod_informer,
            event_informer,
            bundles,
            http,
            start_deadline: config.start_deadline,
            stop_grace: config.core.stop_grace,
            router,
            tasks: tasks.clone(),
        });
        if let Some(catalog) = &catalog {
            tasks.adopt(
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
        let adoption = Adoption::new(config.orphan_policy, config.core.exit_ttl);
        let replicas = config.replication.as_ref().map(|replication| {
            KubeReplicas::spawn(
                replication,
                &client,
                client.default_namespace(),
                &config.session_namespace,
                config.core.watch.enabled,
                &config.managed_by,
                ctx.pod_informer.clone(),
                metrics,
                &tasks,
            )
        });
        let watch_resources = {
            let limits = clamp_limits(&config.app_limits, None);
            Resources {
                cpu: limits.cpu,
                memory: limits.memory,
                ephemeral_storage: limits.ephemeral_storage,
                ttl_seconds: u32::try_from(config.core.watch.max_ttl.as_secs()).unwrap_or(u32::MAX),
            }
        };
        let warm = (!config.warm_pools.is_empty() || !config.watch_pools.is_empty()).then(|| {
            let limits = clamp_limits(&config.limits, None);
            let pools = WarmPools::new(
                WarmShared {
                    ctx: ctx.clone(),
                    settings: settings.clone(),
                    resources: Resources {
                        cpu: limits.cpu,
                        memory: limits.memory,
                        ephemeral_storage: limits.ephemeral_storage,
                        ttl_seconds: u32::try_from(limits.ttl_seconds).unwrap_or(u32::MAX),
                    },
                    workspace_image: config.workspace_image.clone(),
                    watch: config.core.watch.enabled.then(|| WatchPoolShared {
                        resources: watch_resources.clone(),
                        workspace_limits: crate::watch::limit_env(&config.workspace_limits),
                    }),
                    warm_up_modules: config.warm_pool_modules.clone(),
                    refiller: replicas.as_ref().map(|replicas| replicas.refiller()),
                },
                &config.warm_pools,
                &config.watch_pools,
                config.warm_pool_surge,
                metrics,
            );
            pools.spawn(&tasks);
            pools
        });
        let watch = config.core.watch.enabled.then(|| {
            Arc::new(WatchContext {
                session: ctx.clone(),
                checkpoints: Checkpoints::new(
                    Api::namespaced(client.clone(), &config.session_namespace),
                    config.managed_by.clone(),
                    replicas.as_ref().map(|r| r.id().to_owned()),
                ),
                replicas: replicas.clone(),
                settings: settings.clone(),
                resources: watch_resources.clone(),
                workspace_image: config.workspace_image.clone(),
                workspace_limits: config.workspace_limits,
                telo_images: config.telo_images.clone(),
                warm: warm.clone(),
            })
        });
        Self {
            config: Arc::new(config),
            client,
            ctx,
            settings,
            catalog,
            adoption,
            tasks,
            watch,
            warm,
            replicas,
        }
    }

    /// The annotation that names this replica as a new session's owner,
    /// when there are several.
    fn replica_annotation(&self) -> Option<(String, String)> {
        self.replicas.as_ref().map(|replicas| {
            (
                crate::pod::labels::REPLICA_ANNOTATION.to_owned(),
                replicas.id().to_owned(),
            )
        })
    }

    /// `held`, widened by the sessions another replica's objects name: what
    /// recovery must leave alone when there are several.
    fn held_here_or_by_peers(&self, held: HeldSessions) -> HeldSessions {
        match &self.replicas {
            Some(replicas) => {
                let replicas = replicas.clone();
                Arc::new(move |id: &str| held(id) || replicas.named_elsewhere(id))
            }
            None => held,
        }
    }

    /// The image of the telo release `spec` names, if it names one: looked
    /// up once per start, and handed to every step that needs it.
    fn telo_pin(&self, spec: &StartSpec) -> Option<Result<TeloPin, String>> {
        spec.telo
            .as_deref()
            .map(|version| self.config.telo_images.pin(SESSION_CONTAINER, version))
    }

    /// The kernel image and pull policy a run session's pod would run; `None`
    /// for an app session (its catalog image) or a release with no image.
    fn kernel_image(
        &self,
        spec: &StartSpec,
        pin: Option<&Result<TeloPin, String>>,
    ) -> Option<(String, PullPolicy)> {
        if spec.app.is_some() {
            return None;
        }
        match pin {
            Some(pin) => pin
                .as_ref()
                .ok()
                .map(|pin| (pin.image.clone(), pin.pull_policy)),
            None => Some((
                image_or_default(&spec.config.image, &self.settings),
                spec.config.pull_policy,
            )),
        }
    }

    /// Starts `spec` on a claimed warm pod of `image`'s pool: the bundle
    /// handed over through the pod's workspace service, the terminal
    /// attached and the routes published, then the kernel launched (so not
    /// a byte of its output comes before the attach). `None` when no pod
    /// could be claimed.
    async fn start_warm(
        &self,
        pools: &WarmPools,
        spec: &StartSpec,
        image: &str,
        pin: Option<&Result<TeloPin, String>>,
        sink: &SessionSink,
    ) -> Result<Option<Arc<dyn BackendSession>>, StartError> {
        let record = SessionRecord {
            session_id: spec.session_id.clone(),
            created_at: spec.created_at.clone(),
            kind: SessionKind::Run,
            ports: spec.ports.clone(),
            inspect: spec.inspect,
            app: None,
            token_digest: None,
            owner: spec.owner.clone(),
        };
        let resources = self.resources(false);
        let mut annotations = record_annotations(&record);
        annotations.extend(self.replica_annotation());
        let Some(claimed) = pools
            .claim(image, &spec.session_id, &annotations, resources.ttl_seconds)
            .await
        else {
            return Ok(None);
        };
        sink.progress(RunPhase::Provision, "Starting on a warm pod", None);
        let pins = pins_of(pin);
        let subscription =
            subscribe_pod(&self.ctx, &spec.session_id, &claimed.pod_name).naming_telo(pins);
        let files = spec
            .bundle
            .files
            .iter()
            .map(|file| WorkspaceWrite {
                path: file.relative_path.clone(),
                content: file.contents.clone(),
                encoding: None,
            })
            .collect();
        let deliver = claimed
            .workspace
            .apply(&WorkspaceChangeSet {
                write: files,
                delete: Vec::new(),
            })
            .await;
        if let Err(err) = deliver {
            let _ = delete_pod(&self.ctx.pods, &claimed.pod_name).await;
            return Err(StartError::new(
                StartStage::Bundle,
                format!(
                    "could not hand the application to its warm pod: {}",
                    err.message
                ),
            ));
        }
        let shape = SessionShape {
            session_id: spec.session_id.clone(),
            pod_name: claimed.pod_name.clone(),
            ports: spec.ports.clone(),
            inspect: spec.inspect,
            memory_limit: resources.memory,
        };
        let session = bring_up(self.ctx.clone(), shape, sink.clone(), subscription).await?;
        // The kernel starts on the go-ahead typed into its terminal, which
        // needs the attach: without one it would never start.
        if !session.terminal_attached() {
            let _ = session.stop().await;
            return Err(StartError::new(
                StartStage::Start,
                "could not attach to the warm pod's terminal to start the kernel",
            ));
        }
        let launch = WorkspaceChangeSet {
            write: vec![WorkspaceWrite {
                path: LAUNCH_FILE.to_owned(),
                content: launch_file(&spec.env, &spec.entry_relative_path, spec.inspect),
                encoding: None,
            }],
            delete: Vec::new(),
        };
        if let Err(err) = claimed.workspace.apply(&launch).await {
            let _ = session.stop().await;
            return Err(StartError::new(
                StartStage::Start,
                format!(
                    "could not start the kernel on its warm pod: {}",
                    err.message
                ),
            ));
        }
        session.write_stdin(Bytes::from_static(GO_AHEAD));
        Ok(Some(session))
    }

    /// A run or app session's start, on a claimed warm pod or a new pod.
    async fn start_run(
        &self,
        spec: StartSpec,
        sink: &SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        let pin = self.telo_pin(&spec);
        if let Some(pools) = &self.warm
            && let Some((image, pull_policy)) = self.kernel_image(&spec, pin.as_ref())
            && pools.serves(&image, pull_policy)
        {
            // Checked before a pod is claimed: a bundle that starts cold
            // starts cold rather than failing on (and losing) a warm pod.
            let too_large = crate::warm_pool::bundle_exceeds_warm_pod(&spec.bundle);
            if too_large.is_none()
                && let Some(session) = self
                    .start_warm(pools, &spec, &image, pin.as_ref(), sink)
                    .await?
            {
                pools.count_start(&image, true);
                return Ok(session);
            }
            pools.count_start(&image, false);
            let message = match too_large {
                Some(reason) => format!("{reason}: starting a new pod"),
                None => "No warm pod is ready: starting a new pod".to_owned(),
            };
            sink.progress(RunPhase::Provision, &message, None);
        }
        let (pod, env_secret, pins) = self.build_pod(&spec, pin)?;
        let subscription = subscribe_session(&self.ctx, &spec.session_id).naming_telo(pins);
        let pod_name = crate::pod::session_record::pod_name(&spec.session_id);
        let created = self
            .ctx
            .env_secrets
            .create_pod(&env_secret, &spec.session_id, &pod_name, || {
                self.create_pod(&pod)
            })
            .await;
        if let Err(err) = created {
            self.ctx.bundles.drop_bundle(&spec.session_id);
            return Err(err.into_start_error());
        }
        let shape = SessionShape {
            session_id: spec.session_id.clone(),
            pod_name,
            ports: spec.ports.clone(),
            inspect: spec.inspect && !spec.self_contained(),
            memory_limit: self.resources(spec.self_contained()).memory,
        };
        Ok(bring_up(self.ctx.clone(), shape, sink.clone(), subscription).await?)
    }

    /// Keeps the pools still until the session just started has been
    /// announced `running` (its kernel started) or ended, at most
    /// [`KERNEL_START_HOLD`]: the pod runs well before its kernel has
    /// loaded the application, and a refill pod's start (its own kernel
    /// warm-up included) would compete with that kernel for the node.
    fn hold_pools_until_announced(&self, starting: Option<Starting>, sink: &SessionSink) {
        let Some(starting) = starting else {
            return;
        };
        let sink = sink.clone();
        self.tasks.spawn(async move {
            let _starting = starting;
            let _ = tokio::time::timeout(KERNEL_START_HOLD, sink.announced()).await;
        });
    }

    /// Creates a session pod. When the namespace's quota refuses it and a
    /// warm pod can give way, the pool shrinks by one and the create is
    /// tried again (a session asked for; a warm pod only might be).
    async fn create_pod(&self, pod: &Pod) -> Result<Pod, kube::Error> {
        create_pod_giving_way(&self.ctx.pods, self.warm.as_deref(), pod).await
    }

    pub fn pod_informer(&self) -> &Arc<PodInformer> {
        &self.ctx.pod_informer
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

    /// The pod of `spec`, the env values it reads from its Secret, and the
    /// containers of it that run a chosen telo release.
    fn build_pod(
        &self,
        spec: &StartSpec,
        pin: Option<Result<TeloPin, String>>,
    ) -> Result<(Pod, PodEnvSecret, TeloPins), StartError> {
        let mut pins = TeloPins::default();
        let mut env_secret =
            PodEnvSecret::for_pod(&crate::pod::session_record::pod_name(&spec.session_id));
        let pod = match &spec.app {
            Some(app) => build_app_pod(
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
                    token: app.token.as_deref(),
                    resources: &self.resources(true),
                    owner: spec.owner.as_ref(),
                },
                &mut env_secret,
            ),
            None => {
                let bundle_url = self
                    .ctx
                    .bundles
                    .stage(&spec.session_id, &spec.bundle)
                    .map_err(|err| StartError::new(StartStage::Bundle, err.to_string()))?;
                // A named release replaces the config's image and pull
                // policy: core refuses a request that sends both.
                let (image, pull_policy) = match pin {
                    Some(pin) => {
                        let pin = pin.map_err(|reason| {
                            self.ctx.bundles.drop_bundle(&spec.session_id);
                            StartError::new(StartStage::Start, reason)
                        })?;
                        let chosen = (pin.image.clone(), pin.pull_policy);
                        pins.push(pin);
                        chosen
                    }
                    None => (spec.config.image.clone(), spec.config.pull_policy),
                };
                build_session_pod(
                    &self.settings,
                    &RunPodInput {
                        session_id: &spec.session_id,
                        created_at: &spec.created_at,
                        bundle_url: &bundle_url,
                        entry_relative_path: &spec.entry_relative_path,
                        image: &image,
                        pull_policy,
                        env: &spec.env,
                        ports: &spec.ports,
                        inspect: spec.inspect,
                        resources: &self.resources(false),
                        owner: spec.owner.as_ref(),
                    },
                )
            }
        };
        let mut pod = pod;
        if let Some((key, value)) = self.replica_annotation() {
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key, value);
        }
        Ok((pod, env_secret, pins))
    }
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        self.tasks.stop();
    }
}

#[async_trait]
impl Backend for KubeBackend {
    /// A watch session's links in its record Secret; a run or app
    /// session's in its pod's `telo.run/links` annotation. Both outlive the
    /// runner exactly as long as the session does.
    async fn keep_links(
        &self,
        session_id: &str,
        mode: SessionMode,
        links: &[runner_core::backend::KeptLink],
    ) -> Result<(), String> {
        if mode == SessionMode::Watch {
            let Some(watch) = &self.watch else {
                return Ok(());
            };
            return watch
                .checkpoints
                .save_links(session_id, links)
                .await
                .map_err(|err| crate::cluster::api_error::api_reason(&err));
        }
        let pod = self
            .ctx
            .pod_informer
            .objects_of(session_id)
            .into_iter()
            .find(|pod| {
                pod.metadata.deletion_timestamp.is_none() && !crate::pod::labels::is_watch_pod(pod)
            })
            .and_then(|pod| pod.metadata.name.clone())
            .ok_or_else(|| "the session has no pod yet".to_owned())?;
        crate::session::adoption::keep_links_on_pod(&self.ctx.pods, &pod, links)
            .await
            .map_err(|err| crate::cluster::api_error::api_reason(&err))
    }

    /// A pod's ceilings: run sessions' `RUNNER_MAX_*`, app and watch
    /// sessions' `RUNNER_APP_MAX_*`.
    fn session_resources(&self, kind: runner_core::backend::SessionKind) -> SessionResources {
        let resources = self.resources(kind != runner_core::backend::SessionKind::Run);
        let whole = |value: Option<f64>| value.map_or(0, |value| value.ceil() as u64);
        SessionResources {
            cpu_millis: whole(crate::pod::limits::parse_cpu_millis(&resources.cpu)),
            memory_bytes: whole(crate::pod::limits::parse_memory_bytes(&resources.memory)),
        }
    }

    fn readiness(&self) -> Readiness {
        let mut waiting: Vec<String> = self
            .ctx
            .pod_informer
            .not_ready_reason()
            .into_iter()
            .collect();
        if let Some(router) = &self.ctx.router {
            waiting.extend(router.not_ready_reason());
        }
        if let Some(replicas) = &self.replicas {
            waiting.extend(replicas.not_ready_reason());
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
            features: BackendFeatures {
                io: vec![IoMode::Tty, IoMode::Streams],
                ports: true,
            },
            default_config: SessionConfig {
                image: self.config.default_image.clone(),
                pull_policy: PullPolicy::Missing,
                registry_url: None,
            },
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
        let starting = self.warm.as_ref().map(|pools| pools.starting());
        let started = self.start_run(spec, &sink).await;
        if started.is_ok() {
            self.hold_pools_until_announced(starting, &sink);
        }
        started
    }

    async fn recover(&self, held: HeldSessions) -> Vec<RecoveredSession> {
        let recovered = self
            .adoption
            .recover(
                &self.ctx.pod_informer,
                &self.ctx.pods,
                &held,
                self.replicas.as_deref(),
            )
            .await;
        let held = self.held_here_or_by_peers(held);
        // Only catalog entries (app sessions, agents) have env Secrets; a
        // runner without a catalog never made one, and may not be allowed
        // to list Secrets.
        if !self.config.core.apps.is_empty() {
            self.ctx.env_secrets.sweep(&held).await;
        }
        recovered
    }

    async fn resume(
        &self,
        session: RecoveredSession,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        let (record, pod_name) = self.adoption.take(&session.session_id).ok_or_else(|| {
            StartError::new(StartStage::Resume, "the session's pod record was lost")
        })?;
        let subscription = subscribe_pod(&self.ctx, &record.session_id, &pod_name);
        let shape = SessionShape {
            session_id: record.session_id.clone(),
            pod_name,
            ports: record.ports.clone(),
            inspect: record.inspect && record.kind == SessionKind::Run,
            memory_limit: self.resources(record.kind == SessionKind::App).memory,
        };
        Ok(bring_up(self.ctx.clone(), shape, sink, subscription).await?)
    }

    fn release(&self, session_id: &str) {
        self.ctx.bundles.drop_bundle(session_id);
        // A watch session's checkpoint goes with the session.
        if let Some(watch) = &self.watch {
            let watch = watch.clone();
            let id = session_id.to_owned();
            self.tasks.spawn(async move {
                if let Err(err) = watch.checkpoints.delete(&id).await {
                    tracing::warn!(session_id = %id, error = %err, "could not delete a watch session's checkpoint");
                }
            });
        }
    }

    /// With the adopt policy the next runner takes the pods over, so a
    /// restart (every `helm upgrade`) keeps every session.
    fn leaves_sessions_on_shutdown(&self) -> bool {
        self.config.orphan_policy == OrphanPolicy::Adopt
    }

    async fn shutdown(&self) {
        // Every session is left as it runs by now: peers take them over
        // as soon as the Lease is gone.
        if let Some(replicas) = &self.replicas {
            replicas.release().await;
        }
        self.tasks.shutdown(TASKS_SHUTDOWN_BOUND).await;
    }

    fn telo_versions(&self) -> Option<&dyn TeloVersions> {
        Some(self)
    }

    fn watch_sessions(&self) -> Option<&dyn WatchSessions> {
        self.watch.as_ref().map(|_| self as &dyn WatchSessions)
    }

    fn replicas(&self) -> Option<Arc<dyn runner_core::replicas::Replicas>> {
        self.replicas
            .clone()
            .map(|replicas| replicas as Arc<dyn runner_core::replicas::Replicas>)
    }
}

impl TeloVersions for KubeBackend {
    /// Only what the configuration decides: whether a published tag exists
    /// is the kubelet's to find out, and a pull that fails fails the start
    /// naming the release.
    fn supply_telo(
        &self,
        version: &TeloVersion,
        _mode: SessionMode,
    ) -> Result<(), TeloUnavailable> {
        self.config.telo_images.image_for(version).map(|_| ())
    }
}

#[async_trait]
impl WatchSessions for KubeBackend {
    fn offers_agents(&self) -> bool {
        true
    }

    async fn start_watch(
        &self,
        spec: WatchSpec,
        start: WatchStart,
        sink: SessionSink,
    ) -> Result<Arc<dyn WatchWorkload>, StartError> {
        let Some(watch) = &self.watch else {
            return Err(StartError::new(
                StartStage::Start,
                "watch sessions are not enabled on this runner (RUNNER_WATCH_SESSIONS)",
            ));
        };
        // A watch pod is a start someone waits for, like any other.
        let starting = self.warm.as_ref().map(|pools| pools.starting());
        let started = crate::watch::start(watch.clone(), spec, start, sink.clone()).await?;
        self.hold_pools_until_announced(starting, &sink);
        Ok(started)
    }

    async fn has_checkpoint(&self, session_id: &str) -> bool {
        match &self.watch {
            Some(watch) => watch.checkpoints.has_files(session_id).await,
            None => false,
        }
    }

    async fn recover_suspended(&self, held: HeldSessions) -> Vec<SuspendedSession> {
        match &self.watch {
            Some(watch) => crate::watch::recover_suspended(watch, &held).await,
            None => Vec::new(),
        }
    }
}

/// How long shutdown waits for the backend's tasks once they are told to
/// stop; they end at once unless a request hangs.
/// How long a connection to a pod (its workspace service) may idle in the
/// pool: half the service's header deadline.
const WORKSPACE_POOL_IDLE: Duration =
    Duration::from_secs(runner_core::config::DEFAULT_HEADER_TIMEOUT_SECONDS / 2);

const TASKS_SHUTDOWN_BOUND: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest the pools stay still for one session's kernel start after
/// its pod runs: a cold real kernel installing an npm controller takes a
/// few seconds; a session that says nothing is announced after 3 s (10 s
/// with `inspect`).
const KERNEL_START_HOLD: Duration = Duration::from_secs(10);

/// The telo releases a run session's pod runs by name (for a start failure
/// that names the release).
fn pins_of(pin: Option<&Result<TeloPin, String>>) -> TeloPins {
    let mut pins = TeloPins::default();
    if let Some(Ok(pin)) = pin {
        pins.push(pin.clone());
    }
    pins
}
