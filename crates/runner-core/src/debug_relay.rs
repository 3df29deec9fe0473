//! Relays a kernel's debug stream (SSE at `http://<addr>/events`) as parsed
//! JSON frames. The kernel may not be listening yet when the session starts, so
//! the relay retries until it is stopped: soon at first (a kernel opens its
//! debug port moments after it starts, and `running` may wait for it), then
//! less often.

use std::time::Duration;

use futures_util::StreamExt;
use runner_api::sse::SseParser;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// The first and the longest wait between two attempts; each failed
/// attempt doubles the wait, a stream that was open starts it over.
pub const RETRY_DELAY: (Duration, Duration) =
    (Duration::from_millis(20), Duration::from_millis(500));

/// Relay frames from `url` to `on_frame` until `stop` fires.
pub async fn relay_debug_stream(
    client: reqwest::Client,
    url: String,
    mut on_frame: impl FnMut(Value) + Send,
    stop: CancellationToken,
) {
    let relay = async {
        let mut wait = RETRY_DELAY.0;
        loop {
            let mut connected = false;
            if let Err(err) = relay_once(&client, &url, &mut connected, &mut on_frame).await {
                debug!(%url, error = %err, "debug stream unavailable, retrying");
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
    client: &reqwest::Client,
    url: &str,
    connected: &mut bool,
    on_frame: &mut (impl FnMut(Value) + Send),
) -> Result<(), reqwest::Error> {
    let response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await?
        .error_for_status()?;
    *connected = true;
    let mut body = response.bytes_stream();
    let mut parser = SseParser::new(MAX_FRAME_BYTES);
    while let Some(chunk) = body.next().await {
        for data in parser.push(&chunk?).into_iter().filter_map(|f| f.data) {
            if let Ok(frame) = serde_json::from_str::<Value>(&data) {
                on_frame(frame);
            }
        }
    }
    Ok(())
}

/// The largest debug frame relayed. A kernel's frames are a few KiB; one that
/// never ends (a hostile or broken kernel) must not grow the runner's memory
/// or its CPU time without bound: past this the frame is dropped, and the
/// parser skips to the next frame boundary.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
