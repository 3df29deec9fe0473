//! What a container runs as: the launch plan from its image behaviour,
//! command, working directory, mounts and environment.

use super::*;

impl Kubelet {
    pub(super) async fn launch_plan(
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
}
