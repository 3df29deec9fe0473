//! Optional bearer-token authentication (`RUNNER_AUTH_TOKENS_FILE`): loading
//! the token file and checking a presented token. The HTTP side lives in
//! `http::auth`.
//!
//! Off by default, like the reference (docs/contract.md §1.4): a runner without a
//! token file is driven by whoever can reach its port.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::env::{ConfigError, Env};
use crate::settings::RUNNER_AUTH_TOKENS_FILE;

/// The accepted tokens, kept only as SHA-256 digests: comparing digests makes
/// every comparison the same length, so neither a token's bytes nor its length
/// leak through timing, and a heap dump never shows a token.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthTokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for AuthTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthTokens({} tokens)", self.digests.len())
    }
}

impl AuthTokens {
    /// Tokens from the text of a token file: one per line, surrounding
    /// whitespace trimmed, blank lines and `#` comment lines ignored.
    pub fn parse(text: &str) -> Self {
        let digests = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(digest)
            .collect();
        Self { digests }
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether `candidate` is one of the tokens. Every token is compared, in
    /// constant time, whatever matches.
    pub fn accepts(&self, candidate: &str) -> bool {
        let presented = digest(candidate);
        let mut matched = subtle::Choice::from(0);
        for known in &self.digests {
            matched |= known.ct_eq(&presented);
        }
        matched.into()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Reads `RUNNER_AUTH_TOKENS_FILE`. Unset or blank means authentication is
/// off; a file that cannot be read or holds no token is a boot error, because
/// silently starting without auth is the failure an operator who set the
/// variable is guarding against.
pub fn load_auth_tokens(env: &Env) -> Result<Option<AuthTokens>, ConfigError> {
    let Some(path) = RUNNER_AUTH_TOKENS_FILE.string(env) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path).map_err(|err| ConfigError::UnreadableFile {
        var: RUNNER_AUTH_TOKENS_FILE.name.to_owned(),
        path: path.clone(),
        // This variable's refusal has always closed with a full stop.
        reason: format!("{err}."),
    })?;
    let tokens = AuthTokens::parse(&text);
    if tokens.is_empty() {
        return Err(ConfigError::NoTokens {
            var: RUNNER_AUTH_TOKENS_FILE.name.to_owned(),
            path: path.clone(),
        });
    }
    Ok(Some(tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::env_from_pairs;

    #[test]
    fn comments_blank_lines_and_surrounding_whitespace_are_not_tokens() {
        let tokens = AuthTokens::parse("# operators\n\n  alpha  \n#beta\nbeta-2\r\n");
        assert_eq!(tokens.len(), 2);
        assert!(tokens.accepts("alpha"));
        assert!(tokens.accepts("beta-2"));
        assert!(!tokens.accepts("#beta"));
        assert!(!tokens.accepts(""));
        assert!(!tokens.accepts("alph"));
    }

    #[test]
    fn an_unset_or_blank_variable_turns_authentication_off() {
        assert_eq!(load_auth_tokens(&env_from_pairs(&[])), Ok(None));
        assert_eq!(
            load_auth_tokens(&env_from_pairs(&[(RUNNER_AUTH_TOKENS_FILE.name, "  ")])),
            Ok(None)
        );
    }

    #[test]
    fn a_file_without_tokens_is_a_config_error() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# none yet\n\n").expect("write");
        let path = path.to_string_lossy().into_owned();
        assert_eq!(
            load_auth_tokens(&env_from_pairs(&[(RUNNER_AUTH_TOKENS_FILE.name, &path)]))
                .map_err(|err| err.to_string()),
            Err(format!(
                "RUNNER_AUTH_TOKENS_FILE '{path}' holds no token (one per line; blank lines and # comments are ignored)."
            ))
        );
    }

    #[test]
    fn debug_output_never_shows_a_token() {
        let tokens = AuthTokens::parse("s3cret\n");
        assert_eq!(format!("{tokens:?}"), "AuthTokens(1 tokens)");
    }
}
