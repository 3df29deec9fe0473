//! The bundle path guard (docs/contract.md §8.5).
//!
//! Bundle paths arrive POSIX-style from an untrusted client and become file
//! names under the session's directory; `../x` would escape it. Traversal is
//! checked here, in core, so a bad path is a 400 whatever the backend.

/// The message is the reference's, with the raw input quoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid bundle relativePath '{0}'")]
pub struct InvalidBundlePath(pub String);

/// Longest single path component most filesystems accept (`NAME_MAX`).
const MAX_COMPONENT_BYTES: usize = 255;
/// Linux `PATH_MAX`.
const MAX_PATH_BYTES: usize = 4096;

/// Normalizes a bundle path like Node's `path.posix.normalize`, strips every
/// leading `/`, and rejects anything that is not a file strictly inside the
/// bundle root. Backslash is an ordinary character, not a separator.
///
/// Beyond the reference we also reject, because each can only fail later and
/// less clearly when the file is written: NUL bytes (not representable in a
/// file name), a component over 255 bytes, a path over 4096 bytes, and a
/// trailing `/` (which names a directory, never a file).
pub fn normalize_bundle_path(raw: &str) -> Result<String, InvalidBundlePath> {
    let invalid = || InvalidBundlePath(raw.to_owned());
    if raw.contains('\0') {
        return Err(invalid());
    }
    let normalized = posix_normalize(raw);
    let relative = normalized.trim_start_matches('/');
    if relative.is_empty()
        || relative == "."
        || relative == ".."
        || relative.starts_with("../")
        || relative.split('/').any(|segment| segment == "..")
    {
        return Err(invalid());
    }
    if relative.ends_with('/')
        || relative.len() > MAX_PATH_BYTES
        || relative
            .split('/')
            .any(|segment| segment.len() > MAX_COMPONENT_BYTES)
    {
        return Err(invalid());
    }
    Ok(relative.to_owned())
}

/// `path.posix.normalize`: drops empty and `.` segments, lets `..` cancel the
/// preceding segment (kept at the front of a relative path, dropped at the
/// root of an absolute one), and preserves a leading and a trailing `/`.
fn posix_normalize(path: &str) -> String {
    if path.is_empty() {
        return ".".to_owned();
    }
    let absolute = path.starts_with('/');
    let trailing_slash = path.ends_with('/');
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => match segments.last() {
                Some(&last) if last != ".." => {
                    segments.pop();
                }
                _ if !absolute => segments.push(".."),
                _ => {}
            },
            name => segments.push(name),
        }
    }
    let mut normalized = segments.join("/");
    if normalized.is_empty() {
        return match (absolute, trailing_slash) {
            (true, _) => "/".to_owned(),
            (false, true) => "./".to_owned(),
            (false, false) => ".".to_owned(),
        };
    }
    if trailing_slash {
        normalized.push('/');
    }
    if absolute {
        normalized.insert(0, '/');
    }
    normalized
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;

    #[rstest]
    #[case("", ".")]
    #[case("/", "/")]
    #[case("//", "/")]
    #[case("a/b", "a/b")]
    #[case("a//b/./c", "a/b/c")]
    #[case("a/../b", "b")]
    #[case("a/..", ".")]
    #[case("a/../", "./")]
    #[case("./a/", "a/")]
    #[case("../a", "../a")]
    #[case("../../a/..", "../..")]
    #[case("a/../../x", "../x")]
    #[case("/../x", "/x")]
    #[case("/a/b/../../..", "/")]
    #[case("a/.../b", "a/.../b")]
    #[case("..a/b..", "..a/b..")]
    fn posix_normalize_matches_node(#[case] raw: &str, #[case] expected: &str) {
        assert_eq!(posix_normalize(raw), expected);
    }

    #[rstest]
    #[case("telo.yaml", "telo.yaml")]
    #[case("/a/b.yaml", "a/b.yaml")]
    #[case("///a/b.yaml", "a/b.yaml")]
    #[case("a/../b", "b")]
    #[case("./app/./telo.yaml", "app/telo.yaml")]
    #[case("/../x", "x")]
    #[case("a\\..\\b", "a\\..\\b")]
    #[case("..\\x", "..\\x")]
    #[case("a/...", "a/...")]
    #[case("ünïcödé/ファイル.yaml", "ünïcödé/ファイル.yaml")]
    fn accepted_paths_come_back_normalized(#[case] raw: &str, #[case] expected: &str) {
        assert_eq!(normalize_bundle_path(raw), Ok(expected.to_owned()));
    }

    #[rstest]
    #[case("")]
    #[case(".")]
    #[case("./")]
    #[case("..")]
    #[case("/")]
    #[case("//")]
    #[case("../x")]
    #[case("a/../../x")]
    #[case("a/..")]
    #[case("../../etc/passwd")]
    #[case("./../x")]
    // Our hardening:
    #[case("a/b/")]
    #[case("a/../")]
    #[case("a\0b")]
    #[case("a/b\0")]
    fn traversal_and_non_file_paths_are_rejected(#[case] raw: &str) {
        assert_eq!(
            normalize_bundle_path(raw),
            Err(InvalidBundlePath(raw.to_owned()))
        );
    }

    #[test]
    fn the_error_quotes_the_raw_input() {
        assert_eq!(
            normalize_bundle_path("./a/../../etc")
                .unwrap_err()
                .to_string(),
            "invalid bundle relativePath './a/../../etc'"
        );
    }

    #[test]
    fn overlong_components_and_paths_are_rejected() {
        let longest_name = "n".repeat(255);
        assert!(normalize_bundle_path(&longest_name).is_ok());
        assert!(normalize_bundle_path(&"n".repeat(256)).is_err());
        // The limits apply to the normalized path, not the raw text.
        let collapsed = format!("{}{}", "./".repeat(5000), "x");
        assert_eq!(normalize_bundle_path(&collapsed), Ok("x".to_owned()));
        let deep = vec!["d"; 2048].join("/");
        assert_eq!(deep.len(), 4095);
        assert!(normalize_bundle_path(&deep).is_ok());
        assert!(normalize_bundle_path(&format!("{deep}/e")).is_err());
    }

    proptest! {
        #[test]
        fn accepted_paths_stay_inside_the_bundle(raw in "[a./\\\\\0]{0,24}|(\\.\\.|[a-z]|\\.|/){0,12}") {
            if let Ok(path) = normalize_bundle_path(&raw) {
                prop_assert!(!path.starts_with('/'));
                prop_assert!(!path.ends_with('/'));
                prop_assert!(!path.contains('\0'));
                prop_assert!(path.split('/').all(|segment| segment != ".." && segment != "." && !segment.is_empty()));
                // Normalizing again changes nothing.
                prop_assert_eq!(normalize_bundle_path(&path), Ok(path.clone()));
            }
        }

        #[test]
        fn arbitrary_strings_never_escape(raw in any::<String>()) {
            if let Ok(path) = normalize_bundle_path(&raw) {
                prop_assert!(!path.starts_with('/'));
                prop_assert!(!path.contains('\0'));
                prop_assert!(path.split('/').all(|segment| segment != ".."));
            }
        }
    }
}
