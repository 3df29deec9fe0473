//! Per-port TCP reachability of a workload, as seen from the runner: a startup
//! signal (`checking` → `reachable`, or `unreachable` after a while and maybe
//! `reachable` later), not continuous monitoring.

use std::time::Duration;

use runner_api::types::ReachabilityState;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::reach::Reach;
use crate::session::SessionSink;

pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1_000);
pub const UNREACHABLE_AFTER: Duration = Duration::from_millis(30_000);
/// The first retry comes this soon after a refused connect; each one after
/// waits twice as long, up to [`RETRY_INTERVAL`]. A kernel takes one to three
/// seconds to listen; it is seen at most a quarter of a second after it
/// does, not up to a second later (a refused loopback or pod-network connect
/// costs next to nothing).
pub const FIRST_RETRY: Duration = Duration::from_millis(25);
pub const RETRY_INTERVAL: Duration = Duration::from_millis(250);
pub const RETRY_INTERVAL_AFTER_UNREACHABLE: Duration = Duration::from_millis(5_000);

/// Watch every port concurrently until each is reachable or `stop` fires.
pub async fn probe_reachability(
    reach: Reach,
    ports: Vec<u16>,
    sink: SessionSink,
    stop: CancellationToken,
) {
    probe_app_reachability(
        reach,
        runner_api::watch::DEFAULT_APP_NAME.to_owned(),
        ports,
        sink,
        stop,
    )
    .await;
}

/// [`probe_reachability`] for one app of a multi-app session.
pub async fn probe_app_reachability(
    reach: Reach,
    app: String,
    ports: Vec<u16>,
    sink: SessionSink,
    stop: CancellationToken,
) {
    let probes = ports.into_iter().map(|port| {
        let sink = sink.clone();
        let stop = stop.clone();
        let app = app.clone();
        let reach = reach.clone();
        async move {
            tokio::select! {
                () = probe_port(&reach, port, |state| sink.app_reachability(&app, port, state)) => {}
                () = stop.cancelled() => {}
            }
        }
    });
    futures_util::future::join_all(probes).await;
}

/// One port's sequence of states, reported through `report`; returns once the
/// port answered.
pub async fn probe_port(reach: &Reach, port: u16, mut report: impl FnMut(ReachabilityState)) {
    report(ReachabilityState::Checking);
    let started = Instant::now();
    let mut reported_unreachable = false;
    let mut backoff = FIRST_RETRY;
    loop {
        if let Ok(Ok(_)) = timeout(CONNECT_TIMEOUT, reach.connect(port)).await {
            report(ReachabilityState::Reachable);
            return;
        }
        if !reported_unreachable && started.elapsed() >= UNREACHABLE_AFTER {
            reported_unreachable = true;
            report(ReachabilityState::Unreachable);
        }
        sleep(if reported_unreachable {
            RETRY_INTERVAL_AFTER_UNREACHABLE
        } else {
            backoff
        })
        .await;
        backoff = (backoff * 2).min(RETRY_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn a_listening_port_is_reachable_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let states = Arc::new(Mutex::new(Vec::new()));
        let seen = states.clone();
        probe_port(&Reach::LOOPBACK, addr.port(), move |s| {
            seen.lock().unwrap().push(s)
        })
        .await;
        assert_eq!(
            *states.lock().unwrap(),
            vec![ReachabilityState::Checking, ReachabilityState::Reachable]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_port_turns_unreachable_after_thirty_seconds_then_recovers() {
        // Reserve a port, then free it so connects are refused.
        let addr = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let probe = tokio::spawn(async move {
            probe_port(&Reach::LOOPBACK, addr.port(), move |s| {
                let _ = tx.send(s);
            })
            .await
        });
        assert_eq!(rx.recv().await, Some(ReachabilityState::Checking));
        assert_eq!(rx.recv().await, Some(ReachabilityState::Unreachable));
        let _listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        assert_eq!(rx.recv().await, Some(ReachabilityState::Reachable));
        probe.await.unwrap();
    }
}
