//! The session record: what a session pod carries, in its name, labels and
//! annotations, so that a restarted runner can find it and put the session
//! back in its registry (docs/contract.md §6.5, [`crate::session::adoption`]).
//!
//! Labels and annotations are editable by anyone with access to the
//! namespace, so reading a record back checks every field rather than
//! trusting it.

use crate::pod::labels::{
    APP_ANNOTATION, CREATED_AT_ANNOTATION, INSPECT_ANNOTATION, KIND_ANNOTATION, MANAGED_BY_LABEL,
    OWNER_ANNOTATION, PORTS_ANNOTATION, SESSION_ID_LABEL, TOKEN_DIGEST_ANNOTATION,
};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use runner_core::ids::is_session_id;
use runner_core::types::PortMapping;
use runner_core::validate::MAX_PORTS;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `telo-run-<sessionId>`: the pod's name, and the name of the Service and
/// Ingress that route to it.
pub fn pod_name(session_id: &str) -> String {
    format!("telo-run-{session_id}")
}

/// `telo-warm-`: every warm pod's name starts so; a claimed one keeps it.
pub const WARM_POD_PREFIX: &str = "telo-warm-";

/// A new warm pod's name: the prefix and a fresh id from the session-id
/// alphabet (never the id of the session it will serve).
pub fn warm_pod_name() -> String {
    format!("{WARM_POD_PREFIX}{}", runner_core::ids::new_session_id())
}

/// Whether `name` is a warm pod's.
pub fn is_warm_pod_name(name: &str) -> bool {
    name.strip_prefix(WARM_POD_PREFIX)
        .is_some_and(runner_core::ids::is_session_id)
}

/// The label selector matching every session pod of this runner.
pub fn managed_by_selector(managed_by: &str) -> String {
    format!("{MANAGED_BY_LABEL}={managed_by}")
}

/// Which builder made a session pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionKind {
    /// A client bundle run by `telo run` ([`build_session_pod`]).
    Run,
    /// An operator catalog app ([`build_app_pod`]).
    App,
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::App => "app",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "run" => Some(Self::Run),
            "app" => Some(Self::App),
            _ => None,
        }
    }
}

/// What a restarted runner needs, beyond the pod's own spec and status, to
/// put a session back in its registry. The pod's `activeDeadlineSeconds`
/// (with `created_at`) tells whether it is past its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub session_id: String,
    /// ISO-8601 creation time, exactly as first reported to clients.
    pub created_at: String,
    pub kind: SessionKind,
    pub ports: Vec<PortMapping>,
    pub inspect: bool,
    /// The catalog app name; present exactly for [`SessionKind::App`].
    pub app: Option<String>,
    /// SHA-256 of the session's workload token (`tokenEnv`), if it has one.
    pub token_digest: Option<[u8; 32]>,
    /// The principal that created it (with authentication on).
    pub owner: Option<runner_core::identity::Owner>,
}

/// A pod that does not carry a well-formed [`SessionRecord`]: not ours, made
/// by another version, or edited by hand. Adoption skips it rather than guess.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("session pod has no '{0}' label")]
    MissingLabel(&'static str),
    #[error("session pod has no '{0}' annotation")]
    MissingAnnotation(&'static str),
    #[error("label '{SESSION_ID_LABEL}' is not a session id: '{0}'")]
    InvalidSessionId(String),
    #[error(
        "pod '{}' is not named after its session '{session_id}' (expected '{}')",
        .name.as_deref().unwrap_or(""),
        pod_name(.session_id)
    )]
    NameMismatch {
        name: Option<String>,
        session_id: String,
    },
    #[error("annotation '{CREATED_AT_ANNOTATION}' is not an RFC 3339 time: '{value}'")]
    InvalidCreatedAt {
        value: String,
        #[source]
        source: time::error::Parse,
    },
    #[error("annotation '{KIND_ANNOTATION}' is neither 'run' nor 'app': '{0}'")]
    InvalidKind(String),
    #[error("annotation '{PORTS_ANNOTATION}' is not a list of ports")]
    InvalidPorts(#[source] serde_json::Error),
    #[error("annotation '{INSPECT_ANNOTATION}' is neither 'true' nor 'false': '{0}'")]
    InvalidInspect(String),
    #[error("an app session pod needs a non-empty '{APP_ANNOTATION}' annotation")]
    MissingApp,
    #[error("a run session pod must not carry a '{APP_ANNOTATION}' annotation")]
    UnexpectedApp,
    #[error("annotation '{TOKEN_DIGEST_ANNOTATION}' is not a SHA-256 in hex: '{0}'")]
    InvalidTokenDigest(String),
    #[error("annotation '{OWNER_ANNOTATION}' is not an owner record")]
    InvalidOwner(#[source] serde_json::Error),
}

/// The annotations that carry `record` on its pod.
pub fn record_annotations(record: &SessionRecord) -> BTreeMap<String, String> {
    let ports = record
        .ports
        .iter()
        .map(|p| {
            format!(
                r#"{{"port":{},"protocol":"{}"}}"#,
                p.port,
                p.protocol.as_str()
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let mut annotations = BTreeMap::from([
        (CREATED_AT_ANNOTATION.to_owned(), record.created_at.clone()),
        (KIND_ANNOTATION.to_owned(), record.kind.as_str().to_owned()),
        (PORTS_ANNOTATION.to_owned(), format!("[{ports}]")),
        (INSPECT_ANNOTATION.to_owned(), record.inspect.to_string()),
    ]);
    if let Some(app) = &record.app {
        annotations.insert(APP_ANNOTATION.to_owned(), app.clone());
    }
    if let Some(digest) = &record.token_digest {
        annotations.insert(TOKEN_DIGEST_ANNOTATION.to_owned(), hex::encode(digest));
    }
    if let Some(owner) = &record.owner
        && let Ok(text) = serde_json::to_string(owner)
    {
        annotations.insert(OWNER_ANNOTATION.to_owned(), text);
    }
    annotations
}

fn ports_problem(ports: &[PortMapping]) -> Option<String> {
    if ports.len() > MAX_PORTS {
        return Some(format!("more than {MAX_PORTS} ports"));
    }
    ports
        .iter()
        .any(|p| p.port == 0)
        .then(|| "port 0 is not a port".to_owned())
}

/// Reads back the record [`record_annotations`] wrote. Labels and
/// annotations are editable by anyone with access to the namespace, so every
/// field is checked rather than trusted.
pub fn session_record_from_pod(pod: &Pod) -> Result<SessionRecord, RecordError> {
    let labels = pod.metadata.labels.as_ref();
    let session_id = labels
        .and_then(|l| l.get(SESSION_ID_LABEL))
        .ok_or(RecordError::MissingLabel(SESSION_ID_LABEL))?;
    if !is_session_id(session_id) {
        return Err(RecordError::InvalidSessionId(session_id.clone()));
    }
    // The name is what the backend deletes and attaches to; a label that
    // points at another session's pod must not make us act on this one.
    // A claimed warm pod keeps the name it was made with.
    let name = pod.metadata.name.as_deref();
    if name != Some(pod_name(session_id).as_str()) && !name.is_some_and(is_warm_pod_name) {
        return Err(RecordError::NameMismatch {
            name: pod.metadata.name.clone(),
            session_id: session_id.clone(),
        });
    }

    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &'static str| {
        annotations
            .and_then(|a| a.get(key))
            .ok_or(RecordError::MissingAnnotation(key))
    };

    let created_at = annotation(CREATED_AT_ANNOTATION)?;
    if let Err(source) = OffsetDateTime::parse(created_at, &Rfc3339) {
        return Err(RecordError::InvalidCreatedAt {
            value: created_at.clone(),
            source,
        });
    }

    let raw_kind = annotation(KIND_ANNOTATION)?;
    let kind =
        SessionKind::parse(raw_kind).ok_or_else(|| RecordError::InvalidKind(raw_kind.clone()))?;

    let ports: Vec<PortMapping> =
        serde_json::from_str(annotation(PORTS_ANNOTATION)?).map_err(RecordError::InvalidPorts)?;
    // `u16` lets port 0 through, and nothing bounds the list; neither is a
    // record this runner writes, and adopting one publishes a Service the
    // apiserver refuses.
    if let Some(problem) = ports_problem(&ports) {
        return Err(RecordError::InvalidPorts(serde::de::Error::custom(problem)));
    }

    let inspect = match annotation(INSPECT_ANNOTATION)?.as_str() {
        "true" => true,
        "false" => false,
        other => return Err(RecordError::InvalidInspect(other.to_owned())),
    };

    let app = annotations.and_then(|a| a.get(APP_ANNOTATION));
    let app = match (kind, app) {
        (SessionKind::App, Some(name)) if !name.is_empty() => Some(name.clone()),
        (SessionKind::App, _) => return Err(RecordError::MissingApp),
        (SessionKind::Run, Some(_)) => return Err(RecordError::UnexpectedApp),
        (SessionKind::Run, None) => None,
    };

    let token_digest = match annotations.and_then(|a| a.get(TOKEN_DIGEST_ANNOTATION)) {
        None => None,
        Some(text) => {
            let mut digest = [0_u8; 32];
            hex::decode_to_slice(text, &mut digest)
                .map_err(|_| RecordError::InvalidTokenDigest(text.clone()))?;
            Some(digest)
        }
    };

    // A session whose owner record was edited into garbage is not adopted:
    // guessing would show it to the wrong principal.
    let owner = match annotations.and_then(|a| a.get(OWNER_ANNOTATION)) {
        None => None,
        Some(text) => Some(serde_json::from_str(text).map_err(RecordError::InvalidOwner)?),
    };

    Ok(SessionRecord {
        session_id: session_id.clone(),
        created_at: created_at.clone(),
        kind,
        ports,
        inspect,
        app,
        token_digest,
        owner,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use runner_core::types::PortProtocol;

    const SESSION: &str = "abc234defghi";

    fn record(kind: SessionKind) -> SessionRecord {
        SessionRecord {
            session_id: SESSION.to_owned(),
            created_at: "2026-01-01T00:00:00.123Z".to_owned(),
            kind,
            ports: vec![
                PortMapping {
                    port: 8080,
                    protocol: PortProtocol::Tcp,
                },
                PortMapping {
                    port: 5353,
                    protocol: PortProtocol::Udp,
                },
            ],
            inspect: true,
            app: (kind == SessionKind::App).then(|| "tool".to_owned()),
            token_digest: None,
            owner: None,
        }
    }

    fn pod_carrying(record: &SessionRecord) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(pod_name(&record.session_id)),
                labels: Some(BTreeMap::from([(
                    SESSION_ID_LABEL.to_owned(),
                    record.session_id.clone(),
                )])),
                annotations: Some(record_annotations(record)),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn with_annotation(mut pod: Pod, key: &str, value: Option<&str>) -> Pod {
        let annotations = pod.metadata.annotations.get_or_insert_default();
        match value {
            Some(value) => annotations.insert(key.to_owned(), value.to_owned()),
            None => annotations.remove(key),
        };
        pod
    }

    #[test]
    fn annotations_are_compact_and_readable() {
        let annotations = record_annotations(&record(SessionKind::App));
        assert_eq!(
            annotations,
            BTreeMap::from([
                (
                    "telo.run/created-at".to_owned(),
                    "2026-01-01T00:00:00.123Z".to_owned()
                ),
                ("telo.run/kind".to_owned(), "app".to_owned()),
                (
                    "telo.run/ports".to_owned(),
                    r#"[{"port":8080,"protocol":"tcp"},{"port":5353,"protocol":"udp"}]"#.to_owned()
                ),
                ("telo.run/inspect".to_owned(), "true".to_owned()),
                ("telo.run/app".to_owned(), "tool".to_owned()),
            ])
        );
        let run = record_annotations(&SessionRecord {
            ports: vec![],
            inspect: false,
            ..record(SessionKind::Run)
        });
        assert_eq!(run["telo.run/ports"], "[]");
        assert_eq!(run["telo.run/inspect"], "false");
        assert!(!run.contains_key("telo.run/app"));
    }

    #[test]
    fn a_token_digest_is_recorded_in_hex_and_read_back_checked() {
        let record = SessionRecord {
            token_digest: Some(runner_core::session::token_digest("secret")),
            ..record(SessionKind::App)
        };
        let annotations = record_annotations(&record);
        assert_eq!(
            annotations[TOKEN_DIGEST_ANNOTATION],
            "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
        );
        assert_eq!(
            session_record_from_pod(&pod_carrying(&record)).unwrap(),
            record
        );
        let mut pod = pod_carrying(&record);
        pod.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(TOKEN_DIGEST_ANNOTATION.to_owned(), "not hex".to_owned());
        assert!(matches!(
            session_record_from_pod(&pod),
            Err(RecordError::InvalidTokenDigest(_))
        ));
    }

    #[test]
    fn records_read_back_from_their_pod() {
        for kind in [SessionKind::Run, SessionKind::App] {
            let record = record(kind);
            assert_eq!(
                session_record_from_pod(&pod_carrying(&record)).unwrap(),
                record
            );
        }
    }

    #[test]
    fn a_pod_without_labels_or_annotations_is_not_a_session() {
        let error = session_record_from_pod(&Pod::default()).unwrap_err();
        assert!(matches!(error, RecordError::MissingLabel(SESSION_ID_LABEL)));
        assert_eq!(
            error.to_string(),
            "session pod has no 'telo.run/session-id' label"
        );

        let mut pod = pod_carrying(&record(SessionKind::Run));
        pod.metadata.annotations = None;
        assert!(matches!(
            session_record_from_pod(&pod),
            Err(RecordError::MissingAnnotation(CREATED_AT_ANNOTATION))
        ));
    }

    #[test]
    fn a_malformed_session_id_label_is_refused() {
        for bad in [
            "",
            "ABC234DEFGHI",
            "abc234defgh",
            "abc234defghij",
            "abc234defgh1",
        ] {
            let mut pod = pod_carrying(&record(SessionKind::Run));
            pod.metadata
                .labels
                .get_or_insert_default()
                .insert(SESSION_ID_LABEL.to_owned(), bad.to_owned());
            pod.metadata.name = Some(pod_name(bad));
            assert!(
                matches!(session_record_from_pod(&pod), Err(RecordError::InvalidSessionId(ref id)) if id == bad),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_pod_whose_name_is_not_its_session_is_refused() {
        let mut pod = pod_carrying(&record(SessionKind::Run));
        pod.metadata.name = Some("telo-run-zzzzzzzzzzzz".to_owned());
        let error = session_record_from_pod(&pod).unwrap_err();
        assert!(matches!(error, RecordError::NameMismatch { .. }));
        assert_eq!(
            error.to_string(),
            "pod 'telo-run-zzzzzzzzzzzz' is not named after its session 'abc234defghi' \
             (expected 'telo-run-abc234defghi')"
        );
        pod.metadata.name = None;
        assert!(matches!(
            session_record_from_pod(&pod),
            Err(RecordError::NameMismatch { name: None, .. })
        ));
    }

    #[test]
    fn every_missing_annotation_is_named() {
        for key in [
            CREATED_AT_ANNOTATION,
            KIND_ANNOTATION,
            PORTS_ANNOTATION,
            INSPECT_ANNOTATION,
        ] {
            let pod = with_annotation(pod_carrying(&record(SessionKind::Run)), key, None);
            match session_record_from_pod(&pod) {
                Err(RecordError::MissingAnnotation(missing)) => assert_eq!(missing, key),
                other => panic!("{key}: {other:?}"),
            }
        }
    }

    #[test]
    fn malformed_annotations_are_refused_with_the_reason() {
        let cases: [(&str, &str, &str); 10] = [
            (
                CREATED_AT_ANNOTATION,
                "yesterday",
                "annotation 'telo.run/created-at' is not an RFC 3339 time: 'yesterday'",
            ),
            (
                KIND_ANNOTATION,
                "watch",
                "annotation 'telo.run/kind' is neither 'run' nor 'app': 'watch'",
            ),
            (
                KIND_ANNOTATION,
                "Run",
                "annotation 'telo.run/kind' is neither 'run' nor 'app': 'Run'",
            ),
            (
                PORTS_ANNOTATION,
                "8080",
                "annotation 'telo.run/ports' is not a list of ports",
            ),
            (
                PORTS_ANNOTATION,
                r#"[{"port":70000,"protocol":"tcp"}]"#,
                "annotation 'telo.run/ports' is not a list of ports",
            ),
            (
                PORTS_ANNOTATION,
                r#"[{"port":80,"protocol":"TCP"}]"#,
                "annotation 'telo.run/ports' is not a list of ports",
            ),
            (
                PORTS_ANNOTATION,
                r#"[{"port":80}]"#,
                "annotation 'telo.run/ports' is not a list of ports",
            ),
            (
                PORTS_ANNOTATION,
                "",
                "annotation 'telo.run/ports' is not a list of ports",
            ),
            (
                INSPECT_ANNOTATION,
                "yes",
                "annotation 'telo.run/inspect' is neither 'true' nor 'false': 'yes'",
            ),
            (
                APP_ANNOTATION,
                "tool",
                "a run session pod must not carry a 'telo.run/app' annotation",
            ),
        ];
        for (key, value, message) in cases {
            let pod = with_annotation(pod_carrying(&record(SessionKind::Run)), key, Some(value));
            let error = session_record_from_pod(&pod).unwrap_err();
            assert_eq!(error.to_string(), message, "{key}={value}");
        }
    }

    #[test]
    fn an_app_pod_needs_its_app_name() {
        for app in [None, Some("")] {
            let pod = with_annotation(pod_carrying(&record(SessionKind::App)), APP_ANNOTATION, app);
            assert!(
                matches!(session_record_from_pod(&pod), Err(RecordError::MissingApp)),
                "{app:?}"
            );
        }
    }
}
