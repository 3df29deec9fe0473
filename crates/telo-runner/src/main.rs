use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use telo_runner::cli::{Cli, Command, ListFormat};
use telo_runner::client::{self, api::RunnerApi, run::RunOptions};
use telo_runner::logging;
use telo_runner::server::Service;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Exit code for configuration the runner refuses to start with.
const EXIT_BAD_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env: HashMap<String, String> = std::env::vars().collect();
    match cli.command {
        Command::Serve { listen } => serve(&env, listen),
        Command::Run {
            target,
            runner,
            env,
            ports,
            inspect,
            accept_terms,
            max_body_bytes,
        } => client(client::run::run(RunOptions {
            target,
            runner: runner.url,
            token: runner.token,
            env,
            ports,
            inspect,
            accept_terms,
            max_body_bytes,
        })),
        Command::Sessions { runner, output } => client(async move {
            let api = RunnerApi::new(&runner.url, runner.token);
            report(match output {
                ListFormat::Table => client::sessions::list(&api).await,
                ListFormat::Json => client::sessions::list_json(&api).await,
            })
        }),
        Command::Attach { id, runner } => client(client::run::attach_to(
            RunnerApi::new(&runner.url, runner.token),
            id,
        )),
        Command::Logs { id, follow, runner } => client(client::logs::logs(
            RunnerApi::new(&runner.url, runner.token),
            id,
            follow,
        )),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "telo-runner",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
        Command::Stop {
            id,
            runner,
            timeout,
        } => client(async move {
            let api = RunnerApi::new(&runner.url, runner.token);
            report(client::sessions::stop(&api, &id, Duration::from_secs(timeout)).await)
        }),
    }
}

/// Runs a client command to its exit code.
fn client(command: impl Future<Output = u8>) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("could not start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(command);
    // The stdin reader thread may sit in a read; it must not keep us alive.
    runtime.shutdown_background();
    ExitCode::from(code)
}

fn report(outcome: Result<String, String>) -> u8 {
    match outcome {
        Ok(text) => {
            print!(
                "{}",
                if text.ends_with('\n') {
                    text
                } else {
                    format!("{text}\n")
                }
            );
            0
        }
        Err(message) => {
            eprintln!("telo-runner: {message}");
            client::run::EXIT_CLIENT_ERROR
        }
    }
}

fn serve(env: &HashMap<String, String>, listen: Option<SocketAddr>) -> ExitCode {
    if let Err(err) = logging::init(env) {
        eprintln!("{err}");
        return ExitCode::from(EXIT_BAD_CONFIG);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("could not start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let service = match Service::from_env(env).await {
            Ok(service) => service,
            Err(err) => {
                eprintln!("{err}");
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
        };
        let addr = listen.unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, service.core.port)));
        let listener = match TcpListener::bind(addr).await {
            Ok(listener) => listener,
            Err(err) => {
                error!(%addr, error = %err, "could not listen");
                return ExitCode::FAILURE;
            }
        };
        let bound = listener.local_addr().unwrap_or(addr);
        println!("listening on http://{bound}");
        info!(addr = %bound, "telo-runner serving");
        let shutdown = CancellationToken::new();
        tokio::spawn(wait_for_signal(shutdown.clone()));
        match service.serve(listener, shutdown).await {
            Ok(()) => {
                info!("shut down");
                ExitCode::SUCCESS
            }
            Err(err) => {
                error!(error = %err, "server failed");
                ExitCode::FAILURE
            }
        }
    })
}

async fn wait_for_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("could not install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!(signal = "SIGTERM", "shutdown requested"),
        _ = int.recv() => info!(signal = "SIGINT", "shutdown requested"),
    }
    shutdown.cancel();
}
