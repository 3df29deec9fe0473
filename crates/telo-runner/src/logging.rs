//! Logs: human-readable by default, JSON lines with `LOG_FORMAT=json`; level
//! from `LOG_LEVEL` (any `tracing` filter directive). JSON lines carry the
//! fields of their enclosing spans, `session_id` included, at the top level.

mod flat_json;

use std::io::IsTerminal as _;

use runner_core::config::{ConfigError, Env, LOG_FORMAT, LOG_LEVEL, env_string};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::JsonFields;

/// Severities `LOG_LEVEL` names, alone or after `target=`.
const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];

/// `LOG_LEVEL`: a level, or a filter of comma-separated directives each of
/// which ends in a level (`info,runner_k8s=debug`). A bare word that is not
/// a level would be read as a target name and silence every other line, so
/// it is refused.
pub fn parse_level(raw: &str) -> Result<EnvFilter, ConfigError> {
    let refuse = || {
        ConfigError::must_be(
            LOG_LEVEL.name,
            format!(
                "one of trace | debug | info | warn | error | off, or a filter such as \
                 'info,runner_k8s=debug' (got '{raw}')"
            ),
        )
    };
    for directive in raw.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(refuse());
        }
    }
    EnvFilter::try_new(raw).map_err(|_| refuse())
}

/// `LOG_LEVEL` and `LOG_FORMAT`, trimmed, or their documented defaults.
fn log_settings(env: &Env) -> (String, String) {
    (
        LOG_LEVEL.string_or_default(env),
        LOG_FORMAT.string_or_default(env),
    )
}

pub fn init(env: &Env) -> Result<(), ConfigError> {
    let (level, format) = log_settings(env);
    let filter = parse_level(&level)?;
    // Colour only for a person at a terminal; files and pipes get plain text.
    let colour = std::io::stderr().is_terminal() && env_string(env, "NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format.as_str() {
        // Span fields (a session's `session_id`) land at the top level of
        // each line, where log pipelines filter on them.
        "json" => builder
            .fmt_fields(JsonFields::new())
            .event_format(flat_json::FlatJson)
            .init(),
        "pretty" => builder.init(),
        other => {
            return Err(ConfigError::not_one_of(
                LOG_FORMAT.name,
                &["json", "pretty"],
                other,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_core::config::Setting;

    #[test]
    fn logging_reads_its_two_settings_and_defaults_to_what_they_document() {
        let settings: &[Setting] = &[LOG_LEVEL, LOG_FORMAT];
        runner_core::setting::assert_reads_exactly(&[settings], &[], &[Env::new()], log_settings);
        runner_core::setting::assert_documented_defaults_are_the_defaults(&[settings], |env| {
            Ok::<_, ConfigError>(log_settings(env))
        });
        assert_eq!(log_settings(&Env::new()), ("info".into(), "pretty".into()));
    }

    #[test]
    fn levels_and_filters_pass_and_bare_words_are_refused() {
        for ok in [
            "info",
            "DEBUG",
            "warn,runner_k8s=debug",
            "runner_core::http=trace",
            "off",
        ] {
            assert!(parse_level(ok).is_ok(), "{ok}");
        }
        for bad in ["loud", "info,chatty", "runner_k8s=loud", "=info="] {
            assert_eq!(
                parse_level(bad).unwrap_err().to_string(),
                format!(
                    "LOG_LEVEL must be one of trace | debug | info | warn | error | off, or a filter such as 'info,runner_k8s=debug' (got '{bad}')."
                )
            );
        }
    }
}
