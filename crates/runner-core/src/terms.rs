//! Usage terms (docs/contract.md §8.2): an opt-in agreement every session-creating
//! request must acknowledge by version.

use runner_api::js::js_trim;
use runner_api::types::RunnerTerms;
use sha2::{Digest, Sha256};

use crate::env::{ConfigError, Env};
use crate::settings::{
    RUNNER_TERMS_BODY, RUNNER_TERMS_FILE, RUNNER_TERMS_TITLE, RUNNER_TERMS_VERSION,
};

/// Hex characters of the body's SHA-256 used as the default version.
const FINGERPRINT_HEX_CHARS: usize = 12;

/// The runner's terms, or `None` (no gate) when no non-blank body is configured.
///
/// The body comes from `RUNNER_TERMS_FILE` when set (and `RUNNER_TERMS_BODY` is
/// then ignored), else from `RUNNER_TERMS_BODY`. A configured file that cannot
/// be read is an error rather than "no terms": a typo in a mount path must not
/// quietly drop the gate.
pub fn load_terms(env: &Env) -> Result<Option<RunnerTerms>, ConfigError> {
    let Some(body) = terms_body(env)? else {
        return Ok(None);
    };
    if js_trim(&body).is_empty() {
        return Ok(None);
    }
    // Without an explicit version, any edit of the text changes the version and
    // so re-prompts every client; operators set one only to mark typo fixes as
    // immaterial.
    let version = RUNNER_TERMS_VERSION
        .string(env)
        .unwrap_or_else(|| fingerprint(&body));
    let title = RUNNER_TERMS_TITLE.string_or_default(env);
    Ok(Some(RunnerTerms {
        version,
        title,
        body,
    }))
}

fn terms_body(env: &Env) -> Result<Option<String>, ConfigError> {
    let Some(file) = RUNNER_TERMS_FILE.string(env) else {
        return Ok(RUNNER_TERMS_BODY.raw(env).map(str::to_owned));
    };
    let bytes = std::fs::read(&file).map_err(|err| ConfigError::UnreadableAt {
        var: RUNNER_TERMS_FILE.name.to_owned(),
        path: file.clone(),
        reason: err.to_string(),
    })?;
    // Decoded like Node's `readFileSync(path, "utf8")`: invalid sequences become
    // U+FFFD instead of failing, so a stray byte cannot take the runner down.
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

fn fingerprint(body: &str) -> String {
    let digest = Sha256::digest(body.as_bytes());
    let mut hex = hex::encode(digest);
    hex.truncate(FINGERPRINT_HEX_CHARS);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Env {
        crate::env::env_from_pairs(pairs)
    }

    #[test]
    fn no_body_means_no_terms() {
        assert_eq!(load_terms(&Env::new()), Ok(None));
        assert_eq!(
            load_terms(&vars(&[
                ("RUNNER_TERMS_VERSION", "v1"),
                ("RUNNER_TERMS_TITLE", "T")
            ])),
            Ok(None)
        );
    }

    #[test]
    fn a_blank_body_means_no_terms() {
        assert_eq!(
            load_terms(&vars(&[("RUNNER_TERMS_BODY", " \n\t\u{FEFF} ")])),
            Ok(None)
        );
    }

    #[test]
    fn an_inline_body_is_kept_verbatim_with_a_content_hash_version() {
        let terms = load_terms(&vars(&[("RUNNER_TERMS_BODY", "  Be nice.\n")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            terms,
            RunnerTerms {
                // First 12 hex chars of sha256("  Be nice.\n").
                version: hex::encode(Sha256::digest(b"  Be nice.\n"))[..12].to_owned(),
                title: "Usage agreement".into(),
                body: "  Be nice.\n".into(),
            }
        );
    }

    #[test]
    fn the_default_version_is_a_known_sha256_prefix() {
        // sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
        let terms = load_terms(&vars(&[("RUNNER_TERMS_BODY", "abc")]))
            .unwrap()
            .unwrap();
        assert_eq!(terms.version, "ba7816bf8f01");
    }

    #[test]
    fn explicit_version_and_title_are_trimmed() {
        let terms = load_terms(&vars(&[
            ("RUNNER_TERMS_BODY", "Be nice."),
            ("RUNNER_TERMS_VERSION", " 2026-01 "),
            ("RUNNER_TERMS_TITLE", " House rules "),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(terms.version, "2026-01");
        assert_eq!(terms.title, "House rules");
    }

    #[test]
    fn blank_version_and_title_fall_back_to_defaults() {
        let terms = load_terms(&vars(&[
            ("RUNNER_TERMS_BODY", "abc"),
            ("RUNNER_TERMS_VERSION", "  "),
            ("RUNNER_TERMS_TITLE", ""),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(terms.version, "ba7816bf8f01");
        assert_eq!(terms.title, "Usage agreement");
    }

    #[test]
    fn a_terms_file_wins_over_the_inline_body() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("terms.md");
        std::fs::write(&path, "# Terms\nFrom the file.\n").unwrap();
        let terms = load_terms(&vars(&[
            ("RUNNER_TERMS_FILE", &format!("  {}  ", path.display())),
            ("RUNNER_TERMS_BODY", "inline"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(terms.body, "# Terms\nFrom the file.\n");
    }

    #[test]
    fn a_blank_terms_file_means_no_terms_even_with_an_inline_body() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("terms.md");
        std::fs::write(&path, "\n\n").unwrap();
        let env = vars(&[
            ("RUNNER_TERMS_FILE", path.to_str().unwrap()),
            ("RUNNER_TERMS_BODY", "inline"),
        ]);
        assert_eq!(load_terms(&env), Ok(None));
    }

    #[test]
    fn a_blank_terms_file_variable_falls_back_to_the_inline_body() {
        let env = vars(&[("RUNNER_TERMS_FILE", "  "), ("RUNNER_TERMS_BODY", "inline")]);
        assert_eq!(
            load_terms(&env).unwrap().map(|t| t.body),
            Some("inline".into())
        );
    }

    #[test]
    fn invalid_utf8_in_the_file_is_replaced_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("terms.txt");
        std::fs::write(&path, b"caf\xe9").unwrap();
        let env = vars(&[("RUNNER_TERMS_FILE", path.to_str().unwrap())]);
        assert_eq!(
            load_terms(&env).unwrap().map(|t| t.body),
            Some("caf\u{FFFD}".into())
        );
    }

    #[test]
    fn an_unreadable_terms_file_is_a_hard_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.md");
        let env = vars(&[
            ("RUNNER_TERMS_FILE", &format!(" {} ", missing.display())),
            ("RUNNER_TERMS_BODY", "inline"),
        ]);
        let err = load_terms(&env).unwrap_err();
        let expected_prefix = format!(
            "RUNNER_TERMS_FILE could not be read at '{}': ",
            missing.display()
        );
        assert!(err.to_string().starts_with(&expected_prefix), "{err}");
        assert!(
            err.to_string().contains("No such file or directory"),
            "{err}"
        );
    }

    #[test]
    fn a_directory_is_not_a_readable_terms_file() {
        let dir = tempfile::tempdir().unwrap();
        let env = vars(&[("RUNNER_TERMS_FILE", dir.path().to_str().unwrap())]);
        assert!(load_terms(&env).is_err());
    }
}
