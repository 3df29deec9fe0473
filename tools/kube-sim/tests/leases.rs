//! `coordination.k8s.io/v1` Leases through kube-rs: discovery, CRUD,
//! optimistic concurrency under racing writers, error bodies, validation,
//! watches and RBAC denials.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_sim::{Denial, KubeSim};
use serde_json::{Value, json};
use support::*;

const NS: &str = "telo-runner";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/telo-runner/leases";
const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "runner"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "acquireTime": "2026-01-02T03:04:05.123456Z",
                 "renewTime": "2026-01-02T03:04:05.123456Z", "leaseTransitions": 0}
    }))
    .unwrap()
}

fn api(sim: &KubeSim) -> Api<Lease> {
    Api::namespaced(sim.client(), NS)
}

fn holder(l: &Lease) -> &str {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("")
}

fn rv(l: &Lease) -> u64 {
    l.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

fn api_status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn put(sim: &KubeSim, name: &str, body: Value) -> (u16, Value) {
    request(
        sim,
        reqwest::Method::PUT,
        &format!("{LEASES}/{name}"),
        Some(body),
        "application/json",
    )
    .await
}

async fn patch_raw(sim: &KubeSim, name: &str, body: Value, content_type: &str) -> (u16, Value) {
    request(
        sim,
        reqwest::Method::PATCH,
        &format!("{LEASES}/{name}"),
        Some(body),
        content_type,
    )
    .await
}

#[tokio::test]
async fn discovery_serves_leases_in_coordination_v1() {
    let sim = sim().await;
    let discovery = kube::Discovery::new(sim.client()).run().await.unwrap();
    let group = discovery
        .groups()
        .find(|g| g.name() == "coordination.k8s.io")
        .expect("coordination group");
    assert_eq!(group.preferred_version(), Some("v1"));
    let (res, caps) = group
        .recommended_resources()
        .into_iter()
        .find(|(r, _)| r.plural == "leases")
        .expect("leases");
    assert_eq!(res.kind, "Lease");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    for verb in [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ] {
        assert!(caps.supports_operation(verb), "{verb}");
    }
    let (code, list) = get(&sim, "/apis/coordination.k8s.io/v1").await;
    assert_eq!(code, 200);
    assert_eq!(list["resources"][0]["name"], "leases");
    assert_eq!(list["resources"][0]["namespaced"], true);
}

#[tokio::test]
async fn create_get_replace_patch_list_and_delete() {
    let sim = sim().await;
    let api = api(&sim);
    let created = api
        .create(&PostParams::default(), &lease("leader", "a"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert_eq!(created.metadata.generation, None);
    let stored = serde_json::to_value(&created).unwrap();
    assert_eq!(stored["spec"]["renewTime"], "2026-01-02T03:04:05.123456Z");
    assert_eq!(stored["apiVersion"], "coordination.k8s.io/v1");

    let got = api.get("leader").await.unwrap();
    assert_eq!(rv(&got), rv(&created));

    // Replace from the current version: accepted, version bumped.
    let mut next = got.clone();
    next.spec.as_mut().unwrap().holder_identity = Some("b".into());
    next.spec.as_mut().unwrap().lease_transitions = Some(1);
    let replaced = api
        .replace("leader", &PostParams::default(), &next)
        .await
        .unwrap();
    assert_eq!(holder(&replaced), "b");
    assert!(rv(&replaced) > rv(&got));

    // Merge patch.
    let merged = api
        .patch(
            "leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "c"}})),
        )
        .await
        .unwrap();
    assert_eq!(holder(&merged), "c");
    assert!(rv(&merged) > rv(&replaced));

    // JSON patch (over raw HTTP: kube pins another json-patch crate).
    let (code, body) = patch_raw(
        &sim,
        "leader",
        json!([{"op": "replace", "path": "/spec/leaseTransitions", "value": 2}]),
        "application/json-patch+json",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["spec"]["leaseTransitions"], 2);

    // Server-side apply.
    let applied = api
        .patch(
            "leader",
            &PatchParams::apply("runner").force(),
            &Patch::Apply(
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "leader"}, "spec": {"holderIdentity": "d"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(holder(&applied), "d");
    assert_eq!(
        applied.spec.as_ref().unwrap().lease_transitions,
        Some(2),
        "apply keeps what it does not mention"
    );

    api.create(&PostParams::default(), &lease("other", "x"))
        .await
        .unwrap();
    let list = api
        .list(&ListParams::default().labels("app=runner"))
        .await
        .unwrap();
    let names: Vec<String> = list
        .items
        .iter()
        .map(|l| l.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, vec!["leader", "other"]);
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=other"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);

    let deleted = api
        .delete("leader", &DeleteParams::default())
        .await
        .unwrap();
    let status = deleted.right().expect("a Status, as for leases");
    assert!(status.is_success());
    assert_eq!(status.details.unwrap().group, "coordination.k8s.io");
    let status = api_status(api.get("leader").await.unwrap_err());
    assert_eq!(status.code, 404);
}

#[tokio::test]
async fn a_missing_lease_is_a_404_with_the_apiserver_body() {
    let sim = sim().await;
    let (code, body) = get(&sim, &format!("{LEASES}/nope")).await;
    assert_eq!(code, 404);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "leases.coordination.k8s.io \"nope\" not found", "reason": "NotFound",
               "details": {"name": "nope", "group": "coordination.k8s.io", "kind": "leases"},
               "code": 404})
    );
    let status = api_status(
        api(&sim)
            .patch(
                "nope",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn creating_an_existing_lease_is_409_already_exists() {
    let sim = sim().await;
    let api = api(&sim);
    api.create(&PostParams::default(), &lease("dup", "a"))
        .await
        .unwrap();
    let status = api_status(
        api.create(&PostParams::default(), &lease("dup", "b"))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "AlreadyExists");
    assert_eq!(
        status.message,
        "leases.coordination.k8s.io \"dup\" already exists"
    );
    assert_eq!(holder(&api.get("dup").await.unwrap()), "a");
}

#[tokio::test]
async fn a_stale_resource_version_is_409_conflict_for_put_and_patch() {
    let sim = sim().await;
    let api = api(&sim);
    let first = api
        .create(&PostParams::default(), &lease("l", "a"))
        .await
        .unwrap();
    let stale = first.metadata.resource_version.clone().unwrap();
    api.patch(
        "l",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"holderIdentity": "b"}})),
    )
    .await
    .unwrap();

    let mut body = serde_json::to_value(&first).unwrap();
    body["spec"]["holderIdentity"] = json!("c");
    let (code, status) = put(&sim, "l", body).await;
    assert_eq!(code, 409);
    assert_eq!(
        status,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"l\": {MODIFIED}"),
               "reason": "Conflict",
               "details": {"name": "l", "group": "coordination.k8s.io", "kind": "leases"},
               "code": 409})
    );

    let (code, status) = patch_raw(
        &sim,
        "l",
        json!({"metadata": {"resourceVersion": stale}, "spec": {"holderIdentity": "c"}}),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(
        status["message"],
        format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"l\": {MODIFIED}")
    );
    assert_eq!(holder(&api.get("l").await.unwrap()), "b");
}

/// Two clients take the same Lease from the same version and write at the
/// same moment (both requests are held in the apiserver, then let go
/// together): every round exactly one wins and the other gets a Conflict.
#[tokio::test]
async fn racing_writers_from_one_version_get_exactly_one_success() {
    let sim = sim().await;
    let alice = api(&sim);
    let bob: Api<Lease> = Api::namespaced(sim.client(), NS);
    alice
        .create(&PostParams::default(), &lease("race", "nobody"))
        .await
        .unwrap();
    let mut wins = [0u32; 2];
    for round in 0..50 {
        let base = alice.get("race").await.unwrap();
        let base_rv = base.metadata.resource_version.clone().unwrap();
        let by_put = round % 2 == 0;
        let verb = if by_put { "update" } else { "patch" };
        sim.faults().hold(verb, "leases");
        // Each write changes the lease (a write that changes nothing is
        // answered with the current object and no new version).
        let attempt = |api: Api<Lease>, who: &'static str| {
            let who = format!("{who}-{round}");
            let mut mine = base.clone();
            let spec = mine.spec.as_mut().unwrap();
            spec.holder_identity = Some(who.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            let body = json!({"metadata": {"resourceVersion": base_rv.clone()},
                              "spec": {"holderIdentity": who}});
            tokio::spawn(async move {
                if by_put {
                    api.replace("race", &PostParams::default(), &mine).await
                } else {
                    api.patch("race", &PatchParams::default(), &Patch::Merge(body))
                        .await
                }
            })
        };
        let a = attempt(alice.clone(), "alice");
        let b = attempt(bob.clone(), "bob");
        tokio::time::timeout(WAIT, sim.faults().wait_held(2))
            .await
            .expect("both writes reach the apiserver");
        sim.faults().release();
        let results = [a.await.unwrap(), b.await.unwrap()];
        let winners: Vec<usize> = (0..2).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round} ({verb}) from {base_rv}: {results:?}"
        );
        let winner = winners[0];
        wins[winner] += 1;
        let loser = results
            .into_iter()
            .nth(1 - winner)
            .unwrap()
            .map(|_| ())
            .unwrap_err();
        let status = api_status(loser);
        assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
        assert_eq!(
            status.message,
            format!(
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"race\": {MODIFIED}"
            )
        );
        let now = alice.get("race").await.unwrap();
        assert_eq!(
            holder(&now),
            format!("{}-{round}", ["alice", "bob"][winner])
        );
        assert!(rv(&now) > base_rv.parse::<u64>().unwrap());
    }
    assert_eq!(wins[0] + wins[1], 50);
}

#[tokio::test]
async fn a_put_without_a_resource_version_is_unconditional_and_may_create() {
    let sim = sim().await;
    let api = api(&sim);
    let (code, body) = put(
        &sim,
        "fresh",
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "fresh"}, "spec": {"holderIdentity": "a"}}),
    )
    .await;
    assert_eq!(code, 201, "leases allow create on update: {body}");
    let (code, body) = put(
        &sim,
        "fresh",
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "fresh"}, "spec": {"holderIdentity": "b"}}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(holder(&api.get("fresh").await.unwrap()), "b");
}

#[tokio::test]
async fn spec_validation_answers_422_like_the_apiserver() {
    let sim = sim().await;
    let mut bad = lease("bad", "a");
    bad.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
    let status = api_status(
        api(&sim)
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        "Lease.coordination.k8s.io \"bad\" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"
    );

    let (code, body) = post(
        &sim,
        LEASES,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "bad"},
               "spec": {"leaseDurationSeconds": -5, "leaseTransitions": -1}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "Lease.coordination.k8s.io \"bad\" is invalid: [spec.leaseDurationSeconds: Invalid value: -5: must be greater than 0, spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0]"
    );
    assert_eq!(
        body["details"]["causes"][1],
        json!({"reason": "FieldValueInvalid", "field": "spec.leaseTransitions",
               "message": "Invalid value: -1: must be greater than or equal to 0"})
    );

    let (code, body) = post(
        &sim,
        LEASES,
        json!({"metadata": {"name": "Bad_Name"}, "spec": {}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.name");

    // Updates are validated too, and a refused one changes nothing.
    let api = api(&sim);
    let ok = api
        .create(&PostParams::default(), &lease("ok", "a"))
        .await
        .unwrap();
    let status = api_status(
        api.patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseTransitions": -1}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(status.code, 422);
    assert_eq!(rv(&api.get("ok").await.unwrap()), rv(&ok));
}

#[tokio::test]
async fn malformed_micro_times_are_refused_and_good_ones_stored_in_utc() {
    let sim = sim().await;
    let body = |renew: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "t"},
               "spec": {"holderIdentity": "a", "renewTime": renew}})
    };
    // Seconds precision is a metav1.Time, not a MicroTime.
    let (code, status) = post(&sim, LEASES, body("2026-01-02T03:04:05Z")).await;
    assert_eq!(code, 400);
    assert_eq!(status["reason"], "BadRequest");
    assert_eq!(
        status["message"],
        "Lease in version \"v1\" cannot be handled as a Lease: parsing time \"2026-01-02T03:04:05Z\" as \"2006-01-02T15:04:05.000000Z07:00\": cannot parse \"Z\" as \".000000\""
    );
    let (code, status) = post(&sim, LEASES, body("yesterday")).await;
    assert_eq!(code, 400);
    assert_eq!(
        status["message"],
        "Lease in version \"v1\" cannot be handled as a Lease: parsing time \"yesterday\" as \"2006-01-02T15:04:05.000000Z07:00\": cannot parse \"yesterday\" as \"2006\""
    );
    let (code, status) = post(
        &sim,
        LEASES,
        json!({"metadata": {"name": "t"}, "spec": {"leaseDurationSeconds": "15"}}),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        status["message"],
        "Lease in version \"v1\" cannot be handled as a Lease: json: cannot unmarshal string into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32"
    );

    // An offset is accepted and stored as UTC; fields LeaseSpec lacks, and
    // the gated coordinated-election fields, are dropped.
    let (code, created) = post(
        &sim,
        LEASES,
        json!({"metadata": {"name": "t"}, "spec": {"holderIdentity": "a",
               "renewTime": "2026-01-02T05:04:05.000001+02:00", "strategy": "OldestEmulationVersion",
               "preferredHolder": "b", "color": "blue"}}),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        created["spec"],
        json!({"holderIdentity": "a", "renewTime": "2026-01-02T03:04:05.000001Z"})
    );

    // A patch that leaves a malformed time is a 422 on `patch`.
    let (code, status) = patch_raw(
        &sim,
        "t",
        json!({"spec": {"acquireTime": "2026-13-01T00:00:00.000000Z"}}),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["details"]["causes"][0]["field"], "patch");
    let message = status["message"].as_str().unwrap();
    assert!(message.starts_with(" \"\" is invalid: patch: Invalid value: "));
    assert!(
        message.ends_with(": parsing time \"2026-13-01T00:00:00.000000Z\": month out of range")
    );
    // And a PUT with one is a 400, as for a create.
    let (code, _) = put(&sim, "t", body("2026-01-02T03:04:05.1234567Z")).await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn watches_see_leases_added_modified_and_deleted() {
    let sim = sim().await;
    let api = api(&sim);
    let rv0 = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(10), &rv0)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &lease("w", "a"))
        .await
        .unwrap();
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"holderIdentity": "b"}})),
    )
    .await
    .unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(WAIT, stream.try_next())
            .await
            .expect("event in time")
            .unwrap()
            .expect("stream open");
        match ev {
            WatchEvent::Added(l) => seen.push(format!("ADDED {}", holder(&l))),
            WatchEvent::Modified(l) => seen.push(format!("MODIFIED {}", holder(&l))),
            WatchEvent::Deleted(l) => seen.push(format!("DELETED {}", holder(&l))),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, vec!["ADDED a", "MODIFIED b", "DELETED b"]);
}

#[tokio::test]
async fn rbac_denials_apply_to_leases() {
    let sim = sim().await;
    let api = api(&sim);
    api.create(&PostParams::default(), &lease("held", "a"))
        .await
        .unwrap();
    sim.deny(Denial {
        verb: "update".into(),
        resource: "leases".into(),
        namespace: Some(NS.into()),
        user: None,
    });
    let mut next = api.get("held").await.unwrap();
    next.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let status = api_status(
        api.replace("held", &PostParams::default(), &next)
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "leases.coordination.k8s.io \"held\" is forbidden: User \"system:serviceaccount:telo-runner:telo-k8s-runner\" cannot update resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"telo-runner\""
    );
    // Reads are still allowed, and the lease is unchanged.
    assert_eq!(holder(&api.get("held").await.unwrap()), "a");
    sim.clear_denials();
    api.replace("held", &PostParams::default(), &next)
        .await
        .unwrap();
}

#[tokio::test]
async fn injected_faults_reach_lease_requests() {
    let sim = sim().await;
    let api = api(&sim);
    sim.faults().fail_next("get", "leases", 1, 500);
    let status = api_status(api.get("any").await.unwrap_err());
    assert_eq!(
        (status.code, status.reason.as_str()),
        (500, "InternalError")
    );
    let status = api_status(api.get("any").await.unwrap_err());
    assert_eq!(status.code, 404);
}
