//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386), an
//! approximation of strategic merge patch, and server-side apply treated as
//! a strategic merge of the applied configuration.

use serde_json::{Map, Value};

use crate::errors::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let base = content_type.split(';').next().unwrap_or("").trim();
        match base {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// Parses a patch body into a JSON value (apply patches may be YAML).
pub fn parse_body(kind: PatchKind, body: &[u8]) -> Result<Value, ApiError> {
    let parsed: Result<Value, String> = match kind {
        PatchKind::Apply => serde_yaml_ng::from_slice(body).map_err(|e| e.to_string()),
        _ => serde_json::from_slice(body).map_err(|e| e.to_string()),
    };
    parsed.map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// Applies `patch` to `target`, returning the patched document.
pub fn apply(kind: PatchKind, target: &Value, patch: &Value) -> Result<Value, ApiError> {
    let mut doc = target.clone();
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut doc, &ops).map_err(|e| {
                let mut err = ApiError::invalid("", "", "", &[]);
                err.message =
                    format!("the server rejected our request due to an error in our request: {e}");
                err.details = None;
                err
            })?;
        }
        PatchKind::Merge => json_patch::merge(&mut doc, patch),
        PatchKind::Strategic | PatchKind::Apply => strategic_merge(&mut doc, patch),
    }
    Ok(doc)
}

/// The keys lists of objects are merged by in strategic merge patch.
const MERGE_KEYS: &[&str] = &["name", "containerPort", "mountPath", "type", "key", "ip"];

fn merge_key(items: &[Value]) -> Option<&'static str> {
    MERGE_KEYS.iter().copied().find(|k| {
        !items.is_empty()
            && items
                .iter()
                .all(|i| i.get(*k).is_some_and(|v| !v.is_null()))
    })
}

/// Strategic merge, approximated: objects merge recursively, `null`
/// deletes, lists of objects that share a merge key (`name`, …) merge by
/// that key, other lists are replaced. Directive keys (`$patch`,
/// `$setElementOrder/…`, `$retainKeys`) are honoured where simple or dropped.
pub fn strategic_merge(doc: &mut Value, patch: &Value) {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            if p.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut replaced = p.clone();
                replaced.remove("$patch");
                *d = replaced;
                return;
            }
            for (k, v) in p {
                if k.starts_with('$') {
                    continue;
                }
                match v {
                    Value::Null => {
                        d.remove(k);
                    }
                    Value::Object(_) => {
                        let entry = d
                            .entry(k.clone())
                            .or_insert_with(|| Value::Object(Map::new()));
                        if !entry.is_object() {
                            *entry = Value::Object(Map::new());
                        }
                        strategic_merge(entry, v);
                    }
                    Value::Array(items) => match (d.get_mut(k), merge_key(items)) {
                        (Some(Value::Array(existing)), Some(key)) => {
                            merge_list(existing, items, key);
                        }
                        _ => {
                            d.insert(k.clone(), strip_directives(v));
                        }
                    },
                    _ => {
                        d.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (doc, patch) => *doc = strip_directives(patch),
    }
}

fn merge_list(existing: &mut Vec<Value>, items: &[Value], key: &str) {
    for item in items {
        let id = item.get(key).cloned();
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        let pos = existing.iter().position(|e| e.get(key).cloned() == id);
        match (pos, delete) {
            (Some(i), true) => {
                existing.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut existing[i], item),
            (None, false) => existing.push(strip_directives(item)),
        }
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_replaces_and_deletes() {
        let doc = json!({"a": 1, "b": {"c": 2, "d": 3}});
        let out =
            apply(PatchKind::Merge, &doc, &json!({"a": null, "b": {"c": 5}})).expect("applies");
        assert_eq!(out, json!({"b": {"c": 5, "d": 3}}));
    }

    #[test]
    fn json_patch_test_failures_are_422() {
        let doc = json!({"a": 1});
        let err = apply(
            PatchKind::Json,
            &doc,
            &json!([{"op": "test", "path": "/a", "value": 2}]),
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn strategic_merge_merges_named_lists() {
        let mut doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        strategic_merge(
            &mut doc,
            &json!({"spec": {"containers": [{"name": "b", "image": "z"}]}}),
        );
        assert_eq!(doc["spec"]["containers"][1]["image"], "z");
        assert_eq!(doc["spec"]["containers"][0]["image"], "x");
    }

    #[test]
    fn unknown_patch_types_are_unsupported_media() {
        assert_eq!(
            PatchKind::from_content_type("text/plain").unwrap_err().code,
            415
        );
    }
}
