//! What only a watch session's record does: its app set changes, its
//! workload handle, its kernel's run projection per app and the endpoints
//! each app's kernel resolves.

use super::*;

impl Session {
    /// Makes this a watch session launched as `spec`.
    pub(crate) fn with_watch(mut self, spec: crate::launch::WatchSpec) -> Self {
        if let Some(agent) = &spec.agent
            && let Some(token) = agent.token.clone()
        {
            self.guard_with_token_digest(Some(agent.port), token_digest(&token));
            let _ = self.agent_token.set(token);
        }
        self.watch = Some(Mutex::new(WatchState::new(spec)));
        self
    }

    /// The watch session's state; `None` for a run session.
    pub(crate) fn watch_state(&self) -> Option<std::sync::MutexGuard<'_, WatchState>> {
        self.watch.as_ref().map(lock)
    }

    /// The live watch workload, if it runs.
    pub fn watch_workload(&self) -> Option<Arc<dyn crate::backend_session::WatchWorkload>> {
        self.watch_state()?.workload.clone()
    }

    /// The lock its app-set changes, resumes, suspends and checkpoints take
    /// in turn.
    pub(crate) fn watch_lifecycle(&self) -> Option<Arc<tokio::sync::Mutex<()>>> {
        Some(self.watch_state()?.lifecycle.clone())
    }

    /// The watch session's reload budget.
    pub(crate) fn reload_budget(&self) -> Option<Arc<crate::watch::ReloadBudget>> {
        Some(self.watch_state()?.budget.clone())
    }

    /// A watch session that is suspended (its files kept, no workload).
    pub(crate) fn is_suspended(&self) -> bool {
        self.mode == SessionMode::Watch && matches!(self.status(), RunStatus::Suspended)
    }

    /// Counts against `RUNNER_WATCH_MAX_SESSIONS`: a watch session neither
    /// over nor suspended.
    pub(crate) fn is_live_watch(&self) -> bool {
        self.mode == SessionMode::Watch
            && !self.is_terminal()
            && !matches!(self.status(), RunStatus::Suspended)
    }

    /// Adds channels for the apps of `apps` the session does not run yet;
    /// returns their names (removed again if the change fails).
    pub(crate) fn add_channels(&self, apps: &[runner_api::watch::AppSpec]) -> Vec<String> {
        let mut state = lock(&self.state);
        let mut added = Vec::new();
        for app in apps {
            if state.channels.iter().any(|c| c.name == app.name) {
                continue;
            }
            let session_app = SessionApp {
                name: app.name.clone(),
                io: app.io,
                ports: app.ports.clone(),
                telo: app.telo.clone(),
            };
            state.channels.push(AppChannel::new(
                &session_app,
                self.replay_buffer_bytes,
                self.first_output,
            ));
            added.push(app.name.clone());
        }
        added
    }

    /// Keeps only the channels named in `keep`, in that order, with their
    /// declared ports and io mode.
    pub(crate) fn retain_channels(&self, keep: &[runner_api::watch::AppSpec]) {
        let mut state = lock(&self.state);
        let mut channels = std::mem::take(&mut state.channels);
        for app in keep {
            if let Some(index) = channels.iter().position(|c| c.name == app.name) {
                let mut channel = channels.swap_remove(index);
                channel.io = app.io;
                channel.ports = app.ports.clone();
                channel.run.kernel = app.telo.clone();
                state.channels.push(channel);
            }
        }
    }

    /// The telo release app `app` (`None`: the first) runs, as the backend
    /// learned it; `run started` reports it when the kernel does not.
    pub(crate) fn set_kernel_version(&self, app: Option<&str>, version: String) {
        let mut state = lock(&self.state);
        if let Some(channel) = channel_mut(&mut state.channels, app) {
            channel.run.kernel = Some(version);
        }
    }

    /// Removes the channels named in `names`.
    pub(crate) fn remove_channels(&self, names: &[String]) {
        lock(&self.state)
            .channels
            .retain(|c| !names.contains(&c.name));
    }

    /// A watch workload is up. Its idle time counts from now: a session
    /// resumed (or adopted) a while after its subscribers left is not idle
    /// before a client had the time to look at it.
    pub(crate) fn install_watch_workload(
        &self,
        workload: Arc<dyn crate::backend_session::WatchWorkload>,
    ) {
        if let Some(mut state) = self.watch_state() {
            state.workload = Some(workload);
            state.suspended_at = None;
            state.started_at = Some(tokio::time::Instant::now());
        }
        *lock(&self.idle_since) = tokio::time::Instant::now();
    }

    /// The backend's handle went away (suspend): input waits or drops.
    pub(crate) fn clear_handle(&self) {
        lock(&self.state).handle = None;
    }

    /// A suspended session keeps what a client can still read (its events,
    /// every app's output, its snapshot) and gives back the room its buffers
    /// grew to while the workload ran: suspended sessions are many and
    /// long-lived, and a busy hour must not cost each of them for days.
    /// Nothing is dropped, so replay answers exactly as before.
    pub(crate) fn release_spare_capacity(&self) {
        let mut state = lock(&self.state);
        state.events.shrink_to_fit();
        for channel in &mut state.channels {
            channel.release_spare_capacity();
        }
        state.channels.shrink_to_fit();
        state.early_stdin = Vec::new();
        state.early_stdin_bytes = 0;
    }

    /// The `run` events a debug frame of app `app` means.
    pub(super) fn project_run(
        &self,
        app: &str,
        frame: &serde_json::Value,
    ) -> Vec<runner_api::types::RunRecord> {
        let mut state = lock(&self.state);
        match state.channels.iter_mut().find(|c| c.name == app) {
            Some(channel) => channel.run.observe(app, frame),
            None => Vec::new(),
        }
    }

    pub(super) fn end_app_run(
        &self,
        app: &str,
        code: Option<i64>,
        reason: Option<String>,
    ) -> Option<runner_api::types::RunRecord> {
        let mut state = lock(&self.state);
        let channel = state.channels.iter_mut().find(|c| c.name == app)?;
        channel.run.workload_ended(app, code, reason)
    }

    /// How the kernel's `declared` ports differ from app `app`'s: the
    /// added ports no other app declares, the removed ones, and the added
    /// ones another app declares.
    pub(super) fn diff_ports(
        &self,
        app: &str,
        declared: &[PortMapping],
    ) -> (Vec<PortMapping>, Vec<PortMapping>, Vec<PortMapping>) {
        let state = lock(&self.state);
        let Some(channel) = state.channels.iter().find(|c| c.name == app) else {
            return (Vec::new(), Vec::new(), Vec::new());
        };
        let taken: Vec<PortMapping> = state
            .channels
            .iter()
            .filter(|c| c.name != app)
            .flat_map(|c| c.ports.iter().copied())
            .collect();
        let removed = channel
            .ports
            .iter()
            .filter(|p| !declared.contains(p))
            .copied()
            .collect();
        let (rejected, accepted) = declared
            .iter()
            .filter(|p| !channel.ports.contains(p))
            .copied()
            .partition(|p| taken.contains(p));
        (accepted, removed, rejected)
    }

    /// Every port the session's apps declare once `app` gains `accepted`
    /// and loses `removed`.
    pub(super) fn ports_after(
        &self,
        app: &str,
        accepted: &[PortMapping],
        removed: &[PortMapping],
    ) -> Vec<PortMapping> {
        let state = lock(&self.state);
        let mut all: Vec<PortMapping> = Vec::new();
        for channel in &state.channels {
            for port in &channel.ports {
                let gone = channel.name == app && removed.contains(port);
                if !gone && !all.contains(port) {
                    all.push(*port);
                }
            }
        }
        for port in accepted {
            if !all.contains(port) {
                all.push(*port);
            }
        }
        all
    }

    /// Applies an `endpoints` delta to the app's declared ports.
    pub(super) fn apply_endpoints(
        &self,
        app: &str,
        added: &[runner_api::types::RunnerEndpoint],
        removed: &[runner_api::types::RunnerEndpoint],
    ) {
        let mut state = lock(&self.state);
        let Some(channel) = state.channels.iter_mut().find(|c| c.name == app) else {
            return;
        };
        channel.ports.retain(|p| {
            !removed
                .iter()
                .any(|r| r.port == p.port && r.protocol == p.protocol)
        });
        for endpoint in added {
            let port = PortMapping {
                port: endpoint.port,
                protocol: endpoint.protocol,
            };
            if !channel.ports.contains(&port) {
                channel.ports.push(port);
            }
        }
    }

    /// The next generation of each app in `apps` (every app when `None`)
    /// starts because of `trigger`.
    pub(crate) fn attribute_next_run(
        &self,
        apps: Option<&[String]>,
        trigger: runner_api::watch::RunTrigger,
    ) {
        let mut state = lock(&self.state);
        for channel in &mut state.channels {
            if apps.is_none_or(|names| names.contains(&channel.name)) {
                channel.run.attribute(trigger);
            }
        }
    }
}
