//! The registry as the session edge's resolver: a request for
//! `<port>-<id>` goes to the session's own workload, and only to a port the
//! session published while it runs.

use std::net::SocketAddr;

use runner_api::types::RunStatus;

use super::SessionRegistry;
use crate::edge::{EdgeRefusal, EdgeResolver, SessionHost};

#[async_trait::async_trait]
impl EdgeResolver for SessionRegistry {
    async fn resolve(&self, host: &SessionHost) -> Result<SocketAddr, EdgeRefusal> {
        let session = self
            .get(&host.session_id)
            .ok_or(EdgeRefusal::UnknownSession)?;
        match session.status() {
            RunStatus::Starting | RunStatus::Suspended => Err(EdgeRefusal::Starting),
            RunStatus::Exited { .. } | RunStatus::Failed { .. } | RunStatus::Stopped => {
                Err(EdgeRefusal::Ended)
            }
            RunStatus::Running { .. } => {
                if !session.publishes_tcp(host.port) {
                    return Err(EdgeRefusal::PortNotPublished);
                }
                self.backend()
                    .edge_address(&host.session_id, host.port)
                    .ok_or(EdgeRefusal::NotListening)
            }
        }
    }
}
