//! Which workload token the edge asks for on which port.

use super::*;

fn session() -> Session {
    Session::new(
        "s1".into(),
        iso_now(),
        64 * 1024,
        0,
        None,
        Arc::new(Metrics::new()),
    )
}

#[test]
fn a_session_without_a_token_is_open_on_every_port() {
    let session = session();
    assert_eq!(session.edge_access(None, Some(8080)), EdgeAccess::Open);
    assert_eq!(session.edge_access(Some("x"), None), EdgeAccess::Open);
}

#[test]
fn an_app_sessions_token_guards_every_port_and_only_it_passes() {
    let session = session();
    session.set_endpoint_token("app-token".into());
    for port in [Some(8080), Some(9090), None] {
        assert_eq!(session.edge_access(None, port), EdgeAccess::Denied);
        assert_eq!(session.edge_access(Some("other"), port), EdgeAccess::Denied);
        assert_eq!(
            session.edge_access(Some("app-token"), port),
            EdgeAccess::Granted
        );
    }
}

fn session_with_app_port(port: u16) -> Session {
    Session::with_apps(
        "s1".into(),
        iso_now(),
        64 * 1024,
        0,
        None,
        Arc::new(Metrics::new()),
        SessionMode::Watch,
        &[SessionApp::default_app(vec![PortMapping {
            port,
            protocol: runner_api::types::PortProtocol::Tcp,
        }])],
    )
}

#[test]
fn a_port_no_app_publishes_asks_for_every_token() {
    let session = session_with_app_port(8080);
    session.guard_with_token_digest(Some(7070), token_digest("agent-token"));
    assert_eq!(session.edge_access(None, Some(8080)), EdgeAccess::Open);
    for undeclared in [Some(9999), Some(8081)] {
        assert_eq!(session.edge_access(None, undeclared), EdgeAccess::Denied);
        assert_eq!(
            session.edge_access(Some("agent-token"), undeclared),
            EdgeAccess::Granted
        );
    }
}

#[test]
fn an_agents_token_guards_its_port_and_leaves_the_apps_public() {
    let session = session_with_app_port(8080);
    session.guard_with_token_digest(Some(7070), token_digest("agent-token"));
    assert_eq!(session.edge_access(None, Some(8080)), EdgeAccess::Open);
    assert_eq!(session.edge_access(None, Some(7070)), EdgeAccess::Denied);
    assert_eq!(
        session.edge_access(Some("agent-token"), Some(7070)),
        EdgeAccess::Granted
    );
    // A port the edge did not name: the agent's token is asked for.
    assert_eq!(session.edge_access(None, None), EdgeAccess::Denied);
}

#[test]
fn a_kept_digest_checks_a_token_the_runner_never_saw() {
    let session = session();
    session.guard_with_token_digest(None, token_digest("minted-before-a-restart"));
    assert_eq!(
        session.edge_access(Some("minted-before-a-restart"), Some(8080)),
        EdgeAccess::Granted
    );
    assert_eq!(
        session.edge_access(Some("guess"), Some(8080)),
        EdgeAccess::Denied
    );
}
