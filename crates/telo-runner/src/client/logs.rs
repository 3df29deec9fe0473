//! `telo-runner logs <id> [--follow]`: a session's output, read-only.
//!
//! The output is read from the session's io socket (docs/contract.md §5), not from
//! its event stream: the event stream carries lifecycle events only, never
//! output. Every output frame carries its seq, so a frame already printed is
//! dropped and a reconnect resumes with `?lastSeq=` at the next one: each
//! chunk is printed exactly once, in order. Nothing is ever sent on the
//! socket but one ping (no stdin, no resize), and the session is never
//! stopped: Ctrl-C ends only this client.
//!
//! Without `--follow` the output so far is what the runner replays on
//! connect. The runner answers a ping only after that replay (it reads what
//! the client sent once the replay is out), so the pong marks its end; a
//! finished session's socket closes after its replay instead.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use runner_api::io::{
    CLOSE_GOING_AWAY, CLOSE_NO_STATUS, CLOSE_NORMAL, CLOSE_NOTHING_TO_REPLAY,
    CLOSE_SESSION_NOT_FOUND, CLOSE_UNAUTHORIZED, FrameFormat, ServerMessage, is_final_close,
    parse_server_message,
};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use super::api::{ApiError, RunnerApi};
use super::io::{self, GAP_NOTICE, IoSocket, new_output};
use super::output::Output;
use super::run::{EXIT_CLIENT_ERROR, ended_line, runner_gone_line};
use super::status::exit_code_of;
use super::terminal::notice;

/// Reconnect backoff after a dropped socket, as `attach`'s.
const RECONNECT_FIRST: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(10);
/// Connection attempts in a row that may fail before the runner counts as gone.
const MAX_CONNECT_FAILURES: u32 = 20;
/// A runner that answers no ping: the replay is taken to be over after this
/// long without a frame.
const REPLAY_QUIET: Duration = Duration::from_secs(2);
/// The exit code when Ctrl-C ends the client, as a shell reports it.
const EXIT_INTERRUPTED: u8 = 130;
/// The ping's payload, so its pong is recognised.
const REPLAY_MARK: &[u8] = b"telo-runner logs: end of replay";

/// Prints `id`'s output (to its end with `follow`); returns the exit code.
pub async fn logs(api: RunnerApi, id: String, follow: bool) -> u8 {
    if let Err(err) = api.session(&id).await {
        notice(&known_error_line(&api, &id, &err));
        return EXIT_CLIENT_ERROR;
    }
    // The handler is in place before the first byte is printed: a Ctrl-C
    // from someone who saw output always ends this client with its code.
    let mut interrupt = match signal(SignalKind::interrupt()) {
        Ok(interrupt) => interrupt,
        Err(e) => {
            notice(&format!("telo-runner: could not watch signals: {e}"));
            return EXIT_CLIENT_ERROR;
        }
    };
    let mut output = Output::stdout();
    let outcome = tokio::select! {
        outcome = read_output(&api, &id, follow, &mut output) => outcome,
        _ = interrupt.recv() => Ok(Ending::Interrupted),
    };
    output.finish();
    match outcome {
        Ok(Ending::ReplayDone) => 0,
        Ok(Ending::Interrupted) => EXIT_INTERRUPTED,
        Ok(Ending::SessionEnded) if follow => session_exit_code(&api, &id).await,
        Ok(Ending::SessionEnded) => 0,
        Ok(Ending::RunnerGone) => {
            notice(&runner_gone_line(&id));
            EXIT_CLIENT_ERROR
        }
        Err(message) => {
            notice(&format!("telo-runner: {message}"));
            EXIT_CLIENT_ERROR
        }
    }
}

/// Why the output ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Without `--follow`: everything printed so far has been shown.
    ReplayDone,
    /// The session is over and all its output has been shown.
    SessionEnded,
    /// The runner closed with 1001 while the session lived on.
    RunnerGone,
    Interrupted,
}

/// What the client says when `GET /v1/sessions/:id` fails: an unknown id is
/// named, with where to find the known ones.
pub fn known_error_line(api: &RunnerApi, id: &str, err: &ApiError) -> String {
    match err {
        ApiError::Http {
            status: StatusCode::NOT_FOUND,
            ..
        } => format!("telo-runner: {}", unknown_session(&api.base, id)),
        other => format!("telo-runner: {other}"),
    }
}

fn unknown_session(base: &str, id: &str) -> String {
    format!(
        "the runner at {base} has no session '{id}'; `telo-runner sessions` lists the ones it has"
    )
}

/// What one close code means for the reader.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Closed {
    /// The session ended and its output is drained (or there was none).
    SessionEnded,
    RunnerGone,
    Fatal(String),
    /// A dropped connection: reconnect and resume.
    Reconnect,
}

fn closed(code: u16, id: &str, base: &str) -> Closed {
    match code {
        CLOSE_NORMAL | CLOSE_NOTHING_TO_REPLAY => Closed::SessionEnded,
        CLOSE_GOING_AWAY => Closed::RunnerGone,
        CLOSE_SESSION_NOT_FOUND => Closed::Fatal(unknown_session(base, id)),
        CLOSE_UNAUTHORIZED => Closed::Fatal(
            "the runner refused the output stream without a valid token; pass --token or set TELO_RUNNER_TOKEN".to_owned(),
        ),
        code if is_final_close(code) => Closed::Fatal(format!(
            "the runner closed the output stream (code {code})"
        )),
        _ => Closed::Reconnect,
    }
}

/// Reads the socket, reconnecting after drops, until the output ends.
async fn read_output(
    api: &RunnerApi,
    id: &str,
    follow: bool,
    output: &mut Output,
) -> Result<Ending, String> {
    let mut last_seq = 0u32;
    let format = api.frame_format().await;
    let mut failures = 0u32;
    let mut backoff = RECONNECT_FIRST;
    loop {
        let mut socket = match io::connect(api, id, last_seq).await {
            Ok(socket) => socket,
            Err(err) => {
                failures += 1;
                if failures >= MAX_CONNECT_FAILURES {
                    return Err(format!("lost the runner's output stream: {err}"));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        failures = 0;
        backoff = RECONNECT_FIRST;
        if !follow {
            // A failed send shows up as a dropped read next, which reconnects.
            let _ = socket
                .send(Message::Ping(Bytes::from_static(REPLAY_MARK)))
                .await;
        }
        match read_socket(&mut socket, format, follow, &mut last_seq, output).await {
            SocketEnd::ReplayDone => {
                let _ = socket.close(None).await;
                return Ok(Ending::ReplayDone);
            }
            SocketEnd::Closed(code) => match closed(code, id, &api.base) {
                Closed::SessionEnded => return Ok(Ending::SessionEnded),
                Closed::RunnerGone => return Ok(Ending::RunnerGone),
                Closed::Fatal(message) => return Err(message),
                Closed::Reconnect => {}
            },
            SocketEnd::Dropped => {}
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

/// How one connection ended.
enum SocketEnd {
    ReplayDone,
    Closed(u16),
    Dropped,
}

async fn read_socket(
    socket: &mut IoSocket,
    format: FrameFormat,
    follow: bool,
    last_seq: &mut u32,
    output: &mut Output,
) -> SocketEnd {
    let mut quiet_until = Instant::now() + REPLAY_QUIET;
    loop {
        let frame = tokio::select! {
            frame = socket.next() => frame,
            () = tokio::time::sleep_until(quiet_until), if !follow => return SocketEnd::ReplayDone,
        };
        quiet_until = Instant::now() + REPLAY_QUIET;
        match frame {
            Some(Ok(Message::Binary(bytes))) => {
                if let Some((seq, payload)) = new_output(format, &bytes, *last_seq) {
                    *last_seq = seq;
                    output.write(payload);
                }
            }
            Some(Ok(Message::Text(text))) => {
                if parse_server_message(&text) == ServerMessage::Gap {
                    output.write(GAP_NOTICE);
                }
            }
            Some(Ok(Message::Pong(payload))) if !follow && payload == REPLAY_MARK => {
                return SocketEnd::ReplayDone;
            }
            Some(Ok(Message::Close(frame))) => {
                return SocketEnd::Closed(
                    frame.map(|f| u16::from(f.code)).unwrap_or(CLOSE_NO_STATUS),
                );
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return SocketEnd::Dropped,
        }
    }
}

/// The exit code of a session whose output ended: its status as the runner
/// reports it now (terminal, since the socket closed as it does at the end).
async fn session_exit_code(api: &RunnerApi, id: &str) -> u8 {
    let status = match api.session(id).await {
        Ok(summary) => summary.status,
        Err(err) => {
            notice(&known_error_line(api, id, &err));
            return EXIT_CLIENT_ERROR;
        }
    };
    if let Some(line) = ended_line(id, &status) {
        notice(&line);
    }
    exit_code_of(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes_end_resume_or_fail_the_output() {
        let base = "http://r";
        assert_eq!(closed(1000, "s", base), Closed::SessionEnded);
        assert_eq!(closed(4410, "s", base), Closed::SessionEnded);
        assert_eq!(closed(1001, "s", base), Closed::RunnerGone);
        assert_eq!(closed(1006, "s", base), Closed::Reconnect);
        assert_eq!(closed(1011, "s", base), Closed::Reconnect);
        assert!(
            matches!(closed(4404, "s", base), Closed::Fatal(m) if m.contains("no session 's'"))
        );
        assert!(matches!(closed(4401, "s", base), Closed::Fatal(m) if m.contains("--token")));
    }

    #[test]
    fn an_unknown_session_is_named_with_where_to_look() {
        assert_eq!(
            unknown_session("http://127.0.0.1:8061", "abc"),
            "the runner at http://127.0.0.1:8061 has no session 'abc'; `telo-runner sessions` lists the ones it has"
        );
    }
}
