//! The docker runtime's side of a container's life: its volumes owned as
//! the kubelet owns them, its `docker create`, the client that starts it
//! attached to its streams, its exit read from the engine (`OOMKilled`
//! included), and stopping it through the engine.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

use super::container::{Outcome, Target};
use super::engine::{INSTANCE_LABEL, OWNER_LABEL, POD_UID_LABEL, TYPE_LABEL};
use super::engine_spec::{CreateSpec, EngineMount, create_args};
use super::*;

/// How long a stopped container's client may take to exit before it is
/// killed.
const CLIENT_EXIT_WAIT: Duration = Duration::from_secs(5);

impl Kubelet {
    /// The container as a created engine container, and the client process
    /// that will start it.
    pub(super) async fn engine_plan(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Container,
        image: &ImageInfo,
    ) -> Result<Launch, LaunchError> {
        let Some(engine) = self.engine.as_ref() else {
            return Err(LaunchError::Create("no container engine".into()));
        };
        let container_dir = ctx.sandbox.join("containers").join(&c.name);
        let _ = tokio::fs::create_dir_all(&container_dir).await;
        let env = self.container_env(w, ctx, c)?;
        let mounts = engine_mounts(ctx, c).await;
        let name = format!(
            "kube-sim_{}_{}_{}_{}",
            c.name,
            w.name,
            w.ns,
            meta::random_hex(4)
        );
        let labels = pod_labels(engine, w, &c.name, "container");
        // In the pod's network namespace (its infra container's), which
        // gives the container its hostname too; else the host's.
        let (network, hostname) = match &ctx.infra {
            Some(infra) => (format!("container:{infra}"), None),
            None => ("host".to_string(), Some(pod_hostname(&ctx.pod))),
        };
        let args = |hostname: Option<&str>| {
            create_args(&CreateSpec {
                name: &name,
                labels: &labels,
                network: &network,
                hostname,
                pod: &ctx.pod,
                container: c,
                image_user: &image.user,
                env: &env,
                mounts: &mounts,
            })
            .map_err(LaunchError::Config)
        };
        let id = match engine.create(&args(hostname.as_deref())?).await {
            // Some engines refuse a hostname with the host's network.
            Err(e) if e.contains("onflicting options: hostname") => {
                engine.create(&args(None)?).await
            }
            created => created,
        }
        .map_err(LaunchError::Create)?;
        let tty = c.tty.unwrap_or(false);
        let stdin = c.stdin.unwrap_or(false);
        Ok(Launch::Engine(EngineRun {
            start: SpawnSpec {
                program: engine.client().to_path_buf(),
                args: engine.start_args(&name, stdin, tty),
                env: engine.client_env(),
                cwd: container_dir,
                tty,
                stdin,
                stdin_once: c.stdin_once.unwrap_or(false),
            },
            name,
            id,
        }))
    }

    /// The isolated pod network of a docker runtime pod: its infra
    /// container, holding the pod's hostname and network namespace, with
    /// the pod's veth and address moved into that namespace. Its name is
    /// what the pod's containers join.
    pub(super) async fn engine_pod_network(
        &self,
        engine: &Engine,
        bridge: &podnet::Bridge,
        w: &PodWorker,
        pod: &PodView,
    ) -> Result<(podnet::PodNet, String), String> {
        let name = format!("kube-sim_POD_{}_{}_{}", w.name, w.ns, meta::random_hex(4));
        let labels = pod_labels(engine, w, "POD", "podsandbox");
        let pid = engine
            .start_infra(&name, &labels, &pod_hostname(pod))
            .await?;
        match bridge.attach_process(pid).await {
            Ok(net) => Ok((net, name)),
            Err(e) => {
                engine.remove(&name).await;
                Err(e)
            }
        }
    }

    /// Starts a created container through its client, marks it started
    /// when the engine says it has, and reads how it ended once the client
    /// has exited; the container is removed after.
    pub(super) async fn execute_engine(
        &self,
        t: &Target<'_>,
        run: EngineRun,
        streams: &Arc<ContainerStreams>,
        container_id: &str,
        started_at: &mut String,
    ) -> Outcome {
        let Some(engine) = self.engine.clone() else {
            return Outcome::Abandoned;
        };
        let w = t.w;
        if w.is_terminating() {
            engine.remove(&run.name).await;
            return Outcome::Abandoned;
        }
        let mut start = engine.watch_start(&run.name);
        let running = match process::spawn(&run.start, streams.clone(), self.processes.clone()) {
            Ok(running) => running,
            Err(e) => {
                engine.unwatch_start(&run.name);
                engine.remove(&run.name).await;
                self.report_start_error(t, &e.to_string(), streams, container_id);
                return Outcome::StartFailed;
            }
        };
        let admitted = w.admit(t.name, |slot| {
            slot.pgid = Some(running.pgid);
            slot.engine = Some(run.name.clone());
        });
        if !admitted {
            engine.unwatch_start(&run.name);
            process::signal(running.pgid, Signal::SIGKILL);
            let _ = running.exit.await;
            engine.remove(&run.name).await;
            return Outcome::Abandoned;
        }
        let client_exited = CancellationToken::new();
        let _client_exited = client_exited.clone().drop_guard();
        if run.start.tty {
            relay_resizes(streams, running.pgid, client_exited.clone());
        }
        let mut exit = running.exit;
        let mut marked = false;
        let client_code = tokio::select! {
            // A start event, or none to wait for (the events are not
            // followed): started.
            _ = &mut start => {
                *started_at = meta::now_timestamp();
                self.mark_started(t, container_id, started_at);
                marked = true;
                (&mut exit).await
            }
            code = &mut exit => code,
        }
        .unwrap_or(137);
        client_exited.cancel();
        engine.unwatch_start(&run.name);
        // Let the output readers drain the pipes before closing.
        tokio::time::sleep(Duration::from_millis(20)).await;
        {
            let mut slots = w.slots();
            let slot = slots.entry(t.name.to_string()).or_default();
            slot.pgid = None;
            slot.engine = None;
        }
        let state = engine.settled_exit_state(&run.name).await;
        let outcome = match state {
            // The client was killed (shutdown) while the container ran.
            Some(s) if s.running => Outcome::Exited(137),
            Some(s) if !s.started && !marked => {
                engine.remove(&run.name).await;
                if w.is_terminating() || w.kill.is_cancelled() {
                    return Outcome::Abandoned;
                }
                let error = if s.error.is_empty() {
                    format!("the container did not start (its client exited with {client_code})")
                } else {
                    s.error
                };
                // What the client printed is no container output: the
                // log of a container that never started is empty.
                streams.close();
                let fresh = Arc::new(ContainerStreams::new(streams.tty, streams.stdin_open));
                w.slots().entry(t.name.to_string()).or_default().current = Some(fresh.clone());
                let msg = format!("failed to create containerd task: {error}");
                self.report_start_failure(t, &msg, &fresh, container_id);
                return Outcome::StartFailed;
            }
            Some(s) => {
                if !marked {
                    *started_at = meta::now_timestamp();
                    self.mark_started(t, container_id, started_at);
                }
                if s.oom_killed {
                    Outcome::ExitedWith(s.exit_code, "OOMKilled")
                } else {
                    Outcome::Exited(s.exit_code)
                }
            }
            // Removed under it (the simulator is stopping).
            None => Outcome::Exited(client_code),
        };
        engine.remove(&run.name).await;
        outcome
    }

    /// Stops every running container of the pod through the engine (its
    /// stop signal, SIGKILL after `grace`), then waits for their clients.
    pub(super) async fn stop_engine_containers(
        &self,
        engine: &Engine,
        w: &PodWorker,
        grace: Duration,
    ) {
        let targets: Vec<(String, String)> = w
            .slots()
            .iter()
            .filter_map(|(n, s)| s.engine.clone().map(|e| (n.clone(), e)))
            .collect();
        if targets.is_empty() {
            return;
        }
        if !grace.is_zero() {
            for (n, _) in &targets {
                self.event(
                    w,
                    Some(format!("spec.containers{{{n}}}")),
                    EventType::Normal,
                    "Killing",
                    &format!("Stopping container {n}"),
                );
            }
        }
        futures_util::future::join_all(targets.iter().map(|(_, c)| engine.stop(c, grace))).await;
        let deadline = Instant::now() + CLIENT_EXIT_WAIT;
        loop {
            let alive: Vec<i32> = w
                .slots()
                .values()
                .filter(|s| s.engine.is_some())
                .filter_map(|s| s.pgid)
                .collect();
            if alive.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                for g in alive {
                    process::signal(g, Signal::SIGKILL);
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The pod's volumes as the kubelet leaves them for a container: an
    /// emptyDir world-writable (0777), and with an `fsGroup` every volume
    /// owned by that group, group-writable (configMap and secret volumes
    /// group-readable) and its directories setgid.
    pub(super) async fn prepare_engine_volumes(&self, ctx: &PodCtx) {
        let fs_group = ctx
            .pod
            .spec
            .security_context
            .as_ref()
            .and_then(|s| s.fs_group)
            .and_then(|g| u32::try_from(g).ok());
        for v in ctx.pod.spec.volumes.iter().flatten() {
            let dir = ctx.sandbox.join("volumes").join(&v.name);
            let projected = v.config_map.is_some() || v.secret.is_some();
            let owned = tokio::task::spawn_blocking(move || {
                set_volume_ownership(&dir, projected, fs_group)
            })
            .await;
            if let Ok(Err(e)) = owned {
                tracing::warn!(volume = %v.name, "could not set the volume's ownership: {e}");
            }
        }
    }
}

/// The client passes a terminal resize on to the container when its
/// terminal signals one (SIGWINCH), but only once it watches for it, a
/// moment after the container started: a resize before that would be lost.
/// So after each resize the client is signalled again a few times (a
/// client that already applied the size resizes to the same size, which
/// changes nothing).
fn relay_resizes(streams: &ContainerStreams, pgid: i32, client_exited: CancellationToken) {
    const NUDGES: [Duration; 4] = [
        Duration::from_millis(100),
        Duration::from_millis(400),
        Duration::from_secs(1),
        Duration::from_secs(3),
    ];
    let Some(pty) = streams.take_resize() else {
        return;
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u16, u16)>();
    streams.set_resize(tx);
    tokio::spawn(async move {
        let mut nudges = tokio::task::JoinSet::new();
        while let Some(size) = rx.recv().await {
            if pty.send(size).is_err() {
                break;
            }
            nudges.abort_all();
            let exited = client_exited.clone();
            nudges.spawn(async move {
                for pause in NUDGES {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = exited.cancelled() => return,
                    }
                    process::signal(pgid, Signal::SIGWINCH);
                }
            });
        }
    });
}

fn set_volume_ownership(dir: &Path, projected: bool, fs_group: Option<u32>) -> std::io::Result<()> {
    if !projected {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    }
    let Some(gid) = fs_group else {
        return Ok(());
    };
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        std::os::unix::fs::lchown(&path, None, Some(gid))?;
        let mut mode = meta.mode() & 0o7777 | if projected { 0o440 } else { 0o660 };
        if meta.is_dir() {
            mode |= 0o2110;
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// The container's `volumeMounts` as bind mounts of the pod's volume
/// directories; a `subPath` directory is made with its volume's mode and
/// group. ConfigMap and Secret volumes are always read-only.
async fn engine_mounts(ctx: &PodCtx, c: &Container) -> Vec<EngineMount> {
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let root = ctx.sandbox.join("volumes").join(&m.name);
        let projected = ctx
            .pod
            .spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .is_some_and(|v| v.config_map.is_some() || v.secret.is_some());
        let mut source = root.clone();
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            source = root.join(sub.trim_start_matches('/'));
            if !projected {
                let (root, sub) = (root.clone(), sub.to_string());
                let made = tokio::task::spawn_blocking(move || make_sub_path(&root, &sub)).await;
                if let Ok(Err(e)) = made {
                    tracing::warn!(volume = %m.name, "could not make subPath {:?}: {e}", m.sub_path);
                }
            }
        }
        out.push(EngineMount {
            source,
            target: m.mount_path.clone(),
            read_only: m.read_only == Some(true) || projected,
        });
    }
    out
}

fn make_sub_path(root: &Path, sub: &str) -> std::io::Result<()> {
    let meta = std::fs::metadata(root)?;
    let mut path = root.to_path_buf();
    for part in Path::new(sub).components() {
        path.push(part);
        if path.exists() {
            continue;
        }
        std::fs::create_dir(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        let _ = std::os::unix::fs::lchown(&path, None, Some(meta.gid()));
    }
    Ok(())
}

/// The labels of a pod's engine container (`kind`: `container`, or
/// `podsandbox` for its infra container), as the kubelet's docker
/// integration labels them, with this simulator's instance and process.
fn pod_labels(
    engine: &Engine,
    w: &PodWorker,
    container: &str,
    kind: &str,
) -> Vec<(String, String)> {
    let owner = engine.owner().map(|o| (OWNER_LABEL, o));
    [
        (INSTANCE_LABEL, engine.instance()),
        (POD_UID_LABEL, w.uid.as_str()),
        ("io.kubernetes.pod.name", w.name.as_str()),
        ("io.kubernetes.pod.namespace", w.ns.as_str()),
        ("io.kubernetes.container.name", container),
        (TYPE_LABEL, kind),
    ]
    .into_iter()
    .chain(owner)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The pod's hostname: `spec.hostname`, else its name cut to 63
/// characters without a trailing `-` or `.`, as the kubelet makes it.
fn pod_hostname(pod: &PodView) -> String {
    if let Some(h) = pod.spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        return h.to_string();
    }
    let name = pod.metadata.name.as_deref().unwrap_or("pod");
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.']).to_string()
}
