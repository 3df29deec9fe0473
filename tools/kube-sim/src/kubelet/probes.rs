//! Readiness probes, as the kubelet runs them: `httpGet` and `tcpSocket`
//! against the pod's address from the node, every `periodSeconds` after
//! `initialDelaySeconds`; `successThreshold` passes in a row make the
//! container ready, `failureThreshold` failures in a row unready, and each
//! failure is a `Unhealthy` event. A container with a readiness probe is
//! not ready until its probe has passed; one without is ready once it runs.
//! `exec` and `grpc` probes are not run here: such a container never
//! becomes ready, and an event says why.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use status::ContainerState;

impl Kubelet {
    /// Probes main container `idx` of `w` for as long as it is polled:
    /// dropped when the container exits.
    pub(super) async fn probe_readiness(
        &self,
        w: &PodWorker,
        idx: usize,
        ip: Ipv4Addr,
        c: &Container,
        probe: Probe,
    ) -> Infallible {
        let seconds = |v: Option<i32>, default: i32| {
            Duration::from_secs(u64::try_from(v.unwrap_or(default).max(0)).unwrap_or(0))
        };
        let period = seconds(probe.period_seconds, 10).max(Duration::from_secs(1));
        let timeout = seconds(probe.timeout_seconds, 1).max(Duration::from_secs(1));
        let successes = probe.success_threshold.unwrap_or(1).max(1);
        let failures = probe.failure_threshold.unwrap_or(3).max(1);
        let fp = format!("spec.containers{{{}}}", c.name);
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::limited(10))
            .build()
            .unwrap_or_default();
        tokio::time::sleep(seconds(probe.initial_delay_seconds, 0)).await;
        let (mut passed, mut failed) = (0, 0);
        loop {
            let running = self
                .container_model(w, false, idx, |m| {
                    matches!(m.state, ContainerState::Running { .. })
                })
                .unwrap_or(false);
            let result = if running {
                probe_once(&client, &probe, ip, c, timeout).await
            } else {
                Err("container is not running".to_owned())
            };
            let ready = match result {
                Ok(()) => {
                    (passed, failed) = (passed + 1, 0);
                    (passed >= successes).then_some(true)
                }
                Err(why) => {
                    (passed, failed) = (0, failed + 1);
                    self.event(
                        w,
                        Some(fp.clone()),
                        EventType::Warning,
                        "Unhealthy",
                        &format!("Readiness probe failed: {why}"),
                    );
                    (failed >= failures).then_some(false)
                }
            };
            if let Some(ready) = ready {
                let changed = self
                    .container_model(w, false, idx, |m| {
                        let changed = m.ready != ready;
                        m.ready = ready;
                        changed
                    })
                    .unwrap_or(false);
                if changed {
                    self.publish(w);
                }
            }
            tokio::time::sleep(period).await;
        }
    }
}

/// One probe: `Ok` when it passed, else what failed, worded as the
/// kubelet's event says it.
async fn probe_once(
    client: &reqwest::Client,
    probe: &Probe,
    pod_ip: Ipv4Addr,
    c: &Container,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(get) = &probe.http_get {
        let port = port_of(&get.port, c)?;
        let host = get.host.clone().unwrap_or_else(|| pod_ip.to_string());
        let scheme = get.scheme.as_deref().unwrap_or("HTTP");
        if scheme != "HTTP" {
            return Err(format!("kube-sim probes only HTTP, not {scheme}"));
        }
        let path = get.path.as_deref().unwrap_or("/");
        let host = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => host,
        };
        let url = format!("http://{host}:{port}{path}");
        let mut request = client.get(&url).header("User-Agent", "kube-probe/1.31");
        for header in get.http_headers.iter().flatten() {
            request = request.header(&header.name, &header.value);
        }
        return match request.send().await {
            Ok(answer) if (200..400).contains(&answer.status().as_u16()) => Ok(()),
            Ok(answer) => Err(format!(
                "HTTP probe failed with statuscode: {}",
                answer.status().as_u16()
            )),
            Err(err) => Err(format!("Get \"{url}\": {}", error_chain(&err))),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = port_of(&tcp.port, c)?;
        let ip = tcp
            .host
            .as_deref()
            .and_then(|h| h.parse::<IpAddr>().ok())
            .unwrap_or(IpAddr::V4(pod_ip));
        let addr = SocketAddr::new(ip, port);
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(format!("dial tcp {addr}: connect: {err}")),
            Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
        };
    }
    Err("kube-sim runs only httpGet and tcpSocket probes".to_owned())
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port_of(port: &IntOrString, c: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("port {name:?} is not a named port of the container")),
    }
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
