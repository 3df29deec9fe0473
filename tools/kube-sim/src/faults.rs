//! Fault injection: failing the next N requests of a verb/resource, added
//! latency, dropping every watch, an apiserver "restart" that closes
//! every open stream (watches, logs, attach) while keeping all state, and an
//! outage: every request answered `503` for a while.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::errors::ApiError;

/// One "fail the next N requests" rule.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailRule {
    /// Kubernetes verb (`create`, `list`, `watch`, `get`, …); absent = any.
    #[serde(default)]
    pub verb: Option<String>,
    /// Resource (`pods`, `pods/attach`, `httproutes`); absent = any.
    #[serde(default)]
    pub resource: Option<String>,
    pub count: u32,
    pub code: u16,
    #[serde(default)]
    pub message: Option<String>,
}

/// A request to `/_sim/faults`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum FaultCommand {
    /// Fail the next `count` matching requests with `code`.
    #[serde(rename_all = "camelCase")]
    FailNext(FailRule),
    /// Delay every API request by `ms`.
    Latency { ms: u64 },
    /// Close every open watch stream now.
    DropWatches,
    /// Close every open stream (watches, logs, attach), keep all state.
    Restart,
    /// An outage, like an apiserver behind a load balancer that has no
    /// healthy backend: every open stream closes now and every API request
    /// is answered `503 ServiceUnavailable` for the next `ms` milliseconds.
    Unavailable { ms: u64 },
    /// Hold every matching request before it is served (absent verb or
    /// resource: any) until a `release`, as an apiserver that answers late:
    /// what the request reads or writes is decided when it is let go.
    #[serde(rename_all = "camelCase")]
    Hold {
        #[serde(default)]
        verb: Option<String>,
        #[serde(default)]
        resource: Option<String>,
    },
    /// Let the requests of the matching holds go (absent verb or
    /// resource: every hold), and hold those no more.
    #[serde(rename_all = "camelCase")]
    Release {
        #[serde(default)]
        verb: Option<String>,
        #[serde(default)]
        resource: Option<String>,
    },
    /// Remove every rule and the latency, and release what is held.
    Clear,
}

/// Requests of one verb/resource held back until a release.
#[derive(Debug, Clone, PartialEq)]
struct HoldRule {
    verb: Option<String>,
    resource: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FaultState {
    pub fail: Vec<FailRule>,
    pub latency_ms: u64,
    pub watch_drops: u64,
    pub restarts: u64,
    /// How much of the current outage is left (0 = none).
    #[serde(default)]
    pub unavailable_ms: u64,
}

pub struct Faults {
    state: Mutex<FaultState>,
    holds: Mutex<Vec<HoldRule>>,
    /// Counts up at every release; a held request waits for it to change.
    releases: watch::Sender<u64>,
    /// How many requests are held right now.
    held: watch::Sender<usize>,
    /// When the current outage ends.
    unavailable_until: Mutex<Option<Instant>>,
    watch_epoch: watch::Sender<u64>,
    stream_epoch: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            state: Mutex::new(FaultState::default()),
            holds: Mutex::new(Vec::new()),
            releases: watch::channel(0).0,
            held: watch::channel(0).0,
            unavailable_until: Mutex::new(None),
            watch_epoch: watch::channel(0).0,
            stream_epoch: watch::channel(0).0,
        }
    }
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn apply(&self, cmd: FaultCommand) {
        match cmd {
            FaultCommand::FailNext(rule) => self.lock().fail.push(rule),
            FaultCommand::Latency { ms } => self.lock().latency_ms = ms,
            FaultCommand::DropWatches => self.drop_watches(),
            FaultCommand::Restart => self.restart(),
            FaultCommand::Unavailable { ms } => self.unavailable_for(Duration::from_millis(ms)),
            FaultCommand::Hold { verb, resource } => self.holds().push(HoldRule { verb, resource }),
            FaultCommand::Release { verb, resource } => {
                self.release_matching(verb.as_deref(), resource.as_deref());
            }
            FaultCommand::Clear => {
                let mut s = self.lock();
                s.fail.clear();
                s.latency_ms = 0;
                drop(s);
                *self.outage() = None;
                self.release();
            }
        }
    }

    /// Fails the next `count` requests of `verb` on `resource` with `code`.
    pub fn fail_next(&self, verb: &str, resource: &str, count: u32, code: u16) {
        self.apply(FaultCommand::FailNext(FailRule {
            verb: Some(verb.to_string()),
            resource: Some(resource.to_string()),
            count,
            code,
            message: None,
        }));
    }

    /// Holds every `verb` request on `resource` until [`Self::release`].
    pub fn hold(&self, verb: &str, resource: &str) {
        self.apply(FaultCommand::Hold {
            verb: Some(verb.to_string()),
            resource: Some(resource.to_string()),
        });
    }

    /// Lets every held request go and holds no more.
    pub fn release(&self) {
        self.release_matching(None, None);
    }

    /// Lets the requests of the holds on `verb`/`resource` go (`None`: any).
    pub fn release_matching(&self, verb: Option<&str>, resource: Option<&str>) {
        self.holds().retain(|rule| {
            let released = verb.is_none_or(|v| rule.verb.as_deref() == Some(v))
                && resource.is_none_or(|r| rule.resource.as_deref() == Some(r));
            !released
        });
        self.releases.send_modify(|n| *n += 1);
    }

    /// Resolves once at least `count` requests are held.
    pub async fn wait_held(&self, count: usize) {
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|now| *now >= count).await;
    }

    /// Waits while a hold matches this request; returns at once otherwise.
    pub async fn pass_holds(&self, verb: &str, resource: &str) {
        let matches = |rules: &[HoldRule]| {
            rules.iter().any(|r| {
                r.verb.as_deref().is_none_or(|v| v == verb)
                    && r.resource.as_deref().is_none_or(|x| x == resource)
            })
        };
        let mut releases = self.releases.subscribe();
        if !matches(&self.holds()) {
            return;
        }
        self.held.send_modify(|n| *n += 1);
        // Held until no hold matches any more (a release of another rule
        // wakes it too, and it goes back to waiting).
        while matches(&self.holds()) {
            if releases.changed().await.is_err() {
                break;
            }
        }
        self.held.send_modify(|n| *n -= 1);
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, Vec<HoldRule>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency_ms = latency.as_millis() as u64;
    }

    pub fn latency(&self) -> Duration {
        Duration::from_millis(self.lock().latency_ms)
    }

    pub fn drop_watches(&self) {
        self.lock().watch_drops += 1;
        self.watch_epoch.send_modify(|e| *e += 1);
    }

    pub fn restart(&self) {
        self.lock().restarts += 1;
        self.watch_epoch.send_modify(|e| *e += 1);
        self.stream_epoch.send_modify(|e| *e += 1);
    }

    /// Every open stream closes and every request gets `503` for `period`.
    pub fn unavailable_for(&self, period: Duration) {
        *self.outage() = Some(Instant::now() + period);
        self.restart();
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.unavailable_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// What is left of the current outage, if one is under way.
    fn outage_left(&self) -> Option<Duration> {
        let mut until = self.outage();
        let left = until.map(|t| t.saturating_duration_since(Instant::now()));
        match left {
            Some(left) if !left.is_zero() => Some(left),
            _ => {
                *until = None;
                None
            }
        }
    }

    pub fn clear(&self) {
        self.apply(FaultCommand::Clear);
    }

    pub fn state(&self) -> FaultState {
        let mut state = self.lock().clone();
        state.unavailable_ms = self.outage_left().map_or(0, |d| d.as_millis() as u64);
        state
    }

    /// The failure this request gets: `503` during an outage, else one
    /// matching failure rule (consumed), if any.
    pub fn take_failure(&self, verb: &str, resource: &str) -> Option<ApiError> {
        if self.outage_left().is_some() {
            return Some(ApiError::injected(
                503,
                Some("kube-sim: the apiserver is unavailable".into()),
            ));
        }
        let mut s = self.lock();
        let idx = s.fail.iter().position(|r| {
            r.count > 0
                && r.verb.as_deref().is_none_or(|v| v == verb)
                && r.resource.as_deref().is_none_or(|x| x == resource)
        })?;
        let rule = &mut s.fail[idx];
        rule.count -= 1;
        let err = ApiError::injected(rule.code, rule.message.clone());
        if rule.count == 0 {
            s.fail.remove(idx);
        }
        Some(err)
    }

    /// Changes when watches must close.
    pub fn watch_epoch(&self) -> watch::Receiver<u64> {
        self.watch_epoch.subscribe()
    }

    /// Changes when every stream must close.
    pub fn stream_epoch(&self) -> watch::Receiver<u64> {
        self.stream_epoch.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn held_requests_wait_for_the_release_and_others_pass() {
        let f = std::sync::Arc::new(Faults::default());
        f.hold("list", "secrets");
        f.pass_holds("list", "pods").await;
        let held = tokio::spawn({
            let f = f.clone();
            async move { f.pass_holds("list", "secrets").await }
        });
        f.wait_held(1).await;
        f.hold("patch", "secrets");
        f.release_matching(Some("patch"), None);
        tokio::task::yield_now().await;
        assert!(!held.is_finished(), "released by another rule's release");
        f.release();
        held.await.unwrap();
        f.pass_holds("list", "secrets").await;
    }

    #[test]
    fn failures_are_consumed_in_order() {
        let f = Faults::default();
        f.fail_next("create", "pods", 2, 500);
        assert!(f.take_failure("list", "pods").is_none());
        assert_eq!(f.take_failure("create", "pods").map(|e| e.code), Some(500));
        assert_eq!(
            f.take_failure("create", "pods").map(|e| e.reason),
            Some("InternalError".into())
        );
        assert!(f.take_failure("create", "pods").is_none());
    }

    #[test]
    fn an_outage_refuses_every_request_until_it_ends() {
        let f = Faults::default();
        let streams = f.stream_epoch();
        f.apply(FaultCommand::Unavailable { ms: 60_000 });
        assert!(streams.has_changed().unwrap(), "open streams are closed");
        assert_eq!(f.take_failure("get", "pods").map(|e| e.code), Some(503));
        assert_eq!(f.take_failure("watch", "pods").map(|e| e.code), Some(503));
        assert!(f.state().unavailable_ms > 0);
        f.clear();
        assert!(f.take_failure("get", "pods").is_none());
        f.unavailable_for(Duration::ZERO);
        assert!(f.take_failure("get", "pods").is_none(), "an outage ends");
        assert_eq!(f.state().unavailable_ms, 0);
    }

    #[test]
    fn commands_parse_from_json() {
        let cmd: FaultCommand = serde_json::from_str(
            r#"{"action":"failNext","verb":"create","resource":"pods","count":1,"code":429}"#,
        )
        .expect("parses");
        assert!(matches!(
            cmd,
            FaultCommand::FailNext(FailRule { code: 429, .. })
        ));
        let cmd: FaultCommand =
            serde_json::from_str(r#"{"action":"dropWatches"}"#).expect("parses");
        assert_eq!(cmd, FaultCommand::DropWatches);
        let cmd: FaultCommand =
            serde_json::from_str(r#"{"action":"unavailable","ms":2000}"#).expect("parses");
        assert_eq!(cmd, FaultCommand::Unavailable { ms: 2000 });
    }
}
