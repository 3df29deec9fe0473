//! Relays a kernel's debug stream (SSE at `/events` of its `--inspect`
//! port) as parsed JSON frames. The kernel may not be listening yet when the
//! session starts, so the relay retries until it is stopped: soon at first
//! (a kernel opens its debug port moments after it starts, and `running` may
//! wait for it), then less often.

use std::time::Duration;

use axum::body::Body;
use http::{Request, header};
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use runner_api::sse::SseParser;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::reach::Reach;

/// The first and the longest wait between two attempts; each failed
/// attempt doubles the wait, a stream that was open starts it over.
pub const RETRY_DELAY: (Duration, Duration) =
    (Duration::from_millis(20), Duration::from_millis(500));

/// Why one attempt at the stream ended.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("could not connect: {0}")]
    Connect(#[from] std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("the kernel answered {0}")]
    Status(http::StatusCode),
}

/// Relay frames from the kernel's debug port `port` at `reach` to
/// `on_frame` until `stop` fires.
pub async fn relay_debug_stream(
    reach: Reach,
    port: u16,
    mut on_frame: impl FnMut(Value) + Send,
    stop: CancellationToken,
) {
    let relay = async {
        let mut wait = RETRY_DELAY.0;
        loop {
            let mut connected = false;
            if let Err(err) = relay_once(&reach, port, &mut connected, &mut on_frame).await {
                debug!(address = %reach.describe(port), error = %err, "debug stream unavailable, retrying");
            }
            if connected {
                wait = RETRY_DELAY.0;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RETRY_DELAY.1);
        }
    };
    tokio::select! {
        () = relay => {}
        () = stop.cancelled() => {}
    }
}

/// One stream, until it ends; `connected` is set once the kernel answered.
async fn relay_once(
    reach: &Reach,
    port: u16,
    connected: &mut bool,
    on_frame: &mut (impl FnMut(Value) + Send),
) -> Result<(), RelayError> {
    let stream = reach.connect(port).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await?;
    let request = Request::get("/events")
        .header(header::HOST, format!("127.0.0.1:{port}"))
        .header(header::ACCEPT, "text/event-stream")
        .body(Body::empty())
        .expect("a static request is valid");
    let exchange = async {
        let response = sender.send_request(request).await?;
        if !response.status().is_success() {
            return Err(RelayError::Status(response.status()));
        }
        *connected = true;
        let mut body = response.into_body();
        let mut parser = SseParser::new(MAX_FRAME_BYTES);
        while let Some(frame) = body.frame().await {
            let Ok(chunk) = frame?.into_data() else {
                continue;
            };
            for data in parser.push(&chunk).into_iter().filter_map(|f| f.data) {
                if let Ok(frame) = serde_json::from_str::<Value>(&data) {
                    on_frame(frame);
                }
            }
        }
        Ok(())
    };
    // The connection is driven beside the exchange; once it is done, what
    // it read is still taken from the body to its end.
    let mut exchange = std::pin::pin!(exchange);
    let mut connection = std::pin::pin!(connection);
    let mut driving = true;
    loop {
        tokio::select! {
            biased;
            result = &mut exchange => return result,
            result = &mut connection, if driving => {
                driving = false;
                result?;
            }
        }
    }
}

/// The largest debug frame relayed. A kernel's frames are a few KiB; one that
/// never ends (a hostile or broken kernel) must not grow the runner's memory
/// or its CPU time without bound: past this the frame is dropped, and the
/// parser skips to the next frame boundary.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
