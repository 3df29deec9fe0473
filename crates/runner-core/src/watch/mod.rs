//! Watch sessions in the core: their configuration, the reload budget, and
//! the supervisor that checkpoints idle sessions and suspends them.

mod budget;

use std::time::Duration;

pub use budget::{RELOAD_WINDOW, ReloadBudget};

use crate::env::{ConfigError, Env};
use crate::setting::Setting;
use crate::settings::{
    RUNNER_WATCH_IDLE_SECONDS, RUNNER_WATCH_MAX_SESSIONS, RUNNER_WATCH_MAX_SUSPENDED,
    RUNNER_WATCH_MAX_TTL_SECONDS, RUNNER_WATCH_RELOAD_LIMIT, RUNNER_WATCH_SESSIONS,
    RUNNER_WATCH_SUSPENDED_TTL_SECONDS, RUNNER_WORKSPACE_CHECKPOINT_SECONDS,
};

// Typed for `WatchConfig::default`; `typed_defaults_are_the_documented_ones`
// proves they are the settings' documented defaults.
pub const DEFAULT_IDLE_SECONDS: u64 = 300;
pub const DEFAULT_MAX_TTL_SECONDS: u64 = 21_600;
pub const DEFAULT_MAX_WATCH_SESSIONS: u64 = 8;
pub const DEFAULT_RELOAD_LIMIT: u64 = 30;
pub const DEFAULT_SUSPENDED_TTL_SECONDS: u64 = 86_400;
pub const DEFAULT_CHECKPOINT_SECONDS: u64 = 30;
pub const DEFAULT_MAX_SUSPENDED: u64 = 64;
/// How often the supervisor looks at every watch session, at most (the
/// reference's cadence); shorter idle, checkpoint or lifetime windows are looked at
/// four times per window, so a suspend is never late by more than a
/// quarter of its window.
pub const SUPERVISOR_TICK: Duration = Duration::from_secs(5);

/// `RUNNER_WATCH_*` and `RUNNER_WORKSPACE_CHECKPOINT_SECONDS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    /// `RUNNER_WATCH_SESSIONS`: whether `mode: "watch"` is offered.
    pub enabled: bool,
    /// Unwatched for this long, a session is suspended.
    pub idle: Duration,
    /// The longest a watch workload lives (a pod's `activeDeadlineSeconds`).
    pub max_ttl: Duration,
    /// Live (not suspended) watch sessions at once.
    pub max_sessions: usize,
    /// Workspace writes plus reloads per session per minute.
    pub reload_limit: usize,
    /// How long a suspended session is kept.
    pub suspended_ttl: Duration,
    /// Suspended sessions kept at once; at the bound an idle session keeps
    /// running instead of being suspended.
    pub max_suspended: usize,
    /// How often a live session's workspace is checkpointed.
    pub checkpoint_every: Duration,
    /// How often the supervisor runs ([`SUPERVISOR_TICK`] or a quarter of
    /// the shortest window).
    pub tick: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            idle: Duration::from_secs(DEFAULT_IDLE_SECONDS),
            max_ttl: Duration::from_secs(DEFAULT_MAX_TTL_SECONDS),
            max_sessions: DEFAULT_MAX_WATCH_SESSIONS as usize,
            reload_limit: DEFAULT_RELOAD_LIMIT as usize,
            suspended_ttl: Duration::from_secs(DEFAULT_SUSPENDED_TTL_SECONDS),
            max_suspended: DEFAULT_MAX_SUSPENDED as usize,
            checkpoint_every: Duration::from_secs(DEFAULT_CHECKPOINT_SECONDS),
            tick: SUPERVISOR_TICK,
        }
    }
}

/// Reads the watch variables; each is checked whether or not watch
/// sessions are enabled, so a typo never waits for the day they are.
pub fn load_watch_config(env: &Env) -> Result<WatchConfig, ConfigError> {
    let seconds = |setting: Setting| setting.positive_int(env).map(Duration::from_secs);
    let config = WatchConfig {
        enabled: RUNNER_WATCH_SESSIONS.bool(env)?,
        idle: seconds(RUNNER_WATCH_IDLE_SECONDS)?,
        max_ttl: seconds(RUNNER_WATCH_MAX_TTL_SECONDS)?,
        max_sessions: RUNNER_WATCH_MAX_SESSIONS.positive_usize(env)?,
        reload_limit: RUNNER_WATCH_RELOAD_LIMIT.positive_usize(env)?,
        suspended_ttl: seconds(RUNNER_WATCH_SUSPENDED_TTL_SECONDS)?,
        max_suspended: RUNNER_WATCH_MAX_SUSPENDED.positive_usize(env)?,
        checkpoint_every: seconds(RUNNER_WORKSPACE_CHECKPOINT_SECONDS)?,
        tick: SUPERVISOR_TICK,
    };
    let tick = SUPERVISOR_TICK
        .min(config.idle / 4)
        .min(config.checkpoint_every / 4)
        .min(config.max_ttl / 4);
    Ok(WatchConfig { tick, ..config })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::env_from_pairs;

    #[test]
    fn the_defaults_are_the_references() {
        let config = load_watch_config(&env_from_pairs(&[])).unwrap();
        assert_eq!(config, WatchConfig::default());
        assert!(!config.enabled);
        assert_eq!(config.idle, Duration::from_secs(300));
        assert_eq!(config.max_sessions, 8);
        assert_eq!(config.reload_limit, 30);
        assert_eq!(config.tick, SUPERVISOR_TICK);
        let short =
            load_watch_config(&env_from_pairs(&[("RUNNER_WATCH_IDLE_SECONDS", "2")])).unwrap();
        assert_eq!(short.tick, Duration::from_millis(500));
    }

    #[test]
    fn bad_values_are_refused_with_the_variable_named() {
        for (var, value) in [
            ("RUNNER_WATCH_SESSIONS", "maybe"),
            ("RUNNER_WATCH_IDLE_SECONDS", "0"),
            ("RUNNER_WATCH_MAX_TTL_SECONDS", "-1"),
            ("RUNNER_WATCH_MAX_SESSIONS", "x"),
            ("RUNNER_WATCH_RELOAD_LIMIT", "1.5"),
            ("RUNNER_WATCH_SUSPENDED_TTL_SECONDS", "0"),
            ("RUNNER_WATCH_MAX_SUSPENDED", "0"),
            ("RUNNER_WORKSPACE_CHECKPOINT_SECONDS", "abc"),
        ] {
            let err = load_watch_config(&env_from_pairs(&[(var, value)])).unwrap_err();
            assert!(err.to_string().starts_with(var), "{err}");
        }
    }
}
