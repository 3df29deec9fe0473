//! A TCP relay for tests: connections accepted on a loopback (or node)
//! address are spliced to one of its targets, taken in turn — the
//! round-robin balancer a Kubernetes Service puts in front of several
//! runner replicas. A target that refuses is skipped. The relay can be cut
//! (every open connection closed, new ones refused) and restored, which
//! stands in for a network partition.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

pub struct Relay {
    addr: SocketAddr,
    targets: Arc<Mutex<Vec<SocketAddr>>>,
    /// `true` while cut.
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on a free port of `ip` and relays to `targets` in turn.
    pub async fn start(ip: IpAddr, targets: Vec<SocketAddr>) -> Relay {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        Self::on(listener, targets)
    }

    /// Relays what `listener` accepts.
    pub fn on(listener: TcpListener, targets: Vec<SocketAddr>) -> Relay {
        let addr = listener.local_addr().unwrap();
        let targets = Arc::new(Mutex::new(targets));
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, targets.clone(), cut_rx));
        Relay {
            addr,
            targets,
            cut,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the targets (connections already open stay).
    pub fn set_targets(&self, targets: Vec<SocketAddr>) {
        self.targets().set(targets);
    }

    /// A handle that replaces the targets from elsewhere (a task that
    /// follows a Service's endpoints).
    pub fn targets(&self) -> Targets {
        Targets(self.targets.clone())
    }

    /// Closes every relayed connection and refuses new ones until
    /// [`Relay::restore`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

/// Where a [`Relay`] sends new connections, shared with it.
#[derive(Clone)]
pub struct Targets(Arc<Mutex<Vec<SocketAddr>>>);

impl Targets {
    /// Replaces the targets (connections already open stay).
    pub fn set(&self, targets: Vec<SocketAddr>) {
        *self.0.lock().unwrap() = targets;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    targets: Arc<Mutex<Vec<SocketAddr>>>,
    cut: watch::Receiver<bool>,
) {
    let next = AtomicUsize::new(0);
    // Owned here: aborting the loop drops every connection with it.
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok((client, _)) = accepted else { continue };
        if *cut.borrow() {
            drop(client);
            continue;
        }
        let candidates = targets.lock().unwrap().clone();
        let first = next.fetch_add(1, Ordering::Relaxed);
        let mut cut = cut.clone();
        connections.spawn(async move {
            let mut upstream = None;
            for i in 0..candidates.len() {
                let target = candidates[(first + i) % candidates.len()];
                if let Ok(stream) = TcpStream::connect(target).await {
                    upstream = Some(stream);
                    break;
                }
            }
            let Some(mut upstream) = upstream else { return };
            let _ = upstream.set_nodelay(true);
            let _ = client.set_nodelay(true);
            let mut client = client;
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                _ = cut.wait_for(|cut| *cut) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn answering(word: &'static [u8]) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                stream.write_all(word).await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0_u8; 16];
                    let _ = stream.read(&mut buf).await;
                });
            }
        });
        (addr, task)
    }

    async fn first_word(relay: &Relay) -> Vec<u8> {
        let mut stream = TcpStream::connect(relay.addr()).await.unwrap();
        let mut buf = [0_u8; 1];
        let n = stream.read(&mut buf).await.unwrap();
        buf[..n].to_vec()
    }

    #[tokio::test]
    async fn connections_go_round_robin_skipping_a_target_that_refuses() {
        let (a, _a) = answering(b"a").await;
        let (b, _b) = answering(b"b").await;
        let refusing = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let relay = Relay::start("127.0.0.1".parse().unwrap(), vec![a, refusing, b]).await;
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.extend(first_word(&relay).await);
        }
        assert_eq!(seen, b"abb");
    }

    #[tokio::test]
    async fn a_cut_relay_closes_its_connections_and_refuses_until_restored() {
        let (a, _a) = answering(b"a").await;
        let relay = Relay::start("127.0.0.1".parse().unwrap(), vec![a]).await;
        let mut open = TcpStream::connect(relay.addr()).await.unwrap();
        let mut buf = [0_u8; 1];
        assert_eq!(open.read(&mut buf).await.unwrap(), 1);
        relay.cut();
        assert_eq!(open.read(&mut buf).await.unwrap(), 0, "closed by the cut");
        assert_eq!(first_word(&relay).await, b"", "refused while cut");
        relay.restore();
        assert_eq!(first_word(&relay).await, b"a");
    }
}
