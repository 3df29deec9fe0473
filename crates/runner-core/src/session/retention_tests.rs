//! What a suspended watch session keeps in memory: everything a client can
//! still read, and no room beyond it.

use serde_json::json;

use super::*;
use runner_api::types::{PortProtocol, RunPhase, RunnerEndpoint};

/// The heap a session's record holds: ring slots (resident or spare), what
/// the entries hold, the per-app lists and the input held for a start.
fn retained_bytes(session: &Session) -> usize {
    let state = lock(&session.state);
    let events: usize = state.events.slot_bytes()
        + state
            .events
            .replay(0)
            .entries
            .iter()
            .map(|(_, frame)| frame.data.len())
            .sum::<usize>();
    let channels: usize = state
        .channels
        .iter()
        .map(|c| {
            c.output.slot_bytes()
                + c.output.total_bytes()
                + c.name.capacity()
                + c.ports.capacity() * std::mem::size_of::<PortMapping>()
        })
        .sum();
    events
        + state.channels.capacity() * std::mem::size_of::<AppChannel>()
        + channels
        + state.early_stdin.capacity() * std::mem::size_of::<Bytes>()
}

fn watch_session() -> Arc<Session> {
    Arc::new(Session::with_apps(
        "s1".into(),
        iso_now(),
        1024 * 1024,
        0,
        None,
        Arc::new(Metrics::new()),
        SessionMode::Watch,
        &[SessionApp::default_app(Vec::new())],
    ))
}

/// A watch session's life as the local backend reports it: start progress,
/// `running`, every generation's debug frames and run events, endpoints,
/// a few output lines.
fn live_a_while(session: &Arc<Session>, generations: u64, lines: usize) {
    let sink = SessionSink::new(session.clone());
    sink.status(RunStatus::Starting);
    for message in ["preparing the workspace", "seeding 1 file", "starting app"] {
        sink.progress(RunPhase::Provision, message, None);
    }
    sink.status(RunStatus::Running {
        endpoints: None,
        inspect_url: None,
        agent: None,
    });
    for generation in 0..generations {
        for event in ["Kernel.Starting", "Kernel.Started"] {
            sink.app_debug(
                "app",
                json!({"kind": "event", "event": event, "payload": {"telo": "0.81.0"}}),
            );
        }
        sink.app_debug(
            "app",
            json!({"kind": "event", "event": "Kernel.PortsResolved", "payload": {"ports": [{"name": "http", "port": 8080, "protocol": "tcp"}]}}),
        );
        if generation == 0 {
            session.emit(RunEvent::Endpoints {
                app: "app".into(),
                added: Some(vec![RunnerEndpoint::unrouted(PortMapping {
                    port: 8080,
                    protocol: PortProtocol::Tcp,
                })]),
                removed: None,
                rejected: None,
            });
        }
        for line in 0..lines {
            sink.app_output(
                "app",
                StreamTag::Tty,
                Bytes::from(format!("generation {generation} line {line}\r\n")),
            );
        }
        sink.app_debug(
            "app",
            json!({"kind": "event", "event": "Kernel.Stopped", "payload": {"exitCode": 0}}),
        );
    }
}

fn suspend(session: &Session) {
    session.emit(RunEvent::Status {
        status: RunStatus::Suspended,
    });
    session.release_spare_capacity();
}

#[test]
fn a_suspended_session_keeps_no_room_beyond_what_it_recorded() {
    let session = watch_session();
    // Busy enough for the rings to have grown past what they hold at the end.
    live_a_while(&session, 40, 20);
    let events_before = session.replay_events(0);
    let output_before = session.replay_app_output("app", 0);
    suspend(&session);

    let state = lock(&session.state);
    assert_eq!(state.events.capacity(), state.events.len());
    for channel in &state.channels {
        assert_eq!(channel.output.capacity(), channel.output.len());
        assert_eq!(channel.ports.capacity(), channel.ports.len());
    }
    drop(state);
    // Nothing a client can read went: the same entries under the same ids,
    // the suspension after them.
    let events_after = session.replay_events(0);
    assert_eq!(events_after.has_gap, events_before.has_gap);
    assert_eq!(events_after.entries.len(), events_before.entries.len() + 1);
    for ((id_a, a), (id_b, b)) in events_before.entries.iter().zip(&events_after.entries) {
        assert_eq!((id_a, &a.data), (id_b, &b.data));
    }
    assert_eq!(session.replay_app_output("app", 0), output_before);
}

#[test]
fn a_typical_suspended_watch_session_keeps_under_16_kib_of_records() {
    // One generation and its start line, as a session that was edited
    // never and then left alone lives.
    let session = watch_session();
    live_a_while(&session, 1, 1);
    suspend(&session);
    let retained = retained_bytes(&session);
    assert!(
        retained < 4 * 1024,
        "a suspended session's records take {retained} bytes"
    );
}
