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
/// leak through timing, and a heap dump never shows a token. Each token is a
/// principal of its own ([`TokenIdentity`]).
#[derive(Clone, PartialEq, Eq)]
pub struct AuthTokens {
    entries: Vec<([u8; 32], TokenIdentity)>,
}

/// Who a static token is: a line's attributes after the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIdentity {
    /// `name=`; else `token-` and the first 8 hex digits of the token's
    /// SHA-256 (which says nothing usable about the token).
    pub name: String,
    /// `tenant=`; else the name.
    pub tenant: String,
    /// `groups=a,b`.
    pub groups: Vec<String>,
    /// `admin`: sees and stops every session.
    pub admin: bool,
}

impl std::fmt::Debug for AuthTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthTokens({} tokens)", self.entries.len())
    }
}

impl AuthTokens {
    /// Tokens from the text of a token file: one per line, surrounding
    /// whitespace trimmed, blank lines and `#` comment lines ignored. A line
    /// is the token, then optionally whitespace-separated attributes:
    /// `name=<principal>`, `tenant=<tenant>`, `groups=<g1>,<g2>`, `admin`.
    /// An attribute it does not know is an error naming its line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let token = words.next().unwrap_or_default();
            let digest = digest(token);
            let mut identity = TokenIdentity {
                name: format!("token-{}", &hex::encode(digest)[..8]),
                tenant: String::new(),
                groups: Vec::new(),
                admin: false,
            };
            for word in words {
                match word.split_once('=') {
                    None if word == "admin" => identity.admin = true,
                    Some(("name", value)) if !value.is_empty() => identity.name = value.to_owned(),
                    Some(("tenant", value)) if !value.is_empty() => {
                        identity.tenant = value.to_owned()
                    }
                    Some(("groups", value)) => {
                        identity.groups = value
                            .split(',')
                            .filter(|group| !group.is_empty())
                            .map(str::to_owned)
                            .collect();
                    }
                    _ => {
                        return Err(format!(
                            "line {} has '{word}', which is none of name=, tenant=, groups= or admin",
                            number + 1
                        ));
                    }
                }
            }
            if identity.tenant.is_empty() {
                identity.tenant = identity.name.clone();
            }
            entries.push((digest, identity));
        }
        Ok(Self { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether `candidate` is one of the tokens.
    pub fn accepts(&self, candidate: &str) -> bool {
        self.identify(candidate).is_some()
    }

    /// The identity of `candidate`, if it is one of the tokens. Every token
    /// is compared, in constant time, whatever matches.
    pub fn identify(&self, candidate: &str) -> Option<&TokenIdentity> {
        let presented = digest(candidate);
        let mut found = None;
        for (known, identity) in &self.entries {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(identity);
            }
        }
        found
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
    let tokens = AuthTokens::parse(&text).map_err(|reason| ConfigError::Invalid {
        var: RUNNER_AUTH_TOKENS_FILE.name.to_owned(),
        rule: format!("name a token file whose lines are a token and its attributes ({reason})"),
        value: path.clone(),
    })?;
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
        let tokens = AuthTokens::parse("# operators\n\n  alpha  \n#beta\nbeta-2\r\n").unwrap();
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
    fn a_token_line_names_its_principal_tenant_groups_and_admin() {
        let tokens = AuthTokens::parse(
            "alpha name=alice tenant=acme groups=dev,ops\nroot-token name=ops admin\nplain\n",
        )
        .unwrap();
        let alice = tokens.identify("alpha").unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.tenant, "acme");
        assert_eq!(alice.groups, ["dev", "ops"]);
        assert!(!alice.admin);
        let ops = tokens.identify("root-token").unwrap();
        assert!(ops.admin);
        assert_eq!(ops.tenant, "ops");
        let plain = tokens.identify("plain").unwrap();
        assert!(plain.name.starts_with("token-") && plain.name.len() == 14);
        assert_eq!(plain.tenant, plain.name);
        assert!(tokens.identify("name=alice").is_none());
    }

    #[test]
    fn an_unknown_attribute_is_refused_with_its_line() {
        assert_eq!(
            AuthTokens::parse("ok\nbad owner=me\n"),
            Err("line 2 has 'owner=me', which is none of name=, tenant=, groups= or admin".into())
        );
    }

    #[test]
    fn debug_output_never_shows_a_token() {
        let tokens = AuthTokens::parse("s3cret\n").unwrap();
        assert_eq!(format!("{tokens:?}"), "AuthTokens(1 tokens)");
    }
}
