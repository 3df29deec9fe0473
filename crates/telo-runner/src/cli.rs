//! Command-line interface. `--help` documents every environment variable from
//! the same tables the configuration is read with, so the two cannot drift.

use std::fmt::Write as _;
use std::net::SocketAddr;

use clap::{Parser, Subcommand};
use runner_core::config::{CORE_ENV_VARS, EnvVarDoc};
use runner_k8s::config::K8S_ENV_VARS;
use runner_local::LOCAL_ENV_VARS;

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
}

/// The `BACKEND` selector, documented with the rest.
pub const BINARY_ENV_VARS: &[EnvVarDoc] = &[EnvVarDoc {
    name: "RUNNER_BACKEND",
    default: "local",
    description: "Which backend runs sessions: `local` (processes on this host) or `kubernetes` (pods in a cluster).",
}];

pub fn env_help() -> String {
    let mut out = String::from("Environment variables:\n");
    for (title, vars) in [
        ("Service", BINARY_ENV_VARS),
        ("Core", CORE_ENV_VARS),
        ("Local backend", LOCAL_ENV_VARS),
        ("Kubernetes backend", K8S_ENV_VARS),
    ] {
        let _ = writeln!(out, "\n  {title}:");
        for var in vars {
            let default = if var.default.is_empty() {
                "unset".to_owned()
            } else {
                var.default.to_owned()
            };
            let _ = writeln!(
                out,
                "    {} (default: {})\n        {}",
                var.name, default, var.description
            );
        }
    }
    out
}
