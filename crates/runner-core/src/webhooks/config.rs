//! `RUNNER_WEBHOOK_URL` and `RUNNER_WEBHOOK_SECRET_FILE`: where lifecycle
//! events go and the secret they are signed with.

use reqwest::Url;

use crate::env::{ConfigError, Env};
use crate::settings::{RUNNER_WEBHOOK_SECRET_FILE, RUNNER_WEBHOOK_URL};

/// Where lifecycle events are delivered and the secret that signs them.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    pub url: Url,
    /// The HMAC key: the secret file's bytes, surrounding whitespace trimmed.
    pub secret: Vec<u8>,
}

/// The secret is never shown, and neither are the parts of the URL that may
/// carry credentials (user info, query, fragment).
impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &shown_url(&self.url))
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .finish()
    }
}

/// `url` without user info, query or fragment, for logs and `Debug`.
pub fn shown_url(url: &Url) -> String {
    let mut shown = url.clone();
    // Both only fail for URLs that cannot have user info (not http(s)).
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// Reads the webhook settings. An unset or blank URL turns webhooks off (the
/// secret file is then not opened); a URL that is not http(s), or one without
/// a readable, non-empty secret file, is a boot error: an operator who set
/// the URL expects every lifecycle event there, signed.
pub fn load_webhook_config(env: &Env) -> Result<Option<WebhookConfig>, ConfigError> {
    let url = RUNNER_WEBHOOK_URL.string(env);
    let secret_file = RUNNER_WEBHOOK_SECRET_FILE.string(env);
    let Some(raw_url) = url else {
        return Ok(None);
    };
    let url = Url::parse(&raw_url)
        .ok()
        .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
        .ok_or_else(|| {
            ConfigError::invalid(
                RUNNER_WEBHOOK_URL.name,
                "be an absolute http:// or https:// URL",
                &raw_url,
            )
        })?;
    let Some(path) = secret_file else {
        return Err(ConfigError::must_be(
            RUNNER_WEBHOOK_SECRET_FILE.name,
            format!(
                "set to a file holding the signing secret when {} is set",
                RUNNER_WEBHOOK_URL.name
            ),
        ));
    };
    let bytes = std::fs::read(&path).map_err(|err| ConfigError::UnreadableFile {
        var: RUNNER_WEBHOOK_SECRET_FILE.name.to_owned(),
        path: path.clone(),
        reason: format!("{err}."),
    })?;
    let secret = bytes.trim_ascii();
    if secret.is_empty() {
        return Err(ConfigError::invalid(
            RUNNER_WEBHOOK_SECRET_FILE.name,
            "name a file holding a non-empty secret",
            &path,
        ));
    }
    Ok(Some(WebhookConfig {
        url,
        secret: secret.to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::env_from_pairs;

    fn secret_file(contents: &[u8]) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("secret");
        std::fs::write(&path, contents).expect("write");
        let path = path.to_string_lossy().into_owned();
        (dir, path)
    }

    fn load(pairs: &[(&str, &str)]) -> Result<Option<WebhookConfig>, String> {
        load_webhook_config(&env_from_pairs(pairs)).map_err(|err| err.to_string())
    }

    #[test]
    fn an_unset_or_blank_url_turns_webhooks_off() {
        assert_eq!(load(&[]), Ok(None));
        assert_eq!(load(&[("RUNNER_WEBHOOK_URL", "  ")]), Ok(None));
        assert_eq!(
            load(&[("RUNNER_WEBHOOK_SECRET_FILE", "/nonexistent/secret")]),
            Ok(None)
        );
    }

    #[test]
    fn the_secret_is_the_file_trimmed() {
        let (_dir, path) = secret_file(b"\n  s3cret value \r\n");
        let config = load(&[
            ("RUNNER_WEBHOOK_URL", " https://hooks.example/runner?k=v "),
            ("RUNNER_WEBHOOK_SECRET_FILE", &path),
        ])
        .expect("loads")
        .expect("on");
        assert_eq!(config.url.as_str(), "https://hooks.example/runner?k=v");
        assert_eq!(config.secret, b"s3cret value");
    }

    #[test]
    fn a_url_that_is_not_http_is_refused() {
        for raw in [
            "ftp://hooks.example/x",
            "hooks.example/x",
            "http://",
            "data:,x",
        ] {
            assert_eq!(
                load(&[("RUNNER_WEBHOOK_URL", raw)]),
                Err(format!(
                    "RUNNER_WEBHOOK_URL must be an absolute http:// or https:// URL, got '{raw}'."
                ))
            );
        }
    }

    #[test]
    fn a_url_without_a_secret_file_is_refused() {
        assert_eq!(
            load(&[("RUNNER_WEBHOOK_URL", "http://127.0.0.1:9/hook")]),
            Err("RUNNER_WEBHOOK_SECRET_FILE must be set to a file holding the signing secret when RUNNER_WEBHOOK_URL is set.".to_owned())
        );
    }

    #[test]
    fn an_unreadable_or_empty_secret_is_refused() {
        assert_eq!(
            load(&[
                ("RUNNER_WEBHOOK_URL", "http://127.0.0.1:9/hook"),
                ("RUNNER_WEBHOOK_SECRET_FILE", "/nonexistent/webhook-secret"),
            ]),
            Err("RUNNER_WEBHOOK_SECRET_FILE '/nonexistent/webhook-secret' could not be read: No such file or directory (os error 2).".to_owned())
        );
        let (_dir, path) = secret_file(b" \n\t\n");
        assert_eq!(
            load(&[
                ("RUNNER_WEBHOOK_URL", "http://127.0.0.1:9/hook"),
                ("RUNNER_WEBHOOK_SECRET_FILE", &path),
            ]),
            Err(format!(
                "RUNNER_WEBHOOK_SECRET_FILE must name a file holding a non-empty secret, got '{path}'."
            ))
        );
    }

    #[test]
    fn debug_shows_neither_the_secret_nor_url_credentials() {
        let config = WebhookConfig {
            url: Url::parse("https://user:pw@hooks.example/in?token=abc#frag").expect("url"),
            secret: b"top-secret".to_vec(),
        };
        let shown = format!("{config:?}");
        assert_eq!(
            shown,
            "WebhookConfig { url: \"https://hooks.example/in\", secret: <10 bytes> }"
        );
    }
}
