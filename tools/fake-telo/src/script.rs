//! The `fakeTelo:` block: how a test scripts the workload it wants the runner
//! to run. Parsing is pure; reading the file lives in `run`.

use serde::Deserialize;
use serde_yaml_ng::Value;

/// Every field of the `fakeTelo:` block. Field names are an interface other
/// tooling writes against: keep them.
///
/// Unknown fields are rejected: a typo such as `exitAfterMS` that silently
/// turned a timed script into a run-until-killed one would surface as a hung
/// test far away from its cause.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub stdout: Vec<String>,
    /// Raw byte strings, hex-encoded (whitespace between digit pairs is
    /// allowed), each written to stdout verbatim and flushed on its own.
    #[serde(default)]
    pub stdout_hex: Vec<String>,
    #[serde(default)]
    pub stderr: Vec<String>,
    #[serde(default)]
    pub print_env: Vec<String>,
    /// `host:port` addresses the workload tries to connect to at start,
    /// printing `dial <address>: open` or `dial <address>: closed (<why>)`
    /// for each: what a workload can reach from where it runs.
    #[serde(default)]
    pub dial: Vec<String>,
    #[serde(default)]
    pub listen: Vec<u16>,
    #[serde(default)]
    pub echo: bool,
    /// With `echo`: each echoed line is also written to stderr, as
    /// `stderr: <line>`, after its stdout copy.
    #[serde(default)]
    pub echo_stderr: bool,
    pub exit_after_ms: Option<u64>,
    #[serde(default)]
    pub exit_code: u8,
    /// Served on `--inspect`; empty means the frames the real kernel sends
    /// for a run that started (see [`default_debug_events`]).
    #[serde(default)]
    pub debug_events: Vec<DebugEvent>,
    #[serde(default)]
    pub spew_bytes: u64,
    #[serde(default)]
    pub print_size: bool,
    pub line_every_ms: Option<u64>,
    pub lines: Option<u64>,
    /// Dots after each periodic line, to make a stream of a given rate.
    #[serde(default)]
    pub line_padding: usize,
    #[serde(default)]
    pub wait_for_input: bool,
    /// On SIGTERM or SIGINT: print this line and exit 0, as a real kernel's
    /// teardown does (`Stopped listening`).
    pub stop_line: Option<String>,
    /// SIGTERM is ignored: only a kill ends the process.
    #[serde(default)]
    pub ignore_sigterm: bool,
    /// The controllers the application loads, through the kernel cache.
    #[serde(default)]
    pub controllers: Vec<crate::controllers::Controller>,
    /// How long loading the application takes on every start, warm or
    /// cold, after its controllers: the real kernel's Node.js start and
    /// module load (http-hello answers about a second after it starts).
    pub start_ms: Option<u64>,
}

/// One `debugEvents` entry: an event name, or `{event, payload}` for a frame
/// whose payload matters (`Kernel.Stopped {exitCode}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum DebugEvent {
    Name(String),
    WithPayload {
        event: String,
        #[serde(default = "empty_payload")]
        payload: serde_json::Value,
    },
}

fn empty_payload() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

impl DebugEvent {
    pub fn name(&self) -> &str {
        match self {
            DebugEvent::Name(name) | DebugEvent::WithPayload { event: name, .. } => name,
        }
    }

    pub fn payload(&self) -> serde_json::Value {
        match self {
            DebugEvent::Name(_) => empty_payload(),
            DebugEvent::WithPayload { payload, .. } => payload.clone(),
        }
    }
}

impl From<&str> for DebugEvent {
    fn from(name: &str) -> Self {
        DebugEvent::Name(name.to_owned())
    }
}

impl From<String> for DebugEvent {
    fn from(name: String) -> Self {
        DebugEvent::Name(name)
    }
}

/// What the real kernel (0.81) sends under `--inspect` for a run that
/// started: it blocks in inspect mode, then starts. The runner announces
/// `running` on `Kernel.Started`, so a stand-in that sent nothing would make
/// every inspected session look stuck in `starting`.
pub fn default_debug_events() -> Vec<DebugEvent> {
    vec![
        DebugEvent::WithPayload {
            event: "Kernel.Blocked".to_owned(),
            payload: serde_json::json!({ "reason": "inspect", "count": 1 }),
        },
        DebugEvent::Name("Kernel.Starting".to_owned()),
        DebugEvent::Name("Kernel.Started".to_owned()),
    ]
}

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("entry is not valid YAML")]
    ParseYaml(#[source] serde_yaml_ng::Error),
    #[error("invalid fakeTelo block in document {document}")]
    DecodeFakeTelo {
        document: usize,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error(
        "invalid fakeTelo block in document {document}: `lines` and `linePadding` need `lineEveryMs`"
    )]
    LinesWithoutInterval { document: usize },
    #[error("invalid fakeTelo block in document {document}: `stdoutHex` entry {entry} is not hex")]
    BadHex { document: usize, entry: usize },
}

/// The bytes of a `stdoutHex` entry: pairs of hex digits, whitespace ignored.
pub fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// Finds the script in a (possibly multi-document) manifest: the first
/// document whose top level has a `fakeTelo` key. `None` means a real Telo
/// manifest with no script at all.
///
/// `fakeTelo:` with no value counts as an empty script rather than as absent,
/// because the author clearly meant to script this run.
pub fn find_script(manifest: &str) -> Result<Option<Script>, ScriptError> {
    for (index, document) in serde_yaml_ng::Deserializer::from_str(manifest).enumerate() {
        let document_number = index + 1;
        let value = Value::deserialize(document).map_err(ScriptError::ParseYaml)?;
        let Some(block) = value.as_mapping().and_then(|map| map.get("fakeTelo")) else {
            continue;
        };
        let script = if block.is_null() {
            Script::default()
        } else {
            Script::deserialize(block.clone()).map_err(|source| ScriptError::DecodeFakeTelo {
                document: document_number,
                source,
            })?
        };
        if (script.lines.is_some() || script.line_padding > 0) && script.line_every_ms.is_none() {
            return Err(ScriptError::LinesWithoutInterval {
                document: document_number,
            });
        }
        if let Some(entry) = script
            .stdout_hex
            .iter()
            .position(|hex| decode_hex(hex).is_none())
        {
            return Err(ScriptError::BadHex {
                document: document_number,
                entry: entry + 1,
            });
        }
        return Ok(Some(script));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_hex_decodes_pairs_and_refuses_anything_else() {
        assert_eq!(
            decode_hex("ff 1b5b\n00"),
            Some(vec![0xff, 0x1b, 0x5b, 0x00])
        );
        assert_eq!(decode_hex(""), Some(vec![]));
        assert_eq!(decode_hex("f"), None);
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(decode_hex("+1"), None);
        let error = find_script("fakeTelo:\n  stdoutHex: [\"41\", \"4g\"]\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid fakeTelo block in document 1: `stdoutHex` entry 2 is not hex"
        );
    }

    #[test]
    fn a_manifest_without_the_block_has_no_script() {
        let manifest = "kind: Telo.Application\nmetadata: { name: demo }\n";
        assert_eq!(find_script(manifest).unwrap(), None);
        assert_eq!(find_script("").unwrap(), None);
    }

    #[test]
    fn every_documented_field_is_read() {
        let manifest = r#"
kind: Telo.Application
metadata: { name: demo }
fakeTelo:
  stdout: ["hello"]
  stdoutHex: ["ff 00"]
  stderr: ["oops"]
  printEnv: ["FOO"]
  dial: ["127.0.0.1:1"]
  listen: [8080, 0]
  echo: true
  echoStderr: true
  exitAfterMs: 200
  exitCode: 3
  debugEvents: ["Kernel.Starting", "Kernel.Started"]
  spewBytes: 1000
  printSize: true
  lineEveryMs: 10
  lines: 5
  linePadding: 4
  waitForInput: true
  stopLine: bye
  ignoreSigterm: true
  controllers:
    - { purl: "telo:local/js#Say" }
    - { purl: "npm:x@1#y", work: npmInstall, coldMs: 900 }
  startMs: 1000
"#;
        let expected = Script {
            stdout: vec!["hello".to_owned()],
            stdout_hex: vec!["ff 00".to_owned()],
            stderr: vec!["oops".to_owned()],
            print_env: vec!["FOO".to_owned()],
            dial: vec!["127.0.0.1:1".to_owned()],
            listen: vec![8080, 0],
            echo: true,
            echo_stderr: true,
            exit_after_ms: Some(200),
            exit_code: 3,
            debug_events: vec!["Kernel.Starting".into(), "Kernel.Started".into()],
            spew_bytes: 1000,
            print_size: true,
            line_every_ms: Some(10),
            lines: Some(5),
            line_padding: 4,
            wait_for_input: true,
            stop_line: Some("bye".to_owned()),
            ignore_sigterm: true,
            controllers: vec![
                crate::controllers::Controller {
                    purl: "telo:local/js#Say".to_owned(),
                    work: crate::controllers::Work::SourceBuild,
                    cold_ms: 50,
                },
                crate::controllers::Controller {
                    purl: "npm:x@1#y".to_owned(),
                    work: crate::controllers::Work::NpmInstall,
                    cold_ms: 900,
                },
            ],
            start_ms: Some(1000),
        };
        assert_eq!(find_script(manifest).unwrap(), Some(expected));
    }

    #[test]
    fn a_debug_event_may_carry_a_payload() {
        let script =
            find_script("fakeTelo:\n  debugEvents:\n    - Kernel.Started\n    - { event: Kernel.Stopped, payload: { exitCode: 3 } }\n    - { event: Kernel.Starting }\n")
                .unwrap()
                .unwrap();
        let frames: Vec<(String, serde_json::Value)> = script
            .debug_events
            .iter()
            .map(|e| (e.name().to_owned(), e.payload()))
            .collect();
        assert_eq!(
            frames,
            [
                ("Kernel.Started".to_owned(), serde_json::json!({})),
                (
                    "Kernel.Stopped".to_owned(),
                    serde_json::json!({ "exitCode": 3 })
                ),
                ("Kernel.Starting".to_owned(), serde_json::json!({})),
            ]
        );
    }

    #[test]
    fn the_first_document_with_the_block_wins() {
        let manifest = "kind: Telo.Application\n---\n- a list\n---\nfakeTelo: { exitCode: 4 }\n---\nfakeTelo: { exitCode: 5 }\n";
        let script = find_script(manifest).unwrap().unwrap();
        assert_eq!(script.exit_code, 4);
    }

    #[test]
    fn an_empty_block_is_an_empty_script() {
        assert_eq!(find_script("fakeTelo:\n").unwrap(), Some(Script::default()));
    }

    #[test]
    fn a_typo_in_a_field_name_is_rejected() {
        let error = find_script("fakeTelo: { exitAfterMS: 5 }").unwrap_err();
        assert!(matches!(
            error,
            ScriptError::DecodeFakeTelo { document: 1, .. }
        ));
        assert!(
            std::error::Error::source(&error)
                .unwrap()
                .to_string()
                .contains("exitAfterMS")
        );
    }

    #[test]
    fn values_of_the_wrong_type_are_rejected() {
        for manifest in [
            "fakeTelo: { exitCode: 300 }",
            "fakeTelo: { listen: [70000] }",
            "fakeTelo: { echo: maybe }",
            "fakeTelo: [1, 2]",
        ] {
            assert!(
                matches!(
                    find_script(manifest),
                    Err(ScriptError::DecodeFakeTelo { .. })
                ),
                "{manifest}"
            );
        }
    }

    #[test]
    fn lines_without_an_interval_are_rejected() {
        assert!(matches!(
            find_script("fakeTelo: { lines: 3 }"),
            Err(ScriptError::LinesWithoutInterval { document: 1 })
        ));
    }

    #[test]
    fn broken_yaml_is_an_error() {
        assert!(matches!(
            find_script("fakeTelo: [unclosed"),
            Err(ScriptError::ParseYaml(_))
        ));
    }
}
