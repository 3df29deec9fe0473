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

/// A configuration value the runner refuses to start with. The text is the
/// whole message shown to the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

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
pub(crate) fn parse_whole_number(
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

pub(crate) fn parse_positive_usize(
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

    #[test]
    fn env_strings_are_trimmed_and_blank_means_unset() {
        let env = vars(&[("A", "  x y \u{FEFF}"), ("B", " \t ")]);
        assert_eq!(env_string(&env, "A"), Some("x y".to_owned()));
        assert_eq!(env_string(&env, "B"), None);
        assert_eq!(env_string(&env, "C"), None);
    }
}
