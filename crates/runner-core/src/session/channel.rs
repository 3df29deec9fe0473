//! One app's byte channel (its replay buffer and sequence numbers) and its
//! run projection: the generations the kernel reports on its debug stream,
//! turned into `run` events (docs/contract.md §7.8).

use std::sync::Arc;

use bytes::Bytes;
use runner_api::types::{PortMapping, RunOutcome, RunRecord};
use runner_api::watch::{AppSnapshot, IoMode, RunTrigger, StreamTag};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{MAX_OUTPUT_CHUNK_BYTES, SessionApp};
use crate::backend_session::OutputMarks;
use crate::kernel_progress::ResolutionScanner;
use crate::replay::ReplayBuffer;

/// One recorded output chunk and the stream it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    pub tag: StreamTag,
    pub bytes: Bytes,
}

pub struct AppChannel {
    pub(crate) name: String,
    /// `name`, shared by the shipments of its output (several replicas).
    pub(crate) shared_name: Arc<str>,
    pub(crate) io: IoMode,
    pub(crate) ports: Vec<PortMapping>,
    pub(crate) output: ReplayBuffer<OutputChunk>,
    /// The newest sequence number; subscribers wait on it.
    pub(crate) seq: Arc<watch::Sender<u64>>,
    pub(crate) run: RunProjection,
    /// The kernel's controller resolution lines in its output.
    pub(crate) resolution: ResolutionScanner,
    /// Bytes recorded, from the workload's first byte.
    pub(crate) written: u64,
    /// Whether `written` still counts the workload's output exactly
    /// (nothing lost, nothing of the runner's own added).
    pub(crate) exact: bool,
    /// The previous owner's frames, when the session was handed over.
    pub(crate) carried: Carried,
}

impl AppChannel {
    pub(crate) fn new(app: &SessionApp, replay_buffer_bytes: usize, first_output: u64) -> Self {
        Self {
            name: app.name.clone(),
            shared_name: Arc::from(app.name.as_str()),
            io: app.io,
            ports: app.ports.clone(),
            output: ReplayBuffer::starting_at(replay_buffer_bytes, first_output),
            seq: Arc::new(watch::Sender::new(first_output - 1)),
            run: RunProjection {
                kernel: app.telo.clone(),
                ..RunProjection::default()
            },
            resolution: ResolutionScanner::default(),
            written: 0,
            exact: true,
            carried: Carried::Nothing,
        }
    }

    /// Records `chunk` as one frame, or several: one longer than
    /// [`MAX_OUTPUT_CHUNK_BYTES`] is split, and so is one a mark of the
    /// previous owner's falls inside. Returns the last frame's seq.
    pub(crate) fn record(&mut self, tag: StreamTag, mut chunk: Bytes) -> u64 {
        let whole = chunk.len() <= MAX_OUTPUT_CHUNK_BYTES
            && self
                .next_mark_end()
                .is_none_or(|end| end >= self.written + chunk.len() as u64);
        if whole {
            return self.push(tag, chunk);
        }
        let mut last = 0;
        while !chunk.is_empty() {
            let mut take = chunk.len().min(MAX_OUTPUT_CHUNK_BYTES);
            if let Some(end) = self.next_mark_end() {
                take = take.min(usize::try_from(end - self.written).unwrap_or(usize::MAX));
            }
            // Copied, so evicting one piece frees its memory.
            let piece = Bytes::copy_from_slice(&chunk.split_to(take));
            last = self.push(tag, piece);
        }
        last
    }

    fn push(&mut self, tag: StreamTag, bytes: Bytes) -> u64 {
        let size = bytes.len();
        let id = self.output.push(OutputChunk { tag, bytes }, size);
        self.written += size as u64;
        self.line_up(id);
        id
    }

    /// Output was lost here (or the runner wrote its own): the byte count
    /// no longer says where the workload's output is.
    pub(crate) fn lose_count(&mut self) {
        self.exact = false;
        if matches!(self.carried, Carried::LiningUp { .. }) {
            self.carried = Carried::Failed;
        }
    }

    /// Takes the previous owner's marks; only before anything is recorded.
    pub(crate) fn carry(&mut self, marks: OutputMarks) {
        if self.written == 0 && !marks.points.is_empty() {
            self.carried = Carried::LiningUp {
                marks,
                found: Vec::new(),
            };
        }
    }

    /// The seq of this owner's first frame.
    pub(crate) fn output_first_id(&self) -> u64 {
        self.output.first_id()
    }

    /// Gives back the output ring's spare slots and the ports list's room.
    pub(crate) fn release_spare_capacity(&mut self) {
        self.output.shrink_to_fit();
        self.ports.shrink_to_fit();
        self.name.shrink_to_fit();
        self.resolution.release_spare_capacity();
    }

    pub(crate) fn snapshot(&self) -> AppSnapshot {
        AppSnapshot {
            name: self.name.clone(),
            io: self.io,
            generation: self.run.generation,
            ports: self.ports.clone(),
        }
    }
}

/// What a channel knows of the previous owner's frames.
#[derive(Debug, Default)]
pub(crate) enum Carried {
    #[default]
    Nothing,
    /// This owner's output has not reached the last mark yet.
    LiningUp {
        marks: OutputMarks,
        /// `(old seq, this owner's seq)` for the marks passed so far.
        found: Vec<(u64, u64)>,
    },
    /// `(old seq, this owner's seq)` of frames ending at the same byte.
    LinedUp(Vec<(u64, u64)>),
    /// The marks did not fit this owner's output.
    Failed,
}

/// The debug-stream events a generation's life is read from.
pub const KERNEL_STARTING: &str = "Kernel.Starting";
pub const KERNEL_RUN_FAILED: &str = "Kernel.RunFailed";

/// An app's generations as the kernel reported them.
#[derive(Debug, Default)]
pub struct RunProjection {
    /// Generations started so far.
    pub(crate) generation: u64,
    /// When the open generation started; `None` when none is open.
    open_since: Option<Instant>,
    /// Why the next generation starts, when the runner caused it.
    pending: Option<RunTrigger>,
    /// The release the runner runs the app with (what it chose, or what
    /// the backend read off the kernel): a kernel whose `Kernel.Starting`
    /// names no version (before 0.95) is reported with it.
    pub(crate) kernel: Option<String>,
}

impl RunProjection {
    /// The next generation starts because of `trigger` (a reload, a resume).
    pub(crate) fn attribute(&mut self, trigger: RunTrigger) {
        self.pending = Some(trigger);
    }

    /// The `run` events a kernel debug frame means for app `app`.
    pub(crate) fn observe(&mut self, app: &str, frame: &Value) -> Vec<RunRecord> {
        let event = frame.get("event").and_then(Value::as_str);
        let payload = frame.get("payload");
        match event {
            Some(KERNEL_STARTING) => {
                let telo = payload
                    .and_then(|p| p.get("telo"))
                    .and_then(Value::as_str)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
                    .or_else(|| self.kernel.clone());
                let mut records = Vec::new();
                // A start without the previous generation's stop (a kernel
                // that died and was restarted under it) closes that one.
                if self.open_since.is_some() {
                    records.extend(
                        self.finish(
                            app,
                            RunOutcome::Failed {
                                reason:
                                    "the kernel started a new generation before this one stopped"
                                        .to_owned(),
                            },
                        ),
                    );
                }
                records.push(self.start(app, telo));
                records
            }
            Some(super::KERNEL_STOPPED) => {
                let code = payload
                    .and_then(|p| p.get("exitCode"))
                    .and_then(super::sink::js_integer)
                    .unwrap_or(0);
                self.complete(app, code).into_iter().collect()
            }
            Some(KERNEL_RUN_FAILED) => {
                let text = |key: &str| {
                    payload
                        .and_then(|p| p.get(key))
                        .and_then(Value::as_str)
                        .filter(|v| !v.is_empty())
                        .map(str::to_owned)
                };
                let reason = text("code")
                    .or_else(|| text("message"))
                    .unwrap_or_else(|| "run failed".to_owned());
                let mut records = Vec::new();
                // A load failure opens and fails its generation; a start
                // failure fails the one already open.
                if self.open_since.is_none() {
                    records.push(self.start(app, None));
                }
                records.extend(self.finish(app, RunOutcome::Failed { reason }));
                records
            }
            _ => Vec::new(),
        }
    }

    /// The app's workload ended by itself (a crash, an exit): the open
    /// generation ends with it.
    pub(crate) fn workload_ended(
        &mut self,
        app: &str,
        code: Option<i64>,
        reason: Option<String>,
    ) -> Option<RunRecord> {
        match (code, reason) {
            (Some(code), None) => self.complete(app, code),
            (_, reason) => self.finish(
                app,
                RunOutcome::Failed {
                    reason: reason.unwrap_or_else(|| "workload ended".to_owned()),
                },
            ),
        }
    }

    fn start(&mut self, app: &str, telo: Option<String>) -> RunRecord {
        self.generation += 1;
        self.open_since = Some(Instant::now());
        let trigger = self.pending.take().unwrap_or(RunTrigger::Watch);
        RunRecord {
            app: app.to_owned(),
            generation: self.generation,
            phase: RunOutcome::Started { trigger, telo },
        }
    }

    fn complete(&mut self, app: &str, code: i64) -> Option<RunRecord> {
        let duration_ms = self
            .open_since
            .map(|since| u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX));
        self.finish(app, RunOutcome::Completed { code, duration_ms })
    }

    /// Closes the open generation; nothing when none is open, so a repeated
    /// stop is never reported twice.
    fn finish(&mut self, app: &str, phase: RunOutcome) -> Option<RunRecord> {
        self.open_since.take()?;
        Some(RunRecord {
            app: app.to_owned(),
            generation: self.generation,
            phase,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frame(event: &str, payload: Value) -> Value {
        json!({"kind": "event", "event": event, "payload": payload})
    }

    #[test]
    fn generations_open_on_starting_and_close_on_stopped() {
        let mut run = RunProjection::default();
        run.attribute(RunTrigger::Initial);
        let started = run.observe("app", &frame("Kernel.Starting", json!({"telo": "0.81.0"})));
        assert_eq!(
            started,
            vec![RunRecord {
                app: "app".into(),
                generation: 1,
                phase: RunOutcome::Started {
                    trigger: RunTrigger::Initial,
                    telo: Some("0.81.0".into())
                }
            }]
        );
        assert!(
            run.observe("app", &frame("Kernel.Started", json!({})))
                .is_empty()
        );
        let stopped = run.observe("app", &frame("Kernel.Stopped", json!({"exitCode": 3})));
        assert!(matches!(
            stopped[0].phase,
            RunOutcome::Completed {
                code: 3,
                duration_ms: Some(_)
            }
        ));
        // A second stop is not a second completion.
        assert!(
            run.observe("app", &frame("Kernel.Stopped", json!({})))
                .is_empty()
        );
        let next = run.observe("app", &frame("Kernel.Starting", json!({})));
        assert_eq!(next[0].generation, 2);
        assert!(matches!(
            next[0].phase,
            RunOutcome::Started {
                trigger: RunTrigger::Watch,
                telo: None
            }
        ));
    }

    #[test]
    fn a_load_failure_opens_and_fails_one_generation() {
        let mut run = RunProjection::default();
        let failed = run.observe(
            "app",
            &frame(
                "Kernel.RunFailed",
                json!({"phase": "load", "message": "bad yaml"}),
            ),
        );
        assert_eq!(failed.len(), 2);
        assert_eq!(failed[1].generation, 1);
        assert_eq!(
            failed[1].phase,
            RunOutcome::Failed {
                reason: "bad yaml".into()
            }
        );
        // Starting then RunFailed counts once.
        run.observe("app", &frame("Kernel.Starting", json!({})));
        let failed = run.observe(
            "app",
            &frame("Kernel.RunFailed", json!({"code": "E_START"})),
        );
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].generation, 2);
        assert_eq!(
            failed[0].phase,
            RunOutcome::Failed {
                reason: "E_START".into()
            }
        );
    }

    #[test]
    fn a_workload_that_ends_closes_the_open_generation_only() {
        let mut run = RunProjection::default();
        assert_eq!(run.workload_ended("app", Some(1), None), None);
        run.observe("app", &frame("Kernel.Starting", json!({})));
        let ended = run
            .workload_ended(
                "app",
                None,
                Some("application process exited (code 137)".into()),
            )
            .unwrap();
        assert_eq!(
            ended.phase,
            RunOutcome::Failed {
                reason: "application process exited (code 137)".into()
            }
        );
    }
}
