//! The isolated pod network: each pod gets its own network namespace and
//! address, as on a node whose CNI plugin puts pods on a bridge. A
//! simulator makes one Linux bridge holding the gateway address of a
//! private subnet chosen not to collide with the host's routes; each pod is
//! a named network namespace with a veth pair, the pod's end (`eth0`, the
//! pod IP) inside, the host's end on the bridge. Every container of the
//! pod, init containers included, runs inside it, so its loopback is its
//! own, two pods can listen on one port, and a pod reaches the host only at
//! the gateway (the node address). In the process runtime the namespace is
//! a new one and containers enter it through `nsenter`; in the docker
//! runtime it is the namespace of the pod's infra container, named with
//! `ip netns attach` ([`Bridge::attach_process`]), which the pod's
//! containers join (`--network container:<infra>`).
//!
//! Everything is made with `ip` from iproute2 and named after the process
//! that made it (its pid, in hex), so that nothing outlives the simulator:
//! shutdown removes it, a guardian process (a shell waiting on a pipe only
//! this process holds, as the docker runtime's) removes it when the
//! simulator is dropped or dies, and a simulator starting removes what dead
//! ones left.
//!
//! Where the machine does not allow it (not root, no `ip`, no `nsenter`,
//! no network namespaces; for the docker runtime also no `ip netns
//! attach`, an engine that is remote or rootless, or no infra image),
//! [`PodNetwork::Auto`] falls back to the host network with one log line
//! saying why, and [`PodNetwork::Isolated`] refuses to start.

use std::collections::HashSet;
use std::fmt;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::io::AsyncWriteExt as _;

/// Where named network namespaces live (`ip netns`).
const NETNS_DIR: &str = "/run/netns";
/// Prefixes of what a simulator creates: bridges and host-side veths carry
/// `<prefix><pid in hex>-<n in hex>` (at most 15 characters, the kernel's
/// limit), namespaces `kube-sim-<pid>-<instance>-<n>`.
const BRIDGE_PREFIX: &str = "ksb";
const VETH_PREFIX: &str = "ksv";
const NETNS_PREFIX: &str = "kube-sim-";
/// The pods' subnet: a /18 of 10.0.0.0/8 (16381 pods at once, more than
/// the node's capacity of 5000).
const PREFIX_LEN: u8 = 18;

/// Which network a simulator's pods get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PodNetwork {
    /// Isolated when the machine allows it, else the host network (with a
    /// log line saying why).
    #[default]
    Auto,
    /// A network namespace and address of its own for each pod; the
    /// simulator does not start if the machine does not allow it.
    Isolated,
    /// Every pod shares the host's network namespace, with an address of
    /// 127.0.0.0/8 of its own.
    Host,
}

impl FromStr for PodNetwork {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "isolated" => Ok(Self::Isolated),
            "host" => Ok(Self::Host),
            other => Err(format!(
                "unknown pod network {other:?}: expected isolated, host or auto"
            )),
        }
    }
}

impl fmt::Display for PodNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Isolated => "isolated",
            Self::Host => "host",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The machine does not allow isolated pods.
    #[error("isolated pod networks are not available here: {0}")]
    Unavailable(String),
    /// A step of making the network failed.
    #[error("could not {what}: {message}")]
    Setup { what: String, message: String },
}

/// What a requested pod network comes to, given whether the machine allows
/// isolated ones (`Err`: why not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Isolated,
    Host,
    /// The host network, because isolated pods are not possible: why.
    Fallback(String),
}

/// Decides the pod network: `Auto` falls back, `Isolated` fails, `Host` is
/// the host network whatever the machine allows.
pub fn decide(
    requested: PodNetwork,
    available: Result<(), String>,
) -> Result<Decision, NetworkError> {
    match (requested, available) {
        (PodNetwork::Host, _) => Ok(Decision::Host),
        (_, Ok(())) => Ok(Decision::Isolated),
        (PodNetwork::Auto, Err(why)) => Ok(Decision::Fallback(why)),
        (PodNetwork::Isolated, Err(why)) => Err(NetworkError::Unavailable(why)),
    }
}

/// A program on `PATH` (or in the usual system directories, which a
/// non-login `PATH` may lack).
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The tools isolated pods need, if the machine has them and allows
/// network namespaces (tried: one is created and removed).
pub fn probe() -> Result<Tools, String> {
    let ip = find_program("ip").ok_or("no `ip` (iproute2) on PATH")?;
    let nsenter = find_program("nsenter").ok_or("no `nsenter` (util-linux) on PATH")?;
    let name = format!("{NETNS_PREFIX}{}-probe", std::process::id());
    run_blocking(&ip, &["netns", "add", &name]).map_err(|e| {
        format!("creating a network namespace failed ({e}); it needs root or CAP_NET_ADMIN and CAP_SYS_ADMIN")
    })?;
    let _ = run_blocking(&ip, &["netns", "del", &name]);
    Ok(Tools { ip, nsenter })
}

/// Whether this `ip` can name another process's network namespace (`ip
/// netns attach`, iproute2 4.19 and later), as the docker runtime's pods
/// need: tried on this process's own namespace, whose name is removed
/// again (which leaves the namespace itself alone).
pub fn probe_attach(tools: &Tools) -> Result<(), String> {
    let pid = std::process::id();
    let name = format!("{NETNS_PREFIX}{pid}-probe-attach");
    run_blocking(&tools.ip, &["netns", "attach", &name, &pid.to_string()])
        .map_err(|e| format!("`ip netns attach` failed ({e}); it needs iproute2 4.19 or later"))?;
    let _ = run_blocking(&tools.ip, &["netns", "del", &name]);
    Ok(())
}

/// `ip` and `nsenter`.
#[derive(Debug, Clone)]
pub struct Tools {
    ip: PathBuf,
    nsenter: PathBuf,
}

fn run_blocking(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run {}: {e}", program.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Runs `ip [-n netns] -batch -` with `commands`, one a line; `force`
/// goes on past a failing one.
async fn ip_batch(
    ip: &Path,
    netns: Option<&str>,
    force: bool,
    commands: &str,
) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new(ip);
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    if force {
        cmd.arg("-force");
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("could not run {}: {e}", ip.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(commands.as_bytes())
            .await
            .map_err(|e| format!("could not write to ip: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("ip failed: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Whether process `pid` is alive (this process's namespace of pids).
fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The pid a bridge or veth name carries (`ksb1a2b-3` → 0x1a2b).
fn pid_of_link(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix(BRIDGE_PREFIX)
        .or_else(|| name.strip_prefix(VETH_PREFIX))?;
    let (pid, n) = rest.split_once('-')?;
    u32::from_str_radix(n, 16).ok()?;
    u32::from_str_radix(pid, 16).ok()
}

/// The pid a namespace name carries (`kube-sim-6699-0-4` → 6699).
fn pid_of_netns(name: &str) -> Option<u32> {
    name.strip_prefix(NETNS_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Link names of `ip -o link show` output (`5: ksv1a-2@if2: <…>`).
fn link_names(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|n| {
            let n = n.trim_end_matches(':');
            n.split('@').next().unwrap_or(n).to_owned()
        })
        .collect()
}

/// Namespace names of `ip netns list` output (`name (id: 3)`).
fn netns_names(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Removes the bridges, veths and namespaces of simulators whose process
/// is gone (killed outright, before or with their guardian).
pub fn sweep_dead(tools: &Tools) {
    if let Ok(links) = run_blocking(&tools.ip, &["-o", "link", "show"]) {
        for name in link_names(&links) {
            if pid_of_link(&name).is_some_and(|pid| !alive(pid)) {
                let _ = run_blocking(&tools.ip, &["link", "del", &name]);
            }
        }
    }
    if let Ok(list) = run_blocking(&tools.ip, &["netns", "list"]) {
        for name in netns_names(&list) {
            if pid_of_netns(&name).is_some_and(|pid| !alive(pid)) {
                let _ = run_blocking(&tools.ip, &["netns", "del", &name]);
            }
        }
    }
}

/// An IPv4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    base: u32,
    len: u8,
}

impl Net {
    fn mask(len: u8) -> u32 {
        if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        }
    }

    fn parse(s: &str) -> Option<Net> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, l.parse::<u8>().ok().filter(|l| *l <= 32)?),
            None => (s, 32),
        };
        let addr: Ipv4Addr = addr.parse().ok()?;
        Some(Net {
            base: u32::from(addr) & Self::mask(len),
            len,
        })
    }

    fn overlaps(&self, other: &Net) -> bool {
        let len = self.len.min(other.len);
        (self.base & Self::mask(len)) == (other.base & Self::mask(len))
    }
}

/// The destinations of `ip -o route show table all` and the addresses of
/// `ip -o addr show`: the first address-like word of each line.
fn used_nets(listing: &str) -> Vec<Net> {
    listing
        .lines()
        .filter_map(|l| l.split_whitespace().find_map(Net::parse))
        .collect()
}

/// A random [`PREFIX_LEN`] subnet of 10.0.0.0/8 that overlaps none of
/// `used`.
fn pick_subnet(used: &[Net]) -> Option<Net> {
    for _ in 0..256 {
        let base = u32::from(Ipv4Addr::new(10, 0, 0, 0))
            | (rand::random_range(0..(1u32 << (PREFIX_LEN - 8))) << (32 - PREFIX_LEN));
        let net = Net {
            base,
            len: PREFIX_LEN,
        };
        if !used.iter().any(|u| u.overlaps(&net)) {
            return Some(net);
        }
    }
    None
}

/// Simulators of this process, for unique names.
static INSTANCES: AtomicU32 = AtomicU32::new(0);
/// Pods of this process, for unique veth names.
static PODS: AtomicU32 = AtomicU32::new(0);
/// One subnet is chosen at a time in this process.
static CHOOSING: Mutex<()> = Mutex::new(());

/// One simulator's bridge and the pods on it.
pub struct Bridge {
    tools: Tools,
    name: String,
    netns_prefix: String,
    subnet: Net,
    in_use: Mutex<HashSet<u32>>,
    next: AtomicU32,
    guardian: Mutex<Option<std::process::ChildStdin>>,
}

/// One pod's place on the bridge.
#[derive(Debug)]
pub struct PodNet {
    pub ip: Ipv4Addr,
    netns: String,
    veth: String,
}

impl PodNet {
    /// The namespace's file, for `nsenter --net=`.
    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.netns)
    }
}

/// A random locally administered unicast MAC for a bridge.
fn bridge_mac() -> String {
    let mut bytes: [u8; 6] = rand::random();
    bytes[0] = (bytes[0] & 0xfc) | 0x02;
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl Bridge {
    /// Makes this simulator's bridge on a free subnet (after removing what
    /// dead simulators left), and its guardian.
    pub fn create(tools: Tools) -> Result<Bridge, NetworkError> {
        sweep_dead(&tools);
        let pid = std::process::id();
        let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let name = format!("{BRIDGE_PREFIX}{pid:x}-{:x}", instance & 0xfff);
        let setup = |what: &str, message: String| NetworkError::Setup {
            what: what.to_owned(),
            message,
        };
        let _choosing = CHOOSING.lock().unwrap_or_else(|p| p.into_inner());
        let mut used = Vec::new();
        for args in [
            &["-4", "-o", "route", "show", "table", "all"][..],
            &["-4", "-o", "addr", "show"][..],
        ] {
            let out =
                run_blocking(&tools.ip, args).map_err(|e| setup("list the host's routes", e))?;
            used.extend(used_nets(&out));
        }
        // Another process may choose the same subnet at the same moment:
        // whoever finds a second device on it gives it up and chooses again.
        let mut attempt = 0;
        let subnet = loop {
            let subnet = pick_subnet(&used)
                .ok_or_else(|| setup("find a free subnet", "10.0.0.0/8 is taken".into()))?;
            let gateway = Ipv4Addr::from(subnet.base + 1);
            let cidr = format!("{}/{PREFIX_LEN}", Ipv4Addr::from(subnet.base));
            let _ = run_blocking(&tools.ip, &["link", "del", &name]);
            // A bridge left to choose its own MAC takes the lowest of its
            // ports' and changes it as pods come and go, and pods that
            // learnt the gateway's old MAC lose their replies until their
            // ARP entry expires (seconds): a fixed one, as a CNI's bridge
            // has, never changes.
            let mac = bridge_mac();
            let made = run_blocking(
                &tools.ip,
                &["link", "add", &name, "address", &mac, "type", "bridge"],
            )
            .and_then(|_| {
                let address = format!("{gateway}/{PREFIX_LEN}");
                run_blocking(&tools.ip, &["addr", "add", &address, "dev", &name])
            })
            .and_then(|_| run_blocking(&tools.ip, &["link", "set", &name, "up"]))
            .and_then(|_| run_blocking(&tools.ip, &["-4", "-o", "addr", "show", "to", &cidr]));
            match made {
                Ok(holders) if link_names(&holders).iter().all(|n| *n == name) => break subnet,
                Ok(_) if attempt < 8 => {
                    attempt += 1;
                    used.push(subnet);
                    let _ = run_blocking(&tools.ip, &["link", "del", &name]);
                }
                Ok(_) => {
                    let _ = run_blocking(&tools.ip, &["link", "del", &name]);
                    return Err(setup(
                        "find a free subnet",
                        "other devices took every subnet tried".into(),
                    ));
                }
                Err(e) => {
                    let _ = run_blocking(&tools.ip, &["link", "del", &name]);
                    return Err(setup(&format!("create the pod bridge {name}"), e));
                }
            }
        };
        let bridge = Bridge {
            netns_prefix: format!("{NETNS_PREFIX}{pid}-{instance}-"),
            guardian: Mutex::new(None),
            tools,
            name,
            subnet,
            in_use: Mutex::new(HashSet::new()),
            next: AtomicU32::new(2),
        };
        *bridge.guardian.lock().unwrap_or_else(|p| p.into_inner()) = bridge.spawn_guardian();
        Ok(bridge)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bridge's address: the node as its pods see it.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.subnet.base + 1)
    }

    /// The pods' subnet (`10.a.b.0/18`).
    pub fn subnet(&self) -> String {
        format!("{}/{}", Ipv4Addr::from(self.subnet.base), self.subnet.len)
    }

    pub fn nsenter(&self) -> &Path {
        &self.tools.nsenter
    }

    fn allocate(&self) -> Option<u32> {
        let hosts = (1u32 << (32 - u32::from(PREFIX_LEN))) - 1; // .1 to broadcast-1
        let mut in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..hosts {
            let n = self.next.fetch_add(1, Ordering::Relaxed) % hosts;
            if n < 2 {
                continue;
            }
            if in_use.insert(n) {
                return Some(n);
            }
        }
        None
    }

    fn release(&self, n: u32) {
        self.in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&n);
    }

    /// A pod's namespace, veth and address.
    pub async fn attach(&self) -> Result<PodNet, String> {
        self.attach_to(None).await
    }

    /// A pod's veth and address in the network namespace of process `pid`
    /// (a docker runtime pod's infra container), named as [`Bridge::attach`]
    /// names its own: the name keeps the namespace (and with it the veth)
    /// until [`Bridge::detach`], and every cleanup path finds it by that
    /// name whether the process still runs or not.
    pub async fn attach_process(&self, pid: u32) -> Result<PodNet, String> {
        self.attach_to(Some(pid)).await
    }

    async fn attach_to(&self, process: Option<u32>) -> Result<PodNet, String> {
        let n = self
            .allocate()
            .ok_or_else(|| format!("no free pod IP in {}", self.subnet()))?;
        let ip = Ipv4Addr::from(self.subnet.base + n);
        // At most 15 characters: a pid of up to 6 hex digits, 5 for the pod.
        let k = PODS.fetch_add(1, Ordering::Relaxed) & 0xf_ffff;
        let pod = PodNet {
            ip,
            netns: format!("{}{k}", self.netns_prefix),
            veth: format!("{VETH_PREFIX}{:x}-{k:x}", std::process::id()),
        };
        // `netns attach` names an existing namespace (a bind mount of the
        // process's, as `netns add` makes one of a new namespace).
        let namespace = match process {
            None => format!("netns add {}", pod.netns),
            Some(pid) => format!("netns attach {} {pid}", pod.netns),
        };
        let host = format!(
            "{namespace}\nlink add {veth} type veth peer name eth0 netns {ns}\nlink set {veth} master {br} up\n",
            ns = pod.netns,
            veth = pod.veth,
            br = self.name,
        );
        // No default route: a pod reaches its own network, the node address
        // (the runner, the apiserver) included, and nothing past the
        // machine. With one via the node, which forwards but does not
        // masquerade, a pod's packets left the machine from its private
        // address and no answer came back: each name a pod looked up waited
        // out the host's resolver (5 s, twice; the real kernel stalled 10 s
        // in a pod), where a cluster's DNS answers at once. Without it the
        // lookup fails at once (network unreachable).
        let inside =
            format!("link set lo up\naddr add {ip}/{PREFIX_LEN} dev eth0\nlink set eth0 up\n");
        let made = match ip_batch(&self.tools.ip, None, false, &host).await {
            Ok(()) => ip_batch(&self.tools.ip, Some(&pod.netns), false, &inside).await,
            Err(e) => Err(e),
        };
        if let Err(e) = made {
            self.detach(pod).await;
            return Err(format!("could not set up the pod's network: {e}"));
        }
        Ok(pod)
    }

    /// Removes a pod's veth and namespace and frees its address.
    pub async fn detach(&self, pod: PodNet) {
        let commands = format!("link del {}\nnetns del {}\n", pod.veth, pod.netns);
        let _ = ip_batch(&self.tools.ip, None, true, &commands).await;
        self.release(u32::from(pod.ip) - self.subnet.base);
    }

    /// Removes the bridge and whatever pods are left on it, now; the
    /// guardian is released (it finds nothing left).
    pub fn close(&self) {
        let _ = run_blocking(
            Path::new("/bin/sh"),
            &[
                "-c",
                CLEANUP,
                "kube-sim-network",
                &self.tools.ip.to_string_lossy(),
                &self.name,
                &self.netns_prefix,
            ],
        );
        self.release_guardian();
    }

    /// Closes the guardian's pipe: it removes what is left, in the
    /// background (`Drop`).
    pub fn release_guardian(&self) {
        let stdin = self
            .guardian
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut s) = stdin {
            let _ = s.flush();
        }
    }

    /// A shell that waits for its stdin to close — when this simulator
    /// releases it, or when this process dies however it dies — then
    /// removes the bridge, the veths on it and the pods' namespaces.
    fn spawn_guardian(&self) -> Option<std::process::ChildStdin> {
        use std::os::unix::process::CommandExt as _;
        let script = format!("cat >/dev/null\n{CLEANUP}");
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .arg("kube-sim-network-guardian")
            .arg(&self.tools.ip)
            .arg(&self.name)
            .arg(&self.netns_prefix)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: a Ctrl-C meant for the simulator does not
            // stop it before it has cleaned up.
            .process_group(0)
            .spawn()
            .ok()?;
        let stdin = child.stdin.take();
        std::thread::spawn(move || child.wait());
        stdin
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.release_guardian();
    }
}

/// Removes bridge `$2`, the veths on it and the namespaces named `$3*`
/// (`$1`: `ip`).
const CLEANUP: &str = r#"
"$1" -o link show master "$2" 2>/dev/null | while read -r _ name _; do
  name=${name%:}
  "$1" link del "${name%%@*}" 2>/dev/null
done
"$1" link del "$2" 2>/dev/null
"$1" netns list 2>/dev/null | while read -r ns _; do
  case "$ns" in "$3"*) "$1" netns del "$ns" 2>/dev/null ;; esac
done
exit 0"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_by_name() {
        assert_eq!("auto".parse::<PodNetwork>(), Ok(PodNetwork::Auto));
        assert_eq!("isolated".parse::<PodNetwork>(), Ok(PodNetwork::Isolated));
        assert_eq!("host".parse::<PodNetwork>(), Ok(PodNetwork::Host));
        assert!("bridge".parse::<PodNetwork>().is_err());
        assert_eq!(PodNetwork::default(), PodNetwork::Auto);
    }

    #[test]
    fn auto_falls_back_with_the_reason_and_isolated_refuses() {
        let no = || Err("no `ip` (iproute2) on PATH".to_owned());
        assert_eq!(
            decide(PodNetwork::Auto, no()).unwrap(),
            Decision::Fallback("no `ip` (iproute2) on PATH".into())
        );
        let err = decide(PodNetwork::Isolated, no()).unwrap_err().to_string();
        assert!(
            err.contains("not available") && err.contains("iproute2"),
            "{err}"
        );
        assert_eq!(decide(PodNetwork::Host, no()).unwrap(), Decision::Host);
        assert_eq!(decide(PodNetwork::Host, Ok(())).unwrap(), Decision::Host);
        assert_eq!(
            decide(PodNetwork::Auto, Ok(())).unwrap(),
            Decision::Isolated
        );
        assert_eq!(
            decide(PodNetwork::Isolated, Ok(())).unwrap(),
            Decision::Isolated
        );
    }

    #[test]
    fn names_carry_their_pid() {
        assert_eq!(pid_of_link("ksb1a2b-3"), Some(0x1a2b));
        assert_eq!(pid_of_link("ksv1a2b-ff"), Some(0x1a2b));
        assert_eq!(pid_of_link("docker0"), None);
        assert_eq!(pid_of_link("ksbroken"), None);
        assert_eq!(pid_of_netns("kube-sim-6699-0-4"), Some(6699));
        assert_eq!(pid_of_netns("kube-sim-6699-probe"), Some(6699));
        assert_eq!(pid_of_netns("other"), None);
        assert_eq!(
            link_names("5: ksv1a-2@if2: <BROADCAST> mtu 1500\n1: lo: <LOOPBACK> mtu"),
            vec!["ksv1a-2".to_owned(), "lo".to_owned()]
        );
        assert_eq!(
            netns_names("kube-sim-1-0-2 (id: 3)\nx\n"),
            vec!["kube-sim-1-0-2".to_owned(), "x".to_owned()]
        );
    }

    #[test]
    fn subnets_avoid_the_hosts_routes() {
        let used = used_nets(
            "default via 192.0.2.1 dev eth0\n10.0.0.0/9 dev x scope link\nlocal 127.0.0.1 dev lo table local\n",
        );
        assert!(used.contains(&Net::parse("10.0.0.0/9").unwrap()));
        for _ in 0..50 {
            let net = pick_subnet(&used).expect("a free subnet");
            assert_eq!(net.len, PREFIX_LEN);
            let first = Ipv4Addr::from(net.base).octets();
            assert_eq!(first[0], 10);
            assert!(first[1] >= 128, "{first:?} overlaps 10.0.0.0/9");
        }
        let all = [Net::parse("10.0.0.0/8").unwrap()];
        assert_eq!(pick_subnet(&all), None);
    }
}
