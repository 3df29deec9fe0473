//! Authentication: every route wants the bearer token kube-sim writes into
//! its kubeconfig; anything else is the apiserver's `401 Unauthorized`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, AttachParams, ListParams, PostParams, WatchEvent, WatchParams};
use rstest::rstest;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// What a request presents.
#[derive(Debug, Clone, Copy)]
enum Credential {
    Nothing,
    WrongToken,
    /// The right token without the `Bearer` scheme.
    BareToken,
}

impl Credential {
    fn header(self, sim: &kube_sim::KubeSim) -> Option<String> {
        match self {
            Credential::Nothing => None,
            Credential::WrongToken => Some(format!("Bearer {}x", sim.token())),
            Credential::BareToken => Some(sim.token().to_owned()),
        }
    }
}

fn is_unauthorized_status(body: &Value) -> bool {
    *body
        == json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
}

async fn raw(
    sim: &kube_sim::KubeSim,
    credential: Credential,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = sim
        .anonymous_http_client()
        .request(method, format!("{}{path}", sim.url()));
    if let Some(value) = credential.header(sim) {
        req = req.header("authorization", value);
    }
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let resp = req.send().await.unwrap();
    let code = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A pod whose script would run on the host, as a local workload tried.
fn host_script_pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:stable",
            "command": ["sh", "-c", "touch /tmp/kube-sim-owned; sleep 60"]}]}})
}

#[rstest]
#[case::list_secrets(reqwest::Method::GET, "/api/v1/namespaces/default/secrets")]
#[case::list_all_secrets(reqwest::Method::GET, "/api/v1/secrets")]
#[case::get_a_secret(reqwest::Method::GET, "/api/v1/namespaces/default/secrets/checkpoint")]
#[case::watch_pods(
    reqwest::Method::GET,
    "/api/v1/namespaces/default/pods?watch=true&resourceVersion=0"
)]
#[case::create_a_pod(reqwest::Method::POST, "/api/v1/namespaces/default/pods")]
#[case::logs(reqwest::Method::GET, "/api/v1/namespaces/default/pods/target/log")]
#[case::attach_without_upgrade(
    reqwest::Method::GET,
    "/api/v1/namespaces/default/pods/target/attach?stdout=true"
)]
#[case::delete_a_pod(reqwest::Method::DELETE, "/api/v1/namespaces/default/pods/target")]
#[case::discovery(reqwest::Method::GET, "/api")]
#[case::version(reqwest::Method::GET, "/version")]
#[case::health(reqwest::Method::GET, "/livez")]
#[case::openapi(reqwest::Method::GET, "/openapi/v3")]
#[case::admin_stats(reqwest::Method::GET, "/_sim/stats")]
#[case::admin_faults(reqwest::Method::GET, "/_sim/faults")]
#[case::admin_fault_injection(reqwest::Method::POST, "/_sim/faults")]
#[case::admin_rbac(reqwest::Method::POST, "/_sim/rbac")]
#[case::admin_timeline(reqwest::Method::GET, "/_sim/timeline")]
#[tokio::test]
async fn a_request_without_the_kubeconfig_token_is_unauthorized(
    #[case] method: reqwest::Method,
    #[case] path: &str,
    #[values(Credential::Nothing, Credential::WrongToken, Credential::BareToken)]
    credential: Credential,
) {
    let sim = sim().await;
    sim.seed_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "checkpoint", "namespace": "default"}, "data": {"k": "c2VjcmV0"}}))
        .unwrap();
    let body = match (method.as_str(), path) {
        ("POST", "/_sim/faults") => Some(json!({"action": "clear"})),
        ("POST", "/_sim/rbac") => Some(json!({"verb": "*", "resource": "*"})),
        ("POST", _) => Some(host_script_pod("intruder")),
        _ => None,
    };
    let (code, body) = raw(&sim, credential, method.clone(), path, body).await;
    assert_eq!(code, 401, "{method} {path} with {credential:?}: {body}");
    assert!(is_unauthorized_status(&body), "{method} {path}: {body}");
    // Nothing the request asked for happened.
    assert!(sim.get::<Pod>("default", "intruder").is_none());
    assert!(sim.get::<Secret>("default", "checkpoint").is_some());
    Api::<ConfigMap>::namespaced(sim.client(), "default")
        .list(&ListParams::default())
        .await
        .expect("no denial was installed: the client with the token still lists");
}

#[rstest]
#[tokio::test]
async fn a_websocket_attach_without_the_token_is_refused_before_the_upgrade(
    #[values(Credential::Nothing, Credential::WrongToken)] credential: Credential,
) {
    let sim = sim().await;
    let url = format!(
        "wss://{}/api/v1/namespaces/default/pods/target/attach?container=c&stdin=true&stdout=true",
        sim.addr()
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    if let Some(value) = credential.header(&sim) {
        req.headers_mut()
            .insert("authorization", value.parse().unwrap());
    }
    match tokio_tungstenite::client_async(req, sim.connect_tls().await.unwrap()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 401);
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            assert!(is_unauthorized_status(&body), "{body}");
        }
        Err(other) => panic!("expected a 401 answer, got {other}"),
        Ok(_) => panic!("the attach was upgraded without the token"),
    }
}

#[tokio::test]
async fn a_client_built_from_the_written_kubeconfig_lists_watches_creates_and_attaches() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let rv = configmaps
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = configmaps
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let cm: ConfigMap = serde_json::from_value(app_configmap("echo", "  echo: true\n")).unwrap();
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let added = tokio::time::timeout(WAIT, events.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(added, Some(WatchEvent::Added(_))), "{added:?}");

    let pods: Api<Pod> = Api::default_namespaced(client);
    let pod: Pod = serde_json::from_value(pod_with_app("echo", "echo", false)).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    sim.wait_for::<Pod>(
        "default",
        "echo",
        |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
        WAIT,
    )
    .await
    .unwrap();
    let mut attached = pods
        .attach(
            "echo",
            &AttachParams::default()
                .container("session")
                .stdin(true)
                .stdout(true)
                .stderr(false),
        )
        .await
        .unwrap();
    let mut stdin = attached.stdin().unwrap();
    let mut stdout = attached.stdout().unwrap();
    stdin.write_all(b"ping\n").await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(WAIT, stdout.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..n], b"ping\n");
    stdin.write_all(b"exit\n").await.unwrap();
}

#[tokio::test]
async fn plain_http_is_not_served() {
    let sim = sim().await;
    let plain = format!("http://{}/api/v1/namespaces/default/secrets", sim.addr());
    let answer = reqwest::Client::new()
        .get(plain)
        .header("authorization", sim.authorization())
        .send()
        .await;
    assert!(answer.is_err(), "plain HTTP was answered: {answer:?}");
}

#[tokio::test]
async fn two_simulators_do_not_accept_each_others_tokens() {
    let a = sim().await;
    let b = sim().await;
    assert_ne!(a.token(), b.token());
    let resp = a
        .anonymous_http_client()
        .get(format!("{}/api/v1/namespaces/default/secrets", a.url()))
        .header("authorization", b.authorization())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}
