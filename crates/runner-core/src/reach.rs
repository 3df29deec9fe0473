//! Where the runner dials a workload's ports: an address on the runner's
//! own network (a pod IP; loopback for a local session that shares the
//! runner's network), or the workload's own network namespace, where it
//! listens on its loopback and only sockets opened inside that namespace
//! reach it. Reachability probes, the kernel's debug stream and the
//! session edge all dial through a [`Reach`].

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpSocket, TcpStream};

/// Opens sockets inside one network namespace.
#[async_trait::async_trait]
pub trait SocketOpener: Send + Sync + 'static {
    /// A fresh, unconnected IPv4 TCP socket that lives in the namespace.
    async fn open(&self) -> io::Result<TcpSocket>;

    /// Names the namespace for as long as it lives, and never another one
    /// after it: connections kept for reuse are kept per name.
    fn id(&self) -> u64;
}

/// Where a workload's ports are dialed.
#[derive(Clone)]
pub enum Reach {
    /// At this address of the runner's network.
    Address(IpAddr),
    /// At loopback inside the workload's own network namespace.
    Namespace(Arc<dyn SocketOpener>),
}

impl fmt::Debug for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Address(ip) => write!(f, "{ip}"),
            Self::Namespace(opener) => write!(f, "network namespace #{}", opener.id()),
        }
    }
}

impl Reach {
    /// Loopback of the runner's own network.
    pub const LOOPBACK: Self = Self::Address(IpAddr::V4(Ipv4Addr::LOCALHOST));

    /// Connects to `port` of the workload, with Nagle off (requests and
    /// frames are small and relayed as they come).
    pub async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        let stream = match self {
            Self::Address(ip) => TcpStream::connect(SocketAddr::new(*ip, port)).await?,
            Self::Namespace(opener) => {
                let socket = opener.open().await?;
                socket
                    .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                    .await?
            }
        };
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    /// `port` of the workload, as logs and the edge's pool name it.
    pub fn describe(&self, port: u16) -> String {
        match self {
            Self::Address(ip) => SocketAddr::new(*ip, port).to_string(),
            Self::Namespace(opener) => format!("ns{}.invalid:{port}", opener.id()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_address_is_dialed_as_it_is() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stream = Reach::LOOPBACK.connect(port).await.unwrap();
        assert!(stream.nodelay().unwrap());
        assert_eq!(Reach::LOOPBACK.describe(port), format!("127.0.0.1:{port}"));
    }

    struct Loopback;

    #[async_trait::async_trait]
    impl SocketOpener for Loopback {
        async fn open(&self) -> io::Result<TcpSocket> {
            TcpSocket::new_v4()
        }
        fn id(&self) -> u64 {
            7
        }
    }

    #[tokio::test]
    async fn a_namespace_is_dialed_at_its_loopback_through_its_opener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let reach = Reach::Namespace(Arc::new(Loopback));
        reach.connect(port).await.unwrap();
        assert_eq!(reach.describe(port), format!("ns7.invalid:{port}"));
    }
}
