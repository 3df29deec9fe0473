//! The kernel debug stream served on `--inspect ADDR` at `GET /events`:
//! Server-Sent Events carrying `@telorun/debug-wire` frames.
//!
//! One `log` frame precedes the scripted `event` frames because the runner
//! must relay event frames only (docs/contract.md §3.4); a stream of events alone could
//! not catch a runner that forwards everything.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use time::OffsetDateTime;

use crate::debug_frames::initial_stream;
use crate::http;
use crate::live_stream::Hub;
use crate::script::DebugEvent;

pub const EVENTS_PATH: &str = "/events";
/// Idle streams get a comment this often so a dead client is noticed (the
/// write fails) and intermediaries do not time the stream out.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_COMMENT: &[u8] = b": keepalive\n\n";
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(10);

/// What a subscriber is sent: a fixed list (a plain run) or the frames
/// published as the generations of `--watch` come and go.
#[derive(Clone)]
enum Source {
    Fixed(Arc<[DebugEvent]>),
    Live(Arc<Hub>),
}

/// Serves the debug stream from a background thread for the rest of the
/// process's life. Each connection gets the full event list again, as a
/// reconnecting relay expects.
pub fn serve(listener: TcpListener, events: Vec<DebugEvent>) -> std::io::Result<()> {
    serve_source(listener, Source::Fixed(events.into()))
}

/// As [`serve`], for the frames published on `hub`: each connection gets
/// every frame published so far, then each new one as it comes.
pub fn serve_live(listener: TcpListener, hub: Arc<Hub>) -> std::io::Result<()> {
    serve_source(listener, Source::Live(hub))
}

fn serve_source(listener: TcpListener, source: Source) -> std::io::Result<()> {
    thread::Builder::new()
        .name("inspect".to_owned())
        .spawn(move || {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let source = source.clone();
                        let _ = thread::Builder::new()
                            .name("inspect-conn".to_owned())
                            .spawn(move || answer(stream, &source));
                    }
                    Err(_) => thread::sleep(ACCEPT_RETRY_DELAY),
                }
            }
        })?;
    Ok(())
}

fn answer(mut stream: TcpStream, source: &Source) {
    let Some(request) = http::read_request_head(&mut stream) else {
        return;
    };
    let response = match (request.method.as_str(), request.path.as_str()) {
        ("GET", EVENTS_PATH) => {
            return match source {
                Source::Fixed(events) => stream_events(stream, events),
                Source::Live(hub) => stream_live(stream, hub),
            };
        }
        (_, EVENTS_PATH) => http::full_response(
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "method not allowed",
        ),
        _ => http::full_response("404 Not Found", "text/plain; charset=utf-8", "not found"),
    };
    let _ = http::respond_and_close(stream, &response);
}

// No Content-Length: the body is the stream and ends when the process does.
const STREAM_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";

fn stream_events(mut stream: TcpStream, events: &[DebugEvent]) {
    // Frames must reach the relay as they are written, not after Nagle's delay.
    let _ = stream.set_nodelay(true);
    let body = initial_stream(OffsetDateTime::now_utc(), events);
    if stream.write_all(STREAM_HEAD.as_bytes()).is_err()
        || stream.write_all(body.as_bytes()).is_err()
    {
        return;
    }
    loop {
        thread::sleep(KEEPALIVE_INTERVAL);
        if stream.write_all(KEEPALIVE_COMMENT).is_err() {
            return;
        }
    }
}

fn stream_live(mut stream: TcpStream, hub: &Hub) {
    let _ = stream.set_nodelay(true);
    if stream.write_all(STREAM_HEAD.as_bytes()).is_err() {
        return;
    }
    let id = hub.subscribe();
    let mut sent = 0;
    loop {
        let written = match hub.frames_after(sent, KEEPALIVE_INTERVAL) {
            Some((frames, count)) => stream.write_all(frames.as_bytes()).map(|()| count),
            None => stream.write_all(KEEPALIVE_COMMENT).map(|()| sent),
        };
        match written {
            Ok(count) => {
                sent = count;
                hub.written(id, sent);
            }
            Err(_) => {
                hub.unsubscribe(id);
                return;
            }
        }
    }
}
