//! The `/v1` app sessions, black-box over real sockets: the operator's
//! catalog is advertised by identity only, and a client of an app session
//! supplies data to the operator's program, never code.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};

/// An operator catalog whose one app runs fake-telo on a manifest of its own.
fn app_catalog(dir: &std::path::Path) -> String {
    let manifest = dir.join("greeter.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: greeter }\nfakeTelo:\n  printEnv: [API_KEY, MODE]\n  exitCode: 0\n",
    )
    .unwrap();
    let fake = test_support::fake_telo::fake_telo_path();
    json!({
        "greeter": {
            "image": "acme/greeter:1",
            "title": "Greeter",
            "env": {"API_KEY": "operator-secret"},
            "command": [fake.to_string_lossy(), "run", manifest.to_string_lossy()],
        },
        "bare": {"image": "acme/bare:1"},
    })
    .to_string()
}

#[tokio::test]
async fn apps_are_advertised_by_identity_only_and_run_with_operator_env_winning() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = app_catalog(dir.path());
    let runner = Runner::start_with(&[("RUNNER_APPS", catalog.as_str())]).await;
    let (_, caps) = runner.get("/v1/capabilities").await;
    assert_eq!(
        caps["apps"],
        json!([{"name": "greeter", "title": "Greeter"}, {"name": "bare"}])
    );
    assert!(!caps.to_string().contains("operator-secret"));
    assert!(!caps.to_string().contains("acme/greeter"));

    let (status, created) = runner
        .post(
            "/v1/apps/greeter/sessions",
            &json!({"env": {"API_KEY": "client-value", "MODE": "dev"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap();
    assert_eq!(
        runner.wait_terminal(id).await,
        json!({"kind": "exited", "code": 0})
    );
    let output = runner.full_output(id).await;
    assert!(output.contains("API_KEY=operator-secret"), "{output}");
    assert!(output.contains("MODE=dev"), "{output}");
    runner.stop().await;
}

/// The client of an app session supplies data to the operator's program,
/// never code: loader and runtime variables are refused for every entry, and
/// an entry declaring `acceptEnv` takes only those names.
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn an_app_session_client_cannot_change_how_the_operators_program_runs(
    #[case] backend: Backend,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut catalog: Value = serde_json::from_str(&app_catalog(dir.path())).unwrap();
    catalog["greeter"]["acceptEnv"] = json!(["MODE"]);
    let catalog = catalog.to_string();
    let runner = Runner::start_on(backend, &[("RUNNER_APPS", catalog.as_str())]).await;
    for (app, name, value) in [
        (
            "bare",
            "NODE_OPTIONS",
            "--import=data:text/javascript,console.log(process.env)",
        ),
        ("bare", "LD_PRELOAD", "/tmp/evil.so"),
        ("bare", "node_options", "--require=/tmp/evil.js"),
        ("bare", "BASH_ENV", "/tmp/evil.sh"),
        ("bare", "PATH", "/tmp"),
        ("bare", "HTTPS_PROXY", "http://client.example:3128"),
        ("greeter", "NODE_OPTIONS", "--import=data:,1"),
    ] {
        let (status, body) = runner
            .post(
                &format!("/v1/apps/{app}/sessions"),
                &json!({"env": {"MODE": "dev", name: value}}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {body}");
        assert_eq!(
            body,
            json!({"error": "invalid_request", "message": format!("body/env/{name} is not accepted for an app session: it changes how the operator's program loads or runs")}),
        );
    }
    let (status, body) = runner
        .post(
            "/v1/apps/greeter/sessions",
            &json!({"env": {"MODE": "dev", "OPENAI_BASE_URL": "http://client.example"}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["message"],
        json!(
            "body/env/OPENAI_BASE_URL is not accepted by app 'greeter' \u{2014} it accepts: MODE"
        )
    );
    let (_, sessions) = runner.get("/v1/sessions").await;
    assert_eq!(
        sessions,
        json!({"sessions": []}),
        "a refused request created a session"
    );
    // What the entry accepts still reaches the program.
    let (status, created) = runner
        .post(
            "/v1/apps/greeter/sessions",
            &json!({"env": {"MODE": "dev"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    runner.stop().await;
}

#[tokio::test]
async fn an_unknown_app_is_404_before_the_terms_gate() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = app_catalog(dir.path());
    let runner = Runner::start_with(&[
        ("RUNNER_APPS", catalog.as_str()),
        ("RUNNER_TERMS_BODY", "terms"),
    ])
    .await;
    let (status, body) = runner.post("/v1/apps/nope/sessions", &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({"error": "unknown_app", "message": "app 'nope' is not offered by this runner \u{2014} offered apps: greeter, bare (see /v1/capabilities)."})
    );
    let (status, body) = runner.post("/v1/apps/greeter/sessions", &json!({})).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(body["error"], json!("terms_required"));
    runner.stop().await;
}

#[tokio::test]
async fn an_app_without_a_local_command_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = app_catalog(dir.path());
    let runner = Runner::start_with(&[("RUNNER_APPS", catalog.as_str())]).await;
    let (status, created) = runner.post("/v1/apps/bare/sessions", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    let status = runner
        .wait_terminal(created["sessionId"].as_str().unwrap())
        .await;
    assert_eq!(status["kind"], json!("failed"));
    assert!(
        status["message"].as_str().unwrap().starts_with("start: "),
        "{status}"
    );
    runner.stop().await;
}

/// `tokenEnv` (0.16): each app session gets its own 32-character token,
/// injected under that name (a client's value of it is dropped) and
/// reported on the endpoints of `running`. (Minting, injection and
/// reporting are the core's; the backend only runs the env it is given.)
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_token_env_entry_mints_a_token_per_session_and_reports_it(#[case] backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("tokened.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: tokened }\nfakeTelo:\n  printEnv: [APP_TOKEN]\n  echo: true\n",
    )
    .unwrap();
    let fake = test_support::fake_telo::fake_telo_path();
    let catalog = json!({
        "tokened": {
            "image": "acme/tokened:1",
            "tokenEnv": "APP_TOKEN",
            "command": [fake.to_string_lossy(), "run", manifest.to_string_lossy()],
        },
    })
    .to_string();
    let vars = [("RUNNER_APPS", catalog.as_str())];
    let runner = match backend {
        Backend::Local => Runner::start_on(backend, &vars).await,
        // The catalog image's own entrypoint runs the scripted app.
        Backend::Kubernetes => {
            let sim = common::cluster().image(
                "acme/tokened:*",
                kube_sim::ImageBehaviour::FakeTeloEntry(manifest.clone()),
            );
            Runner::start_kube(sim, &vars).await
        }
    };
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let (status, created) = runner
            .post(
                "/v1/apps/tokened/sessions",
                &json!({"env": {"APP_TOKEN": "chosen-by-client"}, "ports": [{"port": 8080, "protocol": "tcp"}]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let id = created["sessionId"].as_str().unwrap().to_owned();
        let mut events = runner.events(&id, &[]).await;
        let frames = events
            .events_until(|f| f.status_kind().as_deref() == Some("running"))
            .await;
        let running = frames.last().unwrap().json();
        let token = running["status"]["endpoints"][0]["token"]
            .as_str()
            .expect("the endpoint carries the token")
            .to_owned();
        if let Some(sim) = &runner.sim {
            // The pod is given the token as its entry's variable, in place
            // of the client's value, from the pod's env Secret: the spec
            // names the key, never the token.
            let pod = sim
                .get_value("pods", "telo-sessions", &format!("telo-run-{id}"))
                .unwrap();
            let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
            let entry = env
                .iter()
                .find(|e| e["name"] == "APP_TOKEN")
                .unwrap_or_else(|| panic!("{env:?}"));
            let reference = &entry["valueFrom"]["secretKeyRef"];
            let secret: k8s_openapi::api::core::v1::Secret = sim
                .get("telo-sessions", reference["name"].as_str().unwrap())
                .unwrap();
            let stored = &secret.data.unwrap()[reference["key"].as_str().unwrap()];
            assert_eq!(stored.0, token.as_bytes());
            assert!(!pod.to_string().contains(&token), "{pod}");
            assert!(!pod.to_string().contains("chosen-by-client"), "{pod}");
        }
        assert_eq!(token.len(), 32);
        assert!(
            token
                .bytes()
                .all(|b| b"abcdefghijklmnopqrstuvwxyz234567".contains(&b)),
            "{token}"
        );
        let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        runner.wait_terminal(&id).await;
        let output = runner.full_output(&id).await;
        assert!(output.contains(&format!("APP_TOKEN={token}")), "{output}");
        assert!(!output.contains("chosen-by-client"), "{output}");
        tokens.push(token);
    }
    assert_ne!(tokens[0], tokens[1], "one token per session");
    runner.stop().await;
}
