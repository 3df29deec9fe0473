//! What connections may cost the workspace service, over real sockets: a
//! pod's network is shared with the session's untrusted app containers, so
//! a half-sent request is closed at the header deadline and, past the
//! connection cap, a client gets a clear 503 while the slots last.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use runner_core::config::ConnectionLimits;
use runner_workspace::WorkspaceLimits;
use runner_workspace_service::{Config, connection_limits, serve_on};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Bound on anything a test waits for.
const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "tok-workspace-connections-0123456789abcdef";
const HEALTH: &[u8] = b"GET /v1/health HTTP/1.1\r\nhost: workspace\r\n\r\n";

struct Served {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(connections: ConnectionLimits) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = Config {
            dir: dir.path().join("workspace"),
            listen: addr,
            token: TOKEN.to_owned(),
            limits: WorkspaceLimits::default(),
            exit_after_write: None,
            connections,
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { serve_on(listener, config, shutdown).await.unwrap() }
        });
        Served {
            addr,
            shutdown,
            task,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Err(_) => panic!("the service kept the connection open past {WAIT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return received,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status code and JSON body of a raw HTTP/1.1 response.
fn parse_response(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())))
        .unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn the_service_bounds_connections_as_the_runner_does_by_default() {
    let limits = connection_limits();
    assert_eq!(
        limits.max_connections,
        runner_workspace_service::MAX_CONNECTIONS
    );
    assert_eq!(limits.header_timeout, Duration::from_secs(10));
}

#[tokio::test]
async fn idle_and_half_sent_connections_are_closed_at_the_header_deadline() {
    let served = Served::start(ConnectionLimits {
        header_timeout: Duration::from_secs(1),
        ..connection_limits()
    })
    .await;
    let mut idle = TcpStream::connect(served.addr).await.unwrap();
    let mut half_sent = TcpStream::connect(served.addr).await.unwrap();
    half_sent
        .write_all(b"POST /v1/apply HTTP/1.1\r\nhost: workspace\r\nx-slow: ")
        .await
        .unwrap();
    let mut kept_alive = TcpStream::connect(served.addr).await.unwrap();
    kept_alive.write_all(HEALTH).await.unwrap();
    let (idle_sent, half_sent_sent, kept_alive_sent) = tokio::join!(
        read_to_close(&mut idle),
        read_to_close(&mut half_sent),
        read_to_close(&mut kept_alive),
    );
    assert!(idle_sent.is_empty());
    assert!(half_sent_sent.is_empty());
    assert_eq!(parse_response(&kept_alive_sent).0, 200);
    served.stop().await;
}

#[tokio::test]
async fn past_the_connection_cap_a_client_is_told_and_served_once_slots_free() {
    const CAP: usize = 4;
    let served = Served::start(ConnectionLimits {
        max_connections: CAP,
        ..connection_limits()
    })
    .await;
    // Connections are accepted in the order they were made: once the last
    // one's request is answered, every one of them holds a slot.
    let mut held = Vec::new();
    for _ in 0..CAP - 1 {
        let mut half_sent = TcpStream::connect(served.addr).await.unwrap();
        half_sent
            .write_all(b"GET /v1/health HTTP/1.1\r\nhost: ")
            .await
            .unwrap();
        held.push(half_sent);
    }
    let mut last = TcpStream::connect(served.addr).await.unwrap();
    last.write_all(HEALTH).await.unwrap();
    let mut buf = [0_u8; 1024];
    let n = tokio::time::timeout(WAIT, last.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parse_response(&buf[..n]).0, 200);
    held.push(last);

    let mut refused = TcpStream::connect(served.addr).await.unwrap();
    let _ = refused.write_all(HEALTH).await;
    let (status, body) = parse_response(&read_to_close(&mut refused).await);
    assert_eq!(status, 503);
    assert_eq!(
        body,
        json!({"error": "too_many_connections",
            "message": "The workspace service is serving its limit of 4 connections; try again shortly."})
    );

    drop(held);
    // The slots come back as the service sees the connections close.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut probe = TcpStream::connect(served.addr).await.unwrap();
        let _ = probe
            .write_all(b"GET /v1/health HTTP/1.1\r\nhost: workspace\r\nconnection: close\r\n\r\n")
            .await;
        let answer = read_to_close(&mut probe).await;
        if !answer.is_empty() && parse_response(&answer).0 == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the health route never answered again"
        );
        tokio::task::yield_now().await;
    }
    served.stop().await;
}
