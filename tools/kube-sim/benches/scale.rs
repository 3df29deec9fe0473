//! Scale: 2,000 pods with one watcher per kind (pods, services, events,
//! ingresses), measuring create throughput, create→Running latency as a
//! watcher sees it, list latency and the simulator's memory.
//!
//! `cargo bench -p kube-sim --bench scale` (env: `PODS`, default 2000;
//! `PROCESSES=1` runs each pod as a real fake-telo process instead of a
//! virtual container; `POD_NETWORK=isolated|host|auto`, default auto).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use kube_sim::{ImageBehaviour, KubeSim};
use serde_json::json;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods_n: usize = std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let processes = std::env::var("PROCESSES").is_ok_and(|v| v == "1");
    let network: kube_sim::PodNetwork = std::env::var("POD_NETWORK")
        .map_or(Ok(kube_sim::PodNetwork::Auto), |v| v.parse())
        .expect("POD_NETWORK is isolated, host or auto");
    // A fresh simulator has a new cluster's namespaces only.
    let mut builder = KubeSim::builder()
        .pull_delay(Duration::ZERO)
        .pod_network(network)
        .namespace("telo-sessions");
    if !processes {
        builder = builder.image("bench/idle:*", ImageBehaviour::Virtual);
    } else if let Some(ft) = kube_sim::find_fake_telo() {
        builder = builder
            .fake_telo(ft)
            .image("bench/idle:*", ImageBehaviour::FakeTelo);
    }
    let sim = builder.start().await.expect("kube-sim starts");
    let client = sim.client();
    let ns = "telo-sessions";
    let rss_start = rss_kib();

    if processes {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "app"},
            "data": {"telo.yaml": "kind: Telo.Application\nmetadata: {name: idle}\nfakeTelo:\n  listen: [8080]\n"}})).unwrap();
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    }

    // One watcher per kind, as the runner runs them.
    let created_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let running_after: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    {
        let created_at = created_at.clone();
        let running_after = running_after.clone();
        let pods_api = pods_api.clone();
        tokio::spawn(async move {
            let cfg = watcher::Config::default().labels("app.kubernetes.io/managed-by=bench");
            let mut seen = std::collections::HashSet::new();
            let mut stream = watcher(pods_api, cfg).boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                if let watcher::Event::Apply(p) = ev
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    if seen.insert(name.clone())
                        && let Some(t) = created_at.lock().unwrap().get(&name)
                    {
                        running_after.lock().unwrap().push(t.elapsed());
                    }
                }
            }
        });
    }
    macro_rules! idle_watch {
        ($k:ty) => {{
            let api: Api<$k> = Api::namespaced(client.clone(), ns);
            tokio::spawn(async move {
                let mut s = watcher(api, watcher::Config::default()).boxed();
                while let Ok(Some(_)) = s.try_next().await {}
            });
        }};
    }
    idle_watch!(Service);
    idle_watch!(Event);
    idle_watch!(Ingress);

    let started = Instant::now();
    let concurrency = 16;
    let names: Vec<String> = (0..pods_n).map(|i| format!("telo-run-{i:05}")).collect();
    futures_util::stream::iter(names.clone())
        .for_each_concurrent(concurrency, |name| {
            let api = pods_api.clone();
            let created_at = created_at.clone();
            async move {
                let mut spec = json!({"restartPolicy": "Never", "containers": [{"name": "session", "image": "bench/idle:1"}]});
                if processes {
                    spec["containers"][0]["command"] = json!(["telo", "run", "/app/telo.yaml"]);
                    spec["containers"][0]["volumeMounts"] = json!([{"name": "app", "mountPath": "/app"}]);
                    spec["volumes"] = json!([{"name": "app", "configMap": {"name": "app"}}]);
                }
                let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name,
                    "labels": {"app.kubernetes.io/managed-by": "bench", "telo.run/session-id": name}}, "spec": spec})).unwrap();
                created_at.lock().unwrap().insert(name.clone(), Instant::now());
                api.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
    let create_time = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    while running_after.lock().unwrap().len() < pods_n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_running = started.elapsed();
    let mut lat = running_after.lock().unwrap().clone();
    lat.sort();
    let list_start = Instant::now();
    let list = pods_api.list(&ListParams::default()).await.unwrap();
    let list_time = list_start.elapsed();
    let stats = sim.stats();
    println!(
        "kube-sim scale: {pods_n} pods ({}), watchers: {:?}",
        if processes {
            "fake-telo processes"
        } else {
            "virtual containers"
        },
        stats.watches
    );
    println!(
        "  create: {:.1}s ({:.0} pods/s, {concurrency} concurrent clients)",
        create_time.as_secs_f64(),
        pods_n as f64 / create_time.as_secs_f64()
    );
    println!(
        "  all Running seen by the watcher after {:.1}s ({} of {pods_n})",
        all_running.as_secs_f64(),
        lat.len()
    );
    println!(
        "  create→Running as watched: p50 {:?}, p99 {:?}, max {:?}",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or_default()
    );
    println!("  list of {} pods: {:?}", list.items.len(), list_time);
    println!(
        "  RSS: {} MiB at start, {} MiB with {pods_n} pods; processes: {}",
        rss_start / 1024,
        rss_kib() / 1024,
        stats.processes
    );
    sim.shutdown().await;
}
