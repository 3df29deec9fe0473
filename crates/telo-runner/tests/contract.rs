//! The `/v1` contract, black-box over real sockets, on both backends: local
//! processes, and pods on a kube-sim cluster. Sessions, their event stream,
//! request validation and stopping are here; the `/io` terminal channel is in
//! `contract_io.rs`, app sessions in `contract_apps.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::bundle::start_body;
use test_support::ws::{self, IoFrame};

fn is_iso(text: &str) -> bool {
    text.len() == 24 && text.ends_with('Z') && text.as_bytes()[10] == b'T'
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn health_answers_ok_with_the_version(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let (status, body) = runner.get("/v1/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["ok"], json!(true));
    assert_eq!(body["version"], json!(env!("CARGO_PKG_VERSION")));
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn capabilities_describe_the_backend_without_terms_or_apps_by_default(
    #[case] backend: Backend,
) {
    let runner = Runner::start_on(backend, &[]).await;
    let (status, body) = runner.get("/v1/capabilities").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["displayName"].is_string());
    assert!(body["description"].is_string());
    assert_eq!(body["features"]["io"], json!(["tty", "streams"]));
    // A runner that runs named telo versions requires neither key: a
    // request naming a version leaves both out.
    let required = if body["features"]["teloVersions"] == json!(true) {
        json!([])
    } else {
        json!(["image", "pullPolicy"])
    };
    assert_eq!(body["config"]["schema"]["required"], required);
    assert!(body.get("terms").is_none());
    assert!(body.get("apps").is_none());
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn probe_reports_ready_and_ignores_unknown_config_keys(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let (status, body) = runner
        .post(
            "/v1/probe",
            &json!({"config": {"image": "x", "pullPolicy": "missing", "registryUrl": "y", "extra": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"status": "ready"}));
    let (status, body) = runner.post("/v1/probe", &json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["message"],
        json!("body must have required property 'config'")
    );
    runner.stop().await;
}

#[tokio::test]
async fn probe_reports_a_missing_telo_cli_as_unavailable() {
    let runner = Runner::start_with(&[("RUNNER_LOCAL_TELO", "/nonexistent/telo")]).await;
    let (status, body) = runner
        .post(
            "/v1/probe",
            &json!({"config": {"image": "x", "pullPolicy": "missing"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], json!("unavailable"));
    assert!(body["remediation"].is_string());
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_session_is_created_before_it_starts_and_runs_to_its_exit_code(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let (status, created) = runner
        .post(
            "/v1/sessions",
            &start_body(json!({"stdout": ["hello"], "exitCode": 3})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = created["sessionId"].as_str().unwrap();
    assert!(runner_core::ids::is_session_id(id), "{id}");
    assert_eq!(
        created["streamUrl"],
        json!(format!("/v1/sessions/{id}/events"))
    );
    assert!(is_iso(created["createdAt"].as_str().unwrap()));

    let mut events = runner.events(id, &[]).await;
    assert_eq!(events.status, StatusCode::OK);
    assert_eq!(events.headers["content-type"], "text/event-stream");
    assert_eq!(events.headers["cache-control"], "no-cache, no-transform");
    assert_eq!(events.headers["x-accel-buffering"], "no");
    assert_eq!(events.headers["access-control-allow-origin"], "*");
    let frames = events.events_until_end().await;
    let kinds: Vec<_> = frames.iter().filter_map(|f| f.status_kind()).collect();
    assert_eq!(kinds, vec!["starting", "running", "exited"]);
    let ids: Vec<u64> = frames.iter().map(|f| f.id.unwrap()).collect();
    assert_eq!(
        ids,
        (1..=frames.len() as u64).collect::<Vec<_>>(),
        "ids count from 1"
    );
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "exited", "code": 3})
    );
    for frame in &frames {
        assert_eq!(
            frame.json()["type"].as_str(),
            frame.event.as_deref(),
            "data carries the type"
        );
    }

    let (status, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(snapshot["status"], json!({"kind": "exited", "code": 3}));
    assert!(is_iso(snapshot["exitedAt"].as_str().unwrap()));

    let mut socket = runner.io(id, "?lastSeq=0").await;
    let frames = ws::read_until_close(&mut socket).await;
    assert_eq!(
        frames[0],
        IoFrame::Text(json!({"type": "seq", "seq": 0, "app": "app", "io": "tty"}))
    );
    assert!(String::from_utf8_lossy(&ws::output_of(&frames)).contains("hello"));
    assert_eq!(
        frames.last().unwrap(),
        &IoFrame::Close {
            code: 1000,
            reason: "session terminal".into()
        }
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_running_session_is_running_before_any_output_is_required(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner.create(json!({"echo": true})).await;
    let mut events = runner.events(id.as_str(), &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    assert_eq!(frames[0].status_kind().as_deref(), Some("starting"));
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(snapshot["status"]["kind"], json!("running"));
    assert!(snapshot.get("exitedAt").is_none());
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn sse_resumes_after_the_header_id_which_wins_over_the_query(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"stdout": ["hello"], "exitCode": 0}))
        .await;
    let all = runner.events(&id, &[]).await.events_until_end().await;
    assert!(all.len() >= 3);

    let after_one = runner
        .events_query(&id, "lastEventId=2", &[("last-event-id", "1")])
        .await
        .events_until_end()
        .await;
    assert_eq!(after_one.first().unwrap().id, Some(2), "header wins");

    let after_two = runner
        .events_query(&id, "lastEventId=2", &[("last-event-id", "garbage")])
        .await
        .events_until_end()
        .await;
    assert_eq!(
        after_two.first().unwrap().id,
        Some(3),
        "bad header falls back to the query"
    );

    let mut at_end = runner
        .events_query(&id, &format!("lastEventId={}", all.len()), &[])
        .await;
    assert!(
        at_end.next_event().await.is_none(),
        "a finished session ends at once"
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn evicted_history_is_announced_with_a_gap_on_both_channels(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[("RUNNER_REPLAY_BUFFER_BYTES", "100")]).await;
    let id = runner
        .create(json!({"spewBytes": 300000, "exitCode": 0}))
        .await;
    assert_eq!(runner.wait_terminal(&id).await["kind"], json!("exited"));

    let mut events = runner.events(&id, &[]).await;
    let gap = events.next_frame().await.unwrap();
    assert_eq!(gap.event.as_deref(), Some("gap"));
    assert_eq!(gap.id, None, "the gap frame does not move the client's id");
    assert_eq!(gap.json(), json!({"reason": "buffer_evicted"}));
    let rest = events.events_until_end().await;
    assert_eq!(
        rest.last().unwrap().status_kind().as_deref(),
        Some("exited")
    );

    let mut socket = runner.io(&id, "?lastSeq=0").await;
    assert_eq!(
        ws::next_frame(&mut socket).await.unwrap(),
        IoFrame::Text(json!({"type": "seq", "seq": 0, "app": "app", "io": "tty"}))
    );
    assert_eq!(
        ws::next_frame(&mut socket).await.unwrap(),
        IoFrame::Text(json!({"type": "gap", "reason": "buffer_evicted"}))
    );
    let frames = ws::read_until_close(&mut socket).await;
    assert!(
        matches!(frames[0], IoFrame::Output { .. }),
        "the newest chunk is always kept"
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn delete_stops_a_live_session_and_is_idempotent(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner.create(json!({"echo": true})).await;
    let mut events = runner.events(&id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let (status, body) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(body.is_empty());
    let rest = events.events_until_end().await;
    assert_eq!(
        rest.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = runner.delete("/v1/sessions/doesnotexist").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn unknown_sessions_are_404_on_every_route(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let (status, body) = runner.get("/v1/sessions/abcdefghijkl").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({"error": "not_found", "message": "session 'abcdefghijkl' not in registry"})
    );
    let events = runner.events("abcdefghijkl", &[]).await;
    assert_eq!(events.status, StatusCode::NOT_FOUND);
    let (status, body) = runner.get("/v1/nowhere").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["message"], json!("Route GET:/v1/nowhere not found"));
    let long = "a".repeat(101);
    let (status, body) = runner.get(&format!("/v1/sessions/{long}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["message"].as_str().unwrap().starts_with("Route GET:"));
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn capacity_evicts_the_oldest_finished_session_but_never_a_live_one(
    #[case] backend: Backend,
) {
    let runner = Runner::start_on(backend, &[("RUNNER_MAX_SESSIONS", "2")]).await;
    let finished = runner.create(json!({"exitCode": 0})).await;
    runner.wait_terminal(&finished).await;
    let live = runner.create(json!({"echo": true})).await;
    // Full: one finished, one live. The finished one makes room.
    let newer = runner.create(json!({"echo": true})).await;
    let (status, _) = runner.get(&format!("/v1/sessions/{finished}")).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the finished session was evicted"
    );
    // Full of live sessions: refused.
    let (status, body) = runner
        .post("/v1/sessions", &start_body(json!({"echo": true})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body,
        json!({"error": "too_many_sessions", "message": "runner is at its configured max of 2 concurrent sessions"})
    );
    for id in [&live, &newer] {
        let (status, _) = runner.get(&format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::OK);
    }
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn finished_sessions_are_forgotten_after_the_exit_ttl(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[("RUNNER_EXIT_TTL_MS", "50")]).await;
    let id = runner.create(json!({"exitCode": 0})).await;
    runner.wait_terminal(&id).await;
    let deadline = tokio::time::Instant::now() + test_support::WAIT;
    loop {
        let (status, _) = runner.get(&format!("/v1/sessions/{id}")).await;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session never expired"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn the_terms_gate_guards_session_creation_only(#[case] backend: Backend) {
    let runner = Runner::start_on(
        backend,
        &[
            ("RUNNER_TERMS_BODY", "Be nice."),
            ("RUNNER_TERMS_VERSION", "v7"),
        ],
    )
    .await;
    let (_, caps) = runner.get("/v1/capabilities").await;
    let terms = json!({"version": "v7", "title": "Usage agreement", "body": "Be nice."});
    assert_eq!(caps["terms"], terms);
    let body = start_body(json!({"exitCode": 0}));
    let (status, refused) = runner.post("/v1/sessions", &body).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(refused, json!({"error": "terms_required", "terms": terms}));
    let (status, _) = runner
        .post_with("/v1/sessions", &body, &[("x-telo-accepted-terms", "V7")])
        .await;
    assert_eq!(
        status,
        StatusCode::PRECONDITION_REQUIRED,
        "versions compare exactly"
    );
    let (status, _) = runner
        .post_with("/v1/sessions", &body, &[("x-telo-accepted-terms", "v7")])
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = runner
        .post(
            "/v1/probe",
            &json!({"config": {"image": "x", "pullPolicy": "never"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "probe is not gated");
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn bad_bundles_and_bodies_get_a_400_naming_the_problem(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let good = start_body(json!({"exitCode": 0}));
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"env": {}, "config": {"image": "x", "pullPolicy": "missing"}}),
            "invalid_request",
            "body must have required property 'bundle'",
        ),
        (
            {
                let mut b = good.clone();
                b["config"]["pullPolicy"] = json!("sometimes");
                b
            },
            "invalid_request",
            "body/config/pullPolicy must be equal to one of the allowed values",
        ),
        (
            {
                let mut b = good.clone();
                b["bundle"]["entryRelativePath"] = json!("");
                b
            },
            "invalid_request",
            "body/bundle/entryRelativePath must NOT have fewer than 1 characters",
        ),
        (
            {
                let mut b = good.clone();
                b["ports"] = json!([{"port": 70000, "protocol": "tcp"}]);
                b
            },
            "invalid_request",
            "body/ports/0/port must be <= 65535",
        ),
        (
            {
                let mut b = good.clone();
                b["bundle"]["entryRelativePath"] = json!("../escape.yaml");
                b
            },
            "invalid_bundle",
            "invalid bundle relativePath '../escape.yaml'",
        ),
        (
            {
                let mut b = good.clone();
                b["bundle"]["entryRelativePath"] = json!("..");
                b
            },
            "invalid_bundle",
            "invalid bundle relativePath '..'",
        ),
        (
            {
                let mut b = good.clone();
                b["bundle"]["files"][0]["relativePath"] = json!("a/../../x");
                b
            },
            "invalid_bundle",
            "invalid bundle relativePath 'a/../../x'",
        ),
    ];
    for (body, code, message) in cases {
        let (status, answer) = runner.post("/v1/sessions", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer, json!({"error": code, "message": message}));
    }
    // Malformed JSON, wrong content type, absent body.
    let response = runner
        .client
        .post(runner.url("/v1/sessions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = runner
        .client
        .post(runner.url("/v1/sessions"))
        .header("content-type", "text/plain")
        .body("hi")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let response = runner
        .client
        .post(runner.url("/v1/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["message"], json!("body must be object"));
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn an_absolute_entry_path_is_normalized_not_refused(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let mut body = start_body(json!({"stdout": ["abs-ok"], "exitCode": 0}));
    body["bundle"]["entryRelativePath"] = json!("/telo.yaml");
    let id = runner.create_body(body).await;
    assert_eq!(
        runner.wait_terminal(&id).await,
        json!({"kind": "exited", "code": 0})
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn oversize_bodies_are_refused_with_413(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[("RUNNER_MAX_BODY_BYTES", "2048")]).await;
    let mut body = start_body(json!({"exitCode": 0}));
    body["bundle"]["files"].as_array_mut().unwrap().push(json!({
        "relativePath": "big.txt",
        "contents": "x".repeat(4096),
    }));
    let (status, answer) = runner.post("/v1/sessions", &body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer["error"], json!("payload_too_large"));
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn types_are_coerced_like_the_reference_validator(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let mut body = start_body(json!({"printEnv": ["NUM"], "exitCode": 0}));
    body["env"] = json!({"NUM": 42});
    body["inspect"] = json!("false");
    let id = runner.create_body(body).await;
    runner.wait_terminal(&id).await;
    let output = runner.full_output(&id).await;
    assert!(output.contains("NUM=42"));
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn only_the_session_env_and_the_registry_url_reach_the_workload(#[case] backend: Backend) {
    // SAFETY-free: the variable is unique to this test and only read by the
    // workload through the runner, which must not pass it on.
    let runner = Runner::start_on(
        backend,
        &[("TELO_REGISTRY_URL", "https://registry.example")],
    )
    .await;
    let mut body = start_body(json!({
        "printEnv": ["FOO", "TELO_REGISTRY_URL", "RUNNER_LOCAL_TELO", "CARGO"],
        "exitCode": 0,
    }));
    body["env"] = json!({"FOO": "bar"});
    let id = runner.create_body(body).await;
    runner.wait_terminal(&id).await;
    let output = runner.full_output(&id).await;
    assert!(output.contains("FOO=bar"), "{output}");
    assert!(
        output.contains("TELO_REGISTRY_URL=https://registry.example"),
        "{output}"
    );
    assert!(output.contains("RUNNER_LOCAL_TELO=<unset>"), "{output}");
    assert!(output.contains("CARGO=<unset>"), "{output}");

    // A per-request registry URL wins over the runner's.
    let mut body = start_body(json!({"printEnv": ["TELO_REGISTRY_URL"], "exitCode": 0}));
    body["config"]["registryUrl"] = json!("  https://mine.example ");
    let id = runner.create_body(body).await;
    runner.wait_terminal(&id).await;
    let output = runner.full_output(&id).await;
    assert!(
        output.contains("TELO_REGISTRY_URL=https://mine.example"),
        "{output}"
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn cors_preflight_and_origin_echo_follow_the_configured_list(#[case] backend: Backend) {
    let runner = Runner::start_on(
        backend,
        &[("RUNNER_CORS_ORIGINS", "https://editor.example")],
    )
    .await;
    let response = runner
        .client
        .request(reqwest::Method::OPTIONS, runner.url("/v1/sessions"))
        .header("origin", "https://editor.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,x-telo-accepted-terms",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let headers = response.headers();
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://editor.example"
    );
    assert_eq!(
        headers["access-control-allow-methods"],
        "GET, POST, PUT, DELETE, OPTIONS"
    );
    assert_eq!(
        headers["access-control-allow-headers"],
        "content-type,x-telo-accepted-terms"
    );
    // No body; hyper omits Content-Length on a 204 as HTTP requires.
    assert!(headers.get("content-length").is_none_or(|v| v == "0"));

    let response = runner
        .client
        .request(reqwest::Method::OPTIONS, runner.url("/v1/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.text().await.unwrap(), "Invalid Preflight Request");

    // A narrowed list is enforced by the runner too (0.15): a foreign
    // origin is refused before any route runs, a request without one passes.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/health"),
        (reqwest::Method::GET, "/v1/capabilities"),
        (reqwest::Method::POST, "/v1/sessions"),
        (reqwest::Method::GET, "/v1/sessions/nope/events"),
    ] {
        let response = runner
            .client
            .request(method.clone(), runner.url(path))
            .header("origin", "https://evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{method} {path}");
        assert!(
            response
                .headers()
                .get("access-control-allow-origin")
                .is_none()
        );
        assert_eq!(
            response.json::<Value>().await.unwrap(),
            json!({
                "error": "origin_not_allowed",
                "message": "origin 'https://evil.example' is not allowed by this runner \u{2014} it serves https://editor.example",
            })
        );
    }
    let response = runner
        .client
        .get(runner.url("/v1/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "no Origin: not a browser"
    );

    let id = runner.create(json!({"exitCode": 0})).await;
    let events = runner
        .events(&id, &[("origin", "https://editor.example")])
        .await;
    assert_eq!(
        events.headers["access-control-allow-origin"],
        "https://editor.example"
    );
    runner.stop().await;
}

/// The origin check is skipped only for the terminal socket's handshake:
/// an `Upgrade: websocket` header on any other request buys a foreign page
/// nothing.
#[tokio::test]
async fn an_upgrade_header_does_not_carry_a_foreign_origin_past_the_check() {
    let runner = Runner::start_with(&[("RUNNER_CORS_ORIGINS", "https://editor.example")]).await;
    for (method, path) in [
        (reqwest::Method::POST, "/v1/sessions"),
        (reqwest::Method::GET, "/v1/sessions"),
        (reqwest::Method::POST, "/v1/sessions/nope/io"),
    ] {
        let response = runner
            .client
            .request(method.clone(), runner.url(path))
            .header("origin", "https://evil.example")
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("content-type", "application/json")
            .body(start_body(json!({"exitCode": 0})).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{method} {path}");
        assert_eq!(
            response.json::<Value>().await.unwrap()["error"],
            "origin_not_allowed"
        );
    }
    let (_, listed) = runner.get("/v1/sessions").await;
    assert_eq!(listed["sessions"], json!([]), "no session was started");
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn reachability_is_reported_per_declared_tcp_port(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut body = start_body(json!({"listen": [port], "echo": true}));
    body["ports"] = json!([{"port": port, "protocol": "tcp"}, {"port": port, "protocol": "udp"}]);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| {
            f.event.as_deref() == Some("reachability") && f.json()["state"] == "reachable"
        })
        .await;
    let running = frames
        .iter()
        .find(|f| f.status_kind().as_deref() == Some("running"))
        .unwrap();
    assert_eq!(
        running.json()["status"]["endpoints"],
        json!([{"host": "", "port": port, "protocol": "tcp"}, {"host": "", "port": port, "protocol": "udp"}])
    );
    let reach: Vec<_> = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("reachability"))
        .map(|f| f.json())
        .collect();
    assert_eq!(
        reach,
        vec![
            json!({"type": "reachability", "app": "app", "port": port, "state": "checking"}),
            json!({"type": "reachability", "app": "app", "port": port, "state": "reachable"}),
        ]
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn only_kernel_event_frames_are_relayed_as_debug_events(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let mut body =
        start_body(json!({"debugEvents": ["Kernel.Starting", "Kernel.Started"], "echo": true}));
    body["inspect"] = json!(true);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| {
            f.event.as_deref() == Some("debug") && f.json()["frame"]["event"] == "Kernel.Started"
        })
        .await;
    let debug: Vec<_> = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("debug"))
        .map(|f| f.json()["frame"]["event"].clone())
        .collect();
    assert_eq!(
        debug,
        vec![json!("Kernel.Starting"), json!("Kernel.Started")]
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn idle_event_streams_carry_heartbeat_comments(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[("RUNNER_SSE_HEARTBEAT_MS", "50")]).await;
    let id = runner.create(json!({"echo": true})).await;
    let mut events = runner.events(&id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    loop {
        let frame = events.next_frame().await.expect("stream stays open");
        if frame.comments == vec!["heartbeat".to_owned()] {
            assert_eq!(frame.id, None);
            break;
        }
    }
    runner.stop().await;
}

/// The statuses a session went through, from its full event history.
async fn statuses_of(runner: &Runner, id: &str) -> (Vec<Value>, Vec<Value>) {
    let frames = runner.events(id, &[]).await.events_until_end().await;
    let statuses = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("status"))
        .map(|f| f.json()["status"].clone())
        .collect();
    let debug = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("debug"))
        .map(|f| f.json()["frame"]["event"].clone())
        .collect();
    (statuses, debug)
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_run_the_kernel_reports_stopped_under_inspect_ends_exited_with_its_code(
    #[case] backend: Backend,
) {
    let runner = Runner::start_on(backend, &[]).await;
    // debugEvents keep fake-telo up, as the real kernel holds a finished app
    // open under --inspect.
    let mut body = start_body(json!({
        "stdout": ["done"],
        "debugEvents": [
            "Kernel.Starting",
            "Kernel.Started",
            {"event": "Kernel.Stopped", "payload": {"exitCode": 3}},
        ],
    }));
    body["inspect"] = json!(true);
    let id = runner.create_body(body).await;
    let (statuses, debug) = statuses_of(&runner, &id).await;
    assert_eq!(
        statuses,
        [
            json!({"kind": "starting"}),
            json!({"kind": "running", "endpoints": []}),
            json!({"kind": "exited", "code": 3}),
        ]
    );
    assert_eq!(
        debug,
        [
            json!("Kernel.Starting"),
            json!("Kernel.Started"),
            json!("Kernel.Stopped")
        ],
        "the debug history stays in the replay"
    );
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_stop_lets_the_workload_tear_down_and_relays_what_it_printed(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner
        .create(json!({"stdout": ["up"], "echo": true, "stopLine": "Stopped listening"}))
        .await;
    let mut socket = runner.io(&id, "").await;
    ws::read_until_output(&mut socket, "up").await;
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(runner.wait_terminal(&id).await, json!({"kind": "stopped"}));
    let output = runner.full_output(&id).await;
    assert!(output.contains("Stopped listening"), "{output}");
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_workload_ignoring_sigterm_is_killed_after_the_grace_period(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[("RUNNER_STOP_GRACE_SECONDS", "1")]).await;
    let id = runner
        .create(json!({"stdout": ["up"], "echo": true, "ignoreSigterm": true}))
        .await;
    let mut socket = runner.io(&id, "").await;
    ws::read_until_output(&mut socket, "up").await;
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(runner.wait_terminal(&id).await, json!({"kind": "stopped"}));
    runner.stop().await;
}
