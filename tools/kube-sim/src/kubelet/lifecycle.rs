//! A pod's life on the node: its initial status, init containers in order
//! and then the main containers under the restart policy with crash
//! back-off, the active deadline, and stopping everything when the pod is
//! deleted, killed or the kubelet stops.

use super::*;

/// Why a pod's run ended.
enum Ended {
    Completed,
    DeadlineExceeded,
    Deleting,
    Killed,
    Shutdown,
}

impl Kubelet {
    /// Runs a picked-up pod from its sandbox to its end, then frees its IP
    /// and sandbox.
    pub(super) async fn run_pod(self: Arc<Self>, w: Arc<PodWorker>, pod: PodView) {
        // The pod's network: in the docker runtime an infra container
        // holds its namespace (and is removed with the pod's containers).
        let attached = match (&self.network, &self.engine) {
            (Some(bridge), Some(engine)) => self
                .engine_pod_network(engine, bridge, &w, &pod)
                .await
                .map(|(net, infra)| (Some(net), Some(infra))),
            (Some(bridge), None) => bridge.attach().await.map(|net| (Some(net), None)),
            (None, _) => Ok((None, None)),
        };
        let (net, infra) = match attached {
            Ok(attached) => attached,
            Err(msg) => {
                self.event(&w, None, EventType::Warning, "FailedCreatePodSandBox", &msg);
                return;
            }
        };
        let ip = match &net {
            Some(net) => net.ip,
            None => match ips::allocate() {
                Some(ip) => ip,
                None => {
                    self.event(
                        &w,
                        None,
                        EventType::Warning,
                        "FailedCreatePodSandBox",
                        "no free pod IP in 127.0.0.0/8",
                    );
                    return;
                }
            },
        };
        let sandbox = self.root.join("pods").join(&w.uid);
        let netns = net.as_ref().map(podnet::PodNet::netns_path);
        let outcome = self
            .clone()
            .pod_lifecycle(&w, &pod, ip, (netns, infra), &sandbox)
            .await;
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
                // A real kubelet has removed the pod's containers by the
                // time the pod is gone.
                if let Some(engine) = &self.engine {
                    engine.remove_pod(&w.uid).await;
                }
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
        if let Some(engine) = &self.engine {
            engine.remove_pod(&w.uid).await;
        }
        match (net, &self.network) {
            (Some(net), Some(bridge)) => bridge.detach(net).await,
            _ => ips::release(ip),
        }
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

    /// SIGTERM every container, SIGKILL after `grace`, wait for exits
    /// (through the engine in the docker runtime).
    async fn stop_containers(&self, w: &PodWorker, grace: Duration) {
        w.terminating.cancel();
        if let Some(engine) = &self.engine {
            return self.stop_engine_containers(engine, w, grace).await;
        }
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
        (netns, infra): (Option<PathBuf>, Option<String>),
        sandbox: &Path,
    ) -> Ended {
        *w.model.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(initial_model(pod, ip, self.node_ip));
        self.publish(w);
        let started = Instant::now();
        let mut deadline = w.deadline.subscribe();
        let sleep_deadline = async move {
            loop {
                let at = (*deadline.borrow_and_update())
                    .map(|s| started + Duration::from_secs(s.max(0) as u64));
                let passed = async {
                    match at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = passed => return,
                    changed = deadline.changed() => {
                        if changed.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                }
            }
        };
        let ctx = PodCtx {
            pod: pod.clone(),
            ip,
            netns,
            infra,
            sandbox: sandbox.to_path_buf(),
            restart_policy: pod.restart_policy().to_string(),
        };
        let latency = self.latency.sandbox;
        let containers = async {
            // The sandbox (network, volumes) before any container.
            tokio::time::sleep(latency).await;
            self.clone().run_containers(w.clone(), ctx).await;
        };
        tokio::select! {
            () = containers => Ended::Completed,
            _ = sleep_deadline => Ended::DeadlineExceeded,
            _ = w.stop.cancelled() => Ended::Deleting,
            _ = w.kill.cancelled() => Ended::Killed,
            _ = self.shutdown.cancelled() => Ended::Shutdown,
        }
    }

    /// Volumes, then each init container to success (or the pod's failure
    /// under `Never`), then every main container at once; returns when all
    /// main container loops have ended.
    async fn run_containers(self: Arc<Self>, w: Arc<PodWorker>, ctx: PodCtx) {
        if let Err(msg) = self.prepare_volumes(&w, &ctx).await {
            self.event(&w, None, EventType::Warning, "FailedMount", &msg);
            std::future::pending::<()>().await;
        }
        if self.engine.is_some() {
            self.prepare_engine_volumes(&ctx).await;
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
        w.back_off(delay).await;
    }
}

/// The pod's status before any of its containers ran: every container
/// waiting for its turn.
fn initial_model(pod: &PodView, ip: Ipv4Addr, node_ip: Ipv4Addr) -> PodModel {
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
        host_ip: node_ip.to_string(),
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
