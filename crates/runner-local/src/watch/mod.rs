//! Watch sessions on the local backend: one `telo run --watch --inspect`
//! process per app, each in its own terminal (and sandbox), over one
//! workspace directory the runner edits itself through `runner-workspace`.
//!
//! The workspace is the checkpoint: it lives under the work root with a
//! record of the session (`watch.json`), so a suspended session — or one
//! whose processes a runner crash took down — is found by the next runner
//! and resumes with its files (`record`). Each app's process is followed to
//! its end by `app_end`.

mod app_end;
pub(crate) mod record;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use runner_api::types::{PortMapping, PortProtocol, RunBundle, RunStatus, RunnerEndpoint};
use runner_api::watch::{
    AppSpec, IoMode, StreamTag, WorkspaceApplyResult, WorkspaceChangeSet, WorkspaceFileContent,
    WorkspaceTree,
};
use runner_core::observe::Observer;
use runner_core::sync::lock;
use runner_core::tasks::OwnedTasks;
use runner_core::{
    AgentLaunch, BackendSession, SessionSink, StartError, StartStage, StopError, WatchSpec,
    WatchStart, WatchWorkload, WorkspaceFailure,
};
use runner_workspace::{Workspace, WorkspaceError, WorkspaceLimits};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, debug, info, warn};

use self::app_end::{AppEnd, follow_app_to_end};
use self::record::{Record, read_record, record_path, write_record};
use crate::disk_bound::DiskBound;
use crate::launch::{LaunchPlan, without_forced_colour, workload_env};
use crate::network::SessionNetwork;
use crate::process::pipes::{Started, spawn_with_pipes};
use crate::process::plan::SpawnPlan;
use crate::process::pty::spawn_in_pty;
use crate::process::spawner::on_spawner_thread;
use crate::sandbox::bubblewrap::{Sandbox, WorkloadSession};
use crate::session::LocalSession;
use crate::session::wiring::{WiredProcess, wire_process};
use crate::work_root::session_dir::WorkDir;

/// The name the agent's process goes by among the apps: reserved, so no
/// app of a session has it, and no client reaches its stdin.
const AGENT_NAME: &str = "agent";

/// How long a torn-down app's output may take to drain.
const TEARDOWN_BOUND: Duration = Duration::from_secs(30);

/// What starting an app process needs, shared by every app of a session.
#[derive(Clone)]
pub(crate) struct Launcher {
    /// The configured Telo CLI: what an app that names no version runs.
    pub telo: PathBuf,
    /// `RUNNER_LOCAL_TELO_VERSIONS`: where a named version's kernel is.
    pub telo_versions: Option<PathBuf>,
    pub node: Option<PathBuf>,
    pub path: String,
    pub sandbox: Option<Arc<Sandbox>>,
    /// What the session's own kernel cache is filled from.
    pub kernel_cache: crate::kernel::cache_warm_up::CacheSource,
    pub stop_grace: Duration,
    pub networks: Arc<crate::network::Networks>,
    pub tasks: OwnedTasks,
    pub limits: WorkspaceLimits,
    /// `RUNNER_LOCAL_MAX_DISK`: what the session's directory may hold.
    pub disk_bytes: u64,
}

impl Launcher {
    /// The kernel app `app` runs: its version's, else the configured CLI.
    fn kernel(&self, app: &AppSpec) -> PathBuf {
        let version = app
            .telo
            .as_deref()
            .and_then(runner_api::telo::TeloVersion::parse);
        match (version, &self.telo_versions) {
            (Some(version), Some(dir)) => crate::kernel::versions::kernel_path(dir, &version),
            _ => self.telo.clone(),
        }
    }
}

/// A running watch session.
pub(crate) struct LocalWatch {
    id: String,
    work: WorkDir,
    workspace: Arc<Workspace>,
    launcher: Launcher,
    sink: SessionSink,
    env: Mutex<Vec<(String, String)>>,
    record: Mutex<Record>,
    apps: Mutex<Vec<RunningApp>>,
    /// The co-resident agent it runs (started after the apps, taken down
    /// with them).
    agent: Mutex<Option<AgentLaunch>>,
    /// A client stopped it: the end is `stopped`.
    stopping: AtomicBool,
    /// The network its apps and agent share; let go once they are gone.
    network: Mutex<Option<SessionNetwork>>,
}

struct RunningApp {
    spec: AppSpec,
    process: Arc<LocalSession>,
    /// Ends the app's relays and asks its end task to take it down.
    teardown: CancellationToken,
    /// Fires once the process is gone and its output drained.
    gone: Option<oneshot::Receiver<()>>,
}

/// Where session `id` keeps its workspace and record.
fn work_dir(work_root: &std::path::Path, id: &str) -> Result<WorkDir, StartError> {
    WorkDir::for_session(work_root, id)
        .map_err(|err| StartError::new(StartStage::Start, err.to_string()))
}

/// Starts (seeded) or resumes session `spec` on this machine.
pub(crate) async fn start(
    launcher: Launcher,
    work_root: PathBuf,
    spec: WatchSpec,
    start: WatchStart,
    sink: SessionSink,
) -> Result<Arc<LocalWatch>, StartError> {
    let work = work_dir(&work_root, &spec.session_id)?;
    let limits = launcher.limits;
    let seeding = matches!(start, WatchStart::Seed(_));
    let cache = session_cache(&launcher, &work);
    let prepared = {
        let work = work.clone();
        let spec = spec.clone();
        let source = launcher.kernel_cache.clone();
        tokio::task::spawn_blocking(move || {
            let prepared = prepare(&work, spec, start, limits)?;
            // Every app of the session shares it: one tenant's kernels.
            let seeded = source.prepare(&cache).map_err(|err| {
                StartError::new(
                    StartStage::Create,
                    format!("could not create the session's kernel cache: {err}"),
                )
                .with_source(err)
            })?;
            Ok((prepared, seeded))
        })
        .await
        .map_err(|join| {
            StartError::new(
                StartStage::Create,
                format!("preparing the workspace was interrupted: {join}"),
            )
        })?
    };
    let (workspace, record) = match prepared {
        Ok((prepared, seeded)) => {
            launcher.kernel_cache.after_prepare(&seeded);
            prepared
        }
        Err(err) => {
            if seeding {
                work.discard();
            }
            return Err(err);
        }
    };
    let network = match launcher.networks.for_session().await {
        Ok(network) => network,
        Err(err) => {
            if seeding {
                work.discard();
            }
            return Err(err);
        }
    };
    let watch = Arc::new(LocalWatch {
        id: spec.session_id.clone(),
        work,
        workspace: Arc::new(workspace),
        launcher,
        sink: sink.clone(),
        env: Mutex::new(spec.env.clone()),
        record: Mutex::new(record),
        apps: Mutex::new(Vec::new()),
        agent: Mutex::new(None),
        stopping: AtomicBool::new(false),
        network: Mutex::new(Some(network)),
    });
    let launched = match watch.launch_apps(&spec.apps).await {
        Ok(()) => watch.launch_agent(spec.agent_launch.as_ref()).await,
        Err(err) => Err(err),
    };
    if let Err(err) = launched {
        watch.take_down().await;
        if seeding {
            watch.work.discard();
        }
        return Err(err);
    }
    *lock(&watch.agent) = spec.agent_launch.clone();
    sink.status(running_status(&spec.apps, spec.agent_launch.as_ref()));
    info!(session_id = %spec.session_id, apps = spec.apps.len(), "watch session running");
    Ok(watch)
}

/// The session's own kernel cache, as its apps see it.
fn session_cache(launcher: &Launcher, work: &WorkDir) -> crate::kernel_cache::SessionCache {
    crate::kernel_cache::SessionCache::new(work.kernel_cache(), launcher.sandbox.is_some())
}

/// The directories, the seeded (or kept) workspace and the record.
fn prepare(
    work: &WorkDir,
    spec: WatchSpec,
    start: WatchStart,
    limits: WorkspaceLimits,
) -> Result<(Workspace, Record), StartError> {
    let create =
        |err: WorkspaceError| StartError::new(StartStage::Create, err.to_string()).with_source(err);
    match start {
        WatchStart::Seed(bundle) => {
            work.create().map_err(|err| {
                StartError::new(StartStage::Create, err.to_string()).with_source(err)
            })?;
            let workspace = Workspace::create(&work.app(), limits).map_err(create)?;
            seed(&workspace, &bundle).map_err(|err| {
                StartError::new(StartStage::Bundle, err.to_string()).with_source(err)
            })?;
            let record = Record {
                spec,
                generation: 0,
            };
            write_record(work, &record).map_err(|err| {
                StartError::new(
                    StartStage::Create,
                    format!("could not record the session: {err}"),
                )
                .with_source(err)
            })?;
            Ok((workspace, record))
        }
        // Nothing of a local session outlives the runner: an adoption is
        // a resume.
        WatchStart::Resume | WatchStart::Adopt => {
            let workspace = Workspace::open(&work.app(), limits).map_err(|err| {
                StartError::new(
                    StartStage::Resume,
                    format!("the session's workspace is gone: {err}"),
                )
                .with_source(err)
            })?;
            let generation = read_record(work).map_or(0, |record| record.generation);
            let record = Record { spec, generation };
            write_record(work, &record).map_err(|err| {
                StartError::new(
                    StartStage::Resume,
                    format!("could not record the session: {err}"),
                )
                .with_source(err)
            })?;
            Ok((workspace, record))
        }
    }
}

fn seed(workspace: &Workspace, bundle: &RunBundle) -> Result<WorkspaceApplyResult, WorkspaceError> {
    workspace.seed(&bundle.files)
}

fn running_status(apps: &[AppSpec], agent: Option<&AgentLaunch>) -> RunStatus {
    let mut status = RunStatus::running_unrouted(apps.iter().flat_map(|app| app.ports.iter()));
    if let (RunStatus::Running { agent: slot, .. }, Some(agent)) = (&mut status, agent) {
        *slot = Some(RunnerEndpoint::unrouted(PortMapping {
            port: agent.port,
            protocol: PortProtocol::Tcp,
        }));
    }
    status
}

impl LocalWatch {
    /// Runs `operation` on the workspace off the async runtime.
    async fn on_workspace<T: Send + 'static>(
        &self,
        operation: impl FnOnce(&Workspace) -> Result<T, WorkspaceError> + Send + 'static,
    ) -> Result<T, WorkspaceFailure> {
        let workspace = self.workspace.clone();
        tokio::task::spawn_blocking(move || operation(&workspace))
            .await
            .map_err(|join| {
                WorkspaceFailure::unavailable(format!(
                    "the workspace operation was interrupted: {join}"
                ))
            })?
            .map_err(|err| runner_workspace_service::failure(&err))
    }

    /// Starts one process per app, in order.
    async fn launch_apps(&self, apps: &[AppSpec]) -> Result<(), StartError> {
        for (index, app) in apps.iter().enumerate() {
            let running = self.launch_app(index, app).await?;
            lock(&self.apps).push(running);
        }
        Ok(())
    }

    /// The network its workloads run in (while they may run).
    fn network(&self) -> Result<SessionNetwork, StartError> {
        lock(&self.network)
            .clone()
            .ok_or_else(|| StartError::new(StartStage::Start, "the session has stopped".to_owned()))
    }

    async fn launch_app(&self, index: usize, app: &AppSpec) -> Result<RunningApp, StartError> {
        let network = self.network()?;
        let inspect_port = network.free_loopback_port().await.map_err(|err| {
            StartError::new(
                StartStage::Start,
                format!(
                    "could not reserve a port for --inspect of app '{}': {err}",
                    app.name
                ),
            )
            .with_source(err)
        })?;
        let launcher = &self.launcher;
        let entry = format!("./{}", app.entry_relative_path);
        let argv = vec![
            launcher.kernel(app).into_os_string(),
            "run".into(),
            "--watch".into(),
            "--inspect".into(),
            format!("127.0.0.1:{inspect_port}").into(),
            "--no-open".into(),
            entry.into(),
        ];
        let terminal = app.io == IoMode::Tty;
        let mut env = lock(&self.env).clone();
        if terminal {
            env.push(("CLICOLOR_FORCE".to_owned(), "1".to_owned()));
        }
        let cache = session_cache(launcher, &self.work);
        let mut env = workload_env(&env, &self.work.home(), &launcher.path, Some(&cache));
        if !terminal {
            // Its output goes to pipes a client shows as it is: no colour
            // unless the session asks for it.
            env = without_forced_colour(env, &lock(&self.env));
        }
        let plan = LaunchPlan {
            argv,
            cwd: self.work.app(),
            env,
        };
        let spawn = match &launcher.sandbox {
            None => plan.unsandboxed(),
            Some(sandbox) => {
                let kernel = launcher.kernel(app);
                let mut programs = vec![kernel.as_path()];
                programs.extend(launcher.node.as_deref());
                let read_only = sandbox.installations(&programs);
                // The app and home directories, not the session's root: the
                // record beside them names the agent's token.
                let read_write = vec![self.work.app(), self.work.home()];
                let session = if terminal {
                    WorkloadSession::Terminal
                } else {
                    WorkloadSession::Detached
                };
                sandbox
                    .spawn_plan(
                        plan,
                        crate::sandbox::bubblewrap::SessionMounts {
                            read_only: &read_only,
                            read_write: &read_write,
                            kernel_cache: Some(cache.host_dir()),
                        },
                        session,
                    )
                    .map_err(|err| {
                        StartError::new(
                            StartStage::Start,
                            format!("could not hand the sandbox its arguments: {err}"),
                        )
                        .with_source(err)
                    })?
            }
        };
        let spawn = network.enter(spawn);
        let members = spawn.members;
        let process = start_process(spawn, terminal, &format!("app '{}'", app.name)).await?;
        let sink = self.sink.clone();
        let name = app.name.clone();
        let WiredProcess {
            session,
            exited,
            output_drained,
        } = wire_process(
            &format!("{}-{index}", self.id),
            process,
            members,
            move |tag: StreamTag, bytes: Bytes| sink.app_output(&name, tag, bytes),
            launcher.stop_grace,
        )?;
        let teardown = self.sink.ended().child_token();
        let (gone_tx, gone) = oneshot::channel();
        launcher.tasks.spawn(
            follow_app_to_end(AppEnd {
                name: app.name.clone(),
                note_tag: if terminal {
                    StreamTag::Tty
                } else {
                    StreamTag::Stderr
                },
                process: session.clone(),
                sink: self.sink.clone(),
                teardown: teardown.clone(),
                exited,
                output_drained,
                gone: gone_tx,
                disk: self.disk_bound(),
            })
            .instrument(Span::current()),
        );
        Observer {
            tasks: &launcher.tasks,
            sink: &self.sink,
            reach: network.reach(),
            stop: &teardown,
        }
        .observe_app(app, inspect_port);
        debug!(session_id = %self.id, app = %app.name, "watch app started");
        Ok(RunningApp {
            spec: app.clone(),
            process: session,
            teardown,
            gone: Some(gone),
        })
    }

    /// Starts the co-resident agent: the operator's program, over the
    /// workspace, with the operator's env (its token included) and nothing
    /// of the session's. It runs on pipes in a sandbox of its own, with a
    /// home of its own that no app's sandbox shows; its output is not a
    /// session channel, so it goes to the runner's log. The workspace is
    /// the one place it shares with the apps, which write it: what the
    /// agent finds there is untrusted input.
    async fn launch_agent(&self, agent: Option<&AgentLaunch>) -> Result<(), StartError> {
        let Some(agent) = agent else {
            return Ok(());
        };
        let launcher = &self.launcher;
        let Some(command) = agent.command.as_deref().filter(|c| !c.is_empty()) else {
            return Err(StartError::new(
                StartStage::Start,
                format!(
                    "agent '{}' has no 'command' configured for the local backend",
                    agent.name
                ),
            ));
        };
        let program = crate::process::executable::resolve_executable(&command[0], &launcher.path)
            .ok_or_else(|| {
            StartError::new(
                StartStage::Start,
                format!(
                    "command '{}' of agent '{}' was not found on this runner's host",
                    command[0], agent.name
                ),
            )
        })?;
        let workspace = self.work.app();
        let home = self
            .work
            .create_agent_home()
            .map_err(|err| StartError::new(StartStage::Start, err.to_string()).with_source(err))?;
        let mut env = agent.env.clone();
        env.push((
            "WORKSPACE_DIR".to_owned(),
            workspace.to_string_lossy().into_owned(),
        ));
        let plan = LaunchPlan {
            argv: crate::launch::app_argv(&program, command),
            cwd: workspace.clone(),
            env: workload_env(&env, &home, &launcher.path, None),
        };
        let spawn = match &launcher.sandbox {
            None => plan.unsandboxed(),
            Some(sandbox) => {
                let read_only: Vec<PathBuf> = sandbox
                    .installations(&[program.as_path()])
                    .into_iter()
                    .chain(
                        command
                            .iter()
                            .skip(1)
                            .map(std::path::Path::new)
                            .filter(|arg| arg.is_absolute() && arg.is_file())
                            .map(std::path::Path::to_path_buf),
                    )
                    .collect();
                // Its own home, never the apps' one: what an app writes into
                // its home must not become the agent's configuration, and
                // what the agent keeps in its home (credentials a tool
                // caches) must not be an app's to read.
                let read_write = vec![workspace, home];
                sandbox
                    .spawn_plan(
                        plan,
                        crate::sandbox::bubblewrap::SessionMounts {
                            read_only: &read_only,
                            read_write: &read_write,
                            kernel_cache: None,
                        },
                        WorkloadSession::Detached,
                    )
                    .map_err(|err| {
                        StartError::new(
                            StartStage::Start,
                            format!("could not hand the agent's sandbox its arguments: {err}"),
                        )
                        .with_source(err)
                    })?
            }
        };
        let spawn = self.network()?.enter(spawn);
        let members = spawn.members;
        let process = start_process(spawn, false, &format!("agent '{}'", agent.name)).await?;
        let session_id = self.id.clone();
        let name = agent.name.clone();
        let WiredProcess {
            session,
            exited,
            output_drained,
        } = wire_process(
            &format!("{}-agent", self.id),
            process,
            members,
            move |_tag: StreamTag, bytes: Bytes| {
                debug!(session_id = %session_id, agent = %name, output = %String::from_utf8_lossy(&bytes), "agent output");
            },
            launcher.stop_grace,
        )?;
        let teardown = self.sink.ended().child_token();
        let (gone_tx, gone) = oneshot::channel();
        launcher.tasks.spawn(
            follow_app_to_end(AppEnd {
                name: AGENT_NAME.to_owned(),
                note_tag: StreamTag::Stderr,
                process: session.clone(),
                sink: self.sink.clone(),
                teardown: teardown.clone(),
                exited,
                output_drained,
                gone: gone_tx,
                disk: self.disk_bound(),
            })
            .instrument(Span::current()),
        );
        info!(session_id = %self.id, agent = %agent.name, port = agent.port, "co-resident agent started");
        lock(&self.apps).push(RunningApp {
            spec: AppSpec {
                name: AGENT_NAME.to_owned(),
                entry_relative_path: String::new(),
                ports: Vec::new(),
                io: IoMode::Streams,
                telo: None,
            },
            process: session,
            teardown,
            gone: Some(gone),
        });
        Ok(())
    }

    /// Ends every app process and waits for them to be gone; ends the
    /// runner causes are not reported as the apps' own.
    async fn take_down(&self) {
        let apps: Vec<RunningApp> = std::mem::take(&mut *lock(&self.apps));
        end_apps(&self.id, apps).await;
    }

    /// The session's directory and `RUNNER_LOCAL_MAX_DISK`.
    fn disk_bound(&self) -> DiskBound {
        DiskBound {
            dir: self.work.root().to_owned(),
            max_bytes: self.launcher.disk_bytes,
        }
    }

    fn app(&self, name: &str) -> Option<Arc<LocalSession>> {
        lock(&self.apps)
            .iter()
            .find(|app| app.spec.name == name)
            .map(|app| app.process.clone())
    }

    fn save_record(&self) -> Result<(), WorkspaceFailure> {
        let record = lock(&self.record).clone();
        write_record(&self.work, &record).map_err(|err| {
            WorkspaceFailure::unavailable(format!("could not record the session: {err}"))
        })
    }
}

/// Starts `spawn` on the spawner thread, in a terminal or on pipes; `what`
/// names it in the failure ("app 'web'").
async fn start_process(
    spawn: SpawnPlan,
    terminal: bool,
    what: &str,
) -> Result<Started, StartError> {
    on_spawner_thread(move || {
        if terminal {
            spawn_in_pty(spawn).map(Started::from)
        } else {
            spawn_with_pipes(spawn)
                .map_err(|err| crate::process::pty::PtyError::Spawn(err.to_string()))
        }
    })
    .await
    .map_err(|err| crate::process::pty::PtyError::Spawn(err.to_string()))
    .flatten()
    .map_err(|err| {
        StartError::new(StartStage::Start, format!("could not start {what}: {err}"))
            .with_source(err)
    })
}

/// Takes `apps` down at once and waits (bounded) for each to be gone.
async fn end_apps(session_id: &str, apps: Vec<RunningApp>) {
    for app in &apps {
        app.teardown.cancel();
    }
    for mut app in apps {
        if let Some(gone) = app.gone.take()
            && tokio::time::timeout(TEARDOWN_BOUND, gone).await.is_err()
        {
            warn!(session_id, app = %app.spec.name, "an app process outlived its teardown");
        }
    }
}

#[async_trait]
impl BackendSession for LocalWatch {
    fn write_stdin(&self, bytes: Bytes) {
        let first = lock(&self.apps).first().map(|app| app.process.clone());
        if let Some(process) = first {
            process.write_stdin(bytes);
        }
    }

    fn resize(&self, cols: u16, rows: u16) {
        let first = lock(&self.apps).first().map(|app| app.process.clone());
        if let Some(process) = first {
            process.resize(cols, rows);
        }
    }

    fn write_app_stdin(&self, app: &str, bytes: Bytes) {
        if let Some(process) = self.app(app) {
            process.write_stdin(bytes);
        }
    }

    fn resize_app(&self, app: &str, cols: u16, rows: u16) {
        if let Some(process) = self.app(app) {
            process.resize(cols, rows);
        }
    }

    /// Takes the apps down in the background and reports `stopped` once
    /// they are gone; the session's files go with the session.
    async fn stop(&self) -> Result<(), StopError> {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // A stopped session is never listed again by a later runner.
        if let Err(err) = std::fs::remove_file(record_path(&self.work))
            && err.kind() != std::io::ErrorKind::NotFound
        {
            warn!(session_id = %self.id, error = %err, "could not remove a stopped watch session's record");
        }
        let apps: Vec<RunningApp> = std::mem::take(&mut *lock(&self.apps));
        let sink = self.sink.clone();
        let id = self.id.clone();
        let network = lock(&self.network).take();
        self.launcher.tasks.spawn(async move {
            end_apps(&id, apps).await;
            drop(network);
            sink.status(RunStatus::Stopped);
        });
        Ok(())
    }
}

#[async_trait]
impl WatchWorkload for LocalWatch {
    async fn tree(&self) -> Result<WorkspaceTree, WorkspaceFailure> {
        self.on_workspace(Workspace::tree).await
    }

    async fn read_file(&self, path: &str) -> Result<WorkspaceFileContent, WorkspaceFailure> {
        let path = path.to_owned();
        self.on_workspace(move |workspace| workspace.read(&path))
            .await
    }

    async fn apply(
        &self,
        changes: WorkspaceChangeSet,
    ) -> Result<WorkspaceApplyResult, WorkspaceFailure> {
        self.on_workspace(move |workspace| workspace.apply(&changes))
            .await
    }

    async fn reload(&self, app: &str) -> Result<(), WorkspaceFailure> {
        let entry = lock(&self.apps)
            .iter()
            .find(|running| running.spec.name == app)
            .map(|running| running.spec.entry_relative_path.clone())
            .ok_or_else(|| WorkspaceFailure::unknown_app(app))?;
        self.on_workspace(move |workspace| workspace.touch(&entry))
            .await
    }

    /// The workspace on disk is the checkpoint; only the record is written.
    async fn checkpoint(&self) -> Result<(), WorkspaceFailure> {
        self.save_record()
    }

    async fn set_apps(&self, apps: Vec<AppSpec>) -> Result<(), StartError> {
        self.take_down().await;
        lock(&self.record).spec.apps = apps.clone();
        if let Err(err) = self.save_record() {
            warn!(session_id = %self.id, error = %err, "could not record the new app set");
        }
        let agent = lock(&self.agent).clone();
        let launched = match self.launch_apps(&apps).await {
            Ok(()) => self.launch_agent(agent.as_ref()).await,
            Err(err) => Err(err),
        };
        if let Err(err) = launched {
            self.take_down().await;
            return Err(err);
        }
        self.sink.status(running_status(&apps, agent.as_ref()));
        Ok(())
    }

    async fn suspend(&self) -> Result<(), StopError> {
        self.save_record().map_err(|err| StopError {
            message: err.message,
        })?;
        self.take_down().await;
        info!(session_id = %self.id, "watch session suspended; its workspace is kept");
        Ok(())
    }
}
