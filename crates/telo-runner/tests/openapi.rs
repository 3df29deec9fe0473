//! `GET /v1/openapi.json` against the live router: every documented operation
//! is routed, every route is documented, and the request schemas agree with
//! what the handlers accept.
#![allow(clippy::unwrap_used)]

mod common;

use common::Runner;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A runner with a one-app catalog, so the app route has something to start.
async fn runner_with_app(dir: &std::path::Path) -> Runner {
    let manifest = dir.join("demo.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: demo }\nfakeTelo:\n  exitCode: 0\n",
    )
    .unwrap();
    let fake = test_support::fake_telo::fake_telo_path();
    let apps = json!({"demo": {
        "image": "acme/demo:1",
        "command": [fake.to_string_lossy(), "run", manifest.to_string_lossy()],
    }})
    .to_string();
    Runner::start_with(&[("RUNNER_APPS", apps.as_str())]).await
}

async fn document(runner: &Runner) -> Value {
    let (status, doc) = runner.get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    doc
}

fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            found.push((path.clone(), method.to_ascii_uppercase()));
        }
    }
    found
}

#[tokio::test]
async fn every_documented_operation_is_routed() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with_app(dir.path()).await;
    let doc = document(&runner).await;
    let operations = operations(&doc);
    assert!(operations.len() >= 13, "{operations:?}");
    for (path, method) in operations {
        let concrete = path
            .replace("{id}", "throwaway000")
            .replace("{name}", "demo");
        let mut request = runner.client.request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            runner.url(&concrete),
        );
        if method == "POST" {
            request = request.json(&json!({}));
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(
            !(status == StatusCode::NOT_FOUND && body.contains("Route ")),
            "{method} {path} is documented but not routed: {body}"
        );
    }
    runner.stop().await;
}

#[tokio::test]
async fn every_route_of_the_router_is_documented_and_nothing_else() {
    let runner = Runner::start().await;
    let doc = document(&runner).await;
    let mut routed: Vec<(String, String)> = runner_core::http::ROUTES
        .iter()
        .flat_map(|route| {
            route
                .methods
                .iter()
                .map(|method| (route.path.to_owned(), (*method).to_owned()))
        })
        .collect();
    let mut documented = operations(&doc);
    routed.sort();
    documented.sort();
    assert_eq!(documented, routed);
    for (path, method) in &documented {
        let responses = &doc["paths"][path][method.to_ascii_lowercase()]["responses"];
        assert!(
            responses.as_object().is_some_and(|r| !r.is_empty()),
            "{method} {path} documents no response"
        );
    }
    runner.stop().await;
}

#[tokio::test]
async fn the_error_envelopes_are_documented() {
    let runner = Runner::start().await;
    let doc = document(&runner).await;
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["Error"]["required"], json!(["error", "message"]));
    assert_eq!(
        schemas["TermsRequired"]["required"],
        json!(["error", "terms"])
    );
    let create = &doc["paths"]["/v1/sessions"]["post"]["responses"];
    for status in ["201", "400", "401", "409", "413", "415", "428"] {
        assert!(
            create.get(status).is_some(),
            "POST /v1/sessions lacks {status}"
        );
    }
    let events = &doc["paths"]["/v1/sessions/{id}/events"]["get"]["responses"]["200"]["content"];
    assert!(events.get("text/event-stream").is_some());
    let kinds: Vec<&Value> = schemas["RunEvent"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|variant| &variant["properties"]["type"])
        .collect();
    assert!(kinds.contains(&&json!({"const": "route"})), "{kinds:?}");
    runner.stop().await;
}

/// The document's verdict on `body` for the request schema of `path`.
fn schema_accepts(doc: &Value, path: &str, body: &Value) -> bool {
    let schema =
        doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"].clone();
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": schema["$ref"],
        "components": doc["components"],
    });
    let validator = jsonschema::validator_for(&root).unwrap();
    validator.is_valid(body)
}

fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    base.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert(key.to_owned(), value);
    base
}

fn without(mut base: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    base.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key);
    base
}

#[tokio::test]
async fn the_request_schemas_agree_with_the_handlers() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with_app(dir.path()).await;
    let doc = document(&runner).await;
    let start = test_support::bundle::start_body(json!({"exitCode": 0}));
    let port = |port: Value, protocol: &str| json!([{"port": port, "protocol": protocol}]);
    let probe = json!({"config": {"image": "telorun/node:0-slim", "pullPolicy": "missing"}});
    // Coercible scalars (`"8080"` for a port) are accepted by the handlers
    // for compatibility but not by the schema, so the table avoids them.
    let cases: Vec<(&str, Value)> = vec![
        ("/v1/sessions", start.clone()),
        (
            "/v1/sessions",
            with(start.clone(), "/ports", port(json!(8080), "tcp")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/ports", port(json!(65535), "udp")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/ports", port(json!(0), "tcp")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/ports", port(json!(65536), "tcp")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/ports", port(json!(80.5), "tcp")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/ports", port(json!(80), "sctp")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/ports", json!([{"port": 80}])),
        ),
        (
            "/v1/sessions",
            with(
                start.clone(),
                "/config/registryUrl",
                json!("https://r.example"),
            ),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/config/registryUrl", json!("")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/config/pullPolicy", json!("sometimes")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/config/image", json!("")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/bundle/entryRelativePath", json!("")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/env", json!({"MODE": "dev"})),
        ),
        ("/v1/sessions", with(start.clone(), "/env", json!([]))),
        (
            "/v1/sessions",
            with(start.clone(), "/env", json!({"A=B": "x"})),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/inspect", json!("yes")),
        ),
        (
            "/v1/sessions",
            with(start.clone(), "/unknownField", json!(1)),
        ),
        ("/v1/sessions", without(start.clone(), "/bundle")),
        ("/v1/sessions", without(start.clone(), "/env")),
        ("/v1/sessions", without(start.clone(), "/config")),
        ("/v1/sessions", without(start.clone(), "/config/pullPolicy")),
        ("/v1/sessions", without(start.clone(), "/bundle/files")),
        ("/v1/sessions", json!([])),
        ("/v1/apps/{name}/sessions", json!({})),
        (
            "/v1/apps/{name}/sessions",
            json!({"env": {"MODE": "dev"}, "inspect": true}),
        ),
        (
            "/v1/apps/{name}/sessions",
            json!({"ports": port(json!(1), "udp")}),
        ),
        (
            "/v1/apps/{name}/sessions",
            json!({"ports": port(json!(70000), "tcp")}),
        ),
        ("/v1/apps/{name}/sessions", json!({"env": "MODE=dev"})),
        ("/v1/apps/{name}/sessions", json!({"inspect": "maybe"})),
        ("/v1/apps/{name}/sessions", json!("hello")),
        ("/v1/probe", probe.clone()),
        (
            "/v1/probe",
            with(probe.clone(), "/config/pullPolicy", json!("never")),
        ),
        (
            "/v1/probe",
            with(probe.clone(), "/config/pullPolicy", json!("sometimes")),
        ),
        ("/v1/probe", with(probe.clone(), "/config/image", json!(""))),
        ("/v1/probe", without(probe.clone(), "/config/image")),
        ("/v1/probe", json!({})),
        (
            "/v1/probe",
            json!({"config": probe["config"], "extra": true}),
        ),
    ];
    for (path, body) in cases {
        let expected = schema_accepts(&doc, path, &body);
        let (status, answer) = runner.post(&path.replace("{name}", "demo"), &body).await;
        let accepted = status.is_success();
        assert!(
            accepted || status == StatusCode::BAD_REQUEST,
            "POST {path} {body}: unexpected {status} {answer}"
        );
        assert_eq!(
            accepted,
            expected,
            "POST {path} {body}: the router answered {status} {answer}, the schema says {}",
            if expected { "valid" } else { "invalid" }
        );
    }
    runner.stop().await;
}
