//! How the session's lifecycle reads on the terminal: exit codes, endpoints,
//! progress and reachability lines, the session table. Pure text.

use serde_json::Value;

use super::api::SessionSummary;

/// The client's exit code for a terminal status: the workload's own code, 1
/// for a failure, 130 (as a shell reports Ctrl-C) for a stop.
pub fn exit_code_of(status: &Value) -> u8 {
    match status.get("kind").and_then(Value::as_str) {
        Some("exited") => status
            .get("code")
            .and_then(Value::as_i64)
            .map(|code| u8::try_from(code.clamp(0, 255)).unwrap_or(1))
            .unwrap_or(1),
        Some("stopped") => 130,
        _ => 1,
    }
}

/// `url` when a proxy fronts the workload, else `host:port` with an unknown
/// host (`""`) filled from the runner's (contract §10.3).
pub fn endpoint_text(endpoint: &Value, runner_host: &str) -> String {
    if let Some(url) = endpoint.get("url").and_then(Value::as_str) {
        return url.to_owned();
    }
    let host = endpoint
        .get("host")
        .and_then(Value::as_str)
        .filter(|host| !host.is_empty())
        .unwrap_or(runner_host);
    let port = endpoint.get("port").and_then(Value::as_u64).unwrap_or(0);
    let protocol = endpoint
        .get("protocol")
        .and_then(Value::as_str)
        .unwrap_or("tcp");
    if protocol == "udp" {
        format!("{host}:{port}/udp")
    } else {
        format!("{host}:{port}")
    }
}

/// Lines for a `running` status: one per endpoint, and the inspector.
pub fn running_lines(status: &Value, runner_host: &str) -> Vec<String> {
    let mut lines: Vec<String> = status
        .get("endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|endpoint| {
            format!(
                "telo-runner: endpoint {}",
                endpoint_text(endpoint, runner_host)
            )
        })
        .collect();
    if let Some(url) = status.get("inspectUrl").and_then(Value::as_str) {
        lines.push(format!("telo-runner: inspect at {url}"));
    }
    lines
}

/// The line for a non-status RunEvent worth showing, if any.
pub fn event_line(event: &Value) -> Option<String> {
    match event.get("type").and_then(Value::as_str)? {
        "progress" => {
            let phase = event
                .get("phase")
                .and_then(Value::as_str)
                .unwrap_or("start");
            let message = event.get("message").and_then(Value::as_str).unwrap_or("");
            let done = if event.get("done").and_then(Value::as_bool) == Some(true) {
                " (done)"
            } else {
                ""
            };
            Some(format!("telo-runner: [{phase}] {message}{done}"))
        }
        "reachability" => {
            let port = event.get("port").and_then(Value::as_u64)?;
            let state = event.get("state").and_then(Value::as_str)?;
            Some(format!("telo-runner: port {port} {state}"))
        }
        _ => None,
    }
}

pub fn status_text(status: &Value) -> String {
    match status.get("kind").and_then(Value::as_str) {
        Some("exited") => format!(
            "exited ({})",
            status.get("code").and_then(Value::as_i64).unwrap_or(-1)
        ),
        Some("failed") => format!(
            "failed: {}",
            status.get("message").and_then(Value::as_str).unwrap_or("")
        ),
        Some(kind) => kind.to_owned(),
        None => "unknown".to_owned(),
    }
}

pub fn session_table(sessions: &[SessionSummary]) -> String {
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
        assert_eq!(exit_code_of(&json!({"kind": "exited", "code": 3})), 3);
        assert_eq!(exit_code_of(&json!({"kind": "exited", "code": 300})), 255);
        assert_eq!(exit_code_of(&json!({"kind": "failed", "message": "x"})), 1);
        assert_eq!(exit_code_of(&json!({"kind": "stopped"})), 130);
    }

    #[test]
    fn endpoints_prefer_the_url_and_fill_an_unknown_host() {
        assert_eq!(
            endpoint_text(
                &json!({"host": "", "port": 8080, "protocol": "tcp", "url": "https://a.example"}),
                "r"
            ),
            "https://a.example"
        );
        assert_eq!(
            endpoint_text(
                &json!({"host": "", "port": 8080, "protocol": "tcp"}),
                "runner.local"
            ),
            "runner.local:8080"
        );
        assert_eq!(
            endpoint_text(
                &json!({"host": "10.0.0.1", "port": 53, "protocol": "udp"}),
                "r"
            ),
            "10.0.0.1:53/udp"
        );
    }

    #[test]
    fn the_session_table_aligns_its_columns() {
        let sessions = vec![SessionSummary {
            session_id: "abc".into(),
            status: json!({"kind": "exited", "code": 0}),
            created_at: "2026-01-01T00:00:00Z".into(),
            exited_at: None,
        }];
        assert_eq!(
            session_table(&sessions),
            "SESSION  STATUS      CREATED               EXITED\nabc      exited (0)  2026-01-01T00:00:00Z  -\n"
        );
    }
}
