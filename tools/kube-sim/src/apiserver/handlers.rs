//! The REST verbs over the registry: get, list, watch, create, update,
//! patch, delete and deletecollection, plus the pod subresources.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};

use super::request::{Query, ResourcePath, delete_options, list_kind};
use super::{ApiContext, bytes_response, json_response, protobuf, table, watch};
use crate::errors::ApiError;
use crate::kinds::ResourceInfo;
use crate::meta;
use crate::storage::patch::PatchKind;
use crate::storage::registry::{Deleted, Target, returns_deleted_object};
use crate::storage::selectors::{FieldSelector, LabelSelector};
use crate::storage::store::ObjRef;

/// Request bodies above this size get `413`, like the apiserver's 3 MiB cap.
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

pub async fn handle(
    ctx: Arc<ApiContext>,
    target: ResourcePath,
    query: Query,
    verb: &'static str,
    req: Request,
) -> Response {
    let headers = req.headers().clone();
    if !matches!(target.subresource.as_deref(), Some("log" | "attach"))
        && let Err(e) = check_acceptable(&headers)
    {
        return e.into_response();
    }
    match target.subresource.as_deref() {
        Some("log") => return super::logs::handle(ctx, target, query).await,
        Some("attach") => return super::attach::handle(ctx, target, query, req).await,
        _ => {}
    }
    let body = if matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    ) {
        match axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await {
            Ok(b) => b,
            Err(_) => {
                return ApiError {
                    code: 413,
                    reason: "RequestEntityTooLarge".into(),
                    message: "the request is too large".into(),
                    details: None,
                    retry_after_seconds: None,
                }
                .into_response();
            }
        }
    } else {
        Bytes::new()
    };
    let result = match verb {
        "get" => get(&ctx, &target, &headers, &query),
        "list" => list(&ctx, &target, &headers, &query),
        "watch" => return watch_response(ctx, &target, &headers, &query),
        "create" => create(&ctx, &target, &headers, &query, &body),
        "update" => update(&ctx, &target, &headers, &query, &body),
        "patch" => patch(&ctx, &target, &headers, &query, &body),
        "delete" => delete(&ctx, &target, &headers, &query, &body),
        "deletecollection" => delete_collection(&ctx, &target, &headers, &query, &body),
        _ => Err(ApiError::method_not_allowed()),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
}

/// An object in the version the client asked for.
fn object_bytes(info: &ResourceInfo, version: &str, obj: &ObjRef) -> Bytes {
    if version == info.storage_version() {
        return obj.json.clone();
    }
    let mut v = obj.value.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("apiVersion".into(), json!(info.api_version(version)));
    }
    Bytes::from(v.to_string())
}

fn object_response(
    code: StatusCode,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
    obj: &ObjRef,
) -> Response {
    let info = target.res.info();
    if table::wants_table(accept(headers)) {
        let t = table::table(
            info,
            std::iter::once(&obj.value),
            obj.rv,
            query.get("includeObject").unwrap_or("Metadata"),
        );
        return json_response(code, &t);
    }
    bytes_response(code, object_bytes(info, &target.version, obj))
}

fn require_name(target: &ResourcePath) -> Result<&str, ApiError> {
    target
        .name
        .as_deref()
        .ok_or_else(ApiError::method_not_allowed)
}

fn get(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
) -> Result<Response, ApiError> {
    let name = require_name(target)?;
    let obj = ctx.registry.get(target.res, target.ns(), name)?;
    Ok(object_response(
        StatusCode::OK,
        target,
        headers,
        query,
        &obj,
    ))
}

fn selectors(
    target: &ResourcePath,
    query: &Query,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""), target.res.info())
        .map_err(|e| ApiError::bad_request(e.0))?;
    Ok((labels, fields))
}

/// Continue tokens: where the previous page stopped.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}")});
    base64::engine::general_purpose::STANDARD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let start = start.trim_end_matches('\u{0}');
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((rv, ns.to_string(), name.to_string()))
}

fn list(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
) -> Result<Response, ApiError> {
    let info = target.res.info();
    let (labels, fields) = selectors(target, query)?;
    let limit = query.int("limit")?.filter(|l| *l > 0).map(|l| l as usize);
    let (objects, mut rv) = ctx.store.snapshot(target.res, target.namespace.as_deref());
    if let Some(requested) = query
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0")
    {
        let requested: u64 = requested.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid resource version: {requested:?}"))
        })?;
        if requested > rv {
            let mut err = ApiError::injected(
                504,
                Some(format!(
                    "Too large resource version: {requested}, current: {rv}"
                )),
            );
            err.reason = "Timeout".into();
            err.details = Some(Box::new(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            ));
            return Err(err);
        }
    }
    let mut start_after: Option<(String, String)> = None;
    if let Some(token) = query.get("continue").filter(|t| !t.is_empty()) {
        let (token_rv, ns, name) = decode_continue(token)?;
        rv = token_rv.max(1);
        start_after = Some((ns, name));
    }
    let mut matching = objects.iter().filter(|o| {
        labels.matches(&o.value)
            && fields.matches(&o.value)
            && start_after
                .as_ref()
                .is_none_or(|(ns, name)| (o.namespace(), o.name()) > (ns.as_str(), name.as_str()))
    });
    let mut page: Vec<&ObjRef> = Vec::new();
    let mut continue_token = None;
    let mut remaining = 0usize;
    match limit {
        Some(limit) => {
            page.extend(matching.by_ref().take(limit));
            remaining = matching.count();
            if remaining > 0
                && let Some(last) = page.last()
            {
                continue_token = Some(encode_continue(rv, last.namespace(), last.name()));
            }
        }
        None => page.extend(matching),
    }
    if table::wants_table(accept(headers)) {
        let mut t = table::table(
            info,
            page.iter().map(|o| &o.value),
            rv,
            query.get("includeObject").unwrap_or("Metadata"),
        );
        if let Some(c) = &continue_token {
            t["metadata"]["continue"] = json!(c);
            t["metadata"]["remainingItemCount"] = json!(remaining);
        }
        return Ok(json_response(StatusCode::OK, &t));
    }
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = &continue_token {
        metadata["continue"] = json!(c);
        metadata["remainingItemCount"] = json!(remaining);
    }
    let head = format!(
        "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
        json!(list_kind(target.res)),
        json!(info.api_version(&target.version)),
        metadata
    );
    let mut body = BytesMut::with_capacity(
        head.len() + page.iter().map(|o| o.json.len() + 1).sum::<usize>() + 2,
    );
    body.put_slice(head.as_bytes());
    for (i, o) in page.iter().enumerate() {
        if i > 0 {
            body.put_u8(b',');
        }
        body.put_slice(&object_bytes(info, &target.version, o));
    }
    body.put_slice(b"]}");
    Ok(bytes_response(StatusCode::OK, body.freeze()))
}

fn watch_response(
    ctx: Arc<ApiContext>,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
) -> Response {
    let build = || -> Result<watch::WatchRequest, ApiError> {
        let (labels, mut fields) = selectors(target, query)?;
        if let Some(name) = &target.name {
            // Legacy `/watch/<resource>/<name>`.
            fields = FieldSelector::parse(&format!("metadata.name={name}"), target.res.info())
                .map_err(|e| ApiError::bad_request(e.0))?;
        }
        Ok(watch::WatchRequest {
            res: target.res,
            version: target.version.clone(),
            namespace: target.namespace.clone(),
            resource_version: query.get("resourceVersion").map(str::to_string),
            labels,
            fields,
            bookmarks: query.flag("allowWatchBookmarks"),
            send_initial_events: query.flag("sendInitialEvents"),
            timeout: query
                .int("timeoutSeconds")?
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s as u64)),
            table: table::wants_table(accept(headers)),
            include_object: query.get("includeObject").unwrap_or("Metadata").to_string(),
        })
    };
    let req = match build() {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match watch::start(ctx, req) {
        Ok(stream) => {
            let mut resp = Response::new(Body::from_stream(stream));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => e.into_response(),
    }
}

/// The request body media types a kind accepts, as the apiserver lists them
/// in a `415`.
fn accepted_body_types(info: &ResourceInfo) -> &'static [&'static str] {
    if info.is_custom() {
        &["application/json", "application/yaml"]
    } else {
        &["application/json", "application/yaml", protobuf::MEDIA_TYPE]
    }
}

fn parse_body(info: &ResourceInfo, headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let base = ct.split(';').next().unwrap_or("").trim();
    match base {
        "application/yaml" => serde_yaml_ng::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}"))),
        "application/json" | "" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "Object 'Kind' is missing in '{}': {e}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))
        }),
        protobuf::MEDIA_TYPE if !info.is_custom() => protobuf_body(info, body),
        _ => Err(ApiError::unsupported_body_media_type(accepted_body_types(
            info,
        ))),
    }
}

/// A Kubernetes protobuf body. Kinds kube-sim has no protobuf schema for are
/// refused with `415` listing JSON and YAML — what the apiserver answers for
/// kinds without a protobuf serializer — so a client can resend as JSON.
fn protobuf_body(info: &ResourceInfo, body: &[u8]) -> Result<Value, ApiError> {
    let unrecognized = |e: &protobuf::ProtoError| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): {e}",
            info.kind
        ))
    };
    match protobuf::decode(body) {
        Ok(v) if v.get("kind").and_then(Value::as_str) == Some("DeleteOptions") => {
            Err(ApiError::bad_request(format!(
                "DeleteOptions in version {:?} cannot be handled as a {}",
                v.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                info.kind
            )))
        }
        Ok(v) => Ok(v),
        Err(protobuf::ProtoError::UnknownKind { .. }) => {
            Err(ApiError::unsupported_body_media_type(&[
                "application/json",
                "application/yaml",
            ]))
        }
        Err(e) => Err(unrecognized(&e)),
    }
}

/// `406` when the client accepts nothing but protobuf: kube-sim answers
/// JSON only (which every protobuf-capable client also lists).
fn check_acceptable(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let types: Vec<&str> = accept
        .split(',')
        .map(|t| t.split(';').next().unwrap_or("").trim())
        .filter(|t| !t.is_empty())
        .collect();
    if !types.is_empty()
        && types
            .iter()
            .all(|t| t.eq_ignore_ascii_case(protobuf::MEDIA_TYPE))
    {
        return Err(ApiError::not_acceptable(&["application/json"]));
    }
    Ok(())
}

fn create(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    if target.name.is_some() {
        if target.subresource.as_deref() == Some("binding") {
            return bind(ctx, target, headers, body);
        }
        return Err(ApiError::method_not_allowed());
    }
    let value = parse_body(target.res.info(), headers, body)?;
    let created = ctx
        .registry
        .create(target.res, target.ns(), value, query.dry_run()?)?;
    Ok(object_response(
        StatusCode::CREATED,
        target,
        headers,
        query,
        &created,
    ))
}

/// `pods/binding`: a scheduler assigning a node.
fn bind(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let value = parse_body(target.res.info(), headers, body)?;
    let node = value
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let name = require_name(target)?.to_string();
    let gr = target.res.info().group_resource();
    let mut conflict = None;
    let updated = ctx.registry.mutate(target.res, target.ns(), &name, |pod| {
        if meta::path_str(pod, "spec.nodeName").is_some_and(|n| !n.is_empty()) {
            conflict = Some(ApiError::conflict(
                gr,
                &name,
                &format!(
                    "pod {name} is already assigned to node {:?}",
                    meta::path_str(pod, "spec.nodeName").unwrap_or("")
                ),
            ));
            return false;
        }
        *meta::path_mut(pod, "spec.nodeName") = json!(node);
        true
    });
    if let Some(c) = conflict {
        return Err(c);
    }
    if updated.is_none() {
        return Err(ApiError::not_found(gr, &name));
    }
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

fn target_part(target: &ResourcePath) -> Result<Target, ApiError> {
    match target.subresource.as_deref() {
        None => Ok(Target::Main),
        Some("status") => Ok(Target::Status),
        Some(_) => Err(ApiError::method_not_allowed()),
    }
}

fn update(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let name = require_name(target)?;
    let part = if target.subresource.as_deref() == Some("finalize") {
        Target::Main
    } else {
        target_part(target)?
    };
    let value = parse_body(target.res.info(), headers, body)?;
    let (updated, created) =
        ctx.registry
            .update(target.res, target.ns(), name, value, part, query.dry_run()?)?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(object_response(code, target, headers, query, &updated))
}

fn patch(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let name = require_name(target)?;
    let part = target_part(target)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let kind = PatchKind::from_content_type(ct)?;
    if kind == PatchKind::Apply && query.get("fieldManager").is_none_or(str::is_empty) {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            &[crate::errors::FieldError::required(
                "fieldManager",
                "is required for apply patch",
            )],
        ));
    }
    let patched = ctx.registry.patch(
        target.res,
        target.ns(),
        name,
        kind,
        body,
        part,
        query.dry_run()?,
    )?;
    Ok(object_response(
        StatusCode::OK,
        target,
        headers,
        query,
        &patched,
    ))
}

fn deleted_response(target: &ResourcePath, outcome: &Deleted) -> Response {
    let info = target.res.info();
    match outcome {
        Deleted::Pending(obj) => {
            bytes_response(StatusCode::OK, object_bytes(info, &target.version, obj))
        }
        Deleted::Gone(obj) if returns_deleted_object(info) => {
            bytes_response(StatusCode::OK, object_bytes(info, &target.version, obj))
        }
        Deleted::Gone(obj) => {
            let mut details = json!({"name": obj.name(), "kind": info.plural, "uid": obj.uid()});
            if !info.group.is_empty() {
                details["group"] = json!(info.group);
            }
            json_response(
                StatusCode::OK,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
            )
        }
    }
}

fn delete(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let name = require_name(target)?;
    if target.subresource.is_some() {
        return Err(ApiError::method_not_allowed());
    }
    let opts = delete_options(query, content_type(headers), body)?;
    let outcome = ctx.registry.delete(target.res, target.ns(), name, &opts)?;
    Ok(deleted_response(target, &outcome))
}

fn delete_collection(
    ctx: &ApiContext,
    target: &ResourcePath,
    headers: &HeaderMap,
    query: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let info = target.res.info();
    if info.kind == "Namespace" {
        return Err(ApiError::method_not_allowed());
    }
    let (labels, fields) = selectors(target, query)?;
    let opts = delete_options(query, content_type(headers), body)?;
    let (objects, _) = ctx.store.snapshot(target.res, target.namespace.as_deref());
    let mut items = Vec::new();
    for o in objects
        .iter()
        .filter(|o| labels.matches(&o.value) && fields.matches(&o.value))
    {
        match ctx
            .registry
            .delete(target.res, o.namespace(), o.name(), &opts)
        {
            Ok(Deleted::Gone(obj)) | Ok(Deleted::Pending(obj)) => items.push(obj.value.clone()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": list_kind(target.res), "apiVersion": info.api_version(&target.version),
                "metadata": {"resourceVersion": ctx.store.current_rv().to_string()}, "items": items}),
    ))
}
