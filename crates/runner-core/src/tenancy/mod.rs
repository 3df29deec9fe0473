//! Limits per tenant: the tiers file, the quotas a session creation is
//! checked against ([`quota`]) and the rate limits every request is
//! ([`rate`]). Without `RUNNER_TIERS_FILE` every tenant is unlimited.
//!
//! The file is read at boot (one that does not parse is a boot error) and
//! again every [`TIERS_POLL`]: a change applies without a restart, and a
//! change that does not parse keeps the last good tiers and is logged. A
//! ConfigMap mounted as a file works: it is read by content, not by event.

pub mod quota;
pub mod rate;
pub mod tiers;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tracing::warn;

use crate::env::{ConfigError, Env};
use crate::identity::{Principal, PrincipalSource};
use crate::settings::{RUNNER_ADMIN_GROUP, RUNNER_ANONYMOUS, RUNNER_TIERS_FILE};
use crate::tasks::OwnedTasks;
pub use quota::{Ask, QuotaExceeded, SessionResources, Usage};
pub use rate::{RateKind, RateLimited, RateLimits};
pub use tiers::{TierLimits, Tiers};

/// How often the tiers file is read again (a change applies within it).
pub const TIERS_POLL: Duration = Duration::from_secs(10);

/// `RUNNER_ANONYMOUS`, `RUNNER_TIERS_FILE`, `RUNNER_ADMIN_GROUP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenancyConfig {
    /// No authentication: every client is its address, in the `anonymous`
    /// tier.
    pub anonymous: bool,
    pub tiers_file: Option<PathBuf>,
    /// Principals in this group (an OIDC groups claim, a token's `groups=`)
    /// are admins.
    pub admin_group: String,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        Self {
            anonymous: false,
            tiers_file: None,
            admin_group: RUNNER_ADMIN_GROUP.default.to_owned(),
        }
    }
}

pub fn load_tenancy_config(env: &Env) -> Result<TenancyConfig, ConfigError> {
    Ok(TenancyConfig {
        anonymous: RUNNER_ANONYMOUS.bool(env)?,
        tiers_file: RUNNER_TIERS_FILE.string(env).map(PathBuf::from),
        admin_group: RUNNER_ADMIN_GROUP.string_or_default(env),
    })
}

/// The installation's tiers, rate buckets and daily usage.
#[derive(Clone)]
pub struct Tenancy {
    inner: Arc<Inner>,
}

struct Inner {
    config: TenancyConfig,
    tiers: RwLock<Arc<Tiers>>,
    /// The text the current tiers came from, to skip re-parsing.
    source: Mutex<Option<String>>,
    rates: RateLimits,
    tasks: OwnedTasks,
}

impl Tenancy {
    /// Reads the tiers file once; a file that cannot be read or parsed is a
    /// boot error naming it.
    pub fn load(config: TenancyConfig) -> Result<Self, ConfigError> {
        let (tiers, source) = match &config.tiers_file {
            None => (Tiers::default(), None),
            Some(path) => {
                let text = read_tiers(path).map_err(|reason| ConfigError::Invalid {
                    var: RUNNER_TIERS_FILE.name.to_owned(),
                    rule: format!("name a readable tiers file ({reason})"),
                    value: path.display().to_string(),
                })?;
                let tiers = Tiers::parse(&text).map_err(|reason| ConfigError::Invalid {
                    var: RUNNER_TIERS_FILE.name.to_owned(),
                    rule: format!("name a tiers file that parses ({reason})"),
                    value: path.display().to_string(),
                })?;
                (tiers, Some(text))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                tiers: RwLock::new(Arc::new(tiers)),
                source: Mutex::new(source),
                rates: RateLimits::default(),
                tasks: OwnedTasks::new(),
            }),
        })
    }

    /// Everything unlimited, nothing anonymous.
    pub fn unlimited() -> Self {
        Self::load(TenancyConfig::default()).expect("no file to read")
    }

    pub fn config(&self) -> &TenancyConfig {
        &self.inner.config
    }

    pub fn is_anonymous(&self) -> bool {
        self.inner.config.anonymous
    }

    /// Whether a tiers file is configured (capabilities report limits then).
    pub fn has_tiers(&self) -> bool {
        self.inner.config.tiers_file.is_some()
    }

    /// Starts the task that reads the tiers file again every
    /// [`TIERS_POLL`] and forgets refilled rate buckets.
    pub fn start(&self) {
        let tenancy = self.clone();
        let stopping = self.inner.tasks.stopping();
        self.inner.tasks.spawn(async move {
            let mut ticks = tokio::time::interval(TIERS_POLL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                tokio::select! {
                    () = stopping.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                let reloaded = tenancy.clone();
                let _ = tokio::task::spawn_blocking(move || reloaded.reload()).await;
            }
        });
    }

    pub async fn shutdown(&self) {
        self.inner.tasks.shutdown(Duration::from_secs(5)).await;
    }

    /// Reads the tiers file again now; returns whether the tiers changed.
    /// A file that cannot be read or parsed keeps the last good tiers.
    pub fn reload(&self) -> bool {
        let tiers_now = self.tiers();
        self.inner.rates.forget_idle(&tiers_now);
        let Some(path) = &self.inner.config.tiers_file else {
            return false;
        };
        let text = match read_tiers(path) {
            Ok(text) => text,
            Err(reason) => {
                warn!(path = %path.display(), %reason, "could not read the tiers file; keeping the last good tiers");
                return false;
            }
        };
        let mut source = lock(&self.inner.source);
        if source.as_deref() == Some(text.as_str()) {
            return false;
        }
        match Tiers::parse(&text) {
            Ok(tiers) => {
                *self
                    .inner
                    .tiers
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(tiers);
                *source = Some(text);
                tracing::info!(path = %path.display(), "tiers file changed; new limits apply now");
                true
            }
            Err(reason) => {
                warn!(path = %path.display(), %reason, "the tiers file does not parse; keeping the last good tiers");
                false
            }
        }
    }

    pub fn tiers(&self) -> Arc<Tiers> {
        self.inner
            .tiers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The tier and limits of `principal`'s tenant.
    pub fn limits_of(&self, principal: &Principal) -> (String, TierLimits) {
        self.tiers().of_tenant(
            &principal.tenant,
            principal.source == PrincipalSource::Anonymous,
        )
    }

    /// Takes a request token (`requestsPerMinute`) for `principal`.
    pub fn take_request(&self, principal: &Principal) -> Result<(), RateLimited> {
        self.take(principal, RateKind::Requests)
    }

    /// Takes a start token (`startsPerMinute`) for `principal`.
    pub fn take_start(&self, principal: &Principal) -> Result<(), RateLimited> {
        self.take(principal, RateKind::Starts)
    }

    fn take(&self, principal: &Principal, kind: RateKind) -> Result<(), RateLimited> {
        let (tier, limits) = self.limits_of(principal);
        self.inner
            .rates
            .take(&tier, &limits, kind, &principal.subject)
    }

    /// Rate keys held now.
    pub fn rate_keys(&self) -> usize {
        self.inner.rates.keys()
    }

    /// Whether `groups` holds the admin group.
    pub fn is_admin_group(&self, groups: &[String]) -> bool {
        groups
            .iter()
            .any(|group| *group == self.inner.config.admin_group)
    }
}

/// The current UTC day, as days since the epoch.
pub fn utc_day() -> i64 {
    time::OffsetDateTime::now_utc()
        .unix_timestamp()
        .div_euclid(86_400)
}

/// The tiers file's text, at most 1 MiB.
fn read_tiers(path: &std::path::Path) -> Result<String, String> {
    const MAX_TIERS_FILE: u64 = 1 << 20;
    let meta = std::fs::metadata(path).map_err(|err| err.to_string())?;
    if meta.len() > MAX_TIERS_FILE {
        return Err(format!("it is over {MAX_TIERS_FILE} bytes"));
    }
    std::fs::read_to_string(path).map_err(|err| err.to_string())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &std::path::Path) -> TenancyConfig {
        TenancyConfig {
            tiers_file: Some(path.to_owned()),
            ..TenancyConfig::default()
        }
    }

    fn principal(tenant: &str) -> Principal {
        Principal {
            subject: format!("oidc:{tenant}-user"),
            tenant: tenant.into(),
            groups: Vec::new(),
            admin: false,
            source: PrincipalSource::Oidc,
        }
    }

    #[test]
    fn a_changed_file_applies_and_a_broken_one_keeps_the_last_good_tiers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiers.yaml");
        std::fs::write(&path, "tiers: {default: {sessions: 1}}").unwrap();
        let tenancy = Tenancy::load(config(&path)).unwrap();
        assert_eq!(tenancy.limits_of(&principal("acme")).1.sessions, Some(1));
        assert!(!tenancy.reload(), "nothing changed");
        std::fs::write(
            &path,
            "tiers: {default: {sessions: 1}, gold: {sessions: 9}}\ntenants: {acme: gold}",
        )
        .unwrap();
        assert!(tenancy.reload());
        assert_eq!(
            tenancy.limits_of(&principal("acme")),
            (
                "gold".into(),
                TierLimits {
                    sessions: Some(9),
                    ..TierLimits::default()
                }
            )
        );
        std::fs::write(&path, "tiers: [not, a, map").unwrap();
        assert!(!tenancy.reload());
        assert_eq!(tenancy.limits_of(&principal("acme")).1.sessions, Some(9));
        std::fs::remove_file(&path).unwrap();
        assert!(!tenancy.reload());
        assert_eq!(tenancy.limits_of(&principal("acme")).1.sessions, Some(9));
    }

    #[test]
    fn a_file_that_does_not_parse_at_boot_is_a_config_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiers.yaml");
        std::fs::write(&path, "tenants: {acme: gold}").unwrap();
        let err = Tenancy::load(config(&path)).err().unwrap().to_string();
        assert_eq!(
            err,
            format!(
                "RUNNER_TIERS_FILE must name a tiers file that parses (tenant 'acme' is in tier 'gold', which the file does not define), got '{}'.",
                path.display()
            )
        );
        let missing = dir.path().join("missing.yaml");
        assert!(
            Tenancy::load(config(&missing))
                .err()
                .unwrap()
                .to_string()
                .starts_with("RUNNER_TIERS_FILE must name a readable tiers file (")
        );
    }

    #[test]
    fn anonymous_clients_are_in_the_anonymous_tier() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiers.json");
        std::fs::write(
            &path,
            r#"{"tiers": {"anonymous": {"startsPerMinute": 1}, "default": {}}}"#,
        )
        .unwrap();
        let tenancy = Tenancy::load(config(&path)).unwrap();
        let client = Principal::anonymous("192.0.2.1".parse().unwrap());
        assert_eq!(tenancy.limits_of(&client).0, "anonymous");
        assert_eq!(tenancy.take_start(&client), Ok(()));
        assert!(tenancy.take_start(&client).is_err());
        let other = Principal::anonymous("192.0.2.2".parse().unwrap());
        assert_eq!(tenancy.take_start(&other), Ok(()));
        assert_eq!(tenancy.take_start(&principal("acme")), Ok(()));
        assert_eq!(tenancy.take_start(&principal("acme")), Ok(()));
    }
}
