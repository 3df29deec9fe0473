//! Several runner replicas on one kube-sim behind a round-robin relay (the
//! Service): session starts per second and POST → `running` at C = 50 with
//! one and with three replicas; the time from a replica's SIGTERM (a
//! rolling update's step: its sessions handed over) and from another's
//! SIGKILL until each of its sessions is served again through the relay;
//! and the apiserver requests an idle replica makes per minute.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::future::try_join_all;
use serde_json::{Value, json};
use test_support::relay::Relay;
use tokio::sync::Semaphore;

use crate::clients::{self, Sse};
use crate::procs::{BackendKind, Proc, Stack, Workloads};
use crate::report::{Report, Samples, ms};
use crate::scenarios::Ctx;
use crate::scenarios::apiserver_load::{delta, describe, requests};

/// The Lease duration the replicas run with (the chart's default).
const LEASE_SECONDS: u64 = 15;
/// How long the idle replicas are watched.
const IDLE_WINDOW: Duration = Duration::from_secs(60);
/// Sessions held while a replica is killed.
const FAILOVER_SESSIONS: usize = 30;

struct Installation {
    stack: Stack,
    /// Replicas beyond the stack's own (`replica-0`), by id.
    more: Vec<(String, Proc, String)>,
    relay: Relay,
    _token: tempfile::TempDir,
}

impl Installation {
    async fn start(ctx: &Ctx, count: usize) -> anyhow::Result<Installation> {
        let token = tempfile::tempdir()?;
        let token_file = token.path().join("peer-token");
        std::fs::write(&token_file, "b".repeat(48))?;
        let env = [
            ("RUNNER_PEER_TOKEN_FILE", token_file.display().to_string()),
            ("RUNNER_REPLICA_ID", "replica-0".to_owned()),
            ("RUNNER_LEASE_DURATION_SECONDS", LEASE_SECONDS.to_string()),
        ];
        let mut stack = Stack::start_with(
            &ctx.bins,
            BackendKind::Kubernetes,
            &env,
            ctx.workloads.unwrap_or(Workloads::Virtual),
        )
        .await?;
        let mut more = Vec::new();
        for index in 1..count {
            let id = format!("replica-{index}");
            let (proc, base) = stack.spawn_replica(&ctx.bins, &id).await?;
            more.push((id, proc, base));
        }
        let mut targets = vec![address(&stack.base)?];
        for (_, _, base) in &more {
            targets.push(address(base)?);
        }
        let relay = Relay::start(targets[0].ip(), targets).await;
        // Every client request from here on goes through the relay.
        stack.base = relay.base();
        Ok(Installation {
            stack,
            more,
            relay,
            _token: token,
        })
    }

    async fn stop(self) -> anyhow::Result<()> {
        drop(self.relay);
        for (_, proc, _) in self.more {
            proc.stop().await?;
        }
        self.stack.stop().await
    }
}

fn address(base: &str) -> anyhow::Result<std::net::SocketAddr> {
    base.trim_start_matches("http://")
        .parse()
        .context("a runner address")
}

/// `n` sessions started `c` at a time through the relay: POST → `running`
/// per session, and the whole run's wall time.
async fn starts(stack: &Arc<Stack>, n: usize, c: usize) -> anyhow::Result<(Samples, Duration)> {
    let gate = Arc::new(Semaphore::new(c));
    let began = Instant::now();
    let runs = (0..n).map(|_| {
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            let created =
                clients::create(&stack, &json!({"stdout": ["ready"], "echo": true})).await?;
            let mut sse = Sse::connect(&stack, &created.id).await?;
            let running_us = sse.wait_status("running").await?;
            anyhow::Ok((created.id, running_us.saturating_sub(created.sent_us)))
        }
    });
    let done = try_join_all(runs).await?;
    let wall = began.elapsed();
    let mut samples = Samples::default();
    let stops = done.into_iter().map(|(id, took)| {
        samples.push(took);
        let stack = stack.clone();
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await?;
            clients::delete(&stack, &id).await
        }
    });
    try_join_all(stops).await?;
    Ok((samples, wall))
}

/// Waits until the session namespace holds no pod.
async fn wait_for_no_session_pods(stack: &Stack) -> anyhow::Result<()> {
    let sim = stack
        .sim_api
        .as_ref()
        .context("no kube-sim in this stack")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pods: Value = sim
            .http
            .get(format!("{}/api/v1/namespaces/telo-sessions/pods", sim.url))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        if pods["items"].as_array().is_none_or(Vec::is_empty) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("session pods were still there 2 minutes after their sessions were stopped");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A session's owner as the installation reports it.
async fn replica_of(stack: &Stack, id: &str) -> anyhow::Result<Option<(String, String)>> {
    let resp = stack
        .http
        .get(stack.url(&format!("/v1/sessions/{id}")))
        .send()
        .await?;
    if !resp.status().is_success() {
        return Ok(None);
    }
    let body: Value = resp.json().await?;
    Ok(Some((
        body["replica"].as_str().unwrap_or_default().to_owned(),
        body["status"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )))
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    if ctx.backend != BackendKind::Kubernetes {
        bail!("replicas needs the kubernetes backend");
    }
    let n = ctx.sessions.unwrap_or(200);
    let c = ctx.concurrency.unwrap_or(50).max(1);
    let mut report = ctx.report(
        "replicas",
        json!({"sessions": n, "concurrency": c, "lease_seconds": LEASE_SECONDS,
               "workloads": ctx.workloads.unwrap_or(Workloads::Virtual)}),
    );
    let mut results = json!({});
    for count in [1, 3] {
        let install = Installation::start(ctx, count).await?;
        let Installation {
            stack,
            more,
            relay,
            _token,
        } = install;
        let stack = Arc::new(stack);
        let (samples, wall) = starts(&stack, n, c).await?;
        let rate = n as f64 / wall.as_secs_f64();
        report.row(
            format!("{count} replica(s): starts per second at C = {c}"),
            format!("{rate:.1}"),
        );
        report.row(
            format!("{count} replica(s): POST → running p50 / p90 / p99 / max"),
            samples.summary(),
        );
        results[format!("replicas_{count}")] = json!({
            "starts_per_second": rate,
            "post_to_running": samples.json(),
        });
        let stack = Arc::into_inner(stack).context("the stack is still shared")?;
        let install = Installation {
            stack,
            more,
            relay,
            _token,
        };
        if count == 3 {
            let (idle, failover) = idle_and_failover(install, &mut report).await?;
            results["idle_requests_per_minute_per_replica"] = json!(idle);
            results["failover"] = failover["failover"].clone();
            results["hand_over"] = failover["hand_over"].clone();
        } else {
            install.stop().await?;
        }
    }
    report.results = results;
    Ok(report)
}

/// The idle replicas' apiserver requests, then a SIGTERM (a hand-over)
/// and a SIGKILL.
async fn idle_and_failover(
    install: Installation,
    report: &mut Report,
) -> anyhow::Result<(f64, Value)> {
    let Installation {
        stack,
        mut more,
        relay,
        _token,
    } = install;
    // Idle means idle: the stopped sessions' pods gone and their last
    // reads done before the window opens.
    wait_for_no_session_pods(&stack).await?;
    let before = requests(&stack.sim_stats().await?);
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = requests(&stack.sim_stats().await?);
    let idle = delta(&after, &before);
    let per_minute = idle.values().sum::<u64>() as f64 / 3.0 / (IDLE_WINDOW.as_secs_f64() / 60.0);
    report.row(
        "apiserver requests per idle replica per minute",
        format!("{per_minute:.1} ({})", describe(&idle, 3)),
    );

    // Sessions spread over the replicas, then one replica killed.
    let stack = Arc::new(stack);
    let mut ids = Vec::new();
    for _ in 0..FAILOVER_SESSIONS {
        let created = clients::create(&stack, &json!({"stdout": ["ready"], "echo": true})).await?;
        let mut sse = Sse::connect(&stack, &created.id).await?;
        sse.wait_status("running").await?;
        ids.push(created.id);
    }
    // A rolling update's step first: one replica stopped (SIGTERM), its
    // sessions handed over; then another killed (SIGKILL).
    let (leaving, leaving_proc, _) = more.remove(1);
    let owned = owned_by(&stack, &ids, &leaving).await?;
    let stopped_at = Instant::now();
    let (stopped, handed) = tokio::join!(
        leaving_proc.stop(),
        served_again(&stack, &owned, &leaving, stopped_at)
    );
    stopped?;
    let handed = handed?;
    report.row(
        format!(
            "hand-over: SIGTERM → each of its {} sessions served again, p50 / p99",
            owned.len()
        ),
        p50_p99(&handed),
    );

    let (victim, victim_proc, _) = more.remove(0);
    let owned = owned_by(&stack, &ids, &victim).await?;
    let killed_at = Instant::now();
    victim_proc.kill()?;
    let samples = served_again(&stack, &owned, &victim, killed_at).await?;
    report.row(
        format!(
            "failover: SIGKILL → each of its {} sessions served again, p50 / p99 (Lease {LEASE_SECONDS} s)",
            owned.len()
        ),
        p50_p99(&samples),
    );
    report.target(
        "failover p99",
        &format!("< Lease + 2 s = {} ms", (LEASE_SECONDS + 2) * 1000),
        format!("{:.0} ms", ms(samples.percentile(99.0))),
        samples.percentile(99.0) < (LEASE_SECONDS + 2) * 1_000_000,
    );
    let stack = Arc::into_inner(stack).context("the stack is still shared")?;
    Installation {
        stack,
        more,
        relay,
        _token,
    }
    .stop()
    .await?;
    Ok((
        per_minute,
        json!({"failover": samples.json(), "hand_over": handed.json()}),
    ))
}

/// `samples`' p50 and p99 in whole milliseconds.
fn p50_p99(samples: &Samples) -> String {
    format!(
        "{:.0} / {:.0} ms",
        ms(samples.percentile(50.0)),
        ms(samples.percentile(99.0))
    )
}

/// The sessions of `ids` that `replica` owns now.
async fn owned_by(stack: &Stack, ids: &[String], replica: &str) -> anyhow::Result<Vec<String>> {
    let mut owned = Vec::new();
    for id in ids {
        if let Some((owner, _)) = replica_of(stack, id).await?
            && owner == replica
        {
            owned.push(id.clone());
        }
    }
    Ok(owned)
}

/// For each of `owned`, the time from `since` until another replica than
/// `gone` serves it `running`.
async fn served_again(
    stack: &Arc<Stack>,
    owned: &[String],
    gone: &str,
    since: Instant,
) -> anyhow::Result<Samples> {
    let waits = owned.iter().map(|id| async move {
        loop {
            // A request that meets the leaving replica's connection as it
            // closes is asked again, as a client would.
            if let Ok(Some((owner, status))) = replica_of(stack, id).await
                && owner != gone
                && !owner.is_empty()
                && status == "running"
            {
                return anyhow::Ok(since.elapsed());
            }
            if since.elapsed() > Duration::from_secs(LEASE_SECONDS * 4) {
                bail!(
                    "session {id} was not served again within {}s",
                    LEASE_SECONDS * 4
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut samples = Samples::default();
    for took in try_join_all(waits).await? {
        samples.push(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    }
    Ok(samples)
}
