//! Fault injection and the request/watch counters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchParams};
use serde_json::json;
use support::*;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test]
async fn the_next_n_requests_of_a_verb_fail_with_the_chosen_code() {
    let sim = sim().await;
    let (code, _) = post(&sim, "/_sim/faults", json!({"action": "failNext", "verb": "create", "resource": "configmaps", "count": 2, "code": 500})).await;
    assert_eq!(code, 200);
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    for _ in 0..2 {
        let kube::Error::Api(status) = api
            .create(&PostParams::default(), &cm("a"))
            .await
            .unwrap_err()
        else {
            panic!()
        };
        assert_eq!(
            (status.code, status.reason.as_str()),
            (500, "InternalError")
        );
    }
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
}

#[tokio::test]
async fn kube_rs_retries_through_injected_503s() {
    let sim = sim().await;
    sim.faults().fail_next("create", "configmaps", 2, 503);
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &cm("retried"))
        .await
        .unwrap();
    assert_eq!(sim.stats().requests["create"]["configmaps"], 3);
}

#[tokio::test]
async fn dropping_watches_ends_every_open_stream() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let waiting = async {
        for _ in 0..200 {
            if sim.stats().watches.get("configmaps") == Some(&1) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("watch never counted");
    };
    waiting.await;
    sim.faults().drop_watches();
    let end = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(end.is_none(), "the stream ended");
}

#[tokio::test]
async fn a_restart_closes_streams_but_keeps_state() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &cm("kept"))
        .await
        .unwrap();
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let (code, _) = post(&sim, "/_sim/faults", json!({"action": "restart"})).await;
    assert_eq!(code, 200);
    assert!(
        tokio::time::timeout(WAIT, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    assert!(api.get("kept").await.is_ok());
}

#[tokio::test]
async fn latency_delays_api_requests() {
    let sim = sim().await;
    sim.faults().set_latency(Duration::from_millis(300));
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let started = std::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn stats_count_requests_by_verb_and_resource() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    api.list(&ListParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("s")).await.unwrap();
    let (code, stats) = get(&sim, "/_sim/stats").await;
    assert_eq!(code, 200);
    assert_eq!(stats["requests"]["list"]["configmaps"], 1);
    assert_eq!(stats["requests"]["create"]["configmaps"], 1);
    assert!(stats["watches"].is_object());
}
