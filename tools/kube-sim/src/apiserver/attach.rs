//! `pods/attach` over WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`):
//! channel 0 stdin, 1 stdout, 2 stderr, 3 error/status, 4 terminal resize,
//! 255 stream close (v5). The container's live output is relayed; stdin
//! and resizes go to the process.
//!
//! As on a real cluster, the stream carries output only from some moment
//! after the client got its `101`: the apiserver answers the upgrade (and
//! sends the empty frame that announces the connection), then dials the
//! kubelet, which has the runtime attach to the container. Output written in
//! between is in the container log and in no attach.
//!
//! Whether the attach has a TTY is the container's own setting (`tty` in
//! its spec), whatever the request says, as the kubelet decides it: a
//! request asking for a TTY has its stderr dropped (everything would come on
//! stdout), so attaching to a container without one that way shows stdout
//! only; and stderr asked for apart from a container that has a TTY is
//! refused by the runtime — the upgrade succeeds, then a `Failure` status
//! ends the stream. Without a TTY, stdout and stderr come apart on channels
//! 1 and 2, and resizes do nothing.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::extract::Request;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::oneshot;

use super::ApiContext;
use super::logs::pick_container;
use super::request::{Query, ResourcePath};
use crate::errors::ApiError;
use crate::kubelet::streams::{ContainerStreams, StdinMsg, StreamKind};

pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";
const SUPPORTED: &[&str] = &[
    V5,
    V4,
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

#[derive(Debug, Clone, Copy)]
struct Options {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

pub async fn handle(
    ctx: Arc<ApiContext>,
    target: ResourcePath,
    query: Query,
    req: Request,
) -> Response {
    match prepare(ctx, target, query, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn prepare(
    ctx: Arc<ApiContext>,
    target: ResourcePath,
    query: Query,
    req: Request,
) -> Result<Response, ApiError> {
    let name = target.name.clone().unwrap_or_default();
    let pod = ctx.registry.get(target.res, target.ns(), &name)?;
    let container = pick_container(&pod.value, query.get("container"))?;
    let opts = Options {
        stdin: query.flag("stdin"),
        stdout: query.flag("stdout"),
        stderr: query.flag("stderr"),
        tty: query.flag("tty"),
    };
    if !opts.stdin && !opts.stdout && !opts.stderr {
        return Err(ApiError::bad_request(
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    let opts = kubelet_options(opts);
    let offered: Vec<String> = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|p| p.trim().to_string()))
        .collect();
    let (mut parts, _body) = req.into_parts();
    let ws = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|_| ApiError::bad_request("Upgrade request required"))?;
    let Some(protocol) = offered
        .iter()
        .find(|p| SUPPORTED.contains(&p.as_str()))
        .cloned()
    else {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: no supported subprotocol (offered {offered:?}, supported {SUPPORTED:?})"
        )));
    };
    let streams = ctx
        .kubelet
        .container_streams(pod.uid(), &container, false)
        .filter(|s| !s.is_closed())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to upgrade connection: container not found ({container:?})"
            ))
        })?;
    let v5 = protocol == V5;
    Ok(ws
        .protocols([protocol])
        .on_upgrade(move |socket| session(ctx, socket, streams, opts, v5)))
}

/// What the kubelet makes of the request's options: with a TTY asked for,
/// stderr is dropped (a TTY has one output).
fn kubelet_options(mut opts: Options) -> Options {
    if opts.tty && opts.stderr {
        opts.stderr = false;
    }
    opts
}

/// Why the runtime refuses to attach with `opts` to a container whose TTY
/// setting is `tty` (which is what the attach gets, not `opts.tty`).
fn runtime_refusal(opts: Options, tty: bool) -> Option<&'static str> {
    if tty && opts.stderr {
        Some("tty and stderr cannot both be true")
    } else if !opts.stdin && !opts.stdout && !opts.stderr {
        Some("one of stdin, stdout, and stderr must be set")
    } else {
        None
    }
}

/// The status that ends an attach the kubelet could not make.
fn failure_status(reason: &str) -> serde_json::Value {
    let message = format!("Internal error occurred: unable to upgrade connection: {reason}");
    json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "details": {"causes": [{"message": format!("unable to upgrade connection: {reason}")}]},
        "code": 500,
    })
}

/// A normal closure: clients treat it as end-of-stream on every channel
/// (a close without a status code reads as an error).
fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: close_code::NORMAL,
        reason: "".into(),
    }))
}

/// Aborts the task when the attach session is over.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::Binary(Bytes::from(v))
}

async fn session(
    ctx: Arc<ApiContext>,
    socket: WebSocket,
    streams: Arc<ContainerStreams>,
    opts: Options,
    v5: bool,
) {
    let (mut tx, mut rx) = socket.split();
    // Output is read from the container's log by sequence number rather than
    // from a bounded fan-out: a slow attach client falls behind and catches
    // up, like a client of the real runtime, instead of silently losing
    // chunks. It starts at what was written after the attach request.
    let mut log_seq = streams.subscribe_log();
    let mut stream_epoch = ctx.faults.stream_epoch();
    let shutdown = ctx.shutdown.clone();
    // The apiserver announces the connection with an empty frame on the
    // lowest writable channel.
    let first = if opts.stdout {
        STDOUT
    } else if opts.stderr {
        STDERR
    } else {
        ERROR
    };
    if tx.send(frame(first, &[])).await.is_err() {
        return;
    }
    // The kubelet is dialled and the runtime attaches: from now on.
    let delay = ctx.attach_delay.mul_f64(rand::random::<f64>());
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(reason) = runtime_refusal(opts, streams.tty) {
        let status = failure_status(reason);
        let _ = tx.send(frame(ERROR, status.to_string().as_bytes())).await;
        let _ = tx.send(normal_close()).await;
        return;
    }
    let (_, mut cursor, _) = streams.read_from(u64::MAX);

    // A container that ended before the runtime attached changes its log no
    // more: look once at once, or the stream would wait forever for a change
    // that never comes (a real runtime ends the attach of an exited
    // container).
    log_seq.mark_changed();
    // With a TTY everything arrives on stdout (and no stderr is attached).
    let wants = |kind: StreamKind| match kind {
        StreamKind::Stdout => opts.stdout.then_some(STDOUT),
        StreamKind::Stderr => opts.stderr.then_some(STDERR),
    };
    // The client's frames are read by a task of their own, as the
    // apiserver's stream copies run side by side: a client that is not
    // reading its output (its own input blocked behind ours) still has its
    // stdin taken, and output waiting on a slow client does not stop input.
    let (gone_tx, mut client_gone) = oneshot::channel::<()>();
    let input = {
        let streams = streams.clone();
        tokio::spawn(async move {
            let _gone = gone_tx;
            while let Some(msg) = rx.next().await {
                match msg {
                    Ok(Message::Binary(b)) if !b.is_empty() => match b[0] {
                        STDIN if opts.stdin => {
                            streams.write_stdin(StdinMsg::Data(b.slice(1..))).await
                        }
                        RESIZE => {
                            if let Ok(size) = serde_json::from_slice::<serde_json::Value>(&b[1..]) {
                                let w = size.get("Width").and_then(|v| v.as_u64()).unwrap_or(80);
                                let h = size.get("Height").and_then(|v| v.as_u64()).unwrap_or(24);
                                streams.resize(
                                    w.min(u16::MAX as u64) as u16,
                                    h.min(u16::MAX as u64) as u16,
                                );
                            }
                        }
                        CLOSE if v5 && b.get(1) == Some(&STDIN) => {
                            streams.write_stdin(StdinMsg::Close).await
                        }
                        _ => {}
                    },
                    Ok(Message::Close(_)) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
    };
    let _input = AbortOnDrop(input);
    loop {
        tokio::select! {
            changed = log_seq.changed() => {
                let (chunks, next, closed) = streams.read_from(cursor);
                cursor = next;
                for chunk in chunks {
                    if let Some(ch) = wants(chunk.stream)
                        && tx.send(frame(ch, &chunk.data)).await.is_err()
                    {
                        return;
                    }
                }
                if changed.is_err() || closed {
                    // Everything written was relayed; report the end.
                    break;
                }
            }
            _ = &mut client_gone => return,
            _ = stream_epoch.changed() => {
                let _ = tx.send(normal_close()).await;
                return;
            }
            _ = shutdown.cancelled() => {
                let _ = tx.send(normal_close()).await;
                return;
            }
        }
    }
    let status = json!({"metadata": {}, "status": "Success"});
    let _ = tx.send(frame(ERROR, status.to_string().as_bytes())).await;
    let _ = tx.send(normal_close()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Options {
        Options {
            stdin,
            stdout,
            stderr,
            tty,
        }
    }

    #[test]
    fn the_containers_tty_decides_and_a_tty_request_drops_stderr() {
        // A TTY asked for: stderr is dropped, whatever the container has.
        let asked_tty = kubelet_options(opts(true, true, true, true));
        assert!(!asked_tty.stderr && asked_tty.stdout && asked_tty.stdin);
        assert_eq!(runtime_refusal(asked_tty, false), None);
        assert_eq!(runtime_refusal(asked_tty, true), None);
        // Stdout and stderr apart: fine without a TTY, refused with one.
        let apart = kubelet_options(opts(true, true, true, false));
        assert!(apart.stderr);
        assert_eq!(runtime_refusal(apart, false), None);
        assert_eq!(
            runtime_refusal(apart, true),
            Some("tty and stderr cannot both be true")
        );
        // Only stderr, with a TTY asked for: nothing is left to attach.
        let nothing = kubelet_options(opts(false, false, true, true));
        assert_eq!(
            runtime_refusal(nothing, false),
            Some("one of stdin, stdout, and stderr must be set")
        );
    }

    #[test]
    fn a_refused_attach_ends_with_an_internal_error_status() {
        let status = failure_status("tty and stderr cannot both be true");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["code"], 500);
        assert_eq!(status["reason"], "InternalError");
        assert_eq!(
            status["message"],
            "Internal error occurred: unable to upgrade connection: tty and stderr cannot both be true"
        );
    }
}
