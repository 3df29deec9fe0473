//! Every variable the core reads, declared once (name, documented default,
//! description): the loaders read them through these consts, and `--help`
//! and the README table print [`CORE_SETTINGS`]. Re-exported by
//! [`crate::config`].

use crate::setting::Setting;

pub const PORT: Setting = Setting {
    name: "PORT",
    default: "8061",
    description: "TCP port the HTTP API listens on; an empty value is an error, not the default.",
};

pub const LOG_LEVEL: Setting = Setting {
    name: "LOG_LEVEL",
    default: "info",
    description: "Minimum severity of log lines (trace, debug, info, warn, error).",
};

pub const LOG_FORMAT: Setting = Setting {
    name: "LOG_FORMAT",
    default: "pretty",
    description: "Log line format: `json` for one JSON object per line, `pretty` for humans.",
};

pub const RUNNER_MAX_SESSIONS: Setting = Setting {
    name: "RUNNER_MAX_SESSIONS",
    default: "32",
    description: "How many sessions may exist at once; finished ones are evicted first when the limit is hit.",
};

/// Exited sessions linger so a reloaded editor can re-attach and replay their
/// history; the registry evicts terminal sessions first at capacity, so a long
/// retention never blocks a new run.
pub const RUNNER_EXIT_TTL_MS: Setting = Setting {
    name: "RUNNER_EXIT_TTL_MS",
    default: "14400000",
    description: "How long a finished session stays available for re-attach and replay, in milliseconds.",
};

/// Applies to each of a session's two replay buffers (events and PTY bytes).
pub const RUNNER_REPLAY_BUFFER_BYTES: Setting = Setting {
    name: "RUNNER_REPLAY_BUFFER_BYTES",
    default: "5000000",
    description: "Byte cap of each of a session's two replay buffers (lifecycle events and terminal output).",
};

/// The reference inherits Fastify's 1 MiB body limit; ours is the same by
/// default but can be raised for large bundles.
pub const RUNNER_MAX_BODY_BYTES: Setting = Setting {
    name: "RUNNER_MAX_BODY_BYTES",
    default: "1048576",
    description: "Largest accepted request body in bytes; bigger requests get 413, so this bounds bundle size.",
};

pub const RUNNER_SSE_HEARTBEAT_MS: Setting = Setting {
    name: "RUNNER_SSE_HEARTBEAT_MS",
    default: "20000",
    description: "Interval of the `: heartbeat` comment on idle event streams; lower it behind proxies with short idle timeouts.",
};

pub const RUNNER_MAX_CONNECTIONS: Setting = Setting {
    name: "RUNNER_MAX_CONNECTIONS",
    default: "6000",
    description: "Client connections served at once. At the limit a new connection closes the oldest one that has not sent a byte yet; only when none is left does it get 503 `too_many_connections` and is closed. Bounded further by the open-file limit, which is raised to its hard limit at boot.",
};

pub const RUNNER_MAX_CONNECTIONS_PER_CLIENT: Setting = Setting {
    name: "RUNNER_MAX_CONNECTIONS_PER_CLIENT",
    default: "(a quarter of the connection limit)",
    description: "Connections one client address holds at once (terminal sockets included); past it a new connection gets 429 `too_many_connections_from_client` and is closed (`/livez` and `/readyz` are still served). Behind a proxy set RUNNER_TRUSTED_PROXIES, or every client is the proxy.",
};

pub const RUNNER_TRUSTED_PROXIES: Setting = Setting {
    name: "RUNNER_TRUSTED_PROXIES",
    default: "(unset: none)",
    description: "Comma-separated addresses and CIDR ranges of reverse proxies whose `X-Forwarded-For` is believed: a request from one of them counts against its client (the rightmost hop that is not a trusted proxy) for RUNNER_MAX_CONNECTIONS_PER_CLIENT and RUNNER_MAX_SUBSCRIBERS_PER_CLIENT, and is refused with 429 `too_many_connections_from_client` when that client is at its cap.",
};

pub const RUNNER_MAX_SUBSCRIBERS_PER_SESSION: Setting = Setting {
    name: "RUNNER_MAX_SUBSCRIBERS_PER_SESSION",
    default: "64",
    description: "Event streams and terminal sockets open on one session at once; past it a new one gets 429 `too_many_subscribers` (a socket before its upgrade).",
};

pub const RUNNER_MAX_SUBSCRIBERS_PER_CLIENT: Setting = Setting {
    name: "RUNNER_MAX_SUBSCRIBERS_PER_CLIENT",
    default: "256",
    description: "Event streams and terminal sockets one client holds at once across sessions (a client is its bearer token, else its address — behind a proxy the address it forwards if it is in RUNNER_TRUSTED_PROXIES, else the proxy's); past it 429 `too_many_subscribers`.",
};

pub const RUNNER_HEADER_TIMEOUT_SECONDS: Setting = Setting {
    name: "RUNNER_HEADER_TIMEOUT_SECONDS",
    default: "10",
    description: "A connection that has not sent a whole request header block within this time (idle keep-alive connections included) is closed.",
};

pub const RUNNER_BODY_TIMEOUT_SECONDS: Setting = Setting {
    name: "RUNNER_BODY_TIMEOUT_SECONDS",
    default: "30",
    description: "A request body not received in full within this time gets 408 `request_timeout`.",
};

pub const RUNNER_MAX_HEADER_BYTES: Setting = Setting {
    name: "RUNNER_MAX_HEADER_BYTES",
    default: "16384",
    description: "Largest request header block in bytes (at least 8192); bigger gets 431.",
};

pub const RUNNER_STOP_GRACE_SECONDS: Setting = Setting {
    name: "RUNNER_STOP_GRACE_SECONDS",
    default: "5",
    description: "How long a stopped session's workload may take to exit after SIGTERM (on Kubernetes, the pod's grace period) before it is killed; 0 kills at once.",
};

pub const RUNNER_IO_FRAMES: Setting = Setting {
    name: "RUNNER_IO_FRAMES",
    default: "tagged",
    description: "Layout of the terminal socket's binary frames: `tagged` (`[seq][stream][bytes]`, `features.io` a list, the wire of runner-core 0.9 and later) or `legacy` (`[seq][bytes]`, `features.io: true`) for editors built against the 0.8 wire.",
};

pub const RUNNER_WATCH_SESSIONS: Setting = Setting {
    name: "RUNNER_WATCH_SESSIONS",
    default: "false",
    description: "Offer watch sessions (`mode: \"watch\"`): one long-lived session per workspace whose apps reload in place when the editor writes a file, suspended when idle and resumed under the same id.",
};

pub const RUNNER_WATCH_IDLE_SECONDS: Setting = Setting {
    name: "RUNNER_WATCH_IDLE_SECONDS",
    default: "300",
    description: "A watch session no event stream or terminal socket has watched for this long is suspended (its workload ends, its files are kept).",
};

pub const RUNNER_WATCH_MAX_TTL_SECONDS: Setting = Setting {
    name: "RUNNER_WATCH_MAX_TTL_SECONDS",
    default: "21600",
    description: "The longest one watch workload runs before the session fails with `watch session reached its time limit`.",
};

pub const RUNNER_WATCH_MAX_SESSIONS: Setting = Setting {
    name: "RUNNER_WATCH_MAX_SESSIONS",
    default: "8",
    description: "Watch sessions running at once (suspended ones do not count); past it a new one gets 409 `too_many_watch_sessions`.",
};

pub const RUNNER_WATCH_RELOAD_LIMIT: Setting = Setting {
    name: "RUNNER_WATCH_RELOAD_LIMIT",
    default: "30",
    description: "Workspace writes plus manual reloads one watch session may make per minute; past it 429 `reload_rate_limited`.",
};

pub const RUNNER_WATCH_SUSPENDED_TTL_SECONDS: Setting = Setting {
    name: "RUNNER_WATCH_SUSPENDED_TTL_SECONDS",
    default: "86400",
    description: "How long a suspended watch session (and its files) is kept before it is removed.",
};

pub const RUNNER_WATCH_MAX_SUSPENDED: Setting = Setting {
    name: "RUNNER_WATCH_MAX_SUSPENDED",
    default: "64",
    description: "Suspended watch sessions kept at once. They do not count against RUNNER_MAX_SESSIONS and are never evicted to admit another session; at this bound an idle session keeps running (until its time limit) instead of being suspended, and its clients are told.",
};

pub const RUNNER_WORKSPACE_CHECKPOINT_SECONDS: Setting = Setting {
    name: "RUNNER_WORKSPACE_CHECKPOINT_SECONDS",
    default: "30",
    description: "How often a live watch session's workspace is checkpointed, so a suspend or a runner crash loses at most this much.",
};

pub const RUNNER_CORS_ORIGINS: Setting = Setting {
    name: "RUNNER_CORS_ORIGINS",
    default: "*",
    description: "Comma-separated browser origins allowed to call the API, or `*` for any origin. An entry ending in `:*` (`http://localhost:*`) admits that scheme and host on any port.",
};

pub const TELO_REGISTRY_URL: Setting = Setting {
    name: "TELO_REGISTRY_URL",
    default: "(unset)",
    description: "Module registry URL handed to workloads whose request supplies none.",
};

pub const RUNNER_TERMS_FILE: Setting = Setting {
    name: "RUNNER_TERMS_FILE",
    default: "(unset)",
    description: "Path of a usage agreement clients must accept before starting sessions; unreadable is a boot error.",
};

pub const RUNNER_TERMS_BODY: Setting = Setting {
    name: "RUNNER_TERMS_BODY",
    default: "(unset)",
    description: "Inline usage agreement text, used only when RUNNER_TERMS_FILE is not set.",
};

pub const RUNNER_TERMS_TITLE: Setting = Setting {
    name: "RUNNER_TERMS_TITLE",
    default: "Usage agreement",
    description: "Heading clients show above the usage agreement.",
};

pub const RUNNER_TERMS_VERSION: Setting = Setting {
    name: "RUNNER_TERMS_VERSION",
    default: "(hash of the body)",
    description: "Version clients must echo to accept the agreement; by default any edit of the text changes it.",
};

pub const RUNNER_APPS: Setting = Setting {
    name: "RUNNER_APPS",
    default: "(unset)",
    description: "JSON object of operator-defined apps launchable by name (`image`, `env`, `pullPolicy`, `title`, `description`, `command` for the local backend (on Kubernetes it replaces an agent image's entrypoint), `acceptEnv`: the only client variables it takes, `port`: the TCP port it listens on, which makes it a watch session's co-resident agent, `tokenEnv`: the variable a per-session token is injected under); treat it as a secret, its env may hold keys.",
};

pub const RUNNER_AUTH_TOKENS_FILE: Setting = Setting {
    name: "RUNNER_AUTH_TOKENS_FILE",
    default: "(unset: no auth)",
    description: "File of bearer tokens, one per line (`#` comments allowed); when set, every /v1 route but health and capabilities needs `Authorization: Bearer <token>`.",
};

pub const RUNNER_OIDC_ISSUER: Setting = Setting {
    name: "RUNNER_OIDC_ISSUER",
    default: "(unset: no OIDC tokens)",
    description: "Issuer whose signed JWT bearer tokens the runner accepts (beside RUNNER_AUTH_TOKENS_FILE's static tokens); a token's `iss` must equal it exactly. Needs RUNNER_OIDC_AUDIENCE and one of RUNNER_OIDC_JWKS_URL / RUNNER_OIDC_JWKS_FILE.",
};

pub const RUNNER_OIDC_AUDIENCE: Setting = Setting {
    name: "RUNNER_OIDC_AUDIENCE",
    default: "(unset)",
    description: "Audience a token's `aud` (a string or a list) must name; required with RUNNER_OIDC_ISSUER.",
};

pub const RUNNER_OIDC_JWKS_URL: Setting = Setting {
    name: "RUNNER_OIDC_JWKS_URL",
    default: "(unset)",
    description: "http(s) URL of the issuer's JSON Web Key Set. Fetched at boot (failure is a boot error), again every 60 s and at once (at most every 10 s) when a token names an unknown key id; a failed refetch keeps the last good set.",
};

pub const RUNNER_OIDC_JWKS_FILE: Setting = Setting {
    name: "RUNNER_OIDC_JWKS_FILE",
    default: "(unset)",
    description: "Path of a file holding the issuer's JSON Web Key Set, instead of RUNNER_OIDC_JWKS_URL; read at boot (unreadable is a boot error) and again every 60 s.",
};

pub const RUNNER_OIDC_TENANT_CLAIM: Setting = Setting {
    name: "RUNNER_OIDC_TENANT_CLAIM",
    default: "sub",
    description: "Top-level claim of a token (a string) that names its tenant; a token without it is refused.",
};

pub const RUNNER_OIDC_GROUPS_CLAIM: Setting = Setting {
    name: "RUNNER_OIDC_GROUPS_CLAIM",
    default: "groups",
    description: "Top-level claim of a token (a list of strings, or one string) that names its groups; a token without it has none.",
};

pub const RUNNER_ADMIN_GROUP: Setting = Setting {
    name: "RUNNER_ADMIN_GROUP",
    default: "telo-admins",
    description: "Principals in this group (an OIDC token's groups claim, a static token's `groups=`) are admins: they see and stop every session.",
};

pub const RUNNER_ANONYMOUS: Setting = Setting {
    name: "RUNNER_ANONYMOUS",
    default: "false",
    description: "`true`/`1`: no authentication, for public demo installs; every client is its address (see RUNNER_TRUSTED_PROXIES), owns the sessions it creates, and gets the `anonymous` tier's limits. Refused beside RUNNER_AUTH_TOKENS_FILE or RUNNER_OIDC_ISSUER.",
};

pub const RUNNER_TIERS_FILE: Setting = Setting {
    name: "RUNNER_TIERS_FILE",
    default: "(unset: unlimited)",
    description: "YAML or JSON file of per-tenant limits: `{tiers: {<tier>: {sessions, watchSessions, suspendedSessions, cpu, memory, sessionSecondsPerDay, requestsPerMinute, startsPerMinute}}, tenants: {<tenant>: <tier>}}`; `default` covers unnamed tenants, `anonymous` anonymous clients. Read again every 10 s; a broken change keeps the last good file.",
};

pub const RUNNER_AUDIT_LOG: Setting = Setting {
    name: "RUNNER_AUDIT_LOG",
    default: "(unset: off)",
    description: "`stdout` or a file path: one JSON line per security-relevant event (session created, stopped, resumed, apps changed, authentication failed, quota or rate refusal, admin action), never a token.",
};

pub const RUNNER_WEBHOOK_URL: Setting = Setting {
    name: "RUNNER_WEBHOOK_URL",
    default: "(unset: no webhooks)",
    description: "http(s) URL session lifecycle events (created, running, suspended, resumed, ended) are POSTed to as CloudEvents, signed with the secret of RUNNER_WEBHOOK_SECRET_FILE; failed deliveries are retried with backoff and never slow a session.",
};

pub const RUNNER_WEBHOOK_SECRET_FILE: Setting = Setting {
    name: "RUNNER_WEBHOOK_SECRET_FILE",
    default: "(unset)",
    description: "File holding the secret each webhook delivery is signed with (HMAC-SHA256 in `Webhook-Signature`); surrounding whitespace is trimmed. Required with RUNNER_WEBHOOK_URL; unreadable or empty is a boot error.",
};

/// Every variable the core (and the binary's logging) reads, in the order
/// `--help` and the README list them.
pub const CORE_SETTINGS: &[Setting] = &[
    PORT,
    LOG_LEVEL,
    LOG_FORMAT,
    RUNNER_MAX_SESSIONS,
    RUNNER_EXIT_TTL_MS,
    RUNNER_REPLAY_BUFFER_BYTES,
    RUNNER_MAX_BODY_BYTES,
    RUNNER_SSE_HEARTBEAT_MS,
    RUNNER_MAX_CONNECTIONS,
    RUNNER_MAX_CONNECTIONS_PER_CLIENT,
    RUNNER_TRUSTED_PROXIES,
    RUNNER_MAX_SUBSCRIBERS_PER_SESSION,
    RUNNER_MAX_SUBSCRIBERS_PER_CLIENT,
    RUNNER_HEADER_TIMEOUT_SECONDS,
    RUNNER_BODY_TIMEOUT_SECONDS,
    RUNNER_MAX_HEADER_BYTES,
    RUNNER_STOP_GRACE_SECONDS,
    RUNNER_IO_FRAMES,
    RUNNER_WATCH_SESSIONS,
    RUNNER_WATCH_IDLE_SECONDS,
    RUNNER_WATCH_MAX_TTL_SECONDS,
    RUNNER_WATCH_MAX_SESSIONS,
    RUNNER_WATCH_RELOAD_LIMIT,
    RUNNER_WATCH_SUSPENDED_TTL_SECONDS,
    RUNNER_WATCH_MAX_SUSPENDED,
    RUNNER_WORKSPACE_CHECKPOINT_SECONDS,
    RUNNER_CORS_ORIGINS,
    TELO_REGISTRY_URL,
    RUNNER_TERMS_FILE,
    RUNNER_TERMS_BODY,
    RUNNER_TERMS_TITLE,
    RUNNER_TERMS_VERSION,
    RUNNER_APPS,
    RUNNER_AUTH_TOKENS_FILE,
    RUNNER_OIDC_ISSUER,
    RUNNER_OIDC_AUDIENCE,
    RUNNER_OIDC_JWKS_URL,
    RUNNER_OIDC_JWKS_FILE,
    RUNNER_OIDC_TENANT_CLAIM,
    RUNNER_OIDC_GROUPS_CLAIM,
    RUNNER_ADMIN_GROUP,
    RUNNER_ANONYMOUS,
    RUNNER_TIERS_FILE,
    RUNNER_AUDIT_LOG,
    RUNNER_WEBHOOK_URL,
    RUNNER_WEBHOOK_SECRET_FILE,
];
