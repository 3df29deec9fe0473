//! Request-body validation with the reference's observable behaviour
//! (docs/contract.md §1.2): Fastify validates bodies with AJV using `coerceTypes:
//! "array"`, `removeAdditional: true` and `allErrors: false`, and answers
//! `400` with `body<instancePath> <message>` for the first failure.
//!
//! Clients rely on the coercions (`"port":"8080"` is a port, a numeric env
//! value is a string), so this is a small schema walker that reproduces AJV's
//! rules and keyword order for the three body schemas (docs/contract.md §2.4–§2.6) rather than
//! a generic JSON Schema engine:
//!
//! * per schema: the type check (with coercion) first, then `enum`, then the
//!   type's own keywords — for numbers `maximum` before `minimum`; for objects
//!   `required` (in array order), then `additionalProperties`, then
//!   `properties` in schema order; for arrays `items` in index order;
//! * object keys are visited in JavaScript's own-key order.

mod schema;
mod walk;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::app_env::refused_client_variable;
use crate::js::js_own_key_order;
use crate::types::{PortMapping, PullPolicy, RequestedConfig, RunBundle};
use crate::watch::{AppSpec, SessionMode, WorkspaceChangeSet};
pub use schema::MAX_LINK_TTL_SECONDS;
pub use schema::request_schemas;
use schema::{APP_SESSION, CHANGE_SET, NEW_LINK, PROBE, SET_APPS, START_SESSION};
use walk::{ROOT, check, child_path, fail};

/// A rejected body; `message` is the complete Fastify-style text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    pub message: String,
}

/// A validated `POST /v1/sessions` body with absent optionals defaulted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartSessionBody {
    pub bundle: RunBundle,
    /// In JavaScript key order, as the reference would iterate it.
    pub env: Vec<(String, String)>,
    pub ports: Vec<PortMapping>,
    /// As sent (absent: all defaults). `registry_url` is kept verbatim:
    /// whitespace-only passes validation and is treated as unset by the
    /// caller (docs/contract.md §8.9).
    pub config: RequestedConfig,
    pub inspect: bool,
    pub mode: SessionMode,
    pub agent: Option<String>,
    /// As sent; [`crate::watch::resolve_apps`] applies the app rules.
    pub apps: Option<Vec<AppSpec>>,
    /// The request-level telo version, as sent.
    pub telo: Option<String>,
}

/// A validated `POST /v1/apps/:name/sessions` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSessionBody {
    pub env: Vec<(String, String)>,
    pub ports: Vec<PortMapping>,
    pub inspect: bool,
}

/// Hardening beyond the reference, which has no such bounds: env and ports
/// end up as process environment and published ports, where thousands of
/// entries are never legitimate and only cost memory and backend calls.
pub const MAX_ENV_ENTRIES: usize = 1000;
/// Linux refuses to start a program with an environment string
/// (`NAME=value` and its NUL) longer than 32 pages (`MAX_ARG_STRLEN`); the
/// kernel would fail at launch with an unreadable error, so such a variable
/// is refused here, by name.
pub const MAX_ENV_ENTRY_BYTES: usize = 128 * 1024;
pub const MAX_PORTS: usize = 100;

/// `POST /v1/sessions`. `None` is an absent body, which the reference validates
/// as `null`.
pub fn validate_start_session(body: Option<Value>) -> Result<StartSessionBody, ValidationError> {
    let mut body = body.unwrap_or(Value::Null);
    check(&START_SESSION, &mut body, ROOT)?;
    let mut fields = into_object(body)?;
    let env = env_entries(fields.remove("env"))?;
    let ports = port_list(fields.remove("ports"))?;
    let config: RequestedConfig = match fields.remove("config") {
        Some(config) => typed(config)?,
        None => RequestedConfig::default(),
    };
    // The registry URL becomes the workload's TELO_REGISTRY_URL, so it obeys
    // the rule for env values (our hardening, like `env_entries`).
    if config
        .registry_url
        .as_deref()
        .is_some_and(|url| url.contains('\0'))
    {
        let config_path = child_path(ROOT, "config");
        return Err(fail(
            &child_path(&config_path, "registryUrl"),
            "must not contain NUL",
        ));
    }
    let mode = match fields.remove("mode") {
        Some(mode) => typed(mode)?,
        None => SessionMode::Run,
    };
    let agent = match fields.remove("agent") {
        Some(agent) => Some(typed(agent)?),
        None => None,
    };
    let apps = match fields.remove("apps") {
        Some(apps) => Some(app_list(apps)?),
        None => None,
    };
    let telo = match fields.remove("telo") {
        Some(telo) => Some(typed(telo)?),
        None => None,
    };
    Ok(StartSessionBody {
        telo,
        bundle: typed(fields.remove("bundle").unwrap_or(Value::Null))?,
        env,
        ports,
        config,
        inspect: flag(fields.remove("inspect")),
        mode,
        agent,
        apps,
    })
}

/// `PUT /v1/sessions/:id/apps`: the new app set, as sent.
pub fn validate_set_apps(body: Option<Value>) -> Result<Vec<AppSpec>, ValidationError> {
    let mut body = body.unwrap_or(Value::Null);
    check(&SET_APPS, &mut body, ROOT)?;
    let mut fields = into_object(body)?;
    app_list(fields.remove("apps").unwrap_or(Value::Null))
}

/// `POST /v1/sessions/:id/links`: the port and lifetime of a share link
/// (`ttlSeconds` defaults to [`DEFAULT_LINK_TTL_SECONDS`]).
pub fn validate_new_link(body: Option<Value>) -> Result<NewLink, ValidationError> {
    let mut body = body.unwrap_or(Value::Null);
    check(&NEW_LINK, &mut body, ROOT)?;
    let fields = into_object(body)?;
    let int = |name: &str| fields.get(name).and_then(Value::as_u64);
    Ok(NewLink {
        port: int("port")
            .and_then(|port| u16::try_from(port).ok())
            .unwrap_or(0),
        ttl_seconds: int("ttlSeconds").unwrap_or(DEFAULT_LINK_TTL_SECONDS),
    })
}

/// How long a share link lives when its request does not say: an hour.
pub const DEFAULT_LINK_TTL_SECONDS: u64 = 3600;

/// A validated share-link request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewLink {
    pub port: u16,
    pub ttl_seconds: u64,
}

/// `POST /v1/sessions/:id/workspace`: a change set, paths not yet checked.
pub fn validate_change_set(body: Option<Value>) -> Result<WorkspaceChangeSet, ValidationError> {
    let mut body = body.unwrap_or(Value::Null);
    check(&CHANGE_SET, &mut body, ROOT)?;
    let changes: WorkspaceChangeSet = typed(body)?;
    if changes.write.len() + changes.delete.len() > MAX_CHANGE_SET_ENTRIES {
        return Err(fail(
            ROOT,
            format_args!("must NOT have more than {MAX_CHANGE_SET_ENTRIES} writes and deletes"),
        ));
    }
    Ok(changes)
}

/// Our bound on `apps`: each app is a process or a container.
pub const MAX_APPS: usize = 16;
/// Our bound on the entries of one change set.
pub const MAX_CHANGE_SET_ENTRIES: usize = 10_000;

fn app_list(value: Value) -> Result<Vec<AppSpec>, ValidationError> {
    let apps: Vec<AppSpec> = typed(value)?;
    if apps.len() > MAX_APPS {
        return Err(fail(
            &child_path(ROOT, "apps"),
            format_args!("must NOT have more than {MAX_APPS} items"),
        ));
    }
    if let Some(index) = apps.iter().position(|app| app.ports.len() > MAX_PORTS) {
        let path = format!("{}/{index}", child_path(ROOT, "apps"));
        return Err(fail(
            &child_path(&path, "ports"),
            format_args!("must NOT have more than {MAX_PORTS} items"),
        ));
    }
    Ok(apps)
}

/// `POST /v1/apps/:name/sessions`. Every field is optional, but the body itself
/// must be an object.
pub fn validate_app_session(body: Option<Value>) -> Result<AppSessionBody, ValidationError> {
    let mut body = body.unwrap_or(Value::Null);
    check(&APP_SESSION, &mut body, ROOT)?;
    let mut fields = into_object(body)?;
    let env = env_entries(fields.remove("env"))?;
    // Our hardening: the client of an app session supplies data to the
    // operator's program, never code (`app_env`).
    let env_path = child_path(ROOT, "env");
    if let Some((name, reason)) = env
        .iter()
        .find_map(|(name, _)| Some((name, refused_client_variable(name)?)))
    {
        return Err(fail(
            &child_path(&env_path, name),
            format_args!("is not accepted for an app session: {reason}"),
        ));
    }
    let ports = port_list(fields.remove("ports"))?;
    Ok(AppSessionBody {
        env,
        ports,
        inspect: flag(fields.remove("inspect")),
    })
}

/// `POST /v1/probe`: the image and pull policy to probe. Unknown properties,
/// at the top level and inside `config`, are dropped rather than rejected
/// (`additionalProperties: false` with `removeAdditional`), which is what lets
/// the editor send its whole session config.
pub fn validate_probe(body: Option<Value>) -> Result<(String, PullPolicy), ValidationError> {
    #[derive(serde::Deserialize)]
    struct ProbeConfig {
        image: String,
        #[serde(rename = "pullPolicy")]
        pull_policy: PullPolicy,
    }
    let mut body = body.unwrap_or(Value::Null);
    check(&PROBE, &mut body, ROOT)?;
    let mut fields = into_object(body)?;
    let config: ProbeConfig = typed(fields.remove("config").unwrap_or(Value::Null))?;
    Ok((config.image, config.pull_policy))
}

// ---------------------------------------------------------------------------
// Typed extraction from an already-checked value, plus our hardening.

fn into_object(value: Value) -> Result<Map<String, Value>, ValidationError> {
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(fail(ROOT, "must be object")),
    }
}

/// Deserializes a part the walker has already checked. The schema and the
/// serde types agree, so this cannot fail in practice; if they ever drift the
/// client still gets a 400 rather than the runner a panic.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, ValidationError> {
    serde_json::from_value(value).map_err(|err| fail(ROOT, err))
}

fn flag(value: Option<Value>) -> bool {
    value.as_ref().and_then(Value::as_bool).unwrap_or(false)
}

/// The checked `env` object as ordered pairs, with our extra rules: at most
/// [`MAX_ENV_ENTRIES`] entries; names non-empty without `=` or NUL (anything
/// else cannot be put into a process environment and would only fail at
/// spawn time); values without NUL (same reason). These run after the
/// reference-compatible checks, so a body the reference rejects gets the
/// reference's message.
fn env_entries(value: Option<Value>) -> Result<Vec<(String, String)>, ValidationError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let env_path = child_path(ROOT, "env");
    let Value::Object(mut map) = value else {
        return Err(fail(&env_path, "must be object"));
    };
    if map.len() > MAX_ENV_ENTRIES {
        return Err(fail(
            &env_path,
            format_args!("must NOT have more than {MAX_ENV_ENTRIES} properties"),
        ));
    }
    let order: Vec<String> = js_own_key_order(&map)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut entries = Vec::with_capacity(order.len());
    for key in order {
        let path = child_path(&env_path, &key);
        if key.is_empty() || key.contains(['=', '\0']) {
            return Err(fail(&path, "must be a valid environment variable name"));
        }
        let Some(Value::String(text)) = map.remove(&key) else {
            return Err(fail(&path, "must be string"));
        };
        if text.contains('\0') {
            return Err(fail(&path, "must not contain NUL"));
        }
        if key.len() + text.len() + 2 > MAX_ENV_ENTRY_BYTES {
            return Err(fail(
                &path,
                format!(
                    "must be shorter: NAME=value may take at most {MAX_ENV_ENTRY_BYTES} bytes in a process environment"
                ),
            ));
        }
        entries.push((key, text));
    }
    Ok(entries)
}

/// The checked `ports` array, capped at [`MAX_PORTS`] (our hardening).
fn port_list(value: Option<Value>) -> Result<Vec<PortMapping>, ValidationError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    if value
        .as_array()
        .is_some_and(|ports| ports.len() > MAX_PORTS)
    {
        return Err(fail(
            &child_path(ROOT, "ports"),
            format_args!("must NOT have more than {MAX_PORTS} items"),
        ));
    }
    typed(value)
}

#[cfg(test)]
mod tests;
