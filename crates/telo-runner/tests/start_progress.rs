//! What a start waits for, told as it happens: the kernel's controller
//! resolution lines (an npm install, a source build) become `progress`
//! events, on both backends, and they are the kernel at work rather than the
//! application, so `running` waits for the application's own first output.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Backend, Runner};
use rstest::rstest;
use serde_json::{Value, json};

/// A kernel whose cache is cold: it installs an npm controller (long
/// enough that a client would wonder) and builds a JavaScript one, then
/// prints its application's line and exits.
fn cold_start() -> Value {
    json!({
        "controllers": [
            {
                "purl": "npm:@telorun/http-server@0.28.0#http-server-api",
                "work": "npmInstall",
                "coldMs": 400,
            },
            { "purl": "telo:local/js#WritelineController", "coldMs": 30 },
        ],
        "stdout": ["Hello from Telo!"],
    })
}

#[rstest]
#[case::local(Backend::Local)]
#[case::kubernetes(Backend::Kubernetes)]
#[tokio::test]
async fn a_cold_kernels_resolutions_are_progress_and_running_follows_them(
    #[case] backend: Backend,
) {
    let runner = Runner::start_on(backend, &[]).await;
    let id = runner.create(cold_start()).await;
    let mut events = runner.events(&id, &[]).await;
    let frames = events.events_until_end().await;
    let named: Vec<(String, Value)> = frames
        .iter()
        .filter_map(|f| Some((f.event.clone()?, f.json())))
        .collect();

    let resolutions: Vec<(&str, Option<bool>)> = named
        .iter()
        .filter(|(event, data)| {
            event == "progress" && data["message"].as_str().unwrap().contains("esolv")
        })
        .map(|(_, data)| {
            assert_eq!(data["phase"], "boot", "{data}");
            assert!(data.get("app").is_none(), "a run session's names no app");
            (data["message"].as_str().unwrap(), data["done"].as_bool())
        })
        .collect();
    let shapes: Vec<(String, Option<bool>)> = resolutions
        .iter()
        .map(|(message, done)| {
            // The time each took varies; what it says does not.
            let shape = match message.split_once(", ") {
                Some((head, _)) => format!("{head}, …)"),
                None => (*message).to_owned(),
            };
            (shape, *done)
        })
        .collect();
    assert_eq!(
        shapes,
        [
            ("Resolving http-server (npm)…".to_owned(), None),
            ("Resolved http-server (npm, …)".to_owned(), Some(true)),
            ("Resolving WritelineController (build)…".to_owned(), None),
            (
                "Resolved WritelineController (build, …)".to_owned(),
                Some(true)
            ),
        ],
        "{named:?}"
    );

    // `running` is the application up: after the last resolution, never
    // while the kernel is still installing.
    let position = |wanted: &dyn Fn(&(String, Value)) -> bool| {
        named.iter().position(wanted).unwrap_or_else(|| {
            panic!("{named:?}");
        })
    };
    let running =
        position(&|(event, data)| event == "status" && data["status"]["kind"] == "running");
    let last_resolution = named
        .iter()
        .rposition(|(event, data)| {
            event == "progress" && data["message"].as_str().unwrap().starts_with("Resolved")
        })
        .unwrap();
    assert!(running > last_resolution, "{named:?}");
    assert_eq!(
        named.last().unwrap().1["status"],
        json!({"kind": "exited", "code": 0}),
        "{named:?}"
    );

    // The terminal shows what the kernel printed, untouched.
    let output = runner.full_output(&id).await;
    assert!(
        output.contains("⬇ npm:@telorun/http-server@0.28.0#http-server-api npm-install…")
            && output.contains("Hello from Telo!"),
        "{output:?}"
    );
}
