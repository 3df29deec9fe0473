//! Whether a session request may start, and what it starts: the policy of
//! `POST /v1/sessions` (run and watch), `POST /v1/apps/{name}/sessions` and
//! `PUT /v1/sessions/{id}/apps`, without HTTP. A validated request and what
//! this runner offers go in; a decision or a typed [`Refusal`] comes out.
//! The HTTP layer reads the body, asks here, registers the session and maps
//! a refusal to its status and code.
//!
//! Refusals come in the order the checks run, and the first one wins:
//! telo versions, config, watch offered, agent, watch capacity, app rules,
//! io.

mod telo;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use runner_api::bundle_path::normalize_bundle_path;
use runner_api::telo::{SUPERSEDED_BY_TELO, TeloRefusal, TeloVersion, superseded_config_message};
use runner_api::types::{PortMapping, PortProtocol, RunBundle, SessionConfig};
use runner_api::validate::{AppSessionBody, StartSessionBody};
use runner_api::watch::{AppRefusal, AppSpec, DEFAULT_APP_NAME, IoMode, SessionMode, resolve_apps};

use crate::apps::AppCatalog;
use crate::backend::{AgentRef, AppLaunch, Backend, InvalidSessionConfig, TeloUnavailable};

/// The checks only the backend can make, asked before anything starts.
pub trait BackendChecks {
    /// Whether a request may name the telo release its apps run.
    fn offers_telo_versions(&self) -> bool;
    /// Whether the backend can run telo `version` for a session of `mode`.
    fn supply_telo(&self, version: &TeloVersion, mode: SessionMode) -> Result<(), TeloUnavailable>;
    /// A bundle session's config, when no telo version picks the image.
    fn validate_config(&self, config: &SessionConfig) -> Result<(), InvalidSessionConfig>;
}

impl BackendChecks for Arc<dyn Backend> {
    fn offers_telo_versions(&self) -> bool {
        self.as_ref().telo_versions().is_some()
    }

    fn supply_telo(&self, version: &TeloVersion, mode: SessionMode) -> Result<(), TeloUnavailable> {
        match self.as_ref().telo_versions() {
            Some(supply) => supply.supply_telo(version, mode),
            None => Err(TeloUnavailable::NotOffered),
        }
    }

    fn validate_config(&self, config: &SessionConfig) -> Result<(), InvalidSessionConfig> {
        self.as_ref().validate_config(config)
    }
}

/// What this runner offers a session request, as the HTTP layer read it
/// from its configuration, catalog, backend and registry.
pub struct Offer<'a> {
    pub backend: &'a dyn BackendChecks,
    /// What a request's `config` leaves unset runs with.
    pub default_config: SessionConfig,
    /// The `io` modes the backend offers (`features.io`).
    pub io_modes: Vec<String>,
    /// Whether watch sessions are offered.
    pub watch: bool,
    /// The operator's catalog: apps, and the agents among them.
    pub catalog: &'a AppCatalog,
    /// Whether the backend can run a co-resident agent.
    pub backend_runs_agents: bool,
    /// The agents `/v1/capabilities` lists, named in a refusal.
    pub offered_agents: Vec<String>,
    /// Live watch sessions, and the most there may be.
    pub live_watch_sessions: usize,
    pub max_watch_sessions: usize,
    /// The registry URL a workload gets when its request names none.
    pub default_registry_url: Option<String>,
}

/// Why a session request is refused before anything starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A bundle path that breaks the bundle path rules.
    #[error("{0}")]
    InvalidBundle(String),
    #[error(transparent)]
    Telo(#[from] TeloRefusal),
    /// An app set that breaks the app rules.
    #[error(transparent)]
    Apps(#[from] AppRefusal),
    /// A config key the chosen telo version supersedes.
    #[error("{}", superseded_config_message(key))]
    SupersededConfig { key: &'static str },
    #[error(transparent)]
    InvalidConfig(#[from] InvalidSessionConfig),
    #[error("this runner does not offer watch sessions (see /v1/capabilities)")]
    WatchDisabled,
    #[error("`agent` requires `mode: \"watch\"` \u{2014} nothing would observe the agent's writes")]
    AgentRequiresWatch,
    #[error("{}", unknown_agent_message(agent, offered))]
    UnknownAgent { agent: String, offered: Vec<String> },
    #[error(
        "agent '{agent}' declares no port, so this runner cannot route it \u{2014} set RUNNER_APPS.{agent}.port to the port its image listens on"
    )]
    AgentPortUndeclared { agent: String },
    #[error("runner is at its configured max of {max} concurrent watch sessions")]
    TooManyWatchSessions { max: usize },
    #[error(
        "app '{app}' asks for io '{io}', which this runner does not offer; it offers: {}",
        offered.join(", ")
    )]
    IoNotOffered {
        app: String,
        io: &'static str,
        offered: Vec<String>,
    },
    #[error(
        "app '{app}' asks for io '{io}', which this runner offers to watch sessions only (`mode: \"watch\"`); a run session runs on a terminal (io 'tty')"
    )]
    IoWatchOnly { app: String, io: &'static str },
    /// A new app set declaring the port the session's agent listens on.
    #[error(
        "app '{owner}' declares tcp port {port}, which this session's co-resident agent '{agent}' listens on"
    )]
    AgentPortTaken {
        owner: String,
        port: u16,
        agent: String,
    },
    /// No catalog app of that name (the message names the catalog).
    #[error("{message}")]
    UnknownApp { message: String },
    /// A client variable the catalog app does not take.
    #[error("{0}")]
    ClientEnv(String),
}

fn unknown_agent_message(agent: &str, offered: &[String]) -> String {
    let mut message = format!("agent '{agent}' is not offered by this runner");
    if !offered.is_empty() {
        message.push_str(" \u{2014} offered: ");
        message.push_str(&offered.join(", "));
    }
    message
}

/// The bundle's entry, normalized, once every path of the bundle obeys the
/// bundle path rules. CPU work on a big bundle: the caller picks the thread.
pub fn bundle_entry(bundle: &RunBundle) -> Result<String, Refusal> {
    let invalid =
        |err: runner_api::bundle_path::InvalidBundlePath| Refusal::InvalidBundle(err.to_string());
    let entry = normalize_bundle_path(&bundle.entry_relative_path).map_err(invalid)?;
    for file in &bundle.files {
        normalize_bundle_path(&file.relative_path).map_err(invalid)?;
    }
    Ok(entry)
}

/// An admitted `POST /v1/sessions`: what the registry starts.
#[derive(Debug)]
pub enum Admitted {
    Run(RunPlan),
    Watch(WatchPlan),
}

/// A run session: its one app.
#[derive(Debug)]
pub struct RunPlan {
    pub name: String,
    pub bundle: RunBundle,
    pub entry_relative_path: String,
    pub ports: Vec<PortMapping>,
    pub telo: Option<String>,
    pub env: Vec<(String, String)>,
    pub config: SessionConfig,
    pub inspect: bool,
}

/// A watch session: its apps and agent.
#[derive(Debug)]
pub struct WatchPlan {
    pub bundle: RunBundle,
    pub apps: Vec<AppSpec>,
    pub env: Vec<(String, String)>,
    pub config: SessionConfig,
    pub agent: Option<AgentRef>,
    /// Why the requested agent was not started, told once the session
    /// exists.
    pub agent_notice: Option<String>,
}

/// `POST /v1/sessions`: `request` (validated, its bundle's `entry` already
/// normalized by [`bundle_entry`]) against `offer`.
pub fn admit_session(
    offer: &Offer<'_>,
    request: StartSessionBody,
    entry: String,
) -> Result<Admitted, Refusal> {
    let versions = {
        let default_app;
        let sent: &[AppSpec] = match &request.apps {
            Some(apps) => apps,
            None => {
                default_app = [default_app_spec(entry.clone(), Vec::new())];
                &default_app
            }
        };
        telo::check_versions(
            offer.backend,
            request.telo.as_deref(),
            request.apps.is_some(),
            sent,
            request.mode,
        )?
    };
    let config = match &versions {
        // The version says what runs: the keys it supersedes are refused,
        // and the backend picks the image.
        Some(_) => {
            if let Some(key) = request.config.sent_among(&SUPERSEDED_BY_TELO).first() {
                return Err(Refusal::SupersededConfig { key });
            }
            request.config.clone().resolve(&offer.default_config)
        }
        None => {
            let config = request.config.clone().resolve(&offer.default_config);
            offer.backend.validate_config(&config)?;
            config
        }
    };
    let watch = request.mode == SessionMode::Watch;
    if watch && !offer.watch {
        return Err(Refusal::WatchDisabled);
    }
    let agent_port = match &request.agent {
        Some(agent) => Some(check_agent(offer, agent, watch)?),
        None => None,
    };
    if watch && offer.live_watch_sessions >= offer.max_watch_sessions {
        return Err(Refusal::TooManyWatchSessions {
            max: offer.max_watch_sessions,
        });
    }
    let default_ports = request.ports.clone();
    let default_entry = entry.clone();
    let mut apps = resolve_apps(request.apps.clone(), || {
        default_app_spec(default_entry, default_ports)
    })?;
    telo::pin_versions(&mut apps, versions.as_deref());
    check_io(&offer.io_modes, &apps, watch)?;
    // The manifest wins a port clash: the agent is dropped, and the
    // session says why once it exists.
    let mut agent_notice = None;
    let agent = match (&request.agent, agent_port) {
        (Some(name), Some(port)) => match tcp_owner(&apps, port) {
            Some(owner) => {
                agent_notice = Some(format!(
                    "co-resident agent '{name}' was not started: it listens on tcp port {port}, which app '{owner}' declares"
                ));
                None
            }
            None => Some(AgentRef {
                name: name.clone(),
                port,
                token: offer
                    .catalog
                    .get(name)
                    .and_then(|entry| entry.token_env.as_ref())
                    .map(|_| crate::ids::new_workload_token()),
            }),
        },
        _ => None,
    };
    let registry_url = config
        .registry_url
        .as_deref()
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned);
    let env = with_registry_url(
        request.env,
        registry_url.or_else(|| offer.default_registry_url.clone()),
    );
    if watch {
        return Ok(Admitted::Watch(WatchPlan {
            bundle: request.bundle,
            apps,
            env,
            config,
            agent,
            agent_notice,
        }));
    }
    // A run session runs its first app (the bundle's entry when none are
    // named), under that app's name.
    let first = apps.into_iter().next();
    let (entry, ports, name, telo) = match first {
        Some(app) => (app.entry_relative_path, app.ports, app.name, app.telo),
        None => (entry, request.ports, DEFAULT_APP_NAME.to_owned(), None),
    };
    Ok(Admitted::Run(RunPlan {
        name,
        bundle: request.bundle,
        entry_relative_path: entry,
        ports,
        telo,
        env,
        config,
        inspect: request.inspect,
    }))
}

/// `PUT /v1/sessions/{id}/apps`: the new app set of a watch session whose
/// co-resident agent (if any) is `agent`, as it will run.
pub fn admit_app_set(
    offer: &Offer<'_>,
    apps: Vec<AppSpec>,
    agent: Option<&AgentRef>,
) -> Result<Vec<AppSpec>, Refusal> {
    let mut apps = resolve_apps(Some(apps), || {
        unreachable!("PUT /apps always names its apps")
    })?;
    // The session's agent keeps its port: a new app set that declares it
    // is refused (the manifest won the clash when the session began; an
    // agent already running is not dropped under a client's feet).
    if let Some(agent) = agent
        && let Some(owner) = tcp_owner(&apps, agent.port)
    {
        return Err(Refusal::AgentPortTaken {
            owner: owner.to_owned(),
            port: agent.port,
            agent: agent.name.clone(),
        });
    }
    let versions = telo::check_versions(offer.backend, None, true, &apps, SessionMode::Watch)?;
    telo::pin_versions(&mut apps, versions.as_deref());
    check_io(&offer.io_modes, &apps, true)?;
    Ok(apps)
}

/// An admitted `POST /v1/apps/{name}/sessions`.
#[derive(Debug)]
pub struct AppPlan {
    pub launch: AppLaunch,
    pub env: Vec<(String, String)>,
    pub ports: Vec<PortMapping>,
    pub inspect: bool,
}

/// `POST /v1/apps/{name}/sessions`: catalog app `name` run with `request`.
pub fn admit_app_session(
    catalog: &AppCatalog,
    default_registry_url: Option<String>,
    name: &str,
    request: AppSessionBody,
) -> Result<AppPlan, Refusal> {
    let Some(app) = catalog.get(name) else {
        return Err(Refusal::UnknownApp {
            message: catalog.unknown_app_message(name),
        });
    };
    if let Some(message) = app.refused_client_env(name, &request.env) {
        return Err(Refusal::ClientEnv(message));
    }
    let token = app
        .token_env
        .as_ref()
        .map(|_| crate::ids::new_workload_token());
    let merged = app.merge_env(&request.env);
    let merged = match &token {
        Some(token) => app.with_token(merged, token),
        None => merged,
    };
    let env = with_registry_url(merged, default_registry_url);
    Ok(AppPlan {
        launch: AppLaunch {
            name: name.to_owned(),
            image: app.image.clone(),
            pull_policy: app.pull_policy,
            command: app.command.clone(),
            token,
        },
        env,
        ports: request.ports,
        inspect: request.inspect,
    })
}

/// The one app of a request without `apps`: the bundle's entry, the
/// request's ports, under the default name.
fn default_app_spec(entry: String, ports: Vec<PortMapping>) -> AppSpec {
    AppSpec {
        name: DEFAULT_APP_NAME.to_owned(),
        entry_relative_path: entry,
        ports,
        io: IoMode::Tty,
        telo: None,
    }
}

/// `agent` on a session request: only a watch session has one, and only a
/// catalog entry that declares the port it listens on can be one. Returns
/// that port.
fn check_agent(offer: &Offer<'_>, agent: &str, watch: bool) -> Result<u16, Refusal> {
    if !watch {
        return Err(Refusal::AgentRequiresWatch);
    }
    let entry = offer
        .catalog
        .get(agent)
        .filter(|_| offer.backend_runs_agents);
    let Some(entry) = entry else {
        return Err(Refusal::UnknownAgent {
            agent: agent.to_owned(),
            offered: offer.offered_agents.clone(),
        });
    };
    entry.port.ok_or_else(|| Refusal::AgentPortUndeclared {
        agent: agent.to_owned(),
    })
}

/// The app declaring tcp `port`, if one does.
fn tcp_owner(apps: &[AppSpec], port: u16) -> Option<&str> {
    apps.iter()
        .find(|app| {
            app.ports
                .iter()
                .any(|mapping| mapping.port == port && mapping.protocol == PortProtocol::Tcp)
        })
        .map(|app| app.name.as_str())
}

/// An app whose `io` the backend does not offer is refused before anything
/// starts. A run session is always on a terminal: `streams` is offered to
/// watch sessions only.
fn check_io(offered: &[String], apps: &[AppSpec], watch: bool) -> Result<(), Refusal> {
    if let Some(app) = apps
        .iter()
        .find(|app| !offered.iter().any(|mode| mode == app.io.as_str()))
    {
        return Err(Refusal::IoNotOffered {
            app: app.name.clone(),
            io: app.io.as_str(),
            offered: offered.to_vec(),
        });
    }
    match apps.iter().find(|app| !watch && app.io != IoMode::Tty) {
        None => Ok(()),
        Some(app) => Err(Refusal::IoWatchOnly {
            app: app.name.clone(),
            io: app.io.as_str(),
        }),
    }
}

/// `TELO_REGISTRY_URL` reaches the workload unless the request env names it
/// (even as an empty string).
fn with_registry_url(mut env: Vec<(String, String)>, url: Option<String>) -> Vec<(String, String)> {
    if let Some(url) = url
        && !env.iter().any(|(key, _)| key == "TELO_REGISTRY_URL")
    {
        env.push(("TELO_REGISTRY_URL".into(), url));
    }
    env
}
