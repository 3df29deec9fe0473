//! Request-body validation with the reference's observable behaviour
//! (contract §0): Fastify validates bodies with AJV using `coerceTypes:
//! "array"`, `removeAdditional: true` and `allErrors: false`, and answers
//! `400` with `body<instancePath> <message>` for the first failure.
//!
//! Clients rely on the coercions (`"port":"8080"` is a port, a numeric env
//! value is a string), so this is a small schema walker that reproduces AJV's
//! rules and keyword order for the three body schemas of §2.3–§2.5 rather than
//! a generic JSON Schema engine:
//!
//! * per schema: the type check (with coercion) first, then `enum`, then the
//!   type's own keywords — for numbers `maximum` before `minimum`; for objects
//!   `required` (in array order), then `additionalProperties`, then
//!   `properties` in schema order; for arrays `items` in index order;
//! * object keys are visited in JavaScript's own-key order.

use serde::de::DeserializeOwned;
use serde_json::{Map, Number, Value};

use crate::app_env::refused_client_variable;
use crate::js::{js_number, js_own_key_order};
use crate::types::{PortMapping, PullPolicy, RunBundle, SessionConfig};

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
    /// `registry_url` is kept verbatim: whitespace-only passes validation and
    /// is treated as unset by the caller (§2.4).
    pub config: SessionConfig,
    pub inspect: bool,
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
    let config: SessionConfig = typed(fields.remove("config").unwrap_or(Value::Null))?;
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
    Ok(StartSessionBody {
        bundle: typed(fields.remove("bundle").unwrap_or(Value::Null))?,
        env,
        ports,
        config,
        inspect: flag(fields.remove("inspect")),
    })
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
// The schemas (§2.3–§2.5), in the reference's property order.

const PULL_POLICIES: &[&str] = &PullPolicy::ALL;

enum Schema {
    Object {
        required: &'static [&'static str],
        properties: &'static [(&'static str, &'static Schema)],
        additional: Additional,
    },
    Array {
        items: &'static Schema,
    },
    String {
        min_length: usize,
        one_of: Option<&'static [&'static str]>,
    },
    Integer {
        minimum: i64,
        maximum: i64,
    },
    Boolean,
}

enum Additional {
    /// No `additionalProperties`: unknown keys pass through untouched.
    Keep,
    /// `additionalProperties: false` under `removeAdditional`: deleted, no error.
    Strip,
    /// Every other key must match this schema.
    Each(&'static Schema),
}

static NON_EMPTY_STRING: Schema = Schema::String {
    min_length: 1,
    one_of: None,
};
static ANY_STRING: Schema = Schema::String {
    min_length: 0,
    one_of: None,
};
static PULL_POLICY: Schema = Schema::String {
    min_length: 0,
    one_of: Some(PULL_POLICIES),
};
static BOOLEAN: Schema = Schema::Boolean;

static BUNDLE_FILE: Schema = Schema::Object {
    required: &["relativePath", "contents"],
    properties: &[
        ("relativePath", &NON_EMPTY_STRING),
        ("contents", &ANY_STRING),
    ],
    additional: Additional::Keep,
};
static BUNDLE: Schema = Schema::Object {
    required: &["entryRelativePath", "files"],
    properties: &[
        ("entryRelativePath", &NON_EMPTY_STRING),
        (
            "files",
            &Schema::Array {
                items: &BUNDLE_FILE,
            },
        ),
    ],
    additional: Additional::Keep,
};
static ENV: Schema = Schema::Object {
    required: &[],
    properties: &[],
    additional: Additional::Each(&ANY_STRING),
};
static PORT_MAPPING: Schema = Schema::Object {
    required: &["port", "protocol"],
    properties: &[
        (
            "port",
            &Schema::Integer {
                minimum: 1,
                maximum: 65535,
            },
        ),
        (
            "protocol",
            &Schema::String {
                min_length: 0,
                one_of: Some(&["tcp", "udp"]),
            },
        ),
    ],
    additional: Additional::Keep,
};
static PORTS: Schema = Schema::Array {
    items: &PORT_MAPPING,
};
static SESSION_CONFIG: Schema = Schema::Object {
    required: &["image", "pullPolicy"],
    properties: &[
        ("image", &NON_EMPTY_STRING),
        ("pullPolicy", &PULL_POLICY),
        ("registryUrl", &NON_EMPTY_STRING),
    ],
    additional: Additional::Keep,
};
static START_SESSION: Schema = Schema::Object {
    required: &["bundle", "env", "config"],
    properties: &[
        ("bundle", &BUNDLE),
        ("env", &ENV),
        ("ports", &PORTS),
        ("config", &SESSION_CONFIG),
        ("inspect", &BOOLEAN),
    ],
    additional: Additional::Keep,
};
static APP_SESSION: Schema = Schema::Object {
    required: &[],
    properties: &[("env", &ENV), ("ports", &PORTS), ("inspect", &BOOLEAN)],
    additional: Additional::Keep,
};
static PROBE: Schema = Schema::Object {
    required: &["config"],
    properties: &[(
        "config",
        &Schema::Object {
            required: &["image", "pullPolicy"],
            properties: &[("image", &NON_EMPTY_STRING), ("pullPolicy", &PULL_POLICY)],
            additional: Additional::Strip,
        },
    )],
    additional: Additional::Strip,
};

// ---------------------------------------------------------------------------
// The walker.

/// Fastify's `dataVar` for bodies; instance paths are appended to it.
const ROOT: &str = "body";

fn fail(path: &str, message: impl std::fmt::Display) -> ValidationError {
    ValidationError {
        message: format!("{path} {message}"),
    }
}

/// `path` + `/` + the key as a JSON Pointer token (`~` → `~0`, `/` → `~1`).
fn child_path(path: &str, key: &str) -> String {
    let token = key.replace('~', "~0").replace('/', "~1");
    format!("{path}/{token}")
}

/// Validates `value` against `schema`, coercing it in place as AJV does.
fn check(schema: &Schema, value: &mut Value, path: &str) -> Result<(), ValidationError> {
    match schema {
        Schema::Object {
            required,
            properties,
            additional,
        } => {
            // Objects are never coerced, not even out of a one-element array.
            let Value::Object(map) = value else {
                return Err(fail(path, "must be object"));
            };
            if let Some(missing) = required.iter().find(|name| !map.contains_key(**name)) {
                return Err(fail(
                    path,
                    format_args!("must have required property '{missing}'"),
                ));
            }
            let is_declared = |key: &str| properties.iter().any(|(name, _)| *name == key);
            match additional {
                Additional::Keep => {}
                Additional::Strip => map.retain(|key, _| is_declared(key)),
                Additional::Each(each) => {
                    let extra: Vec<String> = js_own_key_order(map)
                        .into_iter()
                        .filter(|key| !is_declared(key))
                        .map(str::to_owned)
                        .collect();
                    for key in extra {
                        if let Some(item) = map.get_mut(&key) {
                            check(each, item, &child_path(path, &key))?;
                        }
                    }
                }
            }
            for (name, property) in *properties {
                if let Some(item) = map.get_mut(*name) {
                    check(property, item, &child_path(path, name))?;
                }
            }
            Ok(())
        }
        Schema::Array { items } => {
            if !value.is_array() {
                // A scalar (or null) where an array is expected is wrapped.
                if matches!(value, Value::Object(_)) {
                    return Err(fail(path, "must be array"));
                }
                *value = Value::Array(vec![value.take()]);
            }
            if let Value::Array(elements) = value {
                for (index, element) in elements.iter_mut().enumerate() {
                    check(items, element, &format!("{path}/{index}"))?;
                }
            }
            Ok(())
        }
        Schema::String { min_length, one_of } => {
            let text = coerce(value, Scalar::String)
                .and_then(|_| value.as_str())
                .ok_or_else(|| fail(path, "must be string"))?;
            if let Some(allowed) = one_of
                && !allowed.contains(&text)
            {
                return Err(fail(path, "must be equal to one of the allowed values"));
            }
            if text.chars().count() < *min_length {
                return Err(fail(
                    path,
                    format_args!("must NOT have fewer than {min_length} characters"),
                ));
            }
            Ok(())
        }
        Schema::Integer { minimum, maximum } => {
            let number =
                coerce(value, Scalar::Integer).ok_or_else(|| fail(path, "must be integer"))?;
            let (low, high) = (*minimum as f64, *maximum as f64);
            if number > high {
                return Err(fail(path, format_args!("must be <= {maximum}")));
            }
            if number < low {
                return Err(fail(path, format_args!("must be >= {minimum}")));
            }
            // Store whole numbers as integers so typed deserialization
            // (`u16` ports) accepts `8080.0` and coerced values alike.
            *value = integer_value(number);
            Ok(())
        }
        Schema::Boolean => coerce(value, Scalar::Boolean)
            .map(|_| ())
            .ok_or_else(|| fail(path, "must be boolean")),
    }
}

#[derive(Clone, Copy)]
enum Scalar {
    String,
    Integer,
    Boolean,
}

/// AJV's `coerceTypes: "array"` for one scalar type. On success `value` holds
/// the coerced value and the result is `Some` (the number, for integers);
/// `None` means a type error.
///
/// A one-element array is unwrapped first; if its element still has the wrong
/// type, the scalar coercions are tried on the element.
fn coerce(value: &mut Value, target: Scalar) -> Option<f64> {
    if let Some(number) = matches_scalar(value, target) {
        return Some(number);
    }
    let candidate = match &*value {
        Value::Array(elements) if elements.len() == 1 => elements[0].clone(),
        other => other.clone(),
    };
    if let Some(number) = matches_scalar(&candidate, target) {
        *value = candidate;
        return Some(number);
    }
    let coerced = match (target, &candidate) {
        (Scalar::String, Value::Number(n)) => Value::String(js_number_to_string(number_f64(n))),
        (Scalar::String, Value::Bool(b)) => Value::String(b.to_string()),
        (Scalar::String, Value::Null) => Value::String(String::new()),
        (Scalar::Integer, Value::Bool(b)) => Value::from(u8::from(*b)),
        (Scalar::Integer, Value::Null) => Value::from(0),
        // `data && data == +data && !(data % 1)`: a non-empty string whose
        // `Number()` is whole. Non-finite results ("Infinity") would slip
        // through AJV's range keywords; we refuse them as non-integers.
        (Scalar::Integer, Value::String(text)) if !text.is_empty() => {
            let number = js_number(text).filter(|n| n.is_finite() && n.fract() == 0.0)?;
            integer_value(number)
        }
        (Scalar::Boolean, Value::String(text)) if text == "false" => Value::Bool(false),
        (Scalar::Boolean, Value::String(text)) if text == "true" => Value::Bool(true),
        (Scalar::Boolean, Value::Null) => Value::Bool(false),
        (Scalar::Boolean, Value::Number(n)) if number_f64(n) == 0.0 => Value::Bool(false),
        (Scalar::Boolean, Value::Number(n)) if number_f64(n) == 1.0 => Value::Bool(true),
        _ => return None,
    };
    let number = matches_scalar(&coerced, target);
    *value = coerced;
    number
}

/// `Some` when `value` already has the target type (with `strictNumbers`,
/// integers must be finite whole numbers); the number for integers, `0.0`
/// otherwise.
fn matches_scalar(value: &Value, target: Scalar) -> Option<f64> {
    match (target, value) {
        (Scalar::String, Value::String(_)) | (Scalar::Boolean, Value::Bool(_)) => Some(0.0),
        (Scalar::Integer, Value::Number(n)) => {
            let number = number_f64(n);
            (number.is_finite() && number.fract() == 0.0).then_some(number)
        }
        _ => None,
    }
}

/// The value JavaScript's `JSON.parse` would produce for this number.
fn number_f64(n: &Number) -> f64 {
    n.as_f64().unwrap_or(f64::NAN)
}

fn integer_value(number: f64) -> Value {
    // -2^63..2^63: in range for i64, so the conversion is exact for a whole
    // number.
    const I64_RANGE: std::ops::Range<f64> =
        -9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0;
    if I64_RANGE.contains(&number) {
        Value::from(number as i64)
    } else {
        Number::from_f64(number).map_or(Value::Null, Value::Number)
    }
}

/// JavaScript's `Number.prototype.toString()` for a finite number: the
/// shortest round-tripping digits, in plain notation for decimal exponents in
/// `-7..21` and as `d.ddde±x` outside it (`1e+21`, `1e-7`).
fn js_number_to_string(number: f64) -> String {
    if number.is_nan() {
        return "NaN".to_owned();
    }
    if number == 0.0 {
        return "0".to_owned();
    }
    if number.is_infinite() {
        return if number > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        }
        .to_owned();
    }
    let sign = if number < 0.0 { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits as `d[.ddd]e<exp>`.
    let scientific = format!("{:e}", number.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i64 = exponent.parse().unwrap_or(0);
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    // JavaScript's `n`: the decimal point sits after the first `n` digits.
    let n = exponent + 1;
    let body = if k <= n && n <= 21 {
        let zeros = usize::try_from(n - k).unwrap_or(0);
        format!("{digits}{}", "0".repeat(zeros))
    } else if 0 < n && n <= 21 {
        let split = usize::try_from(n).unwrap_or(0);
        format!("{}.{}", &digits[..split], &digits[split..])
    } else if -6 < n && n <= 0 {
        let zeros = usize::try_from(-n).unwrap_or(0);
        format!("0.{}{digits}", "0".repeat(zeros))
    } else {
        let exponent_sign = if n - 1 < 0 { '-' } else { '+' };
        let magnitude = (n - 1).abs();
        match digits.split_at_checked(1) {
            Some((first, rest)) if !rest.is_empty() => {
                format!("{first}.{rest}e{exponent_sign}{magnitude}")
            }
            _ => format!("{digits}e{exponent_sign}{magnitude}"),
        }
    };
    format!("{sign}{body}")
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
