//! One container's run: pull, launch, its streams, its status from start to
//! exit, and the `Started` mark.

use super::*;

impl Kubelet {
    pub(super) async fn run_container(
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
    pub(super) fn mark_started(
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
}
