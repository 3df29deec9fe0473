//! Request bodies for the session routes.

use serde_json::{Value, json};

/// A one-file bundle whose entry scripts fake-telo with `fake_telo` (the value
/// of the `fakeTelo:` block, as JSON; YAML is a superset of JSON).
pub fn fake_telo_bundle(fake_telo: Value) -> Value {
    let manifest = format!(
        "kind: Telo.Application\nmetadata: {{ name: test }}\nfakeTelo: {}\n",
        fake_telo
    );
    json!({
        "entryRelativePath": "telo.yaml",
        "files": [{ "relativePath": "telo.yaml", "contents": manifest }],
    })
}

/// A `POST /v1/sessions` body running `fake_telo`.
pub fn start_body(fake_telo: Value) -> Value {
    json!({
        "bundle": fake_telo_bundle(fake_telo),
        "env": {},
        "ports": [],
        "config": { "image": "telorun/node:0-slim", "pullPolicy": "missing" },
        "inspect": false,
    })
}
