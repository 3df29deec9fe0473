//! Per-session routing end to end against kube-sim (docs/contract.md §9.9–§9.14):
//! how the layer is resolved from what the cluster serves, the objects each
//! layer publishes, the URLs `running` announces, and the `route` events that
//! say whether each host is really served.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Runner;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube_sim::{Denial, KubeSim, KubeSimBuilder};
use rstest::rstest;
use runner_core::config::ConfigError;
use runner_k8s::config::{GatewayParent, RoutingConfig, RoutingMode};
use runner_k8s::routing::create_or_replace::create_or_replace;
use runner_k8s::routing::detect::resolve_routing;
use runner_k8s::routing::mode::ResolvedRouting;
use runner_k8s::routing::service::keep_allocated_fields;
use serde_json::{Value, json};
use test_support::bundle::start_body;
use test_support::sse::SseFrame;

const NS: &str = "telo-sessions";
const GATEWAY_NS: &str = "gateway-system";
const DOMAIN: &str = "telo.run";
const WAIT: Duration = Duration::from_secs(15);

// --- mode resolution against kube-sim discovery ---

fn config(mode: RoutingMode) -> RoutingConfig {
    RoutingConfig {
        mode,
        base_domain: Some(DOMAIN.into()),
        ingress_class_name: None,
        tls_secret_name: None,
        ingress_annotations: Default::default(),
        gateway: None,
        route_ready_timeout: Duration::from_secs(60),
    }
}

fn named_gateway(config: RoutingConfig) -> RoutingConfig {
    RoutingConfig {
        gateway: Some(public_gateway(None)),
        ..config
    }
}

fn public_gateway(section: Option<&str>) -> GatewayParent {
    GatewayParent {
        name: "public".into(),
        namespace: GATEWAY_NS.into(),
        section_name: section.map(str::to_owned),
    }
}

/// What the simulated cluster offers.
#[derive(Debug, Clone, Copy)]
struct Cluster {
    gateway_api: bool,
    /// IngressClasses, the first marked default when `default_class`.
    classes: usize,
    default_class: bool,
    classes_forbidden: bool,
}

const fn cluster(gateway_api: bool, classes: usize, default_class: bool) -> Cluster {
    Cluster {
        gateway_api,
        classes,
        default_class,
        classes_forbidden: false,
    }
}

const FORBIDDEN_LIST: Cluster = Cluster {
    gateway_api: false,
    classes: 1,
    default_class: false,
    classes_forbidden: true,
};

async fn start_cluster(cluster: Cluster) -> KubeSim {
    let mut builder = common::cluster().gateway_api(cluster.gateway_api);
    for index in 0..cluster.classes {
        builder = builder.ingress_class(
            &format!("class-{index}"),
            index == 0 && cluster.default_class,
        );
    }
    let sim = builder.start().await.unwrap();
    if cluster.classes_forbidden {
        sim.deny(Denial {
            verb: "list".into(),
            resource: "ingressclasses".into(),
            namespace: None,
            user: None,
        });
    }
    sim
}

fn ingress(class: Option<&str>) -> Result<ResolvedRouting, String> {
    Ok(ResolvedRouting::Ingress {
        class: class.map(str::to_owned),
    })
}

fn gateway_v1() -> Result<ResolvedRouting, String> {
    Ok(ResolvedRouting::Gateway {
        api_version: "v1".into(),
        parent: public_gateway(None),
    })
}

fn refused(message: &str) -> Result<ResolvedRouting, String> {
    Err(message.to_owned())
}

const CANNOT_CHOOSE_2: &str = "SESSION_ROUTING_MODE=auto cannot choose: this cluster serves \
    'gateway.networking.k8s.io' AND has 2 IngressClass(es) with none marked default, and nothing \
    says which should carry session traffic. Set SESSION_ROUTING_MODE=ingress (with \
    SESSION_INGRESS_CLASS) or SESSION_ROUTING_MODE=gateway (with SESSION_GATEWAY_NAME).";
const GATEWAY_UNNAMED: &str = "SESSION_ROUTING_MODE=auto resolved to Gateway API, but \
    SESSION_GATEWAY_NAME is unset — a route has to name the Gateway it attaches to, and picking \
    one of several would fail as silently as publishing none. Set SESSION_GATEWAY_NAME (and \
    SESSION_GATEWAY_NAMESPACE when the Gateway is not in 'telo-sessions').";
const NO_LAYER: &str = "SESSION_ROUTING_BASE_DOMAIN is set but this cluster offers no usable \
    routing layer: no IngressClass exists and 'gateway.networking.k8s.io' is not served. Install \
    an Ingress controller or the Gateway API, or set SESSION_ROUTING_MODE=none to run logs-only.";
const LIST_FORBIDDEN: &str = "SESSION_ROUTING_BASE_DOMAIN is set but the routing layer could not \
    be resolved: listing IngressClasses failed (the runner is not permitted to do this \
    (Forbidden, HTTP 403). The cluster operator must check the runner's RBAC.) and \
    'gateway.networking.k8s.io' is not served. Grant `list` on `ingressclasses`, or set \
    SESSION_ROUTING_MODE explicitly.";
const GATEWAY_MODE_UNSERVED: &str = "SESSION_ROUTING_MODE=gateway but the cluster does not serve \
    'gateway.networking.k8s.io'. Install the Gateway API CRDs, or set \
    SESSION_ROUTING_MODE=ingress.";
const NAMED_GATEWAY_UNSERVED: &str = "SESSION_GATEWAY_NAME is set but the cluster does not serve \
    'gateway.networking.k8s.io'. Install the Gateway API CRDs, or unset SESSION_GATEWAY_NAME to \
    route via Ingress.";
const TLS_UNDER_GATEWAY: &str = "SESSION_INGRESS_TLS_SECRET is set but session routing resolved \
    to Gateway API. Under Gateway API the origin certificate belongs to the Gateway listener's \
    own `tls.certificateRefs`, not to the per-session route, so this Secret would be silently \
    ignored. Move the reference to the Gateway and unset this, or set \
    SESSION_ROUTING_MODE=ingress.";

#[rstest]
#[case::named_gateway_on_a_gateway_cluster(
    named_gateway(config(RoutingMode::Auto)),
    cluster(true, 0, false),
    gateway_v1()
)]
#[case::named_gateway_beats_usable_ingress(
    named_gateway(config(RoutingMode::Auto)),
    cluster(true, 2, false),
    gateway_v1()
)]
#[case::named_gateway_beats_a_default_class(
    named_gateway(config(RoutingMode::Auto)),
    cluster(true, 1, true),
    gateway_v1()
)]
#[case::configured_class_beats_a_served_gateway(
    RoutingConfig { ingress_class_name: Some("nginx".into()), ..config(RoutingMode::Auto) },
    cluster(true, 2, false),
    ingress(Some("nginx"))
)]
#[case::one_default_class_beside_the_gateway(
    config(RoutingMode::Auto),
    cluster(true, 1, true),
    ingress(None)
)]
#[case::one_default_class_alone(config(RoutingMode::Auto), cluster(false, 1, true), ingress(None))]
#[case::two_plain_classes_without_a_gateway(
    config(RoutingMode::Auto),
    cluster(false, 2, false),
    ingress(None)
)]
#[case::two_plain_classes_beside_the_gateway(
    config(RoutingMode::Auto),
    cluster(true, 2, false),
    refused(CANNOT_CHOOSE_2)
)]
#[case::gateway_only_without_a_name(
    config(RoutingMode::Auto),
    cluster(true, 0, false),
    refused(GATEWAY_UNNAMED)
)]
#[case::nothing_served(config(RoutingMode::Auto), cluster(false, 0, false), refused(NO_LAYER))]
#[case::class_list_forbidden(config(RoutingMode::Auto), FORBIDDEN_LIST, refused(LIST_FORBIDDEN))]
#[case::named_gateway_not_served(
    named_gateway(config(RoutingMode::Auto)),
    cluster(false, 1, true),
    refused(NAMED_GATEWAY_UNSERVED)
)]
#[case::tls_secret_with_a_resolved_gateway(
    RoutingConfig { tls_secret_name: Some("origin-tls".into()), ..named_gateway(config(RoutingMode::Auto)) },
    cluster(true, 0, false),
    refused(TLS_UNDER_GATEWAY)
)]
#[case::ingress_mode_is_taken_at_its_word(
    config(RoutingMode::Ingress),
    cluster(true, 0, false),
    ingress(None)
)]
#[case::ingress_mode_keeps_its_tls_secret(
    RoutingConfig { tls_secret_name: Some("origin-tls".into()), ..config(RoutingMode::Ingress) },
    FORBIDDEN_LIST,
    ingress(None)
)]
#[case::gateway_mode(
    named_gateway(config(RoutingMode::Gateway)),
    cluster(true, 2, false),
    gateway_v1()
)]
#[case::gateway_mode_not_served(
    named_gateway(config(RoutingMode::Gateway)),
    cluster(false, 1, true),
    refused(GATEWAY_MODE_UNSERVED)
)]
#[tokio::test]
async fn the_routing_layer_is_resolved_from_configuration_then_from_the_cluster(
    #[case] config: RoutingConfig,
    #[case] cluster: Cluster,
    #[case] expected: Result<ResolvedRouting, String>,
) {
    let sim = start_cluster(cluster).await;
    let resolved = resolve_routing(&sim.client(), &config, NS)
        .await
        .map_err(|err: ConfigError| err.to_string());
    assert_eq!(resolved, expected);
    sim.shutdown().await;
}

#[rstest]
#[case::none_mode(config(RoutingMode::None), "SESSION_ROUTING_MODE=none")]
#[case::no_base_domain(
    RoutingConfig { base_domain: None, ..named_gateway(config(RoutingMode::Gateway)) },
    "SESSION_ROUTING_BASE_DOMAIN is unset, so no session host can be constructed"
)]
#[tokio::test]
async fn logs_only_is_decided_without_asking_the_cluster(
    #[case] config: RoutingConfig,
    #[case] reason: &str,
) {
    // A cluster that would make `auto` refuse: asking it would show.
    let sim = start_cluster(cluster(true, 2, false)).await;
    let resolved = resolve_routing(&sim.client(), &config, NS).await;
    assert_eq!(
        resolved,
        Ok(ResolvedRouting::None {
            reason: reason.into()
        })
    );
    assert_eq!(sim.stats().requests, Default::default(), "no API call");
    sim.shutdown().await;
}

#[tokio::test]
async fn an_ambiguous_cluster_makes_the_binary_refuse_to_start_with_exit_2() {
    let sim = start_cluster(cluster(true, 2, false)).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_telo-runner"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUNNER_BACKEND", "kubernetes")
        .env("KUBECONFIG", &kubeconfig)
        .env("RUNNER_SELF_URL", "http://runner:8062")
        .env("RUNNER_BASE_IMAGE_CATALOG_ENABLED", "false")
        .env("SESSION_ROUTING_BASE_DOMAIN", DOMAIN)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(WAIT, output).await.unwrap().unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!("{CANNOT_CHOOSE_2}\n")
    );
    assert!(output.stdout.is_empty(), "nothing was served");
    sim.shutdown().await;
}

// --- sessions on a routed runner ---

fn gateway_cluster() -> KubeSimBuilder {
    common::cluster().gateway_api(true).namespace(GATEWAY_NS)
}

/// The simulated controller's GatewayClass and a Gateway `gateway-system/public`
/// whose one listener admits routes from namespaces `from`.
fn seed_gateway(sim: &KubeSim, from: &str) {
    sim.seed_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "sim"},
        "spec": {"controllerName": "kube-sim.dev/gateway-controller"},
    }))
    .unwrap();
    sim.seed_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "public", "namespace": GATEWAY_NS},
        "spec": {"gatewayClassName": "sim", "listeners": [{
            "name": "https", "protocol": "HTTP", "port": 80, "hostname": format!("*.{DOMAIN}"),
            "allowedRoutes": {"namespaces": {"from": from}},
        }]},
    }))
    .unwrap();
}

const GATEWAY_ENV: &[(&str, &str)] = &[
    ("SESSION_ROUTING_BASE_DOMAIN", DOMAIN),
    ("SESSION_GATEWAY_NAME", "public"),
    ("SESSION_GATEWAY_NAMESPACE", GATEWAY_NS),
];

const INGRESS_ENV: &[(&str, &str)] = &[
    ("SESSION_ROUTING_BASE_DOMAIN", DOMAIN),
    ("SESSION_ROUTING_MODE", "ingress"),
    ("SESSION_INGRESS_CLASS", "nginx"),
];

fn session_body(ports: Value) -> Value {
    let listen: Vec<Value> = ports
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["protocol"] == "tcp")
        .map(|p| p["port"].clone())
        .collect();
    // It says it is up, as a kernel does, so the session is announced
    // `running` even without a port to answer on.
    let mut body = start_body(json!({"stdout": ["up"], "listen": listen}));
    body["ports"] = ports;
    body
}

fn tcp_ports(ports: &[u16]) -> Value {
    json!(
        ports
            .iter()
            .map(|port| json!({"port": port, "protocol": "tcp"}))
            .collect::<Vec<_>>()
    )
}

fn host(port: u16, id: &str) -> String {
    format!("{port}-{id}.{DOMAIN}")
}

fn route_frames(frames: &[SseFrame]) -> Vec<Value> {
    frames
        .iter()
        .filter(|frame| frame.event.as_deref() == Some("route"))
        .map(SseFrame::json)
        .collect()
}

fn is_route_state(frame: &SseFrame, state: &str) -> bool {
    frame.event.as_deref() == Some("route") && frame.json()["state"] == state
}

/// Every event from the start of the session until `settled` route events
/// have reached a final state (`programmed` or `unprogrammed`).
async fn events_until_routes_settle(runner: &Runner, id: &str, settled: usize) -> Vec<SseFrame> {
    let mut events = runner.events(id, &[]).await;
    let mut done = 0;
    tokio::time::timeout(
        WAIT,
        events.events_until(|frame| {
            if is_route_state(frame, "programmed") || is_route_state(frame, "unprogrammed") {
                done += 1;
            }
            done == settled
        }),
    )
    .await
    .expect("the routes settled")
}

fn running_endpoints(frames: &[SseFrame]) -> Value {
    let running = frames
        .iter()
        .find(|frame| frame.status_kind().as_deref() == Some("running"))
        .expect("a running status");
    running.json()["status"]["endpoints"].clone()
}

fn pod_uid(sim: &KubeSim, id: &str) -> String {
    let pod: Pod = sim.get(NS, &format!("telo-run-{id}")).unwrap();
    pod.metadata.uid.unwrap()
}

/// The object is owned by the session pod, and so goes with it.
fn assert_owned_by_pod(meta: &Value, sim: &KubeSim, id: &str) {
    assert_eq!(
        meta["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Pod", "name": format!("telo-run-{id}"),
                "uid": pod_uid(sim, id), "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(meta["labels"]["telo.run/session-id"], json!(id));
    assert_eq!(
        meta["labels"]["app.kubernetes.io/managed-by"],
        json!("telo-k8s-runner")
    );
}

#[tokio::test]
async fn with_the_gateway_api_each_port_gets_a_programmed_httproute_and_a_url() {
    let runner = Runner::start_kube(gateway_cluster(), GATEWAY_ENV).await;
    let sim = runner.sim.as_ref().unwrap();
    seed_gateway(sim, "All");
    let id = runner
        .create_body(session_body(tcp_ports(&[8080, 9090])))
        .await;
    let frames = events_until_routes_settle(&runner, &id, 2).await;

    assert_eq!(
        running_endpoints(&frames),
        json!([
            {"host": host(8080, &id), "port": 8080, "protocol": "tcp", "url": format!("https://{}", host(8080, &id))},
            {"host": host(9090, &id), "port": 9090, "protocol": "tcp", "url": format!("https://{}", host(9090, &id))},
        ])
    );
    // Route events follow the `running` status that announced the hosts.
    let running_at = frames
        .iter()
        .position(|f| f.status_kind().as_deref() == Some("running"))
        .unwrap();
    let first_route_at = frames
        .iter()
        .position(|f| f.event.as_deref() == Some("route"))
        .unwrap();
    assert!(running_at < first_route_at);
    assert_routes_settle(
        &route_frames(&frames),
        &[(8080, &id), (9090, &id)],
        |_| json!({"state": "programmed"}),
    );

    for port in [8080, 9090] {
        let route = sim
            .get_value("httproutes", NS, &format!("telo-run-{id}-{port}"))
            .unwrap();
        assert_eq!(route["apiVersion"], "gateway.networking.k8s.io/v1");
        assert_owned_by_pod(&route["metadata"], sim, &id);
        assert_eq!(
            route["spec"]["parentRefs"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": GATEWAY_NS}])
        );
        assert_eq!(route["spec"]["hostnames"], json!([host(port, &id)]));
        let rules = route["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0]["matches"],
            json!([{"path": {"type": "PathPrefix", "value": "/"}}])
        );
        let backends = rules[0]["backendRefs"].as_array().unwrap();
        assert_eq!(backends.len(), 1);
        assert_eq!(
            (&backends[0]["name"], &backends[0]["port"]),
            (&json!(format!("telo-run-{id}")), &json!(port))
        );
    }
    let service: Service = sim.get(NS, &format!("telo-run-{id}")).unwrap();
    let service = serde_json::to_value(service).unwrap();
    assert_owned_by_pod(&service["metadata"], sim, &id);
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "p8080", "port": 8080, "protocol": "TCP", "targetPort": 8080},
               {"name": "p9090", "port": 9090, "protocol": "TCP", "targetPort": 9090}])
    );

    // One shared watch follows every route; nothing polls a route's status.
    let stats = sim.stats();
    assert_eq!(stats.watches.get("httproutes"), Some(&1));
    assert_eq!(
        stats.requests.get("get").and_then(|r| r.get("httproutes")),
        None
    );

    // Stopping the session deletes the pod; the cluster collects the rest.
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert!(status.is_success());
    for (plural, name) in [
        ("services", format!("telo-run-{id}")),
        ("httproutes", format!("telo-run-{id}-8080")),
        ("httproutes", format!("telo-run-{id}-9090")),
    ] {
        sim.wait_for_deletion(plural, NS, &name, WAIT)
            .await
            .unwrap_or_else(|err| panic!("{plural}/{name} collected with the pod: {err}"));
    }
    runner.stop().await;
}

/// Every host is `pending` first, in port order, then settles once as `last`
/// says (the controller may answer for the hosts in any order).
fn assert_routes_settle(events: &[Value], hosts: &[(u16, &str)], last: impl Fn(u16) -> Value) {
    let pending: Vec<Value> = hosts
        .iter()
        .map(|(port, id)| json!({"type": "route", "app": "app", "host": host(*port, id), "port": port, "state": "pending"}))
        .collect();
    assert_eq!(events[..hosts.len()], pending[..], "{events:#?}");
    let mut settled: Vec<Value> = events[hosts.len()..].to_vec();
    settled.sort_by_key(|event| event["port"].as_u64());
    let expected: Vec<Value> = hosts
        .iter()
        .map(|(port, id)| {
            let mut event =
                json!({"type": "route", "app": "app", "host": host(*port, id), "port": port});
            for (key, value) in last(*port).as_object().unwrap() {
                event[key] = value.clone();
            }
            event
        })
        .collect();
    assert_eq!(settled, expected, "{events:#?}");
}

#[tokio::test]
async fn in_ingress_mode_a_session_publishes_one_ingress_with_a_rule_per_port() {
    let runner =
        Runner::start_kube(common::cluster().ingress_class("nginx", false), INGRESS_ENV).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner
        .create_body(session_body(tcp_ports(&[8080, 9090])))
        .await;
    let frames = events_until_routes_settle(&runner, &id, 2).await;
    assert_eq!(
        running_endpoints(&frames)
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["url"].clone())
            .collect::<Vec<_>>(),
        vec![
            json!(format!("https://{}", host(8080, &id))),
            json!(format!("https://{}", host(9090, &id)))
        ]
    );
    assert_routes_settle(
        &route_frames(&frames),
        &[(8080, &id), (9090, &id)],
        |_| json!({"state": "programmed"}),
    );

    let ingress: Ingress = sim.get(NS, &format!("telo-run-{id}")).unwrap();
    let ingress = serde_json::to_value(ingress).unwrap();
    assert_owned_by_pod(&ingress["metadata"], sim, &id);
    assert_eq!(ingress["spec"]["ingressClassName"], "nginx");
    assert_eq!(ingress["spec"].get("tls"), None, "no secret configured");
    let rule = |port: u16| {
        json!({"host": host(port, &id), "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": format!("telo-run-{id}"), "port": {"number": port}}}}]}})
    };
    assert_eq!(ingress["spec"]["rules"], json!([rule(8080), rule(9090)]));
    assert_eq!(
        sim.stats().watches.get("ingresses"),
        Some(&1),
        "one shared watch"
    );

    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert!(status.is_success());
    for plural in ["ingresses", "services"] {
        sim.wait_for_deletion(plural, NS, &format!("telo-run-{id}"), WAIT)
            .await
            .unwrap();
    }
    runner.stop().await;
}

#[tokio::test]
async fn a_route_no_listener_admits_is_unprogrammed_with_the_controllers_reason() {
    let runner = Runner::start_kube(gateway_cluster(), GATEWAY_ENV).await;
    let sim = runner.sim.as_ref().unwrap();
    // Routes live in the session namespace; this listener only admits its own.
    seed_gateway(sim, "Same");
    let id = runner.create_body(session_body(tcp_ports(&[8080]))).await;
    let frames = events_until_routes_settle(&runner, &id, 1).await;
    assert_routes_settle(&route_frames(&frames), &[(8080, &id)], |_| {
        json!({"state": "unprogrammed",
               "reason": "NotAllowedByListeners: No listeners included by this parent ref allowed this attachment."})
    });
    // Reported, never fatal.
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(snapshot["status"]["kind"], "running");
    runner.stop().await;
}

#[tokio::test]
async fn an_httproute_nobody_claims_is_unprogrammed_after_the_ready_timeout() {
    let runner = Runner::start_kube(
        gateway_cluster().gateway_controller(false),
        &[
            GATEWAY_ENV[0],
            GATEWAY_ENV[1],
            GATEWAY_ENV[2],
            ("SESSION_GATEWAY_SECTION_NAME", "https"),
            ("SESSION_ROUTE_READY_TIMEOUT_SECONDS", "1"),
        ],
    )
    .await;
    seed_gateway(runner.sim.as_ref().unwrap(), "All");
    let id = runner.create_body(session_body(tcp_ports(&[8080]))).await;
    let frames = events_until_routes_settle(&runner, &id, 1).await;
    assert_routes_settle(&route_frames(&frames), &[(8080, &id)], |_| {
        json!({"state": "unprogrammed",
               "reason": "no controller claimed the session HTTPRoute for Gateway 'gateway-system/public' (listener 'https'). Check the Gateway exists, is programmed, and that a listener admits routes from namespace 'telo-sessions' (spec.listeners[].allowedRoutes.namespaces)."})
    });
    runner.stop().await;
}

#[tokio::test]
async fn an_ingress_nobody_claims_is_unprogrammed_and_programmed_once_a_controller_appears() {
    let mut env = INGRESS_ENV.to_vec();
    env.push(("SESSION_ROUTE_READY_TIMEOUT_SECONDS", "1"));
    let runner = Runner::start_kube(
        common::cluster()
            .ingress_class("nginx", false)
            .ingress_controller(false),
        &env,
    )
    .await;
    let id = runner.create_body(session_body(tcp_ports(&[8080]))).await;
    let mut events = runner.events(&id, &[]).await;
    let unclaimed = tokio::time::timeout(
        WAIT,
        events.events_until(|frame| is_route_state(frame, "unprogrammed")),
    )
    .await
    .unwrap();
    assert_eq!(
        route_frames(&unclaimed).last().unwrap()["reason"],
        "no ingress controller claimed the session Ingress for class 'nginx'. Check that an Ingress controller is installed and watching namespace 'telo-sessions'."
    );
    // The truth keeps being told: a controller that shows up late programs it.
    runner.sim.as_ref().unwrap().set_ingress_controller(true);
    let late = tokio::time::timeout(
        WAIT,
        events.events_until(|frame| is_route_state(frame, "programmed")),
    )
    .await
    .unwrap();
    assert_eq!(
        route_frames(&late).last().unwrap(),
        &json!({"type": "route", "app": "app", "host": host(8080, &id), "port": 8080, "state": "programmed"})
    );
    runner.stop().await;
}

#[tokio::test]
async fn a_session_without_ports_creates_no_routing_object() {
    let runner =
        Runner::start_kube(common::cluster().ingress_class("nginx", false), INGRESS_ENV).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create_body(session_body(json!([]))).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    assert_eq!(running_endpoints(&frames), json!([]));
    // Routes are published before `running`: none means none.
    assert!(sim.get::<Service>(NS, &format!("telo-run-{id}")).is_none());
    assert!(sim.get::<Ingress>(NS, &format!("telo-run-{id}")).is_none());
    let creates = sim
        .stats()
        .requests
        .get("create")
        .cloned()
        .unwrap_or_default();
    assert_eq!(creates.get("services"), None);
    assert_eq!(creates.get("ingresses"), None);
    runner.stop().await;
}

#[tokio::test]
async fn udp_ports_are_on_the_service_but_get_no_route_or_url() {
    let runner =
        Runner::start_kube(common::cluster().ingress_class("nginx", false), INGRESS_ENV).await;
    let sim = runner.sim.as_ref().unwrap();
    let ports = json!([{"port": 8080, "protocol": "tcp"}, {"port": 8080, "protocol": "udp"}, {"port": 5353, "protocol": "udp"}]);
    let id = runner.create_body(session_body(ports)).await;
    let frames = events_until_routes_settle(&runner, &id, 1).await;
    assert_eq!(
        running_endpoints(&frames),
        json!([
            {"host": host(8080, &id), "port": 8080, "protocol": "tcp", "url": format!("https://{}", host(8080, &id))},
            {"host": "", "port": 8080, "protocol": "udp"},
            {"host": "", "port": 5353, "protocol": "udp"},
        ])
    );
    assert_routes_settle(
        &route_frames(&frames),
        &[(8080, &id)],
        |_| json!({"state": "programmed"}),
    );
    let service: Service = sim.get(NS, &format!("telo-run-{id}")).unwrap();
    let ports: Vec<(String, i32, String)> = service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port, p.protocol.unwrap()))
        .collect();
    assert_eq!(
        ports,
        [
            ("p8080".to_owned(), 8080, "TCP".to_owned()),
            ("p8080u".to_owned(), 8080, "UDP".to_owned()),
            ("p5353".to_owned(), 5353, "UDP".to_owned()),
        ]
    );
    let ingress: Ingress = sim.get(NS, &format!("telo-run-{id}")).unwrap();
    assert_eq!(ingress.spec.unwrap().rules.unwrap().len(), 1);
    runner.stop().await;
}

#[tokio::test]
async fn a_route_that_cannot_be_published_is_reported_and_the_session_runs_on() {
    let runner =
        Runner::start_kube(common::cluster().ingress_class("nginx", false), INGRESS_ENV).await;
    let sim = runner.sim.as_ref().unwrap();
    sim.deny(Denial {
        verb: "create".into(),
        resource: "ingresses".into(),
        namespace: None,
        user: None,
    });
    let id = runner
        .create_body(session_body(tcp_ports(&[8080, 9090])))
        .await;
    let frames = events_until_routes_settle(&runner, &id, 2).await;
    let reason = "could not publish the session route: the runner is not permitted to do this (Forbidden, HTTP 403). The cluster operator must check the runner's RBAC.";
    assert_eq!(
        route_frames(&frames),
        vec![
            json!({"type": "route", "app": "app", "host": host(8080, &id), "port": 8080, "state": "unprogrammed", "reason": reason}),
            json!({"type": "route", "app": "app", "host": host(9090, &id), "port": 9090, "state": "unprogrammed", "reason": reason}),
        ]
    );
    let mut socket = runner.io(&id, "").await;
    test_support::ws::read_until_output(&mut socket, &format!("\r\n[runner] {reason}\r\n")).await;
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(snapshot["status"]["kind"], "running");
    runner.stop().await;
}

#[tokio::test]
async fn a_logs_only_runner_publishes_nothing_and_reports_hostless_endpoints() {
    let runner = Runner::start_kube(common::cluster().ingress_class("nginx", true), &[]).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create_body(session_body(tcp_ports(&[8080]))).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    assert_eq!(
        running_endpoints(&frames),
        json!([{"host": "", "port": 8080, "protocol": "tcp"}])
    );
    assert!(sim.get::<Service>(NS, &format!("telo-run-{id}")).is_none());
    assert_eq!(sim.stats().watches.get("ingresses"), None, "no route watch");
    runner.stop().await;
}

#[tokio::test]
async fn create_or_replace_replaces_a_leftover_and_keeps_its_cluster_ip() {
    let sim = common::cluster().start().await.unwrap();
    let services: Api<Service> = Api::namespaced(sim.client(), NS);
    let service = |port: i32| -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "telo-run-abc234defghi", "namespace": NS},
            "spec": {"selector": {"telo.run/session-id": "abc234defghi"},
                     "ports": [{"name": format!("p{port}"), "port": port, "targetPort": port}]},
        }))
        .unwrap()
    };
    let leftover = create_or_replace(&services, &service(8080), keep_allocated_fields)
        .await
        .unwrap();
    let cluster_ip = leftover.spec.as_ref().unwrap().cluster_ip.clone();
    assert!(cluster_ip.is_some(), "the apiserver allocated one");
    let replaced = create_or_replace(&services, &service(9090), keep_allocated_fields)
        .await
        .unwrap();
    let spec = replaced.spec.unwrap();
    assert_eq!(spec.ports.unwrap()[0].port, 9090);
    assert_eq!(spec.cluster_ip, cluster_ip);
    assert_ne!(
        replaced.metadata.resource_version,
        leftover.metadata.resource_version
    );
    sim.shutdown().await;
}

/// A runner process on `kubeconfig`, killed (not stopped) when dropped — the
/// way a runner dies, leaving its sessions to the next one.
struct RunnerProcess {
    child: std::process::Child,
    base: String,
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn spawn_runner(kubeconfig: &std::path::Path, env: &[(&str, &str)]) -> RunnerProcess {
    // Pods reach the runner at the node's address.
    let host = common::node_address(kubeconfig).await;
    let port = {
        let listener = std::net::TcpListener::bind((host, 0)).unwrap();
        listener.local_addr().unwrap().port()
    };
    let base = format!("http://{host}:{port}");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_telo-runner"));
    command
        .args(["serve", "--listen", &format!("{host}:{port}")])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUNNER_BACKEND", "kubernetes")
        .env("KUBECONFIG", kubeconfig)
        .env("RUNNER_SELF_URL", &base)
        .env("RUNNER_BASE_IMAGE_CATALOG_ENABLED", "false")
        .env("RUNNER_IMAGE", "telorun/node:0-slim")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let process = RunnerProcess { child, base };
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        line
    })
    .await
    .unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    process
}

#[tokio::test]
async fn an_adopted_session_republishes_its_routes_in_place_and_reports_them_again() {
    let sim = gateway_cluster()
        .fake_telo(test_support::fake_telo::fake_telo_path())
        .start()
        .await
        .unwrap();
    seed_gateway(&sim, "All");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();

    let first = spawn_runner(&kubeconfig, GATEWAY_ENV).await;
    let (status, created) = runner_core::http_client::client()
        .post(format!("{}/v1/sessions", first.base))
        .json(&session_body(tcp_ports(&[8080])))
        .send()
        .await
        .map(|r| (r.status(), r))
        .unwrap();
    assert!(status.is_success());
    let id = created.json::<Value>().await.unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut events = test_support::sse::SseStream::connect(
        &format!("{}/v1/sessions/{id}/events", first.base),
        &[],
    )
    .await;
    events
        .events_until(|frame| is_route_state(frame, "programmed"))
        .await;
    let route_name = format!("telo-run-{id}-8080");
    let before = sim.get_value("httproutes", NS, &route_name).unwrap();
    drop(first);

    let mut env: std::collections::HashMap<String, String> = GATEWAY_ENV
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.insert("RUNNER_BACKEND".into(), "kubernetes".into());
    env.insert(
        "KUBECONFIG".into(),
        kubeconfig.to_string_lossy().into_owned(),
    );
    env.insert("RUNNER_SELF_URL".into(), "http://127.0.0.1:1".into());
    env.insert("RUNNER_BASE_IMAGE_CATALOG_ENABLED".into(), "false".into());
    let second = telo_runner::server::RunningService::start(&env, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::time::timeout(WAIT, second.recovered())
        .await
        .unwrap();
    let mut events = test_support::sse::SseStream::connect(
        &format!("{}/v1/sessions/{id}/events", second.base_url()),
        &[],
    )
    .await;
    let frames = tokio::time::timeout(
        WAIT,
        events.events_until(|frame| is_route_state(frame, "programmed")),
    )
    .await
    .unwrap();
    let adopted: Vec<Value> = route_frames(&frames)
        .into_iter()
        .skip_while(|event| event["state"] == "programmed")
        .collect();
    assert_eq!(
        adopted,
        vec![
            json!({"type": "route", "app": "app", "host": host(8080, &id), "port": 8080, "state": "pending"}),
            json!({"type": "route", "app": "app", "host": host(8080, &id), "port": 8080, "state": "programmed"}),
        ]
    );
    // Replaced in place (same object, newer version), still owned by the pod.
    let after = sim.get_value("httproutes", NS, &route_name).unwrap();
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_ne!(
        after["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    assert_owned_by_pod(&after["metadata"], &sim, &id);
    second.stop().await.unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn routes_whose_status_cannot_be_read_say_so_instead_of_blaming_the_controller() {
    let runner = Runner::start_kube(
        gateway_cluster(),
        &[
            GATEWAY_ENV[0],
            GATEWAY_ENV[1],
            GATEWAY_ENV[2],
            ("SESSION_ROUTE_READY_TIMEOUT_SECONDS", "1"),
        ],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    seed_gateway(sim, "All");
    // The shared route watch cannot list what it follows.
    sim.deny(Denial {
        verb: "list".into(),
        resource: "httproutes".into(),
        namespace: None,
        user: None,
    });
    let id = runner.create_body(session_body(tcp_ports(&[8080]))).await;
    let frames = events_until_routes_settle(&runner, &id, 1).await;
    let reason = "the runner is not permitted to do this (Forbidden, HTTP 403). The cluster operator must check the runner's RBAC.";
    assert_routes_settle(
        &route_frames(&frames),
        &[(8080, &id)],
        |_| json!({"state": "unprogrammed", "reason": format!("route status could not be read: {reason}")}),
    );
    let mut socket = runner.io(&id, "").await;
    test_support::ws::read_until_output(
        &mut socket,
        &format!("\r\n[runner] could not read route status: {reason}\r\n"),
    )
    .await;
    runner.stop().await;
}

/// The ports of the rules of `ingress`.
fn rule_ports(ingress: &Value) -> Vec<u64> {
    ingress["spec"]["rules"]
        .as_array()
        .map(|rules| {
            rules
                .iter()
                .filter_map(|rule| {
                    rule["http"]["paths"][0]["backend"]["service"]["port"]["number"].as_u64()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_a_watch_apps_kernel_resolves_is_routed_live() {
    let mut env = INGRESS_ENV.to_vec();
    env.push(("RUNNER_WATCH_SESSIONS", "true"));
    let runner = Runner::start_kube(common::cluster().ingress_class("nginx", false), &env).await;
    let sim = runner.sim.as_ref().unwrap();
    let first = test_support::free_port();
    let second = if first == 65535 { first - 1 } else { first + 1 };
    // No port is declared: the kernel resolves the one its app listens on.
    let id = runner
        .create_body(common::watch::watch_body(
            json!({"listen": [first], "stdout": ["up"]}),
        ))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.event.as_deref() == Some("endpoints"))
        .await;
    let added = &frames.last().unwrap().json()["added"][0];
    assert_eq!(added["port"], first);
    assert_eq!(added["url"], format!("https://{}", host(first, &id)));
    let name = format!("telo-run-{id}");
    let ingress = sim
        .wait_for_value(
            "ingresses",
            NS,
            &name,
            |i| rule_ports(i) == [u64::from(first)],
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(ingress["spec"]["rules"][0]["host"], host(first, &id));
    sim.wait_for_value(
        "services",
        NS,
        &name,
        |s| s["spec"]["ports"][0]["port"] == first,
        WAIT,
    )
    .await
    .unwrap();

    // The app moves to another port: the routes follow, the pod stays.
    let owner = |ingress: &Value| ingress["metadata"]["ownerReferences"][0]["uid"].clone();
    let pod_before = owner(&ingress);
    assert!(pod_before.is_string(), "{ingress}");
    let (status, body) = common::watch::request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "telo.yaml", "content": common::watch::manifest(json!({"listen": [second], "stdout": ["moved"]}))}]})),
    )
    .await;
    assert!(status.is_success(), "{body}");
    let frames = events
        .events_until(|f| {
            f.event.as_deref() == Some("endpoints") && f.json()["added"][0]["port"] == second
        })
        .await;
    let moved = frames.last().unwrap().json();
    assert_eq!(
        moved["added"][0]["url"],
        format!("https://{}", host(second, &id))
    );
    assert_eq!(moved["removed"][0]["port"], first);
    let ingress = sim
        .wait_for_value(
            "ingresses",
            NS,
            &name,
            |i| rule_ports(i) == [u64::from(second)],
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(owner(&ingress), pod_before, "no pod was recreated");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    events.events_until_end().await;
    runner.stop().await;
}
