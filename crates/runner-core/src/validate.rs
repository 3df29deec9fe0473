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
mod tests {
    use super::*;
    use crate::types::{BundleFile, PortProtocol};
    use rstest::rstest;
    use serde_json::json;

    fn start_body() -> Value {
        json!({
            "bundle": {"entryRelativePath": "telo.yaml", "files": [{"relativePath": "telo.yaml", "contents": "kind: App"}]},
            "env": {},
            "config": {"image": "telorun/node:0-slim", "pullPolicy": "missing"}
        })
    }

    /// `start_body()` with the JSON Pointer `pointer` set to `value`.
    fn start_body_with(pointer: &str, value: Value) -> Value {
        let mut body = start_body();
        set(&mut body, pointer, value);
        body
    }

    fn set(body: &mut Value, pointer: &str, value: Value) {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let parent = body.pointer_mut(parent).unwrap();
        match parent {
            Value::Object(map) => {
                map.insert(key.to_owned(), value);
            }
            Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
            _ => panic!("cannot set {pointer}"),
        }
    }

    fn start_message(body: Value) -> String {
        validate_start_session(Some(body)).unwrap_err().message
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_minimal_start_body_is_accepted_with_defaults() {
        let body = validate_start_session(Some(start_body())).unwrap();
        assert_eq!(
            body,
            StartSessionBody {
                bundle: RunBundle {
                    entry_relative_path: "telo.yaml".into(),
                    files: vec![BundleFile {
                        relative_path: "telo.yaml".into(),
                        contents: "kind: App".into()
                    }],
                },
                env: vec![],
                ports: vec![],
                config: SessionConfig {
                    image: "telorun/node:0-slim".into(),
                    pull_policy: PullPolicy::Missing,
                    registry_url: None
                },
                inspect: false,
            }
        );
    }

    #[test]
    fn a_full_start_body_keeps_everything_and_ignores_unknown_fields() {
        let body = json!({
            "bundle": {"entryRelativePath": "app/telo.yaml", "files": [], "extra": 1},
            "env": {"B": "2", "A": "1", "10": "ten", "2": "two"},
            "ports": [{"port": 8080, "protocol": "tcp"}, {"port": 53, "protocol": "udp", "name": "dns"}],
            "config": {"image": "img", "pullPolicy": "never", "registryUrl": "  ", "baseUrl": "x"},
            "inspect": true,
            "app": "legacy"
        });
        let body = validate_start_session(Some(body)).unwrap();
        assert_eq!(body.bundle.entry_relative_path, "app/telo.yaml");
        assert!(body.bundle.files.is_empty());
        assert_eq!(
            body.env,
            pairs(&[("2", "two"), ("10", "ten"), ("B", "2"), ("A", "1")])
        );
        assert_eq!(
            body.ports,
            vec![
                PortMapping {
                    port: 8080,
                    protocol: PortProtocol::Tcp
                },
                PortMapping {
                    port: 53,
                    protocol: PortProtocol::Udp
                },
            ]
        );
        assert_eq!(body.config.pull_policy, PullPolicy::Never);
        assert_eq!(body.config.registry_url.as_deref(), Some("  "));
        assert!(body.inspect);
    }

    #[rstest]
    #[case::absent(None, "body must be object")]
    #[case::null(Some(json!(null)), "body must be object")]
    #[case::array(Some(json!([{}])), "body must be object")]
    #[case::string(Some(json!("{}")), "body must be object")]
    #[case::empty(Some(json!({})), "body must have required property 'bundle'")]
    #[case::env_only(Some(json!({"env": {}})), "body must have required property 'bundle'")]
    #[case::no_env(Some(json!({"bundle": 1, "config": 1})), "body must have required property 'env'")]
    #[case::no_config(Some(json!({"bundle": 1, "env": 1})), "body must have required property 'config'")]
    fn start_bodies_must_be_objects_with_the_required_fields(
        #[case] body: Option<Value>,
        #[case] message: &str,
    ) {
        assert_eq!(validate_start_session(body).unwrap_err().message, message);
    }

    #[rstest]
    #[case("/bundle", json!([]), "body/bundle must be object")]
    #[case("/bundle", json!(null), "body/bundle must be object")]
    #[case("/bundle", json!({"files": []}), "body/bundle must have required property 'entryRelativePath'")]
    #[case("/bundle", json!({"entryRelativePath": "x"}), "body/bundle must have required property 'files'")]
    #[case("/bundle/entryRelativePath", json!(""), "body/bundle/entryRelativePath must NOT have fewer than 1 characters")]
    #[case("/bundle/entryRelativePath", json!(null), "body/bundle/entryRelativePath must NOT have fewer than 1 characters")]
    #[case("/bundle/entryRelativePath", json!({}), "body/bundle/entryRelativePath must be string")]
    #[case("/bundle/files", json!({}), "body/bundle/files must be array")]
    #[case("/bundle/files", json!(null), "body/bundle/files/0 must be object")]
    #[case("/bundle/files", json!("a.yaml"), "body/bundle/files/0 must be object")]
    #[case("/bundle/files/0", json!({"contents": ""}), "body/bundle/files/0 must have required property 'relativePath'")]
    #[case("/bundle/files/0", json!({"relativePath": "a"}), "body/bundle/files/0 must have required property 'contents'")]
    #[case("/bundle/files/0/relativePath", json!({}), "body/bundle/files/0/relativePath must be string")]
    #[case("/bundle/files/0/relativePath", json!([[1]]), "body/bundle/files/0/relativePath must be string")]
    #[case("/bundle/files/0/relativePath", json!(""), "body/bundle/files/0/relativePath must NOT have fewer than 1 characters")]
    #[case("/bundle/files/0/contents", json!({"a": 1}), "body/bundle/files/0/contents must be string")]
    #[case("/bundle/files/0/contents", json!([]), "body/bundle/files/0/contents must be string")]
    #[case("/env", json!(null), "body/env must be object")]
    #[case("/env", json!([]), "body/env must be object")]
    #[case("/env", json!("A=1"), "body/env must be object")]
    #[case("/env", json!({"FOO": {}}), "body/env/FOO must be string")]
    #[case("/env", json!({"FOO": [1, 2]}), "body/env/FOO must be string")]
    #[case("/env", json!({"a/b~c": {}}), "body/env/a~1b~0c must be string")]
    #[case("/env", json!({"Z": {}, "7": {}}), "body/env/7 must be string")]
    #[case("/ports", json!({}), "body/ports must be array")]
    #[case("/ports", json!(8080), "body/ports/0 must be object")]
    #[case("/ports", json!([8080]), "body/ports/0 must be object")]
    #[case("/ports", json!([{"protocol": "tcp"}]), "body/ports/0 must have required property 'port'")]
    #[case("/ports", json!([{"port": 1}]), "body/ports/0 must have required property 'protocol'")]
    #[case("/ports", json!([{"port": 0, "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
    #[case("/ports", json!([{"port": false, "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
    #[case("/ports", json!([{"port": null, "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
    #[case("/ports", json!([{"port": "", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
    #[case("/ports", json!([{"port": "  ", "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
    #[case("/ports", json!([{"port": 65536, "protocol": "tcp"}]), "body/ports/0/port must be <= 65535")]
    #[case("/ports", json!([{"port": "1e9", "protocol": "tcp"}]), "body/ports/0/port must be <= 65535")]
    #[case("/ports", json!([{"port": 80.5, "protocol": "tcp"}]), "body/ports/0/port must be integer")]
    #[case("/ports", json!([{"port": "80.5", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
    #[case("/ports", json!([{"port": "http", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
    #[case("/ports", json!([{"port": "Infinity", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
    #[case("/ports", json!([{"port": [80, 81], "protocol": "tcp"}]), "body/ports/0/port must be integer")]
    #[case("/ports", json!([{"port": {}, "protocol": "tcp"}]), "body/ports/0/port must be integer")]
    #[case("/ports", json!([{"port": 80, "protocol": "TCP"}]), "body/ports/0/protocol must be equal to one of the allowed values")]
    #[case("/ports", json!([{"port": 80, "protocol": "sctp"}]), "body/ports/0/protocol must be equal to one of the allowed values")]
    #[case("/ports", json!([{"port": 80, "protocol": null}]), "body/ports/0/protocol must be equal to one of the allowed values")]
    #[case("/ports", json!([{"port": 80, "protocol": "tcp"}, {"port": 80, "protocol": 6}]), "body/ports/1/protocol must be equal to one of the allowed values")]
    #[case("/config", json!("img"), "body/config must be object")]
    #[case("/config", json!({"pullPolicy": "missing"}), "body/config must have required property 'image'")]
    #[case("/config", json!({"image": "x"}), "body/config must have required property 'pullPolicy'")]
    #[case("/config/image", json!(""), "body/config/image must NOT have fewer than 1 characters")]
    #[case("/config/image", json!(null), "body/config/image must NOT have fewer than 1 characters")]
    #[case("/config/image", json!({}), "body/config/image must be string")]
    #[case("/config/pullPolicy", json!("sometimes"), "body/config/pullPolicy must be equal to one of the allowed values")]
    #[case("/config/pullPolicy", json!("Always"), "body/config/pullPolicy must be equal to one of the allowed values")]
    #[case("/config/pullPolicy", json!(["always", "never"]), "body/config/pullPolicy must be string")]
    #[case("/config/registryUrl", json!(""), "body/config/registryUrl must NOT have fewer than 1 characters")]
    #[case("/config/registryUrl", json!(null), "body/config/registryUrl must NOT have fewer than 1 characters")]
    #[case("/config/registryUrl", json!({}), "body/config/registryUrl must be string")]
    #[case("/inspect", json!("yes"), "body/inspect must be boolean")]
    #[case("/inspect", json!("TRUE"), "body/inspect must be boolean")]
    #[case("/inspect", json!(2), "body/inspect must be boolean")]
    #[case("/inspect", json!({}), "body/inspect must be boolean")]
    #[case("/inspect", json!([true, false]), "body/inspect must be boolean")]
    fn start_body_fields_report_ajv_messages(
        #[case] pointer: &str,
        #[case] value: Value,
        #[case] message: &str,
    ) {
        assert_eq!(start_message(start_body_with(pointer, value)), message);
    }

    #[test]
    fn only_the_first_error_in_schema_order_is_reported() {
        let body = json!({
            "inspect": "nope",
            "config": {},
            "ports": [{"port": 0}],
            "env": {"A": {}},
            "bundle": {"entryRelativePath": ""}
        });
        assert_eq!(
            start_message(body),
            "body/bundle must have required property 'files'"
        );
        let body = json!({
            "inspect": "nope",
            "config": {},
            "ports": [{"port": 0, "protocol": "tcp"}],
            "env": {"A": "1"},
            "bundle": {"entryRelativePath": "a", "files": []}
        });
        assert_eq!(start_message(body), "body/ports/0/port must be >= 1");
    }

    #[rstest]
    #[case::number_string(json!("8080"), 8080)]
    #[case::padded_string(json!(" 8080 "), 8080)]
    #[case::hex_string(json!("0x1F90"), 8080)]
    #[case::exponent_string(json!("8.08e3"), 8080)]
    #[case::float_with_zero_fraction(json!(8080.0), 8080)]
    #[case::exponent_number(json!(8.08e3), 8080)]
    #[case::one_element_array(json!([8080]), 8080)]
    #[case::one_element_array_of_string(json!(["8080"]), 8080)]
    #[case::boolean_true(json!(true), 1)]
    fn ports_are_coerced_to_integers(#[case] port: Value, #[case] expected: u16) {
        let body = start_body_with("/ports", json!([{"port": port, "protocol": "tcp"}]));
        let body = validate_start_session(Some(body)).unwrap();
        assert_eq!(body.ports[0].port, expected);
    }

    #[test]
    fn a_single_port_mapping_is_wrapped_into_a_list() {
        let body = start_body_with("/ports", json!({"port": "9229", "protocol": ["udp"]}));
        // An object is not wrapped: only scalars are.
        assert_eq!(start_message(body), "body/ports must be array");
        let body = start_body_with("/ports", json!([{"port": "9229", "protocol": ["udp"]}]));
        assert_eq!(
            validate_start_session(Some(body)).unwrap().ports,
            vec![PortMapping {
                port: 9229,
                protocol: PortProtocol::Udp
            }]
        );
    }

    #[rstest]
    #[case::integer(json!(42), "42")]
    #[case::negative(json!(-7), "-7")]
    #[case::float(json!(1.5), "1.5")]
    #[case::whole_float(json!(3.0), "3")]
    #[case::tiny(json!(1e-7), "1e-7")]
    #[case::small(json!(0.000001), "0.000001")]
    #[case::large(json!(1e21), "1e+21")]
    #[case::below_exponent_form(json!(1e20), "100000000000000000000")]
    #[case::big_mantissa(json!(1.2345e25), "1.2345e+25")]
    #[case::beyond_f64_precision(json!(12345678901234567890u64), "12345678901234567000")]
    #[case::min_i64(json!(i64::MIN), "-9223372036854776000")]
    #[case::fraction(json!(0.1), "0.1")]
    #[case::true_(json!(true), "true")]
    #[case::false_(json!(false), "false")]
    #[case::null(json!(null), "")]
    #[case::one_element_array(json!(["x"]), "x")]
    #[case::one_element_array_of_number(json!([5]), "5")]
    #[case::one_element_array_of_null(json!([null]), "")]
    fn env_values_are_coerced_to_strings(#[case] value: Value, #[case] expected: &str) {
        let body = start_body_with("/env", json!({"V": value}));
        let body = validate_start_session(Some(body)).unwrap();
        assert_eq!(body.env, pairs(&[("V", expected)]));
    }

    #[rstest]
    #[case::string_true(json!("true"), true)]
    #[case::string_false(json!("false"), false)]
    #[case::one(json!(1), true)]
    #[case::zero(json!(0), false)]
    #[case::one_float(json!(1.0), true)]
    #[case::null(json!(null), false)]
    #[case::wrapped(json!([true]), true)]
    #[case::wrapped_string(json!(["true"]), true)]
    fn inspect_is_coerced_to_boolean(#[case] value: Value, #[case] expected: bool) {
        let body = start_body_with("/inspect", value);
        assert_eq!(
            validate_start_session(Some(body)).unwrap().inspect,
            expected
        );
    }

    #[rstest]
    #[case::number_image("/config/image", json!(5), "5")]
    #[case::bool_image("/config/image", json!(true), "true")]
    #[case::wrapped_image("/config/image", json!(["img:1"]), "img:1")]
    #[case::number_path("/bundle/entryRelativePath", json!(7), "7")]
    fn strings_are_coerced_from_scalars(
        #[case] pointer: &str,
        #[case] value: Value,
        #[case] expected: &str,
    ) {
        let body = validate_start_session(Some(start_body_with(pointer, value))).unwrap();
        let actual = if pointer.starts_with("/config") {
            body.config.image
        } else {
            body.bundle.entry_relative_path
        };
        assert_eq!(actual, expected);
    }

    #[test]
    fn a_wrapped_pull_policy_and_coerced_contents_are_accepted() {
        let mut body = start_body_with("/config/pullPolicy", json!(["always"]));
        set(&mut body, "/bundle/files/0/contents", json!(null));
        let body = validate_start_session(Some(body)).unwrap();
        assert_eq!(body.config.pull_policy, PullPolicy::Always);
        assert_eq!(body.bundle.files[0].contents, "");
    }

    #[test]
    fn a_scalar_files_value_is_wrapped_then_rejected_as_an_item() {
        assert_eq!(
            start_message(start_body_with("/bundle/files", json!(true))),
            "body/bundle/files/0 must be object"
        );
    }

    #[rstest]
    #[case::empty_name(json!({"": "x"}), "body/env/ must be a valid environment variable name")]
    #[case::equals(json!({"A=B": "x"}), "body/env/A=B must be a valid environment variable name")]
    #[case::nul_name(json!({"A\u{0}": "x"}), "body/env/A\u{0} must be a valid environment variable name")]
    #[case::nul_value(json!({"A": "x\u{0}y"}), "body/env/A must not contain NUL")]
    #[case::too_long(json!({"BIG": "x".repeat(MAX_ENV_ENTRY_BYTES - 4)}), "body/env/BIG must be shorter: NAME=value may take at most 131072 bytes in a process environment")]
    fn env_entries_a_process_cannot_hold_are_rejected(#[case] env: Value, #[case] message: &str) {
        assert_eq!(start_message(start_body_with("/env", env)), message);
    }

    #[test]
    fn reference_errors_win_over_our_hardening() {
        let body = json!({"bundle": {"entryRelativePath": "a", "files": []}, "env": {"": "x"}, "config": {}});
        assert_eq!(
            start_message(body),
            "body/config must have required property 'image'"
        );
    }

    #[test]
    fn env_and_ports_are_bounded() {
        let env: Map<String, Value> = (0..=MAX_ENV_ENTRIES)
            .map(|i| (format!("K{i}"), json!("v")))
            .collect();
        assert_eq!(
            start_message(start_body_with("/env", Value::Object(env))),
            "body/env must NOT have more than 1000 properties"
        );
        let ports: Vec<Value> = (1..=MAX_PORTS + 1)
            .map(|port| json!({"port": port, "protocol": "tcp"}))
            .collect();
        assert_eq!(
            start_message(start_body_with("/ports", Value::Array(ports))),
            "body/ports must NOT have more than 100 items"
        );
        let env: Map<String, Value> = (0..MAX_ENV_ENTRIES)
            .map(|i| (format!("K{i}"), json!("v")))
            .collect();
        let ports: Vec<Value> = (1..=MAX_PORTS)
            .map(|port| json!({"port": port, "protocol": "tcp"}))
            .collect();
        let mut body = start_body_with("/env", Value::Object(env));
        set(&mut body, "/ports", Value::Array(ports));
        let body = validate_start_session(Some(body)).unwrap();
        assert_eq!(
            (body.env.len(), body.ports.len()),
            (MAX_ENV_ENTRIES, MAX_PORTS)
        );
    }

    #[test]
    fn app_bodies_default_every_field() {
        assert_eq!(
            validate_app_session(Some(json!({"anything": 1}))),
            Ok(AppSessionBody {
                env: vec![],
                ports: vec![],
                inspect: false
            })
        );
        let body = validate_app_session(Some(json!({
            "env": {"N": 1},
            "ports": {"port": 1, "protocol": "tcp"}
        })));
        assert_eq!(body.unwrap_err().message, "body/ports must be array");
        let body = validate_app_session(Some(json!({
            "env": {"N": 1},
            "ports": [{"port": "3000", "protocol": "tcp"}],
            "inspect": "true"
        })))
        .unwrap();
        assert_eq!(
            body,
            AppSessionBody {
                env: pairs(&[("N", "1")]),
                ports: vec![PortMapping {
                    port: 3000,
                    protocol: PortProtocol::Tcp
                }],
                inspect: true
            }
        );
    }

    #[rstest]
    #[case::absent(None, "body must be object")]
    #[case::array(Some(json!([])), "body must be object")]
    #[case::env(Some(json!({"env": "A=1"})), "body/env must be object")]
    #[case::env_value(Some(json!({"env": {"FOO": {}}})), "body/env/FOO must be string")]
    #[case::port(Some(json!({"ports": [{"port": 70000, "protocol": "tcp"}]})), "body/ports/0/port must be <= 65535")]
    #[case::inspect(Some(json!({"inspect": "on"})), "body/inspect must be boolean")]
    #[case::env_name(Some(json!({"env": {"A=B": "1"}})), "body/env/A=B must be a valid environment variable name")]
    #[case::node_options(Some(json!({"env": {"MODE": "x", "NODE_OPTIONS": "--import=data:,1"}})), "body/env/NODE_OPTIONS is not accepted for an app session: it changes how the operator's program loads or runs")]
    #[case::preload(Some(json!({"env": {"LD_PRELOAD": "/tmp/x.so"}})), "body/env/LD_PRELOAD is not accepted for an app session: it changes how the operator's program loads or runs")]
    #[case::path(Some(json!({"env": {"PATH": "/tmp"}})), "body/env/PATH is not accepted for an app session: it changes how the operator's program loads or runs")]
    fn app_bodies_report_ajv_messages(#[case] body: Option<Value>, #[case] message: &str) {
        assert_eq!(validate_app_session(body).unwrap_err().message, message);
    }

    #[test]
    fn probe_strips_unknown_properties() {
        let body = json!({
            "config": {"image": "img", "pullPolicy": "always", "registryUrl": "", "baseUrl": 1},
            "extra": {"deep": true}
        });
        assert_eq!(
            validate_probe(Some(body)),
            Ok(("img".to_owned(), PullPolicy::Always))
        );
    }

    #[rstest]
    #[case::absent(None, "body must be object")]
    #[case::empty(Some(json!({})), "body must have required property 'config'")]
    #[case::config_null(Some(json!({"config": null})), "body/config must be object")]
    #[case::no_image(Some(json!({"config": {"pullPolicy": "never"}})), "body/config must have required property 'image'")]
    #[case::no_policy(Some(json!({"config": {"image": "x"}})), "body/config must have required property 'pullPolicy'")]
    #[case::empty_image(Some(json!({"config": {"image": "", "pullPolicy": "never"}})), "body/config/image must NOT have fewer than 1 characters")]
    #[case::bad_policy(Some(json!({"config": {"image": "x", "pullPolicy": "latest"}})), "body/config/pullPolicy must be equal to one of the allowed values")]
    fn probe_bodies_report_ajv_messages(#[case] body: Option<Value>, #[case] message: &str) {
        assert_eq!(validate_probe(body).unwrap_err().message, message);
    }

    #[test]
    fn probe_coerces_like_the_other_routes() {
        assert_eq!(
            validate_probe(Some(
                json!({"config": {"image": 42, "pullPolicy": ["never"]}})
            )),
            Ok(("42".to_owned(), PullPolicy::Never))
        );
    }

    #[rstest]
    #[case(0.5, "0.5")]
    #[case(123.456, "123.456")]
    #[case(-0.0, "0")]
    #[case(100.0, "100")]
    #[case(1e-6, "0.000001")]
    #[case(1.5e-7, "1.5e-7")]
    #[case(123456789012345680000.0, "123456789012345680000")]
    #[case(5e-324, "5e-324")]
    #[case(f64::MAX, "1.7976931348623157e+308")]
    #[case(f64::INFINITY, "Infinity")]
    #[case(f64::NAN, "NaN")]
    fn numbers_print_like_javascript(#[case] number: f64, #[case] expected: &str) {
        assert_eq!(js_number_to_string(number), expected);
    }
}
