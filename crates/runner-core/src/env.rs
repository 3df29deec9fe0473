//! Reading settings from the environment: the map the loaders read, the
//! error they refuse a value with, and the parsers every loader shares
//! (integers, booleans, ports, trimmed strings). Values are read with the
//! reference runner's JavaScript semantics ([`runner_api::js`]), so an environment
//! that works there means the same here, and one it refuses is refused with
//! the same sentence.

use std::collections::HashMap;

use runner_api::js::{js_number, js_trim};

/// The process environment as seen by the config loaders. A plain map so tests
/// never touch the real environment.
pub type Env = HashMap<String, String>;

/// A configuration the runner refuses to start with. Its text is the whole
/// message shown to the operator (and matched by tests and documentation), so
/// each variant renders the sentence that shape of problem has always had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not a whole number, or one outside what the variable allows.
    #[error("{var} must be {wanted}, got '{value}'.")]
    InvalidInteger {
        var: String,
        wanted: IntegerRange,
        value: String,
    },
    /// Not one of the boolean spellings.
    #[error("{var} must be a boolean (true/false), got '{value}'.")]
    InvalidBoolean { var: String, value: String },
    /// Not one of a fixed set of words.
    #[error("{var} must be one of {} (got '{value}').", choices.join(" | "))]
    NotOneOf {
        var: String,
        choices: Vec<String>,
        value: String,
    },
    /// A value that breaks a rule of its variable; `rule` completes "must …"
    /// (`be an absolute path`).
    #[error("{var} must {rule}, got '{value}'.")]
    Invalid {
        var: String,
        rule: String,
        value: String,
    },
    /// A value that does not parse as what it should be; `expected` completes
    /// "is not …" (`valid JSON`), `reason` is the parser's account.
    #[error("{var} is not {expected}: {reason}")]
    Malformed {
        var: String,
        expected: String,
        reason: String,
    },
    /// One entry of the `RUNNER_APPS` catalog; `problem` is the rest of the
    /// sentence after the entry's name.
    #[error("RUNNER_APPS entry '{name}' {problem}")]
    InvalidApp { name: String, problem: String },
    /// A file a variable names that cannot be read; `reason` is the system's
    /// account, ending the sentence as that variable's message always has.
    #[error("{var} '{path}' could not be read: {reason}")]
    UnreadableFile {
        var: String,
        path: String,
        reason: String,
    },
    /// A variable that is set where other settings (or the cluster) make it
    /// wrong; `reason` is the rest of the sentence after "is set but".
    #[error("{var} is set but {reason}")]
    Conflict { var: String, reason: String },
    /// Something the runner builds from its configuration before serving;
    /// `action` completes "could not …" (`build the HTTP client`).
    #[error("could not {action}: {reason}")]
    Setup { action: String, reason: String },
    /// A variable that must hold something it does not; `what` completes
    /// "must be …" (`set to the session's token`).
    #[error("{var} must be {what}.")]
    MustBe { var: String, what: String },
    /// A tokens file with no token in it.
    #[error(
        "{var} '{path}' holds no token (one per line; blank lines and # comments are ignored)."
    )]
    NoTokens { var: String, path: String },
    /// A file a variable names that cannot be read, in the sentence that
    /// variable's message has always had.
    #[error("{var} could not be read at '{path}': {reason}")]
    UnreadableAt {
        var: String,
        path: String,
        reason: String,
    },
    /// A refusal a backend or the binary words itself, as its own typed
    /// error (routing that cannot be resolved, an unusable kubeconfig, a
    /// backend that cannot be built).
    #[error(transparent)]
    Refused(RefusedBy),
}

/// A typed error from outside this crate carried by [`ConfigError`]: its
/// text is the message, and two are equal when they say the same.
#[derive(Debug, Clone)]
pub struct RefusedBy(pub std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl RefusedBy {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(error))
    }
}

impl std::fmt::Display for RefusedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for RefusedBy {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for RefusedBy {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for RefusedBy {}

/// What a whole-number variable accepts, as its refusal puts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegerRange {
    /// Above zero.
    Positive,
    /// Zero or above.
    NonNegative,
    /// At least this much.
    AtLeast(u64),
    /// Within these bounds, both included.
    Within(u64, u64),
}

impl std::fmt::Display for IntegerRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IntegerRange::Positive => f.write_str("a positive integer"),
            IntegerRange::NonNegative => f.write_str("a non-negative integer"),
            IntegerRange::AtLeast(least) => write!(f, "an integer of at least {least}"),
            IntegerRange::Within(least, most) => write!(f, "an integer in {least}..{most}"),
        }
    }
}

impl ConfigError {
    /// `var` must be `what`.
    pub fn must_be(var: &str, what: impl Into<String>) -> Self {
        ConfigError::MustBe {
            var: var.to_owned(),
            what: what.into(),
        }
    }

    /// A refusal worded by its own typed error.
    pub fn refused(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ConfigError::Refused(RefusedBy::new(error))
    }

    /// `var` refused with `wanted`, quoting the value as the operator wrote it.
    pub fn invalid_integer(var: &str, wanted: IntegerRange, value: &str) -> Self {
        ConfigError::InvalidInteger {
            var: var.to_owned(),
            wanted,
            value: value.to_owned(),
        }
    }

    /// `var` is not one of `choices`.
    pub fn not_one_of<S: AsRef<str>>(var: &str, choices: &[S], value: &str) -> Self {
        ConfigError::NotOneOf {
            var: var.to_owned(),
            choices: choices.iter().map(|c| c.as_ref().to_owned()).collect(),
            value: value.to_owned(),
        }
    }

    /// `var` breaks `rule` (what follows "must").
    pub fn invalid(var: &str, rule: &str, value: &str) -> Self {
        ConfigError::Invalid {
            var: var.to_owned(),
            rule: rule.to_owned(),
            value: value.to_owned(),
        }
    }

    /// `var` is set where it cannot apply (`reason` follows "is set but").
    pub fn conflict(var: &str, reason: impl Into<String>) -> Self {
        ConfigError::Conflict {
            var: var.to_owned(),
            reason: reason.into(),
        }
    }

    /// Building `action` (what follows "could not") failed.
    pub fn setup(action: &str, reason: impl std::fmt::Display) -> Self {
        ConfigError::Setup {
            action: action.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// `<field>` parsed like the reference's `parsePositiveInt`: unset or blank
/// means the fallback; otherwise JavaScript's `Number(raw)` must be a whole
/// number above zero (so `1e3` and `0x10` are accepted).
pub fn parse_positive_int(
    raw: Option<&str>,
    fallback: u64,
    field: &str,
) -> Result<u64, ConfigError> {
    parse_whole_number(raw, fallback, 1, field, IntegerRange::Positive)
}

/// Like [`parse_positive_int`], but zero is allowed.
pub fn parse_non_negative_int(
    raw: Option<&str>,
    fallback: u64,
    field: &str,
) -> Result<u64, ConfigError> {
    parse_whole_number(raw, fallback, 0, field, IntegerRange::NonNegative)
}

/// A whole number of at least `least`, read with JavaScript's `Number()`.
pub(crate) fn parse_whole_number(
    raw: Option<&str>,
    fallback: u64,
    least: u64,
    field: &str,
    wanted: IntegerRange,
) -> Result<u64, ConfigError> {
    let Some(raw) = raw.filter(|raw| !js_trim(raw).is_empty()) else {
        return Ok(fallback);
    };
    js_number(raw)
        .and_then(exact_u64)
        .filter(|n| *n >= least)
        .ok_or_else(|| ConfigError::invalid_integer(field, wanted, raw))
}

pub(crate) fn parse_positive_usize(
    raw: Option<&str>,
    fallback: u64,
    field: &str,
) -> Result<usize, ConfigError> {
    let value = parse_positive_int(raw, fallback, field)?;
    usize::try_from(value).map_err(|_| {
        ConfigError::invalid_integer(field, IntegerRange::Positive, raw.unwrap_or_default())
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
        _ => Err(ConfigError::InvalidBoolean {
            var: field.to_owned(),
            value: raw.to_owned(),
        }),
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
        .ok_or_else(|| ConfigError::invalid_integer("PORT", IntegerRange::Within(1, 65535), &shown))
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

/// An environment from literal pairs (tests, embedding).
pub fn env_from_pairs(pairs: &[(&str, &str)]) -> Env {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn vars(pairs: &[(&str, &str)]) -> Env {
        env_from_pairs(pairs)
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
            parse_positive_int(Some(raw), 32, "RUNNER_MAX_SESSIONS").map_err(|err| err.to_string()),
            Err(message.to_owned())
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
            parse_bool(Some(raw), false, "FLAG").map_err(|err| err.to_string()),
            Err(message.to_owned())
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
            parse_port(Some(raw), 8061).map_err(|err| err.to_string()),
            Err(message.to_owned())
        );
    }

    #[test]
    fn a_zero_port_fallback_is_reported_like_the_reference() {
        assert_eq!(
            parse_port(None, 0).map_err(|err| err.to_string()),
            Err("PORT must be an integer in 1..65535, got '0'.".to_owned())
        );
    }

    #[test]
    fn env_strings_are_trimmed_and_blank_means_unset() {
        let env = vars(&[("A", "  x y \u{FEFF}"), ("B", " \t ")]);
        assert_eq!(env_string(&env, "A"), Some("x y".to_owned()));
        assert_eq!(env_string(&env, "B"), None);
        assert_eq!(env_string(&env, "C"), None);
    }
}
