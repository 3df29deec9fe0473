//! The session edge (`RUNNER_PREVIEW_BASE_URL`): the runner itself serves
//! each session port at `<port>-<sessionId>.<base host>`, on both backends;
//! `running` endpoints carry that URL; anything that is not such a host is
//! the API, and a request never goes anywhere but a published port of a
//! running session.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};

const BASE: &str = "http://preview.test";

async fn via_host(runner: &Runner, host: &str) -> (StatusCode, String) {
    let response = runner
        .client
        .get(runner.url("/hello?x=1"))
        .header("host", host)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

fn error_of(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap()["error"].clone()
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_port_is_served_at_its_session_host_and_nothing_else_is(
    #[case] backend: Backend,
) {
    let runner = Runner::start_on(backend, &[("RUNNER_PREVIEW_BASE_URL", BASE)]).await;
    let port = test_support::free_port();
    let mut body = test_support::bundle::start_body(json!({"listen": [port], "echo": true}));
    body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let running = frames.last().unwrap().json();
    let endpoint = &running["status"]["endpoints"][0];
    assert_eq!(endpoint["port"], port);
    assert_eq!(endpoint["url"], format!("http://{port}-{id}.preview.test"));

    // The session's own port, through the edge (the app may take a moment
    // to listen after `running`: wait for it, bounded).
    let host = format!("{port}-{id}.preview.test");
    let deadline = std::time::Instant::now() + test_support::WAIT;
    let answer = loop {
        let answer = via_host(&runner, &host).await;
        if answer.0 != StatusCode::BAD_GATEWAY {
            break answer;
        }
        assert!(std::time::Instant::now() < deadline, "{answer:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(answer, (StatusCode::OK, format!("ok {port}")));
    // Mixed case and a trailing dot name the same host.
    let upper = format!("{port}-{id}.PREVIEW.test.");
    assert_eq!(via_host(&runner, &upper).await.0, StatusCode::OK);

    // A port it does not publish, an unknown session: refused, named.
    let other = if port == 65535 { port - 1 } else { port + 1 };
    let (status, body) = via_host(&runner, &format!("{other}-{id}.preview.test")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body), "port_not_published");
    let (status, body) = via_host(&runner, &format!("{port}-zzzzzzzzzzzz.preview.test")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body), "unknown_session");
    // Malformed under the base: 421, never forwarded.
    for hostile in [
        format!("0{port}-{id}.preview.test"),
        format!("{port}-{id}.x.preview.test"),
        format!("{port}-{id}.preview.test:6443"),
    ] {
        let (status, body) = via_host(&runner, &hostile).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{hostile}: {body}");
    }
    // Not under the base: the API's, which has no `/hello`.
    let (status, body) = via_host(&runner, &format!("{port}-{id}.evil.test")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!body.contains("ok "), "{body}");

    // Ended: 410.
    runner.delete(&format!("/v1/sessions/{id}")).await;
    events.events_until_end().await;
    let (status, body) = via_host(&runner, &host).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    runner.stop().await;
}

#[tokio::test]
async fn the_preview_base_beside_a_routing_mode_that_publishes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sim = common::cluster().start().await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_telo-runner"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("RUNNER_BACKEND", "kubernetes")
        .env("KUBECONFIG", &kubeconfig)
        .env("RUNNER_SELF_URL", "http://127.0.0.1:1")
        .env("RUNNER_PREVIEW_BASE_URL", BASE)
        .env("SESSION_ROUTING_MODE", "ingress")
        .env("SESSION_ROUTING_BASE_DOMAIN", "apps.example.com")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("RUNNER_PREVIEW_BASE_URL is set but so is SESSION_ROUTING_MODE=ingress"),
        "{stderr}"
    );
    sim.shutdown().await;
}

/// A runner whose watch sessions are suspended after one idle second,
/// behind the edge, and a free port for an app.
async fn waking_runner() -> (Runner, u16) {
    let runner = Runner::start_with(&[
        ("RUNNER_PREVIEW_BASE_URL", BASE),
        ("RUNNER_WATCH_SESSIONS", "true"),
        ("RUNNER_WATCH_IDLE_SECONDS", "1"),
    ])
    .await;
    (runner, test_support::free_port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_suspended_sessions_port_wakes_it() {
    let (runner, port) = waking_runner().await;
    let id = runner
        .create_body(common::watch::watch_body(
            json!({"listen": [port], "stdout": ["up"]}),
        ))
        .await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.event.as_deref() == Some("endpoints"))
        .await;
    assert_eq!(
        frames.last().unwrap().json()["added"][0]["url"],
        format!("http://{port}-{id}.preview.test")
    );
    drop(events);
    common::watch::until_status(&runner, &id, "suspended").await;

    // A plain request, no resume call: held while the session comes back,
    // then answered by its app.
    let host = format!("{port}-{id}.preview.test");
    let (status, body) = via_host(&runner, &host).await;
    assert_eq!((status, body), (StatusCode::OK, format!("ok {port}")));
    // It ran again: a second generation of its app, attributed to the
    // resume (its `run` event may follow the port's first answer).
    let mut events = runner.events(&id, &[]).await;
    let started = common::watch::run_event(&mut events, "app", "started", 2).await;
    assert_eq!(started["trigger"], "resume", "{started}");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_woken_by_a_request_is_not_suspended_while_its_app_starts() {
    let (runner, port) = waking_runner().await;
    // An app that takes longer to start than the idle limit, as the real
    // kernel's http-hello (about a second) does against a short one.
    let id = runner
        .create_body(common::watch::watch_body(
            json!({"listen": [port], "stdout": ["up"], "startMs": 2500}),
        ))
        .await;
    common::watch::until_status(&runner, &id, "suspended").await;
    let host = format!("{port}-{id}.preview.test");
    let (status, body) = via_host(&runner, &host).await;
    assert_eq!((status, body), (StatusCode::OK, format!("ok {port}")));
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

/// A client that shows redirects instead of following them, as the tests
/// need to see what the edge answers.
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A request for `target` on session host `host`, with `cookie` if any.
async fn edge_get(
    runner_base: &str,
    host: &str,
    target: &str,
    cookie: Option<&str>,
) -> reqwest::Response {
    let mut request = no_redirects()
        .get(format!("{runner_base}{target}"))
        .header("host", host)
        .header("accept", "application/json");
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    request.send().await.unwrap()
}

/// The path and query of an edge URL (`http://<host>/?telo_access=...`).
fn target_of(url: &str) -> String {
    let after_scheme = url.split_once("://").unwrap().1;
    after_scheme[after_scheme.find('/').unwrap()..].to_owned()
}

/// Trades the pass in `url` for the edge's cookie (`telo_access=...`).
async fn cookie_from(runner_base: &str, host: &str, url: &str) -> String {
    let response = edge_get(runner_base, host, &target_of(url), None).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "{url}");
    assert_eq!(response.headers()["location"], "/");
    let set = response.headers()["set-cookie"].to_str().unwrap();
    assert!(set.contains("HttpOnly") && !set.contains("Domain"), "{set}");
    set.split(';').next().unwrap().to_owned()
}

/// The answer of the app behind a cookie, once it listens.
async fn app_answer(runner_base: &str, host: &str, cookie: &str) -> (StatusCode, String) {
    let deadline = std::time::Instant::now() + test_support::WAIT;
    loop {
        let response = edge_get(runner_base, host, "/", Some(cookie)).await;
        let status = response.status();
        if status != StatusCode::BAD_GATEWAY {
            return (status, response.text().await.unwrap());
        }
        assert!(std::time::Instant::now() < deadline, "never listened");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_port_opens_from_its_reported_url_and_from_share_links(#[case] backend: Backend) {
    let runner = Runner::start_on(
        backend,
        &[
            ("RUNNER_PREVIEW_BASE_URL", BASE),
            ("RUNNER_PREVIEW_ACCESS", "private"),
        ],
    )
    .await;
    let port = test_support::free_port();
    let mut body = test_support::bundle::start_body(json!({"listen": [port], "echo": true}));
    body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let url = frames.last().unwrap().json()["status"]["endpoints"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let host = format!("{port}-{id}.preview.test");
    assert!(
        url.starts_with(&format!("http://{host}/?telo_access=")),
        "{url}"
    );

    // Nothing presented: refused, in JSON for a client and a page for a
    // browser.
    let response = edge_get(&runner.base, &host, "/", None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_of(&response.text().await.unwrap()), "unauthorized");
    let page = no_redirects()
        .get(runner.url("/"))
        .header("host", &host)
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED);
    assert!(page.text().await.unwrap().contains("is private"));

    // The reported URL opens it, as the editor's link does.
    let cookie = cookie_from(&runner.base, &host, &url).await;
    assert_eq!(
        app_answer(&runner.base, &host, &cookie).await,
        (StatusCode::OK, format!("ok {port}"))
    );

    // A share link: made, listed, used, revoked.
    let (status, link) = runner
        .post(
            &format!("/v1/sessions/{id}/links"),
            &json!({"port": port, "ttlSeconds": 600}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{link}");
    let link_id = link["linkId"].as_str().unwrap().to_owned();
    let link_url = link["url"].as_str().unwrap().to_owned();
    assert!(link_url.starts_with(&format!("http://{host}/?telo_access=")));
    assert!(link["expiresAt"].as_str().unwrap().ends_with('Z'));
    let (status, listed) = runner.get(&format!("/v1/sessions/{id}/links")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["links"][0]["linkId"], link_id.as_str());
    assert_eq!(listed["links"][0]["port"], port);
    let shared = cookie_from(&runner.base, &host, &link_url).await;
    assert_eq!(
        app_answer(&runner.base, &host, &shared).await.0,
        StatusCode::OK
    );
    let (status, _) = runner
        .delete(&format!("/v1/sessions/{id}/links/{link_id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Revoked: the link and the cookie it was traded for open nothing;
    // the owner's own cookie still does.
    let response = edge_get(&runner.base, &host, &target_of(&link_url), None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = edge_get(&runner.base, &host, "/", Some(&shared)).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        app_answer(&runner.base, &host, &cookie).await.0,
        StatusCode::OK
    );
    let (_, listed) = runner.get(&format!("/v1/sessions/{id}/links")).await;
    assert_eq!(listed["links"], json!([]));
    let (status, body) = runner
        .delete(&format!("/v1/sessions/{id}/links/{link_id}"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body), "link_not_found");

    // Bad requests are named.
    let other = if port == 65535 { port - 1 } else { port + 1 };
    for (request, code) in [
        (json!({"port": other}), "port_not_published"),
        (json!({"port": port, "ttlSeconds": 0}), "invalid_request"),
        (json!({"port": "eighty"}), "invalid_request"),
        (json!({}), "invalid_request"),
    ] {
        let (status, body) = runner
            .post(&format!("/v1/sessions/{id}/links"), &request)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {body}");
        assert_eq!(body["error"], code, "{request}: {body}");
    }
    let (status, body) = runner
        .post("/v1/sessions/zzzzzzzzzzzz/links", &json!({"port": port}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    events.events_until_end().await;
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_links_need_the_edge() {
    let runner = Runner::start().await;
    let id = runner
        .create(json!({"stdout": ["up"], "exitAfterMs": 60_000}))
        .await;
    let (status, body) = runner
        .post(&format!("/v1/sessions/{id}/links"), &json!({"port": 8080}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "edge_disabled");
    runner.delete(&format!("/v1/sessions/{id}")).await;
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_links_and_cookies_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runner.log");
    let runner = common::RunnerProcess::spawn_logging_to(
        Backend::Local,
        dir.path(),
        None,
        &[
            ("RUNNER_PREVIEW_BASE_URL", BASE),
            ("RUNNER_PREVIEW_ACCESS", "private"),
            ("LOG_LEVEL", "trace"),
        ],
        &log,
    )
    .await;
    let client = runner_core::http_client::client();
    let port = test_support::free_port();
    let mut body = test_support::bundle::start_body(json!({"listen": [port]}));
    body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
    let created: Value = client
        .post(format!("{}/v1/sessions", runner.base))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events = test_support::sse::SseStream::connect(
        &format!("{}/v1/sessions/{id}/events", runner.base),
        &[],
    )
    .await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let url = frames.last().unwrap().json()["status"]["endpoints"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let host = format!("{port}-{id}.preview.test");
    let link: Value = client
        .post(format!("{}/v1/sessions/{id}/links", runner.base))
        .json(&json!({"port": port}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let link_url = link["url"].as_str().unwrap().to_owned();
    let cookie = cookie_from(&runner.base, &host, &url).await;
    let shared = cookie_from(&runner.base, &host, &link_url).await;
    assert_eq!(
        app_answer(&runner.base, &host, &cookie).await.0,
        StatusCode::OK
    );
    // Refused ones too.
    edge_get(&runner.base, &host, &format!("{}x", target_of(&url)), None).await;
    client
        .delete(format!("{}/v1/sessions/{id}", runner.base))
        .send()
        .await
        .unwrap();
    events.events_until_end().await;
    drop(runner);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains(&id), "the log is the runner's: {logged}");
    for secret in [&url, &link_url, &cookie, &shared] {
        let token = secret.rsplit(['=']).next().unwrap();
        assert!(!logged.contains(token), "{secret} is in the log");
    }
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inspected_sessions_kernel_is_served_at_its_inspect_url(#[case] backend: Backend) {
    let runner = Runner::start_on(backend, &[("RUNNER_PREVIEW_BASE_URL", BASE)]).await;
    let mut body =
        test_support::bundle::start_body(json!({"stdout": ["up"], "exitAfterMs": 60_000}));
    body["inspect"] = json!(true);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let running = frames.last().unwrap().json();
    assert_eq!(
        running["status"]["inspectUrl"],
        format!("http://9230-{id}.preview.test"),
        "{running}"
    );
    // The kernel's debug stream, through the edge.
    let host = format!("9230-{id}.preview.test");
    let deadline = std::time::Instant::now() + test_support::WAIT;
    let mut response = loop {
        let response = runner
            .client
            .get(runner.url("/events"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        if response.status() != StatusCode::BAD_GATEWAY {
            break response;
        }
        assert!(std::time::Instant::now() < deadline, "never served");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(response.status(), StatusCode::OK);
    let first = tokio::time::timeout(test_support::WAIT, response.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!first.is_empty());
    drop(response);
    // A session without inspect has no such port.
    let plain = runner
        .create(json!({"stdout": ["up"], "exitAfterMs": 60_000}))
        .await;
    let mut plain_events = runner.events(&plain, &[]).await;
    let frames = plain_events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    assert!(
        frames.last().unwrap().json()["status"]
            .get("inspectUrl")
            .is_none()
    );
    let (status, body) = via_host(&runner, &format!("9230-{plain}.preview.test")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    for session in [&id, &plain] {
        runner.delete(&format!("/v1/sessions/{session}")).await;
    }
    events.events_until_end().await;
    runner.stop().await;
}

/// Which session a share link survives a restart with.
#[derive(Debug, Clone, Copy)]
enum Kept {
    /// A watch session: listed suspended (local) or adopted running
    /// (Kubernetes) by the next runner, and woken by the link's request.
    Watch,
    /// A run session, whose pod the next runner adopts (Kubernetes).
    Run,
}

#[rstest]
#[case::local_watch(Backend::Local, Kept::Watch)]
#[case::kubernetes_watch(Backend::Kubernetes, Kept::Watch)]
#[case::kubernetes_run(Backend::Kubernetes, Kept::Run)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_links_and_revocations_outlive_the_runner(
    #[case] backend: Backend,
    #[case] kept: Kept,
) {
    use common::RunnerProcess;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("signing-key");
    std::fs::write(&key, [7_u8; 32]).unwrap();
    let key = key.to_str().unwrap().to_owned();
    let sim = common::cluster_for(backend).await;
    let vars = [
        ("RUNNER_PREVIEW_BASE_URL", BASE),
        ("RUNNER_PREVIEW_ACCESS", "private"),
        ("RUNNER_PREVIEW_SIGNING_KEY_FILE", key.as_str()),
        ("RUNNER_WATCH_SESSIONS", "true"),
    ];
    let client = runner_core::http_client::client();
    let mut first = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), &vars).await;
    let port = test_support::free_port();
    let body = match kept {
        Kept::Watch => common::watch::watch_body(json!({"listen": [port], "echo": true})),
        Kept::Run => {
            let mut body =
                test_support::bundle::start_body(json!({"listen": [port], "echo": true}));
            body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
            body
        }
    };
    let send = |base: &str, method: reqwest::Method, path: String, body: Option<Value>| {
        let client = client.clone();
        let base = base.to_owned();
        async move { common::watch::request_at(&client, &base, method, &path, body).await }
    };
    let (status, created) = send(
        &first.base,
        reqwest::Method::POST,
        "/v1/sessions".into(),
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let mut events = test_support::sse::SseStream::connect(
        &format!("{}/v1/sessions/{id}/events", first.base),
        &[],
    )
    .await;
    events
        .events_until(|f| match kept {
            Kept::Watch => f.event.as_deref() == Some("endpoints"),
            Kept::Run => f.status_kind().as_deref() == Some("running"),
        })
        .await;
    drop(events);

    let mut made = Vec::new();
    for _ in 0..2 {
        let (status, link) = send(
            &first.base,
            reqwest::Method::POST,
            format!("/v1/sessions/{id}/links"),
            Some(json!({"port": port, "ttlSeconds": 600})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{link}");
        made.push(link);
    }
    let (kept_link, revoked) = (&made[0], &made[1]);
    let (status, _) = send(
        &first.base,
        reqwest::Method::DELETE,
        format!(
            "/v1/sessions/{id}/links/{}",
            revoked["linkId"].as_str().unwrap()
        ),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let host = format!("{port}-{id}.preview.test");
    let url = kept_link["url"].as_str().unwrap();
    let cookie = cookie_from(&first.base, &host, url).await;
    assert_eq!(
        app_answer(&first.base, &host, &cookie).await,
        (StatusCode::OK, format!("ok {port}"))
    );

    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");
    let second = RunnerProcess::spawn(backend, dir.path(), sim.as_ref(), &vars).await;
    common::watch::ready(&second.base).await;
    let (status, listed) = send(
        &second.base,
        reqwest::Method::GET,
        format!("/v1/sessions/{id}/links"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(
        listed["links"],
        json!([kept_link]),
        "only the unrevoked link"
    );
    // Its URL opens the app again (a suspended session wakes for it); the
    // revoked one still opens nothing.
    let cookie = cookie_from(&second.base, &host, url).await;
    assert_eq!(
        app_answer(&second.base, &host, &cookie).await,
        (StatusCode::OK, format!("ok {port}"))
    );
    let refused = edge_get(
        &second.base,
        &host,
        &target_of(revoked["url"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    send(
        &second.base,
        reqwest::Method::DELETE,
        format!("/v1/sessions/{id}"),
        None,
    )
    .await;
}

/// A link change the cluster refuses to keep is refused whole: no link is
/// made, and a link whose revocation could not be kept still opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_change_that_cannot_be_kept_changes_nothing() {
    let runner = Runner::start_on(
        Backend::Kubernetes,
        &[
            ("RUNNER_PREVIEW_BASE_URL", BASE),
            ("RUNNER_PREVIEW_ACCESS", "private"),
        ],
    )
    .await;
    let sim = runner.sim.as_ref().unwrap();
    let port = test_support::free_port();
    let mut body = test_support::bundle::start_body(json!({"listen": [port], "echo": true}));
    body["ports"] = json!([{"port": port, "protocol": "tcp"}]);
    let id = runner.create_body(body).await;
    let mut events = runner.events(&id, &[]).await;
    events
        .events_until(|f| f.status_kind().as_deref() == Some("running"))
        .await;
    let links = format!("/v1/sessions/{id}/links");
    let wanted = json!({"port": port});

    sim.faults().fail_next("patch", "pods", 1, 500);
    let (status, refused) = runner.post(&links, &wanted).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(refused["error"], "links_not_kept");
    assert_eq!(runner.get(&links).await.1["links"], json!([]));

    let (status, link) = runner.post(&links, &wanted).await;
    assert_eq!(status, StatusCode::CREATED, "{link}");
    let link_id = link["linkId"].as_str().unwrap();
    sim.faults().fail_next("patch", "pods", 1, 500);
    let (status, refused) = runner.delete(&format!("{links}/{link_id}")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(runner.get(&links).await.1["links"][0]["linkId"], link_id);
    let host = format!("{port}-{id}.preview.test");
    let cookie = cookie_from(&runner.base, &host, link["url"].as_str().unwrap()).await;
    assert_eq!(
        app_answer(&runner.base, &host, &cookie).await.0,
        StatusCode::OK
    );
    let (status, _) = runner.delete(&format!("{links}/{link_id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(runner.get(&links).await.1["links"], json!([]));
}
