//! The sockets a script opens: `listen` ports and the `--inspect` debug stream.

mod support;

use std::net::TcpStream;

use serde_json::Value;
use support::{http_get, launch, next_frame, open_events};

#[test]
fn a_listen_port_answers_any_request_with_ok_and_its_port() {
    let mut fake = launch("fakeTelo: { listen: [0, 0] }\n").spawn();
    let first = fake.line_after("listening on ");
    let second = fake.line_after("listening on ");
    assert_ne!(first, second);
    for (port, path) in [(&first, "/"), (&second, "/anything?at=all")] {
        let (status, body) = http_get(&format!("127.0.0.1:{port}"), path);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(body, format!("ok {port}"));
    }
}

#[test]
fn listeners_bind_the_host_named_by_host_only() {
    let mut fake = launch("fakeTelo: { listen: [0] }\n")
        .env("HOST", Some("127.0.0.2"))
        .spawn();
    let port = fake.line_after("listening on ");
    let (_, body) = http_get(&format!("127.0.0.2:{port}"), "/");
    assert_eq!(body, format!("ok {port}"));
    assert!(
        TcpStream::connect(format!("127.0.0.1:{port}")).is_err(),
        "bound wider than HOST"
    );
}

#[test]
fn a_port_that_cannot_be_bound_fails_the_run() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut fake = launch(&format!("fakeTelo: {{ listen: [{port}] }}\n")).spawn();
    let (status, _) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(1));
    let stderr = fake.stderr_text();
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
}

fn assert_rfc3339_utc_millis(timestamp: &Value) {
    let text = timestamp.as_str().expect("timestamp is a string");
    let parsed = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339);
    assert!(parsed.is_ok(), "{text}");
    assert_eq!(text.len(), "2026-01-02T03:04:05.678Z".len(), "{text}");
    assert!(text.ends_with('Z'), "{text}");
}

#[test]
fn debug_events_stream_a_log_frame_then_each_event_to_every_subscriber() {
    let manifest = "fakeTelo:\n  debugEvents: [Kernel.Starting, Kernel.Started]\n";
    let mut fake = launch(manifest)
        .args(&["run", "--inspect", "127.0.0.1:0", "--no-open", "app.yaml"])
        .spawn();
    let address = fake.line_after("inspect listening on ");
    for _subscriber in 0..2 {
        let (head, mut reader) = open_events(&address);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/event-stream"),
            "{head}"
        );
        let log = next_frame(&mut reader);
        assert_eq!(log["kind"], "log");
        assert_eq!(log["stream"], "stdout");
        assert_eq!(log["line"], "fake-telo booting");
        assert_rfc3339_utc_millis(&log["timestamp"]);
        for expected in ["Kernel.Starting", "Kernel.Started"] {
            let event = next_frame(&mut reader);
            assert_eq!(event["kind"], "event");
            assert_eq!(event["event"], expected);
            assert_eq!(event["payload"], serde_json::json!({}));
            assert_rfc3339_utc_millis(&event["timestamp"]);
        }
    }
}

#[test]
fn without_debug_events_the_stream_carries_the_real_kernels_start_frames() {
    let mut fake = launch("fakeTelo:\n  listen: [0]\n")
        .args(&["run", "--inspect", "127.0.0.1:0", "--no-open", "app.yaml"])
        .spawn();
    let address = fake.line_after("inspect listening on ");
    let (_, mut reader) = open_events(&address);
    assert_eq!(next_frame(&mut reader)["kind"], "log");
    let blocked = next_frame(&mut reader);
    assert_eq!(blocked["event"], "Kernel.Blocked");
    assert_eq!(
        blocked["payload"],
        serde_json::json!({ "reason": "inspect", "count": 1 })
    );
    assert_eq!(next_frame(&mut reader)["event"], "Kernel.Starting");
    assert_eq!(next_frame(&mut reader)["event"], "Kernel.Started");
}

#[test]
fn a_scripted_event_carries_its_payload() {
    let manifest = "fakeTelo:\n  debugEvents:\n    - Kernel.Started\n    - { event: Kernel.Stopped, payload: { exitCode: 3 } }\n";
    let mut fake = launch(manifest)
        .args(&["run", "--inspect", "127.0.0.1:0", "app.yaml"])
        .spawn();
    let address = fake.line_after("inspect listening on ");
    let (_, mut reader) = open_events(&address);
    assert_eq!(next_frame(&mut reader)["kind"], "log");
    assert_eq!(next_frame(&mut reader)["event"], "Kernel.Started");
    let stopped = next_frame(&mut reader);
    assert_eq!(stopped["event"], "Kernel.Stopped");
    assert_eq!(stopped["payload"], serde_json::json!({ "exitCode": 3 }));
}

#[test]
fn the_inspect_server_answers_other_paths_with_404() {
    let mut fake = launch("fakeTelo: { debugEvents: [A] }\n")
        .args(&["run", "app.yaml", "--inspect=127.0.0.1:0"])
        .spawn();
    let address = fake.line_after("inspect listening on ");
    let (status, _) = http_get(&address, "/json/version");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

#[test]
fn a_wildcard_inspect_address_binds_the_pod_host() {
    let mut fake = launch("fakeTelo: { debugEvents: [A] }\n")
        .args(&["run", "--inspect", "0.0.0.0:0", "app.yaml"])
        .env("HOST", Some("127.0.0.2"))
        .spawn();
    let address = fake.line_after("inspect listening on ");
    assert!(address.starts_with("127.0.0.2:"), "{address}");
    let (_, mut reader) = open_events(&address);
    assert_eq!(next_frame(&mut reader)["kind"], "log");
}
