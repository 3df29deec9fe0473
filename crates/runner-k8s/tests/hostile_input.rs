//! Hostile input against what the Kubernetes backend parses: objects coming
//! back from the apiserver (pods, their status and annotations, routing
//! objects), its environment, resource quantities and bundle archives.
//! Anyone with access to the session namespace can edit these objects, so
//! nothing read from them may panic, and what is accepted must be usable.
//!
//! Case counts are kept small for CI; `PROPTEST_CASES=200000 cargo test
//! --release -p runner-k8s --test hostile_input` is the long run.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use runner_core::bundle_path::normalize_bundle_path;
use runner_core::config::{CORE_SETTINGS, Env};
use runner_core::ids::is_session_id;
use runner_core::types::{BundleFile, RunBundle, RunStatus};
use runner_k8s::bundle_store::{BundleError, MAX_TAR_PATH_BYTES, bundle_tar_gz};
use runner_k8s::config::{K8S_SETTINGS, LimitCeilings, load_k8s_config};
use runner_k8s::pod::labels::{
    APP_ANNOTATION, CREATED_AT_ANNOTATION, INSPECT_ANNOTATION, KIND_ANNOTATION, PORTS_ANNOTATION,
    SESSION_ID_LABEL,
};
use runner_k8s::pod::limits::{
    RequestedLimits, clamp_limits, parse_cpu_millis, parse_memory_bytes,
};
use runner_k8s::pod::session_record::{SessionKind, pod_name, session_record_from_pod};
use runner_k8s::pod::status::{
    container_exit_code, pod_failure_message, provision_message, start_blocker, terminal_status,
};
use runner_k8s::routing::gateway::http_route_verdict;
use runner_k8s::routing::health::Verdict;
use runner_k8s::routing::ingress::ingress_verdict;
use serde_json::{Map, Value, json};

/// `cases` unless `PROPTEST_CASES` asks for more (or fewer).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        max_shrink_iters: 2048,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/hostile_input.txt",
        ))),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Generators

const NASTY_STRINGS: &[&str] = &[
    "",
    " ",
    "\t\n",
    "\0",
    "Pending",
    "Running",
    "Succeeded",
    "Failed",
    "Unknown",
    "Error",
    "Completed",
    "OOMKilled",
    "Evicted",
    "DeadlineExceeded",
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "PodInitializing",
    "ContainerCreating",
    "PodScheduled",
    "Unschedulable",
    "True",
    "False",
    "Accepted",
    "ResolvedRefs",
    "run",
    "app",
    "true",
    "false",
    "2026-01-01T00:00:00Z",
    "2026-01-01T00:00:00.123+02:00",
    "2026-13-01T00:00:00Z",
    "[]",
    "[{\"port\":80,\"protocol\":\"tcp\"}]",
    "[{\"port\":0,\"protocol\":\"tcp\"}]",
    "[{\"port\":65536,\"protocol\":\"tcp\"}]",
    "[{\"port\":80,\"protocol\":\"sctp\"}]",
    "[{\"port\":80}]",
    "abcdefghjkmn",
    "telo-run-abcdefghjkmn",
    "\u{202E}",
    "\u{E9}\u{301}",
    "\u{1F600}",
];

fn nasty_string() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::sample::select(NASTY_STRINGS).prop_map(str::to_owned),
        2 => any::<String>(),
        1 => (0usize..3000, prop::sample::select(&["a", "é", " ", "\u{1F600}"][..]))
            .prop_map(|(n, unit)| unit.repeat(n)),
    ]
    .boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(
            &[
                0i64,
                1,
                -1,
                137,
                255,
                2_147_483_647,
                2_147_483_648,
                -2_147_483_649
            ][..]
        )
        .prop_map(Value::from),
        nasty_string().prop_map(Value::String),
    ]
    .boxed()
}

fn json_value() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((nasty_string(), inner), 0..6)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
        .boxed()
}

/// A string usually, sometimes anything at all (which then fails to
/// deserialize, as the apiserver would never send it).
fn text() -> BoxedStrategy<Value> {
    prop_oneof![
        8 => nasty_string().prop_map(Value::String),
        1 => leaf(),
    ]
    .boxed()
}

fn optional(value: BoxedStrategy<Value>) -> BoxedStrategy<Option<Value>> {
    prop::option::weighted(0.7, value).boxed()
}

fn object(fields: Vec<(&'static str, Option<Value>)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(key, value)| value.map(|value| (key.to_owned(), value)))
            .collect(),
    )
}

fn exit_code() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => any::<i32>().prop_map(Value::from),
        3 => (-2i32..300).prop_map(Value::from),
        1 => leaf(),
    ]
    .boxed()
}

fn container_state() -> BoxedStrategy<Value> {
    let waiting = (optional(text()), optional(text()))
        .prop_map(|(reason, message)| object(vec![("reason", reason), ("message", message)]));
    let terminated =
        (exit_code(), optional(text()), optional(text())).prop_map(|(code, reason, message)| {
            object(vec![
                ("exitCode", Some(code)),
                ("reason", reason),
                ("message", message),
            ])
        });
    (
        optional(waiting.boxed()),
        optional(terminated.boxed()),
        optional(Just(json!({})).boxed()),
    )
        .prop_map(|(waiting, terminated, running)| {
            object(vec![
                ("waiting", waiting),
                ("terminated", terminated),
                ("running", running),
            ])
        })
        .boxed()
}

fn container_status() -> BoxedStrategy<Value> {
    (
        text(),
        optional(container_state()),
        optional(container_state()),
        any::<bool>(),
    )
        .prop_map(|(name, state, last_state, ready)| {
            object(vec![
                ("name", Some(name)),
                ("image", Some(json!("img"))),
                ("imageID", Some(json!(""))),
                ("ready", Some(json!(ready))),
                ("restartCount", Some(json!(0))),
                ("state", state),
                ("lastState", last_state),
            ])
        })
        .boxed()
}

fn condition() -> BoxedStrategy<Value> {
    (text(), text(), optional(text()), optional(text()))
        .prop_map(|(kind, status, reason, message)| {
            object(vec![
                ("type", Some(kind)),
                ("status", Some(status)),
                ("reason", reason),
                ("message", message),
            ])
        })
        .boxed()
}

fn pod_status() -> BoxedStrategy<Value> {
    (
        optional(text()),
        optional(text()),
        optional(text()),
        optional(
            prop::collection::vec(condition(), 0..3)
                .prop_map(Value::Array)
                .boxed(),
        ),
        optional(
            prop::collection::vec(container_status(), 0..3)
                .prop_map(Value::Array)
                .boxed(),
        ),
        optional(
            prop::collection::vec(container_status(), 0..3)
                .prop_map(Value::Array)
                .boxed(),
        ),
    )
        .prop_map(|(phase, reason, message, conditions, inits, containers)| {
            object(vec![
                ("phase", phase),
                ("reason", reason),
                ("message", message),
                ("conditions", conditions),
                ("initContainerStatuses", inits),
                ("containerStatuses", containers),
            ])
        })
        .boxed()
}

fn string_map(
    pairs: impl Strategy<Value = Vec<(String, String)>> + 'static,
) -> BoxedStrategy<Value> {
    pairs
        .prop_map(|pairs| {
            Value::Object(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            )
        })
        .boxed()
}

/// Session id, name, labels and annotations: mostly a well-formed record with
/// one or two fields hand-edited.
fn metadata() -> BoxedStrategy<Value> {
    let id = prop_oneof![
        3 => Just("abcdefghjkmn".to_owned()),
        1 => "[a-z0-9]{10,14}",
        1 => nasty_string(),
    ];
    let record_key = prop::sample::select(
        &[
            SESSION_ID_LABEL,
            CREATED_AT_ANNOTATION,
            KIND_ANNOTATION,
            PORTS_ANNOTATION,
            INSPECT_ANNOTATION,
            APP_ANNOTATION,
        ][..],
    );
    let ports = prop_oneof![
        Just("[]".to_owned()),
        prop::collection::vec((json_value(), json_value()), 0..4).prop_map(|ports| {
            Value::Array(
                ports
                    .into_iter()
                    .map(|(port, protocol)| json!({"port": port, "protocol": protocol}))
                    .collect(),
            )
            .to_string()
        }),
        prop::collection::vec(
            (0u32..70_000, prop::sample::select(&["tcp", "udp"][..])),
            0..4
        )
        .prop_map(|ports| {
            Value::Array(
                ports
                    .into_iter()
                    .map(|(port, protocol)| json!({"port": port, "protocol": protocol}))
                    .collect(),
            )
            .to_string()
        }),
        nasty_string(),
    ];
    (
        id,
        any::<bool>(),
        prop::option::of(nasty_string()),
        ports,
        prop::sample::select(&["run", "app", "App", ""][..]),
        prop::option::of(nasty_string()),
        prop::collection::vec((record_key, prop::option::of(nasty_string())), 0..3),
        prop::option::of(string_map(prop::collection::vec(
            (nasty_string(), nasty_string()),
            0..3,
        ))),
    )
        .prop_map(
            |(id, named_after_id, name, ports, kind, app, edits, extra)| {
                let mut labels = Map::new();
                labels.insert(SESSION_ID_LABEL.into(), json!(id));
                let mut annotations = Map::new();
                annotations.insert(
                    CREATED_AT_ANNOTATION.into(),
                    json!("2026-01-01T00:00:00.000Z"),
                );
                annotations.insert(KIND_ANNOTATION.into(), json!(kind));
                annotations.insert(PORTS_ANNOTATION.into(), json!(ports));
                annotations.insert(INSPECT_ANNOTATION.into(), json!("false"));
                if let Some(app) = app {
                    annotations.insert(APP_ANNOTATION.into(), json!(app));
                }
                for (key, value) in edits {
                    let map = if key == SESSION_ID_LABEL {
                        &mut labels
                    } else {
                        &mut annotations
                    };
                    match value {
                        Some(value) => map.insert(key.to_owned(), json!(value)),
                        None => map.remove(key),
                    };
                }
                if let Some(Value::Object(extra)) = extra {
                    annotations.extend(extra);
                }
                let name = if named_after_id {
                    Some(pod_name(&id))
                } else {
                    name
                };
                object(vec![
                    ("name", name.map(Value::String)),
                    ("labels", Some(Value::Object(labels))),
                    ("annotations", Some(Value::Object(annotations))),
                ])
            },
        )
        .boxed()
}

/// A Pod as JSON: a plausible one with hostile values, or anything at all.
fn pod_json() -> BoxedStrategy<Value> {
    let plausible = (metadata(), optional(pod_status())).prop_map(|(metadata, status)| {
        object(vec![
            ("apiVersion", Some(json!("v1"))),
            ("kind", Some(json!("Pod"))),
            ("metadata", Some(metadata)),
            ("status", status),
        ])
    });
    prop_oneof![
        8 => plausible,
        1 => json_value(),
        1 => json_value().prop_map(|status| json!({"metadata": {}, "status": status})),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------
// Pods and their status

fn check_failure_message(message: &str) -> Result<(), TestCaseError> {
    prop_assert!(!message.trim().is_empty(), "empty failure message");
    prop_assert!(!message.ends_with(": "), "dangling detail in {message:?}");
    Ok(())
}

fn check_pod(pod: &Pod) -> Result<(), TestCaseError> {
    let _ = provision_message(pod);
    let _ = container_exit_code(pod);
    if let Some(blocker) = start_blocker(pod) {
        check_failure_message(&blocker)?;
    }
    check_failure_message(&pod_failure_message(Some(pod)))?;
    prop_assert_eq!(terminal_status(pod, true), RunStatus::Stopped);
    if let RunStatus::Failed { message } = terminal_status(pod, false) {
        check_failure_message(&message)?;
    }
    if let Ok(record) = session_record_from_pod(pod) {
        // What adoption takes over must be a session this runner could have
        // made: the id and the pod name agree, the kind and app agree, and
        // every port can be published.
        prop_assert!(is_session_id(&record.session_id));
        prop_assert_eq!(
            pod.metadata.name.clone(),
            Some(pod_name(&record.session_id))
        );
        prop_assert_eq!(record.kind == SessionKind::App, record.app.is_some());
        prop_assert!(
            record.ports.iter().all(|p| p.port >= 1),
            "adopted port 0: {:?}",
            record.ports
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn hostile_pods_never_panic_the_status_functions(raw in pod_json()) {
        if let Ok(pod) = serde_json::from_value::<Pod>(raw) {
            check_pod(&pod)?;
        }
    }

    #[test]
    fn routing_objects_of_any_status_have_a_verdict(
        status in prop_oneof![
            json_value(),
            (prop::collection::vec(
                (prop::option::of(json_value()),
                 prop::collection::vec((condition(), prop::option::of(any::<i64>())), 0..3)),
                0..3,
            ))
                .prop_map(|parents| json!({"parents": parents.into_iter().map(|(parent_ref, conditions)| json!({
                    "parentRef": parent_ref,
                    "conditions": conditions.into_iter().map(|(mut condition, observed)| {
                        if let Some(observed) = observed { condition["observedGeneration"] = json!(observed); }
                        condition
                    }).collect::<Vec<_>>(),
                })).collect::<Vec<_>>()})),
            prop::option::of(json_value()).prop_map(|ingress| json!({"loadBalancer": {"ingress": ingress}})),
        ],
        generation in prop::option::of(any::<i64>()),
    ) {
        let object = json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "telo-run-abcdefghjkmn-80", "generation": generation},
            "spec": {}, "status": status,
        });
        if let Ok(object) = serde_json::from_value::<DynamicObject>(object) {
            if let Verdict::Refused(reason) = http_route_verdict(&object) {
                prop_assert!(!reason.is_empty());
            }
            prop_assert_ne!(ingress_verdict(&object), Verdict::Refused(String::new()));
        }
    }
}

// Regressions found by the properties above.

fn run_pod_with_ports(ports: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": pod_name("abcdefghjkmn"),
            "labels": {SESSION_ID_LABEL: "abcdefghjkmn"},
            "annotations": {
                CREATED_AT_ANNOTATION: "2026-01-01T00:00:00.000Z",
                KIND_ANNOTATION: "run",
                PORTS_ANNOTATION: ports,
                INSPECT_ANNOTATION: "false",
            },
        },
    }))
    .unwrap()
}

/// `u16` took port 0, so a hand-edited record was adopted with a port no
/// Service can publish; a list longer than a request may carry likewise.
#[test]
fn a_pod_record_with_port_zero_or_too_many_ports_is_not_adopted() {
    let too_many: Vec<Value> = (1..=101)
        .map(|port| json!({"port": port, "protocol": "tcp"}))
        .collect();
    for ports in [
        "[{\"port\":0,\"protocol\":\"tcp\"}]".to_owned(),
        Value::Array(too_many).to_string(),
    ] {
        assert_eq!(
            session_record_from_pod(&run_pod_with_ports(&ports))
                .unwrap_err()
                .to_string(),
            format!("annotation '{PORTS_ANNOTATION}' is not a list of ports")
        );
    }
    let hundred: Vec<Value> = (1..=100)
        .map(|port| json!({"port": port, "protocol": "tcp"}))
        .collect();
    let record = session_record_from_pod(&run_pod_with_ports(&Value::Array(hundred).to_string()));
    assert_eq!(record.unwrap().ports.len(), 100);
}

/// A blank pod reason became the whole failure message (`" "`), and a blank
/// waiting reason a progress line of one space.
#[test]
fn blank_reasons_count_as_no_reason() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "telo-run-abcdefghjkmn"},
        "status": {"phase": "Failed", "reason": " "},
    }))
    .unwrap();
    assert_eq!(pod_failure_message(Some(&pod)), "pod failed");
    // Nor does one of punctuation only (found by the property below).
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "telo-run-abcdefghjkmn"},
        "status": {"phase": "Failed", "reason": ": "},
    }))
    .unwrap();
    assert_eq!(pod_failure_message(Some(&pod)), "pod failed");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "telo-run-abcdefghjkmn"},
        "status": {"phase": "Pending", "containerStatuses": [{
            "name": "session", "image": "img", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "  "}},
        }]},
    }))
    .unwrap();
    assert_eq!(provision_message(&pod).as_deref(), Some("Scheduling"));
    assert_eq!(pod_failure_message(Some(&pod)), "pod failed");
    // A blank pod reason does not hide a plain exit either.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "telo-run-abcdefghjkmn"},
        "status": {"phase": "Failed", "reason": " ", "containerStatuses": [{
            "name": "session", "image": "img", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3, "reason": "Error"}},
        }]},
    }))
    .unwrap();
    assert_eq!(terminal_status(&pod, false), RunStatus::Exited { code: 3 });
}

// ---------------------------------------------------------------------------
// Environment

fn documented_names() -> Vec<&'static str> {
    CORE_SETTINGS
        .iter()
        .chain(K8S_SETTINGS)
        .map(|var| var.name)
        .collect()
}

fn k8s_env() -> BoxedStrategy<Env> {
    let value = prop_oneof![
        4 => nasty_string(),
        1 => json_value().prop_map(|v| v.to_string()),
        1 => "[\\\\()\\[\\]{}*+?|^$.a-z0-9,]{0,24}",
        1 => prop::sample::select(&["auto", "ingress", "gateway", "none", "adopt", "reap", "http://", "https://x", "1e3", "0x10", "-1"][..]).prop_map(str::to_owned),
    ];
    (
        prop::option::of(nasty_string()),
        prop::collection::vec((prop::sample::select(documented_names()), value), 0..10),
    )
        .prop_map(|(self_url, pairs)| {
            let mut env: Env = pairs
                .into_iter()
                .map(|(name, value)| {
                    // Reading a path an operator names is not hostile input.
                    let value = if name.ends_with("_FILE") {
                        format!("/nonexistent/hostile-input/{}", value.len())
                    } else {
                        value
                    };
                    (name.to_owned(), value)
                })
                .collect();
            if let Some(url) = self_url {
                env.entry("RUNNER_SELF_URL".into()).or_insert(url);
            }
            env
        })
        .boxed()
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn k8s_config_refuses_with_a_message_naming_the_variable(env in k8s_env()) {
        match load_k8s_config(&env) {
            Ok(config) => {
                prop_assert!(!config.self_url.is_empty() && !config.self_url.ends_with('/'));
                prop_assert!(!config.session_namespace.trim().is_empty());
                prop_assert!(config.base_image_catalog.limit >= 1);
                prop_assert!(!config.start_deadline.is_zero());
                prop_assert!(!config.routing.route_ready_timeout.is_zero());
            }
            Err(err) => {
                let names = documented_names();
                prop_assert!(
                    names.iter().any(|name| err.to_string().contains(name)),
                    "a config error that names no variable: {}", err
                );
            }
        }
    }

    #[test]
    fn quantities_never_loosen_a_ceiling(
        cpu in nasty_string(),
        memory in prop_oneof![nasty_string(), "[0-9.]{0,6} ?(Ki|Mi|Gi|Ti|K|k|M|G|T|Pi|E|m)?"],
        ceiling in prop_oneof![Just("512Mi".to_owned()), nasty_string()],
        ttl in prop::option::of(any::<u64>()),
    ) {
        let cpu_millis = parse_cpu_millis(&cpu);
        let memory_bytes = parse_memory_bytes(&memory);
        for value in [cpu_millis, memory_bytes].into_iter().flatten() {
            prop_assert!(!value.is_nan());
        }
        let ceilings = LimitCeilings {
            cpu: "500m".into(),
            memory: ceiling.clone(),
            ttl_seconds: 3600,
            ephemeral_storage: ceiling.clone(),
        };
        let requested = RequestedLimits {
            cpu: Some(cpu.clone()),
            memory: Some(memory.clone()),
            ephemeral_storage: Some(memory.clone()),
            ttl_seconds: ttl,
        };
        let effective = clamp_limits(&ceilings, Some(&requested));
        prop_assert!(effective.ttl_seconds >= 1 && effective.ttl_seconds <= 3600);
        if effective.cpu != ceilings.cpu {
            prop_assert!(cpu_millis.unwrap() <= 500.0);
        }
        if effective.memory != ceiling {
            prop_assert!(memory_bytes.unwrap() <= parse_memory_bytes(&ceiling).unwrap());
        }
    }
}

// ---------------------------------------------------------------------------
// Bundle archives

const PATH_PARTS: &[&str] = &[
    "",
    ".",
    "..",
    "a",
    "telo.yaml",
    "\\",
    "..\\",
    "%2e%2e",
    "\u{FF0E}\u{FF0E}",
    "\u{202E}",
    "e\u{301}",
    "\u{E9}",
    "\0",
    " ",
    "\n",
];

fn bundle_path() -> BoxedStrategy<String> {
    let part = prop_oneof![
        6 => prop::sample::select(PATH_PARTS).prop_map(str::to_owned),
        1 => "[a-z.]{90,110}",
        1 => any::<String>(),
    ];
    (
        prop::option::of(prop::sample::select(&["/", "./", "../"][..])),
        prop::collection::vec(part, 0..8),
    )
        .prop_map(|(lead, parts)| format!("{}{}", lead.unwrap_or_default(), parts.join("/")))
        .boxed()
}

proptest! {
    #![proptest_config(config(512))]

    /// Whatever the core's path guard accepted, the archive either holds it
    /// under its normalized name or refuses it as too long for ustar.
    #[test]
    fn bundle_archives_take_every_accepted_path_or_refuse_it(
        paths in prop::collection::vec(bundle_path(), 1..4),
        contents in any::<String>(),
    ) {
        let files: Vec<BundleFile> = paths
            .iter()
            .map(|path| BundleFile { relative_path: path.clone(), contents: contents.clone() })
            .collect();
        let bundle = RunBundle { entry_relative_path: "telo.yaml".into(), files };
        match bundle_tar_gz(&bundle) {
            Ok(_) => {
                for path in &paths {
                    let name = normalize_bundle_path(path).unwrap();
                    prop_assert!(name.len() <= MAX_TAR_PATH_BYTES);
                }
            }
            Err(BundleError::InvalidPath(err)) => {
                prop_assert!(paths.iter().any(|path| normalize_bundle_path(path) == Err(err.clone())));
            }
            Err(BundleError::PathTooLong(name)) => {
                prop_assert!(paths.iter().any(|path| normalize_bundle_path(path).as_ref() == Ok(&name)));
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected archive error: {other}"))),
        }
    }
}

#[test]
fn annotations_on_a_real_record_round_trip() {
    // Sanity for the generator: the well-formed record the pods start from
    // is adopted.
    let mut annotations = BTreeMap::new();
    annotations.insert(CREATED_AT_ANNOTATION, "2026-01-01T00:00:00.000Z");
    annotations.insert(KIND_ANNOTATION, "run");
    annotations.insert(PORTS_ANNOTATION, "[{\"port\":80,\"protocol\":\"tcp\"}]");
    annotations.insert(INSPECT_ANNOTATION, "false");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": pod_name("abcdefghjkmn"),
            "labels": {SESSION_ID_LABEL: "abcdefghjkmn"},
            "annotations": annotations,
        },
    }))
    .unwrap();
    assert_eq!(session_record_from_pod(&pod).unwrap().ports.len(), 1);
}
