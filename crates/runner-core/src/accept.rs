//! The HTTP accept loop of every server the runner binary runs (the runner's
//! API, `telo-runner workspace`), bounded so that anonymous clients cannot
//! take a service down: a connection limit with a clear refusal, a
//! deadline for every request's header block (idle keep-alive connections
//! included), a header size cap, and the open-file limit raised at boot.
//!
//! HTTP/1.1 only, with upgrades for the terminal WebSocket: every client of
//! the runner (the editor, the terminal client, probes, proxies in front of
//! it, the runner itself for the workspace service) speaks it, and a
//! cleartext HTTP/2 preface would only be one more thing to bound.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::ConnectionLimits;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// File descriptors kept free of client connections: session terminals and
/// logs, apiserver connections, bundle files.
pub const RESERVED_FDS: u64 = 512;
/// How many refusals may be in flight at once; past it a connection is
/// dropped without an answer (a flood is not owed one).
const MAX_REFUSALS_IN_FLIGHT: usize = 256;
/// Time a refused client gets to take its 503.
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// Open connections get this long to finish once the service stops.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long the loop pauses after an accept error that is about the
/// process (out of file descriptors), not the peer.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// A header block of at most this many header lines.
const MAX_HEADERS: usize = 100;

/// Raises the open-file soft limit to the hard limit and returns the soft
/// limit now in force (`None` where it cannot be read).
pub fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => Some(hard),
        Err(err) => {
            warn!(soft, hard, error = %err, "could not raise the open-file limit");
            Some(soft)
        }
    }
}

/// The connection limit the process can honour: the configured one, lowered
/// to what the open-file limit leaves beside [`RESERVED_FDS`].
pub fn effective_max_connections(configured: usize, fd_limit: Option<u64>) -> usize {
    let Some(limit) = fd_limit else {
        return configured;
    };
    let room = usize::try_from(limit.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    configured.min(room.max(1))
}

/// Which service a refusal at the connection limit speaks for, and the
/// setting that raises the limit (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceName {
    /// `runner`: "The runner is serving its limit of …".
    pub name: &'static str,
    /// `RUNNER_MAX_CONNECTIONS`, named in the refusal and the warnings.
    pub limit_setting: Option<&'static str>,
}

impl ServiceName {
    /// The refusal's message at `limit` connections.
    pub fn refusal(&self, limit: usize) -> String {
        match self.limit_setting {
            Some(setting) => format!(
                "The {} is serving its limit of {limit} connections ({setting}); try again shortly.",
                self.name
            ),
            None => format!(
                "The {} is serving its limit of {limit} connections; try again shortly.",
                self.name
            ),
        }
    }
}

/// Serves `router` on `listener` until `stop` fires, then gives open
/// connections [`CLOSE_GRACE`] to finish and drops the rest.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    name: ServiceName,
    stop: CancellationToken,
) -> io::Result<()> {
    let max_connections = effective_max_connections(limits.max_connections, raise_fd_limit());
    if max_connections < limits.max_connections {
        warn!(
            configured = limits.max_connections,
            serving = max_connections,
            setting = name.limit_setting.unwrap_or("the connection limit"),
            "the connection limit is more than the open-file limit allows; serving fewer"
        );
    }
    info!(
        max_connections,
        header_timeout_s = limits.header_timeout.as_secs(),
        "accepting connections"
    );
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes)
        .max_headers(MAX_HEADERS);
    let service = TowerToHyperService::new(router);
    let slots = Arc::new(Semaphore::new(max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let closing = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut last_accept_warning: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        while tasks.try_join_next().is_some() {}
        let tcp = match accepted {
            Ok((tcp, _peer)) => tcp,
            Err(err) if is_peer_error(&err) => continue,
            Err(err) => {
                // Out of descriptors: the connections already open go on;
                // retry shortly instead of spinning on the same error.
                if last_accept_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    warn!(error = %err, "could not accept a connection");
                    last_accept_warning = Some(Instant::now());
                }
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    () = stop.cancelled() => break,
                }
            }
        };
        // Frames are written as they happen (SSE events, terminal output);
        // with Nagle's algorithm on, a small write waits for the previous
        // one's delayed ACK — up to 40 ms on Linux.
        if let Err(err) = tcp.set_nodelay(true) {
            warn!(error = %err, "could not turn off Nagle's algorithm on a connection");
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                let message = name.refusal(max_connections);
                tasks.spawn(async move {
                    refuse(tcp, &message).await;
                    drop(refusal);
                });
            }
            continue;
        };
        let connection = http
            .serve_connection(TokioIo::new(tcp), service.clone())
            .with_upgrades();
        let closing = closing.clone();
        tasks.spawn(async move {
            // A connection error is the peer's business (reset, timed out
            // headers, a malformed request hyper already answered).
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = closing.cancelled() => {
                    // Finish the request in flight, take no other.
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    closing.cancel();
    let finished = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(CLOSE_GRACE, finished).await.is_err() {
        warn!("connections still open after shutdown; closing them");
    }
    tasks.shutdown().await;
    Ok(())
}

/// Errors of one incoming connection, not of the listener.
fn is_peer_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A connection past the limit gets a 503 saying so, then is closed. The
/// request is read and discarded only so that closing does not reset the
/// connection before the client has read the answer.
async fn refuse(mut tcp: TcpStream, message: &str) {
    let body = serde_json::json!({"error": "too_many_connections", "message": message}).to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        tcp.write_all(response.as_bytes()).await?;
        tcp.shutdown().await?;
        let mut discard = [0_u8; 4096];
        while tcp.read(&mut discard).await? > 0 {}
        Ok::<(), io::Error>(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_leaves_room_for_the_runners_own_files() {
        assert_eq!(effective_max_connections(6000, None), 6000);
        assert_eq!(effective_max_connections(6000, Some(1_048_576)), 6000);
        assert_eq!(effective_max_connections(6000, Some(1024)), 512);
        assert_eq!(effective_max_connections(6000, Some(100)), 1);
    }

    #[test]
    fn a_refusal_names_the_service_and_its_setting() {
        let runner = ServiceName {
            name: "runner",
            limit_setting: Some("RUNNER_MAX_CONNECTIONS"),
        };
        assert_eq!(
            runner.refusal(8),
            "The runner is serving its limit of 8 connections (RUNNER_MAX_CONNECTIONS); try again shortly."
        );
        let workspace = ServiceName {
            name: "workspace service",
            limit_setting: None,
        };
        assert_eq!(
            workspace.refusal(64),
            "The workspace service is serving its limit of 64 connections; try again shortly."
        );
    }
}
