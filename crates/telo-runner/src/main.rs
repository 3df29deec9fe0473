use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use telo_runner::cli::{Cli, Command, ListFormat};
use telo_runner::client::{self, api::RunnerApi, run::RunOptions};
use telo_runner::dev::{self, Cluster, DevAccess, DevError, DevOrigins, Kernel};
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
        Command::Dev {
            kubernetes,
            port,
            telo,
            allow_origin,
            any_origin,
        } => dev(&env, kubernetes, port, telo, &allow_origin, any_origin),
        Command::Logs { id, follow, runner } => client(client::logs::logs(
            RunnerApi::new(&runner.url, runner.token),
            id,
            follow,
        )),
        Command::Workspace => workspace(&env),
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
    service_main(env, |runtime| {
        runtime.block_on(async {
            let service = match Service::from_env(env).await {
                Ok(service) => service,
                Err(err) => {
                    eprintln!("{err}");
                    return ExitCode::from(EXIT_BAD_CONFIG);
                }
            };
            let addr =
                listen.unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, service.core.port)));
            let listener = match TcpListener::bind(addr).await {
                Ok(listener) => listener,
                Err(err) => {
                    error!(%addr, error = %err, "could not listen");
                    return ExitCode::FAILURE;
                }
            };
            serve_on(service, listener, |_| {}).await
        })
    })
}

/// Logging, then a runtime for `body`: what `serve` and `dev` share.
fn service_main(
    env: &HashMap<String, String>,
    body: impl FnOnce(&tokio::runtime::Runtime) -> ExitCode,
) -> ExitCode {
    if let Err(err) = logging::init(env) {
        eprintln!("{err}");
        return ExitCode::from(EXIT_BAD_CONFIG);
    }
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => body(&runtime),
        Err(err) => {
            eprintln!("could not start the async runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Serves `service` on `listener` until SIGTERM or SIGINT. `serving` runs
/// once the address is printed.
async fn serve_on(
    service: Service,
    listener: TcpListener,
    serving: impl FnOnce(SocketAddr),
) -> ExitCode {
    let bound = match listener.local_addr() {
        Ok(bound) => bound,
        Err(err) => {
            error!(error = %err, "could not read the listening address");
            return ExitCode::FAILURE;
        }
    };
    // Handlers first: a SIGTERM sent as soon as the address is printed
    // (a supervisor, a test, `dev`'s user) must stop the service cleanly,
    // not kill it with its sessions and kube-sim left behind.
    let handlers = install_signal_handlers();
    println!("listening on http://{bound}");
    info!(addr = %bound, "telo-runner serving");
    serving(bound);
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(wait_for_signal(handlers, shutdown.clone()));
    let served = service.serve(listener, shutdown).await;
    stop_waiting(signals).await;
    match served {
        Ok(()) => {
            info!("shut down");
            ExitCode::SUCCESS
        }
        Err(err) => {
            error!(error = %err, "server failed");
            ExitCode::FAILURE
        }
    }
}

/// `telo-runner workspace`: the pod-local workspace service
/// (`runner_workspace_service`), until SIGTERM or SIGINT.
fn workspace(env: &HashMap<String, String>) -> ExitCode {
    let config = match runner_workspace_service::Config::from_env(env) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    service_main(env, |runtime| {
        runtime.block_on(async {
            let listener = match TcpListener::bind(config.listen).await {
                Ok(listener) => listener,
                Err(err) => {
                    error!(addr = %config.listen, error = %err, "could not listen");
                    return ExitCode::FAILURE;
                }
            };
            match listener.local_addr() {
                Ok(bound) => println!("listening on http://{bound}"),
                Err(err) => {
                    error!(error = %err, "could not read the listening address");
                    return ExitCode::FAILURE;
                }
            }
            let shutdown = CancellationToken::new();
            let signals =
                tokio::spawn(wait_for_signal(install_signal_handlers(), shutdown.clone()));
            let served = runner_workspace_service::serve_on(listener, config, shutdown).await;
            stop_waiting(signals).await;
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    error!(error = %err, "workspace service failed");
                    ExitCode::FAILURE
                }
            }
        })
    })
}

/// `telo-runner dev`: see [`telo_runner::dev`].
fn dev(
    env: &HashMap<String, String>,
    kubernetes: bool,
    port: u16,
    telo: Option<std::path::PathBuf>,
    allow_origin: &[String],
    any_origin: bool,
) -> ExitCode {
    let origins = match DevOrigins::choose(allow_origin, any_origin, env) {
        Ok(origins) => origins,
        Err(err) => {
            eprintln!("telo-runner dev: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let access = DevAccess {
        origins: origins.clone(),
        tokens: runner_core::config::RUNNER_AUTH_TOKENS_FILE
            .raw(env)
            .is_some_and(|path| !path.trim().is_empty()),
        uid: nix::unistd::geteuid().as_raw(),
    };
    let exe = std::env::current_exe().ok();
    let search_path = env.get("PATH").map_or("", String::as_str);
    let kernel = match Kernel::choose(telo.as_deref(), exe.as_deref(), search_path) {
        Ok(kernel) => kernel,
        Err(err) => {
            eprintln!("telo-runner dev: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let kube_sim = match kubernetes {
        false => None,
        true => match dev::companion("kube-sim", exe.as_deref(), search_path) {
            Some(path) => Some(path),
            None => {
                eprintln!("telo-runner dev: {}", DevError::NoKubeSim);
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
        },
    };
    service_main(env, |runtime| {
        runtime.block_on(async {
            // Loopback only: a dev runner has no tokens and no terms, so
            // the listener and the origin list are what keep strangers out.
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let listener = match TcpListener::bind(addr).await {
                Ok(listener) => listener,
                Err(err) => {
                    eprintln!("telo-runner dev: could not listen on {addr}: {err}");
                    return ExitCode::FAILURE;
                }
            };
            let bound = match listener.local_addr() {
                Ok(bound) => bound,
                Err(err) => {
                    eprintln!("telo-runner dev: {err}");
                    return ExitCode::FAILURE;
                }
            };
            let runner_url = format!("http://{bound}");
            let cluster = match &kube_sim {
                None => None,
                Some(path) => match Cluster::start(path, kernel.path(), bound).await {
                    Ok(cluster) => Some(cluster),
                    Err(err) => {
                        eprintln!("telo-runner dev: {err}");
                        return ExitCode::FAILURE;
                    }
                },
            };
            let runner_env = dev::runner_env(env, &kernel, cluster.as_ref(), &origins, bound);
            let code = match Service::from_env(&runner_env).await {
                Ok(service) => {
                    let steps = dev::next_steps(&runner_url, &kernel, cluster.as_ref(), &access);
                    serve_on(service, listener, |_| {
                        print!("{steps}");
                        let _ = std::io::Write::flush(&mut std::io::stdout());
                    })
                    .await
                }
                Err(err) => {
                    eprintln!("{err}");
                    ExitCode::from(EXIT_BAD_CONFIG)
                }
            };
            if let Some(cluster) = cluster {
                cluster.stop().await;
            }
            code
        })
    })
}

/// Ends the signal listener once the server is done (a server that failed
/// leaves it waiting), so no task outlives `main`'s runtime unjoined.
async fn stop_waiting(signals: tokio::task::JoinHandle<()>) {
    signals.abort();
    let _ = signals.await;
}

/// SIGTERM and SIGINT handlers, installed at once (from then on neither
/// kills the process); `None` when they could not be.
fn install_signal_handlers() -> Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)> {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => Some((term, int)),
        _ => {
            error!("could not install signal handlers");
            None
        }
    }
}

async fn wait_for_signal(
    handlers: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
    shutdown: CancellationToken,
) {
    let Some((mut term, mut int)) = handlers else {
        return;
    };
    tokio::select! {
        _ = term.recv() => info!(signal = "SIGTERM", "shutdown requested"),
        _ = int.recv() => info!(signal = "SIGINT", "shutdown requested"),
    }
    shutdown.cancel();
}
