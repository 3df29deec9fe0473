//! Core runner configuration read from the environment (docs/contract.md §8.1): the
//! top-level loader, which also reads the app catalog, the auth tokens and the
//! terms. The parsers it shares with them live in [`crate::env`] (re-exported
//! here for the backends' loaders); the JavaScript semantics they follow are
//! [`runner_api::js`].

use runner_api::io::FrameFormat;
use runner_api::js::js_trim;
use runner_api::types::RunnerTerms;
use std::time::Duration;

use crate::apps::{AppCatalog, load_apps};
use crate::auth::{AuthTokens, load_auth_tokens};
use crate::client_addr::TrustedProxies;
use crate::oidc::{OidcConfig, load_oidc_config};
use crate::terms::load_terms;
use crate::watch::{WatchConfig, load_watch_config};
use crate::webhooks::{WebhookConfig, load_webhook_config};

pub use crate::env::{
    ConfigError, Env, IntegerRange, env_from_pairs, env_string, parse_bool, parse_non_negative_int,
    parse_port, parse_positive_int,
};
use crate::env::{parse_positive_usize, parse_whole_number};
pub use crate::setting::Setting;
pub use crate::settings::*;

// The typed defaults below are for the types' `Default`s and other crates;
// the loaders fall back to the settings' documented defaults, and
// `typed_defaults_are_the_documented_ones` proves the two agree.

/// Seconds a stopped workload gets between SIGTERM and the kill.
pub const DEFAULT_STOP_GRACE_SECONDS: u64 = 5;
/// Open client connections served at once (our hardening). Sized for the
/// chart's 256 MiB memory limit: each connection costs at most about 25 KiB
/// with the header cap below, so the limit is reached well before the limit
/// of the pod, and 1,100 idle plus 3,000 slow clients still fit beside the
/// editor.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 6_000;
/// Event streams plus terminal sockets open on one session at once. An
/// editor tab holds one stream and a socket per app; the cap is far above
/// that and far below what would let one session's subscribers take the
/// service's connections.
pub const DEFAULT_MAX_SUBSCRIBERS_PER_SESSION: u64 = 64;
/// Event streams plus terminal sockets one client holds at once, across
/// sessions. A client is its bearer token when it presents one, else its
/// address.
pub const DEFAULT_MAX_SUBSCRIBERS_PER_CLIENT: u64 = 256;
/// A client that has not sent a request's whole header block within this
/// time, including an idle keep-alive connection, is disconnected.
pub const DEFAULT_HEADER_TIMEOUT_SECONDS: u64 = 10;
/// A request body that has not arrived in full within this time gets 408.
pub const DEFAULT_BODY_TIMEOUT_SECONDS: u64 = 30;
/// Largest request header block; bigger gets 431.
pub const DEFAULT_MAX_HEADER_BYTES: u64 = 16_384;
/// The smallest header cap the HTTP server can work with (its read buffer).
pub const MIN_MAX_HEADER_BYTES: u64 = 8_192;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// `Access-Control-Allow-Origin: *`.
    Any,
    /// Exact-match origins. May contain a literal `"*"`: whether that acts as a
    /// wildcard differs per route in the reference (docs/contract.md §1.5), so callers decide.
    List(Vec<String>),
}

impl CorsOrigins {
    /// Whether `origin` (what a browser sent) is an entry of the list. A
    /// literal `*` entry matches nothing here: each route decides what it
    /// makes of one.
    pub fn lists(&self, origin: &str) -> bool {
        match self {
            CorsOrigins::Any => false,
            CorsOrigins::List(list) => list.iter().any(|entry| origin_matches(entry, origin)),
        }
    }
}

/// An entry matches its own text, and an entry ending in `:*`
/// (`http://localhost:*`) matches that scheme and host on any port: a
/// loopback editor or dev server picks its port at random, so listing the
/// ports one by one is no choice at all. The host must end where the entry
/// does, so `http://localhost:*` never admits `http://localhost.evil.example`.
pub fn origin_matches(entry: &str, origin: &str) -> bool {
    if entry == origin {
        return true;
    }
    let Some(scheme_and_host) = entry.strip_suffix(":*") else {
        return false;
    };
    if !scheme_and_host.contains("://") {
        return false;
    }
    match origin.strip_prefix(scheme_and_host) {
        Some("") => true,
        Some(rest) => rest.strip_prefix(':').is_some_and(|port| {
            !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
        }),
        None => false,
    }
}

/// Everything `loadCoreConfig` resolves, plus our body limit, the terms and the
/// app catalog (resolved once at boot so what is advertised and what is
/// enforced can never drift).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreConfig {
    pub port: u16,
    pub log_level: String,
    pub max_sessions: usize,
    pub exit_ttl: Duration,
    pub replay_buffer_bytes: usize,
    pub cors_origins: CorsOrigins,
    pub default_registry_url: Option<String>,
    pub max_body_bytes: usize,
    /// Interval of the SSE heartbeat comment that keeps idle streams open
    /// through proxies.
    pub sse_heartbeat: Duration,
    pub terms: Option<RunnerTerms>,
    pub apps: AppCatalog,
    /// Bearer tokens every gated `/v1` route requires; `None` = no auth.
    pub auth_tokens: Option<AuthTokens>,
    /// `RUNNER_OIDC_*`: the issuer whose JWT bearer tokens are accepted;
    /// `None` = none are.
    pub oidc: Option<OidcConfig>,
    /// How long a stopped workload may take to exit after SIGTERM (a pod's
    /// grace period) before it is killed.
    pub stop_grace: Duration,
    pub connections: ConnectionLimits,
    /// `RUNNER_IO_FRAMES`: the layout of `/io` output frames.
    pub io_frames: FrameFormat,
    /// `RUNNER_WATCH_*`: watch sessions.
    pub watch: WatchConfig,
    /// `RUNNER_MAX_SUBSCRIBERS_*`: streams per session and per client.
    pub subscribers: SubscriberLimits,
    /// `RUNNER_ANONYMOUS`, `RUNNER_TIERS_FILE`, `RUNNER_ADMIN_GROUP`.
    pub tenancy: crate::tenancy::TenancyConfig,
    /// `RUNNER_AUDIT_LOG`.
    pub audit: Option<crate::audit::AuditTarget>,
    /// `RUNNER_WEBHOOK_*`: where session lifecycle events are delivered;
    /// `None` = no webhooks.
    pub webhooks: Option<WebhookConfig>,
}

/// How many subscribers (event streams and terminal sockets) one session
/// and one client may hold, so that no one client's streams can take every
/// connection the service has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriberLimits {
    pub per_session: usize,
    pub per_client: usize,
}

impl Default for SubscriberLimits {
    fn default() -> Self {
        Self {
            per_session: DEFAULT_MAX_SUBSCRIBERS_PER_SESSION as usize,
            per_client: DEFAULT_MAX_SUBSCRIBERS_PER_CLIENT as usize,
        }
    }
}

fn load_subscriber_limits(env: &Env) -> Result<SubscriberLimits, ConfigError> {
    Ok(SubscriberLimits {
        per_session: RUNNER_MAX_SUBSCRIBERS_PER_SESSION.positive_usize(env)?,
        per_client: RUNNER_MAX_SUBSCRIBERS_PER_CLIENT.positive_usize(env)?,
    })
}

/// What one client connection may cost the service (our hardening; the
/// reference has no such bounds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// Connections one client address may hold at once; `None` is a
    /// quarter of the connection limit in force.
    pub max_connections_per_client: Option<usize>,
    /// Peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: TrustedProxies,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_header_bytes: usize,
    /// Threads serving connections; `None` is one per core.
    pub connection_threads: Option<usize>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
            max_connections_per_client: None,
            trusted_proxies: TrustedProxies::default(),
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECONDS),
            body_timeout: Duration::from_secs(DEFAULT_BODY_TIMEOUT_SECONDS),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES as usize,
            connection_threads: None,
        }
    }
}

fn load_connection_limits(env: &Env) -> Result<ConnectionLimits, ConfigError> {
    let max_connections = RUNNER_MAX_CONNECTIONS.positive_usize(env)?;
    let max_connections_per_client = RUNNER_MAX_CONNECTIONS_PER_CLIENT
        .raw(env)
        .filter(|raw| !js_trim(raw).is_empty())
        .map(|raw| parse_positive_usize(Some(raw), 1, RUNNER_MAX_CONNECTIONS_PER_CLIENT.name))
        .transpose()?;
    let trusted_proxies = TrustedProxies::parse(RUNNER_TRUSTED_PROXIES.raw(env))?;
    let header_timeout = RUNNER_HEADER_TIMEOUT_SECONDS.positive_int(env)?;
    let body_timeout = RUNNER_BODY_TIMEOUT_SECONDS.positive_int(env)?;
    let header_bytes = RUNNER_MAX_HEADER_BYTES;
    let raw_header_bytes = header_bytes
        .raw(env)
        .filter(|raw| !js_trim(raw).is_empty())
        .or(header_bytes.default_value());
    let max_header_bytes = parse_whole_number(
        raw_header_bytes,
        0,
        MIN_MAX_HEADER_BYTES,
        header_bytes.name,
        IntegerRange::Positive,
    )
    .map_err(|_| {
        ConfigError::invalid_integer(
            header_bytes.name,
            IntegerRange::AtLeast(MIN_MAX_HEADER_BYTES),
            raw_header_bytes.unwrap_or_default(),
        )
    })?;
    Ok(ConnectionLimits {
        max_connections,
        max_connections_per_client,
        trusted_proxies,
        header_timeout: Duration::from_secs(header_timeout),
        body_timeout: Duration::from_secs(body_timeout),
        max_header_bytes: usize::try_from(max_header_bytes).unwrap_or(usize::MAX),
        connection_threads: None,
    })
}

/// Reads the core configuration. Variables are evaluated in a fixed order and
/// the first invalid one is reported, so the same environment always yields
/// the same message.
/// Anonymous mode is no authentication: it cannot stand beside a way to
/// authenticate. Tiers apply to principals: without any identity there is
/// nobody to count against them.
fn check_identity(
    tenancy: &crate::tenancy::TenancyConfig,
    authenticates: bool,
) -> Result<(), ConfigError> {
    use crate::settings::{RUNNER_ANONYMOUS, RUNNER_TIERS_FILE};
    if tenancy.anonymous && authenticates {
        return Err(ConfigError::Conflict {
            var: RUNNER_ANONYMOUS.name.to_owned(),
            reason: "anonymous mode turns authentication off, and RUNNER_AUTH_TOKENS_FILE or RUNNER_OIDC_ISSUER turns it on; set one of them.".to_owned(),
        });
    }
    if tenancy.tiers_file.is_some() && !tenancy.anonymous && !authenticates {
        return Err(ConfigError::Conflict {
            var: RUNNER_TIERS_FILE.name.to_owned(),
            reason: "tiers apply to principals, and this runner has none: set RUNNER_AUTH_TOKENS_FILE, RUNNER_OIDC_ISSUER or RUNNER_ANONYMOUS.".to_owned(),
        });
    }
    Ok(())
}

pub fn load_core_config(env: &Env, default_port: u16) -> Result<CoreConfig, ConfigError> {
    let port = parse_port(PORT.raw(env), default_port)?;
    let log_level = LOG_LEVEL.string_or_default(env);
    let max_sessions = RUNNER_MAX_SESSIONS.positive_usize(env)?;
    let exit_ttl_ms = RUNNER_EXIT_TTL_MS.positive_int(env)?;
    let replay_buffer_bytes = RUNNER_REPLAY_BUFFER_BYTES.positive_usize(env)?;
    let cors_origins = parse_cors_origins(RUNNER_CORS_ORIGINS.raw(env));
    let default_registry_url = TELO_REGISTRY_URL.string(env);
    let max_body_bytes = RUNNER_MAX_BODY_BYTES.positive_usize(env)?;
    let sse_heartbeat_ms = RUNNER_SSE_HEARTBEAT_MS.positive_int(env)?;
    let stop_grace_seconds = RUNNER_STOP_GRACE_SECONDS.non_negative_int(env)?;
    let terms = load_terms(env)?;
    let apps = load_apps(env)?;
    let auth_tokens = load_auth_tokens(env)?;
    let oidc = load_oidc_config(env)?;
    let connections = load_connection_limits(env)?;
    let io_frames = parse_io_frames(RUNNER_IO_FRAMES.raw(env))?;
    let watch = load_watch_config(env)?;
    let subscribers = load_subscriber_limits(env)?;
    let tenancy = crate::tenancy::load_tenancy_config(env)?;
    let audit = crate::audit::load_audit_target(env)?;
    check_identity(&tenancy, auth_tokens.is_some() || oidc.is_some())?;
    let webhooks = load_webhook_config(env)?;
    Ok(CoreConfig {
        port,
        log_level,
        max_sessions,
        exit_ttl: Duration::from_millis(exit_ttl_ms),
        replay_buffer_bytes,
        cors_origins,
        default_registry_url,
        max_body_bytes,
        sse_heartbeat: Duration::from_millis(sse_heartbeat_ms),
        terms,
        apps,
        auth_tokens,
        oidc,
        stop_grace: Duration::from_secs(stop_grace_seconds),
        connections,
        io_frames,
        watch,
        subscribers,
        tenancy,
        audit,
        webhooks,
    })
}

/// `RUNNER_IO_FRAMES`: `tagged` (the default) or `legacy`; blank is unset.
fn parse_io_frames(raw: Option<&str>) -> Result<FrameFormat, ConfigError> {
    let Some(raw) = raw.filter(|raw| !js_trim(raw).is_empty()) else {
        return Ok(FrameFormat::Tagged);
    };
    FrameFormat::parse(js_trim(raw)).ok_or_else(|| ConfigError::NotOneOf {
        var: RUNNER_IO_FRAMES.name.to_owned(),
        choices: vec!["tagged".to_owned(), "legacy".to_owned()],
        value: raw.to_owned(),
    })
}

/// `RUNNER_CORS_ORIGINS`: unset, blank or `*` allow any origin; otherwise a
/// comma-separated list, entries trimmed and empty ones dropped.
pub fn parse_cors_origins(raw: Option<&str>) -> CorsOrigins {
    let Some(raw) = raw else {
        return CorsOrigins::Any;
    };
    let trimmed = js_trim(raw);
    if trimmed.is_empty() || trimmed == "*" {
        return CorsOrigins::Any;
    }
    CorsOrigins::List(
        raw.split(',')
            .map(js_trim)
            .filter(|origin| !origin.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn vars(pairs: &[(&str, &str)]) -> Env {
        crate::config::env_from_pairs(pairs)
    }

    #[rstest]
    #[case(None, CorsOrigins::Any)]
    #[case(Some(""), CorsOrigins::Any)]
    #[case(Some("  "), CorsOrigins::Any)]
    #[case(Some(" * "), CorsOrigins::Any)]
    #[case(Some("http://a.test"), CorsOrigins::List(vec!["http://a.test".into()]))]
    #[case(
        Some(" http://a.test , ,http://b.test,"),
        CorsOrigins::List(vec!["http://a.test".into(), "http://b.test".into()])
    )]
    #[case(Some("http://a.test,*"), CorsOrigins::List(vec!["http://a.test".into(), "*".into()]))]
    #[case(Some(",,"), CorsOrigins::List(vec![]))]
    fn cors_origins_parse_like_the_reference(
        #[case] raw: Option<&str>,
        #[case] expected: CorsOrigins,
    ) {
        assert_eq!(parse_cors_origins(raw), expected);
    }

    #[rstest]
    #[case("http://localhost:*", "http://localhost:5173", true)]
    #[case("http://localhost:*", "http://localhost", true)]
    #[case("http://[::1]:*", "http://[::1]:8080", true)]
    #[case("http://127.0.0.1:*", "http://127.0.0.1:65535", true)]
    #[case("https://editor.example", "https://editor.example", true)]
    #[case("http://localhost:*", "http://localhost.evil.example", false)]
    #[case("http://localhost:*", "http://localhost.evil.example:80", false)]
    #[case("http://localhost:*", "http://localhost:80.evil.example", false)]
    #[case("http://localhost:*", "https://localhost:443", false)]
    #[case("http://localhost:*", "http://localhost:", false)]
    #[case("http://localhost:*", "http://localhost:*", true)]
    #[case("https://editor.example", "https://editor.example:8443", false)]
    #[case("*", "https://evil.example", false)]
    fn an_entry_ending_in_a_star_port_admits_its_host_on_any_port(
        #[case] entry: &str,
        #[case] origin: &str,
        #[case] admitted: bool,
    ) {
        assert_eq!(origin_matches(entry, origin), admitted);
    }

    #[test]
    fn an_empty_environment_yields_the_documented_defaults() {
        let config = load_core_config(&Env::new(), 8061).unwrap();
        assert_eq!(
            config,
            CoreConfig {
                port: 8061,
                log_level: "info".into(),
                max_sessions: 32,
                exit_ttl: Duration::from_secs(4 * 60 * 60),
                replay_buffer_bytes: 5_000_000,
                cors_origins: CorsOrigins::Any,
                default_registry_url: None,
                max_body_bytes: 1_048_576,
                sse_heartbeat: Duration::from_millis(20_000),
                terms: None,
                apps: AppCatalog::default(),
                auth_tokens: None,
                oidc: None,
                stop_grace: Duration::from_secs(5),
                connections: ConnectionLimits {
                    max_connections: 6_000,
                    max_connections_per_client: None,
                    trusted_proxies: TrustedProxies::default(),
                    header_timeout: Duration::from_secs(10),
                    body_timeout: Duration::from_secs(30),
                    max_header_bytes: 16_384,
                    connection_threads: None,
                },
                io_frames: FrameFormat::Tagged,
                watch: WatchConfig::default(),
                subscribers: SubscriberLimits {
                    per_session: 64,
                    per_client: 256,
                },
                tenancy: crate::tenancy::TenancyConfig::default(),
                audit: None,
                webhooks: None,
            }
        );
    }

    #[test]
    fn subscriber_caps_are_read_and_refused_by_name() {
        let config = load_core_config(
            &vars(&[
                ("RUNNER_MAX_SUBSCRIBERS_PER_SESSION", "3"),
                ("RUNNER_MAX_SUBSCRIBERS_PER_CLIENT", "5"),
            ]),
            8061,
        )
        .unwrap();
        assert_eq!(
            config.subscribers,
            SubscriberLimits {
                per_session: 3,
                per_client: 5
            }
        );
        for (name, raw) in [
            ("RUNNER_MAX_SUBSCRIBERS_PER_SESSION", "0"),
            ("RUNNER_MAX_SUBSCRIBERS_PER_SESSION", "many"),
            ("RUNNER_MAX_SUBSCRIBERS_PER_CLIENT", "-1"),
        ] {
            assert_eq!(
                load_core_config(&vars(&[(name, raw)]), 8061).map_err(|err| err.to_string()),
                Err(format!("{name} must be a positive integer, got '{raw}'."))
            );
        }
    }

    #[test]
    fn the_frame_layout_is_tagged_unless_the_operator_asks_for_the_old_one() {
        let legacy = load_core_config(&vars(&[("RUNNER_IO_FRAMES", " legacy ")]), 8061).unwrap();
        assert_eq!(legacy.io_frames, FrameFormat::Legacy);
        let blank = load_core_config(&vars(&[("RUNNER_IO_FRAMES", "")]), 8061).unwrap();
        assert_eq!(blank.io_frames, FrameFormat::Tagged);
        let err = load_core_config(&vars(&[("RUNNER_IO_FRAMES", "v8")]), 8061).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RUNNER_IO_FRAMES must be one of tagged | legacy (got 'v8')."
        );
    }

    #[test]
    fn connection_limits_are_read_and_refused_by_name() {
        let config = load_core_config(
            &vars(&[
                ("RUNNER_MAX_CONNECTIONS", "50"),
                ("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "7"),
                ("RUNNER_TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.1"),
                ("RUNNER_HEADER_TIMEOUT_SECONDS", "2"),
                ("RUNNER_BODY_TIMEOUT_SECONDS", "3"),
                ("RUNNER_MAX_HEADER_BYTES", "8192"),
            ]),
            8061,
        )
        .unwrap();
        assert_eq!(
            config.connections,
            ConnectionLimits {
                max_connections: 50,
                max_connections_per_client: Some(7),
                trusted_proxies: TrustedProxies::parse(Some("10.0.0.0/8,192.0.2.1")).unwrap(),
                header_timeout: Duration::from_secs(2),
                body_timeout: Duration::from_secs(3),
                max_header_bytes: 8192,
                connection_threads: None,
            }
        );
        for (name, raw, message) in [
            (
                "RUNNER_MAX_CONNECTIONS",
                "0",
                "RUNNER_MAX_CONNECTIONS must be a positive integer, got '0'.",
            ),
            (
                "RUNNER_MAX_CONNECTIONS_PER_CLIENT",
                "0",
                "RUNNER_MAX_CONNECTIONS_PER_CLIENT must be a positive integer, got '0'.",
            ),
            (
                "RUNNER_TRUSTED_PROXIES",
                "10.0.0.0/8;192.0.2.1",
                "RUNNER_TRUSTED_PROXIES must be a comma-separated list of IP addresses and CIDR ranges ('10.0.0.0/8;192.0.2.1' is neither), got '10.0.0.0/8;192.0.2.1'.",
            ),
            (
                "RUNNER_HEADER_TIMEOUT_SECONDS",
                "0",
                "RUNNER_HEADER_TIMEOUT_SECONDS must be a positive integer, got '0'.",
            ),
            (
                "RUNNER_BODY_TIMEOUT_SECONDS",
                "soon",
                "RUNNER_BODY_TIMEOUT_SECONDS must be a positive integer, got 'soon'.",
            ),
            (
                "RUNNER_MAX_HEADER_BYTES",
                "4096",
                "RUNNER_MAX_HEADER_BYTES must be an integer of at least 8192, got '4096'.",
            ),
        ] {
            assert_eq!(
                load_core_config(&vars(&[(name, raw)]), 8061).map_err(|err| err.to_string()),
                Err(message.to_owned())
            );
        }
    }

    #[test]
    fn webhooks_are_read_and_refused_by_name() {
        let dir = tempfile::tempdir().expect("dir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret\n").expect("write");
        let secret = secret.to_string_lossy().into_owned();
        let config = load_core_config(
            &vars(&[
                ("RUNNER_WEBHOOK_URL", "https://hooks.example/runner"),
                ("RUNNER_WEBHOOK_SECRET_FILE", &secret),
            ]),
            8061,
        )
        .unwrap();
        let webhooks = config.webhooks.expect("webhooks on");
        assert_eq!(webhooks.url.as_str(), "https://hooks.example/runner");
        assert_eq!(webhooks.secret, b"s3cret");
        assert_eq!(
            load_core_config(&vars(&[("RUNNER_WEBHOOK_URL", "hooks.example")]), 8061)
                .map_err(|err| err.to_string()),
            Err(
                "RUNNER_WEBHOOK_URL must be an absolute http:// or https:// URL, got 'hooks.example'."
                    .to_owned()
            )
        );
    }

    #[test]
    fn every_core_variable_is_read() {
        let env = vars(&[
            ("PORT", "9000"),
            ("LOG_LEVEL", " debug "),
            ("RUNNER_MAX_SESSIONS", "4"),
            ("RUNNER_EXIT_TTL_MS", "1000"),
            ("RUNNER_REPLAY_BUFFER_BYTES", "0x100"),
            ("RUNNER_CORS_ORIGINS", "http://a.test"),
            ("TELO_REGISTRY_URL", " http://registry.test "),
            ("RUNNER_MAX_BODY_BYTES", "2048"),
            ("RUNNER_TERMS_BODY", "Be nice."),
            ("RUNNER_APPS", r#"{"agent":{"image":"agent:1"}}"#),
        ]);
        let config = load_core_config(&env, 8061).unwrap();
        assert_eq!(config.port, 9000);
        assert_eq!(config.log_level, "debug");
        assert_eq!(config.max_sessions, 4);
        assert_eq!(config.exit_ttl, Duration::from_secs(1));
        assert_eq!(config.replay_buffer_bytes, 256);
        assert_eq!(
            config.cors_origins,
            CorsOrigins::List(vec!["http://a.test".into()])
        );
        assert_eq!(
            config.default_registry_url.as_deref(),
            Some("http://registry.test")
        );
        assert_eq!(config.max_body_bytes, 2048);
        assert_eq!(config.terms.map(|t| t.body), Some("Be nice.".to_owned()));
        assert_eq!(config.apps.names(), vec!["agent"]);
    }

    #[test]
    fn the_first_invalid_variable_in_evaluation_order_is_reported() {
        let env = vars(&[
            ("RUNNER_APPS", "not json"),
            ("RUNNER_MAX_BODY_BYTES", "big"),
            ("RUNNER_EXIT_TTL_MS", "-1"),
        ]);
        assert_eq!(
            load_core_config(&env, 8061).map_err(|err| err.to_string()),
            Err("RUNNER_EXIT_TTL_MS must be a positive integer, got '-1'.".to_owned())
        );
        let env = vars(&[("RUNNER_APPS", "[]"), ("RUNNER_MAX_BODY_BYTES", "big")]);
        assert_eq!(
            load_core_config(&env, 8061).map_err(|err| err.to_string()),
            Err("RUNNER_MAX_BODY_BYTES must be a positive integer, got 'big'.".to_owned())
        );
        let env = vars(&[("RUNNER_APPS", "[]")]);
        assert_eq!(
            load_core_config(&env, 8061).map_err(|err| err.to_string()),
            Err("RUNNER_APPS must be a JSON object mapping app name → app config.".to_owned())
        );
    }

    fn load(env: &Env) -> Result<CoreConfig, ConfigError> {
        load_core_config(env, 8061)
    }

    #[test]
    fn the_documented_defaults_are_what_unset_means() {
        crate::setting::assert_documented_defaults_are_the_defaults(&[CORE_SETTINGS], load);
    }

    #[test]
    fn the_loader_reads_exactly_the_documented_variables() {
        // LOG_FORMAT is documented with the core's and read by the binary's
        // logging.
        crate::setting::assert_reads_exactly(
            &[CORE_SETTINGS],
            &["LOG_FORMAT"],
            // The terms' title and version are read only beside a body.
            &[Env::new(), vars(&[("RUNNER_TERMS_BODY", "Be nice.")])],
            load,
        );
    }

    #[test]
    fn typed_defaults_are_the_documented_ones() {
        let config = load(&Env::new()).unwrap();
        assert_eq!(config.connections, ConnectionLimits::default());
        assert_eq!(config.subscribers, SubscriberLimits::default());
        assert_eq!(config.watch, WatchConfig::default());
        assert_eq!(
            config.stop_grace,
            Duration::from_secs(DEFAULT_STOP_GRACE_SECONDS)
        );
    }

    #[test]
    fn the_documentation_table_names_each_variable_once() {
        let mut names: Vec<&str> = CORE_SETTINGS.iter().map(|doc| doc.name).collect();
        let total = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), total);
        for name in [
            "PORT",
            "LOG_LEVEL",
            "LOG_FORMAT",
            "RUNNER_MAX_SESSIONS",
            "RUNNER_EXIT_TTL_MS",
            "RUNNER_REPLAY_BUFFER_BYTES",
            "RUNNER_MAX_BODY_BYTES",
            "RUNNER_CORS_ORIGINS",
            "TELO_REGISTRY_URL",
            "RUNNER_TERMS_FILE",
            "RUNNER_TERMS_BODY",
            "RUNNER_TERMS_TITLE",
            "RUNNER_TERMS_VERSION",
            "RUNNER_APPS",
        ] {
            assert!(names.contains(&name), "{name} is undocumented");
        }
    }
}
