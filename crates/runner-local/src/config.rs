//! The local backend's configuration, read from the environment.

use std::path::PathBuf;
use std::time::Duration;

pub use crate::sandbox::{BubblewrapConfig, DEFAULT_BWRAP, SandboxConfig};

use runner_core::config::{ConfigError, Env, RUNNER_AUTH_TOKENS_FILE, Setting, env_string};
use runner_workspace_service::{
    RUNNER_WORKSPACE_MAX_BYTES, RUNNER_WORKSPACE_MAX_CHANGE_BYTES, RUNNER_WORKSPACE_MAX_FILE_BYTES,
    RUNNER_WORKSPACE_MAX_FILES,
};

pub const DEFAULT_STOP_GRACE: Duration =
    Duration::from_secs(runner_core::config::DEFAULT_STOP_GRACE_SECONDS);
/// The workload `PATH` when the runner itself has none.
pub const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Directory name under the system temporary directory used by default.
pub const DEFAULT_WORK_DIR_NAME: &str = "telo-runner-sessions";
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// The Telo CLI: a path, or a name looked up on [`LocalConfig::path`].
    pub telo: String,
    /// `RUNNER_LOCAL_TELO_VERSIONS`: the kernels a request may choose by
    /// version, at `<dir>/<version>/bin/telo`. Absolute; `None` offers no
    /// choice (`features.teloVersions` absent).
    pub telo_versions: Option<PathBuf>,
    /// Parent of every session's private work directory. Absolute.
    pub work_root: PathBuf,
    /// A session still running after this long is stopped and reported failed.
    pub max_ttl: Duration,
    /// The `PATH` workloads get, also where a bare `telo` name is looked up.
    pub path: String,
    /// How long a stopped session's processes get between SIGTERM and
    /// SIGKILL (`RUNNER_STOP_GRACE_SECONDS`, read with the core settings).
    pub stop_grace: Duration,
    pub sandbox: SandboxConfig,
    /// `RUNNER_LOCAL_NETWORK`.
    pub network: crate::network::NetworkConfig,
    /// What one watch session's workspace may hold.
    pub workspace: runner_workspace::WorkspaceLimits,
    /// What one session may use (memory, processes, CPU, disk).
    pub limits: crate::sandbox::limits::SessionLimits,
    /// The warmed kernel caches sessions start from.
    pub kernel_cache: crate::kernel_cache::KernelCacheConfig,
}

pub const RUNNER_LOCAL_TELO: Setting = Setting {
    name: "RUNNER_LOCAL_TELO",
    default: "telo",
    description: "The Telo CLI sessions run: a path to its executable, or a name looked up on RUNNER_LOCAL_PATH.",
};

pub const RUNNER_LOCAL_TELO_VERSIONS: Setting = Setting {
    name: "RUNNER_LOCAL_TELO_VERSIONS",
    default: "(unset)",
    description: "Absolute directory of Telo kernels a request may choose by version (`telo`): one per release at `<dir>/<version>/bin/telo`, read at each request. Unset: `features.teloVersions` is absent and a request naming a version is `400 telo_version_unsupported`.",
};

pub const RUNNER_LOCAL_WORK_DIR: Setting = Setting {
    name: "RUNNER_LOCAL_WORK_DIR",
    default: "(system temp dir)/telo-runner-sessions",
    description: "Absolute directory holding one private work directory per session (leftovers are removed at boot) and the warmed Telo kernel caches sessions start from (.kernel-cache).",
};

pub const RUNNER_LOCAL_PATH: Setting = Setting {
    name: "RUNNER_LOCAL_PATH",
    default: "(the runner's PATH)",
    description: "PATH given to session processes; none of the runner's other environment reaches them.",
};

pub const RUNNER_MAX_TTL_SECONDS: Setting = Setting {
    name: "RUNNER_MAX_TTL_SECONDS",
    default: "3600",
    description: "Longest a session may run; one still running then is stopped and reported as failed.",
};

pub const RUNNER_LOCAL_SANDBOX: Setting = Setting {
    name: "RUNNER_LOCAL_SANDBOX",
    default: "bubblewrap",
    description: "How sessions are isolated: `bubblewrap` (each in its own sandbox, `bwrap` from the runner's PATH; sessions fail, saying why, where it cannot run) or `none` (no isolation: workloads can read the runner's environment and files; logged as an error at boot).",
};

pub const RUNNER_LOCAL_SANDBOX_READ_ONLY: Setting = Setting {
    name: "RUNNER_LOCAL_SANDBOX_READ_ONLY",
    default: "(unset)",
    description: "Colon-separated absolute paths every sandbox shows read-only, besides the system directories and the installation of the program a session runs (for a kernel wrapper that runs files kept elsewhere).",
};

pub const RUNNER_LOCAL_KERNEL_CACHE_WARM_UP: Setting = Setting {
    name: "RUNNER_LOCAL_KERNEL_CACHE_WARM_UP",
    default: "(unset)",
    description: "Absolute path of a Telo application manifest (importing modules by absolute path) that the runner runs once per kernel, in a sandbox, to warm the kernel cache Telo sessions start from; read at boot, it must exit 0 by itself. Each session gets its own copy of that cache and writes only the copy. Unset: no warm-up, every session's kernel starts with an empty cache.",
};

pub const RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES: Setting = Setting {
    name: "RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES",
    default: crate::kernel_cache::DEFAULT_MAX_BYTES,
    description: "Most bytes the warmed kernel caches (one per kernel and warm-up manifest) hold together; past it the least recently used is removed. Bytes, or with a Ki/Mi/Gi suffix.",
};

/// Every variable the local backend reads, in the order `--help` and the
/// README list them; the workspace limits are read by
/// [`runner_workspace_service::workspace_limits_from_env`].
pub const LOCAL_SETTINGS: &[Setting] = &[
    RUNNER_LOCAL_TELO,
    RUNNER_LOCAL_TELO_VERSIONS,
    RUNNER_LOCAL_WORK_DIR,
    RUNNER_LOCAL_PATH,
    RUNNER_MAX_TTL_SECONDS,
    RUNNER_LOCAL_SANDBOX,
    RUNNER_LOCAL_SANDBOX_READ_ONLY,
    crate::network::RUNNER_LOCAL_NETWORK,
    crate::sandbox::limits::RUNNER_LOCAL_MAX_MEMORY,
    crate::sandbox::limits::RUNNER_LOCAL_MAX_PROCESSES,
    crate::sandbox::limits::RUNNER_LOCAL_MAX_CPU,
    crate::sandbox::limits::RUNNER_LOCAL_MAX_DISK,
    RUNNER_LOCAL_KERNEL_CACHE_WARM_UP,
    RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES,
    RUNNER_WORKSPACE_MAX_FILE_BYTES,
    RUNNER_WORKSPACE_MAX_CHANGE_BYTES,
    RUNNER_WORKSPACE_MAX_BYTES,
    RUNNER_WORKSPACE_MAX_FILES,
];

/// Reads the local backend's variables. The runner's own `PATH` (from `env`,
/// like every other variable, so tests never depend on the machine) is the
/// workload `PATH` unless `RUNNER_LOCAL_PATH` says otherwise.
pub fn load_local_config(env: &Env) -> Result<LocalConfig, ConfigError> {
    let telo = RUNNER_LOCAL_TELO.string_or_default(env);
    let work_root = match RUNNER_LOCAL_WORK_DIR.string(env) {
        Some(raw) => {
            let dir = PathBuf::from(&raw);
            // The boot sweep deletes session directories under this root, so
            // a root that silently moved with the runner's working directory
            // could sweep the wrong place.
            if !dir.is_absolute() {
                return Err(ConfigError::invalid(
                    RUNNER_LOCAL_WORK_DIR.name,
                    "be an absolute path",
                    &raw,
                ));
            }
            dir
        }
        None => std::env::temp_dir().join(DEFAULT_WORK_DIR_NAME),
    };
    let telo_versions = match RUNNER_LOCAL_TELO_VERSIONS.string(env) {
        None => None,
        Some(raw) => {
            let dir = PathBuf::from(&raw);
            if !dir.is_absolute() {
                return Err(ConfigError::invalid(
                    RUNNER_LOCAL_TELO_VERSIONS.name,
                    "be an absolute path",
                    &raw,
                ));
            }
            Some(dir)
        }
    };
    let max_ttl_seconds = RUNNER_MAX_TTL_SECONDS.positive_int(env)?;
    // PATH and HOME are the host's own variables, not settings of the runner.
    let runner_path = env_string(env, "PATH").unwrap_or_else(|| FALLBACK_PATH.to_owned());
    let path = RUNNER_LOCAL_PATH
        .string(env)
        .unwrap_or_else(|| runner_path.clone());
    let read_only = match RUNNER_LOCAL_SANDBOX_READ_ONLY.string(env) {
        None => Vec::new(),
        Some(raw) => {
            let paths: Vec<PathBuf> = raw
                .split(':')
                .map(str::trim)
                .filter(|entry| !entry.is_empty())
                .map(PathBuf::from)
                .collect();
            if let Some(relative) = paths.iter().find(|path| !path.is_absolute()) {
                return Err(ConfigError::invalid(
                    RUNNER_LOCAL_SANDBOX_READ_ONLY.name,
                    "list absolute paths separated by ':'",
                    &relative.display().to_string(),
                ));
            }
            paths
        }
    };
    let sandbox = match RUNNER_LOCAL_SANDBOX.string_or_default(env).as_str() {
        "bubblewrap" => SandboxConfig::Bubblewrap(BubblewrapConfig {
            read_only,
            bwrap: DEFAULT_BWRAP.to_owned(),
            search_path: runner_path,
            home: env_string(env, "HOME").map(PathBuf::from),
            hidden: RUNNER_AUTH_TOKENS_FILE
                .string(env)
                .map(PathBuf::from)
                .into_iter()
                .collect(),
        }),
        "none" => SandboxConfig::None,
        other => {
            return Err(ConfigError::not_one_of(
                RUNNER_LOCAL_SANDBOX.name,
                &["bubblewrap", "none"],
                other,
            ));
        }
    };
    let network = crate::network::load_network_config(
        env,
        &env_string(env, "PATH").unwrap_or_else(|| FALLBACK_PATH.to_owned()),
    )?;
    let workspace = runner_workspace_service::workspace_limits_from_env(env)?;
    let limits = crate::sandbox::limits::load_session_limits(env)?;
    let kernel_cache = load_kernel_cache_config(env)?;
    Ok(LocalConfig {
        telo,
        telo_versions,
        work_root,
        max_ttl: Duration::from_secs(max_ttl_seconds),
        path,
        stop_grace: DEFAULT_STOP_GRACE,
        sandbox,
        network,
        workspace,
        limits,
        kernel_cache,
    })
}

fn load_kernel_cache_config(
    env: &Env,
) -> Result<crate::kernel_cache::KernelCacheConfig, ConfigError> {
    let warm_up = match RUNNER_LOCAL_KERNEL_CACHE_WARM_UP.string(env) {
        None => None,
        Some(raw) => {
            let path = PathBuf::from(&raw);
            // Read at boot from wherever the runner happened to start
            // otherwise.
            if !path.is_absolute() {
                return Err(ConfigError::invalid(
                    RUNNER_LOCAL_KERNEL_CACHE_WARM_UP.name,
                    "be an absolute path",
                    &raw,
                ));
            }
            Some(path)
        }
    };
    let raw = RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES.string_or_default(env);
    let max_bytes = crate::sandbox::limits::parse_bytes(&raw)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| {
            ConfigError::invalid(
                RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES.name,
                crate::sandbox::limits::BYTES_RULE,
                &raw,
            )
        })?;
    Ok(crate::kernel_cache::KernelCacheConfig { warm_up, max_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Env {
        runner_core::config::env_from_pairs(pairs)
    }

    #[test]
    fn an_empty_environment_yields_the_documented_defaults() {
        let config = load_local_config(&Env::new()).unwrap();
        assert_eq!(
            config,
            LocalConfig {
                telo: "telo".into(),
                telo_versions: None,
                work_root: std::env::temp_dir().join("telo-runner-sessions"),
                max_ttl: Duration::from_secs(3600),
                path: FALLBACK_PATH.into(),
                stop_grace: DEFAULT_STOP_GRACE,
                sandbox: SandboxConfig::Bubblewrap(BubblewrapConfig {
                    bwrap: "bwrap".into(),
                    search_path: FALLBACK_PATH.into(),
                    home: None,
                    hidden: Vec::new(),
                    read_only: Vec::new(),
                }),
                network: crate::network::NetworkConfig::Isolated {
                    search_path: FALLBACK_PATH.into(),
                },
                workspace: runner_workspace::WorkspaceLimits::default(),
                limits: crate::sandbox::limits::SessionLimits::default(),
                kernel_cache: crate::kernel_cache::KernelCacheConfig::default(),
            }
        );
    }

    #[test]
    fn the_kernel_cache_warm_up_and_bound_are_read_and_bad_values_refused() {
        let env = vars(&[
            (
                "RUNNER_LOCAL_KERNEL_CACHE_WARM_UP",
                " /etc/telo-runner/warm-up.yaml ",
            ),
            ("RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES", "64Mi"),
        ]);
        assert_eq!(
            load_local_config(&env).unwrap().kernel_cache,
            crate::kernel_cache::KernelCacheConfig {
                warm_up: Some(PathBuf::from("/etc/telo-runner/warm-up.yaml")),
                max_bytes: 64 << 20,
            }
        );
        for (name, raw, message) in [
            (
                "RUNNER_LOCAL_KERNEL_CACHE_WARM_UP",
                "warm-up.yaml",
                "RUNNER_LOCAL_KERNEL_CACHE_WARM_UP must be an absolute path, got 'warm-up.yaml'.",
            ),
            (
                "RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES",
                "0",
                "RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES must be a byte size such as 512Mi, 1Gi or 1073741824, got '0'.",
            ),
            (
                "RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES",
                "lots",
                "RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES must be a byte size such as 512Mi, 1Gi or 1073741824, got 'lots'.",
            ),
        ] {
            assert_eq!(
                load_local_config(&vars(&[(name, raw)])).map_err(|err| err.to_string()),
                Err(message.to_owned())
            );
        }
    }

    #[test]
    fn bubblewrap_is_found_on_the_runners_path_and_hides_the_token_file() {
        let env = vars(&[
            ("PATH", "/opt/bin:/usr/bin"),
            ("RUNNER_LOCAL_PATH", "/sandbox/bin"),
            ("HOME", "/home/runner"),
            ("RUNNER_AUTH_TOKENS_FILE", "/etc/telo-runner/tokens"),
        ]);
        for sandbox in [None, Some("bubblewrap"), Some(" bubblewrap ")] {
            let mut env = env.clone();
            if let Some(value) = sandbox {
                env.insert("RUNNER_LOCAL_SANDBOX".into(), value.into());
            }
            assert_eq!(
                load_local_config(&env).unwrap().sandbox,
                SandboxConfig::Bubblewrap(BubblewrapConfig {
                    bwrap: "bwrap".into(),
                    search_path: "/opt/bin:/usr/bin".into(),
                    home: Some("/home/runner".into()),
                    hidden: vec!["/etc/telo-runner/tokens".into()],
                    read_only: Vec::new(),
                }),
                "{sandbox:?}"
            );
        }
    }

    #[test]
    fn extra_read_only_paths_must_be_absolute() {
        let env = vars(&[(
            "RUNNER_LOCAL_SANDBOX_READ_ONLY",
            " /opt/node :: /srv/modules ",
        )]);
        let SandboxConfig::Bubblewrap(config) = load_local_config(&env).unwrap().sandbox else {
            panic!("not sandboxed");
        };
        assert_eq!(
            config.read_only,
            [PathBuf::from("/opt/node"), PathBuf::from("/srv/modules")]
        );
        let env = vars(&[("RUNNER_LOCAL_SANDBOX_READ_ONLY", "/opt/node:modules")]);
        assert_eq!(
            load_local_config(&env).map_err(|err| err.to_string()),
            Err(
                "RUNNER_LOCAL_SANDBOX_READ_ONLY must list absolute paths separated by ':', got 'modules'."
                    .into()
            )
        );
    }

    #[test]
    fn the_sandbox_can_be_turned_off_only_by_name() {
        let env = vars(&[("RUNNER_LOCAL_SANDBOX", "none")]);
        assert_eq!(
            load_local_config(&env).unwrap().sandbox,
            SandboxConfig::None
        );
        for raw in ["None", "off", "false", "bwrap", "0"] {
            let env = vars(&[("RUNNER_LOCAL_SANDBOX", raw)]);
            assert_eq!(
                load_local_config(&env).map_err(|err| err.to_string()),
                Err(format!(
                    "RUNNER_LOCAL_SANDBOX must be one of bubblewrap | none (got '{raw}')."
                ))
            );
        }
    }

    #[test]
    fn workloads_get_the_runners_path_unless_overridden() {
        let env = vars(&[("PATH", "/opt/bin:/usr/bin")]);
        assert_eq!(load_local_config(&env).unwrap().path, "/opt/bin:/usr/bin");
        let env = vars(&[
            ("PATH", "/opt/bin"),
            ("RUNNER_LOCAL_PATH", " /sandbox/bin "),
        ]);
        assert_eq!(load_local_config(&env).unwrap().path, "/sandbox/bin");
    }

    #[test]
    fn every_local_variable_is_read() {
        let env = vars(&[
            ("RUNNER_LOCAL_TELO", " /opt/telo/bin/telo "),
            ("RUNNER_LOCAL_WORK_DIR", "/var/lib/telo-runner"),
            ("RUNNER_MAX_TTL_SECONDS", "90"),
        ]);
        let config = load_local_config(&env).unwrap();
        assert_eq!(config.telo, "/opt/telo/bin/telo");
        assert_eq!(config.work_root, PathBuf::from("/var/lib/telo-runner"));
        assert_eq!(config.max_ttl, Duration::from_secs(90));
    }

    #[test]
    fn a_bad_ttl_is_refused_with_the_raw_value() {
        for raw in ["0", "-5", "1.5", "an hour"] {
            let env = vars(&[("RUNNER_MAX_TTL_SECONDS", raw)]);
            assert_eq!(
                load_local_config(&env).map_err(|err| err.to_string()),
                Err(format!(
                    "RUNNER_MAX_TTL_SECONDS must be a positive integer, got '{raw}'."
                ))
            );
        }
    }

    #[test]
    fn a_relative_versions_dir_is_refused() {
        let env = vars(&[("RUNNER_LOCAL_TELO_VERSIONS", "kernels")]);
        assert_eq!(
            load_local_config(&env).map_err(|err| err.to_string()),
            Err("RUNNER_LOCAL_TELO_VERSIONS must be an absolute path, got 'kernels'.".into())
        );
        let env = vars(&[("RUNNER_LOCAL_TELO_VERSIONS", " /opt/telo-versions ")]);
        assert_eq!(
            load_local_config(&env).unwrap().telo_versions,
            Some(PathBuf::from("/opt/telo-versions"))
        );
    }

    #[test]
    fn a_relative_work_dir_is_refused() {
        let env = vars(&[("RUNNER_LOCAL_WORK_DIR", "sessions")]);
        assert_eq!(
            load_local_config(&env).map_err(|err| err.to_string()),
            Err("RUNNER_LOCAL_WORK_DIR must be an absolute path, got 'sessions'.".into())
        );
    }

    /// The tables of what the local loader reads: its own, and the core's
    /// tokens file, which every sandbox hides.
    const READ: &[&[Setting]] = &[LOCAL_SETTINGS, &[RUNNER_AUTH_TOKENS_FILE]];

    #[test]
    fn the_documented_defaults_are_what_unset_means() {
        runner_core::setting::assert_documented_defaults_are_the_defaults(READ, load_local_config);
    }

    #[test]
    fn the_loader_reads_exactly_the_documented_variables() {
        runner_core::setting::assert_reads_exactly(READ, &[], &[Env::new()], load_local_config);
    }

    #[test]
    fn the_documentation_table_names_every_variable_read() {
        let names: Vec<&str> = LOCAL_SETTINGS.iter().map(|doc| doc.name).collect();
        assert_eq!(
            names,
            [
                "RUNNER_LOCAL_TELO",
                "RUNNER_LOCAL_TELO_VERSIONS",
                "RUNNER_LOCAL_WORK_DIR",
                "RUNNER_LOCAL_PATH",
                "RUNNER_MAX_TTL_SECONDS",
                "RUNNER_LOCAL_SANDBOX",
                "RUNNER_LOCAL_SANDBOX_READ_ONLY",
                "RUNNER_LOCAL_NETWORK",
                "RUNNER_LOCAL_MAX_MEMORY",
                "RUNNER_LOCAL_MAX_PROCESSES",
                "RUNNER_LOCAL_MAX_CPU",
                "RUNNER_LOCAL_MAX_DISK",
                "RUNNER_LOCAL_KERNEL_CACHE_WARM_UP",
                "RUNNER_LOCAL_KERNEL_CACHE_MAX_BYTES",
                "RUNNER_WORKSPACE_MAX_FILE_BYTES",
                "RUNNER_WORKSPACE_MAX_CHANGE_BYTES",
                "RUNNER_WORKSPACE_MAX_BYTES",
                "RUNNER_WORKSPACE_MAX_FILES"
            ]
        );
    }
}
