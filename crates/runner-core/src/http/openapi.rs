//! `GET /v1/openapi.json`: the `/v1` contract as an OpenAPI 3.1 document,
//! built by hand from the same route list the router is built from
//! ([`super::ROUTES`]), so a route cannot ship undocumented without the
//! OpenAPI test noticing.
//!
//! The request schemas state what `runner_api::validate` accepts. The runner is
//! more lenient than JSON Schema in one way, kept for compatibility with the
//! reference (docs/contract.md §1.2): scalars are coerced the way AJV's
//! `coerceTypes: "array"` does (`"8080"` is a port, a number is an env value).

use axum::Json;
use runner_api::validate::request_schemas;
use serde_json::{Value, json};

use super::auth::{ACCESS_TOKEN_PARAM, requires_token};
use super::{ACCEPTED_TERMS_HEADER, MAX_PARAM_LENGTH, ROUTES};

pub async fn openapi_json() -> Json<Value> {
    Json(document())
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn response(description: &str, schema: Value) -> Value {
    json!({ "description": description, "content": json_content(schema) })
}

fn error(description: &str) -> Value {
    response(description, schema_ref("Error"))
}

fn id_parameter() -> Value {
    json!({
        "name": "id", "in": "path", "required": true,
        "description": "Session id as returned by the create routes.",
        "schema": { "type": "string", "minLength": 1, "maxLength": MAX_PARAM_LENGTH }
    })
}

fn json_body(schema: &str) -> Value {
    json!({ "required": true, "content": json_content(schema_ref(schema)) })
}

/// The responses every JSON-body route shares.
fn body_errors(responses: &mut Value) {
    responses["400"] = error(
        "The body failed validation (`invalid_request`, `invalid_json`, `empty_json_body`), or for `POST /v1/sessions` a bundle path escapes the bundle (`invalid_bundle`) or the backend refuses the config (`invalid_config`).",
    );
    responses["413"] = error("Body larger than `RUNNER_MAX_BODY_BYTES` (`payload_too_large`).");
    responses["415"] = error("Body not sent as `application/json` (`unsupported_media_type`).");
}

fn session_creating(responses: &mut Value) {
    body_errors(responses);
    responses["400"] = error(
        "The body failed validation (`invalid_request`, `invalid_json`, `empty_json_body`), or the `Idempotency-Key` is no key (`invalid_idempotency_key`).",
    );
    responses["409"] = error(
        "The runner is at its session limit (`too_many_sessions`), or the first request with this `Idempotency-Key` is still being answered (`idempotency_key_in_flight`).",
    );
    responses["422"] = error(
        "The `Idempotency-Key` was already used with another request (`idempotency_key_reused`).",
    );
    responses["428"] = response(
        "Terms configured and `x-telo-accepted-terms` missing or not the current version.",
        schema_ref("TermsRequired"),
    );
    responses["429"] = response(
        "With `RUNNER_TIERS_FILE`: the principal's tenant is at a quota of its tier (`quota_exceeded`, naming the `quota`, its `limit` and what is `used`), or the principal is past its `startsPerMinute` or `requestsPerMinute` (`rate_limited`, with `Retry-After`).",
        json!({
            "type": "object", "required": ["error", "message"],
            "properties": {
                "error": {"type": "string", "enum": ["quota_exceeded", "rate_limited"]},
                "message": {"type": "string"},
                "quota": {"type": "string", "enum": ["sessions", "watchSessions", "suspendedSessions", "cpu", "memory", "sessionSecondsPerDay"]},
                "limit": {"type": "integer"},
                "used": {"type": "integer"}
            }
        }),
    );
}

fn idempotency_header() -> Value {
    json!({
        "name": "Idempotency-Key", "in": "header", "required": false,
        "description": "1 to 255 visible ASCII characters (else 400 `invalid_idempotency_key`). A retry with the same key, token and body gets the session the first request made (the same 201 body, with `Idempotent-Replayed: true`) for 24 hours; keys live in the runner's memory.",
        "schema": { "type": "string", "minLength": 1, "maxLength": 255 }
    })
}

fn terms_header() -> Value {
    json!({
        "name": ACCEPTED_TERMS_HEADER, "in": "header", "required": false,
        "description": "The accepted `terms.version` from `/v1/capabilities`; required when the runner has terms.",
        "schema": { "type": "string" }
    })
}

/// The operation object of one route and method.
fn operation(path: &str, method: &str) -> Value {
    let mut op = match (path, method) {
        ("/livez", "get") => json!({
            "summary": "Liveness: the process is serving.",
            "responses": { "200": response("Alive.", json!({"type": "object", "required": ["ok"], "properties": {"ok": {"const": true}}})) }
        }),
        ("/readyz", "get") => json!({
            "summary": "Readiness: sessions of a previous runner have been adopted.",
            "responses": {
                "200": response("Ready.", json!({"type": "object", "required": ["ready"], "properties": {"ready": {"const": true}}})),
                "503": response("Not ready yet.", json!({"type": "object", "required": ["ready", "waiting"], "properties": {"ready": {"const": false}, "waiting": {"type": "array", "items": {"type": "string"}, "description": "Every unmet condition."}}}))
            }
        }),
        ("/metrics", "get") => json!({
            "summary": "Prometheus metrics in the text exposition format.",
            "responses": { "200": {"description": "The metrics.", "content": {"text/plain": {"schema": {"type": "string"}}}} }
        }),
        ("/internal/sessions/{id}/access", "get") => json!({
            "summary": "The edge's check of a request to a session's published ports (an ingress controller's external authentication): 204 when the session has no workload token or the request's `Authorization: Bearer` is one of its tokens; never needs the runner's own token.",
            "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
            "responses": {
                "204": {"description": "The request may pass."},
                "401": error("The session has a token the request does not present, or no such session runs.")
            }
        }),
        ("/v1/health", "get") => json!({
            "summary": "Liveness and version; always 200 (use /v1/probe for the backend).",
            "responses": { "200": response("Alive.", schema_ref("Health")) }
        }),
        ("/v1/capabilities", "get") => json!({
            "summary": "Self-description: config schema, features, terms, apps.",
            "responses": { "200": response("The capabilities document.", schema_ref("RunnerCapabilities")) }
        }),
        ("/v1/openapi.json", "get") => json!({
            "summary": "This document.",
            "responses": { "200": response("OpenAPI 3.1 document.", json!({"type": "object"})) }
        }),
        ("/v1/probe", "post") => {
            let mut op = json!({
                "summary": "Readiness report of the backend for an image and pull policy.",
                "description": "Unknown properties, at the top level and in `config`, are dropped rather than rejected.",
                "requestBody": json_body("ProbeRequest"),
                "responses": { "200": response("The backend's report.", schema_ref("AvailabilityReport")) }
            });
            body_errors(&mut op["responses"]);
            op
        }
        ("/v1/sessions", "post") => {
            let mut op = json!({
                "summary": "Create a bundle session; answers before the backend starts anything.",
                "description": "Start failures surface only as a terminal `failed` status on the event stream.",
                "parameters": [terms_header(), idempotency_header()],
                "requestBody": json_body("StartSessionRequest"),
                "responses": { "201": response("Created.", schema_ref("SessionCreated")) }
            });
            session_creating(&mut op["responses"]);
            op["responses"]["400"] = error(
                "The body failed validation (`invalid_request`, `invalid_json`, `empty_json_body`); a bundle path escapes the bundle (`invalid_bundle`); the backend refuses the config (`invalid_config`); `mode: \"watch\"` is not offered (`watch_disabled`); `agent` without watch (`agent_requires_watch`), not in the catalog (`unknown_agent`) or without a port (`agent_port_undeclared`); an app breaks the app rules (`invalid_app_name`, `reserved_app_name`, `duplicate_app_name`, `port_conflict`) or asks for an io mode the runner does not offer (`io_unsupported`); a telo version is named on a runner without `features.teloVersions` (`telo_version_unsupported`), is not one or is named for only some apps (`invalid_telo_version`), or cannot be had (`telo_version_unavailable`, with `app`, `version` and `reason`); an `Idempotency-Key` that is no key (`invalid_idempotency_key`).",
            );
            op["responses"]["409"] = error(
                "The runner is at its session limit (`too_many_sessions`) or its live watch session limit (`too_many_watch_sessions`), or the first request with this `Idempotency-Key` is still being answered (`idempotency_key_in_flight`).",
            );
            op
        }
        ("/v1/sessions", "get") => json!({
            "summary": "Every session the registry holds.",
            "responses": { "200": response("The sessions.", json!({
                "type": "object", "required": ["sessions"],
                "properties": {"sessions": {"type": "array", "items": schema_ref("SessionSnapshot")}}
            })) }
        }),
        ("/v1/apps/{name}/sessions", "post") => {
            let mut op = json!({
                "summary": "Create a session of an operator-defined app (see `apps` in /v1/capabilities).",
                "parameters": [
                    {"name": "name", "in": "path", "required": true, "schema": {"type": "string", "minLength": 1, "maxLength": MAX_PARAM_LENGTH}},
                    terms_header(),
                    idempotency_header()
                ],
                "requestBody": json_body("AppSessionRequest"),
                "responses": {
                    "201": response("Created.", schema_ref("SessionCreated")),
                    "404": error("No app of that name (`unknown_app`); answered before the terms gate.")
                }
            });
            session_creating(&mut op["responses"]);
            op
        }
        ("/v1/sessions/{id}", "get") => json!({
            "summary": "Status snapshot of a session.",
            "parameters": [id_parameter()],
            "responses": {
                "200": response("The session.", schema_ref("SessionSnapshot")),
                "404": error("Unknown session (`not_found`).")
            }
        }),
        ("/v1/sessions/{id}", "delete") => json!({
            "summary": "Stop a session; idempotent (unknown ids answer 204 too).",
            "parameters": [id_parameter()],
            "responses": {
                "204": {"description": "Stopped or stopping; `stopped` arrives on the event stream."},
                "500": error("The backend failed to stop it (`stop_failed`).")
            }
        }),
        ("/v1/sessions/{id}/events", "get") => json!({
            "summary": "Server-sent lifecycle events: replay after the resume point, then live, ending after the terminal status.",
            "description": "Each frame is `id: <n>`, `event: <type>`, `data: <RunEvent JSON>`. A `gap` frame without id (`{\"reason\":\"buffer_evicted\"}`) precedes replay when older events were evicted; `: heartbeat` comments keep idle streams open. `EventSource` cannot set headers, so with auth on the token may also be passed as `?access_token=`.",
            "parameters": [
                id_parameter(),
                {"name": "Last-Event-ID", "in": "header", "required": false, "schema": {"type": "string"}, "description": "Resume after this event id; wins over the query."},
                {"name": "lastEventId", "in": "query", "required": false, "schema": {"type": "string"}, "description": "Resume after this event id."},
                access_token_parameter()
            ],
            "responses": {
                "200": {"description": "The event stream.", "content": {"text/event-stream": {"schema": schema_ref("RunEvent")}}},
                "404": error("Unknown session (`not_found`).")
            }
        }),
        ("/v1/sessions/{id}/io", "get") => json!({
            "summary": "WebSocket terminal channel (upgrade with `GET` and `Upgrade: websocket`).",
            "description": "Server → client: a text frame `{\"type\":\"seq\",\"seq\":n,\"app\":name,\"io\":\"tty\"}` first, maybe `{\"type\":\"gap\",\"reason\":\"buffer_evicted\"}`, then binary frames of a 4-byte big-endian chunk seq, a stream byte (0 tty, 1 stdout, 2 stderr) and the bytes (with `RUNNER_IO_FRAMES=legacy`: no stream byte, and a `seq` frame without `app` and `io`). Each app of a session has its own channel and seqs; `?app=` picks it (required when the session runs several: 4404 `session runs N apps — ?app= is required`; 4404 `session runs no app named '<app>'`). Client → server: binary frames are stdin; text `{\"type\":\"resize\",\"cols\":C,\"rows\":R}` resizes (an app without a terminal answers `{\"type\":\"error\",\"error\":\"resize_unsupported\",\"io\":\"streams\"}`). Refusals happen after the handshake with close codes: 4401 `unauthorized` (auth on, no valid token), 4403 `forbidden_origin`, 4404 `session not found`, 4410 `session terminal, nothing to replay`; 1000 `session terminal` at the end. Browsers cannot set headers on a WebSocket, so the token may be passed as `?access_token=`.",
            "parameters": [
                id_parameter(),
                {"name": "lastSeq", "in": "query", "required": false, "schema": {"type": "string"}, "description": "Resume after this chunk seq; missing or invalid means 0."},
                {"name": "app", "in": "query", "required": false, "schema": {"type": "string"}, "description": "The app whose channel to open; the only app when absent."},
                access_token_parameter()
            ],
            "responses": {
                "101": {"description": "Switching protocols; the session's frames follow."},
                "404": {"description": "Not a WebSocket upgrade request (empty body)."}
            }
        }),
        ("/v1/sessions/{id}/workspace", "get") => json!({
            "summary": "A watch session's workspace: every file with the sha256 (hex) of its bytes; `node_modules`, `.telo` and `.git` left out.",
            "parameters": [id_parameter()],
            "responses": {
                "200": response("The tree.", schema_ref("WorkspaceTree")),
                "404": error("Unknown session (`not_found`)."),
                "409": error("Not a watch session (`not_a_watch_session`), or no live workspace: starting, suspended or over (`not_running`)."),
                "413": error("The workspace holds more than the runner's limits (`workspace_too_large`).")
            }
        }),
        ("/v1/sessions/{id}/workspace", "post") => {
            let mut op = json!({
                "summary": "Apply a change set to a watch session's workspace: writes, then deletes. The kernel's own watch reloads the apps.",
                "description": "Paths follow the bundle path rules and may not be absolute; every path and content is checked before anything is written, so a refused change set changes nothing. Spends one slot of the session's reload budget, shared with `POST /reload`, even when it then fails.",
                "parameters": [id_parameter()],
                "requestBody": json_body("WorkspaceChangeSet"),
                "responses": {
                    "200": response("Applied.", json!({"type": "object", "required": ["written", "deleted"], "properties": {"written": {"type": "integer"}, "deleted": {"type": "integer"}}})),
                    "404": error("Unknown session (`not_found`)."),
                    "409": error("Not a watch session (`not_a_watch_session`) or no live workspace (`not_running`); a path conflicts with what is on disk (`path_conflict`)."),
                    "429": error("More than `RUNNER_WATCH_RELOAD_LIMIT` writes and reloads in the last minute (`reload_rate_limited`).")
                }
            });
            body_errors(&mut op["responses"]);
            op["responses"]["400"] = error(
                "The body failed validation (`invalid_request`), a path breaks the bundle path rules (`invalid_path`), or a content does not decode (`invalid_encoding`).",
            );
            op["responses"]["413"] = error(
                "Body larger than `RUNNER_MAX_BODY_BYTES` (`payload_too_large`), or the change set or the workspace it leaves over a `RUNNER_WORKSPACE_MAX_*` limit (`workspace_too_large`, naming the limit).",
            );
            op
        }
        ("/v1/sessions/{id}/workspace/file", "get") => json!({
            "summary": "One file of a watch session's workspace, as UTF-8 (invalid bytes as U+FFFD), with its size in bytes.",
            "parameters": [id_parameter(), {"name": "path", "in": "query", "required": true, "schema": {"type": "string"}}],
            "responses": {
                "200": response("The file.", json!({"type": "object", "required": ["content", "size"], "properties": {"content": {"type": "string"}, "size": {"type": "integer"}}})),
                "400": error("No `?path=`, or a path breaking the bundle path rules or absolute (`invalid_path`); not a regular file (`not_a_file`)."),
                "404": error("Unknown session (`not_found`) or no such file (`file_not_found`)."),
                "409": error("Not a watch session (`not_a_watch_session`) or no live workspace (`not_running`)."),
                "413": error("The file is over `RUNNER_WORKSPACE_MAX_FILE_BYTES` (`workspace_too_large`).")
            }
        }),
        ("/v1/sessions/{id}/reload", "post") => json!({
            "summary": "Re-run one app (`?app=`) or every app of a watch session in place; their next generation is attributed `manual`.",
            "parameters": [id_parameter(), {"name": "app", "in": "query", "required": false, "schema": {"type": "string"}}],
            "responses": {
                "202": response("Reloading.", json!({"type": "object", "required": ["reloaded"], "properties": {"reloaded": {"type": "array", "items": {"type": "string"}}}})),
                "404": error("Unknown session (`not_found`) or app (`unknown_app`)."),
                "409": error("Not a watch session (`not_a_watch_session`) or no live workload (`not_running`)."),
                "429": error("More than `RUNNER_WATCH_RELOAD_LIMIT` writes and reloads in the last minute (`reload_rate_limited`).")
            }
        }),
        ("/v1/sessions/{id}/apps", "put") => {
            let mut op = json!({
                "summary": "Replace a watch session's app set over the same workspace; a `running` status with the new endpoints follows.",
                "parameters": [id_parameter()],
                "requestBody": json_body("SetAppsRequest"),
                "responses": {
                    "202": response("Changed.", json!({"type": "object", "required": ["apps"], "properties": {"apps": {"type": "array", "items": {"type": "string"}}}})),
                    "404": error("Unknown session (`not_found`)."),
                    "409": error("Not a watch session (`not_a_watch_session`) or no live workload (`not_running`)."),
                    "500": error("The new apps did not start (`set_apps_failed`); the session ended `failed`.")
                }
            });
            body_errors(&mut op["responses"]);
            op["responses"]["400"] = error(
                "The body failed validation (`invalid_request`) or the app rules (`invalid_app_name`, `reserved_app_name`, `duplicate_app_name`, `invalid_bundle`, `port_conflict`, `io_unsupported`) or a telo version it names (`telo_version_unsupported`, `invalid_telo_version`, `telo_version_unavailable`).",
            );
            op
        }
        ("/v1/sessions/{id}/resume", "post") => json!({
            "summary": "Start a suspended watch session again under its id, from its files; every app's next generation is attributed `resume`.",
            "parameters": [id_parameter()],
            "responses": {
                "202": response("Resuming; `starting` then `running` follow on the event stream.", json!({"type": "object", "required": ["sessionId"], "properties": {"sessionId": {"type": "string"}}})),
                "404": error("Unknown or not suspended (`not_suspended`)."),
                "409": error("Suspended before its workspace was checkpointed (`no_checkpoint`).")
            }
        }),
        ("/v1/sessions/{id}/links", "post") => {
            let mut op = json!({
                "summary": "Make a share link: a URL that opens one published tcp port of the session through the session edge to whoever holds it, until `expiresAt` or until it is revoked.",
                "parameters": [id_parameter()],
                "requestBody": json_body("CreateLinkRequest"),
                "responses": {
                    "201": response("The link.", schema_ref("ShareLink")),
                    "404": error("Unknown session (`not_found`)."),
                    "409": error("The session edge is off (`edge_disabled`), the session has ended (`not_running`), or it holds 64 links already (`too_many_links`).")
                }
            });
            body_errors(&mut op["responses"]);
            op["responses"]["400"] = error(
                "The body failed validation (`invalid_request`, `invalid_json`, `empty_json_body`), or the session does not publish that tcp port (`port_not_published`).",
            );
            op["responses"]["503"] = error(
                "The link could not be kept where the session outlives the runner (`links_not_kept`); no link was made.",
            );
            op
        }
        ("/v1/sessions/{id}/links", "get") => json!({
            "summary": "The session's unexpired share links.",
            "parameters": [id_parameter()],
            "responses": {
                "200": response("The links.", json!({"type": "object", "required": ["links"], "properties": {"links": {"type": "array", "items": schema_ref("ShareLink")}}})),
                "404": error("Unknown session (`not_found`).")
            }
        }),
        ("/v1/sessions/{id}/links/{link_id}", "delete") => json!({
            "summary": "Revoke a share link: within a second, its URL and the cookies it was traded for open nothing.",
            "parameters": [id_parameter(), {"name": "link_id", "in": "path", "required": true, "schema": {"type": "string"}}],
            "responses": {
                "204": {"description": "Revoked."},
                "404": error("Unknown session (`not_found`) or link (`link_not_found`)."),
                "503": error("The revocation could not be kept where the session outlives the runner (`links_not_kept`); the link still opens.")
            }
        }),
        _ => json!({ "responses": {} }),
    };
    replica_errors(path, method, &mut op);
    if requires_token(path) {
        op["responses"]["401"] = error(
            "Only with `RUNNER_AUTH_TOKENS_FILE` or `RUNNER_OIDC_ISSUER` set: a missing, unknown, expired or otherwise refused bearer token (`unauthorized`, with `WWW-Authenticate: Bearer`; the message says why).",
        );
        if op["responses"].get("429").is_none() {
            op["responses"]["429"] = error(
                "With `RUNNER_TIERS_FILE`: the principal is past its tier's `requestsPerMinute` (`rate_limited`, with `Retry-After`).",
            );
        }
        op["security"] = if path.ends_with("/events") || path.ends_with("/io") {
            json!([{"bearerAuth": []}, {"accessToken": []}, {}])
        } else {
            json!([{"bearerAuth": []}, {}])
        };
    }
    op
}

/// The `503`s of a runner with several replicas (additive: a single
/// replica never answers them), and a create's while the runner shuts
/// down.
fn replica_errors(path: &str, method: &str, op: &mut Value) {
    let writes = method != "get";
    let session = path.starts_with("/v1/sessions/{id}") || path == "/internal/sessions/{id}/access";
    let create = method == "post" && (path == "/v1/sessions" || path == "/v1/apps/{name}/sessions");
    let text = if session {
        let fenced = if writes {
            ", or this replica may not change its sessions now (`replica_fenced`)"
        } else {
            ""
        };
        format!(
            "With several replicas: the replica that holds the session could not be reached (`replica_unavailable`) or the session is moving to another replica (`session_moving`){fenced}; each with `Retry-After: 1`."
        )
    } else if create {
        "The runner is shutting down and takes no new session (`shutting_down`); with several replicas, this replica may not create sessions now (`replica_fenced`); each with `Retry-After: 1`.".to_owned()
    } else {
        return;
    };
    let responses = &mut op["responses"];
    match responses["503"]["description"].as_str() {
        Some(before) => {
            let joined = format!("{before} {text}");
            responses["503"]["description"] = Value::String(joined);
        }
        None => responses["503"] = error(&text),
    }
}

fn access_token_parameter() -> Value {
    json!({
        "name": ACCESS_TOKEN_PARAM, "in": "query", "required": false,
        "schema": {"type": "string"},
        "description": "The bearer token, for clients that cannot set `Authorization` (browsers' EventSource and WebSocket)."
    })
}

/// The OpenAPI 3.1 document of every route in [`ROUTES`].
pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for route in ROUTES {
        let mut item = serde_json::Map::new();
        for method in route.methods {
            let method = method.to_ascii_lowercase();
            item.insert(method.clone(), operation(route.path, &method));
        }
        paths.insert(route.path.to_owned(), Value::Object(item));
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Telo runner /v1",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The runner contract: sessions created from a bundle or an operator app, their lifecycle events over SSE and their terminal over WebSocket. Runner-authored errors are `{error, message}`; the terms gate answers 428 `{error: \"terms_required\", terms}`. Request bodies are validated as the reference's AJV does, including its scalar coercions (`\"8080\"` is a port)."
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "Only when the runner is started with RUNNER_AUTH_TOKENS_FILE."},
                "accessToken": {"type": "apiKey", "in": "query", "name": ACCESS_TOKEN_PARAM, "description": "The same token as a query parameter, accepted by the event stream and the WebSocket only."}
            },
            "schemas": schemas()
        }
    })
}

/// The response schemas, written here, and the request schemas, generated
/// from the definitions the validator checks bodies against.
fn schemas() -> Value {
    let mut schemas = json!({
        "Error": {
            "type": "object", "required": ["error", "message"],
            "properties": {"error": {"type": "string", "description": "Machine-readable code."}, "message": {"type": "string"}}
        },
        "TermsRequired": {
            "type": "object", "required": ["error", "terms"],
            "properties": {"error": {"const": super::ErrorCode::TermsRequired.as_str()}, "terms": schema_ref("RunnerTerms")}
        },
        "RunnerTerms": {
            "type": "object", "required": ["version", "title", "body"],
            "properties": {"version": {"type": "string"}, "title": {"type": "string"}, "body": {"type": "string"}}
        },
        "Health": {
            "type": "object", "required": ["ok", "version"],
            "properties": {"ok": {"const": true}, "version": {"type": "string"}}
        },
        "RunnerCapabilities": {
            "type": "object", "required": ["displayName", "description", "config", "features"],
            "properties": {
                "displayName": {"type": "string"},
                "description": {"type": "string"},
                "config": {"type": "object", "required": ["schema"], "properties": {"schema": {"type": "object", "description": "JSON Schema of the editable session config."}}},
                "features": {"type": "object", "properties": {
                    "io": {"oneOf": [{"type": "array", "items": {"enum": ["tty", "streams"]}}, {"type": "boolean"}], "description": "The io modes apps may ask for; `true` under `RUNNER_IO_FRAMES=legacy`."},
                    "ports": {"type": "boolean"},
                    "watch": {"type": "boolean", "description": "Whether `mode: \"watch\"` is offered."},
                    "auth": {"type": "object", "properties": {"type": {"const": "bearer"}}, "description": "Present when the runner requires bearer tokens."}
                }},
                "terms": schema_ref("RunnerTerms"),
                "apps": {"type": "array", "items": schema_ref("RunnerAppDescriptor")},
                "limits": {
                    "type": "object",
                    "description": "Present when the request carries a principal (a valid bearer token, or anonymous mode): who it is, its tier, the tier's limits (an absent limit is unlimited) and what its tenant uses now.",
                    "required": ["principal", "tenant", "tier", "admin", "limits", "used"],
                    "properties": {
                        "principal": {"type": "string"},
                        "tenant": {"type": "string"},
                        "tier": {"type": "string"},
                        "admin": {"type": "boolean"},
                        "limits": {"type": "object", "properties": {
                            "sessions": {"type": "integer"}, "watchSessions": {"type": "integer"},
                            "suspendedSessions": {"type": "integer"}, "cpu": {"type": "string", "description": "Millicores, as `<n>m`."},
                            "memory": {"type": "integer", "description": "Bytes."}, "sessionSecondsPerDay": {"type": "integer"},
                            "requestsPerMinute": {"type": "integer"}, "startsPerMinute": {"type": "integer"}
                        }},
                        "used": {"type": "object", "properties": {
                            "sessions": {"type": "integer"}, "watchSessions": {"type": "integer"},
                            "suspendedSessions": {"type": "integer"}, "cpu": {"type": "integer", "description": "Millicores."},
                            "memory": {"type": "integer", "description": "Bytes."}, "sessionSecondsToday": {"type": "integer"}
                        }}
                    }
                }
            }
        },
        "RunnerAppDescriptor": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "title": {"type": "string"}, "description": {"type": "string"}}
        },
        "ShareLink": {
            "type": "object", "required": ["linkId", "port", "url", "expiresAt", "createdAt"],
            "properties": {
                "linkId": {"type": "string"},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "url": {"type": "string", "description": "The port's URL on the session edge, carrying the signed link in `telo_access`."},
                "expiresAt": {"type": "string", "format": "date-time"},
                "createdAt": {"type": "string", "format": "date-time"}
            }
        },
        "SessionCreated": {
            "type": "object", "required": ["sessionId", "streamUrl", "createdAt"],
            "properties": {"sessionId": {"type": "string"}, "streamUrl": {"type": "string"}, "createdAt": {"type": "string", "format": "date-time"}}
        },
        "SessionSnapshot": {
            "type": "object", "required": ["sessionId", "status", "createdAt"],
            "properties": {
                "sessionId": {"type": "string"}, "status": schema_ref("RunStatus"),
                "mode": {"enum": ["run", "watch"]},
                "agent": {"type": "string"},
                "apps": {"type": "array", "items": {"type": "object", "required": ["name", "io", "generation", "ports"], "properties": {"name": {"type": "string"}, "io": {"enum": ["tty", "streams"]}, "generation": {"type": "integer"}, "ports": {"type": "array", "items": schema_ref("PortMapping")}}}},
                "createdAt": {"type": "string", "format": "date-time"}, "exitedAt": {"type": "string", "format": "date-time"},
                "replica": {"type": "string", "description": "Additive: the id of the replica that holds the session, only when the runner runs several replicas."}
            }
        },
        "RunnerEndpoint": {
            "type": "object", "required": ["host", "port", "protocol"],
            "properties": {"host": {"type": "string"}, "port": {"type": "integer"}, "protocol": schema_ref("PortProtocol"), "url": {"type": "string"}}
        },
        "RunStatus": {"oneOf": [
            {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "starting"}}},
            {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "running"}, "endpoints": {"type": "array", "items": schema_ref("RunnerEndpoint")}, "inspectUrl": {"type": "string"}}},
            {"type": "object", "required": ["kind", "code"], "properties": {"kind": {"const": "exited"}, "code": {"type": "integer"}}},
            {"type": "object", "required": ["kind", "message"], "properties": {"kind": {"const": "failed"}, "message": {"type": "string"}}},
            {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "stopped"}}},
            {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "suspended"}}, "description": "A watch session waiting to be resumed; not terminal."}
        ]},
        "WorkspaceTree": {
            "type": "object", "required": ["files"],
            "properties": {"files": {"type": "array", "items": {"type": "object", "required": ["path", "hash"], "properties": {"path": {"type": "string"}, "hash": {"type": "string", "description": "sha256 of the file's bytes, lowercase hex."}}}}}
        },
        "RunEvent": {"oneOf": [
            {"type": "object", "required": ["type", "status"], "properties": {"type": {"const": "status"}, "status": schema_ref("RunStatus")}},
            {"type": "object", "required": ["type", "phase", "message"], "properties": {"type": {"const": "progress"}, "app": {"type": "string"}, "phase": {"enum": ["build", "provision", "boot"]}, "message": {"type": "string"}, "done": {"type": "boolean"}}},
            {"type": "object", "required": ["type", "frame"], "properties": {"type": {"const": "debug"}, "app": {"type": "string"}, "frame": {"type": "object", "description": "A kernel debug event frame."}}},
            {"type": "object", "required": ["type", "port", "state"], "properties": {"type": {"const": "reachability"}, "app": {"type": "string"}, "port": {"type": "integer"}, "state": {"enum": ["checking", "reachable", "unreachable"]}}},
            {"type": "object", "required": ["type", "host", "port", "state"], "properties": {"type": {"const": "route"}, "app": {"type": "string"}, "host": {"type": "string"}, "port": {"type": "integer"}, "state": {"enum": ["pending", "programmed", "unprogrammed"]}, "reason": {"type": "string"}}},
            {"type": "object", "required": ["type", "app", "generation", "phase"], "properties": {"type": {"const": "run"}, "app": {"type": "string"}, "generation": {"type": "integer"}, "phase": {"enum": ["started", "completed", "failed"]}, "trigger": {"enum": ["initial", "watch", "manual", "resume"]}, "telo": {"type": "string"}, "code": {"type": "integer"}, "durationMs": {"type": "integer"}, "reason": {"type": "string"}}, "description": "One generation of an app, from the kernel's debug stream: `started` (with `trigger`), `completed` (with `code`), `failed` (with `reason`)."},
            {"type": "object", "required": ["type", "app"], "properties": {"type": {"const": "endpoints"}, "app": {"type": "string"}, "added": {"type": "array", "items": schema_ref("RunnerEndpoint")}, "removed": {"type": "array", "items": schema_ref("RunnerEndpoint")}, "rejected": {"type": "array", "items": {"type": "object", "required": ["port", "reason"], "properties": {"port": {"type": "integer"}, "reason": {"type": "string"}}}}}},
            {"type": "object", "required": ["type", "chunk"], "properties": {"type": {"enum": ["stdout", "stderr"]}, "chunk": {"type": "string"}}, "description": "In the union for compatibility; never sent."}
        ]},
        "AvailabilityReport": {"oneOf": [
            {"type": "object", "required": ["status"], "properties": {"status": {"const": "ready"}}},
            {"type": "object", "required": ["status", "issues"], "properties": {"status": {"const": "needs-setup"}, "issues": {"type": "array", "items": {"type": "object", "required": ["path", "message"], "properties": {"path": {"type": "string"}, "message": {"type": "string"}}}}}},
            {"type": "object", "required": ["status", "message"], "properties": {"status": {"const": "unavailable"}, "message": {"type": "string"}, "remediation": {"type": "string"}}}
        ]}
    });
    if let Some(map) = schemas.as_object_mut() {
        map.extend(request_schemas());
    }
    schemas
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_and_method_of_the_router_is_in_the_document() {
        let doc = document();
        for route in ROUTES {
            for method in route.methods {
                let op = &doc["paths"][route.path][method.to_ascii_lowercase()];
                assert!(
                    op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                    "{method} {} has no documented responses",
                    route.path
                );
            }
        }
    }

    #[test]
    fn the_replica_refusals_are_documented() {
        let doc = document();
        let describes = |path: &str, method: &str, code: &str| {
            doc["paths"][path][method]["responses"]["503"]["description"]
                .as_str()
                .is_some_and(|text| text.contains(code))
        };
        for (path, method) in [
            ("/v1/sessions/{id}", "get"),
            ("/v1/sessions/{id}", "delete"),
            ("/v1/sessions/{id}/events", "get"),
            ("/v1/sessions/{id}/io", "get"),
            ("/v1/sessions/{id}/links", "post"),
            ("/internal/sessions/{id}/access", "get"),
        ] {
            assert!(
                describes(path, method, "replica_unavailable"),
                "{method} {path}"
            );
            assert!(describes(path, method, "session_moving"), "{method} {path}");
        }
        assert!(describes("/v1/sessions/{id}", "delete", "replica_fenced"));
        assert!(describes(
            "/v1/sessions/{id}/links",
            "post",
            "links_not_kept"
        ));
        assert!(describes("/v1/sessions", "post", "replica_fenced"));
        assert!(describes("/v1/sessions", "post", "shutting_down"));
        assert!(describes(
            "/v1/apps/{name}/sessions",
            "post",
            "replica_fenced"
        ));
        assert!(!describes("/v1/sessions/{id}", "get", "replica_fenced"));
        assert!(
            doc["components"]["schemas"]["SessionSnapshot"]["properties"]
                .get("replica")
                .is_some()
        );
    }
}
