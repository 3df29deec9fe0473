//! `telo-runner workspace`'s configuration, read from the environment.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::time::Duration;

use runner_core::config::{
    ConfigError, ConnectionLimits, DEFAULT_HEADER_TIMEOUT_SECONDS, DEFAULT_MAX_HEADER_BYTES, Env,
    EnvVarDoc, env_string, parse_positive_int,
};
use runner_workspace::WorkspaceLimits;

/// Where the service listens unless `RUNNER_WORKSPACE_LISTEN` says otherwise.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:8099";
/// The shortest token the service accepts.
pub const MIN_TOKEN_CHARS: usize = 32;
/// The connections the service serves at once. Its one client is the
/// runner (a few requests at a time per session); anything past this is a
/// process on the pod's network holding connections open.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a request body may take to arrive in full.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The service's connection bounds: [`MAX_CONNECTIONS`], and the runner's
/// own defaults for the header deadline and size.
pub fn connection_limits() -> ConnectionLimits {
    ConnectionLimits {
        max_connections: MAX_CONNECTIONS,
        // Its one client may hold every connection.
        max_connections_per_client: Some(MAX_CONNECTIONS),
        trusted_proxies: Default::default(),
        header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECONDS),
        body_timeout: BODY_TIMEOUT,
        max_header_bytes: usize::try_from(DEFAULT_MAX_HEADER_BYTES).unwrap_or(usize::MAX),
    }
}

const DIR_VAR: &str = "RUNNER_WORKSPACE_DIR";
const LISTEN_VAR: &str = "RUNNER_WORKSPACE_LISTEN";
const TOKEN_VAR: &str = "RUNNER_WORKSPACE_TOKEN";
const EXIT_AFTER_VAR: &str = "RUNNER_WORKSPACE_EXIT_AFTER_WRITE";

/// The variables only `telo-runner workspace` reads. It also reads the
/// runner's `RUNNER_WORKSPACE_MAX_*` limits, documented with the local
/// backend's.
pub const WORKSPACE_SERVICE_ENV_VARS: &[EnvVarDoc] = &[
    EnvVarDoc {
        name: DIR_VAR,
        default: "",
        description: "`telo-runner workspace` only (the workspace container of a Kubernetes watch pod): the absolute workspace directory it serves. Required. The limits are the RUNNER_WORKSPACE_MAX_* above.",
    },
    EnvVarDoc {
        name: LISTEN_VAR,
        default: DEFAULT_LISTEN,
        description: "`telo-runner workspace` only: the address it listens on (`host:port`); the bound address is printed as `listening on http://<addr>`.",
    },
    EnvVarDoc {
        name: TOKEN_VAR,
        default: "",
        description: "`telo-runner workspace` only: the bearer token every request but `GET /v1/health` must carry, at least 32 characters. Required; never logged.",
    },
    EnvVarDoc {
        name: EXIT_AFTER_VAR,
        default: "(unset)",
        description: "`telo-runner workspace` only: a path in the workspace; once a change set has written it, the service answers and exits 0 (a warm pod's service, done once its session is launched).",
    },
];

/// What the service needs: its directory, its address, its token and the
/// workspace limits.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// The workspace root (absolute); created if missing.
    pub dir: PathBuf,
    pub listen: SocketAddr,
    /// The bearer token; [`Config`]'s `Debug` never shows it.
    pub token: String,
    pub limits: WorkspaceLimits,
    /// The service exits once a change set wrote this path (normalized).
    pub exit_after_write: Option<String>,
    /// What connections may cost (default [`connection_limits`]).
    pub connections: ConnectionLimits,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("dir", &self.dir)
            .field("listen", &self.listen)
            .field("token", &"<redacted>")
            .field("limits", &self.limits)
            .field("exit_after_write", &self.exit_after_write)
            .field("connections", &self.connections)
            .finish()
    }
}

impl Config {
    /// Reads `RUNNER_WORKSPACE_DIR`, `RUNNER_WORKSPACE_LISTEN`,
    /// `RUNNER_WORKSPACE_TOKEN` and the `RUNNER_WORKSPACE_MAX_*` limits.
    /// The error's `Display` is the message to exit with; it never quotes
    /// the token.
    pub fn from_env(env: &Env) -> Result<Config, ConfigError> {
        let dir = match env_string(env, DIR_VAR) {
            None => {
                return Err(ConfigError::must_be(
                    DIR_VAR,
                    "set to the absolute workspace directory to serve",
                ));
            }
            Some(raw) if !PathBuf::from(&raw).is_absolute() => {
                return Err(ConfigError::invalid(DIR_VAR, "be an absolute path", &raw));
            }
            Some(raw) => PathBuf::from(raw),
        };
        let raw_listen = env_string(env, LISTEN_VAR).unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = raw_listen.parse().map_err(|_| {
            ConfigError::invalid(
                LISTEN_VAR,
                "be an address such as 0.0.0.0:8099",
                &raw_listen,
            )
        })?;
        // Not trimmed: the token is compared exactly as the runner sends it.
        let token = match env.get(TOKEN_VAR).filter(|token| !token.is_empty()) {
            None => {
                return Err(ConfigError::must_be(
                    TOKEN_VAR,
                    format!("set to the session's token (at least {MIN_TOKEN_CHARS} characters)"),
                ));
            }
            Some(token) if token.chars().count() < MIN_TOKEN_CHARS => {
                return Err(ConfigError::must_be(
                    TOKEN_VAR,
                    format!(
                        "at least {MIN_TOKEN_CHARS} characters, got {}",
                        token.chars().count()
                    ),
                ));
            }
            Some(token) => token.clone(),
        };
        let exit_after_write = match env_string(env, EXIT_AFTER_VAR) {
            None => None,
            Some(raw) => Some(
                runner_api::bundle_path::normalize_bundle_path(&raw).map_err(|_| {
                    ConfigError::invalid(EXIT_AFTER_VAR, "be a workspace path", &raw)
                })?,
            ),
        };
        Ok(Config {
            dir,
            listen,
            token,
            limits: workspace_limits_from_env(env)?,
            exit_after_write,
            connections: connection_limits(),
        })
    }
}

/// `RUNNER_WORKSPACE_MAX_*`: the bounds of one watch session's workspace,
/// read the same way by the runner and by `telo-runner workspace`.
pub fn workspace_limits_from_env(env: &Env) -> Result<WorkspaceLimits, ConfigError> {
    let defaults = WorkspaceLimits::default();
    let var = |key: &str| env.get(key).map(String::as_str);
    let bytes = |key: &str, default: u64| parse_positive_int(var(key), default, key);
    Ok(WorkspaceLimits {
        max_file_bytes: bytes("RUNNER_WORKSPACE_MAX_FILE_BYTES", defaults.max_file_bytes)?,
        max_change_set_bytes: bytes(
            "RUNNER_WORKSPACE_MAX_CHANGE_BYTES",
            defaults.max_change_set_bytes,
        )?,
        max_workspace_bytes: bytes("RUNNER_WORKSPACE_MAX_BYTES", defaults.max_workspace_bytes)?,
        max_files: usize::try_from(bytes(
            "RUNNER_WORKSPACE_MAX_FILES",
            defaults.max_files as u64,
        )?)
        .unwrap_or(usize::MAX),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use runner_core::config::env_from_pairs;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_full_environment_is_read_and_debug_hides_the_token() {
        let env = env_from_pairs(&[
            ("RUNNER_WORKSPACE_DIR", "/workspace"),
            ("RUNNER_WORKSPACE_LISTEN", "127.0.0.1:0"),
            ("RUNNER_WORKSPACE_TOKEN", TOKEN),
            ("RUNNER_WORKSPACE_MAX_FILES", "12"),
        ]);
        let config = Config::from_env(&env).unwrap();
        assert_eq!(config.dir, PathBuf::from("/workspace"));
        assert_eq!(config.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.limits.max_files, 12);
        assert_eq!(
            config.limits.max_file_bytes,
            WorkspaceLimits::default().max_file_bytes
        );
        assert!(!format!("{config:?}").contains(TOKEN));
        let defaulted = Config::from_env(&env_from_pairs(&[
            ("RUNNER_WORKSPACE_DIR", "/workspace"),
            ("RUNNER_WORKSPACE_TOKEN", TOKEN),
        ]))
        .unwrap();
        assert_eq!(defaulted.listen, "0.0.0.0:8099".parse().unwrap());
    }

    #[test]
    fn bad_configuration_is_refused_with_the_exact_message() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("RUNNER_WORKSPACE_TOKEN", TOKEN)],
                "RUNNER_WORKSPACE_DIR must be set to the absolute workspace directory to serve.",
            ),
            (
                &[
                    ("RUNNER_WORKSPACE_DIR", "workspace"),
                    ("RUNNER_WORKSPACE_TOKEN", TOKEN),
                ],
                "RUNNER_WORKSPACE_DIR must be an absolute path, got 'workspace'.",
            ),
            (
                &[("RUNNER_WORKSPACE_DIR", "/workspace")],
                "RUNNER_WORKSPACE_TOKEN must be set to the session's token (at least 32 characters).",
            ),
            (
                &[
                    ("RUNNER_WORKSPACE_DIR", "/workspace"),
                    ("RUNNER_WORKSPACE_TOKEN", "secret-short-token"),
                ],
                "RUNNER_WORKSPACE_TOKEN must be at least 32 characters, got 18.",
            ),
            (
                &[
                    ("RUNNER_WORKSPACE_DIR", "/workspace"),
                    ("RUNNER_WORKSPACE_TOKEN", TOKEN),
                    ("RUNNER_WORKSPACE_LISTEN", "8099"),
                ],
                "RUNNER_WORKSPACE_LISTEN must be an address such as 0.0.0.0:8099, got '8099'.",
            ),
            (
                &[
                    ("RUNNER_WORKSPACE_DIR", "/workspace"),
                    ("RUNNER_WORKSPACE_TOKEN", TOKEN),
                    ("RUNNER_WORKSPACE_MAX_BYTES", "0"),
                ],
                "RUNNER_WORKSPACE_MAX_BYTES must be a positive integer, got '0'.",
            ),
        ];
        for (pairs, message) in cases {
            let err = Config::from_env(&env_from_pairs(pairs)).unwrap_err();
            assert_eq!(err.to_string(), *message);
        }
    }
}
