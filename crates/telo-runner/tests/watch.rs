//! Watch sessions, black-box over real sockets on the local backend with
//! fake-telo's watch mode as the kernel: the editor's workflow (create, see
//! generation 1, write a file, see generation 2, reload, go idle, resume,
//! change the app set, stop) and every error code of the watch routes.

mod common;

use std::time::{Duration, Instant};

use common::watch::*;
use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::WAIT;
use test_support::ws::{self, IoFrame};

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_edits_reloads_suspends_resumes_and_changes_apps(#[case] backend: Backend) {
    let runner = Runner::start_on(
        backend,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WATCH_IDLE_SECONDS", "1"),
        ],
    )
    .await;
    let (_, capabilities) = runner.get("/v1/capabilities").await;
    assert_eq!(capabilities["features"]["watch"], json!(true));
    assert_eq!(capabilities["features"]["io"], json!(["tty", "streams"]));

    let id = runner
        .create_body(watch_body(json!({"stdout": ["generation one"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let started = run_event(&mut events, "app", "started", 1).await;
    assert_eq!(started["trigger"], "initial");
    let mut socket = runner.io(&id, "?app=app").await;
    ws::read_until_output(&mut socket, "generation one").await;

    let snapshot = status_of(&runner, &id).await;
    assert_eq!(snapshot["mode"], "watch");
    assert_eq!(
        snapshot["apps"],
        json!([{"name": "app", "io": "tty", "generation": 1, "ports": []}])
    );
    if let Some(sim) = &runner.sim {
        // One pod: the workspace service and the app, over one volume.
        let pod = sim
            .get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
            .expect("the watch pod");
        let containers: Vec<&str> = pod["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(containers, ["workspace", "app-app"]);
        assert!(
            sim.get_value("secrets", "telo-sessions", &format!("telo-watch-{id}"))
                .is_some()
        );
    }

    // An edit: the kernel's own watch reloads it.
    let (status, applied) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [
            {"path": "telo.yaml", "content": manifest(json!({"stdout": ["generation two"]}))},
            {"path": "notes/readme.txt", "content": "aGVsbG8=", "encoding": "base64"},
        ]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    assert_eq!(applied, json!({"written": 2, "deleted": 0}));
    let completed = run_event(&mut events, "app", "completed", 1).await;
    assert_eq!(completed["code"], 0);
    let second = run_event(&mut events, "app", "started", 2).await;
    assert_eq!(second["trigger"], "watch");
    ws::read_until_output(&mut socket, "generation two").await;

    let (status, tree) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let paths: Vec<&str> = tree["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["notes/readme.txt", "telo-workspace.yaml", "telo.yaml"]
    );
    let (status, file) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=notes/readme.txt"),
        None,
    )
    .await;
    assert_eq!(
        (status, file),
        (StatusCode::OK, json!({"content": "hello", "size": 5}))
    );

    // A manual reload is attributed to the client.
    let (status, reloaded) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/reload"),
        None,
    )
    .await;
    assert_eq!(
        (status, reloaded),
        (StatusCode::ACCEPTED, json!({"reloaded": ["app"]}))
    );
    let third = run_event(&mut events, "app", "started", 3).await;
    assert_eq!(third["trigger"], "manual");

    // Nobody watching: it suspends, and keeps its files.
    drop(events);
    drop(socket);
    until_status(&runner, &id, "suspended").await;
    if let Some(sim) = &runner.sim {
        // Suspended: no pod, the files in the session's Secret.
        assert!(
            sim.get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
                .is_none()
        );
        let secret = sim
            .get_value("secrets", "telo-sessions", &format!("telo-watch-{id}"))
            .expect("the checkpoint");
        assert!(secret["data"]["workspace.json.gz"].is_string(), "{secret}");
    }
    let (status, refused) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["error"], "not_running");

    // Watched before it resumes, as an editor that reconnects does: it is
    // not idle the moment it runs.
    let mut events = runner.events(&id, &[]).await;
    let (status, resumed) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(
        (status, resumed),
        (StatusCode::ACCEPTED, json!({"sessionId": id}))
    );
    let fourth = run_event(&mut events, "app", "started", 4).await;
    assert_eq!(fourth["trigger"], "resume");
    let mut socket = runner.io(&id, "").await;
    ws::read_until_output(&mut socket, "generation two").await;
    let (_, file) = request(
        &runner,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/workspace/file?path=notes/readme.txt"),
        None,
    )
    .await;
    assert_eq!(file["content"], "hello");

    // A second app over the same workspace.
    let (status, _) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "api/telo.yaml", "content": manifest(json!({"stdout": ["the api"]}))}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, changed) = request(
        &runner,
        reqwest::Method::PUT,
        &format!("/v1/sessions/{id}/apps"),
        Some(json!({"apps": [
            {"name": "app", "entryRelativePath": "telo.yaml"},
            {"name": "api", "entryRelativePath": "api/telo.yaml"},
        ]})),
    )
    .await;
    assert_eq!(
        (status, changed),
        (StatusCode::ACCEPTED, json!({"apps": ["app", "api"]}))
    );
    let api = run_event(&mut events, "api", "started", 1).await;
    assert_eq!(api["trigger"], "resume");
    let mut api_socket = runner.io(&id, "?app=api").await;
    ws::read_until_output(&mut api_socket, "the api").await;
    let ambiguous = runner.io(&id, "").await;
    let mut ambiguous = ambiguous;
    assert_eq!(
        ws::next_frame(&mut ambiguous).await,
        Some(IoFrame::Close {
            code: 4404,
            reason: "session runs 2 apps \u{2014} ?app= is required".into()
        })
    );

    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "stopped"})
    );
    if let Some(sim) = &runner.sim {
        let secret = format!("telo-watch-{id}");
        let deadline = Instant::now() + WAIT;
        while sim.get_value("secrets", "telo-sessions", &secret).is_some()
            || sim.get_value("pods", "telo-sessions", &secret).is_some()
        {
            assert!(
                Instant::now() < deadline,
                "the stopped session's pod or Secret stayed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(socket);
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watch_route_refuses_with_the_references_codes() {
    let runner = Runner::start_with(&[
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_RELOAD_LIMIT", "3"),
        ("RUNNER_WATCH_MAX_SESSIONS", "1"),
    ])
    .await;
    let post = |body: Value| {
        let runner = &runner;
        async move { runner.post("/v1/sessions", &body).await }
    };
    let refused = |status: StatusCode, code: &str, message: &str| {
        (status, json!({"error": code, "message": message}))
    };

    // Creation.
    let mut body = watch_body(json!({}));
    body["mode"] = json!("run");
    body["agent"] = json!("helper");
    assert_eq!(
        post(body).await,
        refused(
            StatusCode::BAD_REQUEST,
            "agent_requires_watch",
            "`agent` requires `mode: \"watch\"` \u{2014} nothing would observe the agent's writes"
        )
    );
    let mut body = watch_body(json!({}));
    body["agent"] = json!("helper");
    assert_eq!(
        post(body).await,
        refused(
            StatusCode::BAD_REQUEST,
            "unknown_agent",
            "agent 'helper' is not offered by this runner"
        )
    );
    for (apps, code, message) in [
        (
            json!([{"name": "Bad", "entryRelativePath": "a.yaml"}]),
            "invalid_app_name",
            "app name 'Bad' must be a DNS label (lowercase alphanumeric and '-')",
        ),
        (
            json!([{"name": "agent", "entryRelativePath": "a.yaml"}]),
            "reserved_app_name",
            "app name 'agent' is reserved \u{2014} a session's own containers use it",
        ),
        (
            json!([{"name": "a", "entryRelativePath": "a.yaml"}, {"name": "a", "entryRelativePath": "b.yaml"}]),
            "duplicate_app_name",
            "app 'a' is declared twice",
        ),
        (
            json!([{"name": "a", "entryRelativePath": "../a.yaml"}]),
            "invalid_bundle",
            "invalid bundle relativePath '../a.yaml'",
        ),
        (
            json!([{"name": "a", "entryRelativePath": "a.yaml", "ports": [{"port": 80, "protocol": "tcp"}]}, {"name": "b", "entryRelativePath": "b.yaml", "ports": [{"port": 80, "protocol": "tcp"}]}]),
            "port_conflict",
            "apps 'a' and 'b' both declare tcp port 80; session hosts carry no app name, so the two would be indistinguishable",
        ),
    ] {
        let mut body = watch_body(json!({}));
        body["apps"] = apps;
        assert_eq!(
            post(body).await,
            refused(StatusCode::BAD_REQUEST, code, message)
        );
    }

    // A run session has none of the watch surface.
    let run_id = runner.create(json!({})).await;
    for (method, path) in [
        (reqwest::Method::GET, "workspace"),
        (reqwest::Method::POST, "reload"),
        (reqwest::Method::GET, "workspace/file?path=a"),
    ] {
        assert_eq!(
            request(
                &runner,
                method,
                &format!("/v1/sessions/{run_id}/{path}"),
                None
            )
            .await,
            refused(
                StatusCode::CONFLICT,
                "not_a_watch_session",
                "this surface exists only on a watch session"
            )
        );
    }
    assert_eq!(
        request(
            &runner,
            reqwest::Method::POST,
            &format!("/v1/sessions/{run_id}/resume"),
            None
        )
        .await,
        refused(
            StatusCode::NOT_FOUND,
            "not_suspended",
            &format!("session '{run_id}' is not suspended")
        )
    );
    assert_eq!(
        request(
            &runner,
            reqwest::Method::GET,
            "/v1/sessions/nosuchsession/workspace",
            None
        )
        .await,
        refused(
            StatusCode::NOT_FOUND,
            "not_found",
            "session 'nosuchsession' not in registry"
        )
    );

    let id = runner
        .create_body(watch_body(json!({"stdout": ["up"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    // The ceiling counts live watch sessions.
    assert_eq!(
        post(watch_body(json!({}))).await,
        refused(
            StatusCode::CONFLICT,
            "too_many_watch_sessions",
            "runner is at its configured max of 1 concurrent watch sessions"
        )
    );
    let workspace = format!("/v1/sessions/{id}/workspace");
    assert_eq!(
        request(
            &runner,
            reqwest::Method::GET,
            &format!("{workspace}/file"),
            None
        )
        .await,
        refused(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "?path= is required"
        )
    );
    assert_eq!(
        request(
            &runner,
            reqwest::Method::GET,
            &format!("{workspace}/file?path=../x"),
            None
        )
        .await,
        refused(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "invalid bundle relativePath '../x'"
        )
    );
    assert_eq!(
        request(
            &runner,
            reqwest::Method::GET,
            &format!("{workspace}/file?path=missing.yaml"),
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        request(
            &runner,
            reqwest::Method::POST,
            &format!("/v1/sessions/{id}/reload?app=nope"),
            None
        )
        .await,
        refused(
            StatusCode::NOT_FOUND,
            "unknown_app",
            "session runs no app named 'nope'"
        )
    );
    // The reload budget is shared by writes and reloads; a refused app or
    // path still spent its slot (three so far).
    assert_eq!(
        request(
            &runner,
            reqwest::Method::POST,
            &workspace,
            Some(json!({"delete": ["/etc/passwd"]}))
        )
        .await,
        refused(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "invalid bundle relativePath '/etc/passwd'"
        )
    );
    assert_eq!(
        request(
            &runner,
            reqwest::Method::POST,
            &workspace,
            Some(json!({"write": [{"path": "x", "content": "%%", "encoding": "base64"}]}))
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        request(
            &runner,
            reqwest::Method::POST,
            &format!("/v1/sessions/{id}/reload"),
            None
        )
        .await,
        refused(
            StatusCode::TOO_MANY_REQUESTS,
            "reload_rate_limited",
            "more than 3 reloads in the last minute"
        )
    );
    assert_eq!(
        request(&runner, reqwest::Method::POST, &workspace, Some(json!({}))).await,
        refused(
            StatusCode::TOO_MANY_REQUESTS,
            "reload_rate_limited",
            "more than 3 workspace writes in the last minute"
        )
    );
    // A body the schema refuses never reaches the budget.
    assert_eq!(
        request(
            &runner,
            reqwest::Method::POST,
            &workspace,
            Some(json!({"write": [{"path": ""}]}))
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        request(
            &runner,
            reqwest::Method::PUT,
            &format!("/v1/sessions/{id}/apps"),
            Some(json!({"apps": [{"name": "workspace", "entryRelativePath": "a.yaml"}]}))
        )
        .await,
        refused(
            StatusCode::BAD_REQUEST,
            "reserved_app_name",
            "app name 'workspace' is reserved \u{2014} a session's own containers use it"
        )
    );
    let mut socket = runner.io(&id, "?app=other").await;
    assert_eq!(
        ws::next_frame(&mut socket).await,
        Some(IoFrame::Close {
            code: 4404,
            reason: "session runs no app named 'other'".into()
        })
    );
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

#[tokio::test]
async fn watch_sessions_are_refused_unless_the_operator_enables_them() {
    let runner = Runner::start().await;
    let (_, capabilities) = runner.get("/v1/capabilities").await;
    assert_eq!(capabilities["features"]["watch"], json!(false));
    assert_eq!(
        runner.post("/v1/sessions", &watch_body(json!({}))).await,
        (
            StatusCode::BAD_REQUEST,
            json!({"error": "watch_disabled", "message": "this runner does not offer watch sessions (see /v1/capabilities)"})
        )
    );
    runner.stop().await;
}

#[tokio::test]
async fn the_legacy_wire_keeps_four_byte_frames_and_a_boolean_io_feature() {
    let runner = Runner::start_with(&[("RUNNER_IO_FRAMES", "legacy")]).await;
    let (_, capabilities) = runner.get("/v1/capabilities").await;
    assert_eq!(capabilities["features"]["io"], json!(true));
    let id = runner
        .create(json!({"stdout": ["old wire"], "exitAfterMs": 0}))
        .await;
    let url = runner.ws_url(&format!("/v1/sessions/{id}/io?lastSeq=0"));
    let (raw, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let mut socket = ws::Socket::wrap(raw, runner_api::io::FrameFormat::Legacy);
    let frames = ws::read_until_close(&mut socket).await;
    assert_eq!(frames[0], IoFrame::Text(json!({"type": "seq", "seq": 0})));
    let output = ws::output_of(&frames);
    assert!(
        !output.contains(&0),
        "a NUL leaked into the legacy frames: {output:?}"
    );
    assert!(String::from_utf8_lossy(&output).contains("old wire"));
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_suspended_session_ends_it_and_its_files() {
    let runner = Runner::start_with(&[
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_IDLE_SECONDS", "1"),
        ("RUNNER_WORKSPACE_MAX_CHANGE_BYTES", "64"),
    ])
    .await;
    let id = runner.create_body(watch_body(json!({}))).await;
    let mut events = runner.events(&id, &[]).await;
    run_event(&mut events, "app", "started", 1).await;
    let (status, refused) = request(
        &runner,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/workspace"),
        Some(json!({"write": [{"path": "big.txt", "content": "x".repeat(65)}]})),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{refused}");
    assert_eq!(refused["error"], "workspace_too_large");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("RUNNER_WORKSPACE_MAX_CHANGE_BYTES"),
        "{refused}"
    );
    drop(events);
    until_status(&runner, &id, "suspended").await;
    let session_dir = runner.work_dir.path().join("sessions").join(&id);
    assert!(session_dir.is_dir());
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        status_of(&runner, &id).await["status"],
        json!({"kind": "stopped"})
    );
    assert!(
        !session_dir.exists(),
        "the suspended session's files outlived it"
    );
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_workload_past_its_lifetime_fails_the_session() {
    let runner = Runner::start_with(&[
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_MAX_TTL_SECONDS", "1"),
    ])
    .await;
    let id = runner
        .create_body(watch_body(json!({"stdout": ["up"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events.events_until_end().await;
    assert_eq!(
        frames.last().unwrap().json()["status"],
        json!({"kind": "failed", "message": "watch session reached its time limit"})
    );
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ports_the_kernel_resolves_become_the_apps_endpoints() {
    let runner = Runner::start_with(WATCH).await;
    let port = test_support::free_port();
    let id = runner
        .create_body(watch_body(json!({"listen": [port], "stdout": ["up"]})))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.event.as_deref() == Some("endpoints"))
        .await;
    assert_eq!(
        frames.last().unwrap().json(),
        json!({"type": "endpoints", "app": "app", "added": [{"host": "", "port": port, "protocol": "tcp"}]})
    );
    events
        .events_until(|f| {
            f.event.as_deref() == Some("reachability") && f.json()["state"] == "reachable"
        })
        .await;
    assert_eq!(
        status_of(&runner, &id).await["apps"][0]["ports"],
        json!([{"port": port, "protocol": "tcp"}])
    );
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}
