//! Connection pressure: N idle connections (TCP connect, send nothing;
//! default 1,100) against a runner whose open-file limit is 1024 (so it
//! serves 512 connections at once), first all from one address, then
//! spread over 64. `/livez`, `/v1/health` and an authorised
//! `POST /v1/sessions` are timed before, while the connections are held
//! and after they closed, each request on a new connection from another
//! address (127.0.0.2), as an editor arriving during the attack would.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio::net::{TcpSocket, TcpStream};

use crate::clients;
use crate::procs::Stack;
use crate::report::{Report, Samples};
use crate::scenarios::Ctx;

/// The open-file limit of a shell's default.
const OPEN_FILES: u64 = 1024;
/// Requests of each kind per phase.
const ROUNDS: usize = 10;
/// The longest a request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Source addresses of the spread attack.
const SPREAD: u8 = 64;
const TOKEN: &str = "bench-connection-pressure-token";

/// What the measuring client saw of one kind of request in one phase.
#[derive(Default)]
struct Seen {
    latency: Samples,
    failures: Vec<String>,
}

impl Seen {
    fn summary(&self) -> String {
        if self.failures.is_empty() {
            return format!("{} (min / median / max)", self.latency.spread());
        }
        let mut failures = self.failures.clone();
        failures.sort();
        failures.dedup();
        format!(
            "{}; {} of {ROUNDS} failed ({})",
            self.latency.spread(),
            ROUNDS - self.latency.len(),
            failures.join(", ")
        )
    }

    fn json(&self) -> Value {
        json!({
            "latency": self.latency.spread_json(),
            "failed": ROUNDS - self.latency.len(),
            "failures": self.failures,
        })
    }
}

/// Times `ROUNDS` of each request, one after the other.
async fn measure(stack: &Stack, client: &reqwest::Client) -> [Seen; 3] {
    let mut seen: [Seen; 3] = Default::default();
    let body = clients::start_body(&json!({"exitCode": 0}));
    for _ in 0..ROUNDS {
        let requests = [
            client.get(stack.url("/livez")),
            client.get(stack.url("/v1/health")),
            client
                .post(stack.url("/v1/sessions"))
                .bearer_auth(TOKEN)
                .json(&body),
        ];
        for (request, seen) in requests.into_iter().zip(seen.iter_mut()) {
            let began = Instant::now();
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    seen.latency.push(began.elapsed().as_micros() as u64);
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    seen.failures
                        .push(format!("{status} {}", body["error"].as_str().unwrap_or("")));
                }
                Err(err) if err.is_timeout() => seen.failures.push("timed out".into()),
                Err(_) => seen.failures.push("closed without an answer".into()),
            }
        }
    }
    seen
}

/// Opens `n` connections that send nothing, from `sources` in turn.
async fn open_idle(addr: SocketAddr, n: usize, sources: &[IpAddr]) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let source = sources[i % sources.len()];
        let Ok(socket) = TcpSocket::new_v4() else {
            continue;
        };
        if socket.bind(SocketAddr::new(source, 0)).is_err() {
            continue;
        }
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_secs(5), socket.connect(addr)).await
        {
            held.push(stream);
        }
    }
    held
}

/// How many of `held` the runner has not closed.
fn still_open(held: &[TcpStream]) -> usize {
    let mut buf = [0_u8; 1];
    held.iter()
        .filter(|stream| {
            matches!(stream.try_read(&mut buf), Err(err) if err.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count()
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let idle = ctx.sessions.unwrap_or(1_100);
    // This process holds every idle socket.
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    let mut report = ctx.report(
        "connection-pressure",
        json!({"idle_connections": idle, "open_file_limit": OPEN_FILES, "rounds": ROUNDS, "spread_addresses": SPREAD, "backend": ctx.backend}),
    );
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n"))?;
    let stack = Stack::start_with_open_file_limit(
        &ctx.bins,
        ctx.backend,
        &[
            ("RUNNER_AUTH_TOKENS_FILE", tokens.display().to_string()),
            // The runner's own default, not the bench's.
            ("RUNNER_MAX_CONNECTIONS_PER_CLIENT", String::new()),
        ],
        OPEN_FILES,
    )
    .await?;
    let addr: SocketAddr = stack
        .base
        .trim_start_matches("http://")
        .parse()
        .context("the runner's address")?;
    let client = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        .pool_max_idle_per_host(0)
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let kinds = ["/livez", "/v1/health", "POST /v1/sessions"];
    let mut results = serde_json::Map::new();
    let mut record = |report: &mut Report, phase: &str, seen: [Seen; 3]| {
        let mut phase_json = serde_json::Map::new();
        for (kind, seen) in kinds.iter().zip(seen) {
            report.row(format!("{phase}: {kind}"), seen.summary());
            phase_json.insert((*kind).to_owned(), seen.json());
        }
        results.insert(phase.to_owned(), Value::Object(phase_json));
    };
    record(&mut report, "before", measure(&stack, &client).await);

    let one = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let spread: Vec<IpAddr> = (1..=SPREAD)
        .map(|n| IpAddr::V4(Ipv4Addr::new(127, 0, 1, n)))
        .collect();
    for (shape, sources) in [("one address", &one[..]), ("64 addresses", &spread[..])] {
        let began = Instant::now();
        let held = open_idle(addr, idle, sources).await;
        let opened_s = began.elapsed().as_secs_f64();
        let seen = measure(&stack, &client).await;
        report.row(
            format!("{shape}: idle connections opened"),
            format!(
                "{} of {idle} in {opened_s:.1} s; {} still open after the requests",
                held.len(),
                still_open(&held)
            ),
        );
        record(&mut report, &format!("{shape}, during"), seen);
        drop(held);
        record(
            &mut report,
            &format!("{shape}, after"),
            measure(&stack, &client).await,
        );
    }
    report.result("phases", Value::Object(results));
    Ok(report)
}
