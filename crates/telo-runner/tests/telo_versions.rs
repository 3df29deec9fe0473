//! Telo version selection (runner-core 0.17), black-box: a local runner
//! given a directory of kernels runs each request's version, and both
//! backends refuse before a session exists what they cannot run exactly.
//! (The Kubernetes backend's images are tested in `telo_versions_k8s`; the
//! real kernel by version in `real_kernel`.)
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{Backend, Runner};
use reqwest::StatusCode;
use rstest::rstest;
use serde_json::{Value, json};
use test_support::fake_telo::fake_telo_path;

/// A versions directory holding `versions`, each kernel fake-telo.
fn kernels(versions: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for version in versions {
        install(dir.path(), version, &fake_telo_path());
    }
    dir
}

fn install(dir: &Path, version: &str, kernel: &Path) {
    let bin = dir.join(version).join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(kernel, bin.join("telo")).unwrap();
}

async fn runner_with(dir: &Path, watch: bool) -> Runner {
    let dir = dir.to_string_lossy().into_owned();
    let mut vars = vec![("RUNNER_LOCAL_TELO_VERSIONS", dir.as_str())];
    if watch {
        vars.push(("RUNNER_WATCH_SESSIONS", "true"));
    }
    Runner::start_on(Backend::Local, &vars).await
}

fn body(fake_telo: Value) -> Value {
    let mut body = test_support::bundle::start_body(fake_telo);
    body.as_object_mut().unwrap().remove("config");
    body["inspect"] = json!(true);
    body
}

fn apps(versions: &[Option<&str>]) -> Value {
    Value::Array(
        versions
            .iter()
            .enumerate()
            .map(|(i, version)| {
                let mut app = json!({"name": format!("app{i}"), "entryRelativePath": "telo.yaml"});
                if let Some(version) = version {
                    app["telo"] = json!(version);
                }
                app
            })
            .collect(),
    )
}

#[tokio::test]
async fn without_a_versions_directory_a_named_version_is_unsupported() {
    let runner = Runner::start_on(Backend::Local, &[]).await;
    let (_, caps) = runner.get("/v1/capabilities").await;
    assert!(caps["features"].get("teloVersions").is_none(), "{caps}");
    assert!(caps["config"].get("supersededByTelo").is_none(), "{caps}");
    let mut request = body(json!({"exitCode": 0}));
    request["telo"] = json!("0.96.0");
    let (status, answer) = runner.post("/v1/sessions", &request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer,
        json!({
            "error": "telo_version_unsupported",
            "message": "this runner does not run a chosen telo version (its /v1/capabilities has no features.teloVersions) \u{2014} leave `telo` out to run the kernel it provides",
        })
    );
    // Unsupported wins over a version that is not even one.
    request["telo"] = json!("latest");
    let (_, answer) = runner.post("/v1/sessions", &request).await;
    assert_eq!(answer["error"], "telo_version_unsupported");
    runner.stop().await;
}

#[tokio::test]
async fn capabilities_advertise_versions_and_deprecate_what_they_supersede() {
    let dir = kernels(&["0.96.0"]);
    let runner = runner_with(dir.path(), false).await;
    let (_, caps) = runner.get("/v1/capabilities").await;
    assert_eq!(caps["features"]["teloVersions"], json!(true));
    assert_eq!(
        caps["config"]["supersededByTelo"],
        json!(["image", "pullPolicy"])
    );
    let schema = &caps["config"]["schema"];
    assert_eq!(schema["required"], json!([]));
    assert_eq!(schema["properties"]["image"]["deprecated"], json!(true));
    assert_eq!(
        schema["properties"]["pullPolicy"]["deprecated"],
        json!(true)
    );
    runner.stop().await;
}

#[tokio::test]
async fn a_run_session_runs_the_named_release_and_reports_it() {
    let dir = kernels(&["0.96.0", "0.97.0-rc.1"]);
    let runner = runner_with(dir.path(), false).await;
    // It runs until stopped, so its debug stream is there to be read.
    let mut request = body(json!({"echo": true}));
    request["telo"] = json!("0.97.0-rc.1");
    let id = runner.create_body(request).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events
        .events_until(|f| f.event.as_deref() == Some("run") && f.json()["phase"] == "started")
        .await;
    assert_eq!(frames.last().unwrap().json()["telo"], "0.97.0-rc.1");
    runner.stop().await;
}

/// The version gate is the core's; what a backend cannot supply is its
/// own (a kernel missing from the directory, an unreleased build without
/// an operator's image). Every refusal comes before a session exists.
#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn versions_are_checked_before_a_session_exists(#[case] backend: Backend) {
    let dir = kernels(&["0.96.0", "0.100.0"]);
    let (runner, unavailable) = match backend {
        Backend::Local => (
            runner_with(dir.path(), true).await,
            (
                {
                    let mut b = body(json!({}));
                    b["telo"] = json!("0.99.0");
                    b
                },
                json!({
                    "error": "telo_version_unavailable",
                    "message": "telo 0.99.0 cannot be run for app 'app': this runner has no telo 0.99.0 \u{2014} it has 0.96.0, 0.100.0",
                    "app": "app",
                    "version": "0.99.0",
                    "reason": "this runner has no telo 0.99.0 \u{2014} it has 0.96.0, 0.100.0",
                }),
            ),
        ),
        Backend::Kubernetes => (
            Runner::start_on(backend, &[("RUNNER_WATCH_SESSIONS", "true")]).await,
            (
                {
                    let mut b = body(json!({}));
                    b["telo"] = json!("0.97.0+unreleased");
                    b
                },
                json!({
                    "error": "telo_version_unavailable",
                    "message": "telo 0.97.0+unreleased cannot be run for app 'app': 0.97.0+unreleased is an unreleased build, which has no published image. Pin a released telo version for this workspace, or have the runner's operator set RUNNER_TELO_UNRELEASED_IMAGE to a kernel image built from that same tree",
                    "app": "app",
                    "version": "0.97.0+unreleased",
                    "reason": "0.97.0+unreleased is an unreleased build, which has no published image. Pin a released telo version for this workspace, or have the runner's operator set RUNNER_TELO_UNRELEASED_IMAGE to a kernel image built from that same tree",
                }),
            ),
        ),
    };
    let cases: Vec<(Value, Value)> = vec![
        unavailable,
        (
            {
                let mut b = body(json!({}));
                b["telo"] = json!("v0.96");
                b
            },
            json!({
                "error": "invalid_telo_version",
                "message": "telo version 'v0.96' is not a release version (major.minor.patch, optionally -prerelease and +build)",
            }),
        ),
        (
            {
                let mut b = body(json!({}));
                b["mode"] = json!("watch");
                b["apps"] = apps(&[Some("0.96.0"), None]);
                b
            },
            json!({
                "error": "invalid_telo_version",
                "message": "app 'app1' names no telo version while others do \u{2014} name one on every app or on none",
            }),
        ),
        (
            {
                let mut b = body(json!({}));
                b["telo"] = json!("0.96.0");
                b["apps"] = apps(&[Some("0.96.0")]);
                b
            },
            json!({
                "error": "invalid_telo_version",
                "message": "`telo` names the version of a request's one app; a request with `apps` names it on each app instead",
            }),
        ),
        (
            {
                let mut b = body(json!({}));
                b["mode"] = json!("watch");
                b["apps"] = apps(&[Some("0.96.0"), Some("0.81.0")]);
                b
            },
            json!({
                "error": "telo_version_unavailable",
                "message": "telo 0.81.0 cannot be run for app 'app1': telo 0.81.0 is older than 0.95.0, the oldest release a runner is verified to supervise (watch mode, the debug stream and the workspace marker)",
                "app": "app1",
                "version": "0.81.0",
                "reason": "telo 0.81.0 is older than 0.95.0, the oldest release a runner is verified to supervise (watch mode, the debug stream and the workspace marker)",
            }),
        ),
        (
            {
                let mut b = body(json!({}));
                b["telo"] = json!("0.96.0");
                b["config"] = json!({"image": "telorun/node:0-slim"});
                b
            },
            json!({
                "error": "invalid_config",
                "message": "`config.image` and an application's `telo` version both say what runs; send one. `config.image` is deprecated \u{2014} name the telo version instead.",
            }),
        ),
        (
            {
                let mut b = body(json!({}));
                b["telo"] = json!("0.96.0");
                b["config"] = json!({"pullPolicy": "always"});
                b
            },
            json!({
                "error": "invalid_config",
                "message": "`config.pullPolicy` does not apply to a session whose applications name their `telo` version: the runner pulls a version's image under its operator's policy. Omit it.",
            }),
        ),
    ];
    for (request, expected) in cases {
        let (status, answer) = runner.post("/v1/sessions", &request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}");
        assert_eq!(answer, expected, "{request}");
    }
    let (_, list) = runner.get("/v1/sessions").await;
    assert_eq!(list["sessions"], json!([]), "no session was created");
    runner.stop().await;
}

#[tokio::test]
async fn a_watch_session_runs_each_app_on_its_release() {
    let dir = kernels(&["0.96.0", "0.100.0"]);
    let runner = runner_with(dir.path(), true).await;
    let mut request = body(json!({"stdout": ["up"]}));
    request["mode"] = json!("watch");
    request["apps"] = json!([
        {"name": "old", "entryRelativePath": "telo.yaml", "telo": "0.96.0"},
        {"name": "new", "entryRelativePath": "telo.yaml", "telo": "0.100.0"},
    ]);
    let id = runner.create_body(request).await;
    let mut events = runner.events(&id, &[]).await;
    let mut started = std::collections::BTreeMap::new();
    events
        .events_until(|f| {
            if f.event.as_deref() == Some("run") && f.json()["phase"] == "started" {
                let run = f.json();
                started.insert(
                    run["app"].as_str().unwrap().to_owned(),
                    run["telo"].as_str().unwrap_or_default().to_owned(),
                );
            }
            started.len() == 2
        })
        .await;
    assert_eq!(started["old"], "0.96.0");
    assert_eq!(started["new"], "0.100.0");
    // A new app set is checked like a new session.
    let response = runner
        .client
        .put(runner.url(&format!("/v1/sessions/{id}/apps")))
        .json(
            &json!({"apps": [{"name": "web", "entryRelativePath": "telo.yaml", "telo": "0.98.0"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"], "telo_version_unavailable");
    assert_eq!(answer["version"], "0.98.0");
    runner.stop().await;
}
