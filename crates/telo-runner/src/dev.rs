//! `telo-runner dev`: a runner to try things with, in one command. It serves
//! on loopback with the stand-in kernel (`fake-telo`, which plays the
//! `fakeTelo:` script of an example) unless given a Telo CLI, and with
//! `--kubernetes` it first starts kube-sim — a simulated apiserver and
//! kubelet — and puts the runner's Kubernetes backend on it. The programs it
//! needs are looked for next to this executable (where `cargo build` puts
//! them), then on `PATH`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The session namespace the runner's Kubernetes backend uses by default;
/// a fresh kube-sim has a new cluster's namespaces only.
const SESSION_NAMESPACE: &str = "telo-sessions";
/// How long kube-sim may take to say where it listens.
const CLUSTER_START_BOUND: Duration = Duration::from_secs(30);
/// How long kube-sim may take to stop its pods and remove its files.
const CLUSTER_STOP_BOUND: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error(
        "the stand-in kernel 'fake-telo' was not found next to this telo-runner or on PATH; build it with `cargo build -p fake-telo` (same profile as telo-runner), or pass --telo with a Telo CLI"
    )]
    NoStandIn,
    #[error("--telo {}: no such executable", .0.display())]
    NoTelo(PathBuf),
    #[error(
        "'kube-sim' was not found next to this telo-runner or on PATH; build it with `cargo build -p kube-sim` (same profile as telo-runner)"
    )]
    NoKubeSim,
    #[error("could not start kube-sim ({}): {source}", path.display())]
    SpawnKubeSim {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kube-sim did not start: {0}")]
    KubeSimStart(String),
    #[error("could not create a directory for kube-sim's kubeconfig: {0}")]
    TempDir(#[source] std::io::Error),
    #[error(
        "--allow-origin '{0}': expected a browser origin such as https://editor.example (scheme://host[:port], no path); --any-origin admits every origin"
    )]
    BadOrigin(String),
    #[error(
        "RUNNER_CORS_ORIGINS is set, but dev decides the browser origins itself: unset it and pass --allow-origin ORIGIN (repeatable) or --any-origin"
    )]
    CorsFromEnv,
}

/// Browser origins a dev runner admits without being told: pages served
/// from this machine's loopback, on any port (where an editor or a dev
/// server runs locally). The Telo editor has no fixed hosted origin this
/// project could name, so a hosted editor is admitted by naming its origin
/// (`--allow-origin`); every other page is refused `403
/// origin_not_allowed`, because a dev runner starts whatever it is sent and
/// any page open in a browser could otherwise send it.
pub const LOOPBACK_ORIGINS: &[&str] =
    &["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"];

/// Which browser pages a dev runner serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevOrigins {
    /// [`LOOPBACK_ORIGINS`] and the origins named with `--allow-origin`.
    Listed(Vec<String>),
    /// `--any-origin`: every page, which dev warns about.
    Any,
}

impl DevOrigins {
    /// From `--allow-origin` (each checked to be an origin) and
    /// `--any-origin`; a `RUNNER_CORS_ORIGINS` in the environment is
    /// refused rather than silently overridden or silently obeyed.
    pub fn choose(
        allowed: &[String],
        any: bool,
        env: &HashMap<String, String>,
    ) -> Result<Self, DevError> {
        if env.contains_key("RUNNER_CORS_ORIGINS") {
            return Err(DevError::CorsFromEnv);
        }
        if any {
            return Ok(DevOrigins::Any);
        }
        let mut list: Vec<String> = LOOPBACK_ORIGINS.iter().map(|o| (*o).to_owned()).collect();
        for origin in allowed {
            let origin = origin.trim().trim_end_matches('/');
            if !is_origin(origin) {
                return Err(DevError::BadOrigin(origin.to_owned()));
            }
            if !list.iter().any(|known| known == origin) {
                list.push(origin.to_owned());
            }
        }
        Ok(DevOrigins::Listed(list))
    }

    /// The `RUNNER_CORS_ORIGINS` value the runner is given.
    fn env_value(&self) -> String {
        match self {
            DevOrigins::Any => "*".to_owned(),
            DevOrigins::Listed(list) => list.join(","),
        }
    }
}

/// `scheme://host[:port]` as a browser sends it in `Origin`: http or https,
/// a host, no path, query, fragment or credentials.
fn is_origin(text: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(text) else {
        return false;
    };
    matches!(url.scheme(), "http" | "https")
        && url.host_str().is_some_and(|host| !host.is_empty())
        && url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none()
        && url.path() == "/"
        && !text.ends_with('/')
        && text
            .split_once("://")
            .is_some_and(|(_, rest)| !rest.contains('/'))
}

/// The kernel dev sessions run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kernel {
    /// `fake-telo`: plays the `fakeTelo:` script of an example.
    StandIn(PathBuf),
    /// A Telo CLI the user named with `--telo`.
    Telo(PathBuf),
}

impl Kernel {
    /// `--telo`, else the stand-in next to `exe` or on `search_path`.
    pub fn choose(
        telo: Option<&Path>,
        exe: Option<&Path>,
        search_path: &str,
    ) -> Result<Self, DevError> {
        match telo {
            Some(telo) => runner_local::process::executable::resolve_executable(
                &telo.to_string_lossy(),
                search_path,
            )
            .map(Kernel::Telo)
            .ok_or_else(|| DevError::NoTelo(telo.to_owned())),
            None => companion("fake-telo", exe, search_path)
                .map(Kernel::StandIn)
                .ok_or(DevError::NoStandIn),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Kernel::StandIn(path) | Kernel::Telo(path) => path,
        }
    }

    fn describe(&self) -> String {
        match self {
            Kernel::StandIn(path) => format!(
                "the stand-in fake-telo ({}), which plays an example's fakeTelo: script; --telo PATH runs a Telo CLI",
                path.display()
            ),
            Kernel::Telo(path) => format!("the Telo CLI {}", path.display()),
        }
    }
}

/// A program of this workspace: next to `exe` first (a build puts them side
/// by side, and the one on `PATH` may be from another checkout), then on
/// `search_path`.
pub fn companion(name: &str, exe: Option<&Path>, search_path: &str) -> Option<PathBuf> {
    let beside = exe.and_then(Path::parent).map(|dir| dir.join(name));
    beside
        .and_then(|path| {
            runner_local::process::executable::resolve_executable(&path.to_string_lossy(), "")
        })
        .or_else(|| runner_local::process::executable::resolve_executable(name, search_path))
}

/// kube-sim, started for the runner: its URL and kubeconfig, where its pods
/// reach the runner, and the process, stopped with [`Cluster::stop`] (or
/// killed when dropped).
pub struct Cluster {
    child: Child,
    pub url: String,
    pub kubeconfig: PathBuf,
    /// The runner as session pods reach it (`RUNNER_SELF_URL`): the runner's
    /// own address when pods share this host's network; with kube-sim's
    /// isolated pod network, a relay on the node address (the pods'
    /// gateway) to the runner, which itself stays on loopback.
    pub runner_for_pods: std::net::SocketAddr,
    relay: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(relay) = &self.relay {
            relay.abort();
        }
    }
}

/// Relays every connection to `listener` to `runner`.
async fn relay(listener: tokio::net::TcpListener, runner: std::net::SocketAddr) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(runner).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

impl Cluster {
    /// Starts `kube_sim` with the session namespace and `kernel` as what the
    /// session image runs, and waits until it says where it listens and
    /// where its pods reach this machine; pods are given a way to `runner`
    /// from there.
    pub async fn start(
        kube_sim: &Path,
        kernel: &Path,
        runner: std::net::SocketAddr,
    ) -> Result<Self, DevError> {
        let dir = tempfile::Builder::new()
            .prefix("telo-runner-dev-")
            .tempdir()
            .map_err(DevError::TempDir)?;
        let kubeconfig = dir.path().join("kubeconfig");
        let mut child = Command::new(kube_sim)
            .args(["--listen", "127.0.0.1:0", "--namespace", SESSION_NAMESPACE])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--fake-telo")
            .arg(kernel)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| DevError::SpawnKubeSim {
                path: kube_sim.to_owned(),
                source,
            })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(CLUSTER_START_BOUND, lines.next_line()).await;
        let url = match first {
            Ok(Ok(Some(line))) => match line.strip_prefix("listening on ") {
                Some(url) => url.trim().to_owned(),
                None => return Err(DevError::KubeSimStart(format!("it said {line:?}"))),
            },
            Ok(Ok(None)) => {
                let status = child.wait().await.ok();
                return Err(DevError::KubeSimStart(match status {
                    Some(status) => format!("it exited ({status}); its messages are above"),
                    None => "it closed its output".to_owned(),
                }));
            }
            Ok(Err(err)) => return Err(DevError::KubeSimStart(err.to_string())),
            Err(_) => {
                return Err(DevError::KubeSimStart(format!(
                    "no answer within {} s",
                    CLUSTER_START_BOUND.as_secs()
                )));
            }
        };
        // `node address <ip>` follows (a kube-sim without it runs pods on
        // this host's network).
        let node = match tokio::time::timeout(CLUSTER_START_BOUND, lines.next_line()).await {
            Ok(Ok(Some(line))) => line
                .strip_prefix("node address ")
                .and_then(|ip| ip.trim().parse::<std::net::IpAddr>().ok()),
            _ => None,
        };
        let (runner_for_pods, relay) = match node {
            Some(node) if !node.is_loopback() => {
                let listener = tokio::net::TcpListener::bind((node, 0))
                    .await
                    .map_err(|err| {
                        DevError::KubeSimStart(format!(
                            "could not listen on its node address {node}: {err}"
                        ))
                    })?;
                let addr = listener
                    .local_addr()
                    .map_err(|err| DevError::KubeSimStart(err.to_string()))?;
                (addr, Some(tokio::spawn(relay(listener, runner))))
            }
            _ => (runner, None),
        };
        Ok(Self {
            child,
            url,
            kubeconfig,
            runner_for_pods,
            relay,
            _dir: dir,
        })
    }

    /// SIGTERM, so kube-sim ends its pods' processes and removes its files;
    /// a kill if it does not exit in time.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id().and_then(|id| i32::try_from(id).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            if tokio::time::timeout(CLUSTER_STOP_BOUND, self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// The runner's environment: the user's, with what dev decides on top (the
/// port it bound, the kernel; with a cluster, the backend and where the
/// runner is reached).
pub fn runner_env(
    user: &HashMap<String, String>,
    kernel: &Kernel,
    cluster: Option<&Cluster>,
    origins: &DevOrigins,
    bound: std::net::SocketAddr,
) -> HashMap<String, String> {
    let mut env = user.clone();
    let mut set = |key: &str, value: String| {
        env.insert(key.to_owned(), value);
    };
    // dev listens itself (`--port 0` included); the runner is told where.
    set("PORT", bound.port().to_string());
    set("RUNNER_CORS_ORIGINS", origins.env_value());
    // Session ports at `http://<port>-<id>.localhost:<port>/`: browsers and
    // curl resolve every `*.localhost` name to loopback. A base the user set
    // stays.
    env.entry(runner_core::edge::RUNNER_PREVIEW_BASE_URL.name.to_owned())
        .or_insert_with(|| format!("http://localhost:{}", bound.port()));
    let mut set = |key: &str, value: String| {
        env.insert(key.to_owned(), value);
    };
    match cluster {
        None => {
            set("RUNNER_BACKEND", "local".to_owned());
            set("RUNNER_LOCAL_TELO", kernel.path().display().to_string());
        }
        Some(cluster) => {
            set("RUNNER_BACKEND", "kubernetes".to_owned());
            set("KUBECONFIG", cluster.kubeconfig.display().to_string());
            // Session pods fetch their bundle from the runner.
            set(
                "RUNNER_SELF_URL",
                format!("http://{}", cluster.runner_for_pods),
            );
            // kube-sim has no registry to list base images from.
            set("RUNNER_BASE_IMAGE_CATALOG_ENABLED", "false".to_owned());
        }
    }
    env
}

/// What dev prints once the runner serves: what runs where, who may drive
/// it, the warnings that apply, and what to type.
pub fn next_steps(
    runner_url: &str,
    kernel: &Kernel,
    cluster: Option<&Cluster>,
    access: &DevAccess,
) -> String {
    let client = if runner_url == crate::client::DEFAULT_RUNNER_URL {
        "telo-runner".to_owned()
    } else {
        format!("telo-runner --runner {runner_url}")
    };
    let mut text = String::new();
    match cluster {
        None => text.push_str(&format!(
            "telo-runner dev: a runner on the local backend at {runner_url}\n"
        )),
        Some(cluster) => text.push_str(&format!(
            "telo-runner dev: a runner on the Kubernetes backend at {runner_url}\n  cluster  kube-sim (a simulated apiserver and kubelet) at {}, kubeconfig {}\n",
            cluster.url,
            cluster.kubeconfig.display()
        )),
    }
    text.push_str(&format!("  kernel   {}\n", kernel.describe()));
    text.push_str(&access.describe(cluster.is_some()));
    text.push_str("Next, in another terminal:\n");
    // The client's subcommand comes first: `--runner` belongs to it.
    let command = |sub: &str| match client.split_once(' ') {
        Some((bin, flags)) => format!("  {bin} {sub} {flags}"),
        None => format!("  {client} {sub}"),
    };
    text.push_str(&format!("{}\n", command("run examples/hello")));
    text.push_str(&format!("{}\n", command("sessions")));
    text.push_str(&format!(
        "The Telo editor takes {runner_url} as its runner URL. Ctrl-C stops {}.\n",
        if cluster.is_some() {
            "the runner and kube-sim"
        } else {
            "the runner"
        }
    ));
    text
}

/// Who can drive a dev runner, said plainly when it starts: a dev runner
/// has no token, so what keeps strangers out is the loopback listener and
/// the origin list.
#[derive(Debug, Clone)]
pub struct DevAccess {
    pub origins: DevOrigins,
    /// Whether the user's environment turned tokens on
    /// (`RUNNER_AUTH_TOKENS_FILE`).
    pub tokens: bool,
    /// The effective user id dev runs as (kube-sim's pods run as it).
    pub uid: u32,
}

impl DevAccess {
    fn describe(&self, kubernetes: bool) -> String {
        let mut text = String::new();
        match &self.origins {
            DevOrigins::Listed(list) => text.push_str(&format!(
                "  browser  pages from {} only (--allow-origin ORIGIN admits another, e.g. a hosted editor's); any other page is refused\n",
                list.join(", ")
            )),
            DevOrigins::Any => text.push_str(
                "  browser  pages from any origin\nwarning: --any-origin: every web page open in a browser on this machine can start sessions on this runner and run what it sends\n",
            ),
        }
        if self.tokens {
            text.push_str(
                "  access   a token from RUNNER_AUTH_TOKENS_FILE is required (pass it with --token or TELO_RUNNER_TOKEN)\n",
            );
        } else {
            text.push_str(
                "  access   open, no token: every program and user on this machine that can reach loopback can start sessions\n",
            );
        }
        if kubernetes {
            let who = if self.uid == 0 {
                "as root, with the whole machine in reach".to_owned()
            } else {
                format!("as this user (uid {})", self.uid)
            };
            text.push_str(&format!(
                "warning: --kubernetes: kube-sim runs each session pod as a plain process on this host, {who}, with no container and no sandbox; run only applications you trust\n"
            ));
        }
        text
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn executable(path: &Path) {
        std::fs::write(path, "").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_local_env_runs_the_chosen_kernel_and_keeps_the_users_settings() {
        let user = HashMap::from([
            ("LOG_LEVEL".to_owned(), "debug".to_owned()),
            ("RUNNER_BACKEND".to_owned(), "kubernetes".to_owned()),
        ]);
        let kernel = Kernel::StandIn(PathBuf::from("/opt/bin/fake-telo"));
        let origins = DevOrigins::choose(&[], false, &HashMap::new()).unwrap();
        let env = runner_env(
            &user,
            &kernel,
            None,
            &origins,
            "127.0.0.1:40123".parse().unwrap(),
        );
        assert_eq!(
            env["RUNNER_CORS_ORIGINS"],
            "http://localhost:*,http://127.0.0.1:*,http://[::1]:*"
        );
        assert_eq!(env["LOG_LEVEL"], "debug");
        assert_eq!(env["RUNNER_BACKEND"], "local");
        assert_eq!(env["RUNNER_LOCAL_TELO"], "/opt/bin/fake-telo");
        assert_eq!(env["PORT"], "40123");
        assert!(!env.contains_key("RUNNER_SELF_URL"));
    }

    #[test]
    fn next_steps_name_the_runner_only_when_it_is_not_the_clients_default() {
        let kernel = Kernel::Telo(PathBuf::from("/usr/bin/telo"));
        let access = DevAccess {
            origins: DevOrigins::Listed(vec!["http://localhost:*".into()]),
            tokens: false,
            uid: 1000,
        };
        let default = next_steps("http://127.0.0.1:8061", &kernel, None, &access);
        assert!(
            default.contains("\n  telo-runner run examples/hello\n"),
            "{default}"
        );
        assert!(default.contains("the Telo CLI /usr/bin/telo"), "{default}");
        let other = next_steps("http://127.0.0.1:9000", &kernel, None, &access);
        assert!(
            other.contains("\n  telo-runner run examples/hello --runner http://127.0.0.1:9000\n"),
            "{other}"
        );
        assert!(
            other.contains("\n  telo-runner sessions --runner http://127.0.0.1:9000\n"),
            "{other}"
        );
    }

    #[test]
    fn a_named_telo_that_is_not_there_is_refused() {
        let err = Kernel::choose(Some(Path::new("/nonexistent/telo")), None, "").unwrap_err();
        assert_eq!(
            err.to_string(),
            "--telo /nonexistent/telo: no such executable"
        );
    }

    #[test]
    fn the_stand_in_is_looked_for_next_to_the_executable_first() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("telo-runner");
        executable(&exe);
        executable(&dir.path().join("fake-telo"));
        assert_eq!(
            Kernel::choose(None, Some(&exe), "").unwrap(),
            Kernel::StandIn(dir.path().join("fake-telo"))
        );
        let empty = tempfile::tempdir().unwrap();
        let alone = empty.path().join("telo-runner");
        assert!(matches!(
            Kernel::choose(None, Some(&alone), ""),
            Err(DevError::NoStandIn)
        ));
    }

    #[test]
    fn dev_origins_are_loopback_and_what_the_user_names() {
        let none = HashMap::new();
        assert_eq!(
            DevOrigins::choose(&["https://editor.example/".into()], false, &none).unwrap(),
            DevOrigins::Listed(vec![
                "http://localhost:*".into(),
                "http://127.0.0.1:*".into(),
                "http://[::1]:*".into(),
                "https://editor.example".into(),
            ])
        );
        assert_eq!(
            DevOrigins::choose(&[], true, &none).unwrap(),
            DevOrigins::Any
        );
        for bad in [
            "*",
            "editor.example",
            "https://editor.example/app",
            "ftp://x",
            "https://u:p@x.example",
        ] {
            assert_eq!(
                DevOrigins::choose(&[bad.into()], false, &none)
                    .unwrap_err()
                    .to_string(),
                format!(
                    "--allow-origin '{bad}': expected a browser origin such as https://editor.example (scheme://host[:port], no path); --any-origin admits every origin"
                )
            );
        }
        let set = HashMap::from([("RUNNER_CORS_ORIGINS".to_owned(), "*".to_owned())]);
        assert_eq!(
            DevOrigins::choose(&[], false, &set)
                .unwrap_err()
                .to_string(),
            "RUNNER_CORS_ORIGINS is set, but dev decides the browser origins itself: unset it and pass --allow-origin ORIGIN (repeatable) or --any-origin"
        );
    }
}
