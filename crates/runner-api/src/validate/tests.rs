use super::*;
use crate::js::js_number_to_string;
use crate::types::{BundleFile, PortProtocol};
use rstest::rstest;
use serde_json::json;

fn start_body() -> Value {
    json!({
        "bundle": {"entryRelativePath": "telo.yaml", "files": [{"relativePath": "telo.yaml", "contents": "kind: App"}]},
        "env": {},
        "config": {"image": "telorun/node:0-slim", "pullPolicy": "missing"}
    })
}

/// `start_body()` with the JSON Pointer `pointer` set to `value`.
fn start_body_with(pointer: &str, value: Value) -> Value {
    let mut body = start_body();
    set(&mut body, pointer, value);
    body
}

fn set(body: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = body.pointer_mut(parent).unwrap();
    match parent {
        Value::Object(map) => {
            map.insert(key.to_owned(), value);
        }
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        _ => panic!("cannot set {pointer}"),
    }
}

fn start_message(body: Value) -> String {
    validate_start_session(Some(body)).unwrap_err().message
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn a_minimal_start_body_is_accepted_with_defaults() {
    let body = validate_start_session(Some(start_body())).unwrap();
    assert_eq!(
        body,
        StartSessionBody {
            bundle: RunBundle {
                entry_relative_path: "telo.yaml".into(),
                files: vec![BundleFile {
                    relative_path: "telo.yaml".into(),
                    contents: "kind: App".into()
                }],
            },
            env: vec![],
            ports: vec![],
            config: RequestedConfig {
                image: Some("telorun/node:0-slim".into()),
                pull_policy: Some(PullPolicy::Missing),
                registry_url: None
            },
            inspect: false,
            mode: crate::watch::SessionMode::Run,
            agent: None,
            apps: None,
            telo: None,
        }
    );
}

#[test]
fn a_full_start_body_keeps_everything_and_ignores_unknown_fields() {
    let body = json!({
        "bundle": {"entryRelativePath": "app/telo.yaml", "files": [], "extra": 1},
        "env": {"B": "2", "A": "1", "10": "ten", "2": "two"},
        "ports": [{"port": 8080, "protocol": "tcp"}, {"port": 53, "protocol": "udp", "name": "dns"}],
        "config": {"image": "img", "pullPolicy": "never", "registryUrl": "  ", "baseUrl": "x"},
        "inspect": true,
        "app": "legacy"
    });
    let body = validate_start_session(Some(body)).unwrap();
    assert_eq!(body.bundle.entry_relative_path, "app/telo.yaml");
    assert!(body.bundle.files.is_empty());
    assert_eq!(
        body.env,
        pairs(&[("2", "two"), ("10", "ten"), ("B", "2"), ("A", "1")])
    );
    assert_eq!(
        body.ports,
        vec![
            PortMapping {
                port: 8080,
                protocol: PortProtocol::Tcp
            },
            PortMapping {
                port: 53,
                protocol: PortProtocol::Udp
            },
        ]
    );
    assert_eq!(body.config.pull_policy, Some(PullPolicy::Never));
    assert_eq!(body.config.registry_url.as_deref(), Some("  "));
    assert!(body.inspect);
}

#[rstest]
#[case::absent(None, "body must be object")]
#[case::null(Some(json!(null)), "body must be object")]
#[case::array(Some(json!([{}])), "body must be object")]
#[case::string(Some(json!("{}")), "body must be object")]
#[case::empty(Some(json!({})), "body must have required property 'bundle'")]
#[case::env_only(Some(json!({"env": {}})), "body must have required property 'bundle'")]
#[case::no_env(Some(json!({"bundle": 1, "config": 1})), "body must have required property 'env'")]
fn start_bodies_must_be_objects_with_the_required_fields(
    #[case] body: Option<Value>,
    #[case] message: &str,
) {
    assert_eq!(validate_start_session(body).unwrap_err().message, message);
}

#[rstest]
#[case("/bundle", json!([]), "body/bundle must be object")]
#[case("/bundle", json!(null), "body/bundle must be object")]
#[case("/bundle", json!({"files": []}), "body/bundle must have required property 'entryRelativePath'")]
#[case("/bundle", json!({"entryRelativePath": "x"}), "body/bundle must have required property 'files'")]
#[case("/bundle/entryRelativePath", json!(""), "body/bundle/entryRelativePath must NOT have fewer than 1 characters")]
#[case("/bundle/entryRelativePath", json!(null), "body/bundle/entryRelativePath must NOT have fewer than 1 characters")]
#[case("/bundle/entryRelativePath", json!({}), "body/bundle/entryRelativePath must be string")]
#[case("/bundle/files", json!({}), "body/bundle/files must be array")]
#[case("/bundle/files", json!(null), "body/bundle/files/0 must be object")]
#[case("/bundle/files", json!("a.yaml"), "body/bundle/files/0 must be object")]
#[case("/bundle/files/0", json!({"contents": ""}), "body/bundle/files/0 must have required property 'relativePath'")]
#[case("/bundle/files/0", json!({"relativePath": "a"}), "body/bundle/files/0 must have required property 'contents'")]
#[case("/bundle/files/0/relativePath", json!({}), "body/bundle/files/0/relativePath must be string")]
#[case("/bundle/files/0/relativePath", json!([[1]]), "body/bundle/files/0/relativePath must be string")]
#[case("/bundle/files/0/relativePath", json!(""), "body/bundle/files/0/relativePath must NOT have fewer than 1 characters")]
#[case("/bundle/files/0/contents", json!({"a": 1}), "body/bundle/files/0/contents must be string")]
#[case("/bundle/files/0/contents", json!([]), "body/bundle/files/0/contents must be string")]
#[case("/env", json!(null), "body/env must be object")]
#[case("/env", json!([]), "body/env must be object")]
#[case("/env", json!("A=1"), "body/env must be object")]
#[case("/env", json!({"FOO": {}}), "body/env/FOO must be string")]
#[case("/env", json!({"FOO": [1, 2]}), "body/env/FOO must be string")]
#[case("/env", json!({"a/b~c": {}}), "body/env/a~1b~0c must be string")]
#[case("/env", json!({"Z": {}, "7": {}}), "body/env/7 must be string")]
#[case("/ports", json!({}), "body/ports must be array")]
#[case("/ports", json!(8080), "body/ports/0 must be object")]
#[case("/ports", json!([8080]), "body/ports/0 must be object")]
#[case("/ports", json!([{"protocol": "tcp"}]), "body/ports/0 must have required property 'port'")]
#[case("/ports", json!([{"port": 1}]), "body/ports/0 must have required property 'protocol'")]
#[case("/ports", json!([{"port": 0, "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
#[case("/ports", json!([{"port": false, "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
#[case("/ports", json!([{"port": null, "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
#[case("/ports", json!([{"port": "", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
#[case("/ports", json!([{"port": "  ", "protocol": "tcp"}]), "body/ports/0/port must be >= 1")]
#[case("/ports", json!([{"port": 65536, "protocol": "tcp"}]), "body/ports/0/port must be <= 65535")]
#[case("/ports", json!([{"port": "1e9", "protocol": "tcp"}]), "body/ports/0/port must be <= 65535")]
#[case("/ports", json!([{"port": 80.5, "protocol": "tcp"}]), "body/ports/0/port must be integer")]
#[case("/ports", json!([{"port": "80.5", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
#[case("/ports", json!([{"port": "http", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
#[case("/ports", json!([{"port": "Infinity", "protocol": "tcp"}]), "body/ports/0/port must be integer")]
#[case("/ports", json!([{"port": [80, 81], "protocol": "tcp"}]), "body/ports/0/port must be integer")]
#[case("/ports", json!([{"port": {}, "protocol": "tcp"}]), "body/ports/0/port must be integer")]
#[case("/ports", json!([{"port": 80, "protocol": "TCP"}]), "body/ports/0/protocol must be equal to one of the allowed values")]
#[case("/ports", json!([{"port": 80, "protocol": "sctp"}]), "body/ports/0/protocol must be equal to one of the allowed values")]
#[case("/ports", json!([{"port": 80, "protocol": null}]), "body/ports/0/protocol must be equal to one of the allowed values")]
#[case("/ports", json!([{"port": 80, "protocol": "tcp"}, {"port": 80, "protocol": 6}]), "body/ports/1/protocol must be equal to one of the allowed values")]
#[case("/config", json!("img"), "body/config must be object")]
#[case("/config/image", json!(""), "body/config/image must NOT have fewer than 1 characters")]
#[case("/config/image", json!(null), "body/config/image must NOT have fewer than 1 characters")]
#[case("/config/image", json!({}), "body/config/image must be string")]
#[case("/config/pullPolicy", json!("sometimes"), "body/config/pullPolicy must be equal to one of the allowed values")]
#[case("/config/pullPolicy", json!("Always"), "body/config/pullPolicy must be equal to one of the allowed values")]
#[case("/config/pullPolicy", json!(["always", "never"]), "body/config/pullPolicy must be string")]
#[case("/config/registryUrl", json!(""), "body/config/registryUrl must NOT have fewer than 1 characters")]
#[case("/config/registryUrl", json!(null), "body/config/registryUrl must NOT have fewer than 1 characters")]
#[case("/config/registryUrl", json!({}), "body/config/registryUrl must be string")]
#[case("/inspect", json!("yes"), "body/inspect must be boolean")]
#[case("/inspect", json!("TRUE"), "body/inspect must be boolean")]
#[case("/inspect", json!(2), "body/inspect must be boolean")]
#[case("/inspect", json!({}), "body/inspect must be boolean")]
#[case("/inspect", json!([true, false]), "body/inspect must be boolean")]
fn start_body_fields_report_ajv_messages(
    #[case] pointer: &str,
    #[case] value: Value,
    #[case] message: &str,
) {
    assert_eq!(start_message(start_body_with(pointer, value)), message);
}

#[test]
fn only_the_first_error_in_schema_order_is_reported() {
    let body = json!({
        "inspect": "nope",
        "config": {},
        "ports": [{"port": 0}],
        "env": {"A": {}},
        "bundle": {"entryRelativePath": ""}
    });
    assert_eq!(
        start_message(body),
        "body/bundle must have required property 'files'"
    );
    let body = json!({
        "inspect": "nope",
        "config": {},
        "ports": [{"port": 0, "protocol": "tcp"}],
        "env": {"A": "1"},
        "bundle": {"entryRelativePath": "a", "files": []}
    });
    assert_eq!(start_message(body), "body/ports/0/port must be >= 1");
}

#[rstest]
#[case::number_string(json!("8080"), 8080)]
#[case::padded_string(json!(" 8080 "), 8080)]
#[case::hex_string(json!("0x1F90"), 8080)]
#[case::exponent_string(json!("8.08e3"), 8080)]
#[case::float_with_zero_fraction(json!(8080.0), 8080)]
#[case::exponent_number(json!(8.08e3), 8080)]
#[case::one_element_array(json!([8080]), 8080)]
#[case::one_element_array_of_string(json!(["8080"]), 8080)]
#[case::boolean_true(json!(true), 1)]
fn ports_are_coerced_to_integers(#[case] port: Value, #[case] expected: u16) {
    let body = start_body_with("/ports", json!([{"port": port, "protocol": "tcp"}]));
    let body = validate_start_session(Some(body)).unwrap();
    assert_eq!(body.ports[0].port, expected);
}

#[test]
fn a_single_port_mapping_is_wrapped_into_a_list() {
    let body = start_body_with("/ports", json!({"port": "9229", "protocol": ["udp"]}));
    // An object is not wrapped: only scalars are.
    assert_eq!(start_message(body), "body/ports must be array");
    let body = start_body_with("/ports", json!([{"port": "9229", "protocol": ["udp"]}]));
    assert_eq!(
        validate_start_session(Some(body)).unwrap().ports,
        vec![PortMapping {
            port: 9229,
            protocol: PortProtocol::Udp
        }]
    );
}

#[rstest]
#[case::integer(json!(42), "42")]
#[case::negative(json!(-7), "-7")]
#[case::float(json!(1.5), "1.5")]
#[case::whole_float(json!(3.0), "3")]
#[case::tiny(json!(1e-7), "1e-7")]
#[case::small(json!(0.000001), "0.000001")]
#[case::large(json!(1e21), "1e+21")]
#[case::below_exponent_form(json!(1e20), "100000000000000000000")]
#[case::big_mantissa(json!(1.2345e25), "1.2345e+25")]
#[case::beyond_f64_precision(json!(12345678901234567890u64), "12345678901234567000")]
#[case::min_i64(json!(i64::MIN), "-9223372036854776000")]
#[case::fraction(json!(0.1), "0.1")]
#[case::true_(json!(true), "true")]
#[case::false_(json!(false), "false")]
#[case::null(json!(null), "")]
#[case::one_element_array(json!(["x"]), "x")]
#[case::one_element_array_of_number(json!([5]), "5")]
#[case::one_element_array_of_null(json!([null]), "")]
fn env_values_are_coerced_to_strings(#[case] value: Value, #[case] expected: &str) {
    let body = start_body_with("/env", json!({"V": value}));
    let body = validate_start_session(Some(body)).unwrap();
    assert_eq!(body.env, pairs(&[("V", expected)]));
}

#[rstest]
#[case::string_true(json!("true"), true)]
#[case::string_false(json!("false"), false)]
#[case::one(json!(1), true)]
#[case::zero(json!(0), false)]
#[case::one_float(json!(1.0), true)]
#[case::null(json!(null), false)]
#[case::wrapped(json!([true]), true)]
#[case::wrapped_string(json!(["true"]), true)]
fn inspect_is_coerced_to_boolean(#[case] value: Value, #[case] expected: bool) {
    let body = start_body_with("/inspect", value);
    assert_eq!(
        validate_start_session(Some(body)).unwrap().inspect,
        expected
    );
}

#[rstest]
#[case::number_image("/config/image", json!(5), "5")]
#[case::bool_image("/config/image", json!(true), "true")]
#[case::wrapped_image("/config/image", json!(["img:1"]), "img:1")]
#[case::number_path("/bundle/entryRelativePath", json!(7), "7")]
fn strings_are_coerced_from_scalars(
    #[case] pointer: &str,
    #[case] value: Value,
    #[case] expected: &str,
) {
    let body = validate_start_session(Some(start_body_with(pointer, value))).unwrap();
    let actual = if pointer.starts_with("/config") {
        body.config.image.unwrap()
    } else {
        body.bundle.entry_relative_path
    };
    assert_eq!(actual, expected);
}

#[test]
fn a_wrapped_pull_policy_and_coerced_contents_are_accepted() {
    let mut body = start_body_with("/config/pullPolicy", json!(["always"]));
    set(&mut body, "/bundle/files/0/contents", json!(null));
    let body = validate_start_session(Some(body)).unwrap();
    assert_eq!(body.config.pull_policy, Some(PullPolicy::Always));
    assert_eq!(body.bundle.files[0].contents, "");
}

#[test]
fn a_scalar_files_value_is_wrapped_then_rejected_as_an_item() {
    assert_eq!(
        start_message(start_body_with("/bundle/files", json!(true))),
        "body/bundle/files/0 must be object"
    );
}

#[rstest]
#[case::empty_name(json!({"": "x"}), "body/env/ must be a valid environment variable name")]
#[case::equals(json!({"A=B": "x"}), "body/env/A=B must be a valid environment variable name")]
#[case::nul_name(json!({"A\u{0}": "x"}), "body/env/A\u{0} must be a valid environment variable name")]
#[case::nul_value(json!({"A": "x\u{0}y"}), "body/env/A must not contain NUL")]
#[case::too_long(json!({"BIG": "x".repeat(MAX_ENV_ENTRY_BYTES - 4)}), "body/env/BIG must be shorter: NAME=value may take at most 131072 bytes in a process environment")]
fn env_entries_a_process_cannot_hold_are_rejected(#[case] env: Value, #[case] message: &str) {
    assert_eq!(start_message(start_body_with("/env", env)), message);
}

#[test]
fn reference_errors_win_over_our_hardening() {
    let body = json!({"bundle": {"entryRelativePath": "a", "files": []}, "env": {"": "x"}, "config": {"image": ""}});
    assert_eq!(
        start_message(body),
        "body/config/image must NOT have fewer than 1 characters"
    );
}

#[test]
fn env_and_ports_are_bounded() {
    let env: Map<String, Value> = (0..=MAX_ENV_ENTRIES)
        .map(|i| (format!("K{i}"), json!("v")))
        .collect();
    assert_eq!(
        start_message(start_body_with("/env", Value::Object(env))),
        "body/env must NOT have more than 1000 properties"
    );
    let ports: Vec<Value> = (1..=MAX_PORTS + 1)
        .map(|port| json!({"port": port, "protocol": "tcp"}))
        .collect();
    assert_eq!(
        start_message(start_body_with("/ports", Value::Array(ports))),
        "body/ports must NOT have more than 100 items"
    );
    let env: Map<String, Value> = (0..MAX_ENV_ENTRIES)
        .map(|i| (format!("K{i}"), json!("v")))
        .collect();
    let ports: Vec<Value> = (1..=MAX_PORTS)
        .map(|port| json!({"port": port, "protocol": "tcp"}))
        .collect();
    let mut body = start_body_with("/env", Value::Object(env));
    set(&mut body, "/ports", Value::Array(ports));
    let body = validate_start_session(Some(body)).unwrap();
    assert_eq!(
        (body.env.len(), body.ports.len()),
        (MAX_ENV_ENTRIES, MAX_PORTS)
    );
}

#[test]
fn app_bodies_default_every_field() {
    assert_eq!(
        validate_app_session(Some(json!({"anything": 1}))),
        Ok(AppSessionBody {
            env: vec![],
            ports: vec![],
            inspect: false
        })
    );
    let body = validate_app_session(Some(json!({
        "env": {"N": 1},
        "ports": {"port": 1, "protocol": "tcp"}
    })));
    assert_eq!(body.unwrap_err().message, "body/ports must be array");
    let body = validate_app_session(Some(json!({
        "env": {"N": 1},
        "ports": [{"port": "3000", "protocol": "tcp"}],
        "inspect": "true"
    })))
    .unwrap();
    assert_eq!(
        body,
        AppSessionBody {
            env: pairs(&[("N", "1")]),
            ports: vec![PortMapping {
                port: 3000,
                protocol: PortProtocol::Tcp
            }],
            inspect: true
        }
    );
}

#[rstest]
#[case::absent(None, "body must be object")]
#[case::array(Some(json!([])), "body must be object")]
#[case::env(Some(json!({"env": "A=1"})), "body/env must be object")]
#[case::env_value(Some(json!({"env": {"FOO": {}}})), "body/env/FOO must be string")]
#[case::port(Some(json!({"ports": [{"port": 70000, "protocol": "tcp"}]})), "body/ports/0/port must be <= 65535")]
#[case::inspect(Some(json!({"inspect": "on"})), "body/inspect must be boolean")]
#[case::env_name(Some(json!({"env": {"A=B": "1"}})), "body/env/A=B must be a valid environment variable name")]
#[case::node_options(Some(json!({"env": {"MODE": "x", "NODE_OPTIONS": "--import=data:,1"}})), "body/env/NODE_OPTIONS is not accepted for an app session: it changes how the operator's program loads or runs")]
#[case::preload(Some(json!({"env": {"LD_PRELOAD": "/tmp/x.so"}})), "body/env/LD_PRELOAD is not accepted for an app session: it changes how the operator's program loads or runs")]
#[case::path(Some(json!({"env": {"PATH": "/tmp"}})), "body/env/PATH is not accepted for an app session: it changes how the operator's program loads or runs")]
fn app_bodies_report_ajv_messages(#[case] body: Option<Value>, #[case] message: &str) {
    assert_eq!(validate_app_session(body).unwrap_err().message, message);
}

#[test]
fn probe_strips_unknown_properties() {
    let body = json!({
        "config": {"image": "img", "pullPolicy": "always", "registryUrl": "", "baseUrl": 1},
        "extra": {"deep": true}
    });
    assert_eq!(
        validate_probe(Some(body)),
        Ok(("img".to_owned(), PullPolicy::Always))
    );
}

#[rstest]
#[case::absent(None, "body must be object")]
#[case::empty(Some(json!({})), "body must have required property 'config'")]
#[case::config_null(Some(json!({"config": null})), "body/config must be object")]
#[case::no_image(Some(json!({"config": {"pullPolicy": "never"}})), "body/config must have required property 'image'")]
#[case::no_policy(Some(json!({"config": {"image": "x"}})), "body/config must have required property 'pullPolicy'")]
#[case::empty_image(Some(json!({"config": {"image": "", "pullPolicy": "never"}})), "body/config/image must NOT have fewer than 1 characters")]
#[case::bad_policy(Some(json!({"config": {"image": "x", "pullPolicy": "latest"}})), "body/config/pullPolicy must be equal to one of the allowed values")]
fn probe_bodies_report_ajv_messages(#[case] body: Option<Value>, #[case] message: &str) {
    assert_eq!(validate_probe(body).unwrap_err().message, message);
}

#[test]
fn probe_coerces_like_the_other_routes() {
    assert_eq!(
        validate_probe(Some(
            json!({"config": {"image": 42, "pullPolicy": ["never"]}})
        )),
        Ok(("42".to_owned(), PullPolicy::Never))
    );
}

#[rstest]
#[case(0.5, "0.5")]
#[case(123.456, "123.456")]
#[case(-0.0, "0")]
#[case(100.0, "100")]
#[case(1e-6, "0.000001")]
#[case(1.5e-7, "1.5e-7")]
#[case(123456789012345680000.0, "123456789012345680000")]
#[case(5e-324, "5e-324")]
#[case(f64::MAX, "1.7976931348623157e+308")]
#[case(f64::INFINITY, "Infinity")]
#[case(f64::NAN, "NaN")]
fn numbers_print_like_javascript(#[case] number: f64, #[case] expected: &str) {
    assert_eq!(js_number_to_string(number), expected);
}

#[test]
fn the_published_schemas_come_from_the_checked_definitions() {
    let schemas = request_schemas();
    for name in [
        "StartSessionRequest",
        "AppSessionRequest",
        "ProbeRequest",
        "RunBundle",
        "BundleFile",
        "Env",
        "PortMapping",
        "PortProtocol",
        "PullPolicy",
        "SessionConfig",
    ] {
        assert!(schemas.contains_key(name), "{name} is not published");
    }
    assert_eq!(
        schemas["StartSessionRequest"]["required"],
        json!(["bundle", "env"])
    );
    assert_eq!(schemas["Env"]["maxProperties"], json!(MAX_ENV_ENTRIES));
    assert_eq!(
        schemas["StartSessionRequest"]["properties"]["ports"]["maxItems"],
        json!(MAX_PORTS)
    );
    assert_eq!(schemas["PullPolicy"]["enum"], json!(PullPolicy::ALL));
    assert_eq!(
        schemas["ProbeRequest"]["properties"]["config"]["required"],
        json!(["image", "pullPolicy"])
    );
}

#[test]
fn watch_fields_are_checked_with_ajv_messages() {
    let with = |key: &str, value: serde_json::Value| {
        let mut body = start_body();
        body[key] = value;
        validate_start_session(Some(body))
    };
    assert_eq!(
        with("mode", json!("live")).unwrap_err().message,
        "body/mode must be equal to one of the allowed values"
    );
    assert_eq!(
        with("apps", json!([])).unwrap_err().message,
        "body/apps must NOT have fewer than 1 items"
    );
    assert_eq!(
        with("apps", json!([{"name": "a"}])).unwrap_err().message,
        "body/apps/0 must have required property 'entryRelativePath'"
    );
    assert_eq!(
        with(
            "apps",
            json!([{"name": "a".repeat(64), "entryRelativePath": "a.yaml"}])
        )
        .unwrap_err()
        .message,
        "body/apps/0/name must NOT have more than 63 characters"
    );
    assert_eq!(
        with(
            "apps",
            json!([{"name": "a", "entryRelativePath": "a.yaml", "io": "pty"}])
        )
        .unwrap_err()
        .message,
        "body/apps/0/io must be equal to one of the allowed values"
    );
    assert_eq!(
        with("agent", json!("")).unwrap_err().message,
        "body/agent must NOT have fewer than 1 characters"
    );
    let body = with(
        "apps",
        json!([{"name": "api", "entryRelativePath": "api/telo.yaml", "ports": [{"port": "3000", "protocol": "tcp"}]}]),
    )
    .unwrap();
    let apps = body.apps.unwrap();
    assert_eq!(apps[0].ports[0].port, 3000);
    assert_eq!(apps[0].io, crate::watch::IoMode::Tty);
    let watch = with("mode", json!("watch")).unwrap();
    assert_eq!(watch.mode, crate::watch::SessionMode::Watch);
}

#[test]
fn change_sets_and_app_sets_are_checked() {
    assert_eq!(
        validate_change_set(Some(json!({"write": [{"path": "", "content": "x"}]})))
            .unwrap_err()
            .message,
        "body/write/0/path must NOT have fewer than 1 characters"
    );
    assert_eq!(
        validate_change_set(Some(
            json!({"write": [{"path": "a", "content": "x", "encoding": "hex"}]})
        ))
        .unwrap_err()
        .message,
        "body/write/0/encoding must be equal to one of the allowed values"
    );
    let changes = validate_change_set(Some(json!({"delete": ["old.yaml"]}))).unwrap();
    assert_eq!(changes.delete, ["old.yaml"]);
    assert_eq!(
        validate_set_apps(Some(json!({}))).unwrap_err().message,
        "body must have required property 'apps'"
    );
}

#[test]
fn config_and_its_keys_are_optional_since_telo_versions() {
    let mut body = start_body();
    body.as_object_mut().unwrap().remove("config");
    body["telo"] = json!("0.96.0");
    let parsed = validate_start_session(Some(body)).unwrap();
    assert_eq!(parsed.config, RequestedConfig::default());
    assert_eq!(parsed.telo.as_deref(), Some("0.96.0"));
    let mut body = start_body();
    body["config"] = json!({});
    body["apps"] = json!([{"name": "web", "entryRelativePath": "telo.yaml", "telo": "0.96.0"}]);
    let parsed = validate_start_session(Some(body)).unwrap();
    assert_eq!(parsed.config, RequestedConfig::default());
    assert_eq!(parsed.apps.unwrap()[0].telo.as_deref(), Some("0.96.0"));
}

#[rstest]
#[case("/telo", json!({}), "body/telo must be string")]
#[case("/telo", json!([1, 2]), "body/telo must be string")]
fn a_telo_version_is_a_string(#[case] pointer: &str, #[case] value: Value, #[case] message: &str) {
    assert_eq!(start_message(start_body_with(pointer, value)), message);
}
