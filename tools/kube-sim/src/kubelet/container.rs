//! One container's run: pull, launch, its streams, its status from start to
//! exit, and the `Started` mark.

use super::*;

/// Which container of which pod a step is for, and the names its events
/// and status carry.
pub(super) struct Target<'a> {
    pub w: &'a PodWorker,
    pub init: bool,
    pub idx: usize,
    pub name: &'a str,
    /// The event `fieldPath`: `spec.containers{name}`.
    pub fp: &'a str,
    /// Whether a readiness probe decides when it is ready (else it is
    /// ready once it runs).
    pub probed: bool,
}

/// How a launched container ended.
pub(super) enum Outcome {
    Exited(i32),
    /// Exited with a reason other than its exit code's (`OOMKilled`).
    ExitedWith(i32, &'static str),
    /// The runtime could not start it; its status already says why.
    StartFailed,
    /// Never started: the pod began terminating first.
    Abandoned,
}

impl Kubelet {
    pub(super) async fn run_container(
        self: Arc<Self>,
        w: Arc<PodWorker>,
        ctx: Arc<PodCtx>,
        c: Container,
        init: bool,
        idx: usize,
    ) -> i32 {
        let fp = field_path(init, &c.name);
        let t = Target {
            w: &w,
            init,
            idx,
            name: &c.name,
            fp: &fp,
            probed: !init && c.readiness_probe.is_some(),
        };
        // The kubelet retries a container whose config is not there yet
        // (a missing Secret, say) from the pull on, as it would a new one.
        let (launch, streams) = loop {
            let Some(pulled) = self.pull_until_present(&t, &c).await else {
                return 137;
            };
            if w.is_terminating() {
                return 137;
            }
            let streams = Arc::new(ContainerStreams::new(
                c.tty.unwrap_or(false),
                c.stdin.unwrap_or(false),
            ));
            let plan = match &pulled {
                Pulled::Behaviour(behaviour) => self.launch_plan(&w, &ctx, &c, behaviour).await,
                Pulled::Engine(image) => self.engine_plan(&w, &ctx, &c, image).await,
            };
            match plan {
                Ok(l) => break (l, streams),
                Err(e) => {
                    self.report_config_error(&t, &e);
                    w.back_off(Duration::from_secs(2)).await;
                }
            }
        };
        let container_id = match &launch {
            Launch::Engine(run) => format!("docker://{}", run.id),
            _ => format!("containerd://{}", meta::random_hex(32)),
        };
        {
            let mut slots = w.slots();
            let slot = slots.entry(c.name.clone()).or_default();
            slot.previous = slot.current.take();
            slot.current = Some(streams.clone());
        }
        self.event(
            &w,
            Some(fp.clone()),
            EventType::Normal,
            "Created",
            &format!("Created container: {}", c.name),
        );
        // The runtime's start (with a latency profile; nothing by default).
        if !self.latency.container_start.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(self.latency.container_start) => {}
                () = w.terminating.cancelled() => return 137,
            }
        }
        let mut started_at = meta::now_timestamp();
        let execute = self.execute(&t, launch, &streams, &container_id, &mut started_at);
        let outcome = match c.readiness_probe.clone().filter(|_| !init) {
            None => execute.await,
            Some(probe) => {
                let probing = self.probe_readiness(&w, idx, ctx.ip, &c, probe);
                tokio::select! {
                    outcome = execute => outcome,
                    never = probing => match never {},
                }
            }
        };
        let (exit_code, reason) = match outcome {
            Outcome::Exited(code) => (code, None),
            Outcome::ExitedWith(code, reason) => (code, Some(reason)),
            Outcome::StartFailed => return 128,
            Outcome::Abandoned => return 137,
        };
        streams.close();
        self.record_exit(&t, &ctx, exit_code, reason, &started_at, &container_id);
        exit_code
    }

    /// Pulls the container's image, reporting failures and backing off as a
    /// kubelet does, until it is there. `None`: the pod began terminating.
    /// An image that can never be pulled (an invalid name, `Never` with no
    /// image) leaves the container waiting until the pod terminates.
    async fn pull_until_present(&self, t: &Target<'_>, c: &Container) -> Option<Pulled> {
        let image = cimage(c);
        loop {
            if t.w.is_terminating() {
                return None;
            }
            let pulled = match &self.engine {
                Some(engine) => self
                    .pull_engine(engine, t.w, c, t.init, t.idx)
                    .await
                    .map(Pulled::Engine),
                None => self
                    .pull(t.w, c, t.init, t.idx)
                    .await
                    .map(Pulled::Behaviour),
            };
            match pulled {
                Ok(p) => return Some(p),
                Err(PullFailure::Invalid(msg)) => {
                    self.report_pull_failure(
                        t.w,
                        t.init,
                        t.idx,
                        t.fp,
                        "InvalidImageName",
                        &msg,
                        "InspectFailed",
                        &msg,
                    );
                    t.w.terminating.cancelled().await;
                }
                Err(PullFailure::NeverPull(msg)) => {
                    self.report_pull_failure(
                        t.w,
                        t.init,
                        t.idx,
                        t.fp,
                        "ErrImageNeverPull",
                        &msg,
                        "ErrImageNeverPull",
                        &msg,
                    );
                    t.w.terminating.cancelled().await;
                }
                Err(PullFailure::Failed(msg)) => self.pull_backoff(t, image, &msg).await,
            }
        }
    }

    /// After a failed pull: `ErrImagePull`, then `ImagePullBackOff` and the
    /// back-off delay before the next try.
    async fn pull_backoff(&self, t: &Target<'_>, image: &str, msg: &str) {
        let attempts = self.pull_failures(t.w, t.name);
        let pull_error = format!("Failed to pull image {image:?}: {msg}");
        self.report_pull_failure(
            t.w,
            t.init,
            t.idx,
            t.fp,
            "ErrImagePull",
            msg,
            "Failed",
            &pull_error,
        );
        tokio::time::sleep(PULL_ERROR_SETTLE).await;
        self.container_model(t.w, t.init, t.idx, |m| {
            m.state = ContainerState::Waiting {
                reason: "ImagePullBackOff".into(),
                message: Some(format!(
                    "Back-off pulling image {image:?}: ErrImagePull: {msg}"
                )),
            };
        });
        self.publish(t.w);
        self.event(
            t.w,
            Some(t.fp.to_string()),
            EventType::Normal,
            "BackOff",
            &format!("Back-off pulling image {image:?}"),
        );
        self.event(
            t.w,
            Some(t.fp.to_string()),
            EventType::Warning,
            "Failed",
            "Error: ImagePullBackOff",
        );
        let delay = BACKOFF_INITIAL
            .saturating_mul(1u32 << attempts.min(5))
            .min(BACKOFF_MAX);
        t.w.back_off(delay).await;
    }

    /// A container whose environment or mounts cannot be built yet, or
    /// that the runtime refused to create.
    fn report_config_error(&self, t: &Target<'_>, e: &LaunchError) {
        let msg = e.message();
        self.container_model(t.w, t.init, t.idx, |m| {
            m.state = ContainerState::Waiting {
                reason: e.reason().into(),
                message: Some(msg.to_string()),
            };
        });
        self.publish(t.w);
        self.event(
            t.w,
            Some(t.fp.to_string()),
            EventType::Warning,
            "Failed",
            &format!("Error: {msg}"),
        );
    }

    /// Starts the launch plan and waits for it to end.
    async fn execute(
        &self,
        t: &Target<'_>,
        launch: Launch,
        streams: &Arc<ContainerStreams>,
        container_id: &str,
        started_at: &mut String,
    ) -> Outcome {
        let w = t.w;
        let name = t.name;
        match launch {
            Launch::Engine(run) => {
                self.execute_engine(t, run, streams, container_id, started_at)
                    .await
            }
            Launch::Process(spec) => {
                if w.is_terminating() {
                    return Outcome::Abandoned;
                }
                let running = match process::spawn(&spec, streams.clone(), self.processes.clone()) {
                    Ok(running) => running,
                    Err(e) => {
                        self.report_start_error(t, &e.to_string(), streams, container_id);
                        return Outcome::StartFailed;
                    }
                };
                if !w.admit(name, |slot| slot.pgid = Some(running.pgid)) {
                    process::signal(running.pgid, Signal::SIGKILL);
                    let _ = running.exit.await;
                    return Outcome::Abandoned;
                }
                self.mark_started(t, container_id, started_at);
                let code = running.exit.await.unwrap_or(137);
                // Let the output readers drain the pipes before closing.
                tokio::time::sleep(Duration::from_millis(20)).await;
                w.slots().entry(name.to_string()).or_default().pgid = None;
                Outcome::Exited(code)
            }
            Launch::BundleFetch(plan, mounts) => {
                let stop = CancellationToken::new();
                if !w.admit(name, |slot| slot.stop = Some(stop.clone())) {
                    return Outcome::Abandoned;
                }
                self.mark_started(t, container_id, started_at);
                let out = tokio::select! {
                    out = bundle_fetch::run(&plan, &mounts, &self.http) => Some(out),
                    _ = stop.cancelled() => None,
                };
                w.slots().entry(name.to_string()).or_default().stop = None;
                Outcome::Exited(match out {
                    Some(out) => {
                        for line in out.stderr {
                            streams.push(StreamKind::Stderr, Bytes::from(format!("{line}\n")));
                        }
                        out.exit_code
                    }
                    None => 143,
                })
            }
            Launch::Virtual => {
                let stop = CancellationToken::new();
                if !w.admit(name, |slot| slot.stop = Some(stop.clone())) {
                    return Outcome::Abandoned;
                }
                self.mark_started(t, container_id, started_at);
                // One line, as a kernel prints when it starts: a runner
                // that waits for a session's first output sees it.
                streams.push(
                    StreamKind::Stdout,
                    Bytes::from_static(b"virtual container started\n"),
                );
                stop.cancelled().await;
                w.slots().entry(name.to_string()).or_default().stop = None;
                Outcome::Exited(143)
            }
        }
    }

    /// The runtime refused to start the process: the container is
    /// terminated with `StartError`, as containerd reports a bad binary.
    pub(super) fn report_start_error(
        &self,
        t: &Target<'_>,
        error: &str,
        streams: &ContainerStreams,
        container_id: &str,
    ) {
        let msg = format!(
            "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: {error}: unknown"
        );
        self.report_start_failure(t, &msg, streams, container_id);
    }

    /// A container that never started: terminated with `StartError` and
    /// the runtime's `msg`.
    pub(super) fn report_start_failure(
        &self,
        t: &Target<'_>,
        msg: &str,
        streams: &ContainerStreams,
        container_id: &str,
    ) {
        self.event(
            t.w,
            Some(t.fp.to_string()),
            EventType::Warning,
            "Failed",
            &format!("Error: {msg}"),
        );
        self.container_model(t.w, t.init, t.idx, |m| {
            m.container_id = Some(container_id.to_string());
            m.state = ContainerState::Terminated {
                exit_code: 128,
                reason: "StartError".into(),
                message: Some(msg.to_string()),
                started_at: "1970-01-01T00:00:00Z".into(),
                finished_at: meta::now_timestamp(),
                container_id: container_id.to_string(),
            };
        });
        streams.close();
        self.publish(t.w);
    }

    /// A container that ran and exited: its terminated state, and the pod's
    /// phase when that was its last main container and nothing restarts.
    fn record_exit(
        &self,
        t: &Target<'_>,
        ctx: &PodCtx,
        exit_code: i32,
        reason: Option<&str>,
        started_at: &str,
        container_id: &str,
    ) {
        self.container_model(t.w, t.init, t.idx, |m| {
            m.ready = false;
            m.state = ContainerState::Terminated {
                exit_code,
                reason: reason
                    .unwrap_or(status::terminated_reason(exit_code))
                    .into(),
                message: None,
                started_at: started_at.to_string(),
                finished_at: meta::now_timestamp(),
                container_id: container_id.to_string(),
            };
        });
        if !t.init {
            // Phase stays Running while any main container still runs.
            self.with_model(t.w, |m| {
                if m.reason.is_none()
                    && m.main.iter().all(|c| c.state.is_terminated())
                    && ctx.restart_policy == "Never"
                {
                    m.phase = status::terminal_phase(&m.main);
                }
            });
        }
        self.publish(t.w);
    }

    pub(super) fn mark_started(&self, t: &Target<'_>, container_id: &str, started_at: &str) {
        let (w, init, fp, name) = (t.w, t.init, t.fp, t.name);
        self.container_model(w, init, t.idx, |m| {
            m.container_id = Some(container_id.to_string());
            m.state = ContainerState::Running {
                started_at: started_at.to_string(),
            };
            m.ready = !init && !t.probed;
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
}
