//! The three request-body schemas (docs/contract.md §2.4–§2.6), in the reference's
//! property order, as data: the walker (`walk.rs`) validates against them and
//! [`request_schemas`] turns them into the JSON Schemas the OpenAPI document
//! publishes, so what is documented is what is checked.

use serde_json::{Map, Value, json};

use super::{MAX_ENV_ENTRIES, MAX_PORTS};
use crate::types::PullPolicy;
use crate::watch::MAX_APP_NAME_LEN;

pub(super) enum Schema {
    Object {
        required: &'static [&'static str],
        properties: &'static [(&'static str, &'static Schema)],
        additional: Additional,
    },
    Array {
        items: &'static Schema,
        min_items: usize,
    },
    String {
        min_length: usize,
        max_length: Option<usize>,
        one_of: Option<&'static [&'static str]>,
    },
    Integer {
        minimum: i64,
        maximum: i64,
    },
    Boolean,
    /// A schema the OpenAPI document publishes as a named component and
    /// refers to by `$ref`; validated as `schema`.
    Named(&'static str, &'static Schema),
    /// Our hardening beyond the reference's schema. The walker ignores it
    /// (the reference's checks, and so its first message, come first); the
    /// typed extraction after the walk enforces each bound, with the same
    /// constants, and the document states it.
    Bounded(&'static Schema, &'static [Bound]),
    /// A schema with a description for the document; validated as `schema`.
    Described(&'static Schema, &'static str),
}

pub(super) enum Additional {
    /// No `additionalProperties`: unknown keys pass through untouched.
    Keep,
    /// `additionalProperties: false` under `removeAdditional`: deleted, no error.
    Strip,
    /// Every other key must match this schema.
    Each(&'static Schema),
}

/// A bound the extraction enforces after the walk (see [`Schema::Bounded`]).
pub(super) enum Bound {
    MaxProperties(usize),
    MaxItems(usize),
    /// Property names are non-empty and hold no `=` or NUL.
    EnvironmentNames,
    /// The string holds no NUL.
    NoNul,
}

const PULL_POLICIES: &[&str] = &PullPolicy::ALL;

static NON_EMPTY_STRING: Schema = Schema::String {
    min_length: 1,
    max_length: None,
    one_of: None,
};
static ANY_STRING: Schema = Schema::String {
    min_length: 0,
    max_length: None,
    one_of: None,
};
static PULL_POLICY: Schema = Schema::Named(
    "PullPolicy",
    &Schema::String {
        min_length: 0,
        max_length: None,
        one_of: Some(PULL_POLICIES),
    },
);
static PORT_PROTOCOL: Schema = Schema::Named(
    "PortProtocol",
    &Schema::String {
        min_length: 0,
        max_length: None,
        one_of: Some(&["tcp", "udp"]),
    },
);
static BOOLEAN: Schema = Schema::Boolean;

static BUNDLE_FILE: Schema = Schema::Named(
    "BundleFile",
    &Schema::Object {
        required: &["relativePath", "contents"],
        properties: &[
            ("relativePath", &NON_EMPTY_STRING),
            (
                "contents",
                &Schema::Described(&ANY_STRING, "UTF-8 text, inline."),
            ),
        ],
        additional: Additional::Keep,
    },
);
static BUNDLE: Schema = Schema::Named(
    "RunBundle",
    &Schema::Object {
        required: &["entryRelativePath", "files"],
        properties: &[
            ("entryRelativePath", &NON_EMPTY_STRING),
            (
                "files",
                &Schema::Array {
                    items: &BUNDLE_FILE,
                    min_items: 0,
                },
            ),
        ],
        additional: Additional::Keep,
    },
);
static ENV: Schema = Schema::Named(
    "Env",
    &Schema::Bounded(
        &Schema::Object {
            required: &[],
            properties: &[],
            additional: Additional::Each(&Schema::Bounded(&ANY_STRING, &[Bound::NoNul])),
        },
        &[
            Bound::MaxProperties(MAX_ENV_ENTRIES),
            Bound::EnvironmentNames,
        ],
    ),
);
static PORT_MAPPING: Schema = Schema::Named(
    "PortMapping",
    &Schema::Object {
        required: &["port", "protocol"],
        properties: &[
            (
                "port",
                &Schema::Integer {
                    minimum: 1,
                    maximum: 65535,
                },
            ),
            ("protocol", &PORT_PROTOCOL),
        ],
        additional: Additional::Keep,
    },
);
static PORTS: Schema = Schema::Bounded(
    &Schema::Array {
        items: &PORT_MAPPING,
        min_items: 0,
    },
    &[Bound::MaxItems(MAX_PORTS)],
);
static SESSION_CONFIG: Schema = Schema::Named(
    "SessionConfig",
    &Schema::Object {
        required: &[],
        properties: &[
            ("image", &NON_EMPTY_STRING),
            ("pullPolicy", &PULL_POLICY),
            (
                "registryUrl",
                &Schema::Bounded(&NON_EMPTY_STRING, &[Bound::NoNul]),
            ),
        ],
        additional: Additional::Keep,
    },
);
static SESSION_APP: Schema = Schema::Named(
    "SessionAppSpec",
    &Schema::Object {
        required: &["name", "entryRelativePath"],
        properties: &[
            (
                "name",
                &Schema::String {
                    min_length: 1,
                    max_length: Some(MAX_APP_NAME_LEN),
                    one_of: None,
                },
            ),
            ("entryRelativePath", &NON_EMPTY_STRING),
            ("ports", &PORTS),
            (
                "io",
                &Schema::String {
                    min_length: 0,
                    max_length: None,
                    one_of: Some(&["tty", "streams"]),
                },
            ),
            (
                "telo",
                &Schema::Described(
                    &ANY_STRING,
                    "The telo release the app runs (see TELO_VERSION_PATTERN); needs features.teloVersions.",
                ),
            ),
        ],
        additional: Additional::Keep,
    },
);
static SESSION_APPS: Schema = Schema::Array {
    items: &SESSION_APP,
    min_items: 1,
};
pub(super) static START_SESSION: Schema = Schema::Named(
    "StartSessionRequest",
    &Schema::Object {
        required: &["bundle", "env"],
        properties: &[
            ("bundle", &BUNDLE),
            ("env", &ENV),
            ("ports", &PORTS),
            ("config", &SESSION_CONFIG),
            ("inspect", &BOOLEAN),
            (
                "mode",
                &Schema::String {
                    min_length: 0,
                    max_length: None,
                    one_of: Some(&["run", "watch"]),
                },
            ),
            ("agent", &NON_EMPTY_STRING),
            ("apps", &SESSION_APPS),
            (
                "telo",
                &Schema::Described(
                    &ANY_STRING,
                    "The telo release of the request's one app when `apps` is omitted; needs features.teloVersions.",
                ),
            ),
        ],
        additional: Additional::Keep,
    },
);
pub(super) static SET_APPS: Schema = Schema::Named(
    "SetAppsRequest",
    &Schema::Object {
        required: &["apps"],
        properties: &[("apps", &SESSION_APPS)],
        additional: Additional::Keep,
    },
);
/// The longest a share link may live: 30 days.
pub const MAX_LINK_TTL_SECONDS: i64 = 30 * 24 * 3600;
pub(super) static NEW_LINK: Schema = Schema::Named(
    "CreateLinkRequest",
    &Schema::Object {
        required: &["port"],
        properties: &[
            (
                "port",
                &Schema::Integer {
                    minimum: 1,
                    maximum: 65535,
                },
            ),
            (
                "ttlSeconds",
                &Schema::Integer {
                    minimum: 1,
                    maximum: MAX_LINK_TTL_SECONDS,
                },
            ),
        ],
        additional: Additional::Keep,
    },
);
static WORKSPACE_WRITE: Schema = Schema::Named(
    "WorkspaceWrite",
    &Schema::Object {
        required: &["path", "content"],
        properties: &[
            ("path", &NON_EMPTY_STRING),
            ("content", &ANY_STRING),
            (
                "encoding",
                &Schema::String {
                    min_length: 0,
                    max_length: None,
                    one_of: Some(&["utf8", "base64"]),
                },
            ),
        ],
        additional: Additional::Keep,
    },
);
pub(super) static CHANGE_SET: Schema = Schema::Named(
    "WorkspaceChangeSet",
    &Schema::Object {
        required: &[],
        properties: &[
            (
                "write",
                &Schema::Array {
                    items: &WORKSPACE_WRITE,
                    min_items: 0,
                },
            ),
            (
                "delete",
                &Schema::Array {
                    items: &NON_EMPTY_STRING,
                    min_items: 0,
                },
            ),
        ],
        additional: Additional::Keep,
    },
);
pub(super) static APP_SESSION: Schema = Schema::Named(
    "AppSessionRequest",
    &Schema::Object {
        required: &[],
        properties: &[("env", &ENV), ("ports", &PORTS), ("inspect", &BOOLEAN)],
        additional: Additional::Keep,
    },
);
pub(super) static PROBE: Schema = Schema::Named(
    "ProbeRequest",
    &Schema::Object {
        required: &["config"],
        properties: &[(
            "config",
            &Schema::Object {
                required: &["image", "pullPolicy"],
                properties: &[("image", &NON_EMPTY_STRING), ("pullPolicy", &PULL_POLICY)],
                additional: Additional::Strip,
            },
        )],
        additional: Additional::Strip,
    },
);

/// The JSON Schemas of the three request bodies and of every named part of
/// them, by component name (`StartSessionRequest`, `AppSessionRequest`,
/// `ProbeRequest`, `RunBundle`, `Env`, …). References between them are
/// `#/components/schemas/<name>`.
///
/// JSON Schema cannot say one thing the walker does: scalars are coerced as
/// AJV's `coerceTypes: "array"` does (`"8080"` is a port), so the runner
/// accepts a little more than these schemas admit, never less.
pub fn request_schemas() -> Map<String, Value> {
    let mut components = Map::new();
    for root in [
        &START_SESSION,
        &APP_SESSION,
        &PROBE,
        &SET_APPS,
        &CHANGE_SET,
        &NEW_LINK,
    ] {
        let _ = to_json(root, &mut components);
    }
    components
}

/// The JSON Schema of `schema`; every named schema met on the way is added
/// to `components` and referred to.
fn to_json(schema: &Schema, components: &mut Map<String, Value>) -> Value {
    match schema {
        Schema::Named(name, inner) => {
            if !components.contains_key(*name) {
                let body = to_json(inner, components);
                components.insert((*name).to_owned(), body);
            }
            json!({ "$ref": format!("#/components/schemas/{name}") })
        }
        Schema::Described(inner, description) => {
            let mut body = to_json(inner, components);
            body["description"] = json!(description);
            body
        }
        Schema::Bounded(inner, bounds) => {
            let mut body = to_json(inner, components);
            for bound in *bounds {
                match bound {
                    Bound::MaxProperties(max) => body["maxProperties"] = json!(max),
                    Bound::MaxItems(max) => body["maxItems"] = json!(max),
                    Bound::EnvironmentNames => {
                        body["propertyNames"] = json!({"minLength": 1, "pattern": "^[^=\\x00]*$"});
                    }
                    Bound::NoNul => body["pattern"] = json!("^[^\\x00]*$"),
                }
            }
            body
        }
        Schema::Object {
            required,
            properties,
            additional,
        } => {
            let mut body = json!({ "type": "object" });
            if !required.is_empty() {
                body["required"] = json!(required);
            }
            if !properties.is_empty() {
                let mut declared = Map::new();
                for (name, property) in *properties {
                    declared.insert((*name).to_owned(), to_json(property, components));
                }
                body["properties"] = Value::Object(declared);
            }
            // `Strip` publishes nothing: unknown keys are dropped, never refused.
            if let Additional::Each(each) = additional {
                body["additionalProperties"] = to_json(each, components);
            }
            body
        }
        Schema::Array { items, min_items } => {
            let mut body = json!({ "type": "array", "items": to_json(items, components) });
            if *min_items > 0 {
                body["minItems"] = json!(min_items);
            }
            body
        }
        Schema::String {
            min_length,
            max_length,
            one_of,
        } => {
            let mut body = json!({ "type": "string" });
            if *min_length > 0 {
                body["minLength"] = json!(min_length);
            }
            if let Some(max) = max_length {
                body["maxLength"] = json!(max);
            }
            if let Some(allowed) = one_of {
                body["enum"] = json!(allowed);
            }
            body
        }
        Schema::Integer { minimum, maximum } => {
            json!({ "type": "integer", "minimum": minimum, "maximum": maximum })
        }
        Schema::Boolean => json!({ "type": "boolean" }),
    }
}
