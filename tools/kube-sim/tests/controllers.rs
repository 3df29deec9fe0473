//! The simulated Ingress and Gateway API controllers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::networking::v1::Ingress;
use serde_json::{Value, json};
use support::*;

fn ingress(class: Option<&str>) -> Value {
    let mut spec = json!({"rules": [{"host": "8080-abc.example.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
        "backend": {"service": {"name": "telo-run-abc", "port": {"number": 8080}}}}]}}]});
    if let Some(c) = class {
        spec["ingressClassName"] = json!(c);
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "telo-run-abc", "namespace": "telo-sessions"}, "spec": spec})
}

fn lb_ip(i: &Ingress) -> Option<String> {
    i.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

#[tokio::test]
async fn the_ingress_controller_programs_ingresses_of_its_class() {
    let sim = builder().ingress_class("sim", false).start().await.unwrap();
    sim.seed_value(ingress(Some("sim"))).unwrap();
    let i = sim
        .wait_for::<Ingress>(
            "telo-sessions",
            "telo-run-abc",
            |i| lb_ip(i).is_some(),
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(lb_ip(&i).as_deref(), Some("127.0.0.1"));
}

#[tokio::test]
async fn a_switched_off_ingress_controller_leaves_ingresses_unprogrammed() {
    let sim = builder()
        .ingress_class("sim", true)
        .ingress_controller(false)
        .start()
        .await
        .unwrap();
    sim.seed_value(ingress(None)).unwrap();
    let err = sim
        .wait_for::<Ingress>(
            "telo-sessions",
            "telo-run-abc",
            |i| lb_ip(i).is_some(),
            Duration::from_millis(300),
        )
        .await;
    assert!(err.is_err());
    sim.set_ingress_controller(true);
    sim.wait_for::<Ingress>(
        "telo-sessions",
        "telo-run-abc",
        |i| lb_ip(i).is_some(),
        WAIT,
    )
    .await
    .unwrap();
}

async fn gateway_sim(from: &str) -> kube_sim::KubeSim {
    let sim = builder().gateway_api(true).start().await.unwrap();
    sim.seed_value(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "sim"},
        "spec": {"controllerName": kube_sim::controllers::gateway::CONTROLLER_NAME}})).unwrap();
    sim.seed_value(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "telo-runner"},
        "spec": {"gatewayClassName": "sim", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80, "hostname": "*.example.com",
            "allowedRoutes": {"namespaces": {"from": from}}}]}})).unwrap();
    sim.seed_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "telo-run-abc", "namespace": "telo-sessions"},
        "spec": {"selector": {"telo.run/session-id": "abc"}, "ports": [{"name": "p8080", "port": 8080}]}})).unwrap();
    sim.seed_value(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "telo-run-abc-8080", "namespace": "telo-sessions"},
        "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw", "namespace": "telo-runner"}],
                 "hostnames": ["8080-abc.example.com"],
                 "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": "telo-run-abc", "port": 8080}]}]}})).unwrap();
    sim
}

async fn route_condition(sim: &kube_sim::KubeSim, ty: &str) -> Value {
    for _ in 0..500 {
        if let Some(r) = sim.get_value("httproutes", "telo-sessions", "telo-run-abc-8080")
            && let Some(c) = r
                .pointer("/status/parents/0/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
        {
            return c.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {ty} condition");
}

#[tokio::test]
async fn the_gateway_controller_accepts_routes_its_listeners_admit() {
    let sim = gateway_sim("All").await;
    let accepted = route_condition(&sim, "Accepted").await;
    assert_eq!(
        (accepted["status"].as_str(), accepted["reason"].as_str()),
        (Some("True"), Some("Accepted"))
    );
    let resolved = route_condition(&sim, "ResolvedRefs").await;
    assert_eq!(resolved["status"], "True");
}

#[tokio::test]
async fn routes_from_other_namespaces_are_not_allowed_by_same_namespace_listeners() {
    let sim = gateway_sim("Same").await;
    let accepted = route_condition(&sim, "Accepted").await;
    assert_eq!(
        (accepted["status"].as_str(), accepted["reason"].as_str()),
        (Some("False"), Some("NotAllowedByListeners"))
    );
}
