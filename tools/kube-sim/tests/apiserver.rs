//! The apiserver surface over real HTTP: discovery, CRUD, error bodies,
//! selectors, optimistic concurrency, patches, watches, admission.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ResourceQuota, Service};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_sim::Denial;
use serde_json::json;
use support::*;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"tier": "web"}}, "data": {"a": "1"}}),
    )
    .unwrap()
}

#[tokio::test]
async fn discovery_reports_core_networking_and_gateway_only_when_enabled() {
    let sim = sim().await;
    let (code, apis) = get(&sim, "/apis").await;
    assert_eq!(code, 200);
    let names: Vec<&str> = apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"networking.k8s.io"));
    assert!(!names.contains(&"gateway.networking.k8s.io"));
    let (code, _) = get(&sim, "/apis/gateway.networking.k8s.io/v1").await;
    assert_eq!(code, 404);
    let (_, version) = get(&sim, "/version").await;
    assert_eq!(version["gitVersion"], "v1.33.0");

    let gw = builder().gateway_api(true).start().await.unwrap();
    let discovery = kube::Discovery::new(gw.client()).run().await.unwrap();
    let group = discovery
        .groups()
        .find(|g| g.name() == "gateway.networking.k8s.io")
        .expect("gateway group");
    assert_eq!(group.preferred_version(), Some("v1"));
    assert!(group.versions().any(|v| v == "v1beta1"));
}

#[tokio::test]
async fn objects_get_uid_creation_time_and_resource_version_on_create() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let created = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    let got = api.get("a").await.unwrap();
    assert_eq!(
        got.metadata.resource_version,
        created.metadata.resource_version
    );
    assert!(rv > 0);
}

#[tokio::test]
async fn generate_name_appends_five_characters() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let mut obj = cm("");
    obj.metadata.name = None;
    obj.metadata.generate_name = Some("telo-run-".into());
    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("telo-run-"));
    assert_eq!(name.len(), "telo-run-".len() + 5);
}

#[tokio::test]
async fn a_missing_object_is_a_404_status_with_details() {
    let sim = sim().await;
    let (code, body) = get(&sim, "/api/v1/namespaces/default/pods/nope").await;
    assert_eq!(code, 404);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "pods \"nope\" not found", "reason": "NotFound",
               "details": {"name": "nope", "kind": "pods"}, "code": 404})
    );
}

#[tokio::test]
async fn creating_twice_is_409_already_exists() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &cm("dup"))
        .await
        .unwrap();
    let err = api
        .create(&PostParams::default(), &cm("dup"))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("api error")
    };
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "AlreadyExists");
    assert_eq!(status.message, "configmaps \"dup\" already exists");
}

#[tokio::test]
async fn invalid_pod_names_are_422_with_the_dns_subdomain_message() {
    let sim = sim().await;
    let (code, body) = post(
        &sim,
        "/api/v1/namespaces/default/pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "Bad_Name"},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(
        body["message"],
        "Pod \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    );
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.name");
    assert_eq!(body["details"]["causes"][0]["reason"], "FieldValueInvalid");
}

#[tokio::test]
async fn service_names_must_start_with_a_letter() {
    let sim = sim().await;
    let (code, body) = post(
        &sim,
        "/api/v1/namespaces/default/services",
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "8080-svc"},
               "spec": {"ports": [{"port": 80}]}}),
    )
    .await;
    assert_eq!(code, 422);
    assert!(body["message"].as_str().unwrap().starts_with(
        "Service \"8080-svc\" is invalid: metadata.name: Invalid value: \"8080-svc\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character"
    ));
}

#[tokio::test]
async fn long_label_values_and_port_names_are_refused() {
    let sim = sim().await;
    let long = "x".repeat(64);
    let (code, body) = post(
        &sim,
        "/api/v1/namespaces/default/pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"telo.run/session-id": long}},
               "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"name": "a-very-long-port-name", "containerPort": 80}]}]}}),
    )
    .await;
    assert_eq!(code, 422);
    let msg = body["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!(
            "metadata.labels: Invalid value: \"{long}\": must be no more than 63 characters"
        )),
        "{msg}"
    );
    assert!(msg.contains("spec.containers[0].ports[0].name: Invalid value: \"a-very-long-port-name\": must be no more than 15 characters"), "{msg}");
}

#[tokio::test]
async fn pods_start_pending_with_defaults() {
    let sim = builder()
        .image("nope:*", kube_sim::ImageBehaviour::Virtual)
        .start()
        .await
        .unwrap();
    let api: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "nope:1"}]}})).unwrap();
    let created = api.create(&PostParams::default(), &pod).await.unwrap();
    let status = created.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    let spec = created.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &cm("one"))
        .await
        .unwrap();
    let mut other = cm("two");
    other.metadata.labels = Some([("tier".to_string(), "db".to_string())].into());
    api.create(&PostParams::default(), &other).await.unwrap();
    let names = |l: kube::api::ObjectList<ConfigMap>| {
        l.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier=web"))
                .await
                .unwrap()
        ),
        vec!["one"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier in (db,cache)"))
                .await
                .unwrap()
        ),
        vec!["two"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier!=web,tier"))
                .await
                .unwrap()
        ),
        vec!["two"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier,tier notin (web)"))
                .await
                .unwrap()
        ),
        vec!["two"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=one"))
                .await
                .unwrap()
        ),
        vec!["one"]
    );
    let (code, body) = get(
        &sim,
        "/api/v1/namespaces/default/configmaps?fieldSelector=spec.x%3D1",
    )
    .await;
    assert_eq!(
        (code, body["message"].as_str().unwrap()),
        (400, "field label not supported: spec.x")
    );
}

#[tokio::test]
async fn put_with_a_stale_resource_version_is_409_conflict() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let created = api.create(&PostParams::default(), &cm("c")).await.unwrap();
    let mut first = created.clone();
    first.data = Some([("a".to_string(), "2".to_string())].into());
    api.replace("c", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut stale = created;
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    let kube::Error::Api(status) = api
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap_err()
    else {
        panic!()
    };
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
    assert_eq!(
        status.message,
        "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
    );
}

#[tokio::test]
async fn merge_and_json_patches_apply() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &cm("p")).await.unwrap();
    let merged = api
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.data.unwrap().get("b").map(String::as_str), Some("2"));
    // JSON patch over raw HTTP (kube 5 pins an older json-patch crate).
    let path = "/api/v1/namespaces/default/configmaps/p";
    let (code, patched) = request(
        &sim,
        reqwest::Method::PATCH,
        path,
        Some(json!([{"op": "replace", "path": "/data/a", "value": "9"}])),
        "application/json-patch+json",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(patched["data"]["a"], "9");
    let (code, body) = request(
        &sim,
        reqwest::Method::PATCH,
        path,
        Some(json!([{"op": "test", "path": "/data/a", "value": "0"}])),
        "application/json-patch+json",
    )
    .await;
    assert_eq!(code, 422, "{body}");
    let (code, _) = request(
        &sim,
        reqwest::Method::PATCH,
        path,
        Some(json!({})),
        "text/plain",
    )
    .await;
    assert_eq!(code, 415);
}

#[tokio::test]
async fn a_watch_from_a_resource_version_replays_later_changes() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &cm("w")).await.unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut kinds = Vec::new();
    while let Some(ev) = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        match ev {
            WatchEvent::Added(c) => kinds.push(format!("ADDED {}", c.metadata.name.unwrap())),
            WatchEvent::Deleted(c) => kinds.push(format!("DELETED {}", c.metadata.name.unwrap())),
            _ => {}
        }
        if kinds.len() == 2 {
            break;
        }
    }
    assert_eq!(kinds, vec!["ADDED w", "DELETED w"]);
}

#[tokio::test]
async fn a_compacted_resource_version_gets_410_expired_in_the_stream() {
    let sim = builder().history_per_kind(3).start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let first = api.create(&PostParams::default(), &cm("x")).await.unwrap();
    for i in 0..5 {
        api.patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await
        .unwrap();
    }
    let rv = first.metadata.resource_version.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let WatchEvent::Error(e) = ev else {
        panic!("expected an ERROR event, got {ev:?}")
    };
    assert_eq!(e.code, 410);
    assert_eq!(e.reason, "Expired");
    assert!(
        e.message
            .starts_with(&format!("too old resource version: {rv} (")),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn watches_send_bookmarks_when_asked() {
    let sim = builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            }
            .timeout(5),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(ev, WatchEvent::Bookmark(_)), "{ev:?}");
}

#[tokio::test]
async fn a_watch_with_a_field_selector_sees_objects_leave_as_deleted() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &cm("sel"))
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
        .watch(&WatchParams::default().labels("tier=web").timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    api.patch(
        "sel",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "db"}}})),
    )
    .await
    .unwrap();
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(ev, WatchEvent::Deleted(_)), "{ev:?}");
}

#[tokio::test]
async fn kube_runtime_watcher_follows_pods() {
    let sim = builder()
        .image("idle:*", kube_sim::ImageBehaviour::Virtual)
        .start()
        .await
        .unwrap();
    let api: Api<Pod> = Api::namespaced(sim.client(), "default");
    let mut events =
        kube::runtime::watcher(api.clone(), kube::runtime::watcher::Config::default()).boxed();
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "w"}, "spec": {"containers": [{"name": "c", "image": "idle:1"}]}})).unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let running = tokio::time::timeout(WAIT, async {
        while let Some(ev) = events.try_next().await.unwrap() {
            if let kube::runtime::watcher::Event::Apply(p) = ev
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            {
                return p;
            }
        }
        panic!("watch ended")
    })
    .await
    .unwrap();
    assert!(is_pod_ip(&sim, &running.status.unwrap().pod_ip.unwrap()));
}

#[tokio::test]
async fn a_configured_rbac_denial_answers_like_the_apiserver() {
    let sim = sim().await;
    sim.deny(Denial {
        verb: "create".into(),
        resource: "pods".into(),
        namespace: None,
        user: None,
    });
    let api: Api<Pod> = Api::namespaced(sim.client(), "telo-sessions");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})).unwrap();
    let kube::Error::Api(status) = api.create(&PostParams::default(), &pod).await.unwrap_err()
    else {
        panic!()
    };
    assert_eq!(status.code, 403);
    assert_eq!(status.reason, "Forbidden");
    assert_eq!(
        status.message,
        "pods is forbidden: User \"system:serviceaccount:telo-runner:telo-k8s-runner\" cannot create resource \"pods\" in API group \"\" in the namespace \"telo-sessions\""
    );
}

#[tokio::test]
async fn quota_admission_refuses_the_pod_over_the_limit() {
    let sim = builder()
        .image("idle:*", kube_sim::ImageBehaviour::Virtual)
        .start()
        .await
        .unwrap();
    let quota: ResourceQuota = serde_json::from_value(
        json!({"metadata": {"name": "telo-k8s-runner-sessions", "namespace": "telo-sessions"},
        "spec": {"hard": {"pods": "1"}}}),
    )
    .unwrap();
    sim.seed(&quota).unwrap();
    let api: Api<Pod> = Api::namespaced(sim.client(), "telo-sessions");
    let pod = |n: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": n}, "spec": {"containers": [{"name": "c", "image": "idle:1"}]}})).unwrap()
    };
    api.create(&PostParams::default(), &pod("a")).await.unwrap();
    let kube::Error::Api(status) = api
        .create(&PostParams::default(), &pod("b"))
        .await
        .unwrap_err()
    else {
        panic!()
    };
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        "pods \"b\" is forbidden: exceeded quota: telo-k8s-runner-sessions, requested: pods=1, used: pods=1, limited: pods=1"
    );
    let q: ResourceQuota = sim
        .get("telo-sessions", "telo-k8s-runner-sessions")
        .unwrap();
    assert_eq!(q.status.unwrap().used.unwrap()["pods"].0, "1");
}

#[tokio::test]
async fn compute_quota_requires_every_container_to_declare_limits() {
    let sim = sim().await;
    let quota: ResourceQuota = serde_json::from_value(
        json!({"metadata": {"name": "q", "namespace": "telo-sessions"},
        "spec": {"hard": {"limits.cpu": "16", "requests.memory": "16Gi"}}}),
    )
    .unwrap();
    sim.seed(&quota).unwrap();
    let api: Api<Pod> = Api::namespaced(sim.client(), "telo-sessions");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "body-fetch", "image": "busybox:stable"}],
        "containers": [{"name": "session", "image": "busybox", "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}}}]}})).unwrap();
    let kube::Error::Api(status) = api.create(&PostParams::default(), &pod).await.unwrap_err()
    else {
        panic!()
    };
    assert_eq!(
        status.message,
        "pods \"p\" is forbidden: failed quota: q: must specify limits.cpu,requests.memory"
    );
}

#[tokio::test]
async fn dependents_are_garbage_collected_with_their_owner() {
    let sim = builder()
        .image("idle:*", kube_sim::ImageBehaviour::Virtual)
        .start()
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "owner"}, "spec": {"containers": [{"name": "c", "image": "idle:1"}]}})).unwrap();
    let owner = pods.create(&PostParams::default(), &pod).await.unwrap();
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "telo-run-x", "ownerReferences": [{
        "apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": owner.metadata.uid.unwrap(), "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"selector": {"a": "b"}, "ports": [{"name": "p8080", "port": 8080}]}})).unwrap();
    let services: Api<Service> = Api::namespaced(sim.client(), "default");
    services.create(&PostParams::default(), &svc).await.unwrap();
    pods.delete(
        "owner",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    sim.wait_for_deletion("services", "default", "telo-run-x", WAIT)
        .await
        .unwrap();
}

/// The real collector follows updates too: an owner reference added later
/// (a patch) is honoured like one given at creation — the dependent goes
/// with a live owner, and at once when the owner it names is already gone.
#[tokio::test]
async fn an_owner_reference_added_by_a_patch_is_collected_like_one_given_at_creation() {
    let sim = builder()
        .image("idle:*", kube_sim::ImageBehaviour::Virtual)
        .start()
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.client(), "default");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(sim.client(), "default");
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let owned_by = |owner: &Pod| {
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
            "name": owner.metadata.name.clone().unwrap(), "uid": owner.metadata.uid.clone().unwrap()}]}})
    };
    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "idle:1"}]}})).unwrap()
    };
    let secret = |name: &str| -> k8s_openapi::api::core::v1::Secret {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "dg=="}})).unwrap()
    };

    // A live owner: the dependent stays until the owner goes.
    let live = pods
        .create(&PostParams::default(), &pod("live"))
        .await
        .unwrap();
    secrets
        .create(&PostParams::default(), &secret("of-live"))
        .await
        .unwrap();
    secrets
        .patch(
            "of-live",
            &PatchParams::default(),
            &Patch::Merge(owned_by(&live)),
        )
        .await
        .unwrap();
    assert!(secrets.get_opt("of-live").await.unwrap().is_some());
    pods.delete("live", &now).await.unwrap();
    sim.wait_for_deletion("secrets", "default", "of-live", WAIT)
        .await
        .unwrap();

    // An owner already gone when the reference is added.
    let gone = pods
        .create(&PostParams::default(), &pod("gone"))
        .await
        .unwrap();
    pods.delete("gone", &now).await.unwrap();
    sim.wait_for_deletion("pods", "default", "gone", WAIT)
        .await
        .unwrap();
    secrets
        .create(&PostParams::default(), &secret("of-gone"))
        .await
        .unwrap();
    secrets
        .patch(
            "of-gone",
            &PatchParams::default(),
            &Patch::Merge(owned_by(&gone)),
        )
        .await
        .unwrap();
    sim.wait_for_deletion("secrets", "default", "of-gone", WAIT)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_terminating_namespace_refuses_new_content_then_goes() {
    let sim = sim().await;
    let nss: Api<Namespace> = Api::all(sim.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(sim.client(), "doomed");
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    nss.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    sim.wait_for_deletion("namespaces", "", "doomed", WAIT)
        .await
        .unwrap();
    let kube::Error::Api(status) = cms
        .create(&PostParams::default(), &cm("b"))
        .await
        .unwrap_err()
    else {
        panic!()
    };
    assert_eq!(
        (status.code, status.message.as_str()),
        (404, "namespaces \"doomed\" not found")
    );
}

#[tokio::test]
async fn unknown_paths_are_404_and_list_kinds_are_named() {
    let sim = sim().await;
    let (code, body) = get(&sim, "/api/v1/widgets").await;
    assert_eq!(
        (code, body["message"].as_str().unwrap()),
        (404, "the server could not find the requested resource")
    );
    let (code, body) = get(&sim, "/api/v1/namespaces/default/configmaps").await;
    assert_eq!(code, 200);
    assert_eq!(body["kind"], "ConfigMapList");
    let (_, ns) = get(&sim, "/api/v1/namespaces").await;
    let names: Vec<&str> = ns["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    // A new cluster's namespaces, and the ones these tests create.
    assert_eq!(
        names,
        vec![
            "default",
            "kube-node-lease",
            "kube-public",
            "kube-system",
            "telo-runner",
            "telo-sessions"
        ]
    );
}
