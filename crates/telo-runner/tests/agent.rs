//! The co-resident agent (runner-core 0.10) and its workload token (0.16),
//! black-box on both backends: a watch session names an operator
//! catalog entry that declares its port; the runner runs it beside the
//! session's apps over the same workspace, with the operator's env and its
//! token and nothing of the session's, and reports where it listens.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::fake_telo::fake_telo_path;
use test_support::free_port;
use test_support::sse::SseStream;

/// A catalog whose `helper` agent writes what it was given into the
/// workspace, then serves on `port`; `portless` declares no port.
fn catalog(port: u16) -> String {
    // The agent writes its own manifest into its home (a host path would
    // be rewritten inside a pod's /tmp mount), then serves it.
    let script = format!(
        r#"printf '%s|%s|%s' "$AGENT_SECRET" "$AGENT_TOKEN" "${{SESSION_VALUE-unset}}" > "$WORKSPACE_DIR/agent.txt"; printf 'kind: Telo.Application\nmetadata: {{ name: agent }}\nfakeTelo:\n  listen: [{port}]\n' > "$HOME/agent.yaml"; exec "$0" run "$HOME/agent.yaml""#
    );
    json!({
        "helper": {
            "image": "acme/agent:1",
            "port": port,
            "tokenEnv": "AGENT_TOKEN",
            "env": {"AGENT_SECRET": "operator-secret"},
            "command": ["/bin/sh", "-c", script, fake_telo_path().to_string_lossy()],
        },
        "portless": {"image": "acme/portless:1", "command": ["/bin/true"]},
    })
    .to_string()
}

fn watch_body(agent: &str, app_ports: Value) -> Value {
    let mut body = test_support::bundle::start_body(
        json!({"printEnv": ["AGENT_SECRET", "AGENT_TOKEN", "SESSION_VALUE"]}),
    );
    body["mode"] = json!("watch");
    body["agent"] = json!(agent);
    body["env"] = json!({"SESSION_VALUE": "from-the-session"});
    body["ports"] = app_ports;
    body
}

async fn running(events: &mut SseStream) -> Value {
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    frames.last().unwrap().json()["status"].clone()
}

async fn workspace_file(runner: &Runner, id: &str, path: &str) -> Option<String> {
    let (status, body) = runner
        .get(&format!("/v1/sessions/{id}/workspace/file?path={path}"))
        .await;
    (status == StatusCode::OK).then(|| body["content"].as_str().unwrap().to_owned())
}

/// A runner on `backend` offering `catalog`; on Kubernetes the agent's
/// image runs its command on the host, as kube-sim runs a `host` image.
async fn runner(backend: Backend, catalog: &str, idle: bool) -> Runner {
    let mut vars = vec![("RUNNER_WATCH_SESSIONS", "true"), ("RUNNER_APPS", catalog)];
    if idle {
        vars.push(("RUNNER_WATCH_IDLE_SECONDS", "1"));
    }
    match backend {
        Backend::Local => {
            // Its workloads' ports are reached through the edge.
            vars.push(("RUNNER_PREVIEW_BASE_URL", "http://preview.test"));
            Runner::start_on(Backend::Local, &vars).await
        }
        Backend::Kubernetes => {
            let sim = common::cluster().image("acme/agent:*", kube_sim::ImageBehaviour::Host);
            Runner::start_kube(sim, &vars).await
        }
    }
}

/// Where the agent of session `id` listens on Kubernetes: the pod's IP.
fn agent_address(runner: &Runner, id: &str, port: u16) -> std::net::SocketAddr {
    let pod = runner
        .sim
        .as_ref()
        .expect("a kube-sim")
        .get_value("pods", "telo-sessions", &format!("telo-watch-{id}"))
        .expect("the watch pod");
    let ip: std::net::IpAddr = pod["status"]["podIP"].as_str().unwrap().parse().unwrap();
    std::net::SocketAddr::new(ip, port)
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_beside_the_apps_with_only_the_operators_env_and_its_token(
    #[case] backend: Backend,
) {
    let port = free_port();
    let catalog = catalog(port);
    let runner = runner(backend, &catalog, true).await;
    let (_, caps) = runner.get("/v1/capabilities").await;
    assert_eq!(caps["features"]["agents"], json!(["helper"]));

    let id = runner.create_body(watch_body("helper", json!([]))).await;
    let mut events = runner.events(&id, &[]).await;
    let status = running(&mut events).await;
    let agent = &status["agent"];
    assert_eq!(agent["host"], "");
    assert_eq!(agent["port"], json!(port));
    assert_eq!(agent["protocol"], "tcp");
    let token = agent["token"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 32);
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(snapshot["agent"], "helper");

    // The agent wrote into the session's workspace what it was given.
    let deadline = std::time::Instant::now() + test_support::WAIT;
    let written = loop {
        if let Some(text) = workspace_file(&runner, &id, "agent.txt").await {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never wrote"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let fields: Vec<&str> = written.split('|').collect();
    assert_eq!(fields[..3], ["operator-secret", token.as_str(), "unset"]);
    // And it listens where `running.agent` says: on Kubernetes at the
    // pod's IP; locally in the session's own network, through the edge,
    // which asks for the agent's token.
    let deadline = std::time::Instant::now() + test_support::WAIT;
    match backend {
        Backend::Kubernetes => {
            let addr = agent_address(&runner, &id, port);
            while tokio::net::TcpStream::connect(addr).await.is_err() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the agent never listened on {addr}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        Backend::Local => {
            // Guarded by its token, the reported URL carries a grant.
            let url = agent["url"].as_str().unwrap();
            assert!(
                url.starts_with(&format!("http://{port}-{id}.preview.test/?telo_access=")),
                "{url}"
            );
            let through_edge = |bearer: Option<&str>| {
                let mut request = runner
                    .client
                    .get(runner.url("/"))
                    .header("host", format!("{port}-{id}.preview.test"))
                    .header("accept", "application/json");
                if let Some(bearer) = bearer {
                    request = request.bearer_auth(bearer);
                }
                request.send()
            };
            assert_eq!(
                through_edge(None).await.unwrap().status(),
                StatusCode::UNAUTHORIZED
            );
            loop {
                let answer = through_edge(Some(&token)).await.unwrap();
                if answer.status() == StatusCode::OK {
                    assert_eq!(answer.text().await.unwrap(), format!("ok {port}"));
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the agent never answered: {}",
                    answer.status()
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    // The apps got the session's env and nothing of the agent's.
    let mut socket = runner.io(&id, "?app=app").await;
    let frames = test_support::ws::read_until_output(&mut socket, "SESSION_VALUE=").await;
    let mut output = String::new();
    for frame in frames {
        if let test_support::ws::IoFrame::Output { bytes, .. } = frame {
            output.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    drop(socket);
    assert!(
        output.contains("SESSION_VALUE=from-the-session"),
        "{output}"
    );
    assert!(output.contains("AGENT_SECRET=<unset>"), "{output}");
    assert!(output.contains("AGENT_TOKEN=<unset>"), "{output}");

    // A new app set may not take the agent's port.
    let response = runner
        .client
        .put(runner.url(&format!("/v1/sessions/{id}/apps")))
        .json(&json!({"apps": [{"name": "web", "entryRelativePath": "telo.yaml", "ports": [{"port": port, "protocol": "tcp"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        response.json::<Value>().await.unwrap(),
        json!({
            "error": "port_conflict",
            "message": format!("app 'web' declares tcp port {port}, which this session's co-resident agent 'helper' listens on"),
        })
    );

    // Suspended and resumed, it runs again with the same token.
    drop(events);
    let resumed = loop {
        let (status, body) = runner
            .post(&format!("/v1/sessions/{id}/resume"), &json!({}))
            .await;
        if status == StatusCode::ACCEPTED {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline + test_support::WAIT,
            "never suspended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(resumed["sessionId"], json!(id));
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running") && f.id.unwrap_or(0) > 0)
        .await;
    let last_running = frames
        .iter()
        .rev()
        .find(|f| f.status_kind().as_deref() == Some("running"))
        .unwrap()
        .json();
    assert_eq!(last_running["status"]["agent"]["token"], json!(token));
    runner.stop().await;
}

/// The env secrets of the watch pod of session `id`, and that pod as
/// stored, once it exists.
async fn watch_pod_secrets(sim: &kube_sim::KubeSim, id: &str) -> (Vec<String>, String) {
    let pod = sim
        .wait_for_value(
            "pods",
            "telo-sessions",
            &format!("telo-watch-{id}"),
            |_| true,
            test_support::WAIT,
        )
        .await
        .unwrap();
    (common::env_secrets_of(&pod), pod.to_string())
}

/// On Kubernetes the agent's operator env and its token are in no stored
/// pod (anyone with `get pods` in the session namespace reads every spec),
/// only in a Secret of the pod's own, which goes with the pod: at suspend,
/// and when the session is deleted. The agent still gets every value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_operator_env_and_token_are_in_no_stored_pod_and_go_with_it() {
    let port = free_port();
    let catalog = catalog(port);
    let runner = runner(Backend::Kubernetes, &catalog, true).await;
    let sim = runner.sim.as_ref().unwrap();
    let id = runner.create_body(watch_body("helper", json!([]))).await;
    let mut events = runner.events(&id, &[]).await;
    let token = running(&mut events).await["agent"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = std::time::Instant::now() + test_support::WAIT;
    let written = loop {
        if let Some(text) = workspace_file(&runner, &id, "agent.txt").await {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never wrote"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(written, format!("operator-secret|{token}|unset"));
    let (first, stored) = watch_pod_secrets(sim, &id).await;
    assert!(!stored.contains("operator-secret"), "{stored}");
    assert!(!stored.contains(&token), "{stored}");
    assert_eq!(first.len(), 1, "{stored}");

    // Suspended (idle), its pod and the pod's Secret are gone; resumed, a
    // new pod has a new Secret, and is as clean.
    drop(events);
    common::watch::until_status(&runner, &id, "suspended").await;
    sim.wait_for_deletion("secrets", "telo-sessions", &first[0], test_support::WAIT)
        .await
        .expect("a suspended session's pod Secret is deleted with its pod");
    let (status, _) = runner
        .post(&format!("/v1/sessions/{id}/resume"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let mut events = runner.events(&id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running") && f.id.unwrap_or(0) > 0)
        .await;
    let (second, stored) = watch_pod_secrets(sim, &id).await;
    assert!(!stored.contains("operator-secret"), "{stored}");
    assert!(!stored.contains(&token), "{stored}");
    assert_eq!(second.len(), 1, "{stored}");
    assert_ne!(second, first);

    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    sim.wait_for_deletion("secrets", "telo-sessions", &second[0], test_support::WAIT)
        .await
        .expect("a deleted session's pod Secret is deleted with its pod");
    runner.stop().await;
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_wins_a_port_clash_and_bad_agents_are_refused(#[case] backend: Backend) {
    let port = free_port();
    let catalog = catalog(port);
    let runner = runner(backend, &catalog, false).await;
    let id = runner
        .create_body(watch_body(
            "helper",
            json!([{"port": port, "protocol": "tcp"}]),
        ))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let notice = frames
        .iter()
        .find(|f| f.event.as_deref() == Some("progress"))
        .expect("a notice")
        .json();
    assert_eq!(
        notice,
        json!({
            "type": "progress",
            "phase": "provision",
            "message": format!("co-resident agent 'helper' was not started: it listens on tcp port {port}, which app 'app' declares"),
        })
    );
    assert!(
        frames.last().unwrap().json()["status"]
            .get("agent")
            .is_none()
    );
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert!(snapshot.get("agent").is_none(), "{snapshot}");

    for (agent, code, message) in [
        (
            "nobody",
            "unknown_agent",
            "agent 'nobody' is not offered by this runner \u{2014} offered: helper".to_owned(),
        ),
        (
            "portless",
            "agent_port_undeclared",
            "agent 'portless' declares no port, so this runner cannot route it \u{2014} set RUNNER_APPS.portless.port to the port its image listens on".to_owned(),
        ),
    ] {
        let (status, body) = runner
            .post("/v1/sessions", &watch_body(agent, json!([])))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body, json!({"error": code, "message": message}));
    }
    runner.stop().await;
}

/// A kernel that, under `--watch`, plants a `~/.gitconfig` in its home before
/// it starts, then (in the background) tries to read the agent's secret and
/// to write into the agent's home, whose path the agent publishes in the
/// workspace; what it managed goes to `app-saw.txt`.
fn home_planting_kernel(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        r#"#!/bin/sh
case " $* " in *" --watch "*)
  printf '[core]\n\tfsmonitor = planted-by-the-app\n' > "$HOME/.gitconfig"
  (
    i=0
    while [ ! -s agent-home.txt ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
    h=$(cat agent-home.txt)
    {{
      cat "$h/secret" 2>/dev/null || echo unreadable
      printf '[core]\n\tfsmonitor = planted-later\n' > "$h/.gitconfig" 2>/dev/null
    }} > app-saw.tmp
    mv app-saw.tmp app-saw.txt
  ) > /dev/null 2>&1 &
esac
exec '{}' "$@"
"#,
        fake_telo_path().display()
    );
    let kernel = dir.join("telo");
    std::fs::write(&kernel, script).unwrap();
    std::fs::set_permissions(&kernel, std::fs::Permissions::from_mode(0o755)).unwrap();
    kernel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_never_shares_its_home_with_the_apps_of_its_session() {
    let kernel_dir = tempfile::tempdir().unwrap();
    let kernel = home_planting_kernel(kernel_dir.path());
    let port = free_port();
    // The agent keeps a secret in its home, says what it finds of the app's
    // planted configuration there, and publishes where its home is.
    let script = format!(
        r#"printf 'agent-secret-5c1e' > "$HOME/secret"; if [ -e "$HOME/.gitconfig" ]; then cat "$HOME/.gitconfig"; else echo none; fi > "$WORKSPACE_DIR/agent-saw.tmp"; mv "$WORKSPACE_DIR/agent-saw.tmp" "$WORKSPACE_DIR/agent-saw.txt"; printf '%s' "$HOME" > "$WORKSPACE_DIR/agent-home.tmp"; mv "$WORKSPACE_DIR/agent-home.tmp" "$WORKSPACE_DIR/agent-home.txt"; printf 'kind: Telo.Application\nmetadata: {{ name: agent }}\nfakeTelo:\n  listen: [{port}]\n' > "$HOME/agent.yaml"; exec "$0" run "$HOME/agent.yaml""#
    );
    let catalog = json!({
        "helper": {
            "image": "acme/agent:1",
            "port": port,
            "command": ["/bin/sh", "-c", script, fake_telo_path().to_string_lossy()],
        },
    })
    .to_string();
    let fake_telo = fake_telo_path().to_string_lossy().into_owned();
    let runner = Runner::start_on(
        Backend::Local,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_APPS", &catalog),
            ("RUNNER_LOCAL_TELO", &kernel.to_string_lossy()),
            // The wrapper runs fake-telo from outside its own directory.
            ("RUNNER_LOCAL_SANDBOX_READ_ONLY", &fake_telo),
        ],
    )
    .await;
    let id = runner.create_body(watch_body("helper", json!([]))).await;
    let mut events = runner.events(&id, &[]).await;
    running(&mut events).await;

    let wait_for = async |path: &str| {
        let deadline = std::time::Instant::now() + test_support::WAIT;
        loop {
            if let Some(text) = workspace_file(&runner, &id, path).await {
                return text;
            }
            assert!(std::time::Instant::now() < deadline, "{path} never written");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    // What the app wrote into its home is not the agent's configuration...
    assert_eq!(wait_for("agent-saw.txt").await, "none\n");
    // ...and the agent's home is neither readable nor writable by the app.
    let app_saw = wait_for("app-saw.txt").await;
    assert_eq!(app_saw, "unreadable\n");
    let agent_home = std::path::PathBuf::from(wait_for("agent-home.txt").await);
    assert_eq!(
        std::fs::read_to_string(agent_home.join("secret")).unwrap(),
        "agent-secret-5c1e"
    );
    assert!(
        !agent_home.join(".gitconfig").exists(),
        "the app wrote into the agent's home"
    );
    runner.stop().await;
}

/// What the edge check answers for session `id` given `headers`, with the
/// body, so two answers can be compared whole.
async fn edge_answer(
    runner: &Runner,
    id: &str,
    headers: &[(&str, String)],
    bearer: Option<&str>,
) -> (StatusCode, String) {
    let mut request = runner
        .client
        .get(runner.url(&format!("/internal/sessions/{id}/access")));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}

/// The edge check fails closed: a request whose host the headers do not
/// name unambiguously, or a port no app publishes, needs a token of the
/// session; only the apps' own declared ports are public. And it answers
/// an unknown id exactly as it refuses a known one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_check_asks_for_a_token_whenever_the_host_is_unclear() {
    let agent_port = free_port();
    let app_port = free_port();
    let catalog = catalog(agent_port);
    let runner = runner(Backend::Local, &catalog, false).await;
    // The app listens on its declared port, so the kernel's own account of
    // its ports (which replaces the declared ones) names it too.
    let mut body = watch_body("helper", json!([{"port": app_port, "protocol": "tcp"}]));
    body["bundle"] = test_support::bundle::fake_telo_bundle(json!({"listen": [app_port]}));
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let token = running(&mut events).await["agent"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let host = |port: u16| format!("{port}-{id}.sessions.example.com");
    let app_host = host(app_port);
    let agent_host = host(agent_port);

    // The app's own port is public, as in the reference.
    let public = [("x-forwarded-host", app_host.clone())];
    assert_eq!(
        edge_answer(&runner, &id, &public, None).await.0,
        StatusCode::NO_CONTENT
    );
    let ambiguous: Vec<(&str, Vec<(&str, String)>)> = vec![
        (
            "an X-Original-URL without a scheme does not fall back to X-Forwarded-Host",
            vec![
                ("x-original-url", format!("{agent_host}/")),
                ("x-forwarded-host", app_host.clone()),
            ],
        ),
        (
            "a list in X-Forwarded-Host is not read for its first value",
            vec![("x-forwarded-host", format!("{app_host}, {agent_host}"))],
        ),
        (
            "a port no app declares is not public",
            vec![("x-forwarded-host", host(9))],
        ),
        (
            "headers naming different hosts",
            vec![
                ("x-original-url", format!("https://{agent_host}/")),
                ("x-forwarded-host", app_host.clone()),
            ],
        ),
    ];
    for (case, headers) in &ambiguous {
        let (status, _) = edge_answer(&runner, &id, headers, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}");
        let (status, _) = edge_answer(&runner, &id, headers, Some(&token)).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{case}, with the token");
    }

    // No id oracle: an unknown id is refused exactly like a known one.
    let agent = [("x-original-url", format!("https://{agent_host}/"))];
    let known = edge_answer(&runner, &id, &agent, Some("wrong")).await;
    let unknown = edge_answer(&runner, "zzzzzzzzzzzz", &agent, Some("wrong")).await;
    assert_eq!(known.0, StatusCode::UNAUTHORIZED);
    assert_eq!(known, unknown);
    runner.stop().await;
}

/// A watch session's directory past `RUNNER_LOCAL_MAX_DISK` takes down what
/// filled it (here its agent, writing into its home), saying so; the
/// session, its workspace and its apps live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_session_past_its_disk_bound_stops_the_writer_and_keeps_the_session() {
    let filler = r#"for i in 1 2 3 4 5 6; do head -c 524288 /dev/urandom > "$HOME/f$i"; done; echo wrote; exec sleep 600"#;
    let catalog = json!({
        "filler": {"image": "acme/filler:1", "port": free_port(), "command": ["/bin/sh", "-c", filler]},
    })
    .to_string();
    let runner = Runner::start_on(
        Backend::Local,
        &[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_APPS", catalog.as_str()),
            ("RUNNER_LOCAL_MAX_DISK", "1Mi"),
        ],
    )
    .await;
    let id = runner.create_body(watch_body("filler", json!([]))).await;
    let mut events = runner.events(&id, &[]).await;
    let told = "was stopped: the session's directory holds";
    let frames = events
        .events_until(|f| {
            f.json().to_string().contains(told) || f.status_kind().as_deref() == Some("failed")
        })
        .await;
    let last = frames.last().unwrap().json().to_string();
    assert!(last.contains(told), "{last}");
    assert!(
        last.contains("past its disk bound of 1 MiB (RUNNER_LOCAL_MAX_DISK); its files are kept"),
        "{last}"
    );
    let (_, snapshot) = runner.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(snapshot["status"]["kind"], "running", "{snapshot}");
    assert!(workspace_file(&runner, &id, "telo.yaml").await.is_some());
}
