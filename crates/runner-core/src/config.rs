//! Core runner configuration read from the environment (contract §8.1).
//!
//! Parsing follows the reference's JavaScript semantics on purpose: an operator
//! who moves a working environment from the reference runner to ours must get
//! the same values, and a value the reference refuses must be refused here with
//! the same sentence. That is why this module carries small re-creations of
//! JavaScript's `Number(string)`, `String.prototype.trim` and object key order.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::apps::{AppCatalog, load_apps};
use crate::auth::{AuthTokens, load_auth_tokens};
use crate::terms::load_terms;
use crate::types::RunnerTerms;

/// The process environment as seen by the config loaders. A plain map so tests
/// never touch the real environment.
pub type Env = HashMap<String, String>;

/// A configuration value the runner refuses to start with. The text is the
/// whole message shown to the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

pub const DEFAULT_LOG_LEVEL: &str = "info";
pub const DEFAULT_MAX_SESSIONS: u64 = 32;
/// Exited sessions linger so a reloaded editor can re-attach and replay their
/// history; the registry evicts terminal sessions first at capacity, so a long
/// retention never blocks a new run.
pub const DEFAULT_EXIT_TTL_MS: u64 = 4 * 60 * 60 * 1000;
/// Applies to each of a session's two replay buffers (events and PTY bytes).
pub const DEFAULT_REPLAY_BUFFER_BYTES: u64 = 5_000_000;
/// The reference inherits Fastify's 1 MiB body limit; ours is the same by
/// default but can be raised for large bundles.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1_048_576;
pub const DEFAULT_SSE_HEARTBEAT_MS: u64 = 20_000;
/// Seconds a stopped workload gets between SIGTERM and the kill.
pub const DEFAULT_STOP_GRACE_SECONDS: u64 = 5;
/// Open client connections served at once (our hardening). Sized for the
/// chart's 256 MiB memory limit: each connection costs at most about 25 KiB
/// with the header cap below, so the limit is reached well before the limit
/// of the pod, and 1,100 idle plus 3,000 slow clients still fit beside the
/// editor.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 6_000;
/// A client that has not sent a request's whole header block within this
/// time, including an idle keep-alive connection, is disconnected.
pub const DEFAULT_HEADER_TIMEOUT_SECONDS: u64 = 10;
/// A request body that has not arrived in full within this time gets 408.
pub const DEFAULT_BODY_TIMEOUT_SECONDS: u64 = 30;
/// Largest request header block; bigger gets 431.
pub const DEFAULT_MAX_HEADER_BYTES: u64 = 16_384;
/// The smallest header cap the HTTP server can work with (its read buffer).
pub const MIN_MAX_HEADER_BYTES: u64 = 8_192;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// `Access-Control-Allow-Origin: *`.
    Any,
    /// Exact-match origins. May contain a literal `"*"`: whether that acts as a
    /// wildcard differs per route in the reference (§1.3), so callers decide.
    List(Vec<String>),
}

/// Everything `loadCoreConfig` resolves, plus our body limit, the terms and the
/// app catalog (resolved once at boot so what is advertised and what is
/// enforced can never drift).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreConfig {
    pub port: u16,
    pub log_level: String,
    pub max_sessions: usize,
    pub exit_ttl: Duration,
    pub replay_buffer_bytes: usize,
    pub cors_origins: CorsOrigins,
    pub default_registry_url: Option<String>,
    pub max_body_bytes: usize,
    /// Interval of the SSE heartbeat comment that keeps idle streams open
    /// through proxies.
    pub sse_heartbeat: Duration,
    pub terms: Option<RunnerTerms>,
    pub apps: AppCatalog,
    /// Bearer tokens every gated `/v1` route requires; `None` = no auth.
    pub auth_tokens: Option<AuthTokens>,
    /// How long a stopped workload may take to exit after SIGTERM (a pod's
    /// grace period) before it is killed.
    pub stop_grace: Duration,
    pub connections: ConnectionLimits,
}

/// What one client connection may cost the service (our hardening; the
/// reference has no such bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_header_bytes: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECONDS),
            body_timeout: Duration::from_secs(DEFAULT_BODY_TIMEOUT_SECONDS),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES as usize,
        }
    }
}

fn load_connection_limits(env: &Env) -> Result<ConnectionLimits, ConfigError> {
    let var = |key: &str| env.get(key).map(String::as_str);
    let max_connections = parse_positive_usize(
        var("RUNNER_MAX_CONNECTIONS"),
        DEFAULT_MAX_CONNECTIONS,
        "RUNNER_MAX_CONNECTIONS",
    )?;
    let header_timeout = parse_positive_int(
        var("RUNNER_HEADER_TIMEOUT_SECONDS"),
        DEFAULT_HEADER_TIMEOUT_SECONDS,
        "RUNNER_HEADER_TIMEOUT_SECONDS",
    )?;
    let body_timeout = parse_positive_int(
        var("RUNNER_BODY_TIMEOUT_SECONDS"),
        DEFAULT_BODY_TIMEOUT_SECONDS,
        "RUNNER_BODY_TIMEOUT_SECONDS",
    )?;
    let raw_header_bytes = var("RUNNER_MAX_HEADER_BYTES");
    let max_header_bytes = parse_whole_number(
        raw_header_bytes,
        DEFAULT_MAX_HEADER_BYTES,
        MIN_MAX_HEADER_BYTES,
        "RUNNER_MAX_HEADER_BYTES",
        "positive",
    )
    .map_err(|_| {
        ConfigError(format!(
            "RUNNER_MAX_HEADER_BYTES must be an integer of at least {MIN_MAX_HEADER_BYTES}, got '{}'.",
            raw_header_bytes.unwrap_or_default()
        ))
    })?;
    Ok(ConnectionLimits {
        max_connections,
        header_timeout: Duration::from_secs(header_timeout),
        body_timeout: Duration::from_secs(body_timeout),
        max_header_bytes: usize::try_from(max_header_bytes).unwrap_or(usize::MAX),
    })
}

/// An environment from literal pairs (tests, embedding).
pub fn env_from_pairs(pairs: &[(&str, &str)]) -> Env {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// Reads the core configuration. Variables are evaluated in a fixed order and
/// the first invalid one is reported, so the same environment always yields
/// the same message.
pub fn load_core_config(env: &Env, default_port: u16) -> Result<CoreConfig, ConfigError> {
    let var = |key: &str| env.get(key).map(String::as_str);
    let port = parse_port(var("PORT"), default_port)?;
    let log_level = env_string(env, "LOG_LEVEL").unwrap_or_else(|| DEFAULT_LOG_LEVEL.to_owned());
    let max_sessions = parse_positive_usize(
        var("RUNNER_MAX_SESSIONS"),
        DEFAULT_MAX_SESSIONS,
        "RUNNER_MAX_SESSIONS",
    )?;
    let exit_ttl_ms = parse_positive_int(
        var("RUNNER_EXIT_TTL_MS"),
        DEFAULT_EXIT_TTL_MS,
        "RUNNER_EXIT_TTL_MS",
    )?;
    let replay_buffer_bytes = parse_positive_usize(
        var("RUNNER_REPLAY_BUFFER_BYTES"),
        DEFAULT_REPLAY_BUFFER_BYTES,
        "RUNNER_REPLAY_BUFFER_BYTES",
    )?;
    let cors_origins = parse_cors_origins(var("RUNNER_CORS_ORIGINS"));
    let default_registry_url = env_string(env, "TELO_REGISTRY_URL");
    let max_body_bytes = parse_positive_usize(
        var("RUNNER_MAX_BODY_BYTES"),
        DEFAULT_MAX_BODY_BYTES,
        "RUNNER_MAX_BODY_BYTES",
    )?;
    let sse_heartbeat_ms = parse_positive_int(
        var("RUNNER_SSE_HEARTBEAT_MS"),
        DEFAULT_SSE_HEARTBEAT_MS,
        "RUNNER_SSE_HEARTBEAT_MS",
    )?;
    let stop_grace_seconds = parse_non_negative_int(
        var("RUNNER_STOP_GRACE_SECONDS"),
        DEFAULT_STOP_GRACE_SECONDS,
        "RUNNER_STOP_GRACE_SECONDS",
    )?;
    let terms = load_terms(env)?;
    let apps = load_apps(env)?;
    let auth_tokens = load_auth_tokens(env)?;
    let connections = load_connection_limits(env)?;
    Ok(CoreConfig {
        port,
        log_level,
        max_sessions,
        exit_ttl: Duration::from_millis(exit_ttl_ms),
        replay_buffer_bytes,
        cors_origins,
        default_registry_url,
        max_body_bytes,
        sse_heartbeat: Duration::from_millis(sse_heartbeat_ms),
        terms,
        apps,
        auth_tokens,
        stop_grace: Duration::from_secs(stop_grace_seconds),
        connections,
    })
}

/// One documented environment variable, for `--help` and the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvVarDoc {
    pub name: &'static str,
    pub default: &'static str,
    pub description: &'static str,
}

/// Every variable the core (and the binary's logging) reads.
pub const CORE_ENV_VARS: &[EnvVarDoc] = &[
    EnvVarDoc {
        name: "PORT",
        default: "8061",
        description: "TCP port the HTTP API listens on; an empty value is an error, not the default.",
    },
    EnvVarDoc {
        name: "LOG_LEVEL",
        default: "info",
        description: "Minimum severity of log lines (trace, debug, info, warn, error).",
    },
    EnvVarDoc {
        name: "LOG_FORMAT",
        default: "pretty",
        description: "Log line format: `json` for one JSON object per line, `pretty` for humans.",
    },
    EnvVarDoc {
        name: "RUNNER_MAX_SESSIONS",
        default: "32",
        description: "How many sessions may exist at once; finished ones are evicted first when the limit is hit.",
    },
    EnvVarDoc {
        name: "RUNNER_EXIT_TTL_MS",
        default: "14400000",
        description: "How long a finished session stays available for re-attach and replay, in milliseconds.",
    },
    EnvVarDoc {
        name: "RUNNER_REPLAY_BUFFER_BYTES",
        default: "5000000",
        description: "Byte cap of each of a session's two replay buffers (lifecycle events and terminal output).",
    },
    EnvVarDoc {
        name: "RUNNER_MAX_BODY_BYTES",
        default: "1048576",
        description: "Largest accepted request body in bytes; bigger requests get 413, so this bounds bundle size.",
    },
    EnvVarDoc {
        name: "RUNNER_SSE_HEARTBEAT_MS",
        default: "20000",
        description: "Interval of the `: heartbeat` comment on idle event streams; lower it behind proxies with short idle timeouts.",
    },
    EnvVarDoc {
        name: "RUNNER_MAX_CONNECTIONS",
        default: "6000",
        description: "Client connections served at once; past it a new connection gets 503 `too_many_connections` and is closed. Bounded further by the open-file limit, which is raised to its hard limit at boot.",
    },
    EnvVarDoc {
        name: "RUNNER_HEADER_TIMEOUT_SECONDS",
        default: "10",
        description: "A connection that has not sent a whole request header block within this time (idle keep-alive connections included) is closed.",
    },
    EnvVarDoc {
        name: "RUNNER_BODY_TIMEOUT_SECONDS",
        default: "30",
        description: "A request body not received in full within this time gets 408 `request_timeout`.",
    },
    EnvVarDoc {
        name: "RUNNER_MAX_HEADER_BYTES",
        default: "16384",
        description: "Largest request header block in bytes (at least 8192); bigger gets 431.",
    },
    EnvVarDoc {
        name: "RUNNER_STOP_GRACE_SECONDS",
        default: "5",
        description: "How long a stopped session's workload may take to exit after SIGTERM (on Kubernetes, the pod's grace period) before it is killed; 0 kills at once.",
    },
    EnvVarDoc {
        name: "RUNNER_CORS_ORIGINS",
        default: "*",
        description: "Comma-separated browser origins allowed to call the API, or `*` for any origin.",
    },
    EnvVarDoc {
        name: "TELO_REGISTRY_URL",
        default: "(unset)",
        description: "Module registry URL handed to workloads whose request supplies none.",
    },
    EnvVarDoc {
        name: "RUNNER_TERMS_FILE",
        default: "(unset)",
        description: "Path of a usage agreement clients must accept before starting sessions; unreadable is a boot error.",
    },
    EnvVarDoc {
        name: "RUNNER_TERMS_BODY",
        default: "(unset)",
        description: "Inline usage agreement text, used only when RUNNER_TERMS_FILE is not set.",
    },
    EnvVarDoc {
        name: "RUNNER_TERMS_TITLE",
        default: "Usage agreement",
        description: "Heading clients show above the usage agreement.",
    },
    EnvVarDoc {
        name: "RUNNER_TERMS_VERSION",
        default: "(hash of the body)",
        description: "Version clients must echo to accept the agreement; by default any edit of the text changes it.",
    },
    EnvVarDoc {
        name: "RUNNER_APPS",
        default: "(unset)",
        description: "JSON object of operator-defined apps launchable by name (`image`, `env`, `pullPolicy`, `title`, `description`, `command` for the local backend, `acceptEnv`: the only client variables it takes); treat it as a secret, its env may hold keys.",
    },
    EnvVarDoc {
        name: "RUNNER_AUTH_TOKENS_FILE",
        default: "(unset: no auth)",
        description: "File of bearer tokens, one per line (`#` comments allowed); when set, every /v1 route but health and capabilities needs `Authorization: Bearer <token>`.",
    },
];

/// `<field>` parsed like the reference's `parsePositiveInt`: unset or blank
/// means the fallback; otherwise JavaScript's `Number(raw)` must be a whole
/// number above zero (so `1e3` and `0x10` are accepted).
pub fn parse_positive_int(
    raw: Option<&str>,
    fallback: u64,
    field: &str,
) -> Result<u64, ConfigError> {
    parse_whole_number(raw, fallback, 1, field, "positive")
}

/// Like [`parse_positive_int`], but zero is allowed.
pub fn parse_non_negative_int(
    raw: Option<&str>,
    fallback: u64,
    field: &str,
) -> Result<u64, ConfigError> {
    parse_whole_number(raw, fallback, 0, field, "non-negative")
}

/// A whole number of at least `least`, read with JavaScript's `Number()`.
fn parse_whole_number(
    raw: Option<&str>,
    fallback: u64,
    least: u64,
    field: &str,
    kind: &str,
) -> Result<u64, ConfigError> {
    let Some(raw) = raw.filter(|raw| !js_trim(raw).is_empty()) else {
        return Ok(fallback);
    };
    js_number(raw)
        .and_then(exact_u64)
        .filter(|n| *n >= least)
        .ok_or_else(|| ConfigError(format!("{field} must be a {kind} integer, got '{raw}'.")))
}

fn parse_positive_usize(
    raw: Option<&str>,
    fallback: u64,
    field: &str,
) -> Result<usize, ConfigError> {
    let value = parse_positive_int(raw, fallback, field)?;
    usize::try_from(value).map_err(|_| {
        let shown = raw.unwrap_or_default();
        ConfigError(format!(
            "{field} must be a positive integer, got '{shown}'."
        ))
    })
}

/// Booleans as the reference's `parseBool`: trimmed and case-insensitive
/// `true`/`1`/`yes` or `false`/`0`/`no`; unset or blank means the fallback.
pub fn parse_bool(raw: Option<&str>, fallback: bool, field: &str) -> Result<bool, ConfigError> {
    let Some(raw) = raw else {
        return Ok(fallback);
    };
    match js_trim(raw).to_lowercase().as_str() {
        "" => Ok(fallback),
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(ConfigError(format!(
            "{field} must be a boolean (true/false), got '{raw}'."
        ))),
    }
}

/// `PORT`: unlike the other numbers an empty value is not "unset" — the
/// reference evaluates `Number("")`, which is 0, and refuses it.
pub fn parse_port(raw: Option<&str>, fallback: u16) -> Result<u16, ConfigError> {
    let shown = raw.map_or_else(|| fallback.to_string(), str::to_owned);
    js_number(&shown)
        .and_then(exact_u64)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|port| *port > 0)
        .ok_or_else(|| {
            ConfigError(format!(
                "PORT must be an integer in 1..65535, got '{shown}'."
            ))
        })
}

/// `RUNNER_CORS_ORIGINS`: unset, blank or `*` allow any origin; otherwise a
/// comma-separated list, entries trimmed and empty ones dropped.
pub fn parse_cors_origins(raw: Option<&str>) -> CorsOrigins {
    let Some(raw) = raw else {
        return CorsOrigins::Any;
    };
    let trimmed = js_trim(raw);
    if trimmed.is_empty() || trimmed == "*" {
        return CorsOrigins::Any;
    }
    CorsOrigins::List(
        raw.split(',')
            .map(js_trim)
            .filter(|origin| !origin.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// The trimmed value of `key`, or `None` when it is unset or blank.
pub fn env_string(env: &Env, key: &str) -> Option<String> {
    env.get(key)
        .map(|value| js_trim(value))
        .filter(|value| !value.is_empty())
        .map(str::to_owned)
}

/// `f64` → `u64` only when the value is a whole number that fits exactly.
fn exact_u64(n: f64) -> Option<u64> {
    // 2^64 is exactly representable; anything below it that is whole converts
    // without loss.
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    if n.fract() == 0.0 && (0.0..TWO_POW_64).contains(&n) {
        Some(n as u64)
    } else {
        None
    }
}

/// JavaScript's `WhiteSpace` and `LineTerminator` characters — the set
/// `String.prototype.trim` and `Number(string)` strip. It differs from Rust's
/// `char::is_whitespace` (U+FEFF is trimmed, U+0085 is not).
pub fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{9}' | '\u{A}' | '\u{B}' | '\u{C}' | '\u{D}' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

/// `String.prototype.trim`.
pub fn js_trim(raw: &str) -> &str {
    raw.trim_matches(is_js_whitespace)
}

/// JavaScript's `Number(string)`; `None` stands for `NaN`.
///
/// Accepted after trimming: the empty string (0), decimal literals with an
/// optional sign, fraction and exponent (`1.`, `.5`, `-1e3`), `Infinity` with
/// an optional sign, and unsigned `0x`/`0o`/`0b` integers of any length.
pub fn js_number(raw: &str) -> Option<f64> {
    let text = js_trim(raw);
    if text.is_empty() {
        return Some(0.0);
    }
    if let Some(radix_literal) = non_decimal_literal(text) {
        return radix_literal;
    }
    let unsigned = text
        .strip_prefix('+')
        .or_else(|| text.strip_prefix('-'))
        .unwrap_or(text);
    if unsigned == "Infinity" {
        return Some(if text.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    if !is_decimal_literal(unsigned) {
        return None;
    }
    // The grammar is checked above; Rust's parser is correctly rounded like
    // JavaScript's, so the value itself can be left to it.
    text.parse::<f64>().ok()
}

/// `digits [. digits] [e [+-] digits]` or `. digits [e ...]`, at least one
/// mantissa digit.
fn is_decimal_literal(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let (integer, fraction) = match mantissa.split_once('.') {
        Some((integer, fraction)) => (integer, fraction),
        None => (mantissa, ""),
    };
    let all_digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok =
        all_digits(integer) && all_digits(fraction) && !(integer.is_empty() && fraction.is_empty());
    let exponent_ok = exponent.is_none_or(|exponent| {
        let digits = exponent
            .strip_prefix('+')
            .or_else(|| exponent.strip_prefix('-'))
            .unwrap_or(exponent);
        !digits.is_empty() && all_digits(digits)
    });
    mantissa_ok && exponent_ok
}

/// `Some(value)` when `text` has a `0x`/`0o`/`0b` prefix (value `None` when the
/// digits are invalid), `None` when it is not such a literal at all.
fn non_decimal_literal(text: &str) -> Option<Option<f64>> {
    let bytes = text.as_bytes();
    if bytes.len() < 2 || bytes[0] != b'0' {
        return None;
    }
    let radix = match bytes[1] {
        b'x' | b'X' => 16,
        b'o' | b'O' => 8,
        b'b' | b'B' => 2,
        _ => return None,
    };
    let digits = &text[2..];
    if digits.is_empty() {
        return Some(None);
    }
    let mut values = Vec::with_capacity(digits.len());
    for c in digits.chars() {
        match c.to_digit(radix) {
            Some(value) => values.push(value),
            None => return Some(None),
        }
    }
    Some(Some(radix_digits_to_f64(&values, radix.trailing_zeros())))
}

/// Correctly rounded value of a power-of-two-radix digit string of any length:
/// the leading digits go into a wide integer, the rest only contribute a sticky
/// bit (which is all round-to-nearest needs) and a power-of-two scale.
fn radix_digits_to_f64(digits: &[u32], bits_per_digit: u32) -> f64 {
    const MANTISSA_BITS: u32 = 120;
    let mut mantissa: u128 = 0;
    let mut used_bits = 0u32;
    let mut dropped_digits = 0u64;
    let mut sticky = false;
    for &digit in digits.iter().skip_while(|d| **d == 0) {
        if used_bits + bits_per_digit <= MANTISSA_BITS {
            mantissa = (mantissa << bits_per_digit) | u128::from(digit);
            used_bits += bits_per_digit;
        } else {
            dropped_digits += 1;
            sticky |= digit != 0;
        }
    }
    if sticky {
        // Far below bit 53 of a 120-bit mantissa, so it only breaks ties.
        mantissa |= 1;
    }
    let value = mantissa as f64;
    let scale = dropped_digits.saturating_mul(u64::from(bits_per_digit));
    let scale = i32::try_from(scale).unwrap_or(i32::MAX);
    value * 2f64.powi(scale)
}

/// Keys of a JSON object in JavaScript's own-property order: keys that are
/// array indices (canonical integers below 2^32 - 1) first, ascending, then
/// every other key in insertion order. `Object.entries`, `Object.keys` and
/// `for…in` all use it, so it decides which of several bad entries the
/// reference reports and in what order it lists things.
pub fn js_own_key_order(map: &Map<String, Value>) -> Vec<&str> {
    let mut indices: Vec<(u32, &str)> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for key in map.keys() {
        match array_index(key) {
            Some(index) => indices.push((index, key)),
            None => names.push(key),
        }
    }
    indices.sort_unstable_by_key(|(index, _)| *index);
    indices
        .into_iter()
        .map(|(_, key)| key)
        .chain(names)
        .collect()
}

fn array_index(key: &str) -> Option<u32> {
    let canonical = key == "0"
        || (!key.is_empty() && !key.starts_with('0') && key.bytes().all(|b| b.is_ascii_digit()));
    if !canonical {
        return None;
    }
    key.parse::<u32>().ok().filter(|index| *index != u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn vars(pairs: &[(&str, &str)]) -> Env {
        crate::config::env_from_pairs(pairs)
    }

    #[rstest]
    #[case("", Some(0.0))]
    #[case("   ", Some(0.0))]
    #[case("\u{FEFF}\t\n 42 \u{A0}\u{3000}", Some(42.0))]
    #[case("42", Some(42.0))]
    #[case("+42", Some(42.0))]
    #[case("-42", Some(-42.0))]
    #[case("007", Some(7.0))]
    #[case("1.", Some(1.0))]
    #[case(".5", Some(0.5))]
    #[case("-.5e1", Some(-5.0))]
    #[case("1e3", Some(1000.0))]
    #[case("1E+3", Some(1000.0))]
    #[case("25e-1", Some(2.5))]
    #[case("1e400", Some(f64::INFINITY))]
    #[case("0x10", Some(16.0))]
    #[case("0XfF", Some(255.0))]
    #[case("0o17", Some(15.0))]
    #[case("0b101", Some(5.0))]
    #[case("Infinity", Some(f64::INFINITY))]
    #[case("+Infinity", Some(f64::INFINITY))]
    #[case("-Infinity", Some(f64::NEG_INFINITY))]
    #[case("infinity", None)]
    #[case("inf", None)]
    #[case("NaN", None)]
    #[case(".", None)]
    #[case("+", None)]
    #[case("e3", None)]
    #[case("1e", None)]
    #[case("1e+", None)]
    #[case("1.2.3", None)]
    #[case("1_000", None)]
    #[case("12px", None)]
    #[case("0x", None)]
    #[case("0xg", None)]
    #[case("0b2", None)]
    #[case("-0x10", None)]
    #[case("+0x10", None)]
    #[case("0x1.5", None)]
    #[case("\u{85}1", None)]
    fn js_number_follows_javascript_number_of_string(
        #[case] raw: &str,
        #[case] expected: Option<f64>,
    ) {
        assert_eq!(js_number(raw), expected, "Number({raw:?})");
    }

    #[test]
    fn js_number_keeps_the_sign_of_negative_zero() {
        let zero = js_number("-0").unwrap();
        assert_eq!(zero, 0.0);
        assert!(zero.is_sign_negative());
    }

    #[test]
    fn js_number_rounds_long_hex_literals_correctly() {
        // 2^64 + 1 rounds to 2^64; 2^53 + 1 rounds to even (2^53).
        assert_eq!(
            js_number("0x10000000000000001"),
            Some(18_446_744_073_709_551_616.0)
        );
        assert_eq!(js_number("0x20000000000001"), Some(9_007_199_254_740_992.0));
        // 2^53 + 3 rounds up to 2^53 + 4.
        assert_eq!(js_number("0x20000000000003"), Some(9_007_199_254_740_996.0));
        let huge = format!("0x1{}", "0".repeat(300));
        assert_eq!(js_number(&huge), Some(f64::INFINITY));
        // A tie broken by a far-away non-zero digit rounds up.
        let just_above_tie = format!("0x20000000000001{}1", "0".repeat(40));
        let expected = 9_007_199_254_740_994.0 * 2f64.powi(41 * 4);
        assert_eq!(js_number(&just_above_tie), Some(expected));
    }

    #[rstest]
    #[case(None, 32)]
    #[case(Some(""), 32)]
    #[case(Some("  \t"), 32)]
    #[case(Some("7"), 7)]
    #[case(Some(" 7 "), 7)]
    #[case(Some("1e3"), 1000)]
    #[case(Some("0x10"), 16)]
    #[case(Some("5.0"), 5)]
    #[case(Some("18446744073709549568"), 18_446_744_073_709_549_568)]
    fn positive_ints_accept_what_javascript_number_accepts(
        #[case] raw: Option<&str>,
        #[case] expected: u64,
    ) {
        assert_eq!(
            parse_positive_int(raw, 32, "RUNNER_MAX_SESSIONS"),
            Ok(expected)
        );
    }

    #[rstest]
    #[case("0", "RUNNER_MAX_SESSIONS must be a positive integer, got '0'.")]
    #[case("-3", "RUNNER_MAX_SESSIONS must be a positive integer, got '-3'.")]
    #[case("1.5", "RUNNER_MAX_SESSIONS must be a positive integer, got '1.5'.")]
    #[case("ten", "RUNNER_MAX_SESSIONS must be a positive integer, got 'ten'.")]
    #[case(
        " 12x ",
        "RUNNER_MAX_SESSIONS must be a positive integer, got ' 12x '."
    )]
    #[case(
        "Infinity",
        "RUNNER_MAX_SESSIONS must be a positive integer, got 'Infinity'."
    )]
    #[case("1e20", "RUNNER_MAX_SESSIONS must be a positive integer, got '1e20'.")]
    #[case(
        "18446744073709551616",
        "RUNNER_MAX_SESSIONS must be a positive integer, got '18446744073709551616'."
    )]
    fn positive_ints_reject_with_the_raw_value_quoted(#[case] raw: &str, #[case] message: &str) {
        assert_eq!(
            parse_positive_int(Some(raw), 32, "RUNNER_MAX_SESSIONS"),
            Err(ConfigError(message.to_owned()))
        );
    }

    #[rstest]
    #[case(None, true, true)]
    #[case(Some(""), false, false)]
    #[case(Some(" "), true, true)]
    #[case(Some("true"), false, true)]
    #[case(Some(" TRUE "), false, true)]
    #[case(Some("1"), false, true)]
    #[case(Some("Yes"), false, true)]
    #[case(Some("false"), true, false)]
    #[case(Some("0"), true, false)]
    #[case(Some("NO"), true, false)]
    fn booleans_accept_the_reference_spellings(
        #[case] raw: Option<&str>,
        #[case] fallback: bool,
        #[case] expected: bool,
    ) {
        assert_eq!(parse_bool(raw, fallback, "FLAG"), Ok(expected));
    }

    #[rstest]
    #[case("on", "FLAG must be a boolean (true/false), got 'on'.")]
    #[case(" y ", "FLAG must be a boolean (true/false), got ' y '.")]
    #[case("2", "FLAG must be a boolean (true/false), got '2'.")]
    fn booleans_reject_other_words(#[case] raw: &str, #[case] message: &str) {
        assert_eq!(
            parse_bool(Some(raw), false, "FLAG"),
            Err(ConfigError(message.to_owned()))
        );
    }

    #[rstest]
    #[case(None, 8061)]
    #[case(Some("8080"), 8080)]
    #[case(Some(" 8080 "), 8080)]
    #[case(Some("0x1F90"), 8080)]
    #[case(Some("8.08e3"), 8080)]
    #[case(Some("1"), 1)]
    #[case(Some("65535"), 65535)]
    fn ports_accept_integers_in_range(#[case] raw: Option<&str>, #[case] expected: u16) {
        assert_eq!(parse_port(raw, 8061), Ok(expected));
    }

    #[rstest]
    #[case("", "PORT must be an integer in 1..65535, got ''.")]
    #[case("  ", "PORT must be an integer in 1..65535, got '  '.")]
    #[case("0", "PORT must be an integer in 1..65535, got '0'.")]
    #[case("-0", "PORT must be an integer in 1..65535, got '-0'.")]
    #[case("65536", "PORT must be an integer in 1..65535, got '65536'.")]
    #[case("80.5", "PORT must be an integer in 1..65535, got '80.5'.")]
    #[case("http", "PORT must be an integer in 1..65535, got 'http'.")]
    fn ports_reject_empty_and_out_of_range(#[case] raw: &str, #[case] message: &str) {
        assert_eq!(
            parse_port(Some(raw), 8061),
            Err(ConfigError(message.to_owned()))
        );
    }

    #[test]
    fn a_zero_port_fallback_is_reported_like_the_reference() {
        assert_eq!(
            parse_port(None, 0),
            Err(ConfigError(
                "PORT must be an integer in 1..65535, got '0'.".to_owned()
            ))
        );
    }

    #[rstest]
    #[case(None, CorsOrigins::Any)]
    #[case(Some(""), CorsOrigins::Any)]
    #[case(Some("  "), CorsOrigins::Any)]
    #[case(Some(" * "), CorsOrigins::Any)]
    #[case(Some("http://a.test"), CorsOrigins::List(vec!["http://a.test".into()]))]
    #[case(
        Some(" http://a.test , ,http://b.test,"),
        CorsOrigins::List(vec!["http://a.test".into(), "http://b.test".into()])
    )]
    #[case(Some("http://a.test,*"), CorsOrigins::List(vec!["http://a.test".into(), "*".into()]))]
    #[case(Some(",,"), CorsOrigins::List(vec![]))]
    fn cors_origins_parse_like_the_reference(
        #[case] raw: Option<&str>,
        #[case] expected: CorsOrigins,
    ) {
        assert_eq!(parse_cors_origins(raw), expected);
    }

    #[test]
    fn env_strings_are_trimmed_and_blank_means_unset() {
        let env = vars(&[("A", "  x y \u{FEFF}"), ("B", " \t ")]);
        assert_eq!(env_string(&env, "A"), Some("x y".to_owned()));
        assert_eq!(env_string(&env, "B"), None);
        assert_eq!(env_string(&env, "C"), None);
    }

    #[test]
    fn an_empty_environment_yields_the_documented_defaults() {
        let config = load_core_config(&Env::new(), 8061).unwrap();
        assert_eq!(
            config,
            CoreConfig {
                port: 8061,
                log_level: "info".into(),
                max_sessions: 32,
                exit_ttl: Duration::from_secs(4 * 60 * 60),
                replay_buffer_bytes: 5_000_000,
                cors_origins: CorsOrigins::Any,
                default_registry_url: None,
                max_body_bytes: 1_048_576,
                sse_heartbeat: Duration::from_millis(20_000),
                terms: None,
                apps: AppCatalog::default(),
                auth_tokens: None,
                stop_grace: Duration::from_secs(5),
                connections: ConnectionLimits {
                    max_connections: 6_000,
                    header_timeout: Duration::from_secs(10),
                    body_timeout: Duration::from_secs(30),
                    max_header_bytes: 16_384,
                },
            }
        );
    }

    #[test]
    fn connection_limits_are_read_and_refused_by_name() {
        let config = load_core_config(
            &vars(&[
                ("RUNNER_MAX_CONNECTIONS", "50"),
                ("RUNNER_HEADER_TIMEOUT_SECONDS", "2"),
                ("RUNNER_BODY_TIMEOUT_SECONDS", "3"),
                ("RUNNER_MAX_HEADER_BYTES", "8192"),
            ]),
            8061,
        )
        .unwrap();
        assert_eq!(
            config.connections,
            ConnectionLimits {
                max_connections: 50,
                header_timeout: Duration::from_secs(2),
                body_timeout: Duration::from_secs(3),
                max_header_bytes: 8192,
            }
        );
        for (name, raw, message) in [
            (
                "RUNNER_MAX_CONNECTIONS",
                "0",
                "RUNNER_MAX_CONNECTIONS must be a positive integer, got '0'.",
            ),
            (
                "RUNNER_HEADER_TIMEOUT_SECONDS",
                "0",
                "RUNNER_HEADER_TIMEOUT_SECONDS must be a positive integer, got '0'.",
            ),
            (
                "RUNNER_BODY_TIMEOUT_SECONDS",
                "soon",
                "RUNNER_BODY_TIMEOUT_SECONDS must be a positive integer, got 'soon'.",
            ),
            (
                "RUNNER_MAX_HEADER_BYTES",
                "4096",
                "RUNNER_MAX_HEADER_BYTES must be an integer of at least 8192, got '4096'.",
            ),
        ] {
            assert_eq!(
                load_core_config(&vars(&[(name, raw)]), 8061),
                Err(ConfigError(message.to_owned()))
            );
        }
    }

    #[test]
    fn every_core_variable_is_read() {
        let env = vars(&[
            ("PORT", "9000"),
            ("LOG_LEVEL", " debug "),
            ("RUNNER_MAX_SESSIONS", "4"),
            ("RUNNER_EXIT_TTL_MS", "1000"),
            ("RUNNER_REPLAY_BUFFER_BYTES", "0x100"),
            ("RUNNER_CORS_ORIGINS", "http://a.test"),
            ("TELO_REGISTRY_URL", " http://registry.test "),
            ("RUNNER_MAX_BODY_BYTES", "2048"),
            ("RUNNER_TERMS_BODY", "Be nice."),
            ("RUNNER_APPS", r#"{"agent":{"image":"agent:1"}}"#),
        ]);
        let config = load_core_config(&env, 8061).unwrap();
        assert_eq!(config.port, 9000);
        assert_eq!(config.log_level, "debug");
        assert_eq!(config.max_sessions, 4);
        assert_eq!(config.exit_ttl, Duration::from_secs(1));
        assert_eq!(config.replay_buffer_bytes, 256);
        assert_eq!(
            config.cors_origins,
            CorsOrigins::List(vec!["http://a.test".into()])
        );
        assert_eq!(
            config.default_registry_url.as_deref(),
            Some("http://registry.test")
        );
        assert_eq!(config.max_body_bytes, 2048);
        assert_eq!(config.terms.map(|t| t.body), Some("Be nice.".to_owned()));
        assert_eq!(config.apps.names(), vec!["agent"]);
    }

    #[test]
    fn the_first_invalid_variable_in_evaluation_order_is_reported() {
        let env = vars(&[
            ("RUNNER_APPS", "not json"),
            ("RUNNER_MAX_BODY_BYTES", "big"),
            ("RUNNER_EXIT_TTL_MS", "-1"),
        ]);
        assert_eq!(
            load_core_config(&env, 8061),
            Err(ConfigError(
                "RUNNER_EXIT_TTL_MS must be a positive integer, got '-1'.".to_owned()
            ))
        );
        let env = vars(&[("RUNNER_APPS", "[]"), ("RUNNER_MAX_BODY_BYTES", "big")]);
        assert_eq!(
            load_core_config(&env, 8061),
            Err(ConfigError(
                "RUNNER_MAX_BODY_BYTES must be a positive integer, got 'big'.".to_owned()
            ))
        );
        let env = vars(&[("RUNNER_APPS", "[]")]);
        assert_eq!(
            load_core_config(&env, 8061),
            Err(ConfigError(
                "RUNNER_APPS must be a JSON object mapping app name → app config.".to_owned()
            ))
        );
    }

    #[test]
    fn the_documentation_table_names_each_variable_once() {
        let mut names: Vec<&str> = CORE_ENV_VARS.iter().map(|doc| doc.name).collect();
        let total = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), total);
        for name in [
            "PORT",
            "LOG_LEVEL",
            "LOG_FORMAT",
            "RUNNER_MAX_SESSIONS",
            "RUNNER_EXIT_TTL_MS",
            "RUNNER_REPLAY_BUFFER_BYTES",
            "RUNNER_MAX_BODY_BYTES",
            "RUNNER_CORS_ORIGINS",
            "TELO_REGISTRY_URL",
            "RUNNER_TERMS_FILE",
            "RUNNER_TERMS_BODY",
            "RUNNER_TERMS_TITLE",
            "RUNNER_TERMS_VERSION",
            "RUNNER_APPS",
        ] {
            assert!(names.contains(&name), "{name} is undocumented");
        }
    }

    #[test]
    fn object_keys_follow_javascript_own_property_order() {
        let value =
            json!({"b": 1, "10": 2, "a": 3, "2": 4, "01": 5, "0": 6, "4294967295": 7, "-1": 8});
        let Value::Object(map) = value else {
            unreachable!()
        };
        assert_eq!(
            js_own_key_order(&map),
            vec!["0", "2", "10", "b", "a", "01", "4294967295", "-1"]
        );
    }
}
