//! Where a local session's processes meet the network.
//!
//! `isolated` (the default): every session gets a network namespace of its
//! own (`namespace`). Its processes see only their own loopback and an
//! outbound route that `pasta` translates to the host's sockets; they
//! cannot reach the runner's or the host's loopback services, another
//! session, or collide with another session's ports. The runner reaches
//! their ports from inside the namespace (`sockets`). It needs root (to
//! make and enter namespaces), `ip`, `nsenter`, `setpriv` and `pasta` on
//! the runner's `PATH`; without them the runner refuses to start.
//!
//! `host`: the operator asked by name for sessions to share the runner's
//! network namespace, as they did before isolation existed.

mod namespace;
mod sockets;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use runner_core::config::{ConfigError, Env, Setting};
use runner_core::reach::Reach;
use runner_core::sync::lock;
use runner_core::tasks::OwnedTasks;
use runner_core::{StartError, StartStage};
use tracing::{info, warn};

use crate::process::executable::resolve_executable;
use crate::process::plan::SpawnPlan;
pub use namespace::NamespaceError;
use namespace::{Namespace, Tools};
use sockets::NamespaceSockets;

pub const RUNNER_LOCAL_NETWORK: Setting = Setting {
    name: "RUNNER_LOCAL_NETWORK",
    default: "isolated",
    description: "`isolated`: each session in a network namespace of its own, with outbound connectivity through `pasta` and no way to the runner's or the host's loopback services or to another session; its ports are reached through the session edge. Needs root and `ip`, `nsenter`, `setpriv` and `pasta` (Debian's `passt`) on the runner's PATH, else the runner refuses to start. `host`: sessions share the runner's network namespace (their ports listen on the host's loopback, and collide).",
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkConfig {
    /// The tools are looked up on `search_path` (the runner's own `PATH`).
    Isolated {
        search_path: String,
    },
    Host,
}

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error(
        "RUNNER_LOCAL_NETWORK=isolated needs `{0}` on the runner's PATH or in /usr/sbin; install it (Debian: {1}), or set RUNNER_LOCAL_NETWORK=host to run sessions in the runner's own network namespace"
    )]
    Missing(&'static str, &'static str),
    #[error(
        "RUNNER_LOCAL_NETWORK=isolated could not give a session a network namespace here: {0}. It needs root; or set RUNNER_LOCAL_NETWORK=host to run sessions in the runner's own network namespace"
    )]
    Unusable(NamespaceError),
}

/// How many namespaces are kept made and connected, so that a session's
/// start takes one instead of waiting for `ip` and `pasta` (~45 ms).
const READY: usize = 2;

/// Makes each session's network.
pub struct Networks {
    isolation: Option<Arc<Isolation>>,
    /// Refills the ready namespaces.
    tasks: OwnedTasks,
}

struct Isolation {
    tools: Tools,
    /// Starts the name of every namespace this backend makes: its
    /// process's pid, so a runner sweeps what dead runners left and never
    /// a live one's, then the backend's number in the process, so that a
    /// backend shutting down removes its own and never another's.
    prefix: String,
    ready: Mutex<Vec<Namespace>>,
    refilling: AtomicBool,
}

impl Isolation {
    async fn create(&self) -> Result<Namespace, NamespaceError> {
        // One count for the process; the prefix tells backends apart.
        static MADE: AtomicU64 = AtomicU64::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        Namespace::create(&self.tools, format!("{}{n}", self.prefix)).await
    }
}

impl Networks {
    /// Checks that sessions can be isolated here (by making one namespace)
    /// and removes namespaces that runners no longer alive left.
    pub fn new(config: &NetworkConfig, tasks: OwnedTasks) -> Result<Self, NetworkError> {
        let NetworkConfig::Isolated { search_path } = config else {
            warn!(
                "RUNNER_LOCAL_NETWORK=host: sessions share the runner's network namespace; a workload can reach the runner's and the host's loopback services and every other session's ports"
            );
            return Ok(Self {
                isolation: None,
                tasks,
            });
        };
        // `ip` is an administrator's tool: it lives in an sbin directory a
        // service's PATH often lacks.
        let search_path = format!("{search_path}:/usr/local/sbin:/usr/sbin:/sbin");
        let find = |name: &'static str, package: &'static str| {
            resolve_executable(name, &search_path).ok_or(NetworkError::Missing(name, package))
        };
        let tools = Tools {
            ip: find("ip", "iproute2")?,
            nsenter: find("nsenter", "util-linux")?,
            setpriv: find("setpriv", "util-linux")?,
            pasta: find("pasta", "passt")?,
        };
        sweep_dead_runners();
        let prefix = format!("{NAME_START}{}-{}-", std::process::id(), backend_number());
        Namespace::create_blocking(&tools, format!("{prefix}check"))
            .map_err(NetworkError::Unusable)?;
        info!("sessions get a network namespace each (pasta for outbound traffic)");
        let networks = Self {
            isolation: Some(Arc::new(Isolation {
                tools,
                prefix,
                ready: Mutex::new(Vec::new()),
                refilling: AtomicBool::new(false),
            })),
            tasks,
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            networks.refill();
        }
        Ok(networks)
    }

    /// A network for one workload: a ready namespace when there is one.
    pub(crate) async fn for_session(&self) -> Result<SessionNetwork, StartError> {
        let Some(isolation) = &self.isolation else {
            return Ok(SessionNetwork::Host);
        };
        let ready = lock(&isolation.ready).pop();
        self.refill();
        let namespace = match ready {
            Some(namespace) => namespace,
            None => isolation.create().await.map_err(|err| {
                StartError::new(
                    StartStage::Start,
                    format!("could not give the session a network: {err}"),
                )
                .with_source(err)
            })?,
        };
        Ok(SessionNetwork::Isolated {
            namespace: Arc::new(namespace),
            nsenter: isolation.tools.nsenter.clone(),
        })
    }

    /// Removes every namespace this runner made, and makes no more: the
    /// runner is shutting down (its tasks, the refill among them, already
    /// stopped, and its sessions stopped or suspended). That is the ones
    /// kept ready and the ones sessions still hold: a suspended watch
    /// session keeps its network while this runner lives, and the next
    /// runner resumes it in a new one. Removed by name here, not when the
    /// last reference goes, which may be never before the process exits.
    pub(crate) fn close(&self) {
        if let Some(isolation) = &self.isolation {
            // Marked as under way for good: no refill starts after this.
            isolation.refilling.store(true, Ordering::SeqCst);
            let ready = std::mem::take(&mut *lock(&isolation.ready));
            drop(ready);
            remove_where(|name| name.starts_with(&isolation.prefix));
        }
    }

    /// Makes namespaces until [`READY`] are ready, unless that is under way.
    fn refill(&self) {
        let Some(isolation) = &self.isolation else {
            return;
        };
        if isolation.refilling.swap(true, Ordering::SeqCst) {
            return;
        }
        let isolation = isolation.clone();
        self.tasks.spawn(async move {
            while lock(&isolation.ready).len() < READY {
                match isolation.create().await {
                    Ok(namespace) => lock(&isolation.ready).push(namespace),
                    Err(err) => {
                        // A start makes its own, and says why if it cannot.
                        warn!(error = %err, "could not make a ready session network");
                        break;
                    }
                }
            }
            isolation.refilling.store(false, Ordering::SeqCst);
        });
    }
}

/// One workload's network; an isolated one is removed when the last clone
/// is dropped.
#[derive(Clone)]
pub(crate) enum SessionNetwork {
    Host,
    Isolated {
        namespace: Arc<Namespace>,
        nsenter: PathBuf,
    },
}

impl SessionNetwork {
    /// Where the runner dials the workload's ports.
    pub(crate) fn reach(&self) -> Reach {
        match self {
            Self::Host => Reach::LOOPBACK,
            Self::Isolated { namespace, .. } => {
                let sockets: Arc<NamespaceSockets> = namespace.sockets().clone();
                Reach::Namespace(sockets)
            }
        }
    }

    /// `spawn`, run inside the network.
    pub(crate) fn enter(&self, mut spawn: SpawnPlan) -> SpawnPlan {
        if let Self::Isolated { namespace, nsenter } = self {
            let mut argv = namespace.enter_argv(nsenter);
            argv.append(&mut spawn.argv);
            spawn.argv = argv;
        }
        spawn
    }

    /// A loopback port of the network that was free a moment ago (for a
    /// kernel's `--inspect`).
    pub(crate) async fn free_loopback_port(&self) -> std::io::Result<u16> {
        match self {
            Self::Host => crate::session::wiring::free_loopback_port(),
            Self::Isolated { namespace, .. } => namespace.sockets().free_loopback_port().await,
        }
    }
}

/// Tells apart the backends of one process (a restart in place, or tests
/// running several runners).
fn backend_number() -> u64 {
    static BACKENDS: AtomicU64 = AtomicU64::new(0);
    BACKENDS.fetch_add(1, Ordering::Relaxed)
}

/// How the names of the runner's namespaces start: `telo-<pid>-`, then
/// the backend's number and the namespace's (`telo-<pid>-<backend>-<n>`).
const NAME_START: &str = "telo-";

/// The pid of the runner that made namespace `name`.
fn maker_of(name: &str) -> Option<i32> {
    let (pid, _) = name.strip_prefix(NAME_START)?.split_once('-')?;
    pid.parse().ok()
}

/// Removes every namespace a runner made that is no longer alive (killed
/// before it could remove them).
fn sweep_dead_runners() {
    remove_where(|name| {
        maker_of(name).is_some_and(|pid| {
            matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
                Err(nix::errno::Errno::ESRCH)
            )
        })
    });
}

/// Removes every named network namespace whose name `matches`.
fn remove_where(matches: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(namespace::NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches(&name) {
            namespace::remove(&name);
        }
    }
}

/// Reads `RUNNER_LOCAL_NETWORK`.
/// `search_path`: the runner's own `PATH`.
pub fn load_network_config(env: &Env, search_path: &str) -> Result<NetworkConfig, ConfigError> {
    match RUNNER_LOCAL_NETWORK.string_or_default(env).as_str() {
        "isolated" => Ok(NetworkConfig::Isolated {
            search_path: search_path.to_owned(),
        }),
        "host" => Ok(NetworkConfig::Host),
        other => Err(ConfigError::not_one_of(
            RUNNER_LOCAL_NETWORK.name,
            &["isolated", "host"],
            other,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_names_the_runner_that_made_it() {
        assert_eq!(maker_of("telo-4242-abcdefgh2345-0"), Some(4242));
        assert_eq!(maker_of("telo-check"), None);
        assert_eq!(maker_of("cni-1234-5678"), None);
        assert_eq!(maker_of("telo-x-1"), None);
    }

    #[test]
    fn the_mode_is_isolated_unless_host_is_named() {
        let env = runner_core::env::env_from_pairs(&[]);
        assert_eq!(
            load_network_config(&env, "/bin").unwrap(),
            NetworkConfig::Isolated {
                search_path: "/bin".to_owned()
            }
        );
        let env = runner_core::env::env_from_pairs(&[("RUNNER_LOCAL_NETWORK", "host")]);
        assert_eq!(
            load_network_config(&env, "/bin").unwrap(),
            NetworkConfig::Host
        );
        let env = runner_core::env::env_from_pairs(&[("RUNNER_LOCAL_NETWORK", "shared")]);
        let err = load_network_config(&env, "/bin").unwrap_err().to_string();
        assert!(err.contains("RUNNER_LOCAL_NETWORK"), "{err}");
    }
}
