//! A real `SessionRegistry` over a `LocalBackend` running `fake-telo`, and
//! waits on its events and output — always on the event, with a timeout.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use runner_core::registry::{Cursor, EventFrame, Session};
use runner_core::session::OutputChunk;
use runner_core::types::{
    BundleFile, PortMapping, PullPolicy, RunBundle, RunEvent, RunStatus, SessionConfig,
};
use runner_core::{AppLaunch, RegistryLimits, SessionRegistry, StartSpec};
use runner_local::{BubblewrapConfig, LocalBackend, LocalConfig, SandboxConfig};
use serde_json::Value;
use tempfile::TempDir;
use test_support::WAIT;
use test_support::fake_telo::fake_telo_path;

pub struct Harness {
    pub registry: SessionRegistry,
    pub backend: Arc<LocalBackend>,
    pub config: LocalConfig,
    /// Holds the work root; removed with the harness.
    _work_root: TempDir,
}

pub fn config(work_root: &TempDir) -> LocalConfig {
    LocalConfig {
        telo: fake_telo_path().to_string_lossy().into_owned(),
        telo_versions: None,
        work_root: work_root.path().join("sessions"),
        max_ttl: Duration::from_secs(3600),
        path: "/usr/local/bin:/usr/bin:/bin".to_owned(),
        stop_grace: runner_local::config::DEFAULT_STOP_GRACE,
        sandbox: bubblewrap(),
        network: runner_local::network::NetworkConfig::Isolated {
            search_path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        },
        workspace: Default::default(),
        limits: Default::default(),
        kernel_cache: Default::default(),
    }
}

/// The default sandbox: `bwrap` from the system directories.
pub fn bubblewrap() -> SandboxConfig {
    SandboxConfig::Bubblewrap(BubblewrapConfig {
        bwrap: "bwrap".to_owned(),
        search_path: "/usr/bin:/bin".to_owned(),
        home: std::env::var_os("HOME").map(std::path::PathBuf::from),
        hidden: Vec::new(),
        read_only: Vec::new(),
    })
}

pub fn limits() -> RegistryLimits {
    RegistryLimits {
        max_sessions: 32,
        exit_ttl: Duration::from_secs(3600),
        replay_buffer_bytes: 1 << 20,
        watch: Default::default(),
    }
}

impl Harness {
    pub fn new() -> Self {
        Self::with(|_| {}, limits())
    }

    pub fn with(adjust: impl FnOnce(&mut LocalConfig), limits: RegistryLimits) -> Self {
        let work_root = tempfile::tempdir().unwrap();
        let mut config = config(&work_root);
        adjust(&mut config);
        let backend = Arc::new(LocalBackend::new(config.clone()).unwrap());
        let registry = SessionRegistry::new(backend.clone(), limits);
        Self {
            registry,
            backend,
            config,
            _work_root: work_root,
        }
    }

    /// Starts a session from `spec` (its id and creation time are filled in).
    pub fn start(&self, spec: StartSpec) -> Arc<Session> {
        let created = self
            .registry
            .create(|id, created_at| StartSpec {
                session_id: id.to_owned(),
                created_at: created_at.to_owned(),
                ..spec
            })
            .unwrap();
        self.registry.get(&created.session_id).unwrap()
    }

    pub fn session_dir(&self, session: &Session) -> std::path::PathBuf {
        self.config.work_root.join(session.id())
    }
}

/// A bundle session whose one-file entry scripts fake-telo with `script`.
pub fn bundle_spec(script: Value) -> StartSpec {
    let manifest =
        format!("kind: Telo.Application\nmetadata: {{ name: test }}\nfakeTelo: {script}\n");
    StartSpec {
        session_id: String::new(),
        created_at: String::new(),
        bundle: RunBundle {
            entry_relative_path: "app/telo.yaml".to_owned(),
            files: vec![BundleFile {
                relative_path: "app/telo.yaml".to_owned(),
                contents: manifest,
            }],
        },
        entry_relative_path: "app/telo.yaml".to_owned(),
        env: Vec::new(),
        ports: Vec::new(),
        config: SessionConfig {
            image: "local".to_owned(),
            pull_policy: PullPolicy::Missing,
            registry_url: None,
        },
        app: None,
        inspect: false,
        telo: None,
        owner: None,
    }
}

/// An app session running `command`.
pub fn app_spec(command: Option<&[&str]>) -> StartSpec {
    StartSpec {
        bundle: RunBundle {
            entry_relative_path: String::new(),
            files: Vec::new(),
        },
        entry_relative_path: String::new(),
        app: Some(AppLaunch {
            name: "agent".to_owned(),
            image: "unused".to_owned(),
            pull_policy: PullPolicy::Missing,
            command: command.map(|argv| argv.iter().map(|a| (*a).to_owned()).collect()),
            token: None,
        }),
        ..bundle_spec(Value::Null)
    }
}

pub fn with_env(mut spec: StartSpec, env: &[(&str, &str)]) -> StartSpec {
    spec.env = env
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    spec
}

pub fn with_ports(mut spec: StartSpec, ports: &[PortMapping]) -> StartSpec {
    spec.ports = ports.to_vec();
    spec
}

fn decode(frame: &EventFrame) -> RunEvent {
    serde_json::from_slice(&frame.data).unwrap()
}

/// Reads a session's lifecycle events in order.
pub struct Events {
    cursor: Cursor<EventFrame>,
    /// Read from the buffer but not yet looked at.
    pending: std::collections::VecDeque<RunEvent>,
    /// Every event looked at so far.
    pub seen: Vec<RunEvent>,
    /// How long any one wait may take.
    wait: std::time::Duration,
}

impl Events {
    pub fn of(session: &Arc<Session>) -> Self {
        Self {
            cursor: session.subscribe_events(0),
            pending: std::collections::VecDeque::new(),
            seen: Vec::new(),
            wait: WAIT,
        }
    }

    /// Waits up to `wait` instead (the real kernel starts slower).
    pub fn within(mut self, wait: std::time::Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Reads until `wanted` matches an event, which is returned.
    pub async fn until(&mut self, what: &str, wanted: impl Fn(&RunEvent) -> bool) -> RunEvent {
        let Self {
            cursor,
            pending,
            seen,
            wait,
        } = self;
        let found = tokio::time::timeout(*wait, async {
            loop {
                while let Some(event) = pending.pop_front() {
                    seen.push(event.clone());
                    if wanted(&event) {
                        return event;
                    }
                }
                let batch = cursor.next().await;
                pending.extend(batch.entries.iter().map(|(_, frame)| decode(frame)));
            }
        })
        .await;
        match found {
            Ok(event) => event,
            Err(_) => panic!("timed out waiting for {what}; events so far: {seen:#?}"),
        }
    }

    pub async fn running(&mut self) -> RunStatus {
        match self
            .until("running", |e| {
                matches!(e, RunEvent::Status { status } if matches!(status, RunStatus::Running { .. }) || status.is_terminal())
            })
            .await
        {
            RunEvent::Status {
                status: status @ RunStatus::Running { .. },
            } => status,
            other => panic!("session ended before running: {other:?}"),
        }
    }

    pub async fn terminal(&mut self) -> RunStatus {
        match self
            .until(
                "a terminal status",
                |e| matches!(e, RunEvent::Status { status } if status.is_terminal()),
            )
            .await
        {
            RunEvent::Status { status } => status,
            _ => unreachable!(),
        }
    }
}

/// Reads a session's terminal output.
pub struct Output {
    cursor: Cursor<OutputChunk>,
    pub text: String,
    /// How long any one wait may take.
    wait: std::time::Duration,
}

impl Output {
    pub fn of(session: &Arc<Session>) -> Self {
        Self {
            cursor: session.subscribe_output(0),
            text: String::new(),
            wait: WAIT,
        }
    }

    /// Waits up to `wait` instead (the real kernel starts slower).
    pub fn within(mut self, wait: std::time::Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Reads until the output holds `needle` `times` times in all.
    pub async fn until_count(&mut self, needle: &str, times: usize) {
        let cursor = &mut self.cursor;
        let text = &mut self.text;
        let found = tokio::time::timeout(self.wait, async {
            while text.matches(needle).count() < times {
                let batch = cursor.next().await;
                for (_, chunk) in batch.entries {
                    text.push_str(&String::from_utf8_lossy(&chunk.bytes));
                }
            }
        })
        .await;
        if found.is_err() {
            panic!("timed out waiting for {needle:?} x{times}; output so far: {text:?}");
        }
    }

    pub async fn until(&mut self, needle: &str) {
        self.until_count(needle, 1).await;
    }
}

/// Everything in a session's output buffer right now, without waiting.
pub fn output_now(session: &Session) -> String {
    session
        .replay_output(0)
        .entries
        .iter()
        .map(|(_, chunk)| String::from_utf8_lossy(&chunk.bytes).into_owned())
        .collect()
}

/// Host pids of the processes with `marker` as one of their arguments — as
/// the runner's PID namespace sees them, whatever sandbox they run in.
pub fn pids_with_marker(marker: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == marker.as_bytes())
                .then_some(pid)
        })
        .filter(|pid| !is_dead(*pid))
        .collect()
}

fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // `<pid> (<comm>) <state> …`; the command may contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// A marker no other test process uses (nextest runs each test in a
/// process of its own).
pub fn marker(what: &str) -> String {
    format!("marker-{what}-{}", std::process::id())
}

/// Waits until a process carrying `marker` runs; returns the host pids.
pub async fn wait_for_marker(marker: &str) -> Vec<i32> {
    let found = tokio::time::timeout(WAIT, async {
        let mut poll = tokio::time::interval(Duration::from_millis(10));
        loop {
            let pids = pids_with_marker(marker);
            if !pids.is_empty() {
                return pids;
            }
            poll.tick().await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no process with {marker} ever ran"))
}

/// Waits until no process carrying `marker` runs any more.
pub async fn wait_until_marker_gone(marker: &str) {
    let waited = tokio::time::timeout(WAIT, async {
        let mut poll = tokio::time::interval(Duration::from_millis(10));
        while !pids_with_marker(marker).is_empty() {
            poll.tick().await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "processes with {marker} still alive: {:?}",
        pids_with_marker(marker)
    );
}

/// The backend handle, which the registry records right after `start`
/// returned — a moment after `running` was emitted, so it is waited for.
pub async fn handle_of(session: &Session) -> Arc<dyn runner_core::BackendSession> {
    let handle = tokio::time::timeout(WAIT, async {
        let mut poll = tokio::time::interval(Duration::from_millis(5));
        loop {
            if let Some(handle) = session.handle() {
                return handle;
            }
            poll.tick().await;
        }
    })
    .await;
    handle.expect("the session never got a backend handle")
}

/// Waits until none of this process's threads belongs to `session` (the
/// backend names them `<role>-<session id>`, cut to Linux's 15 bytes).
pub async fn wait_until_threads_end(session: &Session) {
    let marker = format!("-{}", &session.id()[..10]);
    let session_threads = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.contains(&marker))
            .collect()
    };
    let waited = tokio::time::timeout(WAIT, async {
        let mut poll = tokio::time::interval(Duration::from_millis(10));
        while !session_threads().is_empty() {
            poll.tick().await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "session threads still running: {:?}",
        session_threads()
    );
}

/// Writes `script` to `path` as an executable, the way an upgrade replaces
/// a program: a new file renamed over the old one. A child process writes
/// it, so that no descriptor open for writing ever exists in this
/// (multi-threaded, forking) test process — exec'ing a file that one of our
/// forks still holds open fails with "text file busy".
pub fn install_script(path: &std::path::Path, script: &str) {
    let staged = path.with_file_name(format!(
        ".{}.new",
        path.file_name().unwrap().to_string_lossy()
    ));
    let status = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            "printf '%s' \"$1\" > \"$2\" && chmod 755 \"$2\" && mv \"$2\" \"$3\"",
            "install",
            script,
        ])
        .arg(&staged)
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "could not install {}", path.display());
}
