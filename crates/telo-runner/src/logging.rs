//! Logs: human-readable by default, JSON lines with `LOG_FORMAT=json`; level
//! from `LOG_LEVEL` (any `tracing` filter directive). JSON lines carry the
//! fields of their enclosing spans, `session_id` included, at the top level.

mod flat_json;

use runner_core::config::{ConfigError, Env, env_string};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::JsonFields;

pub fn init(env: &Env) -> Result<(), ConfigError> {
    let level = env_string(env, "LOG_LEVEL").unwrap_or_else(|| "info".into());
    let filter = EnvFilter::try_new(&level).map_err(|err| {
        ConfigError(format!(
            "LOG_LEVEL is not a valid log level or filter, got '{level}': {err}"
        ))
    })?;
    let format = env_string(env, "LOG_FORMAT").unwrap_or_else(|| "pretty".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
            return Err(ConfigError(format!(
                "LOG_FORMAT must be one of json | pretty (got '{other}')."
            )));
        }
    }
    Ok(())
}
