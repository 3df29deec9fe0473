//! The operator's app catalog (`RUNNER_APPS`, docs/contract.md §8.3): images a client
//! may launch by name through `POST /v1/apps/:name/sessions`.
//!
//! The catalog is the whole gate for that route — the client picks a name,
//! never an image — and its `env` is operator secret material that never
//! leaves the runner: only names, titles and descriptions are advertised.

use std::fmt;

use runner_api::app_env;
use runner_api::js::{js_own_key_order, js_trim};
use runner_api::types::{PullPolicy, RunnerAppDescriptor};
use serde_json::{Map, Value};

use crate::env::{ConfigError, Env};
use crate::settings::RUNNER_APPS;

/// One validated catalog entry with the reference's defaults applied
/// (`env` empty, `pullPolicy` `missing`). Values are kept exactly as written.
#[derive(Clone, PartialEq, Eq)]
pub struct AppEntry {
    pub image: String,
    /// Operator environment, in the order the operator wrote it.
    pub env: Vec<(String, String)>,
    pub pull_policy: PullPolicy,
    pub title: Option<String>,
    pub description: Option<String>,
    /// Our addition for the local backend: the program and arguments to run
    /// instead of the image's own command.
    pub command: Option<Vec<String>>,
    /// Our addition: the only variable names a client may set (`acceptEnv`);
    /// `None` takes any name that is not a loader or runtime variable
    /// (`app_env`).
    pub accept_env: Option<Vec<String>>,
    /// `tokenEnv` (0.16): the variable a per-session workload token is
    /// injected under; the token is reported on the session's endpoints.
    pub token_env: Option<String>,
    /// `port` (0.10): the TCP port the entry listens on; only an entry that
    /// declares one can be a watch session's co-resident agent.
    pub port: Option<u16>,
}

impl AppEntry {
    /// The environment of an app session whose entry mints a token: the
    /// merged environment without any other value of `tokenEnv` (a client's
    /// is dropped), then the token.
    pub fn with_token(&self, mut env: Vec<(String, String)>, token: &str) -> Vec<(String, String)> {
        if let Some(name) = &self.token_env {
            env.retain(|(key, _)| key != name);
            env.push((name.clone(), token.to_owned()));
        }
        env
    }

    /// The workload environment of an app session: client keys the operator
    /// also defines are dropped (a client can neither override nor observe an
    /// operator value), then the operator's entries follow. Order: remaining
    /// client keys as the client sent them, then the operator's keys.
    pub fn merge_env(&self, client: &[(String, String)]) -> Vec<(String, String)> {
        let operator_defines = |key: &str| self.env.iter().any(|(name, _)| name == key);
        client
            .iter()
            .filter(|(key, _)| !operator_defines(key))
            .chain(self.env.iter())
            .cloned()
            .collect()
    }

    /// The first client variable this entry does not take, as the 400
    /// message naming it. Loader and runtime variables are refused earlier,
    /// by request validation, for every entry.
    pub fn refused_client_env(
        &self,
        app_name: &str,
        client: &[(String, String)],
    ) -> Option<String> {
        let accepted = self.accept_env.as_deref()?;
        let (name, _) = client
            .iter()
            .find(|(name, _)| !app_env::accepts(accepted, name))?;
        let offered = if accepted.is_empty() {
            "it accepts no client variables".to_owned()
        } else {
            format!("it accepts: {}", accepted.join(", "))
        };
        Some(format!(
            "body/env/{name} is not accepted by app '{app_name}' \u{2014} {offered}"
        ))
    }
}

/// Operator env values are secrets (API keys); `{:?}` of a config must be safe
/// to log, so only the keys are shown.
impl fmt::Debug for AppEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env_keys: Vec<&str> = self.env.iter().map(|(key, _)| key.as_str()).collect();
        f.debug_struct("AppEntry")
            .field("image", &self.image)
            .field("env_keys", &env_keys)
            .field("pull_policy", &self.pull_policy)
            .field("title", &self.title)
            .field("description", &self.description)
            .field("command", &self.command)
            .field("accept_env", &self.accept_env)
            .field("token_env", &self.token_env)
            .field("port", &self.port)
            .finish()
    }
}

/// The catalog in the order the reference advertises it (JavaScript own-key
/// order of the `RUNNER_APPS` object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppCatalog {
    entries: Vec<(String, AppEntry)>,
}

impl AppCatalog {
    /// A catalog from already-validated entries, kept in the given order.
    pub fn from_entries(entries: Vec<(String, AppEntry)>) -> Self {
        Self { entries }
    }

    /// The entry named exactly `name` (case-sensitive, no trimming).
    pub fn get(&self, name: &str) -> Option<&AppEntry> {
        self.entries
            .iter()
            .find(|(entry_name, _)| entry_name == name)
            .map(|(_, entry)| entry)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(name, _)| name.as_str()).collect()
    }

    /// The entries a watch session may run as its agent: those declaring a
    /// port (`features.agents`).
    pub fn agents(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(_, entry)| entry.port.is_some())
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// What `/v1/capabilities` advertises: identity only, never image or env.
    pub fn descriptors(&self) -> Vec<RunnerAppDescriptor> {
        self.entries
            .iter()
            .map(|(name, entry)| RunnerAppDescriptor {
                name: name.clone(),
                title: entry.title.clone(),
                description: entry.description.clone(),
            })
            .collect()
    }

    /// The `unknown_app` 404 message (docs/contract.md §2.6). Listing the offered names leaks
    /// nothing: they are already public on `/v1/capabilities`.
    pub fn unknown_app_message(&self, name: &str) -> String {
        if self.is_empty() {
            format!(
                "app '{name}' is not offered by this runner \u{2014} it offers no predefined applications (see /v1/capabilities)."
            )
        } else {
            format!(
                "app '{name}' is not offered by this runner \u{2014} offered apps: {} (see /v1/capabilities).",
                self.names().join(", ")
            )
        }
    }
}

/// Parses `RUNNER_APPS`. Unset or blank means no apps; anything malformed is a
/// hard error, because a broken catalog must not silently drop the apps.
pub fn load_apps(env: &Env) -> Result<AppCatalog, ConfigError> {
    let Some(raw) = RUNNER_APPS.raw(env) else {
        return Ok(AppCatalog::default());
    };
    let raw = js_trim(raw);
    if raw.is_empty() {
        return Ok(AppCatalog::default());
    }
    let parsed: Value = serde_json::from_str(raw).map_err(|err| ConfigError::Malformed {
        var: RUNNER_APPS.name.to_owned(),
        expected: "valid JSON".to_owned(),
        reason: err.to_string(),
    })?;
    let Value::Object(catalog) = parsed else {
        return Err(ConfigError::must_be(
            RUNNER_APPS.name,
            "a JSON object mapping app name \u{2192} app config",
        ));
    };
    let mut entries = Vec::with_capacity(catalog.len());
    for name in js_own_key_order(&catalog) {
        if let Some(value) = catalog.get(name) {
            entries.push((name.to_owned(), parse_entry(name, value)?));
        }
    }
    Ok(AppCatalog { entries })
}

fn parse_entry(name: &str, value: &Value) -> Result<AppEntry, ConfigError> {
    let fail = |problem: &str| ConfigError::InvalidApp {
        name: name.to_owned(),
        problem: problem.to_owned(),
    };
    if js_trim(name).is_empty() {
        return Err(fail("has an empty name."));
    }
    let Value::Object(entry) = value else {
        return Err(fail("must be an object."));
    };
    let image = match entry.get("image") {
        Some(Value::String(image)) if !js_trim(image).is_empty() => image.clone(),
        _ => return Err(fail("needs a non-empty string 'image'.")),
    };
    let env = match entry.get("env") {
        None => Vec::new(),
        Some(Value::Object(env)) => string_entries(env).ok_or_else(|| {
            fail("has an invalid 'env' \u{2014} expected an object of string values.")
        })?,
        Some(_) => {
            return Err(fail(
                "has an invalid 'env' \u{2014} expected an object of string values.",
            ));
        }
    };
    let pull_policy = match entry.get("pullPolicy") {
        None => PullPolicy::Missing,
        Some(value) => value.as_str().and_then(PullPolicy::parse).ok_or_else(|| {
            fail(&format!(
                "has an invalid 'pullPolicy' \u{2014} expected one of {}.",
                PullPolicy::ALL.join(", ")
            ))
        })?,
    };
    let title = optional_string(entry, "title").map_err(|detail| fail(&detail))?;
    let description = optional_string(entry, "description").map_err(|detail| fail(&detail))?;
    let command = match entry.get("command") {
        None => None,
        Some(value) => Some(command_line(value).ok_or_else(|| {
            fail("has an invalid 'command' \u{2014} expected a non-empty array of strings.")
        })?),
    };
    let accept_env = match entry.get("acceptEnv") {
        None => None,
        Some(value) => Some(accepted_names(value).map_err(|detail| fail(&detail))?),
    };
    let token_env = match entry.get("tokenEnv") {
        None => None,
        Some(Value::String(name)) if !name.is_empty() && !name.contains(['=', '\0']) => {
            if env.iter().any(|(key, _)| key == name) {
                return Err(fail(&format!(
                    "sets 'tokenEnv' to '{name}', which its own 'env' also defines \u{2014} the token would replace that value; name another variable."
                )));
            }
            Some(name.clone())
        }
        Some(_) => {
            return Err(fail(
                "has an invalid 'tokenEnv' \u{2014} expected a variable name.",
            ));
        }
    };
    let port = match entry.get("port") {
        None => None,
        Some(value) => Some(
            value
                .as_u64()
                .and_then(|port| u16::try_from(port).ok())
                .filter(|port| *port > 0)
                .ok_or_else(|| {
                    fail("has an invalid 'port' \u{2014} expected the TCP port it listens on (1-65535).")
                })?,
        ),
    };
    Ok(AppEntry {
        image,
        env,
        pull_policy,
        title,
        description,
        command,
        accept_env,
        token_env,
        port,
    })
}

/// `acceptEnv`: variable names, none of them one a client may never set.
fn accepted_names(value: &Value) -> Result<Vec<String>, String> {
    let invalid =
        || "has an invalid 'acceptEnv' \u{2014} expected an array of variable names.".to_owned();
    let Value::Array(items) = value else {
        return Err(invalid());
    };
    let mut names = Vec::with_capacity(items.len());
    for item in items {
        let Value::String(name) = item else {
            return Err(invalid());
        };
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(invalid());
        }
        if app_env::refused_client_variable(name).is_some() {
            return Err(format!(
                "accepts '{name}' from clients in 'acceptEnv', but that variable changes how the program loads or runs \u{2014} remove it."
            ));
        }
        names.push(name.clone());
    }
    Ok(names)
}

/// All values must be strings; `None` otherwise.
fn string_entries(map: &Map<String, Value>) -> Option<Vec<(String, String)>> {
    js_own_key_order(map)
        .into_iter()
        .map(|key| match map.get(key) {
            Some(Value::String(value)) => Some((key.to_owned(), value.clone())),
            _ => None,
        })
        .collect()
}

fn optional_string(entry: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match entry.get(key) {
        None => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(format!(
            "has an invalid '{key}' \u{2014} expected a string."
        )),
    }
}

/// A non-empty array of non-empty strings: an empty program name or argv can
/// only fail later, at spawn time, with a far less helpful error.
fn command_line(value: &Value) -> Option<Vec<String>> {
    let Value::Array(items) = value else {
        return None;
    };
    if items.is_empty() {
        return None;
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(arg) if !arg.is_empty() => Some(arg.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn apps_env(raw: &str) -> Env {
        Env::from([("RUNNER_APPS".to_owned(), raw.to_owned())])
    }

    fn entry(image: &str) -> AppEntry {
        AppEntry {
            image: image.to_owned(),
            env: Vec::new(),
            pull_policy: PullPolicy::Missing,
            title: None,
            description: None,
            command: None,
            accept_env: None,
            token_env: None,
            port: None,
        }
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[rstest]
    #[case(None)]
    #[case(Some(""))]
    #[case(Some(" \n\t "))]
    fn unset_or_blank_means_no_apps(#[case] raw: Option<&str>) {
        let env = raw.map(apps_env).unwrap_or_default();
        assert_eq!(load_apps(&env), Ok(AppCatalog::default()));
    }

    #[test]
    fn entries_resolve_with_defaults_and_verbatim_values() {
        let env = apps_env(
            r#" {"authoring-agent":{"image":" telorun/agent:latest ","env":{"OPENAI_API_KEY":" sk-1 ","B":"2"},"pullPolicy":"always","title":"Agent","description":"Writes code","extra":1},
                "plain":{"image":"busybox"},
                "local":{"image":"unused","command":["telo","run","app.yaml"]}} "#,
        );
        let catalog = load_apps(&env).unwrap();
        assert_eq!(catalog.names(), vec!["authoring-agent", "plain", "local"]);
        assert_eq!(
            catalog.get("authoring-agent"),
            Some(&AppEntry {
                image: " telorun/agent:latest ".into(),
                env: pairs(&[("OPENAI_API_KEY", " sk-1 "), ("B", "2")]),
                pull_policy: PullPolicy::Always,
                title: Some("Agent".into()),
                description: Some("Writes code".into()),
                command: None,
                accept_env: None,
                token_env: None,
                port: None,
            })
        );
        assert_eq!(catalog.get("plain"), Some(&entry("busybox")));
        assert_eq!(
            catalog.get("local").and_then(|e| e.command.clone()),
            Some(vec!["telo".into(), "run".into(), "app.yaml".into()])
        );
        assert_eq!(catalog.get("Plain"), None);
    }

    #[test]
    fn catalog_order_is_javascript_key_order() {
        let catalog = load_apps(&apps_env(
            r#"{"zeta":{"image":"z"},"7":{"image":"s"},"alpha":{"image":"a"},"3":{"image":"t"}}"#,
        ))
        .unwrap();
        assert_eq!(catalog.names(), vec!["3", "7", "zeta", "alpha"]);
    }

    #[test]
    fn a_name_like_proto_is_a_plain_key() {
        let catalog = load_apps(&apps_env(r#"{"__proto__":{"image":"p"}}"#)).unwrap();
        assert_eq!(catalog.get("__proto__"), Some(&entry("p")));
        assert_eq!(catalog.get("constructor"), None);
    }

    #[rstest]
    #[case(
        "[]",
        "RUNNER_APPS must be a JSON object mapping app name → app config."
    )]
    #[case(
        "null",
        "RUNNER_APPS must be a JSON object mapping app name → app config."
    )]
    #[case(
        "\"x\"",
        "RUNNER_APPS must be a JSON object mapping app name → app config."
    )]
    #[case(
        "3",
        "RUNNER_APPS must be a JSON object mapping app name → app config."
    )]
    #[case(r#"{" ":{"image":"x"}}"#, "RUNNER_APPS entry ' ' has an empty name.")]
    #[case(r#"{"":{"image":"x"}}"#, "RUNNER_APPS entry '' has an empty name.")]
    #[case(r#"{"a":null}"#, "RUNNER_APPS entry 'a' must be an object.")]
    #[case(r#"{"a":[]}"#, "RUNNER_APPS entry 'a' must be an object.")]
    #[case(r#"{"a":"img"}"#, "RUNNER_APPS entry 'a' must be an object.")]
    #[case(
        r#"{"a":{}}"#,
        "RUNNER_APPS entry 'a' needs a non-empty string 'image'."
    )]
    #[case(
        r#"{"a":{"image":"  "}}"#,
        "RUNNER_APPS entry 'a' needs a non-empty string 'image'."
    )]
    #[case(
        r#"{"a":{"image":7}}"#,
        "RUNNER_APPS entry 'a' needs a non-empty string 'image'."
    )]
    #[case(
        r#"{"a":{"image":"x","env":null}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'env' — expected an object of string values."
    )]
    #[case(
        r#"{"a":{"image":"x","env":["K=V"]}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'env' — expected an object of string values."
    )]
    #[case(
        r#"{"a":{"image":"x","env":{"K":1}}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'env' — expected an object of string values."
    )]
    #[case(
        r#"{"a":{"image":"x","pullPolicy":"sometimes"}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'pullPolicy' — expected one of missing, always, never."
    )]
    #[case(
        r#"{"a":{"image":"x","pullPolicy":null}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'pullPolicy' — expected one of missing, always, never."
    )]
    #[case(
        r#"{"a":{"image":"x","pullPolicy":"Always"}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'pullPolicy' — expected one of missing, always, never."
    )]
    #[case(
        r#"{"a":{"image":"x","title":3}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'title' — expected a string."
    )]
    #[case(
        r#"{"a":{"image":"x","title":null}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'title' — expected a string."
    )]
    #[case(
        r#"{"a":{"image":"x","description":{}}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'description' — expected a string."
    )]
    #[case(
        r#"{"a":{"image":"x","command":[]}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'command' — expected a non-empty array of strings."
    )]
    #[case(
        r#"{"a":{"image":"x","command":"telo run"}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'command' — expected a non-empty array of strings."
    )]
    #[case(
        r#"{"a":{"image":"x","command":["telo",""]}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'command' — expected a non-empty array of strings."
    )]
    #[case(
        r#"{"a":{"image":"x","command":["telo",1]}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'command' — expected a non-empty array of strings."
    )]
    #[case(
        r#"{"ok":{"image":"x"},"b":{"image":""},"1":{}}"#,
        "RUNNER_APPS entry '1' needs a non-empty string 'image'."
    )]
    fn malformed_catalogs_are_refused_with_the_reference_text(
        #[case] raw: &str,
        #[case] message: &str,
    ) {
        assert_eq!(
            load_apps(&apps_env(raw)).map_err(|err| err.to_string()),
            Err(message.to_owned())
        );
    }

    #[test]
    fn invalid_json_carries_the_parser_message() {
        let err = load_apps(&apps_env("{not json")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("RUNNER_APPS is not valid JSON: key must be a string"),
            "{err}"
        );
    }

    #[test]
    fn unknown_app_messages_list_the_offered_names() {
        let catalog = AppCatalog::from_entries(vec![
            ("agent".into(), entry("a")),
            ("shell".into(), entry("s")),
        ]);
        assert_eq!(
            catalog.unknown_app_message("nope"),
            "app 'nope' is not offered by this runner \u{2014} offered apps: agent, shell (see /v1/capabilities)."
        );
        assert_eq!(
            AppCatalog::default().unknown_app_message("nope"),
            "app 'nope' is not offered by this runner \u{2014} it offers no predefined applications (see /v1/capabilities)."
        );
    }

    #[test]
    fn descriptors_advertise_identity_only() {
        let mut described = entry("secret-image");
        described.title = Some("Agent".into());
        described.env = pairs(&[("KEY", "sk-secret")]);
        let catalog = AppCatalog::from_entries(vec![
            ("agent".into(), described),
            ("bare".into(), entry("b")),
        ]);
        let json = serde_json::to_string(&catalog.descriptors()).unwrap();
        assert_eq!(
            json,
            r#"[{"name":"agent","title":"Agent"},{"name":"bare"}]"#
        );
    }

    #[test]
    fn operator_env_wins_and_hides_client_values() {
        let mut app = entry("a");
        app.env = pairs(&[("API_KEY", "operator"), ("MODE", "prod")]);
        let client = pairs(&[("FOO", "1"), ("API_KEY", "client"), ("BAR", "2")]);
        assert_eq!(
            app.merge_env(&client),
            pairs(&[
                ("FOO", "1"),
                ("BAR", "2"),
                ("API_KEY", "operator"),
                ("MODE", "prod")
            ])
        );
        assert_eq!(app.merge_env(&[]), app.env);
        assert_eq!(entry("b").merge_env(&client), client);
    }

    #[test]
    fn debug_output_never_shows_operator_env_values() {
        let mut app = entry("a");
        app.env = pairs(&[("API_KEY", "sk-very-secret")]);
        let shown = format!("{:?}", AppCatalog::from_entries(vec![("x".into(), app)]));
        assert!(shown.contains("API_KEY"), "{shown}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
    }

    #[test]
    fn accept_env_limits_client_names_to_the_declared_ones() {
        let catalog = load_apps(&apps_env(
            r#"{"agent":{"image":"a","acceptEnv":["MODE"]},"closed":{"image":"c","acceptEnv":[]}}"#,
        ))
        .unwrap();
        let agent = catalog.get("agent").unwrap();
        assert_eq!(agent.accept_env.as_deref(), Some(&["MODE".to_owned()][..]));
        assert_eq!(
            agent.refused_client_env("agent", &pairs(&[("MODE", "x")])),
            None
        );
        assert_eq!(
            agent.refused_client_env("agent", &pairs(&[("MODE", "x"), ("OPENAI_BASE_URL", "y")])),
            Some(
                "body/env/OPENAI_BASE_URL is not accepted by app 'agent' \u{2014} it accepts: MODE"
                    .to_owned()
            )
        );
        assert_eq!(
            catalog.get("closed").unwrap().refused_client_env("closed", &pairs(&[("A", "1")])),
            Some("body/env/A is not accepted by app 'closed' \u{2014} it accepts no client variables".to_owned())
        );
        assert_eq!(
            entry("x").refused_client_env("x", &pairs(&[("ANY", "1")])),
            None
        );
    }

    #[rstest]
    #[case(
        r#"{"a":{"image":"x","acceptEnv":"MODE"}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'acceptEnv' \u{2014} expected an array of variable names."
    )]
    #[case(
        r#"{"a":{"image":"x","acceptEnv":[1]}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'acceptEnv' \u{2014} expected an array of variable names."
    )]
    #[case(
        r#"{"a":{"image":"x","acceptEnv":["A=B"]}}"#,
        "RUNNER_APPS entry 'a' has an invalid 'acceptEnv' \u{2014} expected an array of variable names."
    )]
    #[case(
        r#"{"a":{"image":"x","acceptEnv":["NODE_OPTIONS"]}}"#,
        "RUNNER_APPS entry 'a' accepts 'NODE_OPTIONS' from clients in 'acceptEnv', but that variable changes how the program loads or runs \u{2014} remove it."
    )]
    fn a_bad_accept_env_is_a_configuration_error(#[case] raw: &str, #[case] message: &str) {
        assert_eq!(load_apps(&apps_env(raw)).unwrap_err().to_string(), message);
    }

    #[test]
    fn token_env_names_a_variable_the_entry_does_not_set() {
        let catalog =
            load_apps(&apps_env(r#"{"a": {"image": "i", "tokenEnv": "TOKEN"}}"#)).unwrap();
        let entry = catalog.get("a").unwrap();
        assert_eq!(entry.token_env.as_deref(), Some("TOKEN"));
        assert_eq!(
            entry.with_token(pairs(&[("TOKEN", "client"), ("A", "1")]), "t0k"),
            pairs(&[("A", "1"), ("TOKEN", "t0k")])
        );
        let err = load_apps(&apps_env(
            r#"{"a": {"image": "i", "env": {"TOKEN": "v"}, "tokenEnv": "TOKEN"}}"#,
        ))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("sets 'tokenEnv' to 'TOKEN', which its own 'env' also defines"),
            "{err}"
        );
        for bad in [r#""""#, "5", r#""A=B""#] {
            let raw = format!(r#"{{"a": {{"image": "i", "tokenEnv": {bad}}}}}"#);
            let err = load_apps(&apps_env(&raw)).unwrap_err();
            assert!(err.to_string().contains("invalid 'tokenEnv'"), "{err}");
        }
    }
}
