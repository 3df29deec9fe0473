//! Kubernetes protobuf request bodies over HTTP: what client-go's typed
//! clients (Helm's release storage among them) send, and how kube-sim
//! answers what it cannot decode or encode.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{Value, json};
use support::*;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

// A minimal protobuf encoder for the bodies below.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(field: u32, b: &[u8], out: &mut Vec<u8>) {
    varint((u64::from(field) << 3) | 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

fn map_entry(field: u32, k: &str, v: &[u8], out: &mut Vec<u8>) {
    let mut e = Vec::new();
    bytes_field(1, k.as_bytes(), &mut e);
    bytes_field(2, v, &mut e);
    bytes_field(field, &e, out);
}

/// `k8s\0` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut tm = Vec::new();
    bytes_field(1, api_version.as_bytes(), &mut tm);
    bytes_field(2, kind.as_bytes(), &mut tm);
    let mut out = b"k8s\0".to_vec();
    bytes_field(1, &tm, &mut out);
    bytes_field(2, raw, &mut out);
    out
}

/// A Secret with `metadata.name`, optional `resourceVersion`, one label,
/// one data key and a type, as Go's marshaller lays it out.
fn secret(name: &str, rv: &str, value: &[u8]) -> Vec<u8> {
    let mut meta = Vec::new();
    bytes_field(1, name.as_bytes(), &mut meta);
    bytes_field(2, b"", &mut meta);
    bytes_field(3, b"", &mut meta);
    bytes_field(6, rv.as_bytes(), &mut meta);
    map_entry(11, "owner", b"helm", &mut meta);
    let mut raw = Vec::new();
    bytes_field(1, &meta, &mut raw);
    map_entry(2, "release", value, &mut raw);
    bytes_field(3, b"helm.sh/release.v1", &mut raw);
    envelope("v1", "Secret", &raw)
}

async fn send(
    sim: &kube_sim::KubeSim,
    method: reqwest::Method,
    path: &str,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> (u16, Option<String>, Value) {
    let resp = sim
        .http_client()
        .request(method, format!("{}{path}", sim.url()))
        .header("content-type", content_type)
        .header("accept", accept)
        .body(body)
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    (
        code,
        ct,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

const SECRETS: &str = "/api/v1/namespaces/default/secrets";
const TYPED_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";

#[tokio::test]
async fn a_secret_in_protobuf_is_created_updated_and_deleted_and_answered_in_json() {
    let sim = sim().await;
    let (code, ct, created) = send(
        &sim,
        reqwest::Method::POST,
        SECRETS,
        PROTOBUF,
        TYPED_ACCEPT,
        secret("rel", "", b"\x00\x01v1"),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(ct.as_deref(), Some("application/json"));
    assert_eq!(created["kind"], "Secret");
    assert_eq!(created["data"], json!({"release": "AAF2MQ=="}));
    assert_eq!(created["type"], "helm.sh/release.v1");
    assert_eq!(created["metadata"]["labels"], json!({"owner": "helm"}));
    assert!(created["metadata"].get("generateName").is_none());
    let rv = created["metadata"]["resourceVersion"].as_str().unwrap();

    let (code, listed) = get(&sim, &format!("{SECRETS}?labelSelector=owner%3Dhelm")).await;
    assert_eq!(code, 200);
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);

    let (code, _, updated) = send(
        &sim,
        reqwest::Method::PUT,
        &format!("{SECRETS}/rel"),
        PROTOBUF,
        TYPED_ACCEPT,
        secret("rel", rv, b"v2"),
    )
    .await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["data"], json!({"release": "djI="}));

    // A stale resourceVersion in protobuf conflicts like one in JSON.
    let (code, _, stale) = send(
        &sim,
        reqwest::Method::PUT,
        &format!("{SECRETS}/rel"),
        PROTOBUF,
        TYPED_ACCEPT,
        secret("rel", rv, b"v3"),
    )
    .await;
    assert_eq!(code, 409, "{stale}");

    // DeleteOptions in protobuf, as client-go's typed Delete sends them.
    let mut opts = Vec::new();
    bytes_field(4, b"Background", &mut opts);
    let (code, _, deleted) = send(
        &sim,
        reqwest::Method::DELETE,
        &format!("{SECRETS}/rel"),
        PROTOBUF,
        TYPED_ACCEPT,
        envelope("v1", "DeleteOptions", &opts),
    )
    .await;
    assert_eq!(code, 200, "{deleted}");
    assert_eq!(get(&sim, &format!("{SECRETS}/rel")).await.0, 404);
}

#[tokio::test]
async fn protobuf_for_a_kind_without_a_schema_is_415_and_garbage_is_400() {
    let sim = sim().await;
    let (code, _, body) = send(
        &sim,
        reqwest::Method::POST,
        "/api/v1/namespaces/default/pods",
        PROTOBUF,
        TYPED_ACCEPT,
        envelope("v1", "Pod", &[]),
    )
    .await;
    assert_eq!(code, 415, "{body}");
    assert_eq!(body["reason"], "UnsupportedMediaType");
    assert_eq!(
        body["message"],
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml"
    );

    let (code, _, body) = send(
        &sim,
        reqwest::Method::POST,
        SECRETS,
        PROTOBUF,
        TYPED_ACCEPT,
        b"{\"kind\":\"Secret\"}".to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["reason"], "BadRequest");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("the object provided is unrecognized (must be of type Secret): provided data does not appear to be a protobuf message"),
        "{body}"
    );

    // A decodable kind sent to another kind's endpoint.
    let (code, _, body) = send(
        &sim,
        reqwest::Method::POST,
        "/api/v1/namespaces/default/configmaps",
        PROTOBUF,
        TYPED_ACCEPT,
        secret("x", "", b""),
    )
    .await;
    assert_eq!(code, 400, "{body}");
}

#[tokio::test]
async fn unknown_body_types_list_protobuf_for_built_in_kinds_only() {
    let sim = builder().gateway_api(true).start().await.unwrap();
    let (code, _, body) = send(
        &sim,
        reqwest::Method::POST,
        SECRETS,
        "text/plain",
        "application/json",
        b"x".to_vec(),
    )
    .await;
    assert_eq!(code, 415);
    assert_eq!(
        body["message"],
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
    );
    let (code, _, body) = send(
        &sim,
        reqwest::Method::POST,
        "/apis/gateway.networking.k8s.io/v1/namespaces/default/httproutes",
        PROTOBUF,
        "application/json",
        envelope("gateway.networking.k8s.io/v1", "HTTPRoute", &[]),
    )
    .await;
    assert_eq!(code, 415);
    assert_eq!(
        body["message"],
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml"
    );
}

#[tokio::test]
async fn a_client_accepting_only_protobuf_gets_406() {
    let sim = sim().await;
    let resp = sim
        .http_client()
        .get(format!("{}{SECRETS}", sim.url()))
        .header("accept", PROTOBUF)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 406);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["reason"], "NotAcceptable");
    assert_eq!(
        body["message"],
        "only the following media types are accepted: application/json"
    );
    let resp = sim
        .http_client()
        .get(format!("{}{SECRETS}", sim.url()))
        .header("accept", TYPED_ACCEPT)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}
