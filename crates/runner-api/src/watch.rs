//! Watch sessions (runner-core 0.9+): a session per workspace whose apps the
//! kernel re-runs in place when a file changes. The types of its requests,
//! its workspace surface and what `GET /v1/sessions/:id` says about its apps.

use serde::{Deserialize, Serialize};

use crate::bundle_path::normalize_bundle_path;
use crate::ports::PortMapping;

/// The one app of a session that names none (every run session).
pub const DEFAULT_APP_NAME: &str = "app";
/// App names a session's own parts use.
pub const RESERVED_APP_NAMES: [&str; 2] = ["workspace", "agent"];
/// The length limit of an app name (a DNS label).
pub const MAX_APP_NAME_LEN: usize = 63;
/// The window the reload budget counts over.
pub const RELOAD_WINDOW_MS: u64 = 60_000;
/// What the workspace tree leaves out: the kernel's cache, dependencies and
/// version control, none of which an editor edits.
pub const WORKSPACE_EXCLUDED: [&str; 3] = ["node_modules", ".telo", ".git"];
/// The marker file that anchors the kernel's `.telo` cache at the
/// workspace's root; written at seeding unless the bundle has one.
pub const WORKSPACE_MARKER: &str = "telo-workspace.yaml";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionMode {
    #[default]
    Run,
    Watch,
}

impl SessionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Watch => "watch",
        }
    }
}

/// How an app's terminal reaches the client: one PTY (`tty`) or stdout and
/// stderr kept apart (`streams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    #[default]
    Tty,
    Streams,
}

impl IoMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tty => "tty",
            Self::Streams => "streams",
        }
    }
}

/// The byte of a tagged output frame that says which stream a chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum StreamTag {
    #[default]
    Tty = 0,
    Stdout = 1,
    Stderr = 2,
}

impl StreamTag {
    /// Unknown codes read as `tty`, as the reference writes them.
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => Self::Stdout,
            2 => Self::Stderr,
            _ => Self::Tty,
        }
    }
}

/// Why a generation of an app started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunTrigger {
    /// The session was created.
    Initial,
    /// The kernel saw a file change.
    Watch,
    /// `POST /reload`.
    Manual,
    /// `resume` or `PUT /apps`.
    Resume,
}

/// One app of a session as requested (`apps[]`, `PUT /apps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppSpec {
    pub name: String,
    #[serde(rename = "entryRelativePath")]
    pub entry_relative_path: String,
    #[serde(default)]
    pub ports: Vec<PortMapping>,
    #[serde(default)]
    pub io: IoMode,
    /// The telo release the app runs (0.17); as sent, checked by
    /// [`crate::telo::requested_versions`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telo: Option<String>,
}

/// One app as `GET /v1/sessions/:id` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppSnapshot {
    pub name: String,
    pub io: IoMode,
    /// Generations started so far (0 before the first).
    pub generation: u64,
    /// The app's current declared ports.
    pub ports: Vec<PortMapping>,
}

/// A port an `endpoints` event could not route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedPort {
    pub port: u16,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileEncoding {
    #[default]
    Utf8,
    Base64,
}

/// One file of the workspace tree: its path and the sha256 of its bytes
/// (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceFileEntry {
    pub path: String,
    pub hash: String,
}

/// `GET /v1/sessions/:id/workspace`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkspaceTree {
    pub files: Vec<WorkspaceFileEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceWrite {
    pub path: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<FileEncoding>,
}

/// `POST /v1/sessions/:id/workspace`: files to write, then paths to delete.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkspaceChangeSet {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<WorkspaceWrite>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkspaceApplyResult {
    pub written: usize,
    pub deleted: usize,
}

/// `GET /v1/sessions/:id/workspace/file`: the file as UTF-8 and its size in
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceFileContent {
    pub content: String,
    pub size: u64,
}

/// One file of a checkpoint (always base64 when the runner took it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceCheckpointFile {
    pub path: String,
    pub hash: String,
    pub content: String,
    pub encoding: FileEncoding,
}

/// `202` of `POST /reload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reloaded {
    pub reloaded: Vec<String>,
}

/// `202` of `PUT /apps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppsChanged {
    pub apps: Vec<String>,
}

/// `202` of `POST /resume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    #[serde(rename = "sessionId")]
    pub session_id: String,
}

/// Whether `name` is a DNS label, the rule for app names.
pub fn is_app_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_APP_NAME_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// An app set refused by the app rules (docs/contract.md §7.2): a
/// `400` with this code and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AppRefusal {
    pub code: &'static str,
    pub message: String,
}

impl AppRefusal {
    fn new(code: &'static str, message: String) -> Self {
        Self { code, message }
    }
}

/// The apps a session runs: `apps` as sent, checked app by app (the first
/// failure wins), with each entry path normalized; or, when none are sent,
/// the one app `app` running `default` (the bundle's entry and the request's
/// ports).
pub fn resolve_apps(
    apps: Option<Vec<AppSpec>>,
    default: impl FnOnce() -> AppSpec,
) -> Result<Vec<AppSpec>, AppRefusal> {
    let Some(apps) = apps else {
        return Ok(vec![default()]);
    };
    let mut resolved: Vec<AppSpec> = Vec::with_capacity(apps.len());
    for mut app in apps {
        if !is_app_name(&app.name) {
            return Err(AppRefusal::new(
                "invalid_app_name",
                format!(
                    "app name '{}' must be a DNS label (lowercase alphanumeric and '-')",
                    app.name
                ),
            ));
        }
        if RESERVED_APP_NAMES.contains(&app.name.as_str()) {
            return Err(AppRefusal::new(
                "reserved_app_name",
                format!(
                    "app name '{}' is reserved \u{2014} a session's own containers use it",
                    app.name
                ),
            ));
        }
        if resolved.iter().any(|earlier| earlier.name == app.name) {
            return Err(AppRefusal::new(
                "duplicate_app_name",
                format!("app '{}' is declared twice", app.name),
            ));
        }
        app.entry_relative_path = normalize_bundle_path(&app.entry_relative_path)
            .map_err(|err| AppRefusal::new("invalid_bundle", err.to_string()))?;
        for port in &app.ports {
            let owner = resolved.iter().find(|earlier| {
                earlier
                    .ports
                    .iter()
                    .any(|p| p.port == port.port && p.protocol == port.protocol)
            });
            if let Some(owner) = owner {
                return Err(AppRefusal::new(
                    "port_conflict",
                    format!(
                        "apps '{}' and '{}' both declare {} port {}; session hosts carry no app name, so the two would be indistinguishable",
                        owner.name,
                        app.name,
                        port.protocol.as_str(),
                        port.port
                    ),
                ));
            }
        }
        resolved.push(app);
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::PortProtocol;
    use serde_json::json;

    fn app(name: &str, entry: &str, ports: &[(u16, PortProtocol)]) -> AppSpec {
        AppSpec {
            name: name.into(),
            entry_relative_path: entry.into(),
            ports: ports
                .iter()
                .map(|&(port, protocol)| PortMapping { port, protocol })
                .collect(),
            io: IoMode::Tty,
            telo: None,
        }
    }

    #[test]
    fn without_apps_the_default_app_runs_the_bundle() {
        let apps = resolve_apps(None, || app(DEFAULT_APP_NAME, "telo.yaml", &[])).unwrap();
        assert_eq!(apps[0].name, "app");
    }

    #[test]
    fn the_app_rules_refuse_with_the_references_codes_and_messages() {
        let tcp = PortProtocol::Tcp;
        let refuse = |apps: Vec<AppSpec>| resolve_apps(Some(apps), || unreachable!()).unwrap_err();
        assert_eq!(
            refuse(vec![app("Api", "a.yaml", &[])]),
            AppRefusal::new(
                "invalid_app_name",
                "app name 'Api' must be a DNS label (lowercase alphanumeric and '-')".into()
            )
        );
        assert_eq!(
            refuse(vec![app("workspace", "a.yaml", &[])]).message,
            "app name 'workspace' is reserved \u{2014} a session's own containers use it"
        );
        assert_eq!(
            refuse(vec![app("a", "a.yaml", &[]), app("a", "b.yaml", &[])]),
            AppRefusal::new("duplicate_app_name", "app 'a' is declared twice".into())
        );
        assert_eq!(
            refuse(vec![app("a", "../a.yaml", &[])]),
            AppRefusal::new(
                "invalid_bundle",
                "invalid bundle relativePath '../a.yaml'".into()
            )
        );
        assert_eq!(
            refuse(vec![
                app("a", "a.yaml", &[(3000, tcp)]),
                app("b", "b.yaml", &[(3000, tcp)])
            ])
            .message,
            "apps 'a' and 'b' both declare tcp port 3000; session hosts carry no app name, so the two would be indistinguishable"
        );
        // tcp and udp on one number are two ports.
        let apps = resolve_apps(
            Some(vec![
                app("a", "/a.yaml", &[(3000, tcp)]),
                app("b", "b.yaml", &[(3000, PortProtocol::Udp)]),
            ]),
            || unreachable!(),
        )
        .unwrap();
        assert_eq!(apps[0].entry_relative_path, "a.yaml");
    }

    #[test]
    fn app_names_are_dns_labels() {
        for good in ["app", "a", "api-2", "0x", &"a".repeat(63)] {
            assert!(is_app_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64), "é"] {
            assert!(!is_app_name(bad), "{bad}");
        }
    }

    #[test]
    fn an_app_spec_defaults_io_to_tty_and_ports_to_none() {
        let spec: AppSpec =
            serde_json::from_value(json!({"name": "app", "entryRelativePath": "telo.yaml"}))
                .unwrap();
        assert_eq!(spec.io, IoMode::Tty);
        assert!(spec.ports.is_empty());
    }

    #[test]
    fn an_unknown_stream_code_reads_as_tty() {
        assert_eq!(StreamTag::from_code(1), StreamTag::Stdout);
        assert_eq!(StreamTag::from_code(2), StreamTag::Stderr);
        assert_eq!(StreamTag::from_code(9), StreamTag::Tty);
    }
}
