//! The kubelet simulator: schedules pods onto the one node, runs their
//! containers as real local processes (init containers in order, then the
//! main containers), reports status like a kubelet, enforces
//! `activeDeadlineSeconds` and restart policies, and kills process groups
//! when a pod is deleted.

pub mod bundle_fetch;
mod container;
mod env;
pub mod images;
pub mod ips;
mod launch;
pub mod paths;
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
use k8s_openapi::api::core::v1::Container;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::apiserver::defaults::NODE_NAME;
use crate::apiserver::registry::Registry;
use crate::apiserver::store::{EventKind, Store};
use crate::events::{EventRecorder, EventType};
use crate::kinds;
use crate::meta;
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

pub struct KubeletConfig {
    pub images: ImageTable,
    pub fake_telo: Option<PathBuf>,
    pub root: PathBuf,
    pub pull_delay: Duration,
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
}

struct PodWorker {
    uid: String,
    ns: String,
    name: String,
    /// Graceful termination requested (deletionTimestamp set).
    stop: CancellationToken,
    /// The pod is gone from the store: kill now, write nothing.
    kill: CancellationToken,
    /// No restarts or new containers once termination began.
    terminating: std::sync::atomic::AtomicBool,
    model: Mutex<Option<PodModel>>,
    slots: Mutex<HashMap<String, ContainerSlot>>,
    /// Failed pulls per container, for the back-off.
    pull_failures: Mutex<HashMap<String, u32>>,
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
        self.terminating.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Aborts the container loops still waiting on something (a back-off,
    /// an image that will never pull) and waits for all of them. Loops whose
    /// container has just exited finish their bookkeeping first: they have
    /// nothing left to wait on, so the abort cannot cut them short.
    async fn join_containers(&self) {
        let mut loops =
            std::mem::take(&mut *self.containers.lock().unwrap_or_else(|p| p.into_inner()));
        loops.abort_all();
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
                self.schedule(pod);
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
            terminating: std::sync::atomic::AtomicBool::new(false),
            model: Mutex::new(None),
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

    async fn run_pod(self: Arc<Self>, w: Arc<PodWorker>, pod: PodView) {
        let Some(ip) = ips::allocate() else {
            self.event(
                &w,
                None,
                EventType::Warning,
                "FailedCreatePodSandBox",
                "no free pod IP in 127.0.0.0/8",
            );
            return;
        };
        let sandbox = self.root.join("pods").join(&w.uid);
        let outcome = self.clone().pod_lifecycle(&w, &pod, ip, &sandbox).await;
        match outcome {
            Ended::Killed | Ended::Shutdown => {
                self.stop_containers(&w, Duration::ZERO).await;
                w.join_containers().await;
            }
            Ended::Deleting => {
                let grace = self
                    .current_pod(&w)
                    .map_or_else(|| pod.termination_grace(), |p| meta::current_grace(&p));
                self.stop_containers(&w, process::grace(grace)).await;
                w.join_containers().await;
                self.with_model(&w, |m| {
                    if !matches!(m.phase, Phase::Succeeded | Phase::Failed) {
                        m.phase = status::terminal_phase(&m.main);
                    }
                    for c in m.main.iter_mut().chain(m.init.iter_mut()) {
                        c.ready = false;
                    }
                });
                self.publish(&w);
                self.registry
                    .remove_now(kinds::pods(), &w.ns, &w.name, &w.uid);
            }
            Ended::DeadlineExceeded => {
                // The pod is Failed for this reason before its containers
                // are stopped, so their exits cannot report another outcome.
                self.with_model(&w, |m| {
                    m.phase = Phase::Failed;
                    m.reason = Some("DeadlineExceeded".into());
                    m.message = Some(
                        "Pod was active on the node longer than the specified deadline".into(),
                    );
                    for c in m.main.iter_mut().chain(m.init.iter_mut()) {
                        c.ready = false;
                    }
                });
                self.publish(&w);
                self.event(
                    &w,
                    None,
                    EventType::Warning,
                    "DeadlineExceeded",
                    "Pod was active on the node longer than the specified deadline",
                );
                let grace = pod.spec.termination_grace_period_seconds.unwrap_or(30);
                self.stop_containers(&w, process::grace(grace)).await;
                w.join_containers().await;
                self.publish(&w);
                self.wait_for_deletion(&w).await;
            }
            Ended::Completed => {
                w.join_containers().await;
                self.wait_for_deletion(&w).await;
            }
        }
        ips::release(ip);
        let _ = tokio::fs::remove_dir_all(&sandbox).await;
    }

    /// A finished pod stays (with its logs) until it is deleted.
    async fn wait_for_deletion(&self, w: &PodWorker) {
        tokio::select! {
            _ = w.stop.cancelled() => {
                self.registry.remove_now(kinds::pods(), &w.ns, &w.name, &w.uid);
            }
            _ = w.kill.cancelled() => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// SIGTERM every container, SIGKILL after `grace`, wait for exits.
    async fn stop_containers(&self, w: &PodWorker, grace: Duration) {
        w.terminating
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (groups, stops): (Vec<i32>, Vec<CancellationToken>) = {
            let slots = w.slots();
            (
                slots.values().filter_map(|s| s.pgid).collect(),
                slots.values().filter_map(|s| s.stop.clone()).collect(),
            )
        };
        for s in &stops {
            s.cancel();
        }
        if groups.is_empty() {
            return;
        }
        let first = if grace.is_zero() {
            Signal::SIGKILL
        } else {
            Signal::SIGTERM
        };
        for g in &groups {
            if !grace.is_zero() {
                let names: Vec<String> = w
                    .slots()
                    .iter()
                    .filter(|(_, s)| s.pgid == Some(*g))
                    .map(|(n, _)| n.clone())
                    .collect();
                for n in names {
                    self.event(
                        w,
                        Some(format!("spec.containers{{{n}}}")),
                        EventType::Normal,
                        "Killing",
                        &format!("Stopping container {n}"),
                    );
                }
            }
            process::signal(*g, first);
        }
        let deadline = Instant::now() + grace;
        loop {
            let alive: Vec<i32> = w.slots().values().filter_map(|s| s.pgid).collect();
            if alive.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                for g in alive {
                    process::signal(g, Signal::SIGKILL);
                }
                // Give the exit watchers a moment to record the kill.
                let settle = Instant::now() + Duration::from_secs(2);
                while Instant::now() < settle && w.slots().values().any(|s| s.pgid.is_some()) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn pod_lifecycle(
        self: Arc<Self>,
        w: &Arc<PodWorker>,
        pod: &PodView,
        ip: Ipv4Addr,
        sandbox: &Path,
    ) -> Ended {
        *w.model.lock().unwrap_or_else(|p| p.into_inner()) = Some(initial_model(pod, ip));
        self.publish(w);
        let deadline = pod
            .spec
            .active_deadline_seconds
            .map(|s| Instant::now() + Duration::from_secs(s.max(0) as u64));
        let sleep_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let ctx = PodCtx {
            pod: pod.clone(),
            ip,
            sandbox: sandbox.to_path_buf(),
            restart_policy: pod.restart_policy().to_string(),
        };
        tokio::select! {
            _ = self.clone().run_containers(w.clone(), ctx) => Ended::Completed,
            _ = sleep_deadline => Ended::DeadlineExceeded,
            _ = w.stop.cancelled() => Ended::Deleting,
            _ = w.kill.cancelled() => Ended::Killed,
            _ = self.shutdown.cancelled() => Ended::Shutdown,
        }
    }

    async fn run_containers(self: Arc<Self>, w: Arc<PodWorker>, ctx: PodCtx) {
        if let Err(msg) = self.prepare_volumes(&w, &ctx).await {
            self.event(&w, None, EventType::Warning, "FailedMount", &msg);
            std::future::pending::<()>().await;
        }
        let ctx = Arc::new(ctx);
        for (idx, c) in ctx.pod.init_containers().iter().enumerate() {
            loop {
                let code = self
                    .clone()
                    .run_container(w.clone(), ctx.clone(), c.clone(), true, idx)
                    .await;
                if code == 0 {
                    break;
                }
                if ctx.restart_policy == "Never" {
                    self.with_model(&w, |m| {
                        m.phase = Phase::Failed;
                    });
                    self.publish(&w);
                    return;
                }
                self.crash_backoff(&w, true, idx, &ctx).await;
            }
        }
        // Each loop holds a sender; the channel closes when the last one
        // has finished, which is when this pod's containers are done.
        let (done, mut all_done) = tokio::sync::mpsc::channel::<()>(1);
        for idx in 0..ctx.pod.containers().len() {
            self.clone()
                .spawn_main_loop(w.clone(), ctx.clone(), idx, done.clone());
        }
        drop(done);
        let _ = all_done.recv().await;
    }

    /// Starts main container `idx`'s loop: run it, and restart it as the
    /// pod's restart policy says until the pod terminates. The loop is
    /// owned by the worker (see [`PodWorker::containers`]).
    fn spawn_main_loop(
        self: Arc<Self>,
        w: Arc<PodWorker>,
        ctx: Arc<PodCtx>,
        idx: usize,
        done: tokio::sync::mpsc::Sender<()>,
    ) {
        let Some(c) = ctx.pod.containers().get(idx).cloned() else {
            return;
        };
        let owner = w.clone();
        let mut loops = owner.containers.lock().unwrap_or_else(|p| p.into_inner());
        loops.spawn(async move {
            let _done = done;
            loop {
                let code = self
                    .clone()
                    .run_container(w.clone(), ctx.clone(), c.clone(), false, idx)
                    .await;
                let restart = match ctx.restart_policy.as_str() {
                    "Always" => true,
                    "OnFailure" => code != 0,
                    _ => false,
                };
                if !restart || w.is_terminating() {
                    self.finish_if_all_done(&w, &ctx);
                    return;
                }
                self.crash_backoff(&w, false, idx, &ctx).await;
            }
        });
    }

    fn finish_if_all_done(&self, w: &PodWorker, ctx: &PodCtx) {
        let _ = ctx;
        let done = self.with_model(w, |m| {
            if m.reason.is_none() && m.main.iter().all(|c| c.state.is_terminated()) {
                m.phase = status::terminal_phase(&m.main);
                true
            } else {
                false
            }
        });
        if done == Some(true) {
            self.publish(w);
        }
    }

    async fn crash_backoff(&self, w: &PodWorker, init: bool, idx: usize, ctx: &PodCtx) {
        let restarts = self
            .container_model(w, init, idx, |c| c.restart_count)
            .unwrap_or(0);
        let delay = BACKOFF_INITIAL
            .saturating_mul(1u32 << restarts.min(5))
            .min(BACKOFF_MAX);
        let name = self
            .container_model(w, init, idx, |c| c.name.clone())
            .unwrap_or_default();
        let pod_ref = format!("{}_{}({})", w.name, w.ns, w.uid);
        self.container_model(w, init, idx, |c| {
            c.last_state = Some(c.state.clone());
            c.state = ContainerState::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(format!(
                    "back-off {}s restarting failed container={name} pod={pod_ref}",
                    delay.as_secs()
                )),
            };
            c.ready = false;
            c.restart_count += 1;
        });
        let _ = ctx;
        self.publish(w);
        self.event(
            w,
            Some(field_path(init, &name)),
            EventType::Warning,
            "BackOff",
            &format!("Back-off restarting failed container {name} in pod {pod_ref}"),
        );
        tokio::time::sleep(delay).await;
    }
}

/// The pod's status before any of its containers ran: every container
/// waiting for its turn.
fn initial_model(pod: &PodView, ip: Ipv4Addr) -> PodModel {
    let main_wait = if pod.init_containers().is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let waiting = |c: &Container, reason: &str| {
        ContainerModel::new(cname(c), &images::normalize(cimage(c)), reason)
    };
    PodModel {
        phase: Phase::Pending,
        reason: None,
        message: None,
        pod_ip: ip.to_string(),
        host_ip: "127.0.0.1".into(),
        start_time: meta::now_timestamp(),
        sandbox_ready: true,
        init: pod
            .init_containers()
            .iter()
            .map(|c| waiting(c, "PodInitializing"))
            .collect(),
        main: pod
            .containers()
            .iter()
            .map(|c| waiting(c, main_wait))
            .collect(),
        qos_class: pod
            .status
            .qos_class
            .clone()
            .unwrap_or_else(|| "BestEffort".to_string()),
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
    sandbox: PathBuf,
    restart_policy: String,
}

enum Ended {
    Completed,
    DeadlineExceeded,
    Deleting,
    Killed,
    Shutdown,
}

enum PullFailure {
    Invalid(String),
    NeverPull(String),
    Failed(String),
}

enum LaunchError {
    Config(String),
}

enum Launch {
    Process(SpawnSpec),
    BundleFetch(bundle_fetch::FetchPlan, Mounts),
    Virtual,
}
