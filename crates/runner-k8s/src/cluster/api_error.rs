//! Kubernetes API failures, phrased for the person who clicked Run
//! (docs/contract.md §9.7).
//!
//! A start failure's message travels to the client as the session's terminal
//! `failed` status, and an apiserver `Status` message is not fit for that: it
//! names the runner's ServiceAccount, the namespace's quota objects, webhook
//! internals. So the client sees what was refused, the HTTP code, the
//! apiserver's one-word reason and who can act on it; the `Status` message is
//! read to tell a full quota from missing RBAC and is never repeated. The raw
//! error rides along as the `source` of the error we return, so the runner's
//! log keeps every detail: it moves to the log, it does not disappear.

use std::sync::LazyLock;

use kube::core::Status;
use regex::Regex;
use runner_core::{StartError, StartStage};

/// Said when no apiserver answer carries an HTTP status: a refused
/// connection, a DNS or TLS failure, a timeout, a body that was not a
/// `Status`. Reporting those as a rejection would claim the apiserver refused
/// something it was never asked.
pub const API_UNREACHABLE: &str = "the Kubernetes API could not be reached";

/// The client-safe description of a failed Kubernetes API call.
pub fn api_reason(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => status_reason(status),
        _ => API_UNREACHABLE.to_owned(),
    }
}

/// The client-safe description of a `Status` the apiserver returned, for the
/// places a `Status` arrives without a [`kube::Error`] around it (watch
/// streams).
pub fn status_reason(status: &Status) -> String {
    let Some(code) = http_code(status) else {
        return API_UNREACHABLE.to_owned();
    };
    let detail = match reason_word(status) {
        Some(reason) => format!("{reason}, HTTP {code}"),
        None => format!("HTTP {code}"),
    };
    match refusal_cause(code, &status.message) {
        Some(RefusalCause::Quota) => {
            format!("the session namespace's resource quota is exhausted ({detail})")
        }
        Some(RefusalCause::Rbac) => format!(
            "the runner is not permitted to do this ({detail}). The cluster operator must check \
             the runner's RBAC."
        ),
        None => format!("the Kubernetes API rejected the request ({detail})"),
    }
}

/// The client-safe description of a failed watch.
pub fn watcher_reason(err: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error as WatchError;
    match err {
        WatchError::InitialListFailed(err)
        | WatchError::WatchStartFailed(err)
        | WatchError::WatchFailed(err) => api_reason(err),
        WatchError::WatchError(status) => status_reason(status),
        WatchError::NoResourceVersion => API_UNREACHABLE.to_owned(),
    }
}

/// A start failure whose message is `<action>: <api_reason>` and whose source
/// is the raw error, for the log.
pub fn api_failure(err: kube::Error, stage: StartStage, action: &str) -> StartError {
    let message = format!("{action}: {}", api_reason(&err));
    StartError::new(stage, message).with_source(err)
}

/// The HTTP status the apiserver answered with, if it answered with one.
pub fn status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => http_code(status),
        _ => None,
    }
}

pub fn is_not_found(err: &kube::Error) -> bool {
    status_code(err) == Some(404)
}

/// A failure worth retrying: the apiserver was unreachable or answered a
/// server-side error or a throttle, not a refusal of the request itself.
pub fn is_transient(err: &kube::Error) -> bool {
    match status_code(err) {
        None => true,
        Some(code) => code == 429 || code >= 500,
    }
}

/// The apiserver could not be reached or is unavailable (down, overloaded,
/// throttling) — an outage to wait out, unlike an internal error or a
/// refusal, which retrying soon will not change.
pub fn is_unavailable(err: &kube::Error) -> bool {
    match status_code(err) {
        None => true,
        Some(code) => matches!(code, 429 | 503 | 504),
    }
}

pub fn is_conflict(err: &kube::Error) -> bool {
    status_code(err) == Some(409)
}

/// A ResourceQuota's admission refused the request (the namespace is full).
pub fn is_quota_refusal(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => {
            http_code(status).and_then(|code| refusal_cause(code, &status.message))
                == Some(RefusalCause::Quota)
        }
        _ => false,
    }
}

/// `410 Gone`: a watch or list asked for a `resourceVersion` the apiserver no
/// longer keeps, so the caller must list afresh. (kube-runtime's watcher
/// re-lists on its own; only the tests ask.)
#[cfg(test)]
pub fn is_gone(err: &kube::Error) -> bool {
    status_code(err) == Some(410)
}

/// Only a value an HTTP response could carry is a status: kube-rs leaves
/// `code` at 0 when a body parsed as a `Status` had none.
fn http_code(status: &Status) -> Option<u16> {
    Some(status.code).filter(|code| (100..=599).contains(code))
}

/// `Forbidden`, `NotFound`, `AlreadyExists`, … — the one word safe to pass on.
/// Anything else in the field is dropped: kube-rs writes its own sentence
/// there ("Failed to parse error data") when the body was not a `Status`, and
/// a proxy's JSON can put arbitrary text in it.
fn reason_word(status: &Status) -> Option<&str> {
    let reason = status.reason.as_str();
    let mut chars = reason.chars();
    let is_word = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric())
        && reason.len() <= 64;
    is_word.then_some(reason)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefusalCause {
    Quota,
    Rbac,
}

static QUOTA_DENIAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)exceeded quota|forbidden: failed quota").expect("the pattern is a literal")
});

static RBAC_DENIAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\bis forbidden: User\b|\bcannot \w+ resource\b")
        .expect("the pattern is a literal")
});

/// Which of two very different things a 401/403 means. An RBAC denial and a
/// ResourceQuota rejection share the code and the `Forbidden` reason, and the
/// chart ships a 32-pod quota, so blaming RBAC on every 403 sends the operator
/// to re-check a Role exactly when the cluster is merely full. Only the
/// admission message tells them apart. A 403 that names neither (a webhook,
/// say) gets the neutral wording rather than a guess.
fn refusal_cause(code: u16, message: &str) -> Option<RefusalCause> {
    if code != 401 && code != 403 {
        return None;
    }
    if QUOTA_DENIAL.is_match(message) {
        Some(RefusalCause::Quota)
    } else if message.is_empty() || RBAC_DENIAL.is_match(message) {
        Some(RefusalCause::Rbac)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;

    const RBAC_DENIAL_TEXT: &str = "pods is forbidden: User \
        \"system:serviceaccount:telo-runner:telo-k8s-runner\" cannot create resource \"pods\" in \
        the namespace \"telo-sessions\"";
    const QUOTA_DENIAL_TEXT: &str = "pods \"telo-run-abc\" is forbidden: exceeded quota: \
        telo-k8s-runner-sessions, requested: pods=1, used: pods=32, limited: pods=32";

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            reason: reason.to_owned(),
            message: message.to_owned(),
            ..Status::default()
        }))
    }

    fn forbidden(message: &str) -> kube::Error {
        api_error(403, "Forbidden", message)
    }

    #[test]
    fn a_403_keeps_the_code_and_reason_and_nothing_the_status_carried() {
        let reason = api_reason(&forbidden(RBAC_DENIAL_TEXT));
        assert!(reason.contains("Forbidden"), "{reason}");
        assert!(reason.contains("403"), "{reason}");
        assert!(!reason.contains("system:serviceaccount"), "{reason}");
        assert!(!reason.contains("telo-sessions"), "{reason}");
    }

    #[test]
    fn only_server_errors_throttles_and_silence_are_transient() {
        assert!(is_transient(&api_error(500, "InternalError", "")));
        assert!(is_transient(&api_error(503, "ServiceUnavailable", "")));
        assert!(is_transient(&api_error(429, "TooManyRequests", "")));
        assert!(is_transient(&kube::Error::LinesCodecMaxLineLengthExceeded));
        assert!(!is_transient(&forbidden(RBAC_DENIAL_TEXT)));
        assert!(!is_transient(&api_error(404, "NotFound", "")));
        assert!(!is_transient(&api_error(409, "Conflict", "")));
    }

    #[test]
    fn an_rbac_denial_names_rbac_as_the_fix() {
        assert_eq!(
            api_reason(&forbidden(RBAC_DENIAL_TEXT)),
            "the runner is not permitted to do this (Forbidden, HTTP 403). The cluster operator \
             must check the runner's RBAC."
        );
    }

    #[test]
    fn quota_rejection_is_not_blamed_on_rbac() {
        let reason = api_reason(&forbidden(QUOTA_DENIAL_TEXT));
        assert_eq!(
            reason,
            "the session namespace's resource quota is exhausted (Forbidden, HTTP 403)"
        );
        assert!(!reason.contains("RBAC"));
        assert!(!reason.contains("telo-k8s-runner-sessions"));
    }

    #[test]
    fn a_403_that_names_neither_cause_stays_neutral() {
        let reason = api_reason(&forbidden("denied by a validating webhook"));
        assert_eq!(
            reason,
            "the Kubernetes API rejected the request (Forbidden, HTTP 403)"
        );
        assert!(!reason.contains("RBAC"));
        assert!(!reason.contains("quota"));
    }

    #[test]
    fn a_not_found_names_its_reason() {
        let reason = api_reason(&api_error(404, "NotFound", "pods \"telo-run-x\" not found"));
        assert_eq!(
            reason,
            "the Kubernetes API rejected the request (NotFound, HTTP 404)"
        );
    }

    #[rstest]
    #[case::failed_quota(
        403,
        "pods \"x\" is forbidden: failed quota: compute: must specify limits.cpu",
        "the session namespace's resource quota is exhausted (Forbidden, HTTP 403)"
    )]
    #[case::quota_in_capitals(
        403,
        "EXCEEDED QUOTA: sessions",
        "the session namespace's resource quota is exhausted (Forbidden, HTTP 403)"
    )]
    #[case::cannot_verb_resource(
        403,
        "cannot list resource \"ingressclasses\"",
        "the runner is not permitted to do this (Forbidden, HTTP 403). The cluster operator must \
         check the runner's RBAC."
    )]
    #[case::unauthorized_without_message(
        401,
        "",
        "the runner is not permitted to do this (Forbidden, HTTP 401). The cluster operator must \
         check the runner's RBAC."
    )]
    #[case::quota_words_outside_401_403(
        422,
        "exceeded quota: sessions",
        "the Kubernetes API rejected the request (Forbidden, HTTP 422)"
    )]
    #[case::rbac_words_outside_401_403(
        500,
        "pods is forbidden: User \"x\"",
        "the Kubernetes API rejected the request (Forbidden, HTTP 500)"
    )]
    fn refusals_are_classified_by_code_and_message(
        #[case] code: u16,
        #[case] message: &str,
        #[case] expected: &str,
    ) {
        assert_eq!(api_reason(&api_error(code, "Forbidden", message)), expected);
    }

    #[rstest]
    #[case::missing("")]
    #[case::kube_rs_placeholder("Failed to parse error data")]
    #[case::sentence("User system:serviceaccount:x denied")]
    #[case::punctuation("Not-Found")]
    fn a_reason_that_is_not_one_word_is_left_out(#[case] reason: &str) {
        assert_eq!(
            api_reason(&api_error(502, reason, "<html>bad gateway</html>")),
            "the Kubernetes API rejected the request (HTTP 502)"
        );
    }

    #[test]
    fn a_403_without_reason_or_message_is_still_rbac() {
        assert_eq!(
            api_reason(&api_error(403, "", "")),
            "the runner is not permitted to do this (HTTP 403). The cluster operator must check \
             the runner's RBAC."
        );
    }

    fn unreachable_errors() -> Vec<kube::Error> {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connect refused");
        vec![
            kube::Error::Service(Box::new(refused)),
            kube::Error::ReadEvents(std::io::Error::other("socket hang up")),
            kube::Error::TlsRequired,
            kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err()),
            // A `Status` without an HTTP-range code, like an aborted request's
            // small numeric code in the reference, is not an answer.
            api_error(0, "Forbidden", RBAC_DENIAL_TEXT),
            api_error(20, "", ""),
            api_error(600, "Forbidden", ""),
        ]
    }

    #[test]
    fn an_unreachable_apiserver_is_reported_as_unreachable_not_as_a_rejection() {
        for err in unreachable_errors() {
            assert_eq!(api_reason(&err), API_UNREACHABLE, "{err:?}");
            assert_eq!(status_code(&err), None, "{err:?}");
            assert_eq!(api_reason(&err), "the Kubernetes API could not be reached");
        }
    }

    #[rstest]
    #[case(99, None)]
    #[case(100, Some(100))]
    #[case(404, Some(404))]
    #[case(599, Some(599))]
    #[case(600, None)]
    fn only_http_range_codes_count_as_status(#[case] code: u16, #[case] expected: Option<u16>) {
        assert_eq!(status_code(&api_error(code, "", "")), expected);
    }

    #[rstest]
    #[case(404, true, false, false)]
    #[case(409, false, true, false)]
    #[case(410, false, false, true)]
    #[case(403, false, false, false)]
    fn status_predicates_read_the_code(
        #[case] code: u16,
        #[case] not_found: bool,
        #[case] conflict: bool,
        #[case] gone: bool,
    ) {
        let err = api_error(code, "Whatever", "");
        assert_eq!(is_not_found(&err), not_found);
        assert_eq!(is_conflict(&err), conflict);
        assert_eq!(is_gone(&err), gone);
    }

    #[test]
    fn status_predicates_are_false_without_an_answer() {
        for err in unreachable_errors() {
            assert!(!is_not_found(&err) && !is_conflict(&err) && !is_gone(&err));
        }
    }

    #[test]
    fn watch_failures_use_the_same_wording() {
        use kube::runtime::watcher::Error as WatchError;
        let status = Status {
            code: 410,
            reason: "Expired".into(),
            message: "too old resource version: 1 (2)".into(),
            ..Status::default()
        };
        assert_eq!(
            watcher_reason(&WatchError::WatchError(Box::new(status))),
            "the Kubernetes API rejected the request (Expired, HTTP 410)"
        );
        assert_eq!(
            watcher_reason(&WatchError::WatchStartFailed(forbidden(QUOTA_DENIAL_TEXT))),
            "the session namespace's resource quota is exhausted (Forbidden, HTTP 403)"
        );
        assert_eq!(
            watcher_reason(&WatchError::NoResourceVersion),
            API_UNREACHABLE
        );
    }

    #[test]
    fn api_failure_keeps_the_raw_error_as_its_source_for_the_log() {
        let failure = api_failure(
            forbidden(RBAC_DENIAL_TEXT),
            StartStage::Create,
            "could not create the session pod",
        );
        assert_eq!(failure.stage, StartStage::Create);
        assert_eq!(
            failure.message,
            "could not create the session pod: the runner is not permitted to do this \
             (Forbidden, HTTP 403). The cluster operator must check the runner's RBAC."
        );
        assert!(!failure.to_string().contains("system:serviceaccount"));
        let source = failure
            .source
            .as_deref()
            .and_then(|source| source.downcast_ref::<kube::Error>());
        match source {
            Some(kube::Error::Api(status)) => assert_eq!(status.message, RBAC_DENIAL_TEXT),
            other => panic!("the raw error was not kept: {other:?}"),
        }
    }

    proptest! {
        /// Whatever the apiserver puts in a `Status`, its message never
        /// reaches the client, and neither does a ServiceAccount name.
        #[test]
        fn no_status_message_or_identity_ever_reaches_the_client(
            code in any::<u16>(),
            reason in prop_oneof![
                Just(String::from("Forbidden")),
                Just(String::from("system:serviceaccount:ns:sa")),
                "\\PC{0,40}",
                "[A-Za-z][A-Za-z0-9]{0,20}",
            ],
            before in "\\PC{0,40}",
            after in "\\PC{0,40}",
            marker in "secret-[0-9a-f]{12}",
            cause in prop_oneof![
                Just(" exceeded quota: "),
                Just(" is forbidden: User \"system:serviceaccount:telo:runner\" cannot create resource "),
                Just(" denied by webhook "),
                Just(" "),
            ],
        ) {
            let message = format!("{before}{cause}{marker}{after}");
            let err = api_error(code, &reason, &message);
            let outputs = [
                api_reason(&err),
                api_failure(err, StartStage::Create, "could not create the session pod").to_string(),
            ];
            for output in outputs {
                prop_assert!(!output.contains(&marker), "{output}");
                prop_assert!(!output.contains("system:serviceaccount"), "{output}");
            }
        }
    }
}
