//! The JSON types of the `/v1` contract, exactly as clients see them.
//!
//! Field names, tag names and the omission of absent optional fields are part of
//! the wire format the Telo editor parses; change them only together with the
//! contract.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::ports::{PortMapping, PortProtocol};
use crate::watch::{AppSnapshot, RejectedPort, RunTrigger, SessionMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PullPolicy {
    Missing,
    Always,
    Never,
}

impl PullPolicy {
    pub const ALL: [&'static str; 3] = ["missing", "always", "never"];

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "missing" => Some(Self::Missing),
            "always" => Some(Self::Always),
            "never" => Some(Self::Never),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Always => "always",
            Self::Never => "never",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerEndpoint {
    /// Directly dialable host; `""` means "the host the client reached the runner on".
    pub host: String,
    pub port: u16,
    pub protocol: PortProtocol,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The workload token of an app whose catalog entry has `tokenEnv`
    /// (0.16): what a client presents to the app behind this endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl RunnerEndpoint {
    /// A port published as it is, on the host the client reached the
    /// runner on (no routing layer in front).
    pub fn unrouted(mapping: PortMapping) -> Self {
        Self {
            host: String::new(),
            port: mapping.port,
            protocol: mapping.protocol,
            url: None,
            token: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum RunStatus {
    Starting,
    Running {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoints: Option<Vec<RunnerEndpoint>>,
        #[serde(
            default,
            rename = "inspectUrl",
            skip_serializing_if = "Option::is_none"
        )]
        inspect_url: Option<String>,
        /// A watch session's co-resident agent (0.10), where it listens.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<RunnerEndpoint>,
    },
    Exited {
        code: i64,
    },
    Failed {
        message: String,
    },
    Stopped,
    /// A watch session whose workload is gone while the session (its files,
    /// its id) waits to be resumed. Not terminal.
    Suspended,
}

impl RunStatus {
    /// `running` with `ports` published as they are, on the host the client
    /// reached the runner on (no routing layer in front).
    pub fn running_unrouted<'a>(ports: impl IntoIterator<Item = &'a PortMapping>) -> Self {
        Self::Running {
            endpoints: Some(
                ports
                    .into_iter()
                    .copied()
                    .map(RunnerEndpoint::unrouted)
                    .collect(),
            ),
            inspect_url: None,
            agent: None,
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Exited { .. } | Self::Failed { .. } | Self::Stopped
        )
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed {
            message: message.into(),
        }
    }

    /// The `kind` tag, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running { .. } => "running",
            Self::Exited { .. } => "exited",
            Self::Failed { .. } => "failed",
            Self::Stopped => "stopped",
            Self::Suspended => "suspended",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunPhase {
    Build,
    Provision,
    Boot,
}

impl RunPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Build => "build",
            Self::Provision => "provision",
            Self::Boot => "boot",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReachabilityState {
    Checking,
    Reachable,
    Unreachable,
}

impl ReachabilityState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Checking => "checking",
            Self::Reachable => "reachable",
            Self::Unreachable => "unreachable",
        }
    }
}

/// Whether a session host's route is served by the cluster's routing layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteState {
    /// Published; no controller has taken it up yet.
    Pending,
    /// A controller serves it.
    Programmed,
    /// Refused by the controller, never claimed, or never published; `reason`
    /// says which.
    Unprogrammed,
}

/// A session lifecycle event as carried in SSE `data:` lines (the whole object,
/// `type` included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RunEvent {
    Stdout {
        chunk: String,
    },
    Stderr {
        chunk: String,
    },
    Status {
        status: RunStatus,
    },
    Progress {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app: Option<String>,
        phase: RunPhase,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        done: Option<bool>,
    },
    Debug {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app: Option<String>,
        frame: Value,
    },
    Reachability {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app: Option<String>,
        port: u16,
        state: ReachabilityState,
    },
    /// The route of one published host (`<port>-<id>.<baseDomain>`).
    Route {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app: Option<String>,
        host: String,
        port: u16,
        state: RouteState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// One generation of an app: started, completed or failed.
    Run(RunRecord),
    /// An app's routable ports changed.
    Endpoints {
        app: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        added: Option<Vec<RunnerEndpoint>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        removed: Option<Vec<RunnerEndpoint>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rejected: Option<Vec<RejectedPort>>,
    },
}

/// A `run` event: which app, which generation, what happened to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub app: String,
    pub generation: u64,
    #[serde(flatten)]
    pub phase: RunOutcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "lowercase")]
pub enum RunOutcome {
    Started {
        trigger: RunTrigger,
        /// The version the kernel says it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        telo: Option<String>,
    },
    Completed {
        code: i64,
        #[serde(
            default,
            rename = "durationMs",
            skip_serializing_if = "Option::is_none"
        )]
        duration_ms: Option<u64>,
    },
    Failed {
        reason: String,
    },
}

impl RunEvent {
    /// The SSE `event:` name, which equals the `type` tag.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stdout { .. } => "stdout",
            Self::Stderr { .. } => "stderr",
            Self::Status { .. } => "status",
            Self::Progress { .. } => "progress",
            Self::Debug { .. } => "debug",
            Self::Reachability { .. } => "reachability",
            Self::Route { .. } => "route",
            Self::Run(_) => "run",
            Self::Endpoints { .. } => "endpoints",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerTerms {
    pub version: String,
    pub title: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerAppDescriptor {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigIssue {
    pub path: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum AvailabilityReport {
    Ready,
    NeedsSetup {
        issues: Vec<ConfigIssue>,
    },
    Unavailable {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remediation: Option<String>,
    },
}

/// `config` of a session request: the editable surface advertised in
/// `/v1/capabilities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionConfig {
    pub image: String,
    #[serde(rename = "pullPolicy")]
    pub pull_policy: PullPolicy,
    #[serde(
        default,
        rename = "registryUrl",
        skip_serializing_if = "Option::is_none"
    )]
    pub registry_url: Option<String>,
}

/// `config` as a request sends it. Since runner-core 0.15 the whole object
/// is optional, and since 0.17 so are its keys: a request that names a telo
/// version leaves `image` and `pullPolicy` out, and one that names neither
/// runs the backend's default.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RequestedConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(
        default,
        rename = "pullPolicy",
        skip_serializing_if = "Option::is_none"
    )]
    pub pull_policy: Option<PullPolicy>,
    #[serde(
        default,
        rename = "registryUrl",
        skip_serializing_if = "Option::is_none"
    )]
    pub registry_url: Option<String>,
}

impl RequestedConfig {
    /// The keys sent, by wire name, among `keys`.
    pub fn sent_among<'k>(&self, keys: &[&'k str]) -> Vec<&'k str> {
        keys.iter()
            .copied()
            .filter(|key| match *key {
                "image" => self.image.is_some(),
                "pullPolicy" => self.pull_policy.is_some(),
                "registryUrl" => self.registry_url.is_some(),
                _ => false,
            })
            .collect()
    }

    /// The config a session runs with: what was sent, the backend's
    /// defaults for the rest.
    pub fn resolve(self, defaults: &SessionConfig) -> SessionConfig {
        SessionConfig {
            image: self.image.unwrap_or_else(|| defaults.image.clone()),
            pull_policy: self.pull_policy.unwrap_or(defaults.pull_policy),
            registry_url: self.registry_url,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleFile {
    #[serde(rename = "relativePath")]
    pub relative_path: String,
    pub contents: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunBundle {
    #[serde(rename = "entryRelativePath")]
    pub entry_relative_path: String,
    pub files: Vec<BundleFile>,
}

/// A `POST /v1/sessions` body as a client writes it: the bundle, its
/// environment in the order given, the ports to publish, the container
/// config and whether to relay the kernel's debug stream.
#[derive(Debug, Clone, Serialize)]
pub struct StartSessionRequest<'a> {
    pub bundle: &'a RunBundle,
    #[serde(serialize_with = "env_object")]
    pub env: &'a [(String, String)],
    pub ports: Vec<PortMapping>,
    pub config: RequestedConfig,
    pub inspect: bool,
}

/// An environment as the wire's JSON object, keys in the order given.
fn env_object<S: serde::Serializer>(
    env: &&[(String, String)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(env.iter().map(|(key, value)| (key, value)))
}

/// Response of both session-creating routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCreated {
    #[serde(rename = "sessionId")]
    pub session_id: String,
    #[serde(rename = "streamUrl")]
    pub stream_url: String,
    #[serde(rename = "createdAt")]
    pub created_at: String,
}

/// `GET /v1/sessions/:id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSnapshot {
    #[serde(rename = "sessionId")]
    pub session_id: String,
    pub status: RunStatus,
    /// `run` or `watch` (runner-core 0.9+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SessionMode>,
    /// The co-resident agent's catalog name, when it runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps: Option<Vec<AppSnapshot>>,
    #[serde(rename = "createdAt")]
    pub created_at: String,
    #[serde(default, rename = "exitedAt", skip_serializing_if = "Option::is_none")]
    pub exited_at: Option<String>,
    /// The replica that holds the session, when the runner runs several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// `GET /v1/capabilities`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerCapabilities {
    #[serde(default)]
    pub display_name: String,
    #[serde(default)]
    pub description: String,
    /// The editable session config; a runner that takes none may omit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigSurface>,
    /// `io`, `ports`, `auth`, …: what this runner offers, by backend.
    #[serde(default)]
    pub features: serde_json::Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms: Option<RunnerTerms>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apps: Vec<RunnerAppDescriptor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigSurface {
    /// The JSON Schema of the editable `SessionConfig`.
    pub schema: Value,
    /// The config keys a request leaves out once it names a telo version
    /// (0.17; present when the runner runs chosen versions).
    #[serde(
        default,
        rename = "supersededByTelo",
        skip_serializing_if = "Option::is_none"
    )]
    pub superseded_by_telo: Option<Vec<String>>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionList {
    pub sessions: Vec<SessionSnapshot>,
}

/// A runner-authored error body (`{error, message}`); the terms gate's 428
/// carries `terms` instead of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms: Option<RunnerTerms>,
}

/// A kernel debug frame is an event frame unless its `kind` says `log` or
/// `record`; only event frames are relayed, so log spam can never evict
/// lifecycle events from the replay buffer.
pub fn is_event_frame(frame: &Value) -> bool {
    !matches!(
        frame.get("kind").and_then(Value::as_str),
        Some("log") | Some("record")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_serialize_with_kind_tags_and_without_absent_fields() {
        assert_eq!(
            serde_json::to_value(RunStatus::Starting).unwrap(),
            json!({"kind": "starting"})
        );
        assert_eq!(
            serde_json::to_value(RunStatus::Running {
                endpoints: None,
                inspect_url: None,
                agent: None,
            })
            .unwrap(),
            json!({"kind": "running"})
        );
        assert_eq!(
            serde_json::to_value(RunStatus::Exited { code: 3 }).unwrap(),
            json!({"kind": "exited", "code": 3})
        );
        assert_eq!(
            serde_json::to_value(RunStatus::Suspended).unwrap(),
            json!({"kind": "suspended"})
        );
        assert!(!RunStatus::Suspended.is_terminal());
    }

    #[test]
    fn events_carry_their_type_tag() {
        let event = RunEvent::Progress {
            app: None,
            phase: RunPhase::Provision,
            message: "Scheduling".into(),
            done: None,
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"type":"progress","phase":"provision","message":"Scheduling"}"#
        );
        let event = RunEvent::Reachability {
            app: Some("app".into()),
            port: 8080,
            state: ReachabilityState::Checking,
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"type":"reachability","app":"app","port":8080,"state":"checking"}"#
        );
        let run = RunEvent::Run(RunRecord {
            app: "api".into(),
            generation: 2,
            phase: RunOutcome::Started {
                trigger: RunTrigger::Watch,
                telo: None,
            },
        });
        assert_eq!(run.name(), "run");
        assert_eq!(
            serde_json::to_string(&run).unwrap(),
            r#"{"type":"run","app":"api","generation":2,"phase":"started","trigger":"watch"}"#
        );
        let done = RunEvent::Run(RunRecord {
            app: "api".into(),
            generation: 2,
            phase: RunOutcome::Completed {
                code: 0,
                duration_ms: Some(12),
            },
        });
        assert_eq!(
            serde_json::to_string(&done).unwrap(),
            r#"{"type":"run","app":"api","generation":2,"phase":"completed","code":0,"durationMs":12}"#
        );
        assert_eq!(
            serde_json::from_str::<RunEvent>(&serde_json::to_string(&done).unwrap()).unwrap(),
            done
        );
    }

    #[test]
    fn route_events_omit_an_absent_reason() {
        let pending = RunEvent::Route {
            app: None,
            host: "8080-abc.telo.run".into(),
            port: 8080,
            state: RouteState::Pending,
            reason: None,
        };
        assert_eq!(pending.name(), "route");
        assert_eq!(
            serde_json::to_string(&pending).unwrap(),
            r#"{"type":"route","host":"8080-abc.telo.run","port":8080,"state":"pending"}"#
        );
        let refused = RunEvent::Route {
            app: None,
            host: "8080-abc.telo.run".into(),
            port: 8080,
            state: RouteState::Unprogrammed,
            reason: Some("NotAllowedByListeners: no listener admits routes".into()),
        };
        assert_eq!(
            serde_json::to_value(&refused).unwrap(),
            json!({"type": "route", "host": "8080-abc.telo.run", "port": 8080,
                   "state": "unprogrammed", "reason": "NotAllowedByListeners: no listener admits routes"})
        );
        assert_eq!(
            serde_json::from_value::<RunEvent>(serde_json::to_value(&refused).unwrap()).unwrap(),
            refused
        );
    }

    #[test]
    fn availability_reports_use_kebab_case_status() {
        assert_eq!(
            serde_json::to_value(AvailabilityReport::NeedsSetup { issues: vec![] }).unwrap(),
            json!({"status": "needs-setup", "issues": []})
        );
    }

    #[test]
    fn log_and_record_frames_are_not_event_frames() {
        assert!(is_event_frame(&json!({"event": "Kernel.Started"})));
        assert!(is_event_frame(&json!({"kind": "event", "event": "X"})));
        assert!(!is_event_frame(&json!({"kind": "log", "line": "x"})));
        assert!(!is_event_frame(&json!({"kind": "record", "record": {}})));
    }
}
