//! The kubelet simulator: schedules pods onto the one node, runs their
//! containers as real local processes (init containers in order, then the
//! main containers), reports status like a kubelet, enforces
//! `activeDeadlineSeconds` and restart policies, and kills process groups
//! when a pod is deleted.

pub mod bundle_fetch;
pub mod images;
pub mod ips;
pub mod paths;
pub mod process;
pub mod status;
pub mod streams;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
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
}

impl PodWorker {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, ContainerSlot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_terminating(&self) -> bool {
        self.terminating.load(std::sync::atomic::Ordering::SeqCst)
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
                let worker = Arc::new(PodWorker {
                    uid: uid.clone(),
                    ns: meta::namespace(pod).to_string(),
                    name: meta::name(pod).to_string(),
                    stop: CancellationToken::new(),
                    kill: CancellationToken::new(),
                    terminating: std::sync::atomic::AtomicBool::new(false),
                    model: Mutex::new(None),
                    slots: Mutex::new(HashMap::new()),
                    pull_failures: Mutex::new(HashMap::new()),
                });
                self.workers().insert(uid.clone(), worker.clone());
                let kubelet = self.clone();
                let pod = pod.clone();
                tokio::spawn(async move {
                    kubelet.clone().run_pod(worker.clone(), pod).await;
                    kubelet.workers().remove(&worker.uid);
                });
            }
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

    async fn run_pod(self: Arc<Self>, w: Arc<PodWorker>, pod: Value) {
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
            }
            Ended::Deleting => {
                let grace = meta::current_grace(&self.current_pod(&w).unwrap_or(pod.clone()));
                self.stop_containers(&w, process::grace(grace)).await;
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
                let grace = meta::path(&pod, "spec.terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(30);
                self.stop_containers(&w, process::grace(grace)).await;
                self.publish(&w);
                self.wait_for_deletion(&w).await;
            }
            Ended::Completed => {
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
        pod: &Value,
        ip: Ipv4Addr,
        sandbox: &Path,
    ) -> Ended {
        let spec = pod.get("spec").cloned().unwrap_or(Value::Null);
        let list = |g: &str| {
            spec.get(g)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let inits = list("initContainers");
        let mains = list("containers");
        let restart_policy = spec
            .get("restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Always")
            .to_string();
        let main_wait = if inits.is_empty() {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
        let model = PodModel {
            phase: Phase::Pending,
            reason: None,
            message: None,
            pod_ip: ip.to_string(),
            host_ip: "127.0.0.1".into(),
            start_time: meta::now_timestamp(),
            sandbox_ready: true,
            init: inits
                .iter()
                .map(|c| {
                    ContainerModel::new(cname(c), &images::normalize(cimage(c)), "PodInitializing")
                })
                .collect(),
            main: mains
                .iter()
                .map(|c| ContainerModel::new(cname(c), &images::normalize(cimage(c)), main_wait))
                .collect(),
            qos_class: meta::path_str(pod, "status.qosClass")
                .unwrap_or("BestEffort")
                .to_string(),
        };
        *w.model.lock().unwrap_or_else(|p| p.into_inner()) = Some(model);
        self.publish(w);
        let deadline = spec
            .get("activeDeadlineSeconds")
            .and_then(Value::as_i64)
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
            restart_policy,
        };
        tokio::select! {
            _ = self.clone().run_containers(w.clone(), ctx, inits, mains) => Ended::Completed,
            _ = sleep_deadline => Ended::DeadlineExceeded,
            _ = w.stop.cancelled() => Ended::Deleting,
            _ = w.kill.cancelled() => Ended::Killed,
            _ = self.shutdown.cancelled() => Ended::Shutdown,
        }
    }

    async fn run_containers(
        self: Arc<Self>,
        w: Arc<PodWorker>,
        ctx: PodCtx,
        inits: Vec<Value>,
        mains: Vec<Value>,
    ) {
        if let Err(msg) = self.prepare_volumes(&w, &ctx).await {
            self.event(&w, None, EventType::Warning, "FailedMount", &msg);
            std::future::pending::<()>().await;
        }
        let ctx = Arc::new(ctx);
        for (idx, c) in inits.iter().enumerate() {
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
        let mut tasks = Vec::new();
        for (idx, c) in mains.iter().enumerate() {
            let kubelet = self.clone();
            let w = w.clone();
            let ctx = ctx.clone();
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let code = kubelet
                        .clone()
                        .run_container(w.clone(), ctx.clone(), c.clone(), false, idx)
                        .await;
                    let restart = match ctx.restart_policy.as_str() {
                        "Always" => true,
                        "OnFailure" => code != 0,
                        _ => false,
                    };
                    if !restart || w.is_terminating() {
                        kubelet.finish_if_all_done(&w, &ctx);
                        return;
                    }
                    kubelet.crash_backoff(&w, false, idx, &ctx).await;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
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

    async fn prepare_volumes(&self, w: &PodWorker, ctx: &PodCtx) -> Result<(), String> {
        let volumes = meta::path(&ctx.pod, "spec.volumes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for v in volumes {
            let name = v.get("name").and_then(Value::as_str).unwrap_or("");
            let dir = ctx.sandbox.join("volumes").join(name);
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| format!("MountVolume.SetUp failed for volume {name:?} : {e}"))?;
            for (source, plural, key) in [
                ("configMap", "configmaps", "name"),
                ("secret", "secrets", "secretName"),
            ] {
                let Some(src) = v.get(source) else { continue };
                let obj_name = src.get(key).and_then(Value::as_str).unwrap_or("");
                let optional = src
                    .get("optional")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let obj = loop {
                    match self.store.get(kinds::id(plural), &w.ns, obj_name) {
                        Some(o) => break Some(o),
                        None if optional => break None,
                        None => {
                            let kind = if source == "configMap" {
                                "configmap"
                            } else {
                                "secret"
                            };
                            self.event(
                                w,
                                None,
                                EventType::Warning,
                                "FailedMount",
                                &format!("MountVolume.SetUp failed for volume {name:?} : {kind} {obj_name:?} not found"),
                            );
                            tokio::time::sleep(Duration::from_secs(2)).await;
                        }
                    }
                };
                if let Some(obj) = obj {
                    write_volume_files(&obj.value, source == "secret", &dir).await;
                }
            }
        }
        Ok(())
    }

    /// A container stuck before it could start because of its image: its
    /// waiting state, then the two Warning events a real kubelet emits (the
    /// specific one and `Failed: Error: <reason>`).
    #[allow(clippy::too_many_arguments)]
    fn report_pull_failure(
        &self,
        w: &PodWorker,
        init: bool,
        idx: usize,
        fp: &str,
        reason: &str,
        message: &str,
        event_reason: &str,
        event_message: &str,
    ) {
        self.container_model(w, init, idx, |m| {
            m.state = ContainerState::Waiting {
                reason: reason.into(),
                message: Some(message.to_owned()),
            };
        });
        self.publish(w);
        self.event(
            w,
            Some(fp.to_owned()),
            EventType::Warning,
            event_reason,
            event_message,
        );
        self.event(
            w,
            Some(fp.to_owned()),
            EventType::Warning,
            "Failed",
            &format!("Error: {reason}"),
        );
    }

    async fn run_container(
        self: Arc<Self>,
        w: Arc<PodWorker>,
        ctx: Arc<PodCtx>,
        c: Value,
        init: bool,
        idx: usize,
    ) -> i32 {
        let name = cname(&c).to_string();
        let image = cimage(&c).to_string();
        let fp = field_path(init, &name);
        // Pull.
        let behaviour = loop {
            if w.is_terminating() {
                return 137;
            }
            match self.pull(&w, &c, init, idx).await {
                Ok(b) => break b,
                Err(PullFailure::Invalid(msg)) => {
                    self.report_pull_failure(
                        &w,
                        init,
                        idx,
                        &fp,
                        "InvalidImageName",
                        &msg,
                        "InspectFailed",
                        &msg,
                    );
                    std::future::pending::<()>().await;
                }
                Err(PullFailure::NeverPull(msg)) => {
                    self.report_pull_failure(
                        &w,
                        init,
                        idx,
                        &fp,
                        "ErrImageNeverPull",
                        &msg,
                        "ErrImageNeverPull",
                        &msg,
                    );
                    std::future::pending::<()>().await;
                }
                Err(PullFailure::Failed(msg)) => {
                    let attempts = self.pull_failures(&w, &name);
                    let pull_error = format!("Failed to pull image {image:?}: {msg}");
                    self.report_pull_failure(
                        &w,
                        init,
                        idx,
                        &fp,
                        "ErrImagePull",
                        &msg,
                        "Failed",
                        &pull_error,
                    );
                    tokio::time::sleep(PULL_ERROR_SETTLE).await;
                    self.container_model(&w, init, idx, |m| {
                        m.state = ContainerState::Waiting {
                            reason: "ImagePullBackOff".into(),
                            message: Some(format!(
                                "Back-off pulling image {image:?}: ErrImagePull: {msg}"
                            )),
                        };
                    });
                    self.publish(&w);
                    self.event(
                        &w,
                        Some(fp.clone()),
                        EventType::Normal,
                        "BackOff",
                        &format!("Back-off pulling image {image:?}"),
                    );
                    self.event(
                        &w,
                        Some(fp.clone()),
                        EventType::Warning,
                        "Failed",
                        "Error: ImagePullBackOff",
                    );
                    let delay = BACKOFF_INITIAL
                        .saturating_mul(1u32 << attempts.min(5))
                        .min(BACKOFF_MAX);
                    tokio::time::sleep(delay).await;
                }
            }
        };
        if w.is_terminating() {
            return 137;
        }
        // Create.
        let streams = Arc::new(ContainerStreams::new(
            c.get("tty").and_then(Value::as_bool).unwrap_or(false),
            c.get("stdin").and_then(Value::as_bool).unwrap_or(false),
        ));
        let launch = match self.launch_plan(&w, &ctx, &c, &behaviour).await {
            Ok(l) => l,
            Err(LaunchError::Config(msg)) => {
                self.container_model(&w, init, idx, |m| {
                    m.state = ContainerState::Waiting {
                        reason: "CreateContainerConfigError".into(),
                        message: Some(msg.clone()),
                    };
                });
                self.publish(&w);
                self.event(
                    &w,
                    Some(fp.clone()),
                    EventType::Warning,
                    "Failed",
                    &format!("Error: {msg}"),
                );
                // The kubelet retries; the config may appear later.
                tokio::time::sleep(Duration::from_secs(2)).await;
                return Box::pin(self.run_container(w, ctx, c, init, idx)).await;
            }
        };
        let container_id = format!("containerd://{}", meta::random_hex(32));
        {
            let mut slots = w.slots();
            let slot = slots.entry(name.clone()).or_default();
            slot.previous = slot.current.take();
            slot.current = Some(streams.clone());
        }
        self.event(
            &w,
            Some(fp.clone()),
            EventType::Normal,
            "Created",
            &format!("Created container: {name}"),
        );
        let started_at = meta::now_timestamp();
        let exit_code = match launch {
            Launch::Process(spec) => {
                match process::spawn(&spec, streams.clone(), self.processes.clone()) {
                    Ok(running) => {
                        w.slots().entry(name.clone()).or_default().pgid = Some(running.pgid);
                        self.mark_started(&w, init, idx, &container_id, &started_at, &fp, &name);
                        let code = running.exit.await.unwrap_or(137);
                        // Let the output readers drain the pipes before closing.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        w.slots().entry(name.clone()).or_default().pgid = None;
                        code
                    }
                    Err(e) => {
                        let msg = format!(
                            "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: {e}: unknown"
                        );
                        self.event(
                            &w,
                            Some(fp.clone()),
                            EventType::Warning,
                            "Failed",
                            &format!("Error: {msg}"),
                        );
                        self.container_model(&w, init, idx, |m| {
                            m.container_id = Some(container_id.clone());
                            m.state = ContainerState::Terminated {
                                exit_code: 128,
                                reason: "StartError".into(),
                                message: Some(msg.clone()),
                                started_at: "1970-01-01T00:00:00Z".into(),
                                finished_at: meta::now_timestamp(),
                                container_id: container_id.clone(),
                            };
                        });
                        streams.close();
                        self.publish(&w);
                        return 128;
                    }
                }
            }
            Launch::BundleFetch(plan, mounts) => {
                let stop = CancellationToken::new();
                w.slots().entry(name.clone()).or_default().stop = Some(stop.clone());
                self.mark_started(&w, init, idx, &container_id, &started_at, &fp, &name);
                let http = self.http.clone();
                let out = tokio::select! {
                    out = bundle_fetch::run(&plan, &mounts, &http) => Some(out),
                    _ = stop.cancelled() => None,
                };
                w.slots().entry(name.clone()).or_default().stop = None;
                match out {
                    Some(out) => {
                        for line in out.stderr {
                            streams.push(StreamKind::Stderr, Bytes::from(format!("{line}\n")));
                        }
                        out.exit_code
                    }
                    None => 143,
                }
            }
            Launch::Virtual => {
                let stop = CancellationToken::new();
                w.slots().entry(name.clone()).or_default().stop = Some(stop.clone());
                self.mark_started(&w, init, idx, &container_id, &started_at, &fp, &name);
                stop.cancelled().await;
                w.slots().entry(name.clone()).or_default().stop = None;
                143
            }
        };
        streams.close();
        self.container_model(&w, init, idx, |m| {
            m.ready = false;
            m.state = ContainerState::Terminated {
                exit_code,
                reason: status::terminated_reason(exit_code).into(),
                message: None,
                started_at: started_at.clone(),
                finished_at: meta::now_timestamp(),
                container_id: container_id.clone(),
            };
        });
        if !init {
            // Phase stays Running while any main container still runs.
            self.with_model(&w, |m| {
                if m.reason.is_none()
                    && m.main.iter().all(|c| c.state.is_terminated())
                    && ctx.restart_policy == "Never"
                {
                    m.phase = status::terminal_phase(&m.main);
                }
            });
        }
        self.publish(&w);
        exit_code
    }

    #[allow(clippy::too_many_arguments)]
    fn mark_started(
        &self,
        w: &PodWorker,
        init: bool,
        idx: usize,
        container_id: &str,
        started_at: &str,
        fp: &str,
        name: &str,
    ) {
        self.container_model(w, init, idx, |m| {
            m.container_id = Some(container_id.to_string());
            m.state = ContainerState::Running {
                started_at: started_at.to_string(),
            };
            m.ready = !init;
        });
        if !init {
            self.with_model(w, |m| {
                if m.initialized() {
                    m.phase = Phase::Running;
                }
            });
        }
        self.publish(w);
        self.event(
            w,
            Some(fp.to_string()),
            EventType::Normal,
            "Started",
            &format!("Started container {name}"),
        );
    }

    fn pull_failures(&self, w: &PodWorker, container: &str) -> u32 {
        let mut counts = w.pull_failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(container.to_string()).or_insert(0);
        *n += 1;
        *n - 1
    }

    async fn pull(
        &self,
        w: &PodWorker,
        c: &Value,
        init: bool,
        idx: usize,
    ) -> Result<ImageBehaviour, PullFailure> {
        let image = cimage(c).to_string();
        let name = cname(c).to_string();
        let fp = field_path(init, &name);
        if let Some(msg) = images::invalid_reference(&image) {
            return Err(PullFailure::Invalid(msg));
        }
        let policy = c
            .get("imagePullPolicy")
            .and_then(Value::as_str)
            .unwrap_or("IfNotPresent");
        let behaviour = self.images.lookup(&image).cloned();
        let present = self
            .pulled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&image);
        match (&behaviour, policy) {
            (Some(ImageBehaviour::PullError(_)) | None, "Never") => {
                return Err(PullFailure::NeverPull(format!(
                    "Container image {image:?} is not present with pull policy of Never"
                )));
            }
            (Some(b), "Never") => return Ok(b.clone()),
            (Some(b), "IfNotPresent") if present && !matches!(b, ImageBehaviour::PullError(_)) => {
                self.event(
                    w,
                    Some(fp),
                    EventType::Normal,
                    "Pulled",
                    &format!("Container image {image:?} already present on machine"),
                );
                self.set_image_id(w, init, idx, &image);
                return Ok(b.clone());
            }
            _ => {}
        }
        self.event(
            w,
            Some(fp.clone()),
            EventType::Normal,
            "Pulling",
            &format!("Pulling image {image:?}"),
        );
        let started = Instant::now();
        tokio::time::sleep(self.pull_delay).await;
        match behaviour {
            None => Err(PullFailure::Failed(images::not_found_message(&image))),
            Some(ImageBehaviour::PullError(msg)) => Err(PullFailure::Failed(if msg.is_empty() {
                images::not_found_message(&image)
            } else {
                msg
            })),
            Some(b) => {
                let took = started.elapsed().as_secs_f64();
                self.pulled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(image.clone());
                self.event(
                    w,
                    Some(fp),
                    EventType::Normal,
                    "Pulled",
                    &format!("Successfully pulled image {image:?} in {took:.3}s ({took:.3}s including waiting). Image size: 4242424 bytes."),
                );
                self.set_image_id(w, init, idx, &image);
                Ok(b)
            }
        }
    }

    fn set_image_id(&self, w: &PodWorker, init: bool, idx: usize, image: &str) {
        let id = images::image_id(image);
        self.container_model(w, init, idx, |m| m.image_id = id);
    }

    async fn launch_plan(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Value,
        behaviour: &ImageBehaviour,
    ) -> Result<Launch, LaunchError> {
        let name = cname(c);
        let container_dir = ctx.sandbox.join("containers").join(name);
        let _ = tokio::fs::create_dir_all(&container_dir).await;
        let mut mount_list = Vec::new();
        for m in c
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let vol = m.get("name").and_then(Value::as_str).unwrap_or("");
            let mount_path = m.get("mountPath").and_then(Value::as_str).unwrap_or("");
            let mut host = ctx.sandbox.join("volumes").join(vol);
            if let Some(sub) = m
                .get("subPath")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                host = host.join(sub.trim_start_matches('/'));
            }
            let _ = tokio::fs::create_dir_all(&host).await;
            mount_list.push((mount_path.to_string(), host));
        }
        let mounts = Mounts::new(mount_list);
        let env = self.resolve_env(w, ctx, c, &mounts, &container_dir)?;
        let cwd = match c.get("workingDir").and_then(Value::as_str) {
            Some(wd) => match mounts.map_path(wd) {
                Some(p) => p,
                None => {
                    let p = container_dir
                        .join("rootfs")
                        .join(wd.trim_start_matches('/'));
                    let _ = tokio::fs::create_dir_all(&p).await;
                    p
                }
            },
            None => container_dir.clone(),
        };
        let mut argv: Vec<String> = Vec::new();
        for part in ["command", "args"] {
            for a in c.get(part).and_then(Value::as_array).into_iter().flatten() {
                argv.push(a.as_str().unwrap_or("").to_string());
            }
        }
        let has_command = c
            .get("command")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        let tty = c.get("tty").and_then(Value::as_bool).unwrap_or(false);
        let stdin = c.get("stdin").and_then(Value::as_bool).unwrap_or(false);
        let stdin_once = c.get("stdinOnce").and_then(Value::as_bool).unwrap_or(false);
        let spawn = |program: PathBuf, args: Vec<String>| {
            Launch::Process(SpawnSpec {
                program,
                args,
                env: env.clone(),
                cwd: cwd.clone(),
                tty,
                stdin,
                stdin_once,
            })
        };
        let fake_telo = self
            .fake_telo
            .clone()
            .unwrap_or_else(|| PathBuf::from("telo"));
        let is_shell = |s: &str| matches!(s, "sh" | "/bin/sh" | "bash" | "/bin/bash");
        let generic = |argv: &[String]| -> Launch {
            match argv.split_first() {
                Some((sh, rest)) if is_shell(sh) => {
                    let mapped: Vec<String> = rest.iter().map(|a| mounts.map_script(a)).collect();
                    spawn(PathBuf::from("/bin/sh"), mapped)
                }
                Some((prog, rest)) if prog == "telo" || prog.ends_with("/telo") => spawn(
                    fake_telo.clone(),
                    rest.iter().map(|a| mounts.map_arg(a)).collect(),
                ),
                Some((prog, rest)) => spawn(
                    PathBuf::from(mounts.map_arg(prog)),
                    rest.iter().map(|a| mounts.map_arg(a)).collect(),
                ),
                None => spawn(fake_telo.clone(), Vec::new()),
            }
        };
        Ok(match behaviour {
            ImageBehaviour::Virtual => Launch::Virtual,
            ImageBehaviour::FakeTeloEntry(entry) if !has_command => {
                let mut args = vec!["run".to_string(), entry.to_string_lossy().into_owned()];
                args.extend(argv.iter().map(|a| mounts.map_arg(a)));
                spawn(fake_telo, args)
            }
            ImageBehaviour::FakeTelo if !has_command => {
                // The kernel image's entrypoint is `telo`.
                spawn(fake_telo, argv.iter().map(|a| mounts.map_arg(a)).collect())
            }
            ImageBehaviour::BundleFetcher => {
                let script = match argv.as_slice() {
                    [sh, dash_c, script, ..] if is_shell(sh) && dash_c == "-c" => {
                        Some(script.clone())
                    }
                    _ => None,
                };
                match script.as_deref().and_then(bundle_fetch::plan) {
                    Some(plan) => Launch::BundleFetch(plan, mounts.clone()),
                    None => generic(&argv),
                }
            }
            _ => generic(&argv),
        })
    }

    fn resolve_env(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Value,
        mounts: &Mounts,
        container_dir: &Path,
    ) -> Result<Vec<(String, String)>, LaunchError> {
        let mut env: Vec<(String, String)> = Vec::new();
        let set = |k: &str, v: String, env: &mut Vec<(String, String)>| {
            env.retain(|(ek, _)| ek != k);
            env.push((k.to_string(), v));
        };
        let host_path =
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        set(
            "PATH",
            format!("{}:{host_path}", self.shim_dir.display()),
            &mut env,
        );
        set("HOSTNAME", w.name.clone(), &mut env);
        set(
            "HOME",
            container_dir.to_string_lossy().into_owned(),
            &mut env,
        );
        if c.get("tty").and_then(Value::as_bool) == Some(true) {
            set("TERM", "xterm".into(), &mut env);
        }
        for from in c
            .get("envFrom")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let prefix = from.get("prefix").and_then(Value::as_str).unwrap_or("");
            for (source, plural, kind) in [
                ("configMapRef", "configmaps", "configmap"),
                ("secretRef", "secrets", "secret"),
            ] {
                let Some(r) = from.get(source) else { continue };
                let n = r.get("name").and_then(Value::as_str).unwrap_or("");
                let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
                match self.store.get(kinds::id(plural), &w.ns, n) {
                    Some(obj) => {
                        for (k, v) in data_of(&obj.value, plural == "secrets") {
                            set(&format!("{prefix}{k}"), v, &mut env);
                        }
                    }
                    None if optional => {}
                    None => return Err(LaunchError::Config(format!("{kind} {n:?} not found"))),
                }
            }
        }
        for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
            let k = e.get("name").and_then(Value::as_str).unwrap_or("");
            let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
                Some(expand_refs(v, &env))
            } else if let Some(fr) = e
                .pointer("/valueFrom/fieldRef/fieldPath")
                .and_then(Value::as_str)
            {
                Some(field_ref(&ctx.pod, fr, ctx.ip))
            } else {
                let mut resolved = None;
                for (source, plural, kind) in [
                    ("configMapKeyRef", "configmaps", "ConfigMap"),
                    ("secretKeyRef", "secrets", "Secret"),
                ] {
                    let Some(r) = e.pointer(&format!("/valueFrom/{source}")) else {
                        continue;
                    };
                    let n = r.get("name").and_then(Value::as_str).unwrap_or("");
                    let key = r.get("key").and_then(Value::as_str).unwrap_or("");
                    let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
                    match self.store.get(kinds::id(plural), &w.ns, n) {
                        Some(obj) => match data_of(&obj.value, plural == "secrets")
                            .into_iter()
                            .find(|(dk, _)| dk == key)
                        {
                            Some((_, v)) => resolved = Some(v),
                            None if optional => {}
                            None => {
                                return Err(LaunchError::Config(format!(
                                    "couldn't find key {key} in {kind} {}/{n}",
                                    w.ns
                                )));
                            }
                        },
                        None if optional => {}
                        None => {
                            return Err(LaunchError::Config(format!(
                                "{} {n:?} not found",
                                kind.to_lowercase()
                            )));
                        }
                    }
                }
                resolved
            };
            if let Some(v) = value {
                let mapped = mounts
                    .map_path(&v)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or(v);
                set(k, mapped, &mut env);
            }
        }
        // Processes bind to the pod IP (fake-telo's `HOST` rule).
        set("HOST", ctx.ip.to_string(), &mut env);
        Ok(env)
    }
}

/// `$(VAR)` references in env values.
/// The kubelet's expansion of `env[].value`: `$$` is an escaped `$`,
/// `$(NAME)` is the value of a variable defined earlier (left as written when
/// there is none), and any other `$` is kept.
fn expand_refs(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn field_ref(pod: &Value, path: &str, ip: Ipv4Addr) -> String {
    match path {
        "status.podIP" | "status.podIPs" => ip.to_string(),
        "status.hostIP" | "status.hostIPs" => "127.0.0.1".into(),
        "spec.nodeName" => NODE_NAME.into(),
        _ => {
            if let Some(label) = path
                .strip_prefix("metadata.labels['")
                .and_then(|r| r.strip_suffix("']"))
            {
                return meta::labels(pod)
                    .and_then(|l| l.get(label))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
            }
            meta::path_str(pod, path).unwrap_or("").to_string()
        }
    }
}

fn data_of(obj: &Value, base64_encoded: bool) -> Vec<(String, String)> {
    use base64::Engine;
    let mut out = Vec::new();
    if let Some(data) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let s = v.as_str().unwrap_or("");
            let decoded = if base64_encoded {
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_default()
            } else {
                s.to_string()
            };
            out.push((k.clone(), decoded));
        }
    }
    out
}

async fn write_volume_files(obj: &Value, secret: bool, dir: &Path) {
    use base64::Engine;
    for (field, encoded) in [("data", secret), ("binaryData", true)] {
        if let Some(data) = obj.get(field).and_then(Value::as_object) {
            for (k, v) in data {
                let s = v.as_str().unwrap_or("");
                let bytes = if encoded {
                    base64::engine::general_purpose::STANDARD
                        .decode(s)
                        .unwrap_or_default()
                } else {
                    s.as_bytes().to_vec()
                };
                if k.contains('/') || k.starts_with("..") {
                    continue;
                }
                let _ = tokio::fs::write(dir.join(k), bytes).await;
            }
        }
    }
}

fn cname(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("")
}

fn cimage(c: &Value) -> &str {
    c.get("image").and_then(Value::as_str).unwrap_or("")
}

fn field_path(init: bool, name: &str) -> String {
    if init {
        format!("spec.initContainers{{{name}}}")
    } else {
        format!("spec.containers{{{name}}}")
    }
}

struct PodCtx {
    pod: Value,
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

#[cfg(test)]
mod expansion_tests {
    use super::expand_refs;

    #[test]
    fn env_values_expand_like_the_kubelet() {
        let env = vec![("HOME".to_owned(), "/home/x".to_owned())];
        assert_eq!(expand_refs("pa$$word", &env), "pa$word");
        assert_eq!(expand_refs("$(HOME)/bin", &env), "/home/x/bin");
        assert_eq!(expand_refs("$$(HOME)", &env), "$(HOME)");
        assert_eq!(expand_refs("$(NOPE) $", &env), "$(NOPE) $");
        assert_eq!(expand_refs("$(unclosed", &env), "$(unclosed");
        assert_eq!(expand_refs("a$b", &env), "a$b");
    }
}
