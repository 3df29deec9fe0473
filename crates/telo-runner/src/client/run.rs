//! `telo-runner run`: bundle, start a session, attach the terminal to it, and
//! leave with the session's exit code.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use runner_api::io::{CLOSE_NO_STATUS, ServerMessage, parse_server_message};
use runner_api::types::{
    PortMapping, PortProtocol, RunEvent, RunStatus, RunnerTerms, StartSessionRequest,
};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::api::{ApiError, RunnerApi, default_config};
use super::ctrl_c::DoubleCtrlC;
use super::events::{self, Lifecycle, terminal_status};
use super::io::{
    self, CLOSE_GOING_AWAY, GAP_NOTICE, IoSocket, is_final_close, new_output, resize_frame,
};
use super::output::Output;
use super::status::{event_line, exit_code_of, running_lines};
use super::terminal::{self, RawMode, notice};
use crate::bundle;

/// After the terminal status, how long the last output may take to arrive
/// before the client stops waiting for the runner to close the socket.
const OUTPUT_DRAIN: Duration = Duration::from_secs(3);
/// After a stop request, how long to wait for the runner's `stopped`.
const STOP_WAIT: Duration = Duration::from_secs(15);
/// WebSocket reconnect backoff, as the editor's (docs/contract.md §5.6).
const RECONNECT_FIRST: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(10);
/// The exit code when the client itself fails (bad bundle, runner error).
pub const EXIT_CLIENT_ERROR: u8 = 1;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub target: PathBuf,
    pub runner: String,
    pub token: Option<String>,
    pub env: Vec<(String, String)>,
    pub ports: Vec<(u16, String)>,
    pub inspect: bool,
    pub accept_terms: Option<String>,
    pub max_body_bytes: usize,
}

pub async fn run(options: RunOptions) -> u8 {
    match start_and_attach(options).await {
        Ok(code) => code,
        Err(message) => {
            notice(&format!("telo-runner: {message}"));
            EXIT_CLIENT_ERROR
        }
    }
}

/// `telo-runner attach <id>`: this terminal on a session that exists.
pub async fn attach_to(api: RunnerApi, id: String) -> u8 {
    let known = api.session(&id).await.map_err(|e| e.to_string());
    let outcome = match known {
        Ok(_) => attach(api, id).await,
        Err(message) => Err(message),
    };
    match outcome {
        Ok(code) => code,
        Err(message) => {
            notice(&format!("telo-runner: {message}"));
            EXIT_CLIENT_ERROR
        }
    }
}

async fn start_and_attach(options: RunOptions) -> Result<u8, String> {
    let entry = bundle::resolve_entry(&options.target).map_err(|e| e.to_string())?;
    let collected = bundle::collect(&entry).map_err(|e| e.to_string())?;
    if let Some(line) = bundle::left_out_line(&collected.ignored) {
        notice(&line);
    }
    if collected.entry_ignored {
        notice(&bundle::entry_ignored_line(&entry.entry_relative_path));
    }
    let app = collected.bundle;
    let api = RunnerApi::new(&options.runner, options.token.clone());
    let capabilities = api.capabilities().await.map_err(|e| e.to_string())?;
    let body = StartSessionRequest {
        bundle: &app,
        env: &options.env,
        ports: options
            .ports
            .iter()
            .map(|(port, protocol)| PortMapping {
                port: *port,
                protocol: if protocol == "udp" {
                    PortProtocol::Udp
                } else {
                    PortProtocol::Tcp
                },
            })
            .collect(),
        config: default_config(&capabilities),
        inspect: options.inspect,
    };
    let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    bundle::check_body_limit(&app, body.len(), options.max_body_bytes)
        .map_err(|e| e.to_string())?;

    let accepted = accept_terms(capabilities.terms.as_ref(), options.accept_terms.as_deref())?;
    let created = match api.create_session(body, accepted.as_deref()).await {
        Ok(created) => created,
        Err(ApiError::TermsRequired { terms }) => {
            if let Some(terms) = &terms {
                show_terms(terms);
            }
            let version = terms.map(|t| t.version).unwrap_or_default();
            return Err(format!(
                "the runner requires accepting its usage terms; run again and answer y, or pass --accept-terms {version}"
            ));
        }
        Err(err) => return Err(err.to_string()),
    };
    let id = created.session_id;
    notice(&format!("telo-runner: session {id} starting"));
    attach(api, id).await
}

/// The terms version to send: given on the command line, or accepted now at
/// the prompt. Nothing is accepted on the user's behalf.
fn accept_terms(
    terms: Option<&RunnerTerms>,
    given: Option<&str>,
) -> Result<Option<String>, String> {
    let Some(terms) = terms else {
        return Ok(given.map(str::to_owned));
    };
    if given == Some(terms.version.as_str()) {
        return Ok(Some(terms.version.clone()));
    }
    show_terms(terms);
    if let Some(other) = given {
        return Err(format!(
            "you accepted terms version {other}, but the runner's terms are version {}; pass --accept-terms {} after reading them",
            terms.version, terms.version
        ));
    }
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "the runner requires accepting its usage terms; pass --accept-terms {} after reading them",
            terms.version
        ));
    }
    eprint!("Accept these terms (version {})? [y/N] ", terms.version);
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| format!("could not read the answer: {e}"))?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(Some(terms.version.clone()))
    } else {
        Err("the usage terms were not accepted; no session was started".to_owned())
    }
}

fn show_terms(terms: &RunnerTerms) {
    notice(&format!(
        "{} (version {})\n\n{}\n",
        terms.title, terms.version, terms.body
    ));
}

/// Why the attach loop ends.
enum Leave {
    /// The session ended with this status.
    Ended(RunStatus),
    /// The user (Ctrl-C twice, a signal) asked to stop it.
    Stop,
    /// The runner closed the socket with 1001: it is going away (a restart)
    /// while the session lives on, to be served by its successor.
    RunnerGone,
}

/// What to say about a session that ended without this client stopping it:
/// a failure's reason, or that a stop came from elsewhere (this client's own
/// stop is announced by [`stop_session`]); nothing for an exit, whose code
/// speaks for itself.
pub fn ended_line(id: &str, status: &RunStatus) -> Option<String> {
    match status {
        RunStatus::Failed { message } => Some(format!("telo-runner: session failed: {message}")),
        RunStatus::Stopped => Some(format!(
            "telo-runner: session {id} was stopped elsewhere (another client or the runner's operator stopped it)"
        )),
        _ => None,
    }
}

/// A runner that goes away with the session still live is restarting: its
/// successor serves the session, which this client does not wait for.
pub fn runner_gone_line(id: &str) -> String {
    format!(
        "telo-runner: the runner went away (restarting or shutting down) while session {id} was still running; reattach with `telo-runner attach {id}`"
    )
}

async fn attach(api: RunnerApi, id: String) -> Result<u8, String> {
    let (lifecycle_sender, mut lifecycle) = mpsc::channel(256);
    let cancel = CancellationToken::new();
    let _stop_tasks = cancel.clone().drop_guard();
    tokio::spawn(events::follow(
        api.clone(),
        id.clone(),
        lifecycle_sender,
        cancel.clone(),
    ));
    let signal_error = |e: std::io::Error| format!("could not watch signals: {e}");
    let mut interrupt = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(signal_error)?;
    let mut window = signal(SignalKind::window_change()).map_err(signal_error)?;

    // Starting: progress on stderr until the workload runs (or never does).
    let mut ended: Option<RunStatus> = None;
    loop {
        tokio::select! {
            report = lifecycle.recv() => match report {
                Some(Lifecycle::Event(event)) => {
                    if let RunEvent::Status { status } = &event {
                        if status.is_terminal() {
                            ended = Some(status.clone());
                            break;
                        }
                        if matches!(status, RunStatus::Running { .. }) {
                            for line in running_lines(status, &api.host()) {
                                notice(&line);
                            }
                            break;
                        }
                    } else if let Some(line) = event_line(&event) {
                        notice(&line);
                    }
                }
                Some(Lifecycle::Lost(message)) => return Err(message),
                None => return Err("lost the runner's event stream".to_owned()),
            },
            _ = interrupt.recv() => return stop_session(&api, &id, &mut lifecycle).await,
            _ = terminate.recv() => return stop_session(&api, &id, &mut lifecycle).await,
            _ = hangup.recv() => return stop_session(&api, &id, &mut lifecycle).await,
        }
    }
    if let Some(status @ RunStatus::Failed { message }) = &ended {
        // A start failure has no output to replay; say why and leave.
        notice(&format!("telo-runner: session failed: {message}"));
        return Ok(exit_code_of(status));
    }

    let raw =
        RawMode::enable().map_err(|e| format!("could not put the terminal in raw mode: {e}"))?;
    let mut stdin = spawn_stdin_reader();
    let mut stdin_open = true;
    let mut ctrl_c = DoubleCtrlC::default();
    let mut last_seq = 0u32;
    let format = api.frame_format().await;
    let mut socket: Option<IoSocket> = None;
    let mut socket_done = false;
    let mut reconnect_at = Some(Instant::now());
    let mut backoff = RECONNECT_FIRST;
    let mut drain_deadline = ended.as_ref().map(|_| Instant::now() + OUTPUT_DRAIN);
    let mut output = Output::stdout();

    let leave = loop {
        if socket_done && let Some(status) = &ended {
            break Leave::Ended(status.clone());
        }
        tokio::select! {
            frame = io::next(&mut socket), if socket.is_some() => match frame {
                Some(Ok(Message::Binary(bytes))) => {
                    if let Some((seq, payload)) = new_output(format, &bytes, last_seq) {
                        last_seq = seq;
                        output.write(payload);
                    }
                }
                Some(Ok(Message::Text(text))) => {
                    if parse_server_message(&text) == ServerMessage::Gap {
                        output.write(GAP_NOTICE);
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    let code = frame.map(|f| u16::from(f.code)).unwrap_or(CLOSE_NO_STATUS);
                    socket = None;
                    if code == CLOSE_GOING_AWAY {
                        break Leave::RunnerGone;
                    }
                    if is_final_close(code) {
                        socket_done = true;
                    } else {
                        reconnect_at = Some(Instant::now() + backoff);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    socket = None;
                    reconnect_at = Some(Instant::now() + backoff);
                }
            },
            _ = sleep_until(reconnect_at), if socket.is_none() && !socket_done => {
                reconnect_at = None;
                match io::connect(&api, &id, last_seq).await {
                    Ok(open) => {
                        socket = Some(open);
                        backoff = RECONNECT_FIRST;
                        // The workload's PTY starts at a default size; tell it ours.
                        if let Some((cols, rows)) = terminal::size() {
                            io::send(&mut socket, resize_frame(cols, rows)).await;
                        }
                    }
                    Err(_) => {
                        reconnect_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(RECONNECT_MAX);
                    }
                }
            },
            bytes = stdin.recv(), if stdin_open => match bytes {
                Some(bytes) => {
                    if ctrl_c.observe(&bytes, std::time::Instant::now()) {
                        break Leave::Stop;
                    }
                    io::send(&mut socket, Message::binary(bytes)).await;
                }
                None => stdin_open = false,
            },
            _ = window.recv() => {
                if let Some((cols, rows)) = terminal::size() {
                    io::send(&mut socket, resize_frame(cols, rows)).await;
                }
            },
            report = lifecycle.recv(), if ended.is_none() => match report {
                Some(Lifecycle::Event(event)) => {
                    if let RunEvent::Status { status } = &event {
                        if status.is_terminal() {
                            ended = Some(status.clone());
                            drain_deadline = Some(Instant::now() + OUTPUT_DRAIN);
                        } else if matches!(status, RunStatus::Running { .. }) {
                            for line in running_lines(status, &api.host()) {
                                notice(&line);
                            }
                        }
                    } else if let Some(line) = event_line(&event) {
                        notice(&line);
                    }
                }
                Some(Lifecycle::Lost(message)) => {
                    drop(raw);
                    return Err(message);
                }
                None => {
                    drop(raw);
                    return Err("lost the runner's event stream".to_owned());
                }
            },
            _ = sleep_until(drain_deadline), if ended.is_some() => {
                if let Some(status) = &ended {
                    break Leave::Ended(status.clone());
                }
            },
            _ = interrupt.recv() => break Leave::Stop,
            _ = terminate.recv() => break Leave::Stop,
            _ = hangup.recv() => break Leave::Stop,
        }
    };
    if let Some(open) = socket.as_mut() {
        let _ = open.close(None).await;
    }
    output.finish();
    drop(raw);
    match leave {
        Leave::Ended(status) => {
            if let Some(line) = ended_line(&id, &status) {
                notice(&line);
            }
            Ok(exit_code_of(&status))
        }
        Leave::Stop => stop_session(&api, &id, &mut lifecycle).await,
        Leave::RunnerGone => {
            notice(&runner_gone_line(&id));
            Ok(EXIT_CLIENT_ERROR)
        }
    }
}

/// DELETE, then the runner's word on how it ended (normally `stopped`).
async fn stop_session(
    api: &RunnerApi,
    id: &str,
    lifecycle: &mut mpsc::Receiver<Lifecycle>,
) -> Result<u8, String> {
    notice(&format!("telo-runner: stopping session {id}"));
    api.stop(id).await.map_err(|e| e.to_string())?;
    let status = tokio::time::timeout(STOP_WAIT, async {
        while let Some(report) = lifecycle.recv().await {
            if let Lifecycle::Event(event) = report
                && let Some(status) = terminal_status(&event)
            {
                return Some(status.clone());
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    let status = status.unwrap_or(RunStatus::Stopped);
    notice(&format!(
        "telo-runner: session {id} {}",
        super::status::status_text(&status)
    ));
    Ok(exit_code_of(&status))
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Stdin on a plain thread: a blocking read cannot be cancelled, and a thread
/// (unlike a runtime blocking task) does not hold up the process's exit.
fn spawn_stdin_reader() -> mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = mpsc::channel(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buffer = [0u8; 4096];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if sender.blocking_send(buffer[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    receiver
}
