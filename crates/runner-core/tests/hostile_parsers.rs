//! Hostile input against what the runner parses without a request around
//! it: bundle paths, and the operator's configuration values. Properties,
//! not examples: nothing panics, every refusal says what was wrong, and
//! nothing accepted breaks an invariant the backends rely on.
//!
//! Case counts are kept small for CI; `PROPTEST_CASES=200000 cargo test
//! --release -p runner-core --test hostile_parsers` is the long run.
#![allow(clippy::unwrap_used)]

mod support;

use proptest::prelude::*;
use runner_api::js::js_number;
use runner_core::bundle_path::{InvalidBundlePath, normalize_bundle_path};
use runner_core::config::{
    CORE_SETTINGS, ConfigError, Env, load_core_config, parse_bool, parse_cors_origins, parse_port,
    parse_positive_int,
};
use support::{check_accepted_path, config, hostile_path, json_value, nasty_string};

// ---------------------------------------------------------------------------
// Bundle path invariants

fn check_bundle_path(raw: &str) -> Result<(), TestCaseError> {
    match normalize_bundle_path(raw) {
        Ok(path) => {
            check_accepted_path(&path)?;
            // Normalizing is idempotent, so a backend normalizing again gets
            // the same file.
            prop_assert_eq!(normalize_bundle_path(&path), Ok(path.clone()));
        }
        Err(InvalidBundlePath(quoted)) => prop_assert_eq!(quoted, raw),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn accepted_bundle_paths_stay_inside_the_root(raw in hostile_path()) {
        check_bundle_path(&raw)?;
    }

    #[test]
    fn arbitrary_strings_as_bundle_paths_stay_inside_the_root(raw in nasty_string()) {
        check_bundle_path(&raw)?;
    }
}

// ---------------------------------------------------------------------------
// Configuration values

/// Every documented variable, with the file-path ones pointed at paths that
/// do not exist (reading a device such as `/dev/zero` is the operator's own
/// doing, not hostile input).
fn core_env() -> BoxedStrategy<Env> {
    let names: Vec<&'static str> = CORE_SETTINGS.iter().map(|var| var.name).collect();
    prop::collection::vec(
        (
            prop::sample::select(names),
            prop_oneof![nasty_string(), json_value().prop_map(|v| v.to_string())],
        ),
        0..8,
    )
    .prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(name, value)| {
                let value = if name.ends_with("_FILE") {
                    format!("/nonexistent/hostile-input/{}", value.len())
                } else {
                    value
                };
                (name.to_owned(), value)
            })
            .collect()
    })
    .boxed()
}

fn check_config_error(err: &ConfigError) -> Result<(), TestCaseError> {
    let message = &err.to_string();
    let names: Vec<&str> = CORE_SETTINGS.iter().map(|var| var.name).collect();
    prop_assert!(
        names.iter().any(|name| message.contains(name)),
        "a config error that names no variable: {message}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn core_config_refuses_with_a_message_naming_the_variable(env in core_env()) {
        match load_core_config(&env, 8061) {
            Ok(config) => {
                prop_assert!(config.port >= 1);
                prop_assert!(config.max_sessions >= 1);
                prop_assert!(config.max_body_bytes >= 1);
                prop_assert!(!config.exit_ttl.is_zero());
                prop_assert!(!config.sse_heartbeat.is_zero());
            }
            Err(err) => check_config_error(&err)?,
        }
    }

    #[test]
    fn number_and_flag_parsers_never_panic(raw in nasty_string()) {
        let _ = js_number(&raw);
        match parse_positive_int(Some(&raw), 7, "FIELD") {
            Ok(n) => prop_assert!(n >= 1),
            Err(err) => prop_assert_eq!(err.to_string(), format!("FIELD must be a positive integer, got '{raw}'.")),
        }
        match parse_port(Some(&raw), 8061) {
            Ok(port) => prop_assert!(port >= 1),
            Err(err) => prop_assert_eq!(err.to_string(), format!("PORT must be an integer in 1..65535, got '{raw}'.")),
        }
        match parse_bool(Some(&raw), false, "FLAG") {
            Ok(_) => {}
            Err(err) => prop_assert_eq!(err.to_string(), format!("FLAG must be a boolean (true/false), got '{raw}'.")),
        }
        if let runner_core::config::CorsOrigins::List(origins) = parse_cors_origins(Some(&raw)) {
            prop_assert!(origins.iter().all(|origin| !origin.is_empty()));
        }
    }
}
