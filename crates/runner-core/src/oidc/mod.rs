//! OIDC bearer tokens (`RUNNER_OIDC_*`): verifying a JWT signed by the
//! configured issuer against its published key set, and saying whom it
//! names (subject, tenant, groups).
//!
//! The key set is read once at boot, where a failure is a boot error, and
//! then kept fresh by a background task the verifier owns: read again every
//! [`REFRESH_PERIOD`], and at once when a token names a key id the set does
//! not hold (an issuer that rotated its keys), at most every
//! [`REFETCH_MIN_INTERVAL`] so that tokens with made-up key ids cannot make
//! the runner hammer the issuer. A refresh that fails keeps the last good
//! set.
//!
//! Only public-key algorithms are accepted: `alg: none` and the HMAC
//! algorithms are refused by name, and a token's algorithm must fit the kind
//! (and the `alg`, when it names one) of the key it names. The claims are
//! checked by the runner itself, with strict types: `exp` is required,
//! `nbf` and `iat` are honoured, all three with [`MAX_CLOCK_SKEW`] of leeway.

mod keys;
mod source;
mod token;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::env::{ConfigError, Env};
use crate::settings::{
    RUNNER_OIDC_AUDIENCE, RUNNER_OIDC_GROUPS_CLAIM, RUNNER_OIDC_ISSUER, RUNNER_OIDC_JWKS_FILE,
    RUNNER_OIDC_JWKS_URL, RUNNER_OIDC_TENANT_CLAIM,
};
use crate::tasks::OwnedTasks;

use keys::KeySet;
use source::Loader;

pub use keys::MAX_JWKS_BYTES;
pub use source::FETCH_TIMEOUT;
pub use token::MAX_TOKEN_BYTES;

/// Leeway for `exp`, `nbf` and `iat` against clocks that disagree.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// The key set is read again at least this often.
pub const REFRESH_PERIOD: Duration = Duration::from_secs(60);
/// Tokens naming an unknown key id make the key set be read again at most
/// this often.
pub const REFETCH_MIN_INTERVAL: Duration = Duration::from_secs(10);
/// How long shutdown waits for the refresh task.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(10);

/// Which issuer's tokens are accepted, and how they name tenant and groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConfig {
    /// `RUNNER_OIDC_ISSUER`: must equal the token's `iss`.
    pub issuer: String,
    /// `RUNNER_OIDC_AUDIENCE`: must be the token's `aud` or one of them.
    pub audience: String,
    /// `RUNNER_OIDC_JWKS_URL` or `RUNNER_OIDC_JWKS_FILE`.
    pub jwks: JwksSource,
    /// `RUNNER_OIDC_TENANT_CLAIM`: the claim (a string) naming the tenant.
    pub tenant_claim: String,
    /// `RUNNER_OIDC_GROUPS_CLAIM`: the claim (strings) naming the groups.
    pub groups_claim: String,
    /// [`MAX_CLOCK_SKEW`].
    pub max_clock_skew: Duration,
}

/// Where the issuer's key set is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    Url(String),
    File(PathBuf),
}

/// Who a verified token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    /// The `sub` claim.
    pub subject: String,
    pub tenant: String,
    pub groups: Vec<String>,
}

/// Why a token was refused: `reason` is one sentence, safe to show the
/// client that presented it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct TokenRefused {
    pub reason: String,
}

/// A key set the verifier cannot start with; the binary exits 2 with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcError {
    #[error("RUNNER_OIDC_JWKS_URL '{url}' could not be fetched: {reason}")]
    Unfetchable { url: String, reason: String },
    #[error("RUNNER_OIDC_JWKS_FILE '{path}' could not be read: {reason}")]
    UnreadableFile { path: String, reason: String },
    /// `reason` completes "is not a usable key set: …".
    #[error("{var} '{origin}' is not a usable key set: {reason}")]
    Unusable {
        var: String,
        origin: String,
        reason: String,
    },
    #[error("could not build the HTTP client for RUNNER_OIDC_JWKS_URL: {reason}")]
    Client { reason: String },
}

/// Reads the `RUNNER_OIDC_*` settings: `None` when `RUNNER_OIDC_ISSUER` is
/// unset or blank. Every other OIDC setting is read either way, and one set
/// without the issuer (a claim set to anything but its default) is refused:
/// an operator who configured half of OIDC would otherwise get a runner
/// that silently takes no OIDC tokens.
pub fn load_oidc_config(env: &Env) -> Result<Option<OidcConfig>, ConfigError> {
    let issuer = RUNNER_OIDC_ISSUER.string(env);
    let audience = RUNNER_OIDC_AUDIENCE.string(env);
    let jwks_url = RUNNER_OIDC_JWKS_URL.string(env);
    let jwks_file = RUNNER_OIDC_JWKS_FILE.string(env);
    let tenant_claim = RUNNER_OIDC_TENANT_CLAIM.string_or_default(env);
    let groups_claim = RUNNER_OIDC_GROUPS_CLAIM.string_or_default(env);

    let Some(issuer) = issuer else {
        let set_without_issuer = [
            (RUNNER_OIDC_AUDIENCE, audience.is_some()),
            (RUNNER_OIDC_JWKS_URL, jwks_url.is_some()),
            (RUNNER_OIDC_JWKS_FILE, jwks_file.is_some()),
            (
                RUNNER_OIDC_TENANT_CLAIM,
                Some(tenant_claim.as_str()) != RUNNER_OIDC_TENANT_CLAIM.default_value(),
            ),
            (
                RUNNER_OIDC_GROUPS_CLAIM,
                Some(groups_claim.as_str()) != RUNNER_OIDC_GROUPS_CLAIM.default_value(),
            ),
        ];
        return match set_without_issuer.iter().find(|(_, set)| *set) {
            Some((setting, _)) => Err(ConfigError::conflict(
                setting.name,
                format!(
                    "{} is not; set the issuer to accept OIDC tokens, or unset {}.",
                    RUNNER_OIDC_ISSUER.name, setting.name
                ),
            )),
            None => Ok(None),
        };
    };
    let Some(audience) = audience else {
        return Err(ConfigError::must_be(
            RUNNER_OIDC_AUDIENCE.name,
            format!("set when {} is", RUNNER_OIDC_ISSUER.name),
        ));
    };
    let jwks = match (jwks_url, jwks_file) {
        (None, None) => {
            return Err(ConfigError::must_be(
                RUNNER_OIDC_JWKS_URL.name,
                format!(
                    "set when {} is, unless {} is",
                    RUNNER_OIDC_ISSUER.name, RUNNER_OIDC_JWKS_FILE.name
                ),
            ));
        }
        (Some(_), Some(_)) => {
            return Err(ConfigError::conflict(
                RUNNER_OIDC_JWKS_FILE.name,
                format!(
                    "so is {}; set exactly one of them.",
                    RUNNER_OIDC_JWKS_URL.name
                ),
            ));
        }
        (Some(url), None) => {
            let parsed = reqwest::Url::parse(&url).ok();
            let usable = parsed.as_ref().is_some_and(|parsed| {
                matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some()
            });
            if !usable {
                return Err(ConfigError::invalid(
                    RUNNER_OIDC_JWKS_URL.name,
                    "be an http or https URL",
                    &url,
                ));
            }
            JwksSource::Url(url)
        }
        (None, Some(path)) => JwksSource::File(PathBuf::from(path)),
    };
    Ok(Some(OidcConfig {
        issuer,
        audience,
        jwks,
        tenant_claim,
        groups_claim,
        max_clock_skew: MAX_CLOCK_SKEW,
    }))
}

/// The periods of the refresh task ([`REFRESH_PERIOD`],
/// [`REFETCH_MIN_INTERVAL`]); tests shorten them.
#[derive(Debug, Clone, Copy)]
struct Timing {
    period: Duration,
    min_refetch_interval: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            period: REFRESH_PERIOD,
            min_refetch_interval: REFETCH_MIN_INTERVAL,
        }
    }
}

/// The key set in force and how many refreshes have started and finished
/// (succeeded or not), so that a caller can wait for a refresh that began
/// after it asked.
#[derive(Debug, Clone)]
struct Snapshot {
    keys: Arc<KeySet>,
    started: u64,
    finished: u64,
}

/// The unknown-key-id refetch last asked for.
#[derive(Debug, Default)]
struct Refetch {
    asked_at: Option<Instant>,
    /// The `finished` count that answers it.
    answered_at: u64,
}

/// Tokens whose signature is remembered as checked, at most; past it the
/// memory starts over.
const CHECKED_TOKENS: usize = 10_000;

struct Inner {
    /// SHA-256 of tokens whose signature verified, with the key set it
    /// verified against.
    checked: Mutex<std::collections::HashMap<[u8; 32], std::sync::Weak<KeySet>>>,
    config: OidcConfig,
    keys: watch::Receiver<Snapshot>,
    wanted: Arc<Notify>,
    refetch: Mutex<Refetch>,
    timing: Timing,
    tasks: OwnedTasks,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A verifier dropped without shutdown still stops its task.
        self.tasks.stop();
    }
}

/// Verifies bearer JWTs against the issuer's key set; clones share one key
/// set and one refresh task.
#[derive(Clone)]
pub struct OidcVerifier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier")
            .field("issuer", &self.inner.config.issuer)
            .field("audience", &self.inner.config.audience)
            .finish_non_exhaustive()
    }
}

impl OidcVerifier {
    /// Reads the key set once (a file that cannot be read or parsed, or a
    /// URL that cannot be fetched, is an error naming it), then keeps it
    /// fresh in a background task the verifier owns.
    pub async fn start(config: OidcConfig) -> Result<Self, OidcError> {
        Self::start_with(config, Timing::default()).await
    }

    async fn start_with(config: OidcConfig, timing: Timing) -> Result<Self, OidcError> {
        let loader = Loader::new(&config.jwks)?;
        let keys = loader.load().await?;
        debug!(keys = keys.keys.len(), "read the OIDC key set");
        let (publish, keys) = watch::channel(Snapshot {
            keys: Arc::new(keys),
            started: 0,
            finished: 0,
        });
        let wanted = Arc::new(Notify::new());
        let tasks = OwnedTasks::new();
        tasks.spawn(keep_fresh(
            loader,
            publish,
            Arc::clone(&wanted),
            timing.period,
        ));
        Ok(Self {
            inner: Arc::new(Inner {
                checked: Mutex::new(std::collections::HashMap::new()),
                config,
                keys,
                wanted,
                refetch: Mutex::new(Refetch::default()),
                timing,
                tasks,
            }),
        })
    }

    /// Whether a bearer token has the shape of a JWT (three base64url
    /// parts); a static token that does not is checked against the token
    /// file instead.
    pub fn looks_like_jwt(token: &str) -> bool {
        token::looks_like_jwt(token)
    }

    /// Verifies `token` and says whom it names, or why it is refused. A
    /// token naming a key id the set does not hold may wait for the key set
    /// to be fetched again, at most [`FETCH_TIMEOUT`] and a little.
    pub async fn verify(&self, token: &str) -> Result<VerifiedToken, TokenRefused> {
        let parsed = token::parse(token)?;
        let mut keys = Arc::clone(&self.inner.keys.borrow().keys);
        if let Some(kid) = parsed.kid.as_deref()
            && !keys.holds(kid)
        {
            keys = self.refetch_for(kid).await?;
        }
        self.check_signature_once(token, &parsed, &keys)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        token::check_claims(&parsed, &self.inner.config, now)
    }

    /// Checks `parsed`'s signature against `keys`, unless this very token
    /// was already checked against this very key set: an editor sends the
    /// same token with every request, and the signature is the costly part
    /// of a verification. The claims (expiry above all) are checked every
    /// time; a new key set (every refresh) checks every token again.
    fn check_signature_once(
        &self,
        token: &str,
        parsed: &token::Parsed<'_>,
        keys: &Arc<KeySet>,
    ) -> Result<(), TokenRefused> {
        use sha2::Digest as _;
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let mut checked = self
            .inner
            .checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if checked
            .get(&digest)
            .and_then(std::sync::Weak::upgrade)
            .is_some_and(|against| Arc::ptr_eq(&against, keys))
        {
            return Ok(());
        }
        drop(checked);
        token::check_signature(parsed, keys)?;
        checked = self
            .inner
            .checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if checked.len() >= CHECKED_TOKENS {
            checked.clear();
        }
        checked.insert(digest, Arc::downgrade(keys));
        Ok(())
    }

    /// Reads the key set again now, outside the refetch limit, and returns
    /// once that read has ended (a failed one keeps the set in force). After
    /// shutdown it returns at once.
    pub async fn refresh(&self) {
        let target = self.inner.keys.borrow().started + 1;
        self.inner.wanted.notify_one();
        self.wait_for_refresh(target).await;
    }

    /// Stops and joins the refresh task. Tokens are still verified after it,
    /// against the last key set read.
    pub async fn shutdown(&self) {
        self.inner.tasks.shutdown(SHUTDOWN_BOUND).await;
    }

    /// The key set once a refresh started after now has ended, when it holds
    /// `kid`. Refreshes asked for this way are at most one per
    /// `min_refetch_interval`; a token arriving while one is under way waits
    /// for it too.
    async fn refetch_for(&self, kid: &str) -> Result<Arc<KeySet>, TokenRefused> {
        let unknown = || TokenRefused {
            reason: format!(
                "the token names key id '{}', which the issuer's key set does not hold",
                token::quoted(kid)
            ),
        };
        let target = {
            let mut refetch = self
                .inner
                .refetch
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (started, finished) = {
                let snapshot = self.inner.keys.borrow();
                (snapshot.started, snapshot.finished)
            };
            if refetch.answered_at > finished {
                refetch.answered_at
            } else if refetch
                .asked_at
                .is_none_or(|at| at.elapsed() >= self.inner.timing.min_refetch_interval)
            {
                refetch.asked_at = Some(Instant::now());
                refetch.answered_at = started + 1;
                self.inner.wanted.notify_one();
                started + 1
            } else {
                return Err(unknown());
            }
        };
        let keys = self.wait_for_refresh(target).await.ok_or_else(unknown)?;
        if keys.holds(kid) {
            Ok(keys)
        } else {
            Err(unknown())
        }
    }

    /// Waits, at most a fetch's timeout and a little, for refresh number
    /// `target` to end, and returns the key set then in force; `None` when
    /// it did not end in time or the refresh task has stopped.
    async fn wait_for_refresh(&self, target: u64) -> Option<Arc<KeySet>> {
        let mut keys = self.inner.keys.clone();
        let bound = FETCH_TIMEOUT + Duration::from_secs(5);
        match tokio::time::timeout(bound, keys.wait_for(|s| s.finished >= target)).await {
            Ok(Ok(snapshot)) => Some(Arc::clone(&snapshot.keys)),
            _ => None,
        }
    }
}

/// The refresh task: reads the key set every `period`, and whenever asked.
async fn keep_fresh(
    loader: Loader,
    publish: watch::Sender<Snapshot>,
    wanted: Arc<Notify>,
    period: Duration,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = wanted.notified() => {}
        }
        publish.send_modify(|snapshot| snapshot.started += 1);
        let keys = match loader.load().await {
            Ok(keys) => {
                debug!(keys = keys.keys.len(), "refreshed the OIDC key set");
                Some(Arc::new(keys))
            }
            Err(err) => {
                warn!(error = %err, "could not refresh the OIDC key set; keeping the last good one");
                None
            }
        };
        publish.send_modify(|snapshot| {
            snapshot.finished += 1;
            if let Some(keys) = keys {
                snapshot.keys = keys;
            }
        });
    }
}

#[async_trait::async_trait]
impl crate::identity::BearerVerifier for OidcVerifier {
    fn recognizes(&self, token: &str) -> bool {
        Self::looks_like_jwt(token)
    }

    async fn verify(&self, token: &str) -> Result<crate::identity::VerifiedIdentity, String> {
        let verified = OidcVerifier::verify(self, token)
            .await
            .map_err(|refused| refused.reason)?;
        Ok(crate::identity::VerifiedIdentity {
            subject: verified.subject,
            tenant: verified.tenant,
            groups: verified.groups,
        })
    }
}
