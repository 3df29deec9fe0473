//! The `config.schema` of `/v1/capabilities`: the editable `SessionConfig`
//! surface a backend advertises.

use serde_json::{Value, json};

use runner_api::types::PullPolicy;

const DEFAULT_PULL_POLICY_DESCRIPTION: &str = "`missing` pulls on first use; `always` forces a pull every run; `never` fails if the image isn't present.";

#[derive(Debug, Clone)]
pub struct SchemaOptions {
    pub image_default: String,
    /// The image cannot be edited (ignored when `image_enum` offers choices).
    pub enforced: bool,
    /// Images the client may pick from.
    pub image_enum: Vec<String>,
    /// Offer the optional `registryUrl` field.
    pub registry_url: bool,
    pub pull_policy_default: PullPolicy,
    pub pull_policy_description: Option<String>,
}

pub fn session_config_schema(options: &SchemaOptions) -> Value {
    let mut image = json!({
        "type": "string",
        "minLength": 1,
        "default": options.image_default,
        "title": "Image",
        "description": "Container image the runner spawns for each run.",
    });
    if !options.image_enum.is_empty() {
        image["enum"] = json!(options.image_enum);
    } else if options.enforced {
        image["readOnly"] = json!(true);
    }
    let mut properties = json!({
        "image": image,
        "pullPolicy": {
            "type": "string",
            "enum": PullPolicy::ALL,
            "default": options.pull_policy_default.as_str(),
            "title": "Pull policy",
            "description": options
                .pull_policy_description
                .as_deref()
                .unwrap_or(DEFAULT_PULL_POLICY_DESCRIPTION),
        },
    });
    if options.registry_url {
        properties["registryUrl"] = json!({
            "type": "string",
            "title": "Registry URL",
            "description": "Optional base URL for the telo module registry, forwarded to the runner as TELO_REGISTRY_URL. Leave blank for the default registry.",
        });
    }
    json!({
        "type": "object",
        "required": ["image", "pullPolicy"],
        "properties": properties,
    })
}

/// A runner that runs chosen telo versions: the keys a version supersedes
/// are deprecated and none is required (clients leave deprecated keys out).
pub fn supersede_by_telo(schema: &mut Value) {
    for key in runner_api::telo::SUPERSEDED_BY_TELO {
        if let Some(property) = schema["properties"].get_mut(key) {
            property["deprecated"] = json!(true);
        }
    }
    schema["required"] = json!([]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> SchemaOptions {
        SchemaOptions {
            image_default: "telorun/node:0-slim".into(),
            enforced: false,
            image_enum: vec![],
            registry_url: true,
            pull_policy_default: PullPolicy::Missing,
            pull_policy_description: None,
        }
    }

    #[test]
    fn an_enum_makes_the_image_a_picker_and_wins_over_enforcement() {
        let schema = session_config_schema(&SchemaOptions {
            enforced: true,
            image_enum: vec!["a".into(), "b".into()],
            ..options()
        });
        assert_eq!(schema["properties"]["image"]["enum"], json!(["a", "b"]));
        assert!(schema["properties"]["image"].get("readOnly").is_none());
    }

    #[test]
    fn an_enforced_image_is_read_only() {
        let schema = session_config_schema(&SchemaOptions {
            enforced: true,
            ..options()
        });
        assert_eq!(schema["properties"]["image"]["readOnly"], json!(true));
        assert_eq!(schema["required"], json!(["image", "pullPolicy"]));
        assert_eq!(
            schema["properties"]["pullPolicy"]["default"],
            json!("missing")
        );
    }

    #[test]
    fn the_registry_url_field_is_optional() {
        let schema = session_config_schema(&SchemaOptions {
            registry_url: false,
            ..options()
        });
        assert!(schema["properties"].get("registryUrl").is_none());
    }
}
