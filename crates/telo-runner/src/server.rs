//! Build and run the service from an environment.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::cli::RUNNER_BACKEND;
use runner_core::config::{ConfigError, CoreConfig, Env, load_core_config};
use runner_core::http::{AppState, ServerOptions, router};
use runner_core::metrics::{ConnectionCounters, Metrics};
use runner_core::{Backend, RegistryLimits, SessionRegistry};
use runner_k8s::config::load_k8s_config;
use runner_local::{LocalBackend, load_local_config};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

/// Default port of the local backend (the Kubernetes backend uses 8062).
pub const LOCAL_DEFAULT_PORT: u16 = 8061;
/// How long shutdown waits for sessions to report `stopped` beyond their own
/// stop grace period (output still draining, a slow apiserver).
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(5);

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How long shutdown waits for queued webhook deliveries.
const WEBHOOK_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Which backend runs the sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Local,
    Kubernetes,
}

pub fn backend_kind(env: &Env) -> Result<BackendKind, ConfigError> {
    match RUNNER_BACKEND.string_or_default(env).as_str() {
        "local" => Ok(BackendKind::Local),
        "kubernetes" => Ok(BackendKind::Kubernetes),
        other => Err(ConfigError::not_one_of(
            RUNNER_BACKEND.name,
            &["local", "kubernetes"],
            other,
        )),
    }
}

/// A configured service, ready to listen.
pub struct Service {
    pub core: CoreConfig,
    registry: SessionRegistry,
    router: axum::Router,
    going_away: CancellationToken,
    sockets: TaskTracker,
    connection_counters: ConnectionCounters,
    /// The tiers file's reader, stopped with the service.
    tenancy: runner_core::tenancy::Tenancy,
    /// The OIDC key set's refresher, stopped with the service.
    oidc: Option<runner_core::oidc::OidcVerifier>,
    /// Lifecycle deliveries, given a moment to finish at shutdown.
    webhooks: Option<runner_core::webhooks::Webhooks>,
    /// The session edge (`RUNNER_PREVIEW_BASE_URL`).
    edge: Option<runner_core::edge::Edge>,
}

impl Service {
    /// Read and validate the whole configuration; every problem is a
    /// [`ConfigError`] whose text the binary prints before exiting with 2.
    pub async fn from_env(env: &Env) -> Result<Self, ConfigError> {
        runner_core::http_client::install_tls_provider();
        let metrics = Arc::new(Metrics::new());
        let (core, backend, routes): (CoreConfig, Arc<dyn Backend>, axum::Router) =
            match backend_kind(env)? {
                BackendKind::Local => {
                    let core = load_core_config(env, LOCAL_DEFAULT_PORT)?;
                    let mut local_config = load_local_config(env)?;
                    local_config.stop_grace = core.stop_grace;
                    let local = LocalBackend::new(local_config).map_err(ConfigError::refused)?;
                    local.sweep_work_root();
                    (core, Arc::new(local), axum::Router::new())
                }
                BackendKind::Kubernetes => {
                    let mut config = load_k8s_config(env)?;
                    if runner_core::edge::RUNNER_PREVIEW_BASE_URL
                        .string(env)
                        .is_some()
                    {
                        // The edge serves session ports itself: nothing is
                        // published per session.
                        use runner_k8s::config::RoutingMode;
                        if matches!(
                            config.routing.mode,
                            RoutingMode::Ingress | RoutingMode::Gateway
                        ) {
                            return Err(ConfigError::Conflict {
                                var: runner_core::edge::RUNNER_PREVIEW_BASE_URL.name.to_owned(),
                                reason: format!(
                                    "so is SESSION_ROUTING_MODE={}: the session edge serves every session port itself; unset SESSION_ROUTING_MODE (or set it to auto or none), or unset RUNNER_PREVIEW_BASE_URL.",
                                    config.routing.mode.as_str()
                                ),
                            });
                        }
                        config.routing.mode = RoutingMode::None;
                    }
                    let core = config.core.clone();
                    let setup = runner_k8s::setup::build(config, env, metrics.clone()).await?;
                    (core, setup.backend, setup.routes)
                }
            };
        // Never accept a setting the backend cannot honour.
        if core.watch.enabled && backend.watch_sessions().is_none() {
            return Err(ConfigError::Conflict {
                var: runner_core::config::RUNNER_WATCH_SESSIONS.name.to_owned(),
                reason: "this runner's backend does not run watch sessions.".to_owned(),
            });
        }
        let connection_counters = metrics.connection_counters();
        let registry = SessionRegistry::with_metrics(
            backend,
            RegistryLimits {
                max_sessions: core.max_sessions,
                exit_ttl: core.exit_ttl,
                replay_buffer_bytes: core.replay_buffer_bytes,
                watch: core.watch.clone(),
            },
            metrics,
        );
        registry.set_agent_catalog(core.apps.clone());
        let edge = runner_core::edge::load_edge(env)?.map(|settings| {
            let runner_core::edge::EdgeSettings {
                base,
                config,
                policy,
            } = settings;
            registry.set_preview(
                runner_core::edge::Preview {
                    base: base.clone(),
                    policy: policy.clone(),
                },
                config.wake_timeout,
            );
            info!(base = %base, access = policy.access.as_str(), "serving session ports at <port>-<session id> under the preview base");
            if policy.generated_key {
                warn!(
                    "{} is unset: preview grants, share links and their cookies are signed with a key generated for this process; they stop working when it restarts, and no other runner accepts them",
                    runner_core::edge::RUNNER_PREVIEW_SIGNING_KEY_FILE.name
                );
            }
            runner_core::edge::Edge::new(base, Arc::new(registry.clone()), config, policy)
        });
        let options = ServerOptions {
            version: VERSION.to_owned(),
            cors: core.cors_origins.clone(),
            terms: core.terms.clone(),
            apps: core.apps.clone(),
            default_registry_url: core.default_registry_url.clone(),
            max_body_bytes: core.max_body_bytes,
            body_timeout: core.connections.body_timeout,
            sse_heartbeat: core.sse_heartbeat,
            auth_tokens: core.auth_tokens.clone(),
            io_frames: core.io_frames,
            subscribers: core.subscribers,
        };
        let tenancy = runner_core::tenancy::Tenancy::load(core.tenancy.clone())?;
        let oidc = match &core.oidc {
            Some(config) => Some(
                runner_core::oidc::OidcVerifier::start(config.clone())
                    .await
                    .map_err(ConfigError::refused)?,
            ),
            None => None,
        };
        let webhooks = core.webhooks.clone().map(|config| {
            runner_core::webhooks::Webhooks::start(
                config,
                Some(registry.metrics().webhook_counters()),
            )
        });
        if let Some(webhooks) = &webhooks {
            registry.set_webhooks(webhooks.clone());
        }
        tenancy.start();
        let access = runner_core::http::auth::Access {
            jwt: oidc
                .clone()
                .map(|oidc| Arc::new(oidc) as Arc<dyn runner_core::identity::BearerVerifier>),
            tenancy: tenancy.clone(),
            audit: Arc::new(runner_core::audit::AuditLog::open(core.audit.as_ref())?),
        };
        let going_away = CancellationToken::new();
        let sockets = TaskTracker::new();
        let router = router(
            AppState {
                registry: registry.clone(),
                options: Arc::new(options),
                going_away: going_away.clone(),
                sockets: sockets.clone(),
                subscribers: Default::default(),
                idempotency: Default::default(),
                access,
            },
            routes,
        );
        Ok(Self {
            core,
            registry,
            router,
            going_away,
            sockets,
            connection_counters,
            tenancy,
            oidc,
            webhooks,
            edge,
        })
    }

    pub fn registry(&self) -> &SessionRegistry {
        &self.registry
    }

    /// Bind and serve until `shutdown` fires, then stop every session (each
    /// reported `stopped`), let streams end, and return.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let registry = self.registry.clone();
        let shutdown_grace = self.core.stop_grace.saturating_add(SHUTDOWN_MARGIN);
        // Adoption waits for the backend to see its workloads (a cluster that
        // is down at boot may take a while); the API serves meanwhile.
        let recovery = {
            let registry = registry.clone();
            tokio::spawn(async move {
                let adopted = registry.recover().await;
                if adopted > 0 {
                    info!(adopted, "took over sessions from a previous runner");
                }
            })
        };
        let drained = CancellationToken::new();
        let drained_for_recovery = drained.clone();
        let going_away = self.going_away.clone();
        let sockets = self.sockets.clone();
        let tenancy = self.tenancy.clone();
        let oidc = self.oidc.clone();
        let webhooks = self.webhooks.clone();
        let edge = self.edge.clone();
        let stop_sessions = {
            let drained = drained.clone();
            async move {
                shutdown.cancelled().await;
                info!("shutting down: stopping sessions");
                registry.shutdown(shutdown_grace).await;
                // Streams of sessions that live on end with "going away".
                going_away.cancel();
                // Each terminal socket sends its close frame.
                sockets.close();
                if tokio::time::timeout(runner_core::accept::CLOSE_GRACE, sockets.wait())
                    .await
                    .is_err()
                {
                    tracing::warn!("terminal sockets still open after shutdown; closing them");
                }
                tenancy.shutdown().await;
                if let Some(edge) = &edge {
                    edge.shutdown().await;
                }
                if let Some(oidc) = &oidc {
                    oidc.shutdown().await;
                }
                // The sessions' last steps (ended) go out if the receiver
                // takes them soon.
                if let Some(webhooks) = &webhooks {
                    webhooks.shutdown(WEBHOOK_SHUTDOWN_GRACE).await;
                }
                drained.cancel();
            }
        };
        let server = runner_core::accept::serve_with_edge(
            listener,
            self.router,
            self.edge.clone(),
            self.core.connections,
            RUNNER_SERVICE,
            self.connection_counters,
            drained.clone(),
        );
        let stop_recovery = async move {
            drained_for_recovery.cancelled().await;
            recovery.abort();
            // Joined, so no adoption outlives the server.
            let _ = recovery.await;
        };
        let (served, (), ()) = tokio::join!(server, stop_sessions, stop_recovery);
        served
    }
}

/// The runner's API in the accept loop's refusals.
const RUNNER_SERVICE: runner_core::accept::ServiceName = runner_core::accept::ServiceName {
    name: "runner",
    limit_setting: Some(runner_core::config::RUNNER_MAX_CONNECTIONS.name),
    client_limit_setting: Some(runner_core::config::RUNNER_MAX_CONNECTIONS_PER_CLIENT.name),
};

/// A service running in the background of the current runtime (tests, the
/// terminal client's embedded mode).
pub struct RunningService {
    pub addr: SocketAddr,
    pub registry: SessionRegistry,
    shutdown: CancellationToken,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl RunningService {
    pub async fn start(env: &Env, listen: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        Self::start_on(env, listener).await
    }

    /// Serve on a listener bound by the caller (who may need its address in
    /// the configuration, e.g. `RUNNER_SELF_URL`).
    pub async fn start_on(env: &Env, listener: TcpListener) -> anyhow::Result<Self> {
        let service = Service::from_env(env).await?;
        let addr = listener.local_addr()?;
        let registry = service.registry().clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(service.serve(listener, shutdown.clone()));
        Ok(Self {
            addr,
            registry,
            shutdown,
            task: Some(task),
        })
    }

    /// Resolves once sessions left by a previous runner have been adopted.
    pub async fn recovered(&self) {
        self.registry.wait_recovered().await;
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Graceful shutdown, as on SIGTERM.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await??;
        }
        Ok(())
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
