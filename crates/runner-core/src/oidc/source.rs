//! Where the key set comes from: fetched over HTTP(S) or read from a file,
//! never more than [`MAX_JWKS_BYTES`] of it, and a fetch never longer than
//! [`FETCH_TIMEOUT`].

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use super::keys::{KeySet, MAX_JWKS_BYTES};
use super::{JwksSource, OidcError};
use crate::settings::{RUNNER_OIDC_JWKS_FILE, RUNNER_OIDC_JWKS_URL};

/// The longest one fetch of the key set may take, connecting included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads the key set from its source, again each time it is asked.
pub(crate) enum Loader {
    Url {
        url: String,
        client: reqwest::Client,
    },
    File(PathBuf),
}

/// An error and its causes, as one line.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl Loader {
    pub fn new(source: &JwksSource) -> Result<Self, OidcError> {
        Ok(match source {
            JwksSource::Url(url) => {
                let client = crate::http_client::client_builder()
                    .timeout(FETCH_TIMEOUT)
                    .connect_timeout(CONNECT_TIMEOUT)
                    .build()
                    .map_err(|err| OidcError::Client {
                        reason: chain(&err),
                    })?;
                Loader::Url {
                    url: url.clone(),
                    client,
                }
            }
            JwksSource::File(path) => Loader::File(path.clone()),
        })
    }

    pub async fn load(&self) -> Result<KeySet, OidcError> {
        let (var, origin, bytes) = match self {
            Loader::Url { url, client } => (
                RUNNER_OIDC_JWKS_URL.name,
                url.clone(),
                fetch(client, url)
                    .await
                    .map_err(|reason| OidcError::Unfetchable {
                        url: url.clone(),
                        reason,
                    })?,
            ),
            Loader::File(path) => {
                let path = path.clone();
                let shown = path.display().to_string();
                let read = tokio::task::spawn_blocking(move || read_bounded(&path))
                    .await
                    .map_err(|err| err.to_string())
                    .and_then(|read| read.map_err(|err| err.to_string()));
                let bytes = read.map_err(|reason| OidcError::UnreadableFile {
                    path: shown.clone(),
                    reason,
                })?;
                (RUNNER_OIDC_JWKS_FILE.name, shown, bytes)
            }
        };
        KeySet::parse(&bytes).map_err(|reason| OidcError::Unusable {
            var: var.to_owned(),
            origin,
            reason,
        })
    }
}

/// At most one byte more than a key set may hold, so that an oversized one
/// is refused as such.
fn read_bounded(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_JWKS_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let mut response = client
        .get(url)
        .header(http::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|err| chain(&err.without_url()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("it answered HTTP {}", status.as_u16()));
    }
    if response
        .content_length()
        .is_some_and(|length| length > MAX_JWKS_BYTES as u64)
    {
        return Err(format!("it is larger than {MAX_JWKS_BYTES} bytes"));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| chain(&err.without_url()))?
    {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_JWKS_BYTES {
            return Err(format!("it is larger than {MAX_JWKS_BYTES} bytes"));
        }
    }
    Ok(bytes)
}
