//! The edge's settings and their loader.

use std::time::Duration;

use crate::env::{ConfigError, Env};
use crate::setting::Setting;

use super::access::{AccessPolicy, MIN_KEY_BYTES, PreviewAccess, Signer};
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

pub const RUNNER_PREVIEW_ACCESS: Setting = Setting {
    name: "RUNNER_PREVIEW_ACCESS",
    default: "public",
    description: "`public`: session ports are open (except a port a workload token guards). `private`: every port asks for the session's access: the grant on the URLs the runner reports (traded for a cookie), a share link, or a workload token.",
};

pub const RUNNER_PREVIEW_SIGNING_KEY_FILE: Setting = Setting {
    name: "RUNNER_PREVIEW_SIGNING_KEY_FILE",
    default: "(unset: a key generated per process)",
    description: "File holding the key (at least 32 bytes) that signs preview grants, share links and their cookies; every replica needs the same one. Unset, a random key per process: grants and links stop working when it restarts.",
};

pub const RUNNER_PREVIEW_GRANT_TTL_SECONDS: Setting = Setting {
    name: "RUNNER_PREVIEW_GRANT_TTL_SECONDS",
    default: "43200",
    description: "Seconds the grant on a reported preview URL can be traded for a cookie (the cookie then lasts 12 hours).",
};

/// The edge's settings, for `--help` and the README.
pub const EDGE_SETTINGS: &[Setting] = &[
    RUNNER_PREVIEW_BASE_URL,
    RUNNER_PREVIEW_ACCESS,
    RUNNER_PREVIEW_SIGNING_KEY_FILE,
    RUNNER_PREVIEW_GRANT_TTL_SECONDS,
    RUNNER_PREVIEW_WAKE_TIMEOUT_SECONDS,
    RUNNER_EDGE_CONNECT_TIMEOUT_SECONDS,
    RUNNER_EDGE_RESPONSE_TIMEOUT_SECONDS,
    RUNNER_EDGE_IDLE_TIMEOUT_SECONDS,
    RUNNER_EDGE_MAX_CONNECTIONS_PER_SESSION,
];

/// The session edge as configured: where session hosts live, the edge's
/// timeouts and bounds, and who may pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeSettings {
    pub base: PreviewBase,
    pub config: EdgeConfig,
    pub policy: AccessPolicy,
}

/// The edge's settings, or `None` without `RUNNER_PREVIEW_BASE_URL` (no
/// edge: every request is the API's). The other settings are read, and
/// checked, either way.
pub fn load_edge(env: &Env) -> Result<Option<EdgeSettings>, ConfigError> {
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
        waking_page_after: EdgeConfig::default().waking_page_after,
    };
    let policy = load_policy(env)?;
    let Some(raw) = RUNNER_PREVIEW_BASE_URL.string(env) else {
        return Ok(None);
    };
    let base = PreviewBase::parse(&raw).map_err(|rule| ConfigError::Invalid {
        var: RUNNER_PREVIEW_BASE_URL.name.to_owned(),
        rule,
        value: raw.clone(),
    })?;
    Ok(Some(EdgeSettings {
        base,
        config,
        policy,
    }))
}

fn load_policy(env: &Env) -> Result<AccessPolicy, ConfigError> {
    let raw = RUNNER_PREVIEW_ACCESS.string_or_default(env);
    let access = PreviewAccess::parse(&raw).ok_or_else(|| {
        ConfigError::not_one_of(RUNNER_PREVIEW_ACCESS.name, &["public", "private"], &raw)
    })?;
    let grant_ttl = Duration::from_secs(RUNNER_PREVIEW_GRANT_TTL_SECONDS.positive_int(env)?);
    let (signer, generated_key) = match RUNNER_PREVIEW_SIGNING_KEY_FILE.string(env) {
        None => (Signer::generated(), true),
        Some(path) => {
            let bytes = std::fs::read(&path).map_err(|err| ConfigError::UnreadableFile {
                var: RUNNER_PREVIEW_SIGNING_KEY_FILE.name.to_owned(),
                path: path.clone(),
                reason: format!("{err}."),
            })?;
            let key = bytes.trim_ascii();
            if key.len() < MIN_KEY_BYTES {
                return Err(ConfigError::invalid(
                    RUNNER_PREVIEW_SIGNING_KEY_FILE.name,
                    &format!(
                        "name a file holding a key of at least {MIN_KEY_BYTES} bytes (it holds {})",
                        key.len()
                    ),
                    &path,
                ));
            }
            (Signer::new(key.to_vec()), false)
        }
    };
    Ok(AccessPolicy {
        access,
        signer,
        generated_key,
        grant_ttl,
    })
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
        let edge = load_edge(&env).expect("loads").expect("an edge");
        assert_eq!(edge.base.host(), "run.example.com");
        assert_eq!(edge.config, EdgeConfig::default());
        assert_eq!(edge.policy.access, PreviewAccess::Public);
        assert!(edge.policy.generated_key);
        assert_eq!(edge.policy.grant_ttl, AccessPolicy::public().grant_ttl);
        assert_documented_defaults_are_the_defaults(&[EDGE_SETTINGS], load_edge);
        assert_reads_exactly(&[EDGE_SETTINGS], &[], &[Env::new()], load_edge);
    }

    #[test]
    fn an_operators_key_and_private_access_are_taken() {
        let dir = tempfile::tempdir().expect("dir");
        let key = dir.path().join("key");
        std::fs::write(&key, format!("{}\n", "k".repeat(40))).expect("write");
        let env = env_from_pairs(&[
            ("RUNNER_PREVIEW_BASE_URL", "http://localhost:8061"),
            ("RUNNER_PREVIEW_ACCESS", "private"),
            (
                "RUNNER_PREVIEW_SIGNING_KEY_FILE",
                key.to_str().expect("utf-8"),
            ),
            ("RUNNER_PREVIEW_GRANT_TTL_SECONDS", "60"),
        ]);
        let edge = load_edge(&env).expect("loads").expect("an edge");
        assert_eq!(edge.policy.access, PreviewAccess::Private);
        assert!(!edge.policy.generated_key);
        assert_eq!(edge.policy.grant_ttl, Duration::from_secs(60));
        // The same key file signs the same way in any replica.
        let again = load_edge(&env).expect("loads").expect("an edge");
        let grant = edge.policy.grant("abc", 8080, 100);
        assert!(again.policy.signer.verify(&grant).is_some());
    }

    #[test]
    fn bad_values_are_named() {
        let env = env_from_pairs(&[("RUNNER_PREVIEW_BASE_URL", "https://run.example.com/x")]);
        let err = load_edge(&env).expect_err("a path");
        assert_eq!(
            err.to_string(),
            "RUNNER_PREVIEW_BASE_URL must have no path, query or fragment (only scheme, host and port), got 'https://run.example.com/x'."
        );
        let env = env_from_pairs(&[("RUNNER_PREVIEW_ACCESS", "secret")]);
        assert_eq!(
            load_edge(&env).expect_err("a mode").to_string(),
            "RUNNER_PREVIEW_ACCESS must be one of public | private (got 'secret')."
        );
        let dir = tempfile::tempdir().expect("dir");
        let short = dir.path().join("short");
        std::fs::write(&short, "too short\n").expect("write");
        let env = env_from_pairs(&[(
            "RUNNER_PREVIEW_SIGNING_KEY_FILE",
            short.to_str().expect("utf-8"),
        )]);
        assert_eq!(
            load_edge(&env).expect_err("a short key").to_string(),
            format!(
                "RUNNER_PREVIEW_SIGNING_KEY_FILE must name a file holding a key of at least 32 bytes (it holds 9), got '{}'.",
                short.display()
            )
        );
        let missing = dir.path().join("missing");
        let env = env_from_pairs(&[(
            "RUNNER_PREVIEW_SIGNING_KEY_FILE",
            missing.to_str().expect("utf-8"),
        )]);
        assert!(
            load_edge(&env)
                .expect_err("no file")
                .to_string()
                .starts_with(&format!(
                    "RUNNER_PREVIEW_SIGNING_KEY_FILE '{}' could not be read:",
                    missing.display()
                ))
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
