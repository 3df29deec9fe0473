//! One session's network namespace: named under `/run/netns` (made by
//! `ip netns add`), with outbound connectivity from `pasta`, which
//! translates the namespace's traffic to the host's own sockets and
//! forwards nothing into the host's loopback. Removing the name ends
//! `pasta`; the namespace itself goes with its last process and socket.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::mount::{MntFlags, umount2};
use tracing::{debug, warn};

use super::sockets::NamespaceSockets;
use crate::process::spawner::on_spawner_thread;

/// Where named network namespaces live.
pub(crate) const NETNS_DIR: &str = "/run/netns";
/// How long `pasta` may take to set a namespace up.
const PASTA_READY: Duration = Duration::from_secs(10);

/// The programs a namespace is made and entered with.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub ip: PathBuf,
    pub pasta: PathBuf,
    pub nsenter: PathBuf,
    pub setpriv: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("`ip netns add {name}` failed: {reason}")]
    Add { name: String, reason: String },
    #[error("could not open network namespace {name}: {source}")]
    Open {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pasta did not set network namespace {name} up: {reason}")]
    Pasta { name: String, reason: String },
}

pub(crate) struct Namespace {
    name: String,
    sockets: Arc<NamespaceSockets>,
    /// `pasta`, a child of the runner's spawner thread that dies with the
    /// runner.
    pasta: Option<Child>,
}

impl Namespace {
    /// Makes namespace `name` and waits until `pasta` connected it.
    pub(crate) async fn create(tools: &Tools, name: String) -> Result<Self, NamespaceError> {
        let ip = tools.ip.clone();
        let added = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || add(&ip, &name))
                .await
                .unwrap_or_else(|join| Err(join.to_string()))
        };
        added.map_err(|reason| NamespaceError::Add {
            name: name.clone(),
            reason,
        })?;
        // From here the name is removed again on every failure (drop).
        let path = path_of(&name);
        let file = File::open(&path).map_err(|source| NamespaceError::Open {
            name: name.clone(),
            source,
        });
        let mut namespace = Self {
            sockets: Arc::new(NamespaceSockets::new(match file {
                Ok(file) => file,
                Err(err) => {
                    remove(&name);
                    return Err(err);
                }
            })),
            name,
            pasta: None,
        };
        let command = pasta_command(tools, &path);
        let started = on_spawner_thread(move || command_spawn(command))
            .await
            .map_err(|err| err.to_string())
            .and_then(|started| started);
        let (child, ready) = started.map_err(|reason| NamespaceError::Pasta {
            name: namespace.name.clone(),
            reason,
        })?;
        namespace.pasta = Some(child);
        let waited = tokio::task::spawn_blocking(move || wait_ready(&ready))
            .await
            .unwrap_or_else(|join| Err(join.to_string()));
        match waited {
            Ok(()) => Ok(namespace),
            Err(reason) => Err(NamespaceError::Pasta {
                name: namespace.name.clone(),
                reason,
            }),
        }
    }

    /// [`Namespace::create`] without an async runtime, from the calling
    /// thread (`pasta` dies with it): the boot check.
    pub(crate) fn create_blocking(tools: &Tools, name: String) -> Result<Self, NamespaceError> {
        add(&tools.ip, &name).map_err(|reason| NamespaceError::Add {
            name: name.clone(),
            reason,
        })?;
        let path = path_of(&name);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(source) => {
                remove(&name);
                return Err(NamespaceError::Open { name, source });
            }
        };
        let mut namespace = Self {
            sockets: Arc::new(NamespaceSockets::new(file)),
            name,
            pasta: None,
        };
        let (child, ready) =
            command_spawn(pasta_command(tools, &path)).map_err(|reason| NamespaceError::Pasta {
                name: namespace.name.clone(),
                reason,
            })?;
        namespace.pasta = Some(child);
        wait_ready(&ready).map_err(|reason| NamespaceError::Pasta {
            name: namespace.name.clone(),
            reason,
        })?;
        Ok(namespace)
    }

    pub(crate) fn sockets(&self) -> &Arc<NamespaceSockets> {
        &self.sockets
    }

    /// `nsenter`'s arguments that run a command in this namespace.
    pub(crate) fn enter_argv(&self, nsenter: &Path) -> Vec<OsString> {
        let mut net = OsString::from("--net=");
        net.push(path_of(&self.name));
        vec![nsenter.into(), net, "--".into()]
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        self.sockets.close();
        if let Some(mut pasta) = self.pasta.take() {
            let _ = pasta.kill();
            let _ = pasta.wait();
        }
        remove(&self.name);
        debug!(namespace = %self.name, "session network removed");
    }
}

pub(crate) fn path_of(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

fn wait_ready(ready: &Ready) -> Result<(), String> {
    match ready.recv_timeout(PASTA_READY) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(format!("not ready within {}s", PASTA_READY.as_secs()))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err("it stopped before saying".to_owned())
        }
    }
}

fn add(ip: &Path, name: &str) -> Result<(), String> {
    let output = Command::new(ip)
        .args(["netns", "add", name])
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("could not run {}: {err}", ip.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
}

/// Removes name `name` (as `ip netns delete` does); a name already gone is
/// not an error.
pub(crate) fn remove(name: &str) {
    let path = path_of(name);
    let _ = umount2(&path, MntFlags::MNT_DETACH);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => warn!(namespace = %name, error = %err, "could not remove a session network"),
    }
}

/// `pasta` for the namespace at `path`: connectivity out through the
/// host's sockets, no port forwarded either way, the gateway address not
/// mapped to the host; its pid on stdout once it is set up.
fn pasta_command(tools: &Tools, path: &Path) -> Command {
    let mut command = Command::new(&tools.setpriv);
    command
        // It dies with the runner (the spawner thread lives as long).
        .args(["--pdeathsig", "KILL", "--"])
        .arg(&tools.pasta)
        .args(["--foreground", "--quiet", "--config-net"])
        .args(["-t", "none", "-u", "none", "-T", "none", "-U", "none"])
        .arg("--no-map-gw")
        // Root stays root: a namespace under /run/netns is root's to join.
        .args(["--runas", "0:0"])
        .args(["--pid", "/dev/stdout"])
        .arg("--netns")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

type Ready = std::sync::mpsc::Receiver<Result<(), String>>;

/// Starts `command` and a thread that reports once it wrote its pid (set
/// up) or ended without (its last line of stderr).
fn command_spawn(mut command: Command) -> Result<(Child, Ready), String> {
    let mut child = command
        .spawn()
        .map_err(|err| format!("could not start pasta: {err}"))?;
    let (report, ready) = std::sync::mpsc::channel();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    std::thread::Builder::new()
        .name("pasta-ready".to_owned())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut line = String::new();
            let said = stdout
                .map(|out| BufReader::new(out).read_line(&mut line).unwrap_or(0) > 0)
                .unwrap_or(false);
            if said {
                let _ = report.send(Ok(()));
            }
            // Read to its end either way: a full pipe must never stall it.
            let reason = stderr
                .map(|err| {
                    BufReader::new(err)
                        .lines()
                        .map_while(Result::ok)
                        .filter(|line| !line.contains("syslog"))
                        .last()
                        .unwrap_or_default()
                })
                .unwrap_or_default();
            if said {
                return;
            }
            let _ = report.send(Err(if reason.is_empty() {
                "it exited".to_owned()
            } else {
                reason
            }));
        })
        .map_err(|err| format!("could not watch pasta start: {err}"))?;
    Ok((child, ready))
}
