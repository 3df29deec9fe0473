//! Relays a kernel's debug stream (SSE at `http://<addr>/events`) as parsed
//! JSON frames. The kernel may not be listening yet when the session starts, so
//! the relay retries until it is stopped.

use std::time::Duration;

use futures_util::StreamExt;
use runner_api::sse::SseParser;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub const RETRY_DELAY: Duration = Duration::from_millis(500);

/// Relay frames from `url` to `on_frame` until `stop` fires.
pub async fn relay_debug_stream(
    client: reqwest::Client,
    url: String,
    mut on_frame: impl FnMut(Value) + Send,
    stop: CancellationToken,
) {
    let relay = async {
        loop {
            if let Err(err) = relay_once(&client, &url, &mut on_frame).await {
                debug!(%url, error = %err, "debug stream unavailable, retrying");
            }
            tokio::time::sleep(RETRY_DELAY).await;
        }
    };
    tokio::select! {
        () = relay => {}
        () = stop.cancelled() => {}
    }
}

async fn relay_once(
    client: &reqwest::Client,
    url: &str,
    on_frame: &mut (impl FnMut(Value) + Send),
) -> Result<(), reqwest::Error> {
    let response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await?
        .error_for_status()?;
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
