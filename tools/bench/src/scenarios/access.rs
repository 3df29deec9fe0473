//! What authentication, ownership, quotas and rate limits cost a request,
//! and what a large principal table costs in memory.
//!
//! Two runners side by side in one run: one open (no identity), one with a
//! token file, a tiers file (quotas and rate limits on, set high enough that
//! nothing is refused) and the audit log. Each holds one session; the same
//! `GET /v1/sessions/{id}` is sent to each in turn on keep-alive
//! connections, so both see the same machine at the same moment, and the
//! difference of their latencies is what the checks add.
//!
//! Then a runner in anonymous mode behind a trusted proxy (this client,
//! sending `X-Forwarded-For`) gets one request from each of 10,000
//! principals, twice over with different addresses and a tiers-file poll in
//! between: its RSS growth shows what a rate-limit table of 10,000
//! principals holds; the second batch, after the first's buckets refilled
//! and were dropped, shows that the table does not keep growing with every
//! principal ever seen.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use crate::clients;
use crate::procs::Stack;
use crate::report::{Report, Samples, mib};
use crate::scenarios::Ctx;

const TOKENS: usize = 100;
const PRINCIPALS: u32 = 10_000;
const WARM_UP: usize = 500;

async fn timed_get(
    stack: &Stack,
    path: &str,
    token: Option<&str>,
    forwarded: Option<&str>,
) -> anyhow::Result<u64> {
    let mut request = stack.http.get(stack.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(forwarded) = forwarded {
        request = request.header("x-forwarded-for", forwarded);
    }
    let started = Instant::now();
    let response = request.send().await?;
    let status = response.status();
    response.bytes().await?;
    let elapsed = started.elapsed().as_micros() as u64;
    if !status.is_success() {
        bail!("GET {path} answered {status}");
    }
    Ok(elapsed)
}

fn principal_address(i: u32) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let n = ctx.sessions.unwrap_or(5_000);
    // A smoke run with a few requests keeps the principal table small too.
    let principals = PRINCIPALS.min(u32::try_from(n * 2).unwrap_or(PRINCIPALS));
    let mut report = ctx.report(
        "access",
        json!({"requests": n, "tokens": TOKENS, "principals": principals, "backend": ctx.backend}),
    );
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens");
    let lines: Vec<String> = (0..TOKENS)
        .map(|i| format!("bench-token-{i} name=p{i} tenant=t{}", i % 10))
        .collect();
    std::fs::write(&tokens, lines.join("\n"))?;
    let tiers = dir.path().join("tiers.yaml");
    std::fs::write(
        &tiers,
        "tiers:\n  default: { sessions: 1000, cpu: \"1000\", memory: 1Ti, requestsPerMinute: 100000000, startsPerMinute: 100000 }\n  anonymous: { requestsPerMinute: 100000000 }\n",
    )?;
    let audit = dir.path().join("audit.log");

    let open = Stack::start(&ctx.bins, ctx.backend, &[]).await?;
    let gated = Stack::start(
        &ctx.bins,
        ctx.backend,
        &[
            ("RUNNER_AUTH_TOKENS_FILE", tokens.display().to_string()),
            ("RUNNER_TIERS_FILE", tiers.display().to_string()),
            ("RUNNER_AUDIT_LOG", audit.display().to_string()),
        ],
    )
    .await?;
    let token = "bench-token-42";
    let open_id = clients::create(&open, &json!({"echo": true})).await?.id;
    let created: serde_json::Value = gated
        .http
        .post(gated.url("/v1/sessions"))
        .bearer_auth(token)
        .json(&test_support::bundle::start_body(json!({"echo": true})))
        .send()
        .await?
        .json()
        .await?;
    let Some(gated_id) = created["sessionId"].as_str().map(str::to_owned) else {
        bail!("the gated runner refused the session: {created}");
    };
    let open_path = format!("/v1/sessions/{open_id}");
    let gated_path = format!("/v1/sessions/{gated_id}");
    for _ in 0..WARM_UP {
        timed_get(&open, &open_path, None, None).await?;
        timed_get(&gated, &gated_path, Some(token), None).await?;
    }
    let mut without = Samples::default();
    let mut with = Samples::default();
    for _ in 0..n {
        without.push(timed_get(&open, &open_path, None, None).await?);
        with.push(timed_get(&gated, &gated_path, Some(token), None).await?);
    }
    let (p50_without, p99_without) = (without.percentile(50.0), without.percentile(99.0));
    let (p50_with, p99_with) = (with.percentile(50.0), with.percentile(99.0));
    report.row(
        "GET /v1/sessions/{id}, no identity (p50 / p99)",
        format!("{p50_without} / {p99_without} µs"),
    );
    report.row(
        format!(
            "the same with a token of {TOKENS}, ownership, tiers and the audit log (p50 / p99)"
        ),
        format!("{p50_with} / {p99_with} µs"),
    );
    let added_p50 = p50_with as i64 - p50_without as i64;
    let added_p99 = p99_with as i64 - p99_without as i64;
    report.row(
        "added by the checks (p50 / p99)",
        format!("{added_p50} / {added_p99} µs"),
    );
    report.result("without", without.json());
    report.result("with", with.json());
    report.result("added_p50_us", json!(added_p50));
    report.result("added_p99_us", json!(added_p99));
    report.target(
        "p99 added by authentication, ownership, quota and rate checks",
        "< 50 µs",
        format!("{added_p99} µs"),
        added_p99 < 50,
    );
    open.stop().await?;
    gated.stop().await?;

    // The rate-limit table of many principals.
    let anonymous = Stack::start(
        &ctx.bins,
        ctx.backend,
        &[
            ("RUNNER_ANONYMOUS", "1".to_owned()),
            ("RUNNER_TRUSTED_PROXIES", "127.0.0.1".to_owned()),
            ("RUNNER_TIERS_FILE", tiers.display().to_string()),
        ],
    )
    .await?;
    timed_get(&anonymous, "/v1/sessions", None, Some("10.255.255.255")).await?;
    let before = anonymous.runner.rss_bytes()?;
    for i in 0..principals {
        timed_get(
            &anonymous,
            "/v1/sessions",
            None,
            Some(&principal_address(i)),
        )
        .await?;
    }
    let after_first = anonymous.runner.rss_bytes()?;
    // One poll of the tiers file forgets the buckets that refilled.
    tokio::time::sleep(Duration::from_secs(12)).await;
    for i in principals..2 * principals {
        timed_get(
            &anonymous,
            "/v1/sessions",
            None,
            Some(&principal_address(i)),
        )
        .await?;
    }
    let after_second = anonymous.runner.rss_bytes()?;
    let per_principal = after_first.saturating_sub(before) / u64::from(principals);
    report.row(
        format!("runner RSS before / after {principals} principals / after {principals} more"),
        format!(
            "{:.1} / {:.1} / {:.1} MiB ({per_principal} bytes per principal)",
            mib(before),
            mib(after_first),
            mib(after_second)
        ),
    );
    report.result("rss_before_bytes", json!(before));
    report.result("rss_after_first_bytes", json!(after_first));
    report.result("rss_after_second_bytes", json!(after_second));
    report.target(
        "runner memory per rate-limited principal",
        "< 1 KiB",
        format!("{per_principal} bytes"),
        per_principal < 1024,
    );
    anonymous.stop().await?;
    Ok(report)
}
