//! The end of one app process of a watch session: by itself, or taken
//! down by the runner (SIGTERM, then SIGKILL after the stop grace period),
//! or past the session's disk bound; and what the session's clients are
//! told of it.

use std::sync::Arc;

use bytes::Bytes;
use runner_api::types::RunPhase;
use runner_api::watch::StreamTag;
use runner_core::SessionSink;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::disk_bound::DiskBound;
use crate::process::OUTPUT_DRAIN_TIMEOUT;
use crate::session::LocalSession;

pub(super) struct AppEnd {
    pub(super) name: String,
    /// Where the runner's own note about the app's end goes: its terminal,
    /// or the stderr of an app on pipes.
    pub(super) note_tag: StreamTag,
    pub(super) process: Arc<LocalSession>,
    pub(super) sink: SessionSink,
    pub(super) teardown: CancellationToken,
    pub(super) exited: oneshot::Receiver<i64>,
    pub(super) output_drained: oneshot::Receiver<()>,
    pub(super) gone: oneshot::Sender<()>,
    /// The session's directory and its bound: an app is taken down while
    /// the directory is past it.
    pub(super) disk: DiskBound,
}

/// How an app process came to its end.
enum AppEnding {
    /// It exited by itself, with this code.
    Exited(i64),
    /// The runner took it down (stop, suspend, a new app set, the end).
    TakenDown,
    /// The session's directory grew past its bound: this many bytes.
    OverDisk(u64),
}

/// Waits for one app process to end — by itself, or taken down by the
/// runner (stop, suspend, a new app set, the session's end) with SIGTERM and
/// then SIGKILL after the grace period. An end of its own closes the app's
/// open generation; the session lives on.
pub(super) async fn follow_app_to_end(end: AppEnd) {
    let AppEnd {
        name,
        note_tag,
        process,
        sink,
        teardown,
        mut exited,
        output_drained,
        gone,
        disk,
    } = end;
    let max_disk = disk.max_bytes;
    let ending = tokio::select! {
        code = &mut exited => AppEnding::Exited(code.unwrap_or(-1)),
        () = teardown.cancelled() => AppEnding::TakenDown,
        used = crate::disk_bound::exceeded(disk) => AppEnding::OverDisk(used),
    };
    if !matches!(ending, AppEnding::Exited(_)) {
        process.terminate_logged("watch app taken down");
        if tokio::time::timeout(process.stop_grace, &mut exited)
            .await
            .is_err()
        {
            process.kill("stop grace period elapsed");
            let _ = exited.await;
        }
    }
    if tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, output_drained)
        .await
        .is_err()
    {
        warn!(app = %name, "terminal still open after a watch app ended");
    }
    process.close_terminal();
    match ending {
        AppEnding::TakenDown => {}
        AppEnding::Exited(code) => {
            // Its relays end with it.
            teardown.cancel();
            if code == 0 {
                sink.app_ended(&name, Some(0), None);
            } else {
                sink.app_ended(
                    &name,
                    None,
                    Some(format!("application process exited (code {code})")),
                );
            }
            sink.app_output(
                &name,
                note_tag,
                Bytes::from(format!("\r\n[runner] app '{name}' exited (code {code}); change its app set or stop the session to start it again\r\n")),
            );
        }
        AppEnding::OverDisk(used) => {
            teardown.cancel();
            let message = crate::disk_bound::app_over_message(&name, used, max_disk);
            warn!(app = %name, used, max_disk, "watch app taken down: the session's directory is past its disk bound");
            // Said where an editor shows it, whether or not the kernel
            // closed its run first on the way down.
            sink.app_progress(&name, RunPhase::Boot, message.clone());
            sink.app_ended(&name, None, Some(message.clone()));
            sink.app_output(
                &name,
                note_tag,
                Bytes::from(format!("\r\n[runner] {message}\r\n")),
            );
        }
    }
    let _ = gone.send(());
}
