//! `telo-runner workspace`'s configuration, read from the environment.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::time::Duration;

use runner_core::config::{
    ConfigError, ConnectionLimits, DEFAULT_HEADER_TIMEOUT_SECONDS, DEFAULT_MAX_HEADER_BYTES, Env,
    Setting,
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
        // The pod's one client, the runner, is served on one thread.
        connection_threads: Some(1),
    }
}

pub const RUNNER_WORKSPACE_DIR: Setting = Setting {
    name: "RUNNER_WORKSPACE_DIR",
    default: "",
    description: "`telo-runner workspace` only (the workspace container of a Kubernetes watch pod): the absolute workspace directory it serves. Required. The limits are the RUNNER_WORKSPACE_MAX_* above.",
};

pub const RUNNER_WORKSPACE_LISTEN: Setting = Setting {
    name: "RUNNER_WORKSPACE_LISTEN",
    default: DEFAULT_LISTEN,
    description: "`telo-runner workspace` only: the address it listens on (`host:port`); the bound address is printed as `listening on http://<addr>`.",
};

pub const RUNNER_WORKSPACE_TOKEN: Setting = Setting {
    name: "RUNNER_WORKSPACE_TOKEN",
    default: "",
    description: "`telo-runner workspace` only: the bearer token every request but `GET /v1/health` must carry, at least 32 characters. Required; never logged.",
};

pub const RUNNER_WORKSPACE_EXIT_AFTER_WRITE: Setting = Setting {
    name: "RUNNER_WORKSPACE_EXIT_AFTER_WRITE",
    default: "(unset)",
    description: "`telo-runner workspace` only: a path in the workspace; once a change set has written it, the service answers and exits 0 (a warm pod's service, done once its session is launched).",
};

/// The variables only `telo-runner workspace` reads. It also reads the
/// runner's `RUNNER_WORKSPACE_MAX_*` limits ([`WORKSPACE_LIMIT_SETTINGS`]),
/// documented with the local backend's.
pub const WORKSPACE_SERVICE_SETTINGS: &[Setting] = &[
    RUNNER_WORKSPACE_DIR,
    RUNNER_WORKSPACE_LISTEN,
    RUNNER_WORKSPACE_TOKEN,
    RUNNER_WORKSPACE_EXIT_AFTER_WRITE,
];

pub const RUNNER_WORKSPACE_MAX_FILE_BYTES: Setting = Setting {
    name: "RUNNER_WORKSPACE_MAX_FILE_BYTES",
    default: "10485760",
    description: "Largest file of a watch session's workspace the runner reads, writes or touches; bigger is 413 `workspace_too_large`.",
};

pub const RUNNER_WORKSPACE_MAX_CHANGE_BYTES: Setting = Setting {
    name: "RUNNER_WORKSPACE_MAX_CHANGE_BYTES",
    default: "16777216",
    description: "Largest change set (decoded) one `POST /v1/sessions/:id/workspace` may write; bigger is 413 `workspace_too_large` and nothing is written.",
};

pub const RUNNER_WORKSPACE_MAX_BYTES: Setting = Setting {
    name: "RUNNER_WORKSPACE_MAX_BYTES",
    default: "67108864",
    description: "Most bytes a watch session's workspace may hold; a change set that would grow it past this is 413 `workspace_too_large`.",
};

pub const RUNNER_WORKSPACE_MAX_FILES: Setting = Setting {
    name: "RUNNER_WORKSPACE_MAX_FILES",
    default: "10000",
    description: "Most files a watch session's workspace may hold.",
};

/// `RUNNER_WORKSPACE_MAX_*`, read by [`workspace_limits_from_env`] for the
/// runner and for `telo-runner workspace`; the local backend's table lists
/// them.
pub const WORKSPACE_LIMIT_SETTINGS: &[Setting] = &[
    RUNNER_WORKSPACE_MAX_FILE_BYTES,
    RUNNER_WORKSPACE_MAX_CHANGE_BYTES,
    RUNNER_WORKSPACE_MAX_BYTES,
    RUNNER_WORKSPACE_MAX_FILES,
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
        let dir = match RUNNER_WORKSPACE_DIR.string(env) {
            None => {
                return Err(ConfigError::must_be(
                    RUNNER_WORKSPACE_DIR.name,
                    "set to the absolute workspace directory to serve",
                ));
            }
            Some(raw) if !PathBuf::from(&raw).is_absolute() => {
                return Err(ConfigError::invalid(
                    RUNNER_WORKSPACE_DIR.name,
                    "be an absolute path",
                    &raw,
                ));
            }
            Some(raw) => PathBuf::from(raw),
        };
        let raw_listen = RUNNER_WORKSPACE_LISTEN.string_or_default(env);
        let listen = raw_listen.parse().map_err(|_| {
            ConfigError::invalid(
                RUNNER_WORKSPACE_LISTEN.name,
                "be an address such as 0.0.0.0:8099",
                &raw_listen,
            )
        })?;
        // Not trimmed: the token is compared exactly as the runner sends it.
        let token = match RUNNER_WORKSPACE_TOKEN
            .raw(env)
            .filter(|token| !token.is_empty())
        {
            None => {
                return Err(ConfigError::must_be(
                    RUNNER_WORKSPACE_TOKEN.name,
                    format!("set to the session's token (at least {MIN_TOKEN_CHARS} characters)"),
                ));
            }
            Some(token) if token.chars().count() < MIN_TOKEN_CHARS => {
                return Err(ConfigError::must_be(
                    RUNNER_WORKSPACE_TOKEN.name,
                    format!(
                        "at least {MIN_TOKEN_CHARS} characters, got {}",
                        token.chars().count()
                    ),
                ));
            }
            Some(token) => token.to_owned(),
        };
        let exit_after_write = match RUNNER_WORKSPACE_EXIT_AFTER_WRITE.string(env) {
            None => None,
            Some(raw) => Some(
                runner_api::bundle_path::normalize_bundle_path(&raw).map_err(|_| {
                    ConfigError::invalid(
                        RUNNER_WORKSPACE_EXIT_AFTER_WRITE.name,
                        "be a workspace path",
                        &raw,
                    )
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
    Ok(WorkspaceLimits {
        max_file_bytes: RUNNER_WORKSPACE_MAX_FILE_BYTES.positive_int(env)?,
        max_change_set_bytes: RUNNER_WORKSPACE_MAX_CHANGE_BYTES.positive_int(env)?,
        max_workspace_bytes: RUNNER_WORKSPACE_MAX_BYTES.positive_int(env)?,
        max_files: usize::try_from(RUNNER_WORKSPACE_MAX_FILES.positive_int(env)?)
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

    /// The service's loader with the two required variables set.
    fn load(env: &Env) -> Result<Config, ConfigError> {
        let mut env = env.clone();
        env.insert(
            RUNNER_WORKSPACE_DIR.name.to_owned(),
            "/workspace".to_owned(),
        );
        env.insert(RUNNER_WORKSPACE_TOKEN.name.to_owned(), TOKEN.to_owned());
        Config::from_env(&env)
    }

    const TABLES: &[&[Setting]] = &[WORKSPACE_SERVICE_SETTINGS, WORKSPACE_LIMIT_SETTINGS];

    #[test]
    fn the_documented_defaults_are_what_unset_means() {
        runner_core::setting::assert_documented_defaults_are_the_defaults(TABLES, load);
        assert_eq!(
            workspace_limits_from_env(&Env::new()),
            Ok(WorkspaceLimits::default())
        );
    }

    #[test]
    fn the_loader_reads_exactly_the_documented_variables() {
        runner_core::setting::assert_reads_exactly(TABLES, &[], &[Env::new()], load);
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
