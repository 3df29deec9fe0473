//! The kubelet simulator: schedules pods onto the one node, runs their
//! containers as real local processes — or, with the docker runtime, as
//! real containers of a docker engine — (init containers in order, then the
//! main containers), reports status like a kubelet, enforces
//! `activeDeadlineSeconds` and restart policies, and stops every container
//! when a pod is deleted.

pub mod bundle_fetch;
mod container;
pub mod engine;
mod engine_launch;
mod engine_spec;
mod env;
pub mod images;
pub mod ips;
mod launch;
mod lifecycle;
pub mod paths;
pub mod podnet;
mod probes;
pub mod process;
mod pull;
mod spec;
pub mod status;
pub mod streams;
mod volumes;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use engine::{Engine, ImageInfo};
use k8s_openapi::api::core::v1::Container;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{EventRecorder, EventType};
use crate::kinds;
use crate::meta;
use crate::storage::defaults::NODE_NAME;
use crate::storage::registry::Registry;
use crate::storage::store::{EventKind, Store};
use images::{ImageBehaviour, ImageTable};
use paths::Mounts;
use process::{ProcessRegistry, SpawnSpec};
use spec::PodView;
use status::{ContainerModel, ContainerState, Phase, PodModel};
use streams::{ContainerStreams, StreamKind};

/// First and longest restart back-off, as the kubelet's.
const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How long an image "pull" of a known image takes.
pub const DEFAULT_PULL_DELAY: Duration = Duration::from_millis(20);
/// The longest a real apiserver takes, after answering an attach's upgrade,
/// to dial the kubelet and have the runtime hook the container's stream up
/// (one loopback round trip or two; a loaded node takes longer).
pub const DEFAULT_ATTACH_DELAY: Duration = Duration::from_millis(5);
/// Delay between ErrImagePull and the first ImagePullBackOff report.
const PULL_ERROR_SETTLE: Duration = Duration::from_secs(1);

/// How long a cluster takes for what the simulator otherwise does at once:
/// the scheduler's binding, the pod sandbox (network, volumes), and each
/// container's start. All zero by default; [`Latency::CLUSTER`] is a
/// profile taken from published figures (kube-sim's README, "Latency").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    pub schedule: Duration,
    pub sandbox: Duration,
    pub container_start: Duration,
}

impl Latency {
    /// A pod of one pre-pulled container starts in about 0.9 s (create →
    /// running, as Kubernetes' own density measurements put the median on a
    /// lightly loaded cluster); split here as a 0.1 s binding, a 0.6 s
    /// sandbox and 0.15 s per container start.
    pub const CLUSTER: Latency = Latency {
        schedule: Duration::from_millis(100),
        sandbox: Duration::from_millis(600),
        container_start: Duration::from_millis(150),
    };
}

pub struct KubeletConfig {
    pub images: ImageTable,
    pub fake_telo: Option<PathBuf>,
    pub root: PathBuf,
    pub pull_delay: Duration,
    pub latency: Latency,
    /// The docker runtime's engine; `None` runs containers as processes.
    pub engine: Option<Arc<Engine>>,
    /// The pods' bridge (isolated pod network); `None`: the host network.
    pub network: Option<Arc<podnet::Bridge>>,
    /// How a pod's processes reach the apiserver (their service account
    /// token); `None`: they are given no access.
    pub api: Option<PodApiAccess>,
}

/// The apiserver as a pod's processes reach it: what a kubelet mounts as
/// the service account volume, given to a process here as a kubeconfig
/// (`KUBECONFIG`), because a process runs in the host's file system.
#[derive(Clone)]
pub struct PodApiAccess {
    /// `https://<address pods reach>:<port>`.
    pub server: String,
    pub ca_pem: String,
    pub token: String,
}

/// One container's streams: the current instance and the previous one
/// (`kubectl logs --previous`).
#[derive(Default)]
struct ContainerSlot {
    current: Option<Arc<ContainerStreams>>,
    previous: Option<Arc<ContainerStreams>>,
    pgid: Option<i32>,
    /// Stops a container without a process (virtual, built-in).
    stop: Option<CancellationToken>,
    /// The engine's name of the running container (docker runtime): it is
    /// stopped through the engine, not by signalling its client.
    engine: Option<String>,
}

struct PodWorker {
    uid: String,
    ns: String,
    name: String,
    /// Graceful termination requested (deletionTimestamp set).
    stop: CancellationToken,
    /// The pod is gone from the store: kill now, write nothing.
    kill: CancellationToken,
    /// Cancelled once termination began: no restarts or new containers
    /// then, and container loops waiting out a back-off or an image that
    /// will never come wake up on it and end.
    terminating: CancellationToken,
    model: Mutex<Option<PodModel>>,
    /// Held from reading the model to writing the status it renders, so
    /// two containers starting at once cannot write their statuses out of
    /// order: a real kubelet's status manager writes one pod's status from
    /// one place, and the newest always wins.
    publishing: Mutex<()>,
    slots: Mutex<HashMap<String, ContainerSlot>>,
    /// Failed pulls per container, for the back-off.
    pull_failures: Mutex<HashMap<String, u32>>,
    /// `spec.activeDeadlineSeconds` as the pod says now (it may be set or
    /// lowered on a running pod), counted from the pod's start.
    deadline: tokio::sync::watch::Sender<Option<i64>>,
    /// The main containers' loops. They belong to the pod, not to the
    /// future that starts them: that future is dropped as soon as the pod
    /// ends (deleted, past its deadline), while the loops must live on to
    /// record their containers' exits. The pod's task aborts what is left
    /// and joins them once its containers have been stopped.
    containers: Mutex<JoinSet<()>>,
}

impl PodWorker {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, ContainerSlot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_terminating(&self) -> bool {
        self.terminating.is_cancelled()
    }

    /// Records, with `record`, how to stop container `name` that has just
    /// been started — unless the pod began terminating, which is then
    /// answered `false` and the caller stops what it started itself.
    ///
    /// Termination cancels `terminating` before it reads the slots to find
    /// what to stop, and this checks it under the slots' lock: so either
    /// termination sees what is recorded here, or this sees termination.
    /// Without it, a container launched while its pod was being deleted
    /// was never stopped, and its process outlived the pod.
    fn admit(&self, name: &str, record: impl FnOnce(&mut ContainerSlot)) -> bool {
        let mut slots = self.slots();
        if self.is_terminating() {
            return false;
        }
        record(slots.entry(name.to_string()).or_default());
        true
    }

    /// Sleeps for `delay`, or less if the pod begins terminating: a
    /// back-off before a restart or a retry has no point then.
    async fn back_off(&self, delay: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = self.terminating.cancelled() => {}
        }
    }

    /// Waits for the main container loops to end. Once the pod is
    /// terminating they end by themselves after recording their
    /// containers' exits, so waiting here lets the pod's final status carry
    /// them and leaves no loop outliving its pod.
    async fn join_containers(&self) {
        let mut loops =
            std::mem::take(&mut *self.containers.lock().unwrap_or_else(|p| p.into_inner()));
        while loops.join_next().await.is_some() {}
    }
}

pub struct Kubelet {
    registry: Arc<Registry>,
    store: Arc<Store>,
    recorder: Arc<EventRecorder>,
    images: ImageTable,
    fake_telo: Option<PathBuf>,
    root: PathBuf,
    shim_dir: PathBuf,
    pull_delay: Duration,
    latency: Latency,
    /// Pods whose delayed binding is under way (with a schedule latency).
    scheduling: Mutex<HashSet<String>>,
    engine: Option<Arc<Engine>>,
    /// The pods' bridge (isolated pod network); `None`: the host network.
    network: Option<Arc<podnet::Bridge>>,
    /// The node's address as its pods reach it (`status.hostIP`).
    node_ip: Ipv4Addr,
    api: Option<PodApiAccess>,
    pub processes: Arc<ProcessRegistry>,
    workers: Mutex<HashMap<String, Arc<PodWorker>>>,
    /// Every pod's task, so that stopping the kubelet waits for each pod to
    /// have killed its processes and cleaned up its sandbox.
    pods: Mutex<JoinSet<()>>,
    pulled: Mutex<HashSet<String>>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Kubelet {
    pub fn new(
        registry: Arc<Registry>,
        recorder: Arc<EventRecorder>,
        config: KubeletConfig,
        shutdown: CancellationToken,
    ) -> std::io::Result<Arc<Self>> {
        // reqwest is built without a default TLS provider in this workspace;
        // installing ring twice is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let shim_dir = config.root.join("bin");
        std::fs::create_dir_all(&shim_dir)?;
        if let Some(ft) = &config.fake_telo {
            let link = shim_dir.join("telo");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(ft, &link)?;
        }
        Ok(Arc::new(Self {
            store: registry.store.clone(),
            registry,
            recorder,
            images: config.images,
            fake_telo: config.fake_telo,
            root: config.root,
            shim_dir,
            pull_delay: config.pull_delay,
            latency: config.latency,
            scheduling: Mutex::new(HashSet::new()),
            engine: config.engine,
            node_ip: config
                .network
                .as_ref()
                .map_or(Ipv4Addr::LOCALHOST, |b| b.gateway()),
            network: config.network,
            api: config.api,
            processes: Arc::new(ProcessRegistry::default()),
            workers: Mutex::new(HashMap::new()),
            pods: Mutex::new(JoinSet::new()),
            pulled: Mutex::new(HashSet::new()),
            http: reqwest::Client::new(),
            shutdown,
        }))
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PodWorker>>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn process_count(&self) -> usize {
        self.processes.count()
    }

    /// The streams of a container of a live pod (`previous`: the instance
    /// before the last restart).
    pub fn container_streams(
        &self,
        uid: &str,
        container: &str,
        previous: bool,
    ) -> Option<Arc<ContainerStreams>> {
        let worker = self.workers().get(uid).cloned()?;
        let slots = worker.slots();
        let slot = slots.get(container)?;
        if previous {
            slot.previous.clone()
        } else {
            slot.current.clone()
        }
    }

    /// Kills every process now (shutdown).
    pub fn kill_all(&self) {
        for w in self.workers().values() {
            w.kill.cancel();
        }
        self.processes.kill_all();
    }

    /// The docker runtime's engine, if containers run in one.
    pub fn engine(&self) -> Option<&Arc<Engine>> {
        self.engine.as_ref()
    }

    /// The node's address as its pods reach it: the bridge's gateway with
    /// an isolated pod network, else `127.0.0.1`.
    pub fn node_ip(&self) -> Ipv4Addr {
        self.node_ip
    }

    /// The pods' bridge, with an isolated pod network.
    pub fn network(&self) -> Option<&Arc<podnet::Bridge>> {
        self.network.as_ref()
    }

    /// Removes the pods' bridge and whatever is left on it (shutdown,
    /// after the pods have stopped).
    pub fn close_network(&self) {
        if let Some(n) = &self.network {
            n.close();
        }
    }

    /// [`Kubelet::close_network`] for `Drop`: the removal happens in the
    /// background (by the network's guardian).
    pub fn close_network_now(&self) {
        if let Some(n) = &self.network {
            n.release_guardian();
        }
    }

    /// Removes every container the engine still holds for this simulator
    /// and creates none after (shutdown, after the pods have stopped).
    pub async fn close_engine(&self) {
        if let Some(e) = &self.engine {
            e.close().await;
        }
    }

    /// [`Kubelet::close_engine`] for `Drop`: the removal happens in the
    /// background (by the engine's guardian).
    pub fn close_engine_now(&self) {
        if let Some(e) = &self.engine {
            e.close_now();
        }
    }

    /// Follows the pod store until shutdown.
    pub async fn run(self: Arc<Self>) {
        let pods = kinds::pods();
        let mut changes = self.store.subscribe(pods);
        let mut cursor = self.resync();
        loop {
            match self.store.events_since(pods, cursor) {
                Ok(events) => {
                    for ev in events {
                        cursor = ev.rv;
                        match ev.kind {
                            EventKind::Deleted => self.on_deleted(ev.obj.uid()),
                            _ => self.observe(&ev.obj.value),
                        }
                    }
                }
                Err(_) => cursor = self.resync(),
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { break },
                _ = self.shutdown.cancelled() => break,
            }
        }
        self.kill_all();
        let mut pods = std::mem::take(&mut *self.pods.lock().unwrap_or_else(|p| p.into_inner()));
        while pods.join_next().await.is_some() {}
    }

    /// Lists every pod and reconciles workers with it.
    fn resync(self: &Arc<Self>) -> u64 {
        let (objects, rv) = self.store.snapshot(kinds::pods(), None);
        let live: HashSet<String> = objects.iter().map(|o| o.uid().to_string()).collect();
        let gone: Vec<String> = self
            .workers()
            .keys()
            .filter(|uid| !live.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            self.on_deleted(&uid);
        }
        for o in &objects {
            self.observe(&o.value);
        }
        rv
    }

    fn on_deleted(&self, uid: &str) {
        if let Some(w) = self.workers().get(uid) {
            w.kill.cancel();
        }
        self.recorder.forget(uid);
    }

    fn observe(self: &Arc<Self>, pod: &Value) {
        let uid = meta::uid(pod).to_string();
        let node = meta::path_str(pod, "spec.nodeName").unwrap_or("");
        let deleting = meta::deletion_timestamp(pod).is_some();
        if node.is_empty() {
            if !deleting {
                self.schedule_after_latency(pod, &uid);
            }
            return;
        }
        if node != NODE_NAME {
            return;
        }
        let existing = self.workers().get(&uid).cloned();
        match existing {
            Some(w) => {
                if deleting {
                    w.stop.cancel();
                }
                // The deadline may be set, or lowered, while the pod runs.
                let deadline =
                    meta::path(pod, "spec.activeDeadlineSeconds").and_then(Value::as_i64);
                w.deadline.send_if_modified(|current| {
                    let changed = *current != deadline;
                    *current = deadline;
                    changed
                });
            }
            None => {
                let phase = meta::path_str(pod, "status.phase").unwrap_or("Pending");
                let started = meta::path(pod, "status.startTime").is_some();
                if deleting {
                    // Nothing runs for it here: finish the deletion.
                    self.registry.remove_now(
                        kinds::pods(),
                        meta::namespace(pod),
                        meta::name(pod),
                        &uid,
                    );
                    return;
                }
                if started || phase == "Succeeded" || phase == "Failed" {
                    // Already handled by an earlier worker (or another sim).
                    return;
                }
                self.start_worker(pod, &uid);
            }
        }
    }

    /// Reads the pod's spec and starts the task that runs it; a pod whose
    /// spec cannot be read is failed with the reason instead.
    fn start_worker(self: &Arc<Self>, pod: &Value, uid: &str) {
        let view = match PodView::from_stored(pod) {
            Ok(view) => view,
            Err(msg) => return self.fail_unreadable(pod, &msg),
        };
        let worker = Arc::new(PodWorker {
            uid: uid.to_string(),
            ns: meta::namespace(pod).to_string(),
            name: meta::name(pod).to_string(),
            stop: CancellationToken::new(),
            kill: CancellationToken::new(),
            terminating: CancellationToken::new(),
            model: Mutex::new(None),
            publishing: Mutex::new(()),
            deadline: tokio::sync::watch::Sender::new(view.spec.active_deadline_seconds),
            slots: Mutex::new(HashMap::new()),
            pull_failures: Mutex::new(HashMap::new()),
            containers: Mutex::new(JoinSet::new()),
        });
        self.workers().insert(uid.to_string(), worker.clone());
        let kubelet = self.clone();
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        // Reap the pods that have already finished.
        while pods.try_join_next().is_some() {}
        pods.spawn(async move {
            kubelet.clone().run_pod(worker.clone(), view).await;
            kubelet.workers().remove(&worker.uid);
        });
    }

    /// A pod the kubelet cannot read never starts: it is Failed with why,
    /// as a kubelet refusing a pod at admission reports it.
    fn fail_unreadable(&self, pod: &Value, msg: &str) {
        let updated =
            self.registry
                .mutate(kinds::pods(), meta::namespace(pod), meta::name(pod), |p| {
                    if meta::path_str(p, "status.phase") == Some("Failed") {
                        return false;
                    }
                    *meta::path_mut(p, "status.phase") = json!("Failed");
                    *meta::path_mut(p, "status.reason") = json!(spec::UNREADABLE_REASON);
                    *meta::path_mut(p, "status.message") = json!(msg);
                    true
                });
        if let Some(u) = updated {
            self.recorder.record(
                &u.value,
                None,
                EventType::Warning,
                spec::UNREADABLE_REASON,
                msg,
                "kubelet",
            );
        }
    }

    /// Binds `pod` now, or once the schedule latency has passed (one binding
    /// under way per pod, whatever else changes it meanwhile).
    fn schedule_after_latency(self: &Arc<Self>, pod: &Value, uid: &str) {
        if self.latency.schedule.is_zero() {
            return self.schedule(pod);
        }
        if !self
            .scheduling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_owned())
        {
            return;
        }
        let kubelet = self.clone();
        let (ns, name, uid) = (
            meta::namespace(pod).to_owned(),
            meta::name(pod).to_owned(),
            uid.to_owned(),
        );
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        pods.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(kubelet.latency.schedule) => {
                    if let Some(current) = kubelet.store.get(kinds::pods(), &ns, &name)
                        && meta::uid(&current.value) == uid
                        && meta::deletion_timestamp(&current.value).is_none()
                    {
                        kubelet.schedule(&current.value);
                    }
                }
                () = kubelet.shutdown.cancelled() => {}
            }
            kubelet
                .scheduling
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&uid);
        });
    }

    /// The default scheduler: bind to the node (or report why not).
    fn schedule(&self, pod: &Value) {
        let selector = meta::path(pod, "spec.nodeSelector").and_then(Value::as_object);
        let node_labels = self
            .store
            .get(kinds::id("nodes"), "", NODE_NAME)
            .and_then(|n| meta::labels(&n.value).cloned())
            .unwrap_or_default();
        let fits =
            selector.is_none_or(|sel| sel.iter().all(|(k, v)| node_labels.get(k) == Some(v)));
        let ns = meta::namespace(pod).to_string();
        let name = meta::name(pod).to_string();
        if !fits {
            let msg = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.";
            let updated = self.registry.mutate(kinds::pods(), &ns, &name, |p| {
                let conds = json!([{"type": "PodScheduled", "status": "False", "lastProbeTime": null,
                    "lastTransitionTime": meta::now_timestamp(), "reason": "Unschedulable", "message": msg}]);
                if meta::path(p, "status.conditions") == Some(&conds) {
                    return false;
                }
                if meta::path_str(p, "status.conditions").is_none()
                    && meta::path(p, "status.conditions").is_some()
                {
                    return false;
                }
                *meta::path_mut(p, "status.conditions") = conds;
                true
            });
            if let Some(u) = updated {
                self.recorder.record(
                    &u.value,
                    None,
                    EventType::Warning,
                    "FailedScheduling",
                    msg,
                    "default-scheduler",
                );
            }
            return;
        }
        let bound = self.registry.mutate(kinds::pods(), &ns, &name, |p| {
            if meta::path_str(p, "spec.nodeName").is_some_and(|n| !n.is_empty()) {
                return false;
            }
            *meta::path_mut(p, "spec.nodeName") = json!(NODE_NAME);
            *meta::path_mut(p, "status.conditions") = json!([{"type": "PodScheduled", "status": "True",
                "lastProbeTime": null, "lastTransitionTime": meta::now_timestamp()}]);
            true
        });
        if let Some(b) = bound {
            self.recorder.record(
                &b.value,
                None,
                EventType::Normal,
                "Scheduled",
                &format!("Successfully assigned {ns}/{name} to {NODE_NAME}"),
                "default-scheduler",
            );
        }
    }

    /// Writes the worker's model as the pod's status.
    fn publish(&self, w: &PodWorker) {
        if w.kill.is_cancelled() {
            return;
        }
        let _turn = w.publishing.lock().unwrap_or_else(|p| p.into_inner());
        let model = w.model.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(model) = model else { return };
        self.registry.mutate(kinds::pods(), &w.ns, &w.name, |p| {
            if meta::uid(p) != w.uid {
                return false;
            }
            let previous = p.get("status").cloned().unwrap_or(Value::Null);
            let status = status::render(&model, &previous);
            if previous == status {
                return false;
            }
            if let Some(o) = p.as_object_mut() {
                o.insert("status".into(), status);
            }
            true
        });
    }

    fn with_model<R>(&self, w: &PodWorker, f: impl FnOnce(&mut PodModel) -> R) -> Option<R> {
        let mut guard = w.model.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_mut().map(f)
    }

    fn container_model<R>(
        &self,
        w: &PodWorker,
        init: bool,
        idx: usize,
        f: impl FnOnce(&mut ContainerModel) -> R,
    ) -> Option<R> {
        self.with_model(w, |m| {
            let list = if init { &mut m.init } else { &mut m.main };
            list.get_mut(idx).map(f)
        })
        .flatten()
    }

    fn current_pod(&self, w: &PodWorker) -> Option<Value> {
        self.store
            .get(kinds::pods(), &w.ns, &w.name)
            .filter(|o| o.uid() == w.uid)
            .map(|o| o.value.clone())
    }

    fn event(
        &self,
        w: &PodWorker,
        field_path: Option<String>,
        ty: EventType,
        reason: &str,
        message: &str,
    ) {
        if let Some(pod) = self.current_pod(w) {
            self.recorder
                .record(&pod, field_path.as_deref(), ty, reason, message, "kubelet");
        }
    }
}

fn cname(c: &Container) -> &str {
    &c.name
}

fn cimage(c: &Container) -> &str {
    c.image.as_deref().unwrap_or("")
}

fn field_path(init: bool, name: &str) -> String {
    if init {
        format!("spec.initContainers{{{name}}}")
    } else {
        format!("spec.containers{{{name}}}")
    }
}

struct PodCtx {
    pod: PodView,
    ip: Ipv4Addr,
    /// The pod's network namespace (isolated pod network): its processes
    /// run inside it.
    netns: Option<PathBuf>,
    /// The pod's infra container (docker runtime, isolated pod network):
    /// its containers join its network namespace.
    infra: Option<String>,
    sandbox: PathBuf,
    restart_policy: String,
}

enum PullFailure {
    Invalid(String),
    NeverPull(String),
    Failed(String),
}

enum LaunchError {
    /// `CreateContainerConfigError`: the kubelet cannot build the config.
    Config(String),
    /// `CreateContainerError`: the runtime refused to create the container.
    Create(String),
}

impl LaunchError {
    fn reason(&self) -> &'static str {
        match self {
            LaunchError::Config(_) => "CreateContainerConfigError",
            LaunchError::Create(_) => "CreateContainerError",
        }
    }

    fn message(&self) -> &str {
        match self {
            LaunchError::Config(m) | LaunchError::Create(m) => m,
        }
    }
}

/// What a successful pull gives the launch: what the image does (process
/// runtime), or the engine's image (docker runtime).
enum Pulled {
    Behaviour(ImageBehaviour),
    Engine(ImageInfo),
}

enum Launch {
    Process(SpawnSpec),
    BundleFetch(bundle_fetch::FetchPlan, Mounts),
    Virtual,
    /// A created container of the engine, and the client process that
    /// starts it attached to its streams.
    Engine(EngineRun),
}

struct EngineRun {
    name: String,
    id: String,
    start: SpawnSpec,
}
