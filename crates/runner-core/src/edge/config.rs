//! The edge's settings and their loader.

use std::time::Duration;

use crate::env::{ConfigError, Env};
use crate::setting::Setting;

use super::{EdgeConfig, PreviewBase};

pub const RUNNER_PREVIEW_BASE_URL: Setting = Setting {
    name: "RUNNER_PREVIEW_BASE_URL",
    default: "(unset: no session edge)",
    description: "Base URL of session previews (`https://run.example.com`): a request for `<port>-<sessionId>.<its host>` is forwarded to that session's port.",
};

pub const RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS: Setting = Setting {
    name: "RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS",
    default: "5",
    description: "Seconds the session edge waits to connect to a session's port before answering 504.",
};

pub const RUNNER_EDGE_RESPONSE_TIMEOUT_SECONDS: Setting = Setting {
    name: "RUNNER_EDGE_RESPONSE_TIMEOUT_SECONDS",
    default: "60",
    description: "Seconds a session's app may take to answer a forwarded request once it is sent before the edge answers 504.",
};

pub const RUNNER_EDGE_IDLE_TIMEOUT_SECONDS: Setting = Setting {
    name: "RUNNER_EDGE_IDLE_TIMEOUT_SECONDS",
    default: "90",
    description: "Seconds the session edge keeps an idle keep-alive connection to a session's app.",
};

pub const RUNNER_EDGE_MAX_CONNECTIONS_PER_SESSION: Setting = Setting {
    name: "RUNNER_EDGE_MAX_CONNECTIONS_PER_SESSION",
    default: "256",
    description: "Forwarded requests in flight plus upgraded connections (WebSockets) one session may hold; past it the edge answers 503.",
};

pub const RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS: Setting = Setting {
    name: "RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS",
    default: "30",
    description: "Seconds a request to a suspended (or still starting) session is held while the session resumes and its port starts answering; past it 503 with Retry-After.",
};

/// The edge's settings, for `--help` and the README.
pub const EDGE_SETTINGS: &[Setting] = &[
    RUNNER_PREVIEW_BASE_URL,
    RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS,
    RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS,
    RUNNER_EDGE_RESPONSE_TIMEOUT_SECONDS,
    RUNNER_EDGE_IDLE_TIMEOUT_SECONDS,
    RUNNER_EDGE_MAX_CONNECTIONS_PER_SESSION,
];

/// The preview base and the edge's configuration, or `None` without
/// `RUNNER_PREVIEW_BASE_URL` (no edge: every request is the API's). The
/// timeouts and bound are read, and checked, either way.
pub fn load_edge(env: &Env) -> Result<Option<(PreviewBase, EdgeConfig)>, ConfigError> {
    let config = EdgeConfig {
        connect_timeout: Duration::from_secs(
            RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS.positive_int(env)?,
        ),
        response_header_timeout: Duration::from_secs(
            RUNNER_EDGE_RESPONSE_TIMEOUT_SECONDS.positive_int(env)?,
        ),
        idle_timeout: Duration::from_secs(RUNNER_EDGE_IDLE_TIMEOUT_SECONDS.positive_int(env)?),
        max_connections_per_session: RUNNER_EDGE_MAX_CONNECTIONS_PER_SESSION.positive_usize(env)?,
        wake_timeout: Duration::from_secs(RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS.positive_int(env)?),
    };
    let Some(raw) = RUNNER_PREVIEW_BASE_URL.string(env) else {
        return Ok(None);
    };
    let base = PreviewBase::parse(&raw).map_err(|rule| ConfigError::Invalid {
        var: RUNNER_PREVIEW_BASE_URL.name.to_owned(),
        rule,
        value: raw.clone(),
    })?;
    Ok(Some((base, config)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::env_from_pairs;
    use crate::setting::{assert_documented_defaults_are_the_defaults, assert_reads_exactly};

    #[test]
    fn unset_means_no_edge_and_the_documented_defaults() {
        assert_eq!(load_edge(&Env::new()), Ok(None));
        let env = env_from_pairs(&[("RUNNER_PREVIEW_BASE_URL", " https://run.example.com ")]);
        let (base, config) = load_edge(&env).expect("loads").expect("an edge");
        assert_eq!(base.host(), "run.example.com");
        assert_eq!(config, EdgeConfig::default());
        assert_documented_defaults_are_the_defaults(&[EDGE_SETTINGS], load_edge);
        assert_reads_exactly(&[EDGE_SETTINGS], &[], &[Env::new()], load_edge);
    }

    #[test]
    fn bad_values_are_named() {
        let env = env_from_pairs(&[("RUNNER_PREVIEW_BASE_URL", "https://run.example.com/x")]);
        let err = load_edge(&env).expect_err("a path");
        assert_eq!(
            err.to_string(),
            "RUNNER_PREVIEW_BASE_URL must have no path, query or fragment (only scheme, host and port), got 'https://run.example.com/x'."
        );
        let env = env_from_pairs(&[("RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS", "0")]);
        assert!(
            load_edge(&env)
                .expect_err("zero")
                .to_string()
                .starts_with("RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS must be")
        );
    }
}
