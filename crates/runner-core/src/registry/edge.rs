//! The registry as the session edge's resolver: a request for
//! `<port>-<id>` goes to the session's own workload, and only to a port the
//! session publishes while it runs.
//!
//! A request to a suspended watch session wakes it: the session resumes
//! (as `POST /resume` does; concurrent requests share the one resume) and
//! the request is held until the session runs, publishes the port and the
//! port accepts a connection, at most the wake timeout. A request to a
//! session still starting is held the same way.

use std::sync::Arc;
use std::time::Duration;

use runner_api::types::RunStatus;
use tokio::time::Instant;
use tracing::info;

use super::SessionRegistry;
use crate::edge::{EdgeRefusal, EdgeResolver, Hold, SessionHost, Upstream};
use crate::session::{EdgeAccess, Session};

/// How often a woken session's port is tried until it accepts.
const PORT_RETRY: Duration = Duration::from_millis(25);

#[async_trait::async_trait]
impl EdgeResolver for SessionRegistry {
    fn serves_here(&self, host: &SessionHost) -> bool {
        self.inner.backend.replicas().is_none() || self.get(&host.session_id).is_some()
    }

    fn resolve_now(
        &self,
        host: &SessionHost,
    ) -> Option<Result<(Upstream, Option<Hold>), EdgeRefusal>> {
        let Some(session) = self.get(&host.session_id) else {
            return Some(Err(EdgeRefusal::UnknownSession));
        };
        if !session.is_running() {
            return None;
        }
        Some(match upstream_of(&session, host) {
            // Held, the session is in use until the answer is through, and
            // its idle time starts when the hold is let go: noting the
            // activity now as well would add nothing.
            Ok(upstream) => Ok((upstream, Some(hold_of(&session)))),
            Err(refusal) => {
                session.note_activity();
                Err(refusal)
            }
        })
    }

    async fn resolve(&self, host: &SessionHost) -> Result<Upstream, EdgeRefusal> {
        let session = self
            .get(&host.session_id)
            .ok_or(EdgeRefusal::UnknownSession)?;
        session.note_activity();
        if session.is_running() {
            return upstream_of(&session, host);
        }
        // Held while it waits: a session this request wakes must not be
        // suspended for idleness before its port answers, however long
        // its kernel takes to start (the real kernel's http-hello takes
        // about a second, as long as a short idle limit).
        let _held = hold_of(&session);
        let timeout = self
            .inner
            .wake_timeout
            .get()
            .copied()
            .unwrap_or(Duration::from_secs(30));
        let deadline = Instant::now() + timeout;
        self.until_published(&session, host, deadline).await?;
        let upstream = upstream_of(&session, host)?;
        until_accepting(&upstream, deadline).await?;
        // The wait is activity too: a session woken for this request is
        // not suspended again before it is answered.
        session.note_activity();
        Ok(upstream)
    }

    fn hold(&self, host: &SessionHost) -> Option<Hold> {
        self.get(&host.session_id).map(|session| hold_of(&session))
    }

    fn token_guarded(&self, host: &SessionHost) -> Result<bool, EdgeRefusal> {
        let session = self
            .get(&host.session_id)
            .ok_or(EdgeRefusal::UnknownSession)?;
        if session.is_terminal() {
            return Err(EdgeRefusal::Ended);
        }
        Ok(session.edge_access(None, Some(host.port)) != EdgeAccess::Open)
    }

    fn token_admits(&self, host: &SessionHost, token: &str) -> bool {
        self.get(&host.session_id).is_some_and(|session| {
            session.edge_access(Some(token), Some(host.port)) == EdgeAccess::Granted
        })
    }

    fn link_live(&self, host: &SessionHost, link_id: &str) -> bool {
        self.get(&host.session_id)
            .is_some_and(|session| session.links.is_live(link_id, crate::edge::unix_now()))
    }
}

/// Held like a subscriber: a watch session is not idle while a request or
/// a proxied WebSocket to it is open.
fn hold_of(session: &Arc<Session>) -> Hold {
    Box::new(session.subscriber())
}

/// `host.port` of `session`'s workload: a tcp port it publishes, or its
/// kernel's inspection port.
fn upstream_of(session: &Session, host: &SessionHost) -> Result<Upstream, EdgeRefusal> {
    let port = if session.publishes_tcp(host.port) {
        host.port
    } else if host.port == crate::edge::INSPECT_PORT
        && let Some(port) = session.inspect_port()
    {
        port
    } else {
        return Err(EdgeRefusal::PortNotPublished);
    };
    let reach = session.reach().ok_or(EdgeRefusal::NotListening)?;
    Ok(Upstream { reach, port })
}

impl SessionRegistry {
    /// Waits until `session` runs and publishes `host.port`, resuming it if
    /// it is suspended; `Starting` past `deadline`.
    async fn until_published(
        &self,
        session: &Arc<Session>,
        host: &SessionHost,
        deadline: Instant,
    ) -> Result<(), EdgeRefusal> {
        let mut changes = session.watch_events();
        let mut woken = false;
        loop {
            match session.status() {
                RunStatus::Exited { .. } | RunStatus::Failed { .. } | RunStatus::Stopped => {
                    return Err(EdgeRefusal::Ended);
                }
                RunStatus::Running { .. } if session.serves_on_edge(host.port) => return Ok(()),
                RunStatus::Suspended if !woken => {
                    woken = true;
                    info!(session_id = %session.id(), "a request to a suspended session's port wakes it");
                    let registry = self.clone();
                    let id = session.id().to_owned();
                    // Owned by the registry's tasks: a client that gives up
                    // does not cut a resume in half.
                    self.inner.tasks.spawn(async move {
                        // Another request's resume may be under way: either
                        // way the session comes up.
                        let _ = registry.resume(&id).await;
                    });
                }
                _ => {}
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Err(EdgeRefusal::Starting);
            }
        }
    }
}

/// Waits until `upstream` accepts a connection (the app listens), at most
/// until `deadline`.
async fn until_accepting(upstream: &Upstream, deadline: Instant) -> Result<(), EdgeRefusal> {
    loop {
        let attempt = tokio::time::timeout_at(deadline, upstream.reach.connect(upstream.port));
        match attempt.await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) if Instant::now() + PORT_RETRY < deadline => {
                tokio::time::sleep(PORT_RETRY).await;
            }
            _ => return Err(EdgeRefusal::NotListening),
        }
    }
}
