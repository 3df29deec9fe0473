//! Minimal OpenAPI documents: enough for kubectl to learn that every
//! resource supports server-side field validation, so it validates on the
//! server instead of downloading schemas. Real schemas are not served.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::sync::Arc;

use super::{ApiContext, json_response};
use crate::errors::ApiError;
use crate::kinds::RESOURCES;

fn group_versions(gateway_api: bool) -> Vec<(String, &'static str, &'static str)> {
    let mut out: Vec<(String, &'static str, &'static str)> = Vec::new();
    for r in RESOURCES {
        if r.gateway_api && !gateway_api {
            continue;
        }
        for v in r.versions {
            let path = if r.group.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{}/{v}", r.group)
            };
            if !out.iter().any(|(p, _, _)| *p == path) {
                out.push((path, r.group, v));
            }
        }
    }
    out
}

pub async fn v3_index(State(ctx): State<Arc<ApiContext>>) -> Response {
    let mut paths = Map::new();
    for (path, _, _) in group_versions(ctx.gateway_api) {
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash=kube-sim")}),
        );
    }
    json_response(StatusCode::OK, &json!({"paths": paths}))
}

fn field_validation_param() -> Value {
    json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true},
           "description": "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields."})
}

pub async fn v3_document(State(ctx): State<Arc<ApiContext>>, Path(path): Path<String>) -> Response {
    let Some((_, group, version)) = group_versions(ctx.gateway_api)
        .into_iter()
        .find(|(p, _, _)| *p == path)
    else {
        return ApiError::path_not_found().into_response();
    };
    let mut paths = Map::new();
    for r in RESOURCES {
        if r.group != group || !r.versions.contains(&version) {
            continue;
        }
        let gvk = json!({"group": r.group, "version": version, "kind": r.kind});
        let base = if r.group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{}/{version}", r.group)
        };
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        let op = |action: &str| {
            json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
                   "parameters": [field_validation_param()], "responses": {"200": {"description": "OK"}}})
        };
        paths.insert(collection.clone(), json!({"post": op("post")}));
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"put": op("put"), "patch": op("patch")}),
        );
    }
    json_response(
        StatusCode::OK,
        &json!({"openapi": "3.0.0", "info": {"title": "Kubernetes (kube-sim)", "version": super::discovery::SERVER_VERSION},
                "paths": paths, "components": {"schemas": {}}}),
    )
}

pub async fn v2() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"swagger": "2.0", "info": {"title": "Kubernetes (kube-sim)", "version": super::discovery::SERVER_VERSION},
                "paths": {}, "definitions": {}}),
    )
}
