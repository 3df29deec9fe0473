//! The audit log (`RUNNER_AUDIT_LOG`): one JSON object per line for every
//! security-relevant event — a session created, stopped or resumed, an app
//! set changed, an authentication refused, a quota or rate refusal, and any
//! of those done by an admin to another principal's session. Each line has
//! `time`, `event`, `outcome`, and where known `principal`, `tenant`,
//! `address`, `session`, `owner` (when it is not the principal) and
//! `reason`. A token or a secret is never written: principals are named by
//! subject, static tokens by their name.
//!
//! Lines are written whole under a lock and flushed, so concurrent requests
//! never interleave and a crash loses at most the line being written. A
//! write that fails is logged once and the request goes on.

use std::io::Write;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::env::{ConfigError, Env};
use crate::identity::{Owner, Principal};
use crate::settings::RUNNER_AUDIT_LOG;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AuditAction {
    #[serde(rename = "session.create")]
    SessionCreate,
    #[serde(rename = "session.stop")]
    SessionStop,
    #[serde(rename = "session.resume")]
    SessionResume,
    #[serde(rename = "session.apps")]
    SessionApps,
    #[serde(rename = "link.create")]
    LinkCreate,
    #[serde(rename = "link.revoke")]
    LinkRevoke,
    #[serde(rename = "auth.refused")]
    AuthRefused,
    #[serde(rename = "request.rate_limited")]
    RateLimited,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Done.
    Allowed,
    /// Refused by a rule (quota, rate, authentication, a bad request).
    Refused,
    /// Allowed but it did not work.
    Failed,
}

/// One audit line.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRecord {
    pub time: String,
    pub event: AuditAction,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// An admin acting on another principal's session.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The session's owner, when the principal acted on someone else's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl AuditRecord {
    pub fn new(event: AuditAction, outcome: Outcome) -> Self {
        Self {
            time: crate::time::iso_now(),
            event,
            outcome,
            principal: None,
            tenant: None,
            admin: false,
            address: None,
            session: None,
            owner: None,
            reason: None,
        }
    }

    pub fn by(mut self, principal: Option<&Principal>) -> Self {
        if let Some(principal) = principal {
            self.principal = Some(principal.subject.clone());
            self.tenant = Some(principal.tenant.clone());
        }
        self
    }

    pub fn from_address(mut self, address: Option<IpAddr>) -> Self {
        self.address = address.map(|addr| addr.to_canonical().to_string());
        self
    }

    pub fn session(mut self, id: &str) -> Self {
        self.session = Some(id.to_owned());
        self
    }

    /// The session's owner: recorded, and the line marked an admin action,
    /// when it is not the principal.
    pub fn owned_by(mut self, principal: Option<&Principal>, owner: Option<&Owner>) -> Self {
        if let Some(principal) = principal
            && principal.acts_for_another(owner)
        {
            self.admin = true;
            self.owner = Some(owner.map_or_else(|| "(none)".to_owned(), |o| o.subject.clone()));
        }
        self
    }

    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

/// Where audit lines go; off when `RUNNER_AUDIT_LOG` is unset.
#[derive(Default)]
pub struct AuditLog {
    sink: Option<Mutex<Box<dyn Write + Send>>>,
    failed: AtomicBool,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("on", &self.sink.is_some())
            .finish()
    }
}

/// `RUNNER_AUDIT_LOG`'s target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    Stdout,
    File(std::path::PathBuf),
}

pub fn load_audit_target(env: &Env) -> Result<Option<AuditTarget>, ConfigError> {
    Ok(RUNNER_AUDIT_LOG
        .string(env)
        .map(|value| match value.as_str() {
            "stdout" | "-" => AuditTarget::Stdout,
            path => AuditTarget::File(path.into()),
        }))
}

impl AuditLog {
    pub fn off() -> Self {
        Self::default()
    }

    /// Opens the target (a file is created if missing and appended to).
    pub fn open(target: Option<&AuditTarget>) -> Result<Self, ConfigError> {
        let sink: Box<dyn Write + Send> = match target {
            None => return Ok(Self::off()),
            Some(AuditTarget::Stdout) => Box::new(std::io::stdout()),
            Some(AuditTarget::File(path)) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|err| ConfigError::Invalid {
                        var: RUNNER_AUDIT_LOG.name.to_owned(),
                        rule: format!("be `stdout` or a file the runner can append to ({err})"),
                        value: path.display().to_string(),
                    })?,
            ),
        };
        Ok(Self {
            sink: Some(Mutex::new(sink)),
            failed: AtomicBool::new(false),
        })
    }

    /// A log writing into `sink` (tests).
    pub fn to_writer(sink: Box<dyn Write + Send>) -> Self {
        Self {
            sink: Some(Mutex::new(sink)),
            failed: AtomicBool::new(false),
        }
    }

    pub fn is_on(&self) -> bool {
        self.sink.is_some()
    }

    pub fn record(&self, record: AuditRecord) {
        let Some(sink) = &self.sink else {
            return;
        };
        let Ok(mut line) = serde_json::to_vec(&record) else {
            return;
        };
        line.push(b'\n');
        let mut sink = sink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let written = sink.write_all(&line).and_then(|()| sink.flush());
        if let Err(err) = written
            && !self.failed.swap(true, Ordering::Relaxed)
        {
            tracing::error!(error = %err, "could not write to the audit log; audit lines are being lost");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::PrincipalSource;

    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_admin_stopping_anothers_session_is_one_line_naming_both() {
        let out = Shared::default();
        let log = AuditLog::to_writer(Box::new(out.clone()));
        let admin = Principal {
            subject: "oidc:root".into(),
            tenant: "ops".into(),
            groups: vec!["telo-admins".into()],
            admin: true,
            source: PrincipalSource::Oidc,
        };
        let owner = Owner {
            subject: "oidc:alice".into(),
            tenant: "acme".into(),
        };
        log.record(
            AuditRecord::new(AuditAction::SessionStop, Outcome::Allowed)
                .by(Some(&admin))
                .from_address(Some("::ffff:10.0.0.9".parse().unwrap()))
                .session("s-1")
                .owned_by(Some(&admin), Some(&owner)),
        );
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1);
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(line["event"], "session.stop");
        assert_eq!(line["outcome"], "allowed");
        assert_eq!(line["principal"], "oidc:root");
        assert_eq!(line["tenant"], "ops");
        assert_eq!(line["admin"], true);
        assert_eq!(line["owner"], "oidc:alice");
        assert_eq!(line["address"], "10.0.0.9");
        assert_eq!(line["session"], "s-1");
        assert!(line["time"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn ones_own_session_is_no_admin_action() {
        let principal = Principal::anonymous("192.0.2.1".parse().unwrap());
        let record = AuditRecord::new(AuditAction::SessionStop, Outcome::Allowed)
            .owned_by(Some(&principal), Some(&principal.owner()));
        assert!(!record.admin);
        assert_eq!(record.owner, None);
    }

    #[test]
    fn an_unwritable_file_is_a_config_error() {
        let dir = tempfile::tempdir().unwrap();
        let target = AuditTarget::File(dir.path().join("no/such/dir/audit.log"));
        assert!(
            AuditLog::open(Some(&target))
                .unwrap_err()
                .to_string()
                .starts_with(
                    "RUNNER_AUDIT_LOG must be `stdout` or a file the runner can append to ("
                )
        );
    }
}
