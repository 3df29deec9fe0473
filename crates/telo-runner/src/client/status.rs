//! How the session's lifecycle reads on the terminal: exit codes, endpoints,
//! progress and reachability lines, the session table. Pure text.

use runner_api::types::{PortProtocol, RunEvent, RunStatus, RunnerEndpoint, SessionSnapshot};

/// The client's exit code for a terminal status: the workload's own code, 1
/// for a failure, 130 (as a shell reports Ctrl-C) for a stop.
pub fn exit_code_of(status: &RunStatus) -> u8 {
    match status {
        RunStatus::Exited { code } => u8::try_from((*code).clamp(0, 255)).unwrap_or(1),
        RunStatus::Stopped => 130,
        _ => 1,
    }
}

/// `url` when a proxy fronts the workload, else `host:port` with an unknown
/// host (`""`) filled from the runner's (docs/contract.md §3.2).
pub fn endpoint_text(endpoint: &RunnerEndpoint, runner_host: &str) -> String {
    if let Some(url) = &endpoint.url {
        // An address without a path reads as a link to its root page, the
        // way a browser shows it (`http://8845-<id>.localhost:8061/`).
        let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
        return if after_scheme.contains('/') {
            url.clone()
        } else {
            format!("{url}/")
        };
    }
    let host = if endpoint.host.is_empty() {
        runner_host
    } else {
        &endpoint.host
    };
    let port = endpoint.port;
    match endpoint.protocol {
        PortProtocol::Udp => format!("{host}:{port}/udp"),
        PortProtocol::Tcp => format!("{host}:{port}"),
    }
}

/// Lines for a `running` status: one per endpoint, and the inspector.
pub fn running_lines(status: &RunStatus, runner_host: &str) -> Vec<String> {
    let RunStatus::Running {
        endpoints,
        inspect_url,
        ..
    } = status
    else {
        return Vec::new();
    };
    let mut lines: Vec<String> = endpoints
        .iter()
        .flatten()
        .map(|endpoint| {
            format!(
                "telo-runner: endpoint {}",
                endpoint_text(endpoint, runner_host)
            )
        })
        .collect();
    if let Some(url) = inspect_url {
        lines.push(format!("telo-runner: inspect at {url}"));
    }
    lines
}

/// The line for a non-status RunEvent worth showing, if any.
pub fn event_line(event: &RunEvent) -> Option<String> {
    match event {
        RunEvent::Progress {
            phase,
            message,
            done,
            ..
        } => {
            let phase = phase.as_str();
            let done = if *done == Some(true) { " (done)" } else { "" };
            Some(format!("telo-runner: [{phase}] {message}{done}"))
        }
        RunEvent::Reachability { port, state, .. } => {
            let state = state.as_str();
            Some(format!("telo-runner: port {port} {state}"))
        }
        _ => None,
    }
}

pub fn status_text(status: &RunStatus) -> String {
    match status {
        RunStatus::Exited { code } => format!("exited ({code})"),
        RunStatus::Failed { message } => format!("failed: {message}"),
        other => other.kind().to_owned(),
    }
}

pub fn session_table(sessions: &[SessionSnapshot]) -> String {
    let rows: Vec<[String; 4]> = sessions
        .iter()
        .map(|s| {
            [
                s.session_id.clone(),
                status_text(&s.status),
                s.created_at.clone(),
                s.exited_at.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let header = ["SESSION", "STATUS", "CREATED", "EXITED"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exit_codes_follow_the_terminal_status() {
        let status = |value| serde_json::from_value::<RunStatus>(value).unwrap();
        assert_eq!(
            exit_code_of(&status(json!({"kind": "exited", "code": 3}))),
            3
        );
        assert_eq!(
            exit_code_of(&status(json!({"kind": "exited", "code": 300}))),
            255
        );
        assert_eq!(
            exit_code_of(&status(json!({"kind": "failed", "message": "x"}))),
            1
        );
        assert_eq!(exit_code_of(&status(json!({"kind": "stopped"}))), 130);
    }

    #[test]
    fn endpoints_prefer_the_url_and_fill_an_unknown_host() {
        let endpoint_text = |value, host| {
            endpoint_text(
                &serde_json::from_value::<RunnerEndpoint>(value).unwrap(),
                host,
            )
        };
        assert_eq!(
            endpoint_text(
                json!({"host": "", "port": 8080, "protocol": "tcp", "url": "https://a.example"}),
                "r"
            ),
            "https://a.example/"
        );
        assert_eq!(
            endpoint_text(
                json!({"host": "", "port": 8845, "protocol": "tcp",
                       "url": "http://8845-abc.localhost:8061/?telo_access=g"}),
                "r"
            ),
            "http://8845-abc.localhost:8061/?telo_access=g"
        );
        assert_eq!(
            endpoint_text(
                json!({"host": "", "port": 8080, "protocol": "tcp"}),
                "runner.local"
            ),
            "runner.local:8080"
        );
        assert_eq!(
            endpoint_text(
                json!({"host": "10.0.0.1", "port": 53, "protocol": "udp"}),
                "r"
            ),
            "10.0.0.1:53/udp"
        );
    }

    #[test]
    fn the_session_table_aligns_its_columns() {
        let sessions = vec![SessionSnapshot {
            session_id: "abc".into(),
            status: RunStatus::Exited { code: 0 },
            mode: None,
            agent: None,
            apps: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            exited_at: None,
            replica: None,
        }];
        assert_eq!(
            session_table(&sessions),
            "SESSION  STATUS      CREATED               EXITED\nabc      exited (0)  2026-01-01T00:00:00Z  -\n"
        );
    }
}
