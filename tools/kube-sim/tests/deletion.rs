//! A pod deleted at any moment of its start — while its image is pulled,
//! while its init container runs, while its container is being launched —
//! leaves no process of it running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube_sim::{ImageBehaviour, KubeSim};
use serde_json::json;
use support::*;

/// How many pods each case starts and deletes: the moments of a start are
/// short, so many pods deleted at once land in each of them.
const PODS: usize = 24;

/// How long the leftover processes get to go after every pod is gone.
const REAP: Duration = Duration::from_secs(10);

/// A shell that runs until killed, named `marker` (its `$0`, so in its
/// command line) so the test finds it in the process table.
fn forever(marker: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        "while :; do sleep 5; done".into(),
        marker.into(),
    ]
}

fn pod(name: &str, marker: &str, with_init: bool) -> Pod {
    let mut value = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "acme/host:1",
                "command": forever(&format!("{marker}-main"))}]}});
    if with_init {
        value["spec"]["initContainers"] = json!([{"name": "init", "image": "acme/host:1",
            "command": forever(&format!("{marker}-init"))}]);
    }
    serde_json::from_value(value).unwrap()
}

/// The pids of live processes whose command line holds `marker`.
fn processes_marked(marker: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // A zombie is dead, only not yet reaped.
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            !zombie && String::from_utf8_lossy(&cmdline).contains(marker)
        })
        .collect()
}

/// Waits until no process holds `marker` and the kubelet tracks none, or
/// `REAP` passed: the marked processes left, and how many it tracks.
async fn left_after_reap(sim: &KubeSim, marker: &str) -> (Vec<i32>, usize) {
    let deadline = tokio::time::Instant::now() + REAP;
    loop {
        let left = (processes_marked(marker), sim.stats().processes);
        if (left.0.is_empty() && left.1 == 0) || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn sim_with_pull_delay(delay: Duration) -> KubeSim {
    builder()
        .image("acme/host:*", ImageBehaviour::Host)
        .pull_delay(delay)
        .start()
        .await
        .unwrap()
}

fn unique_marker(case: &str) -> String {
    format!(
        "kube-sim-deletion-{case}-{}-{:x}",
        std::process::id(),
        rand_suffix()
    )
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

async fn delete_all(pods: &Api<Pod>, names: &[String], params: &DeleteParams) {
    join_all(names.iter().map(|n| pods.delete(n, params)))
        .await
        .into_iter()
        .for_each(|r| {
            r.unwrap();
        });
}

async fn wait_all_gone(sim: &KubeSim, names: &[String]) {
    for n in names {
        sim.wait_for_deletion("pods", "default", n, WAIT)
            .await
            .unwrap_or_else(|e| panic!("pod {n}: {e}"));
    }
}

#[rstest::rstest]
#[case::gracefully(DeleteParams::default())]
#[case::at_once(DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })]
#[tokio::test]
async fn a_pod_deleted_right_after_its_creation_leaves_no_process(
    #[case] params: DeleteParams,
    #[values(Duration::ZERO, Duration::from_millis(1), Duration::from_millis(20))]
    pull_delay: Duration,
) {
    let sim = sim_with_pull_delay(pull_delay).await;
    let marker = unique_marker("created");
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let names: Vec<String> = (0..PODS).map(|i| format!("p{i}")).collect();
    // Each pod is deleted as soon as its create is answered, so the
    // deletions land at every step of the starts under way.
    join_all(names.iter().map(|n| {
        let pods = pods.clone();
        let pod = pod(n, &marker, false);
        let params = params.clone();
        async move {
            pods.create(&PostParams::default(), &pod).await.unwrap();
            pods.delete(n, &params).await.unwrap();
        }
    }))
    .await;
    wait_all_gone(&sim, &names).await;
    let (left, tracked) = left_after_reap(&sim, &marker).await;
    assert!(left.is_empty(), "processes of deleted pods left: {left:?}");
    assert_eq!(tracked, 0, "container processes the kubelet still tracks");
}

#[rstest::rstest]
#[tokio::test]
async fn a_pod_deleted_while_its_init_container_runs_leaves_no_process(
    #[values(DeleteParams::default(), DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })]
    params: DeleteParams,
) {
    let sim = sim_with_pull_delay(Duration::ZERO).await;
    let marker = unique_marker("init");
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let names: Vec<String> = (0..PODS / 4).map(|i| format!("i{i}")).collect();
    for n in &names {
        pods.create(&PostParams::default(), &pod(n, &marker, true))
            .await
            .unwrap();
    }
    for n in &names {
        sim.wait_for::<Pod>(
            "default",
            n,
            |p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.init_container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.state.as_ref())
                    .is_some_and(|s| s.running.is_some())
            },
            WAIT,
        )
        .await
        .unwrap();
    }
    assert!(!processes_marked(&format!("{marker}-init")).is_empty());
    delete_all(&pods, &names, &params).await;
    wait_all_gone(&sim, &names).await;
    let (left, tracked) = left_after_reap(&sim, &marker).await;
    assert!(left.is_empty(), "processes of deleted pods left: {left:?}");
    assert_eq!(tracked, 0, "container processes the kubelet still tracks");
}
