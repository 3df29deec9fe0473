//! `telo-runner sessions` and `telo-runner stop`.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::api::RunnerApi;
use super::events::{self, Lifecycle, terminal_status};
use super::status::{session_table, status_text};

pub async fn list(api: &RunnerApi) -> Result<String, String> {
    let sessions = api.sessions().await.map_err(|e| e.to_string())?;
    Ok(session_table(&sessions))
}

/// The runner's session list as JSON, for scripts.
pub async fn list_json(api: &RunnerApi) -> Result<String, String> {
    let sessions = api.sessions_json().await.map_err(|e| e.to_string())?;
    serde_json::to_string_pretty(&sessions).map_err(|e| e.to_string())
}

/// Stops `id` and waits for its terminal status; returns that status as text.
pub async fn stop(api: &RunnerApi, id: &str, timeout: Duration) -> Result<String, String> {
    let summary = api.session(id).await.map_err(|e| e.to_string())?;
    if summary.status.is_terminal() {
        return Ok(format!(
            "session {id} already ended: {}",
            status_text(&summary.status)
        ));
    }
    let (sender, mut receiver) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    // Subscribe before stopping so the terminal status cannot slip past.
    let follower = tokio::spawn(events::follow(
        api.clone(),
        id.to_owned(),
        sender,
        cancel.clone(),
    ));
    let _stop_follower = cancel.clone().drop_guard();
    api.stop(id).await.map_err(|e| e.to_string())?;
    let waited = tokio::time::timeout(timeout, async {
        while let Some(report) = receiver.recv().await {
            match report {
                Lifecycle::Event(event) => {
                    if let Some(status) = terminal_status(&event) {
                        return Ok(status.clone());
                    }
                }
                Lifecycle::Lost(message) => return Err(message),
            }
        }
        Err("the event stream ended without a terminal status".to_owned())
    })
    .await;
    cancel.cancel();
    let _ = follower.await;
    match waited {
        Ok(Ok(status)) => Ok(format!("session {id} {}", status_text(&status))),
        Ok(Err(message)) => Err(message),
        Err(_) => Err(format!(
            "session {id} did not stop within {}s",
            timeout.as_secs()
        )),
    }
}
