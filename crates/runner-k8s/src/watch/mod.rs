//! Watch sessions on Kubernetes (docs/contract.md §9.4): one pod per
//! session ([`crate::pod::watch`]), its files moved through the pod's own workspace
//! service (`telo-runner workspace`, reached on the pod IP with the
//! session's token — never `pods/exec`), its checkpoint in a Secret
//! ([`checkpoint`]) so a suspended session survives the runner.
//!
//! A bring-up creates the pod, waits for it to run, waits for the workspace
//! service, fills the workspace (the bundle, or the checkpoint), attaches to
//! every app container, relays every kernel's debug stream, publishes the
//! routes of every app's ports and reports `running`. Suspending, a new app
//! set and stopping take the pod down first and wait until it is gone, so a
//! session has at most one pod at a time and its name never clashes.

pub mod checkpoint;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;
use runner_core::observe::Observer;
use runner_core::reach::Reach;
use runner_core::sync::lock;
use runner_core::types::{PortMapping, RunPhase, RunStatus};
use runner_core::watch_types::{
    AppSpec, WorkspaceApplyResult, WorkspaceChangeSet, WorkspaceCheckpointFile,
    WorkspaceFileContent, WorkspaceTree,
};
use runner_core::{
    BackendSession, HeldSessions, SessionSink, StartError, StartStage, StopError, SuspendedSession,
    WatchSpec, WatchStart, WatchWorkload, WorkspaceFailure,
};
use runner_workspace_service::client::WorkspaceClient;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cluster::api_error::{api_failure, api_reason};
use crate::images::telo::{TeloImageSource, TeloPins};
use crate::pod::env_secret::{PodCreateError, PodEnvSecret};
use crate::pod::informer::PodState;
use crate::pod::pooled_watch::{LAUNCH_PATH, POOLED_APP_CONTAINER, watch_launch_file};
use crate::pod::spec::{PodSettings, Resources};
use crate::pod::status::{PodPhase, is_finished};
use crate::pod::warm::GO_AHEAD;
use crate::pod::watch::{
    WORKSPACE_PORT, WatchPodInput, app_container, build_watch_pod, inspect_port_for, watch_pod_name,
};
use crate::routing::endpoints::endpoints_for;
use crate::session::{
    Arrival, DELETED_OUTSIDE, PodSubscription, SessionContext, delete_pod, start_failed,
    subscribe_pod, wait_until_running,
};
use crate::terminal::{self, Output, Terminal};
use crate::warm_pool::watch_pods::{create_pod_giving_way, shape_misfit};
use crate::warm_pool::{Claimed, WarmPools};
use checkpoint::{CheckpointError, Checkpoints, PooledPod, WatchRecord};

/// How long the workspace service of a running pod may take to answer.
const WORKSPACE_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a starting workspace service is asked whether it answers.
const WORKSPACE_POLL: Duration = Duration::from_millis(100);
/// How long past its grace period a taken-down pod may take to be gone.
const GONE_SETTLE: Duration = Duration::from_secs(10);
/// Attempts at reading a left-running pod's files at boot.
const RECOVERY_SNAPSHOT_ATTEMPTS: u32 = 5;
/// Random bytes of a workspace token (48 hex characters).
const TOKEN_BYTES: usize = 24;

/// What every watch session of one backend shares.
pub struct WatchContext {
    pub session: Arc<SessionContext>,
    pub checkpoints: Checkpoints,
    pub settings: PodSettings,
    /// Per container; `ttl_seconds` is the watch pod's lifetime.
    pub resources: Resources,
    pub workspace_image: String,
    /// What a workspace may hold; the workspace service enforces it.
    pub workspace_limits: runner_workspace::WorkspaceLimits,
    /// The images of named telo releases.
    pub telo_images: TeloImageSource,
    /// The warm pools, when the runner keeps any: a session of a watch
    /// pool's shape starts on a claimed pod, and a cold start the quota
    /// refuses takes the place of an idle warm pod.
    pub warm: Option<Arc<WarmPools>>,
    /// Set when this runner is one of several replicas: a kept session is
    /// recovered only once this replica holds its record.
    pub replicas: Option<Arc<crate::replica::KubeReplicas>>,
}

/// The app containers that run a named release. A version admitted once can
/// stop being runnable only through the runner's own configuration (a
/// resume under a runner without `RUNNER_TELO_UNRELEASED_IMAGE`), and then
/// the start fails saying so.
fn pin_releases(source: &TeloImageSource, apps: &[AppSpec]) -> Result<TeloPins, StartError> {
    let mut pins = TeloPins::default();
    for app in apps {
        if let Some(version) = &app.telo {
            let pin = source
                .pin(&app_container(&app.name), version)
                .map_err(|reason| {
                    StartError::new(
                        StartStage::Start,
                        format!("app '{}' cannot run telo {version}: {reason}", app.name),
                    )
                })?;
            pins.push(pin);
        }
    }
    Ok(pins)
}

/// How a new pod's workspace is filled once its service answers.
enum Fill {
    Seed(Vec<runner_core::types::BundleFile>),
    Restore(Vec<WorkspaceCheckpointFile>),
}

/// Starts (seeded) or resumes session `spec`.
pub async fn start(
    wctx: Arc<WatchContext>,
    spec: WatchSpec,
    start: WatchStart,
    sink: SessionSink,
) -> Result<Arc<KubeWatch>, StartError> {
    let id = spec.session_id.clone();
    let (record, fill) = match &start {
        WatchStart::Seed(bundle) => {
            let bundle = bundle.clone();
            let record = WatchRecord {
                spec: spec.clone(),
                generation: 0,
                token: hex::encode(rand::random::<[u8; TOKEN_BYTES]>()),
                pooled: None,
            };
            wctx.checkpoints.create(&record).await.map_err(|err| {
                api_failure(
                    err,
                    StartStage::Create,
                    "could not record the watch session",
                )
            })?;
            (record, Some(Fill::Seed(bundle.files)))
        }
        WatchStart::Resume | WatchStart::Adopt => {
            let loaded = wctx
                .checkpoints
                .load(&id)
                .await
                .map_err(|reason| StartError::new(StartStage::Resume, reason))?;
            let gone = || StartError::new(StartStage::Resume, "the session's checkpoint is gone");
            let Some((mut record, files)) = loaded else {
                return Err(gone());
            };
            // A pod left running is taken over whether or not its workspace
            // was ever checkpointed; only a resume needs the files.
            if files.is_none() && matches!(start, WatchStart::Resume) {
                return Err(gone());
            }
            if record.spec != spec {
                record.spec = spec.clone();
                if let Err(err) = wctx.checkpoints.save_record(&record).await {
                    warn!(session_id = %id, error = %err, "could not record the resumed session");
                }
            }
            (record, files.map(Fill::Restore))
        }
    };
    let adopting = matches!(start, WatchStart::Adopt);
    let seeding = matches!(fill, Some(Fill::Seed(_)));
    let watch = Arc::new(KubeWatch {
        wctx: wctx.clone(),
        id: id.clone(),
        sink: sink.clone(),
        record: Mutex::new(record),
        live: Mutex::new(None),
        ops: tokio::sync::Mutex::new(()),
        stopping: AtomicBool::new(false),
    });
    let brought_up = {
        let _op = watch.ops.lock().await;
        if adopting && watch.adopt(&spec.apps).await {
            Ok(())
        } else {
            match fill {
                Some(fill) => watch.bring_up(spec.apps.clone(), fill).await,
                None => Err(StartError::new(
                    StartStage::Resume,
                    "the session's pod could not be taken over, and its workspace was never checkpointed",
                )),
            }
        }
    };
    if let Err(err) = brought_up {
        if seeding && let Err(err) = wctx.checkpoints.delete(&id).await {
            warn!(session_id = %id, error = %err, "could not delete the record of a watch session that failed to start");
        }
        return Err(err);
    }
    info!(session_id = %id, apps = spec.apps.len(), "watch session running");
    Ok(watch)
}

/// The pod of a session while it runs.
struct Live {
    pod: String,
    client: WorkspaceClient,
    apps: Vec<AppSpec>,
    terminals: Vec<(String, Terminal)>,
    /// Ends the pod's relays, probes, route follow and pod follower.
    teardown: CancellationToken,
    /// The runner took the pod down: its end is not the session's failure.
    ours: Arc<AtomicBool>,
    /// Held until the pod is gone; dropping it ends the pod-state readers.
    subscription: tokio::sync::Mutex<Option<PodSubscription>>,
}

pub struct KubeWatch {
    wctx: Arc<WatchContext>,
    id: String,
    sink: SessionSink,
    record: Mutex<WatchRecord>,
    live: Mutex<Option<Arc<Live>>>,
    /// One bring-up, take-down or app-set change at a time.
    ops: tokio::sync::Mutex<()>,
    stopping: AtomicBool,
}

impl KubeWatch {
    fn ctx(&self) -> &Arc<SessionContext> {
        &self.wctx.session
    }

    fn live(&self) -> Option<Arc<Live>> {
        lock(&self.live).clone()
    }

    fn client(&self) -> Result<WorkspaceClient, WorkspaceFailure> {
        self.live()
            .map(|live| live.client.clone())
            .ok_or_else(|| WorkspaceFailure::unavailable("the session's pod is not running"))
    }

    /// Creates the pod for `apps`, fills its workspace and reports
    /// `running`. On failure the pod is taken down again.
    async fn bring_up(&self, apps: Vec<AppSpec>, fill: Fill) -> Result<(), StartError> {
        let ctx = self.ctx().clone();
        let name = watch_pod_name(&self.id);
        let (env, image, pull_policy, agent) = {
            let record = lock(&self.record);
            (
                record.spec.env.clone(),
                record.spec.config.image.clone(),
                record.spec.config.pull_policy,
                record.spec.agent_launch.clone(),
            )
        };
        let telo_pins = pin_releases(&self.wctx.telo_images, &apps)?;
        if let Some(pools) = self.wctx.warm.as_ref().filter(|p| p.has_watch_pools()) {
            // The one app's image: its release's, or the session's.
            let (app_image, app_pull) = match apps
                .first()
                .and_then(|app| telo_pins.of_container(&app_container(&app.name)))
            {
                Some(pin) => (pin.image.clone(), pin.pull_policy),
                None => (
                    crate::pod::spec::image_or_default(&image, &self.wctx.settings),
                    pull_policy,
                ),
            };
            let misfit = shape_misfit(
                &apps,
                agent.is_some(),
                &app_image,
                app_pull,
                pools.pools_watch(&app_image),
            );
            let message = match misfit {
                None => {
                    let claimed = pools
                        .claim_watch(
                            &app_image,
                            &self.id,
                            &apps[0].name,
                            self.wctx.resources.ttl_seconds,
                        )
                        .await;
                    pools.count_watch_start(&app_image, claimed.is_some());
                    if let Some(claimed) = claimed {
                        return self.bring_up_pooled(apps, fill, claimed).await;
                    }
                    "No warm pod is ready; starting one".to_owned()
                }
                Some(reason) => {
                    format!("No warm pod for this session's shape ({reason}); starting one")
                }
            };
            self.sink.progress(RunPhase::Provision, &message, None);
        }
        // A cold pod is `telo-watch-<id>` with `app-<name>` containers,
        // and a token of its own (a pooled pod's went with that pod).
        let (token, forgot_pooled) = {
            let mut record = lock(&self.record);
            let forgot = record.pooled.take().is_some();
            if forgot {
                record.token = hex::encode(rand::random::<[u8; TOKEN_BYTES]>());
            }
            (record.token.clone(), forgot.then(|| record.clone()))
        };
        if let Some(record) = forgot_pooled
            && let Err(err) = self.wctx.checkpoints.save_record(&record).await
        {
            warn!(session_id = %self.id, error = %api_reason(&err), "could not record the session's new pod");
        }
        let mut env_secret = PodEnvSecret::for_pod(&name);
        let pod = build_watch_pod(
            &self.wctx.settings,
            &WatchPodInput {
                session_id: &self.id,
                apps: &apps,
                env: &env,
                image: &image,
                pull_policy,
                telo_pins: &telo_pins,
                workspace_image: &self.wctx.workspace_image,
                token: &token,
                workspace_limits: &limit_env(&self.wctx.workspace_limits),
                resources: &self.wctx.resources,
                agent: agent.as_ref(),
            },
            &mut env_secret,
        );
        let mut subscription = subscribe_pod(&ctx, &self.id, &name).naming_telo(telo_pins);
        let pools = self.wctx.warm.as_deref();
        ctx.env_secrets
            .create_pod(&env_secret, &self.id, &name, || {
                create_pod_giving_way(&ctx.pods, pools, &pod)
            })
            .await
            .map_err(PodCreateError::into_start_error)?;
        let ours = Arc::new(AtomicBool::new(false));
        match self
            .serve(&ctx, &name, &token, apps, fill, &mut subscription, &ours)
            .await
        {
            Ok(live) => {
                *live.subscription.lock().await = Some(subscription);
                *lock(&self.live) = Some(live);
                Ok(())
            }
            Err(err) => {
                ours.store(true, Ordering::Release);
                take_down_pod(&ctx, &name, subscription).await;
                Err(err)
            }
        }
    }

    /// Brings the session up on `claimed`, a pooled pod: the session record
    /// names the pod and maps the app to its container, the workspace is
    /// filled and the app attached as on a cold pod, then the launch file
    /// is written and the go-ahead typed into the app's terminal (so not a
    /// byte of the kernel's output comes before the attach).
    async fn bring_up_pooled(
        &self,
        apps: Vec<AppSpec>,
        fill: Fill,
        claimed: Claimed,
    ) -> Result<(), StartError> {
        let ctx = self.ctx().clone();
        let name = claimed.pod_name.clone();
        let (record, env) = {
            let mut record = lock(&self.record);
            record.token = claimed.token.clone();
            record.pooled = Some(PooledPod {
                pod: name.clone(),
                app: apps[0].name.clone(),
                container: POOLED_APP_CONTAINER.to_owned(),
            });
            (record.clone(), record.spec.env.clone())
        };
        if let Err(err) = self.wctx.checkpoints.save_record(&record).await {
            warn!(session_id = %self.id, error = %api_reason(&err), "could not record the session's pooled pod");
        }
        self.sink
            .progress(RunPhase::Provision, "Starting on a warm pod", None);
        let entry = apps[0].entry_relative_path.clone();
        let mut subscription = subscribe_pod(&ctx, &self.id, &name);
        let ours = Arc::new(AtomicBool::new(false));
        let served = self
            .serve(
                &ctx,
                &name,
                &claimed.token,
                apps,
                fill,
                &mut subscription,
                &ours,
            )
            .await;
        let launched = match served {
            Ok(live) => launch_pooled(&live, &env, &entry).await.map(|()| live),
            Err(err) => Err(err),
        };
        match launched {
            Ok(live) => {
                *live.subscription.lock().await = Some(subscription);
                *lock(&self.live) = Some(live);
                info!(session_id = %self.id, pod = %name, "watch session started on a pooled pod");
                Ok(())
            }
            Err(err) => {
                ours.store(true, Ordering::Release);
                take_down_pod(&ctx, &name, subscription).await;
                Err(err)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn serve(
        &self,
        ctx: &Arc<SessionContext>,
        name: &str,
        token: &str,
        apps: Vec<AppSpec>,
        fill: Fill,
        subscription: &mut PodSubscription,
        ours: &Arc<AtomicBool>,
    ) -> Result<Arc<Live>, StartError> {
        let sink = &self.sink;
        let pod = match wait_until_running(ctx, sink, subscription).await? {
            Arrival::Running(pod) => pod,
            Arrival::Finished(pod) => {
                let phase = PodPhase::of(&pod).map_or("Unknown", PodPhase::as_str);
                return Err(start_failed(format!("pod reached {phase} before serving")));
            }
        };
        let ip =
            pod_ip(&pod).ok_or_else(|| start_failed("the pod runs without an IP".to_owned()))?;
        sink.progress(RunPhase::Boot, "Starting workspace", None);
        let client = WorkspaceClient::new(
            ctx.http.clone(),
            SocketAddr::new(ip, WORKSPACE_PORT),
            token.to_owned(),
        )
        .with_limits(&self.wctx.workspace_limits);
        wait_for_workspace(&client, sink).await?;
        match fill {
            Fill::Seed(files) => {
                client.seed(&files).await.map_err(|err| {
                    StartError::new(
                        StartStage::Bundle,
                        format!("could not seed the workspace: {}", err.message),
                    )
                })?;
                // The first checkpoint at once: a session whose runner dies
                // before the first periodic one is still resumable.
                let record = lock(&self.record).clone();
                if let Err(err) = self.wctx.checkpoints.save_from(&record, &client).await {
                    warn!(session_id = %self.id, error = %err, "could not store the seeded workspace as the first checkpoint");
                }
            }
            Fill::Restore(files) => client.restore(&files).await.map_err(|err| {
                StartError::new(
                    StartStage::Resume,
                    format!("could not restore the workspace: {}", err.message),
                )
            })?,
        }
        self.go_live(ctx, name, &pod, ip, client, apps, subscription, ours)
            .await
    }

    /// A pod whose workspace is filled: its apps attached, relayed, probed
    /// and published, `running` reported, the pod followed to its end.
    #[allow(clippy::too_many_arguments)]
    async fn go_live(
        &self,
        ctx: &Arc<SessionContext>,
        name: &str,
        pod: &Pod,
        ip: IpAddr,
        client: WorkspaceClient,
        apps: Vec<AppSpec>,
        subscription: &PodSubscription,
        ours: &Arc<AtomicBool>,
    ) -> Result<Arc<Live>, StartError> {
        let sink = &self.sink;
        let teardown = sink.ended().child_token();
        let containers: Vec<String> = {
            let record = lock(&self.record);
            apps.iter()
                .map(|app| record.container_of(&app.name))
                .collect()
        };
        let mut terminals = Vec::with_capacity(apps.len());
        for (app, container) in apps.iter().zip(&containers) {
            let output = Output::app(sink.clone(), &app.name, container.clone(), app.io);
            terminals.push((
                app.name.clone(),
                terminal::attach_output(&ctx.pods, name, output).await,
            ));
        }
        let ports: Vec<PortMapping> = apps.iter().flat_map(|a| a.ports.iter().copied()).collect();
        // The agent's port joins the session's routes (the manifest won
        // any clash before the session existed).
        let agent_port = lock(&self.record)
            .spec
            .agent_launch
            .as_ref()
            .map(|agent| PortMapping {
                port: agent.port,
                protocol: runner_core::types::PortProtocol::Tcp,
            });
        // Ports the kernels resolve from now on are published live; set
        // before the relays start, which carry the kernels' news.
        if let Some(router) = &ctx.router {
            sink.route_ports(Arc::new(crate::routing::live::LivePorts::new(
                router.clone(),
                &self.id,
                name,
                pod.metadata.uid.as_deref().unwrap_or_default(),
                agent_port.into_iter().collect(),
                ctx.tasks.clone(),
                teardown.clone(),
            )));
        }
        for (index, app) in apps.iter().enumerate() {
            self.relay_app(ctx, ip, index, app, &teardown);
        }
        let published: Vec<PortMapping> = ports.iter().copied().chain(agent_port).collect();
        let routes = match &ctx.router {
            Some(router) if !published.is_empty() => {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                Some(
                    router
                        .publish_session(&self.id, &published, name, uid)
                        .await,
                )
            }
            _ => None,
        };
        let base_domain = ctx.router.as_ref().map(|router| router.base_domain());
        sink.status(RunStatus::Running {
            endpoints: Some(endpoints_for(base_domain, &self.id, &ports)),
            inspect_url: None,
            agent: agent_port.and_then(|port| {
                endpoints_for(base_domain, &self.id, &[port])
                    .into_iter()
                    .next()
            }),
        });
        if let Some(routes) = routes {
            routes.follow_until(sink.clone(), teardown.clone());
        }
        ctx.tasks.spawn(follow_watch_pod(
            sink.clone(),
            subscription.pods(),
            apps.iter().cloned().zip(containers).collect(),
            teardown.clone(),
            ours.clone(),
        ));
        Ok(Arc::new(Live {
            pod: name.to_owned(),
            client,
            apps,
            terminals,
            teardown,
            ours: ours.clone(),
            subscription: tokio::sync::Mutex::new(None),
        }))
    }

    /// One app's debug stream (run events, resolved ports) and probes.
    fn relay_app(
        &self,
        ctx: &Arc<SessionContext>,
        ip: IpAddr,
        index: usize,
        app: &AppSpec,
        teardown: &CancellationToken,
    ) {
        Observer {
            tasks: &ctx.tasks,
            sink: &self.sink,
            reach: Reach::Address(ip),
            stop: teardown,
        }
        .observe_app(app, inspect_port_for(index));
    }

    /// Takes over the pod a previous runner left running, if it still runs
    /// and its workspace answers; otherwise takes it down (the caller then
    /// resumes from the checkpoint).
    async fn adopt(&self, apps: &[AppSpec]) -> bool {
        let ctx = self.ctx().clone();
        let (name, token) = {
            let record = lock(&self.record);
            (record.pod_name(), record.token.clone())
        };
        let subscription = subscribe_pod(&ctx, &self.id, &name);
        let state = subscription.pods().borrow().clone();
        let running = match &state {
            PodState::Present(pod)
                if PodPhase::of(pod) == Some(PodPhase::Running)
                    && pod.metadata.deletion_timestamp.is_none() =>
            {
                pod_ip(pod).map(|ip| (pod.clone(), ip))
            }
            _ => None,
        };
        let ours = Arc::new(AtomicBool::new(false));
        if let Some((pod, ip)) = running {
            let client =
                WorkspaceClient::new(ctx.http.clone(), SocketAddr::new(ip, WORKSPACE_PORT), token)
                    .with_limits(&self.wctx.workspace_limits);
            if client.health().await {
                match self
                    .go_live(
                        &ctx,
                        &name,
                        &pod,
                        ip,
                        client,
                        apps.to_vec(),
                        &subscription,
                        &ours,
                    )
                    .await
                {
                    Ok(live) => {
                        *live.subscription.lock().await = Some(subscription);
                        *lock(&self.live) = Some(live);
                        info!(session_id = %self.id, "adopted a watch pod left running");
                        return true;
                    }
                    Err(err) => {
                        warn!(session_id = %self.id, error = %err, "could not adopt a watch pod; resuming from its checkpoint");
                    }
                }
            }
        }
        ours.store(true, Ordering::Release);
        if !matches!(state, PodState::Gone | PodState::Unknown) {
            take_down_pod(&ctx, &name, subscription).await;
        }
        false
    }

    /// Takes the current pod down and waits until it is gone.
    async fn take_down(&self) {
        let Some(live) = lock(&self.live).take() else {
            return;
        };
        live.ours.store(true, Ordering::Release);
        live.teardown.cancel();
        let subscription = live.subscription.lock().await.take();
        let ctx = self.ctx().clone();
        match subscription {
            Some(subscription) => take_down_pod(&ctx, &live.pod, subscription).await,
            None => {
                if let Err(err) = delete_pod(&ctx.pods, &live.pod).await {
                    warn!(pod = %live.pod, error = %err, "could not delete a watch pod");
                }
            }
        }
    }

    /// The workspace's files, stored as the session's checkpoint.
    async fn save_checkpoint(&self) -> Result<(), WorkspaceFailure> {
        let client = self.client()?;
        let record = lock(&self.record).clone();
        self.wctx
            .checkpoints
            .save_from(&record, &client)
            .await
            .map_err(|err| WorkspaceFailure::unavailable(err.to_string()))
    }
}

fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
}

/// The limits as the workspace service reads them.
pub(crate) fn limit_env(limits: &runner_workspace::WorkspaceLimits) -> Vec<(String, String)> {
    [
        (
            "RUNNER_WORKSPACE_MAX_FILE_BYTES",
            limits.max_file_bytes.to_string(),
        ),
        (
            "RUNNER_WORKSPACE_MAX_CHANGE_BYTES",
            limits.max_change_set_bytes.to_string(),
        ),
        (
            "RUNNER_WORKSPACE_MAX_BYTES",
            limits.max_workspace_bytes.to_string(),
        ),
        ("RUNNER_WORKSPACE_MAX_FILES", limits.max_files.to_string()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

/// Polls the workspace service until it answers.
async fn wait_for_workspace(
    client: &WorkspaceClient,
    sink: &SessionSink,
) -> Result<(), StartError> {
    let stop = sink.stop_requested();
    let deadline = tokio::time::Instant::now() + WORKSPACE_READY_TIMEOUT;
    loop {
        if client.health().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StartError::new(
                StartStage::Start,
                "workspace container did not become ready: no response",
            ));
        }
        tokio::select! {
            () = tokio::time::sleep(WORKSPACE_POLL) => {}
            () = stop.cancelled() => return Err(StartError::cancelled()),
        }
    }
}

/// Starts the kernel of a pooled pod gone live: its launch file written
/// through the workspace service, then the go-ahead typed into its app's
/// terminal, which needs the attach (without one it would never start).
async fn launch_pooled(
    live: &Live,
    env: &[(String, String)],
    entry: &str,
) -> Result<(), StartError> {
    let Some((_, terminal)) = live.terminals.first().filter(|(_, t)| t.is_attached()) else {
        return Err(StartError::new(
            StartStage::Start,
            "could not attach to the warm pod's app terminal to start the kernel",
        ));
    };
    let launch = WorkspaceChangeSet {
        write: vec![runner_core::watch_types::WorkspaceWrite {
            path: LAUNCH_PATH.to_owned(),
            content: watch_launch_file(env, entry),
            encoding: None,
        }],
        delete: Vec::new(),
    };
    live.client.apply(&launch).await.map_err(|err| {
        StartError::new(
            StartStage::Start,
            format!(
                "could not start the kernel on its warm pod: {}",
                err.message
            ),
        )
    })?;
    terminal.write_stdin(Bytes::from_static(GO_AHEAD));
    Ok(())
}

/// Deletes the pod and waits (bounded) until the watch says it is gone.
async fn take_down_pod(ctx: &Arc<SessionContext>, name: &str, subscription: PodSubscription) {
    if let Err(err) = delete_pod(&ctx.pods, name).await {
        warn!(pod = name, error = %err, "could not delete a watch pod");
    }
    let mut pods = subscription.pods();
    let bound = ctx.stop_grace.saturating_add(GONE_SETTLE);
    let gone = pods.wait_for(|state| matches!(state, PodState::Gone));
    if tokio::time::timeout(bound, gone).await.is_err() {
        warn!(
            pod = name,
            "a watch pod was not gone within its grace period"
        );
    }
    drop(subscription);
}

/// Follows a running watch pod: an app container that ended closes that
/// app's generation; the pod ending or vanishing without the runner asking
/// fails the session.
async fn follow_watch_pod(
    sink: SessionSink,
    mut pods: watch::Receiver<PodState>,
    apps: Vec<(AppSpec, String)>,
    teardown: CancellationToken,
    ours: Arc<AtomicBool>,
) {
    let mut ended: Vec<String> = Vec::new();
    loop {
        let state = pods.borrow_and_update().clone();
        let failure = match &state {
            PodState::Present(pod) => {
                note_ended_apps(&sink, pod, &apps, &mut ended);
                if pod.metadata.deletion_timestamp.is_some() {
                    Some(DELETED_OUTSIDE.to_owned())
                } else if is_finished(pod) {
                    let phase = PodPhase::of(pod).map_or("Unknown", PodPhase::as_str);
                    Some(format!("session pod reached {phase}"))
                } else {
                    None
                }
            }
            PodState::Gone => Some(DELETED_OUTSIDE.to_owned()),
            PodState::Unknown => None,
        };
        if let Some(message) = failure {
            if !ours.load(Ordering::Acquire) && !teardown.is_cancelled() {
                info!(session_id = %sink.session_id(), reason = %message, "watch pod ended");
                sink.status(RunStatus::failed(message));
            }
            return;
        }
        tokio::select! {
            changed = pods.changed() => if changed.is_err() { return },
            () = teardown.cancelled() => return,
        }
    }
}

/// App containers (each app's, by the session's mapping) that terminated,
/// each reported once.
fn note_ended_apps(
    sink: &SessionSink,
    pod: &Pod,
    apps: &[(AppSpec, String)],
    ended: &mut Vec<String>,
) {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    for status in statuses.into_iter().flatten() {
        let Some((app, _)) = apps.iter().find(|(_, container)| *container == status.name) else {
            continue;
        };
        let Some(terminated) = status.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
            continue;
        };
        if ended.contains(&app.name) {
            continue;
        }
        ended.push(app.name.clone());
        let code = terminated.exit_code;
        match terminated.reason.as_deref() {
            Some(reason) if reason != "Completed" => sink.app_ended(
                &app.name,
                None,
                Some(format!("application container {reason} (exit code {code})")),
            ),
            _ if code == 0 => sink.app_ended(&app.name, Some(0), None),
            _ => sink.app_ended(
                &app.name,
                None,
                Some(format!("application container exited (code {code})")),
            ),
        }
        sink.app_output(
            &app.name,
            runner_core::watch_types::StreamTag::Tty,
            Bytes::from(format!(
                "\r\n[runner] app '{}' exited (code {code}); change its app set or stop the session to start it again\r\n",
                app.name
            )),
        );
    }
}

#[async_trait]
impl BackendSession for KubeWatch {
    fn write_stdin(&self, bytes: Bytes) {
        if let Some(live) = self.live()
            && let Some((_, terminal)) = live.terminals.first()
        {
            terminal.write_stdin(bytes);
        }
    }

    fn resize(&self, cols: u16, rows: u16) {
        if let Some(live) = self.live()
            && let Some((_, terminal)) = live.terminals.first()
        {
            terminal.resize(cols, rows);
        }
    }

    fn write_app_stdin(&self, app: &str, bytes: Bytes) {
        if let Some(live) = self.live()
            && let Some((_, terminal)) = live.terminals.iter().find(|(name, _)| name == app)
        {
            terminal.write_stdin(bytes);
        }
    }

    fn resize_app(&self, app: &str, cols: u16, rows: u16) {
        if let Some(live) = self.live()
            && let Some((_, terminal)) = live.terminals.iter().find(|(name, _)| name == app)
        {
            terminal.resize(cols, rows);
        }
    }

    /// The pod is left running for the next runner (it adopts it from the
    /// record); the marks go on the record, which that runner claims.
    async fn hand_over(&self, marks: Vec<runner_core::session::OutputMarks>) {
        if marks.is_empty() {
            return;
        }
        let name = checkpoint::secret_name(&self.id);
        if let Err(err) =
            crate::session::marks::leave(self.wctx.checkpoints.api(), &name, &marks).await
        {
            warn!(session_id = %self.id, error = %api_reason(&err), "could not leave the output marks on the watch record; a client resuming the session is told of a gap");
        }
    }

    /// Takes the pod down in the background and reports `stopped` once it
    /// is gone; the checkpoint goes with the session.
    async fn stop(&self) -> Result<(), StopError> {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Err(err) = self.wctx.checkpoints.delete(&self.id).await {
            warn!(session_id = %self.id, error = %err, "could not delete a stopped watch session's checkpoint");
        }
        let live = lock(&self.live).take();
        let sink = self.sink.clone();
        let ctx = self.ctx().clone();
        self.ctx().tasks.spawn(async move {
            if let Some(live) = live {
                live.ours.store(true, Ordering::Release);
                live.teardown.cancel();
                let subscription = live.subscription.lock().await.take();
                match subscription {
                    Some(subscription) => take_down_pod(&ctx, &live.pod, subscription).await,
                    None => {
                        let _ = delete_pod(&ctx.pods, &live.pod).await;
                    }
                }
            }
            sink.status(RunStatus::Stopped);
        });
        Ok(())
    }
}

#[async_trait]
impl WatchWorkload for KubeWatch {
    async fn tree(&self) -> Result<WorkspaceTree, WorkspaceFailure> {
        self.client()?.tree().await
    }

    async fn read_file(&self, path: &str) -> Result<WorkspaceFileContent, WorkspaceFailure> {
        self.client()?.read_file(path).await
    }

    async fn apply(
        &self,
        changes: WorkspaceChangeSet,
    ) -> Result<WorkspaceApplyResult, WorkspaceFailure> {
        self.client()?.apply(&changes).await
    }

    async fn reload(&self, app: &str) -> Result<(), WorkspaceFailure> {
        let live = self
            .live()
            .ok_or_else(|| WorkspaceFailure::unavailable("the session's pod is not running"))?;
        let entry = live
            .apps
            .iter()
            .find(|running| running.name == app)
            .map(|running| running.entry_relative_path.clone())
            .ok_or_else(|| WorkspaceFailure::unknown_app(app))?;
        live.client.touch(&entry).await
    }

    async fn checkpoint(&self) -> Result<(), WorkspaceFailure> {
        let _op = self.ops.lock().await;
        self.save_checkpoint().await
    }

    async fn set_apps(&self, apps: Vec<AppSpec>) -> Result<(), StartError> {
        let _op = self.ops.lock().await;
        let files = self
            .client()
            .map_err(|err| StartError::new(StartStage::Start, err.message))?
            .snapshot()
            .await
            .map_err(|err| {
                StartError::new(
                    StartStage::Start,
                    format!(
                        "could not keep the workspace for the new app set: {}",
                        err.message
                    ),
                )
            })?;
        self.take_down().await;
        let record = {
            let mut record = lock(&self.record);
            record.spec.apps = apps.clone();
            record.clone()
        };
        if let Err(err) = self.wctx.checkpoints.save_record(&record).await {
            warn!(session_id = %self.id, error = %api_reason(&err), "could not record the new app set");
        }
        self.bring_up(apps, Fill::Restore(files)).await
    }

    async fn suspend(&self) -> Result<(), StopError> {
        let _op = self.ops.lock().await;
        self.save_checkpoint().await.map_err(|err| StopError {
            message: err.message,
        })?;
        self.take_down().await;
        info!(session_id = %self.id, "watch session suspended; its checkpoint is kept");
        Ok(())
    }
}

/// Watch sessions a previous runner left (boot), each with its generation
/// counted up. A session whose pod still runs and answers is checkpointed
/// from that pod (its newest files) and adopted as it runs; any other is
/// listed `suspended` (its pod, if any, taken down), resumable from its
/// checkpoint.
pub async fn recover_suspended(
    wctx: &Arc<WatchContext>,
    held: &HeldSessions,
) -> Vec<SuspendedSession> {
    let ctx = wctx.session.clone();
    ctx.pod_informer.wait_synced().await;
    let listed = match wctx.checkpoints.list().await {
        Ok(listed) => listed,
        Err(err) => {
            warn!(error = %api_reason(&err), "could not list the watch sessions kept in the cluster");
            return Vec::new();
        }
    };
    let mut kept = Vec::new();
    let mut known = Vec::new();
    // The pod each kept session's record names.
    let mut pod_names: Vec<String> = Vec::new();
    for checkpoint::Kept {
        mut record,
        mut has_files,
        links,
        meta,
    } in listed
    {
        let id = record.spec.session_id.clone();
        known.push(id.clone());
        let name = record.pod_name();
        pod_names.push(name.clone());
        if held(&id) {
            // Created by this runner since it booted: not a leftover.
            continue;
        }
        // Claimed, the record is read as written: with the output marks
        // its previous owner left when it handed the session over.
        let meta = match &wctx.replicas {
            Some(replicas) => match replicas.claim_object(wctx.checkpoints.api(), &meta).await {
                Some(claimed) => claimed.metadata,
                // A live peer's, or claimed by another survivor first.
                None => continue,
            },
            None => meta,
        };
        let output_marks = crate::session::marks::decode(meta.annotations.as_ref());
        let live = ctx
            .pod_informer
            .pods()
            .into_iter()
            .find(|pod| pod.metadata.name.as_deref() == Some(name.as_str()));
        let mut running = false;
        if let Some(pod) = live {
            let serving = PodPhase::of(&pod) == Some(PodPhase::Running)
                && pod.metadata.deletion_timestamp.is_none();
            if let Some(ip) = pod_ip(&pod) {
                let client = WorkspaceClient::new(
                    ctx.http.clone(),
                    SocketAddr::new(ip, WORKSPACE_PORT),
                    record.token.clone(),
                )
                .with_limits(&wctx.workspace_limits);
                // Checkpointed first: its newest files survive whatever
                // happens to the pod next.
                match checkpoint_with_retries(wctx, &record, &client).await {
                    Ok(()) => {
                        has_files = true;
                        running = serving;
                    }
                    Err(err) => {
                        // A pod that answers is taken over all the same:
                        // deleting it would lose exactly the files the
                        // checkpoint could not hold. The session's clients
                        // hear of it when the next checkpoint fails too.
                        running = serving && client.health().await;
                        if running {
                            warn!(session_id = %id, error = %err, "could not checkpoint a watch pod left running; taking it over as it runs");
                        } else {
                            warn!(session_id = %id, error = %err, "a watch pod left running did not answer; its last checkpoint stays");
                        }
                    }
                }
            }
            if !running {
                let subscription = subscribe_pod(&ctx, &id, &name);
                take_down_pod(&ctx, &name, subscription).await;
            }
        }
        if !has_files && !running {
            // Never checkpointed (the runner ended while it started) and no
            // pod to take over: nothing to resume from.
            warn!(session_id = %id, "dropping a watch session that was never checkpointed");
            if let Err(err) = wctx.checkpoints.delete(&id).await {
                warn!(session_id = %id, error = %api_reason(&err), "could not delete a watch session record");
            }
            continue;
        }
        record.generation = record.generation.saturating_add(1);
        if let Err(err) = wctx.checkpoints.save_record(&record).await {
            warn!(session_id = %id, error = %api_reason(&err), "could not record a recovered watch session");
        }
        kept.push(SuspendedSession {
            generation: record.generation,
            spec: record.spec,
            running,
            links,
            // Only a workload that still runs continues the same output.
            output_marks: if running { output_marks } else { Vec::new() },
        });
    }
    // Watch pods without a record, or not the pod their session's record
    // names (a pooled pod claimed just before the runner ended, before the
    // record said so): nothing can resume them.
    for pod in ctx.pod_informer.pods() {
        let is_watch = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::pod::labels::MODE_LABEL))
            .is_some_and(|mode| mode == crate::pod::labels::WATCH_MODE);
        let session = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::pod::labels::SESSION_ID_LABEL))
            .cloned()
            .unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let stray = !known.contains(&session) || !pod_names.contains(&name);
        let peers = wctx
            .replicas
            .as_ref()
            .is_some_and(|replicas| replicas.named_elsewhere(&session));
        if is_watch && stray && !held(&session) && !peers {
            info!(pod = %name, "deleting a watch pod without a session record");
            if let Err(err) = delete_pod(&ctx.pods, &name).await {
                warn!(pod = %name, error = %err, "could not delete a leftover watch pod");
            }
        }
    }
    kept
}

/// A left-running pod's files checkpointed, asked for a few times: a pod
/// that answers late (a busy node) still gets its newest files kept. A
/// workspace too large to keep is not asked for again.
async fn checkpoint_with_retries(
    wctx: &WatchContext,
    record: &WatchRecord,
    client: &WorkspaceClient,
) -> Result<(), CheckpointError> {
    let mut attempt = 1;
    loop {
        match wctx.checkpoints.save_from(record, client).await {
            Ok(()) => return Ok(()),
            Err(err @ CheckpointError::TooLarge { .. }) => return Err(err),
            Err(err) if attempt >= RECOVERY_SNAPSHOT_ATTEMPTS => return Err(err),
            Err(err) => {
                warn!(error = %err, attempt, "a watch pod left running did not give its files; asking again");
                tokio::time::sleep(WORKSPACE_POLL * attempt).await;
                attempt += 1;
            }
        }
    }
}
