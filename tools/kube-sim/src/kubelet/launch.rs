//! What a container runs as: the launch plan from its image behaviour,
//! command, working directory, mounts and environment.

use super::env::expand_refs;
use super::*;

impl Kubelet {
    pub(super) async fn launch_plan(
        &self,
        w: &PodWorker,
        ctx: &PodCtx,
        c: &Container,
        behaviour: &ImageBehaviour,
    ) -> Result<Launch, LaunchError> {
        let container_dir = ctx.sandbox.join("containers").join(&c.name);
        let _ = tokio::fs::create_dir_all(&container_dir).await;
        let mounts = container_mounts(ctx, c).await;
        let mut env = self.resolve_env(w, ctx, c, &mounts, &container_dir)?;
        if matches!(
            behaviour,
            ImageBehaviour::FakeTelo | ImageBehaviour::FakeTeloEntry(_)
        ) && !env.iter().any(|(name, _)| name == MODULES_VAR)
        {
            env.push((
                MODULES_VAR.to_owned(),
                kernel_modules_dir(self.fake_telo.as_deref()),
            ));
        }
        let cwd = working_dir(c, &mounts, &container_dir).await;
        // `command` and `args` see `$(VAR)` expanded from the variables the
        // container declares (not the ones kube-sim adds for a process, such
        // as `HOST`), as the kubelet expands them.
        let declared = self.container_env(w, ctx, c)?;
        let argv: Vec<String> = c
            .command
            .iter()
            .chain(c.args.iter())
            .flatten()
            .map(|arg| expand_refs(arg, &declared))
            .collect();
        let has_command = c.command.as_ref().is_some_and(|a| !a.is_empty());
        let tty = c.tty.unwrap_or(false);
        let stdin = c.stdin.unwrap_or(false);
        let stdin_once = c.stdin_once.unwrap_or(false);
        // With an isolated pod network the process runs in the pod's
        // network namespace: `nsenter` enters it and executes the program.
        let netns = ctx
            .netns
            .as_ref()
            .zip(self.network.as_ref())
            .map(|(path, bridge)| (path.clone(), bridge.nsenter().to_path_buf()));
        let spawn = |program: PathBuf, args: Vec<String>| {
            let (program, args) = match &netns {
                // A program that cannot be found is left to fail to start
                // as it would outside a namespace.
                Some((path, nsenter)) if resolvable(&program, &cwd, &env) => {
                    let mut wrapped = vec![
                        format!("--net={}", path.display()),
                        "--".to_owned(),
                        program.to_string_lossy().into_owned(),
                    ];
                    wrapped.extend(args);
                    (nsenter.clone(), wrapped)
                }
                _ => (program, args),
            };
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
            ImageBehaviour::Entrypoint(program) if !has_command => spawn(
                program.clone(),
                argv.iter().map(|a| mounts.map_arg(a)).collect(),
            ),
            ImageBehaviour::Entrypoint(program) => match argv.split_first() {
                Some((prog, rest)) if !is_shell(prog) => {
                    let file = Path::new(prog).file_name().unwrap_or(prog.as_ref());
                    let dir = program.parent().unwrap_or(Path::new("/"));
                    spawn(
                        dir.join(file),
                        rest.iter().map(|a| mounts.map_arg(a)).collect(),
                    )
                }
                _ => generic(&argv),
            },
            ImageBehaviour::Binaries(dir) => match argv.split_first() {
                Some((prog, rest)) if !is_shell(prog) => {
                    let file = Path::new(prog).file_name().unwrap_or(prog.as_ref());
                    spawn(
                        dir.join(file),
                        rest.iter().map(|a| mounts.map_arg(a)).collect(),
                    )
                }
                _ => generic(&argv),
            },
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
}

/// Whether `program` names an executable file, itself (from `cwd`) or on
/// the `PATH` of `env`, as the spawn would look it up.
fn resolvable(program: &Path, cwd: &Path, env: &[(String, String)]) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return executable(&cwd.join(program));
    }
    env.iter()
        .find(|(k, _)| k == "PATH")
        .is_some_and(|(_, path)| std::env::split_paths(path).any(|d| executable(&d.join(program))))
}

/// Where a kernel image keeps its standard modules, in its environment
/// (`ENV TELO_MODULES=…`): manifests import them by that path.
pub const MODULES_VAR: &str = "TELO_MODULES";

/// A kernel image's [`MODULES_VAR`]: kube-sim's own when set; else, for a
/// real Telo CLI layout given as the kernel (`<dir>/bin/telo` beside
/// `<dir>/modules`), that layout's modules, which are on this host; else
/// where an image would keep them (fake-telo knows its modules by name,
/// wherever they are).
fn kernel_modules_dir(kernel: Option<&std::path::Path>) -> String {
    if let Some(dir) = std::env::var(MODULES_VAR)
        .ok()
        .filter(|dir| !dir.is_empty())
    {
        return dir;
    }
    kernel
        .and_then(|telo| telo.parent()?.parent())
        .map(|layout| layout.join("modules"))
        .filter(|modules| modules.is_dir())
        .map_or_else(
            || "/opt/telo/modules".to_owned(),
            |modules| modules.to_string_lossy().into_owned(),
        )
}

/// The container's `volumeMounts` as host directories in the pod's sandbox
/// (a `subPath` is a directory inside the volume), created if missing.
async fn container_mounts(ctx: &PodCtx, c: &Container) -> Mounts {
    let mut mount_list = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let mut host = ctx.sandbox.join("volumes").join(&m.name);
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            host = host.join(sub.trim_start_matches('/'));
        }
        let _ = tokio::fs::create_dir_all(&host).await;
        mount_list.push((m.mount_path.clone(), host));
    }
    Mounts::new(mount_list)
}

/// The process's working directory: `workingDir` inside a mount when it
/// names one, else under the container's own root, else the container's
/// directory.
async fn working_dir(c: &Container, mounts: &Mounts, container_dir: &Path) -> PathBuf {
    let Some(wd) = c.working_dir.as_deref() else {
        return container_dir.to_path_buf();
    };
    if let Some(p) = mounts.map_path(wd) {
        return p;
    }
    let p = container_dir
        .join("rootfs")
        .join(wd.trim_start_matches('/'));
    let _ = tokio::fs::create_dir_all(&p).await;
    p
}
