//! Command-line interface. `--help` documents every environment variable from
//! the same tables the configuration is read with, so the two cannot drift.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use runner_core::config::{CORE_SETTINGS, Setting};
use runner_k8s::config::K8S_SETTINGS;
use runner_local::LOCAL_SETTINGS;
use runner_workspace_service::{WORKSPACE_LIMIT_SETTINGS, WORKSPACE_SERVICE_SETTINGS};

#[derive(Debug, Parser)]
#[command(
    name = "telo-runner",
    version,
    about = "Runs Telo applications as sandboxed sessions behind the /v1 runner contract."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the /v1 runner API. Configured through environment variables.
    #[command(after_long_help = env_help())]
    Serve {
        /// Listen on this address instead of 0.0.0.0:$PORT (e.g. 127.0.0.1:0);
        /// the bound address is printed as `listening on http://<addr>`.
        #[arg(long)]
        listen: Option<SocketAddr>,
    },
    /// Run an application in a session and attach this terminal to it.
    ///
    /// Output shows live; typing goes to the application. Press Ctrl-C twice
    /// within a second to stop the session. Exits with the application's exit
    /// code (1 when the session failed, 130 when it was stopped).
    Run {
        /// The application's directory (its telo.yaml is the entry) or a
        /// manifest file (its directory is the bundle root). What the root's
        /// .gitignore and .teloignore files ignore is left out.
        target: PathBuf,
        #[command(flatten)]
        runner: RunnerArg,
        /// An environment variable for the application (repeatable).
        #[arg(long = "env", value_name = "K=V", value_parser = parse_env_pair)]
        env: Vec<(String, String)>,
        /// A port the application listens on, to publish (repeatable).
        #[arg(long = "port", value_name = "N[/udp]", value_parser = parse_port)]
        ports: Vec<(u16, String)>,
        /// Ask the runner to relay the kernel's debug stream (inspector URL).
        #[arg(long)]
        inspect: bool,
        /// Accept the runner's usage terms of this version without asking.
        #[arg(long, value_name = "VERSION")]
        accept_terms: Option<String>,
        /// The runner's request size limit (its RUNNER_MAX_BODY_BYTES).
        #[arg(long, value_name = "BYTES", env = "TELO_RUNNER_MAX_BODY_BYTES", default_value_t = crate::bundle::DEFAULT_MAX_BODY_BYTES)]
        max_body_bytes: usize,
    },
    /// List the runner's sessions.
    Sessions {
        #[command(flatten)]
        runner: RunnerArg,
        /// `table` for people, `json` (the runner's session list) for scripts.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = ListFormat::Table)]
        output: ListFormat,
    },
    /// Attach this terminal to a session that is already running: its output
    /// so far, then live; typing goes to it. Ctrl-C twice stops it, as in
    /// `run`.
    Attach {
        /// The session id (from `telo-runner sessions`).
        id: String,
        #[command(flatten)]
        runner: RunnerArg,
    },
    /// Try telo-runner in one command: a runner on 127.0.0.1 with the
    /// stand-in kernel, and with `--kubernetes` a simulated cluster
    /// (kube-sim) for its Kubernetes backend. Prints what to run next;
    /// Ctrl-C stops everything it started.
    Dev {
        /// Run sessions as pods on kube-sim instead of local processes.
        #[arg(long)]
        kubernetes: bool,
        /// The port to serve on (0 picks a free one).
        #[arg(long, env = "PORT", default_value_t = 8061)]
        port: u16,
        /// A Telo CLI to run sessions with instead of the stand-in kernel
        /// (fake-telo, which plays an example's `fakeTelo:` script).
        #[arg(long, value_name = "PATH")]
        telo: Option<PathBuf>,
        /// A browser origin whose pages may use this runner, besides pages
        /// served from loopback (repeatable), e.g. a hosted editor's
        /// `https://editor.example`.
        #[arg(
            long = "allow-origin",
            value_name = "ORIGIN",
            conflicts_with = "any_origin"
        )]
        allow_origin: Vec<String>,
        /// Let pages of every origin use this runner: any web page open in a
        /// browser on this machine could then start sessions.
        #[arg(long)]
        any_origin: bool,
    },
    /// Print a session's output so far, as the application wrote it.
    ///
    /// Read-only: sends no input and never stops the session. With
    /// `--follow`, keeps printing until the session ends and exits with its
    /// exit code (1 when it failed, 130 when it was stopped).
    Logs {
        /// The session id (from `telo-runner sessions`).
        id: String,
        /// Keep printing live output until the session ends.
        #[arg(short = 'f', long)]
        follow: bool,
        #[command(flatten)]
        runner: RunnerArg,
    },
    /// Serve one watch session's workspace directory over HTTP, for the
    /// runner only (the `workspace` container of a Kubernetes watch pod).
    /// Configured through RUNNER_WORKSPACE_DIR, RUNNER_WORKSPACE_LISTEN,
    /// RUNNER_WORKSPACE_TOKEN and the RUNNER_WORKSPACE_MAX_* limits.
    #[command(after_long_help = workspace_env_help())]
    Workspace,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Stop a session and wait until the runner reports it ended.
    Stop {
        /// The session id (from `telo-runner sessions`).
        id: String,
        #[command(flatten)]
        runner: RunnerArg,
        /// How long to wait for the session to end.
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        timeout: u64,
    },
}

/// How `sessions` prints its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunnerArg {
    /// The runner's base URL.
    /// `host:port` without a scheme means `http://host:port`.
    #[arg(long = "runner", value_name = "URL", env = "TELO_RUNNER_URL", default_value = crate::client::DEFAULT_RUNNER_URL, value_parser = parse_runner_url)]
    pub url: String,
    /// A bearer token, for a runner that requires one (RUNNER_AUTH_TOKENS_FILE).
    #[arg(
        long = "token",
        value_name = "TOKEN",
        env = "TELO_RUNNER_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

/// A runner URL: `http(s)://host[:port][/base]`, or `host:port`, which is
/// taken as plain HTTP. A trailing `/` is dropped.
pub fn parse_runner_url(raw: &str) -> Result<String, String> {
    let trimmed = raw.trim();
    let with_scheme = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let refuse = || format!("expected a runner URL such as http://127.0.0.1:8061, got '{raw}'");
    let url = reqwest::Url::parse(&with_scheme).map_err(|_| refuse())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(refuse());
    }
    Ok(with_scheme.trim_end_matches('/').to_owned())
}

fn parse_env_pair(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected K=V, got '{raw}'")),
    }
}

fn parse_port(raw: &str) -> Result<(u16, String), String> {
    let (number, protocol) = match raw.split_once('/') {
        Some((number, protocol)) => (number, protocol),
        None => (raw, "tcp"),
    };
    if !matches!(protocol, "tcp" | "udp") {
        return Err(format!("protocol must be tcp or udp, got '{protocol}'"));
    }
    match number.parse::<u16>() {
        Ok(port) if port >= 1 => Ok((port, protocol.to_owned())),
        _ => Err(format!("port must be in 1..65535, got '{number}'")),
    }
}

/// The backend selector, read by [`crate::server::backend_kind`].
pub const RUNNER_BACKEND: Setting = Setting {
    name: "RUNNER_BACKEND",
    default: "local",
    description: "Which backend runs sessions: `local` (processes on this host) or `kubernetes` (pods in a cluster).",
};

/// The binary's own settings, documented with the rest. (Its logging reads
/// `LOG_LEVEL` and `LOG_FORMAT`, documented with the core's.)
pub const BINARY_SETTINGS: &[Setting] = &[RUNNER_BACKEND];

/// Every documented environment variable, grouped as `--help` and the README
/// show them. The one source both are generated from.
pub fn env_groups() -> [(&'static str, &'static [Setting]); 6] {
    [
        ("Service", BINARY_SETTINGS),
        ("Core", CORE_SETTINGS),
        ("Session edge", runner_core::edge::EDGE_SETTINGS),
        ("Local backend", LOCAL_SETTINGS),
        ("Kubernetes backend", K8S_SETTINGS),
        (
            "Workspace service (`telo-runner workspace`)",
            WORKSPACE_SERVICE_SETTINGS,
        ),
    ]
}

fn default_text(var: &Setting) -> &str {
    if var.default.is_empty() {
        "unset"
    } else {
        var.default
    }
}

pub fn env_help() -> String {
    help_for(&env_groups())
}

/// `workspace --help`: its own variables and the limits it shares with the
/// runner.
pub fn workspace_env_help() -> String {
    let mut out = help_for(&[("Workspace service", WORKSPACE_SERVICE_SETTINGS)]);
    out.push_str(&help_group(
        "Workspace limits (as the runner's)",
        WORKSPACE_LIMIT_SETTINGS,
    ));
    out
}

fn help_for(groups: &[(&str, &[Setting])]) -> String {
    let mut out = String::from("Environment variables:\n");
    for (title, vars) in groups {
        out.push_str(&help_group(title, vars));
    }
    out
}

fn help_group(title: &str, vars: &[Setting]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n  {title}:");
    for var in vars {
        let _ = writeln!(
            out,
            "    {} (default: {})\n        {}",
            var.name,
            default_text(var),
            var.description
        );
    }
    out
}

/// The README's configuration section (between its `env:begin`/`env:end`
/// markers); a test keeps the README equal to it.
pub fn env_markdown() -> String {
    let mut out = String::new();
    for (title, vars) in env_groups() {
        let _ = writeln!(out, "\n#### {title}\n");
        let _ = writeln!(out, "| variable | default | meaning |");
        let _ = writeln!(out, "| --- | --- | --- |");
        for var in vars {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} |",
                var.name,
                default_text(var).replace('|', "\\|"),
                var.description.replace('|', "\\|")
            );
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {

    #[test]
    fn a_runner_url_may_leave_out_the_scheme() {
        assert_eq!(
            parse_runner_url("localhost:8061"),
            Ok("http://localhost:8061".into())
        );
        assert_eq!(
            parse_runner_url("http://127.0.0.1:8062/"),
            Ok("http://127.0.0.1:8062".into())
        );
        assert_eq!(
            parse_runner_url("https://runner.example/base"),
            Ok("https://runner.example/base".into())
        );
        for bad in ["", "ftp://x", "http://", "http://exa mple"] {
            assert_eq!(
                parse_runner_url(bad),
                Err(format!(
                    "expected a runner URL such as http://127.0.0.1:8061, got '{bad}'"
                ))
            );
        }
    }
    use super::*;

    #[test]
    fn the_backend_selector_reads_its_setting_and_defaults_to_what_it_documents() {
        use runner_core::config::Env;
        runner_core::setting::assert_reads_exactly(
            &[BINARY_SETTINGS],
            &[],
            &[Env::new()],
            crate::server::backend_kind,
        );
        runner_core::setting::assert_documented_defaults_are_the_defaults(
            &[BINARY_SETTINGS],
            crate::server::backend_kind,
        );
    }

    #[test]
    fn ports_default_to_tcp_and_accept_udp() {
        assert_eq!(parse_port("8080").unwrap(), (8080, "tcp".to_owned()));
        assert_eq!(parse_port("53/udp").unwrap(), (53, "udp".to_owned()));
        assert!(parse_port("0").is_err());
        assert!(parse_port("80/sctp").is_err());
    }

    #[test]
    fn env_pairs_split_at_the_first_equals() {
        assert_eq!(
            parse_env_pair("A=b=c").unwrap(),
            ("A".to_owned(), "b=c".to_owned())
        );
        assert!(parse_env_pair("=x").is_err());
        assert!(parse_env_pair("novalue").is_err());
    }
}
