//! The isolated pod network of the process runtime: each pod its own
//! network namespace and address on the simulator's bridge, the node
//! reachable at the bridge's gateway, nothing left behind after the
//! simulator, and the fallback to the host network saying why.
//!
//! Isolated pods need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and
//! iproute2; where the machine has neither, the tests that need them say
//! so and pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, LogParams};
use kube_sim::{KubeSim, PodNetwork, StartError};
use serde_json::json;
use support::*;

/// A simulator with isolated pods, or `None` (with a note) where the
/// machine does not allow them.
async fn isolated() -> Option<KubeSim> {
    match builder().pod_network(PodNetwork::Isolated).start().await {
        Ok(sim) => Some(sim),
        Err(StartError::Network(e)) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("kube-sim starts: {e}"),
    }
}

/// Listens on 0.0.0.0:<argv1>, says `ready`, answers every connection with
/// <argv2>.
const SERVER: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    c.close()
"#;

/// Prints the downward API's node and pod IPs, then tries each
/// `<host>:<port>` argument and prints `<arg> open|closed`.
const PROBE: &str = r#"
import os, socket, sys
print("env", os.environ["NODE_IP"], os.environ["POD_IP"], flush=True)
for a in sys.argv[1:]:
    h, p = a.rsplit(":", 1)
    try:
        socket.create_connection((h, int(p)), timeout=5).close()
        print(a, "open", flush=True)
    except OSError:
        print(a, "closed", flush=True)
"#;

fn python_pod(name: &str, script: &str, args: &[String]) -> serde_json::Value {
    let mut command = vec!["python3".to_owned(), "-c".to_owned(), script.to_owned()];
    command.extend(args.iter().cloned());
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:stable", "command": command}]}
    })
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

async fn pod_ip(sim: &KubeSim, name: &str) -> String {
    sim.wait_for::<Pod>("default", name, |p| phase(p) == "Running", WAIT)
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap()
}

async fn read_all(addr: (&str, u16)) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test]
async fn two_pods_listen_on_one_wildcard_port_each_at_its_own_ip() {
    let Some(sim) = isolated().await else { return };
    // Any port: each pod has its own.
    let port = test_support::free_port();
    for name in ["left", "right"] {
        sim.seed_value(python_pod(
            name,
            SERVER,
            &[port.to_string(), name.to_owned()],
        ))
        .unwrap();
    }
    for name in ["left", "right"] {
        until_logged(&sim, name, "ready").await;
    }
    let (left, right) = (pod_ip(&sim, "left").await, pod_ip(&sim, "right").await);
    assert_ne!(left, right);
    assert!(is_pod_ip(&sim, &left) && is_pod_ip(&sim, &right));
    assert_eq!(read_all((left.as_str(), port)).await, "left");
    assert_eq!(read_all((right.as_str(), port)).await, "right");
}

#[tokio::test]
async fn a_pod_reaches_the_node_address_and_other_pods_but_not_host_loopback() {
    let Some(sim) = isolated().await else { return };
    let node = sim.node_ip();
    assert_ne!(node, std::net::Ipv4Addr::LOCALHOST);
    // A loopback-only service of the host, and one on the node address (a
    // runner, say).
    let loopback = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let on_node = tokio::net::TcpListener::bind((node, 0)).await.unwrap();
    let loopback_port = loopback.local_addr().unwrap().port();
    let node_port = on_node.local_addr().unwrap().port();
    let accepted = tokio::spawn(async move {
        let (_, peer) = on_node.accept().await.unwrap();
        peer.ip()
    });
    sim.seed_value(python_pod(
        "server",
        SERVER,
        &[node_port.to_string(), "pod".into()],
    ))
    .unwrap();
    until_logged(&sim, "server", "ready").await;
    let server = pod_ip(&sim, "server").await;
    let targets = [
        format!("127.0.0.1:{loopback_port}"),
        format!("{node}:{node_port}"),
        format!("{server}:{node_port}"),
    ];
    let mut probe = python_pod("probe", PROBE, &targets);
    probe["spec"]["containers"][0]["env"] = json!([
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]);
    sim.seed_value(probe).unwrap();
    let done = sim
        .wait_for::<Pod>("default", "probe", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
    let status = done.status.unwrap();
    let probe_ip = status.pod_ip.clone().unwrap();
    assert_eq!(status.host_ip.as_deref(), Some(node.to_string().as_str()));
    let logs = Api::<Pod>::namespaced(sim.client(), "default")
        .logs("probe", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        vec![
            format!("env {node} {probe_ip}"),
            format!("{} closed", targets[0]),
            format!("{} open", targets[1]),
            format!("{} open", targets[2]),
        ],
        "{logs}"
    );
    // The node saw the pod's own address.
    let peer = tokio::time::timeout(WAIT, accepted).await.unwrap().unwrap();
    assert_eq!(peer.to_string(), probe_ip);
    // The Node object says where pods reach it.
    let node_obj: Node = Api::all(sim.client())
        .get(kube_sim::storage::defaults::NODE_NAME)
        .await
        .unwrap();
    let addresses = node_obj.status.unwrap().addresses.unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == node.to_string()),
        "{addresses:?}"
    );
}

/// Dials <argv1> over TCP and sends it a UDP datagram (a DNS query's way),
/// printing how each ended: `ok` or the error's errno name.
const BEYOND: &str = r#"
import errno, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
def named(e):
    return errno.errorcode.get(e.errno, str(e))
try:
    socket.create_connection((host, port), timeout=60).close()
    print("tcp ok", flush=True)
except OSError as e:
    print("tcp", named(e), flush=True)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (host, port))
    print("udp ok", flush=True)
except OSError as e:
    print("udp", named(e), flush=True)
"#;

#[tokio::test]
async fn nothing_past_the_pod_network_is_routed_and_a_lookup_fails_at_once() {
    let Some(sim) = isolated().await else { return };
    // An address outside the pod network (TEST-NET-2, RFC 5737): no route
    // leads there from a pod, so nothing leaves the machine and a resolver
    // there is refused at once instead of waited on.
    sim.seed_value(python_pod(
        "beyond",
        BEYOND,
        &["198.51.100.53".into(), "53".into()],
    ))
    .unwrap();
    sim.wait_for::<Pod>("default", "beyond", |p| phase(p) == "Succeeded", WAIT)
        .await
        .unwrap();
    let logs = Api::<Pod>::namespaced(sim.client(), "default")
        .logs("beyond", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        ["tcp ENETUNREACH", "udp ENETUNREACH"],
        "{logs}"
    );
}

async fn a_running_pod(sim: &KubeSim, name: &str) {
    let port = test_support::free_port();
    sim.seed_value(python_pod(
        name,
        SERVER,
        &[port.to_string(), name.to_owned()],
    ))
    .unwrap();
    until_logged(sim, name, "ready").await;
}

#[tokio::test]
async fn shutdown_leaves_no_bridge_veth_or_namespace() {
    let Some(sim) = isolated().await else { return };
    a_running_pod(&sim, "one").await;
    let pid = std::process::id();
    let made = leftovers(pid);
    assert_eq!(made.len(), 3, "a bridge, a veth, a namespace: {made:?}");
    sim.shutdown().await;
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

#[tokio::test]
async fn a_dropped_simulators_guardian_removes_its_network() {
    let Some(sim) = isolated().await else { return };
    a_running_pod(&sim, "one").await;
    let pid = std::process::id();
    assert!(!leftovers(pid).is_empty());
    drop(sim);
    // The guardian works in the background: wait for its result.
    let deadline = std::time::Instant::now() + WAIT;
    while !leftovers(pid).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {:?}",
            leftovers(pid)
        );
        tokio::task::yield_now().await;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_starting_simulator_removes_what_dead_ones_left() {
    if isolated().await.is_none() {
        return;
    }
    // The leftovers are made while their process still lives: a simulator
    // another test starts meanwhile sweeps a dead process's network, and
    // could take a piece from under `ip` half-way through making it.
    // `cat` on a pipe ends with this test, should the test fail first.
    let mut owner = Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let dead = owner.id();
    let ip = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    };
    let bridge = format!("ksb{dead:x}-0");
    let veth = format!("ksv{dead:x}-0");
    let netns = format!("kube-sim-{dead}-0-0");
    ip(&["link", "add", &bridge, "type", "bridge"]);
    ip(&["netns", "add", &netns]);
    ip(&[
        "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
    ]);
    ip(&["link", "set", &veth, "master", &bridge]);
    owner.kill().unwrap();
    owner.wait().unwrap();
    // (Not counted here: a simulator another test starts meanwhile may
    // sweep them first, as any starting simulator does.)
    let sim = isolated().await.unwrap();
    assert_eq!(leftovers(dead), Vec::<String>::new());
    sim.shutdown().await;
}

#[tokio::test]
async fn the_binary_prints_the_node_address_and_a_killed_one_leaves_nothing_after_the_next_start() {
    if isolated().await.is_none() {
        return;
    }
    let (mut child, lines) = start_binary(&["--pod-network", "isolated"], None);
    let node = lines
        .last()
        .and_then(|l| l.strip_prefix("node address "))
        .unwrap_or_else(|| panic!("{lines:?}"))
        .to_owned();
    assert!(!node.starts_with("127."), "{lines:?}");
    let pid = child.id();
    assert_eq!(leftovers(pid).len(), 1, "its bridge");
    child.kill().unwrap();
    child.wait().unwrap();
    let sim = isolated().await.unwrap();
    assert_eq!(leftovers(pid), Vec::<String>::new());
    sim.shutdown().await;
}

#[tokio::test]
async fn without_ip_auto_falls_back_to_the_host_network_saying_why() {
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_str().unwrap();
    let (child, lines) = start_binary(&[], Some(path));
    assert_eq!(
        lines.last().map(String::as_str),
        Some("node address 127.0.0.1")
    );
    let stderr = stop(child);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("host network"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("no `ip` (iproute2) on PATH"), "{stderr}");
}

#[tokio::test]
async fn without_ip_isolated_refuses_to_start() {
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_str().unwrap();
    let (child, lines) = start_binary(&["--pod-network", "isolated"], Some(path));
    assert!(lines.is_empty(), "{lines:?}");
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("isolated pod networks are not available here: no `ip` (iproute2) on PATH"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_host_network_keeps_loopback_pod_ips() {
    let sim = builder()
        .pod_network(PodNetwork::Host)
        .start()
        .await
        .unwrap();
    assert!(sim.pod_bridge().is_none());
    assert_eq!(sim.node_ip(), std::net::Ipv4Addr::LOCALHOST);
    a_running_pod(&sim, "plain").await;
    let ip = pod_ip(&sim, "plain").await;
    assert!(ip.starts_with("127."), "{ip}");
}

#[tokio::test]
async fn two_kernels_bind_one_loopback_debug_port() {
    let Some(sim) = isolated().await else { return };
    let port = test_support::free_port();
    let inspect = format!("127.0.0.1:{port}");
    for name in ["first", "second"] {
        sim.seed_value(app_configmap(name, "  listen: [0]\n"))
            .unwrap();
        let mut pod = pod_with_app(name, name, false);
        pod["spec"]["containers"][0]["command"] =
            json!(["telo", "run", "--inspect", inspect, "/app/telo.yaml"]);
        sim.seed_value(pod).unwrap();
    }
    for name in ["first", "second"] {
        until_logged(&sim, name, &format!("inspect listening on {inspect}")).await;
    }
}

fn bridge_mac_and_ports(bridge: &str) -> (String, usize) {
    let run = |args: &[&str]| {
        String::from_utf8(Command::new("ip").args(args).output().unwrap().stdout).unwrap()
    };
    let shown = run(&["-o", "link", "show", "dev", bridge]);
    let mac = shown
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap()
        .to_owned();
    let ports = run(&["-o", "link", "show", "master", bridge])
        .lines()
        .count();
    (mac, ports)
}

/// Pods that learnt the gateway's MAC keep reaching it as other pods come
/// and go: the bridge's MAC is its own, not its lowest port's.
#[tokio::test]
async fn the_gateway_mac_stays_as_pods_come_and_go() {
    let Some(sim) = isolated().await else { return };
    let bridge = sim.pod_bridge().unwrap().name().to_owned();
    let (before, _) = bridge_mac_and_ports(&bridge);
    for name in ["first", "second", "third"] {
        a_running_pod(&sim, name).await;
    }
    assert_eq!(bridge_mac_and_ports(&bridge), (before.clone(), 3));
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    for name in ["first", "second"] {
        pods.delete(name, &kube::api::DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + WAIT;
    while bridge_mac_and_ports(&bridge).1 > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the deleted pods' veths stay"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(bridge_mac_and_ports(&bridge), (before, 1));
}
