//! How the edge's pooled client dials a session's app: the request's
//! authority names a [`Reach`] (an IP address, or `ns<id>.invalid` for a
//! session's own network namespace), and connections are kept per
//! authority, so a namespace's connections never serve another.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::reach::{Reach, SocketOpener};
use crate::sync::lock;

/// Past this many remembered namespaces, those gone are forgotten.
const PRUNE_PAST: usize = 64;

#[derive(Clone)]
pub(super) struct Connector {
    timeout: Duration,
    /// The namespaces requests were resolved to, by id; weak, so the edge
    /// never keeps a namespace alive after its session let go of it.
    namespaces: Arc<Mutex<HashMap<u64, Weak<dyn SocketOpener>>>>,
}

impl Connector {
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            namespaces: Arc::default(),
        }
    }

    /// The authority a request to `port` at `reach` is sent to; a namespace
    /// is remembered until it is dialed.
    pub(super) fn authority(&self, reach: &Reach, port: u16) -> String {
        if let Reach::Namespace(opener) = reach {
            let mut namespaces = lock(&self.namespaces);
            if !namespaces.contains_key(&opener.id()) {
                if namespaces.len() >= PRUNE_PAST {
                    namespaces.retain(|_, namespace| namespace.strong_count() > 0);
                }
                namespaces.insert(opener.id(), Arc::downgrade(opener));
            }
        }
        reach.describe(port)
    }

    fn reach_of(&self, host: &str) -> io::Result<Reach> {
        if let Some(id) = host
            .strip_prefix("ns")
            .and_then(|rest| rest.strip_suffix(".invalid"))
            .and_then(|id| id.parse::<u64>().ok())
        {
            return lock(&self.namespaces)
                .get(&id)
                .and_then(Weak::upgrade)
                .map(Reach::Namespace)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "the session's network namespace is gone",
                    )
                });
        }
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .map(Reach::Address)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not an upstream address"))
    }
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<TcpStream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let reach = uri
            .host()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no upstream host"))
            .and_then(|host| self.reach_of(host));
        let port = uri.port_u16().unwrap_or(80);
        let timeout = self.timeout;
        Box::pin(async move {
            let reach = reach?;
            match tokio::time::timeout(timeout, reach.connect(port)).await {
                Ok(stream) => stream.map(TokioIo::new),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connecting to the app timed out",
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::Service as _;

    struct Loopback(u64);

    #[async_trait::async_trait]
    impl SocketOpener for Loopback {
        async fn open(&self) -> io::Result<tokio::net::TcpSocket> {
            tokio::net::TcpSocket::new_v4()
        }
        fn id(&self) -> u64 {
            self.0
        }
    }

    #[tokio::test]
    async fn a_namespace_is_dialed_while_its_session_holds_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut connector = Connector::new(Duration::from_secs(5));
        let opener: Arc<dyn SocketOpener> = Arc::new(Loopback(41));
        let authority = connector.authority(&Reach::Namespace(opener.clone()), port);
        assert_eq!(authority, format!("ns41.invalid:{port}"));
        let uri: Uri = format!("http://{authority}/").parse().unwrap();
        connector.call(uri.clone()).await.unwrap();
        drop(opener);
        let gone = connector.call(uri).await.unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[tokio::test]
    async fn an_address_is_dialed_and_nothing_else_is() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut connector = Connector::new(Duration::from_secs(5));
        let authority = connector.authority(&Reach::LOOPBACK, port);
        connector
            .call(format!("http://{authority}/").parse().unwrap())
            .await
            .unwrap();
        for host in ["ns9.invalid", "example.com", "localhost"] {
            let uri: Uri = format!("http://{host}:{port}/").parse().unwrap();
            assert!(connector.call(uri).await.is_err(), "{host}");
        }
    }
}
