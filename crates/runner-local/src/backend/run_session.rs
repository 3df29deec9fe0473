//! Starting a run session: its directory and bundle, the kernel it runs
//! and that kernel's cache, the command line, the sandbox it runs in
//! (`spawn_plan`), the process, and the task that follows it to its end.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use runner_core::errors::error_chain;
use runner_core::observe::Observer;
use runner_core::types::{RunBundle, RunStatus};
use runner_core::{BackendSession, SessionSink, StartError, StartSpec, StartStage};
use tracing::{Instrument, Span, info};

use crate::kernel::cache_warm_up::CacheSource;
use crate::kernel::monitor::KernelHealth;
use crate::kernel_cache::SessionCache;
use crate::launch::{LaunchPlan, app_argv, telo_argv, workload_env};
use crate::process::executable::resolve_executable;
use crate::process::group::Members;
use crate::process::pipes::Started;
use crate::process::plan::SpawnPlan;
use crate::process::pty::spawn_in_pty;
use crate::process::spawner::on_spawner_thread;
use crate::sandbox::check::SandboxHealth;
use crate::session::stop::{RunEnd, follow_run_to_end};
use crate::session::wiring::wire_process;
use crate::work_root::session_dir::{WorkDir, with_bulk_file_work};

use super::{LocalBackend, SMALL_BUNDLE_FILES};

impl LocalBackend {
    /// The command line a session runs, with its program resolved; fails
    /// before anything is created on disk.
    fn command_line(
        &self,
        spec: &StartSpec,
        inspect_port: Option<u16>,
    ) -> Result<Vec<std::ffi::OsString>, StartError> {
        match &spec.app {
            Some(app) => {
                let Some(command) = app.command.as_deref().filter(|c| !c.is_empty()) else {
                    return Err(StartError::new(
                        StartStage::Start,
                        format!(
                            "app '{}' has no 'command' configured for the local backend",
                            app.name
                        ),
                    ));
                };
                let program =
                    resolve_executable(&command[0], &self.config.path).ok_or_else(|| {
                        StartError::new(
                            StartStage::Start,
                            format!(
                                "command '{}' of app '{}' was not found on this runner's host",
                                command[0], app.name
                            ),
                        )
                    })?;
                Ok(app_argv(&program, command))
            }
            None => {
                let telo = self.kernel_for(spec.telo.as_deref())?;
                Ok(telo_argv(&telo, &spec.entry_relative_path, inspect_port))
            }
        }
    }

    /// Creates the session's directory and writes its bundle, on Tokio's
    /// blocking pool: a bundle of thousands of files takes hundreds of
    /// milliseconds of file system calls, which on the async runtime stalled
    /// every other request (`/livez` included).
    async fn stage(
        &self,
        bundle: Option<RunBundle>,
        work: &WorkDir,
        kernel_cache: Option<(SessionCache, CacheSource)>,
    ) -> Result<(), StartError> {
        let dir = work.clone();
        let staged = tokio::task::spawn_blocking(move || {
            dir.create()?;
            let seeded = match &kernel_cache {
                Some((cache, source)) => {
                    let seeded = source.prepare(cache).map_err(|source| {
                        crate::work_root::session_dir::WorkDirError::CreateKernelCache {
                            path: cache.host_dir().to_owned(),
                            source,
                        }
                    })?;
                    Some((seeded, source.clone()))
                }
                None => None,
            };
            let written = match &bundle {
                // Not for the one file of a small bundle: no waiting behind
                // a big one.
                Some(bundle) if bundle.files.len() > SMALL_BUNDLE_FILES => {
                    with_bulk_file_work(|| dir.write_bundle(bundle))
                }
                Some(bundle) => dir.write_bundle(bundle),
                None => Ok(()),
            };
            written.map(|()| seeded)
        })
        .await;
        match staged {
            Ok(Ok(seeded)) => {
                if let Some((seeded, source)) = seeded {
                    source.after_prepare(&seeded);
                }
                Ok(())
            }
            Ok(Err(err)) => {
                Err(StartError::new(StartStage::Create, error_chain(&err)).with_source(err))
            }
            Err(join) => Err(StartError::new(
                StartStage::Create,
                format!("writing the bundle was interrupted: {join}"),
            )),
        }
    }

    /// What runs `plan`: the sandbox around it, when sessions are sandboxed.
    /// `programs` are the executables whose installations it must show,
    /// `extra_read_only` further paths shown as they are.
    fn spawn_plan(
        &self,
        plan: LaunchPlan,
        sandbox: Option<&crate::sandbox::bubblewrap::Sandbox>,
        programs: &[&Path],
        extra_read_only: &[PathBuf],
        read_write: &[PathBuf],
        kernel_cache: Option<&Path>,
    ) -> Result<SpawnPlan, StartError> {
        let Some(sandbox) = sandbox else {
            return Ok(plan.unsandboxed());
        };
        let mut read_only = sandbox.installations(programs);
        read_only.extend(extra_read_only.iter().cloned());
        sandbox
            .spawn_plan(
                plan,
                crate::sandbox::bubblewrap::SessionMounts {
                    read_only: &read_only,
                    read_write,
                    kernel_cache,
                },
                crate::sandbox::bubblewrap::WorkloadSession::Terminal,
            )
            .map_err(|err| {
                StartError::new(
                    StartStage::Start,
                    format!("could not hand the sandbox its arguments: {err}"),
                )
                .with_source(err)
            })
    }

    /// Starts run session `spec`: its directory and bundle, its kernel
    /// cache, its sandbox, its process, and the task that follows it to
    /// its end.
    pub(super) async fn start_run(
        &self,
        mut spec: StartSpec,
        sink: SessionSink,
    ) -> Result<Arc<dyn BackendSession>, StartError> {
        let work = WorkDir::for_session(&self.config.work_root, &spec.session_id)
            .map_err(|err| StartError::new(StartStage::Start, err.to_string()))?;
        let network = match self.networks.for_session().await {
            Ok(network) => network,
            Err(err) => {
                work.discard();
                return Err(err);
            }
        };
        // An app runs its own command; only the Telo CLI gets `--inspect`.
        let inspect_port = if spec.inspect && !spec.self_contained() {
            Some(network.free_loopback_port().await.map_err(|err| {
                StartError::new(
                    StartStage::Start,
                    format!("could not reserve a port for --inspect: {err}"),
                )
                .with_source(err)
            })?)
        } else {
            None
        };
        let argv = self.command_line(&spec, inspect_port)?;
        // Never run a session unsandboxed the operator did not opt out of:
        // say why it cannot be sandboxed instead.
        let sandbox = match self.sandbox.health().await {
            SandboxHealth::Unusable(problem) => {
                return Err(StartError::new(StartStage::Start, problem.sentence()));
            }
            SandboxHealth::Off => None,
            SandboxHealth::Usable(sandbox) => Some(sandbox),
        };
        // A kernel known to fail every run would fail this one too, with only
        // an exit code to show for it: say why instead. (An app runs its own
        // program, not the Telo CLI.)
        if spec.app.is_none()
            && spec.telo.is_none()
            && let KernelHealth::Unusable(problem) = self.kernel.health().await
        {
            return Err(StartError::new(StartStage::Start, problem.sentence()));
        }
        // What the default kernel said it is, for `run started` (a kernel
        // before 0.95 does not say on its debug stream).
        if spec.app.is_none()
            && spec.telo.is_none()
            && let Some(version) = self.kernel.version().await
        {
            sink.kernel_version(None, version);
        }
        // Moved, not copied: a big bundle is megabytes.
        let bundle = (!spec.self_contained()).then(|| RunBundle {
            entry_relative_path: spec.bundle.entry_relative_path.clone(),
            files: std::mem::take(&mut spec.bundle.files),
        });
        // A Telo session's kernel caches into a directory of its own (an
        // operator's app is its own program and gets none).
        let kernel_cache = match &spec.app {
            Some(_) => None,
            None => Some(SessionCache::new(work.kernel_cache(), sandbox.is_some())),
        };
        let seed = match &kernel_cache {
            Some(cache) => Some((cache.clone(), self.cache_source(spec.telo.as_deref()).await)),
            None => None,
        };
        if let Err(err) = self.stage(bundle, &work, seed).await {
            work.discard();
            return Err(err);
        }
        let program = PathBuf::from(&argv[0]);
        let node = resolve_executable("node", &self.config.path);
        let mut programs = vec![program.as_path()];
        let mut read_only = Vec::new();
        let read_write = vec![work.root().to_owned()];
        if kernel_cache.is_some() {
            // The kernel runs `node` from its PATH (the Telo CLI is a Node.js
            // program).
            programs.extend(node.as_deref());
        } else {
            // An operator's command may name files it runs or reads (a
            // script, a manifest): those files, exactly, are shown too
            // (never a directory: `ls /` must not show the host's root).
            read_only.extend(
                argv.iter()
                    .skip(1)
                    .map(Path::new)
                    .filter(|arg| arg.is_absolute() && arg.is_file())
                    .map(Path::to_path_buf),
            );
        }
        let plan = LaunchPlan {
            argv,
            cwd: work.app(),
            env: workload_env(
                &spec.env,
                &work.home(),
                &self.config.path,
                kernel_cache.as_ref(),
            ),
        };
        let spawn = match self.spawn_plan(
            plan,
            sandbox.as_deref(),
            &programs,
            &read_only,
            &read_write,
            kernel_cache.as_ref().map(SessionCache::host_dir),
        ) {
            Ok(spawn) => spawn,
            Err(err) => {
                work.discard();
                return Err(err);
            }
        };
        let spawn = network.enter(spawn);
        let members = spawn.members;
        let launched = on_spawner_thread(move || spawn_in_pty(spawn).map(Started::from))
            .await
            .map_err(|err| crate::process::pty::PtyError::Spawn(err.to_string()))
            .flatten()
            .map_err(|err| {
                let program = match &spec.app {
                    Some(app) => app.command.as_ref().and_then(|c| c.first()).cloned(),
                    None => Some(self.config.telo.clone()),
                };
                let message = format!("could not start '{}': {err}", program.unwrap_or_default());
                StartError::new(StartStage::Start, message).with_source(err)
            });
        let process = match launched {
            Ok(process) => process,
            Err(err) => {
                work.discard();
                return Err(err);
            }
        };
        let (session, run_end) = match wire_session(
            &spec,
            process,
            members,
            &sink,
            self.config.max_ttl,
            self.config.stop_grace,
            crate::disk_bound::DiskBound {
                dir: work.root().to_owned(),
                max_bytes: self.config.limits.disk_bytes,
            },
        ) {
            Ok(wired) => wired,
            Err(err) => {
                work.discard();
                return Err(err);
            }
        };
        info!(session_id = %spec.session_id, dir = %work.root().display(), "session process started");

        sink.status(RunStatus::running_unrouted(spec.ports.iter()));
        // Only now: the terminal status must never overtake `running`.
        // The directory goes as soon as the session has ended: its output
        // lives in the registry's memory, and a finished session's files
        // kept for the exit TTL were disk a tenant could fill and leave.
        let finished = work.clone();
        let reach = network.reach();
        self.tasks.spawn(
            async move {
                follow_run_to_end(run_end).await;
                finished.discard();
                // Its namespace goes with its processes.
                drop(network);
            }
            .instrument(Span::current()),
        );

        Observer {
            tasks: &self.tasks,
            sink: &sink,
            reach,
            stop: &sink.ended(),
        }
        .run_session(spec.tcp_ports(), inspect_port);
        Ok(session)
    }
}

/// Starts the threads of a freshly spawned process and prepares its
/// end task. On failure the process group is killed.
fn wire_session(
    spec: &StartSpec,
    process: Started,
    members: Members,
    sink: &SessionSink,
    max_ttl: Duration,
    stop_grace: Duration,
    disk: crate::disk_bound::DiskBound,
) -> Result<(Arc<dyn BackendSession>, RunEnd), StartError> {
    let output_sink = sink.clone();
    let wired = wire_process(
        &spec.session_id,
        process,
        members,
        move |_, bytes| output_sink.output(bytes),
        stop_grace,
    )?;
    let run_end = RunEnd {
        session: wired.session.clone(),
        sink: sink.clone(),
        exited: wired.exited,
        output_drained: wired.output_drained,
        max_ttl,
        disk: Some(disk),
    };
    Ok((wired.session, run_end))
}
