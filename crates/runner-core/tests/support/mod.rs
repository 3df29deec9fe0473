//! What both hostile-input suites share: the proptest configuration, the
//! generators of hostile strings, numbers, JSON and bundle paths, and the
//! invariant every accepted bundle path keeps.
use std::path::{Component, Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::Value;

// ---------------------------------------------------------------------------
// Configuration

/// `cases` unless `PROPTEST_CASES` asks for more (or fewer).
pub fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        max_shrink_iters: 2048,
        // Integration tests have no `src/` beside them to mirror; the kept
        // corpus, one for both suites, lives in the crate's
        // `proptest-regressions/` all the same.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/hostile_input.txt",
        ))),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Generators

/// Strings chosen to hit coercions, traversal checks and encodings.
pub const NASTY_STRINGS: &[&str] = &[
    "",
    " ",
    "\0",
    "a\0b",
    "\u{FEFF}",
    "\u{FEFF}5",
    "\u{85}5",
    "0",
    "-0",
    "+1",
    "-1",
    "1.5",
    "1e3",
    "1E+3",
    "8.08e3",
    "1e400",
    "-1e400",
    "1e-400",
    "0x1F90",
    "0x",
    "0o17",
    "0b101",
    "0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF",
    "Infinity",
    "-Infinity",
    "NaN",
    "inf",
    "nan",
    "65535",
    "65536",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "9223372036854775808",
    "-9223372036854775809",
    "true",
    "false",
    "TRUE",
    "null",
    "..",
    ".",
    "../x",
    "./../x",
    "/",
    "//",
    "/etc/passwd",
    "a/../../x",
    "..\\x",
    "a\\..\\..\\b",
    "%2e%2e/x",
    "%2e%2e%2fx",
    "..%2f",
    "..%00",
    "\u{FF0E}\u{FF0E}/x",
    "\u{FF0F}etc",
    "\u{2024}\u{2024}/x",
    "\u{FE52}\u{FE52}/x",
    "\u{202E}lmay.exe",
    "e\u{301}",
    "\u{E9}",
    ".\u{301}.",
    "..\u{200B}",
    "\u{1F600}",
    "A=B",
    "=",
    "TELO_REGISTRY_URL",
    "PATH",
    "LD_PRELOAD",
    "tcp",
    "udp",
    "TCP",
    "always",
    "never",
    "missing",
    "resize",
    "telo.yaml",
];

pub fn nasty_string() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::sample::select(NASTY_STRINGS).prop_map(str::to_owned),
        2 => any::<String>(),
        2 => "[a./\\\\%0-9\0\u{FF0E}\u{202E}\u{301}=_-]{0,16}",
        1 => (prop::sample::select(NASTY_STRINGS), prop::sample::select(NASTY_STRINGS))
            .prop_map(|(a, b)| format!("{a}{b}")),
        1 => (0usize..5000, prop::sample::select(&["a", "../", "./", "\u{E9}", "/"][..]))
            .prop_map(|(n, unit)| unit.repeat(n)),
    ]
    .boxed()
}

/// Numbers as JSON can carry them, with the edges of every range we check.
pub fn nasty_number() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(
            &[
                0.0,
                -0.0,
                0.5,
                1.0,
                1.5,
                65535.0,
                65535.5,
                65536.0,
                -1.0,
                1e21,
                1e300,
                f64::MAX,
                f64::MIN,
                f64::MIN_POSITIVE,
                5e-324,
                9_223_372_036_854_775_808.0,
                -9_223_372_036_854_775_808.0,
                18_446_744_073_709_551_616.0,
            ][..]
        )
        .prop_map(Value::from),
        (-70_000i64..70_000).prop_map(Value::from),
    ]
    .boxed()
}

pub const KEYS: &[&str] = &[
    "bundle",
    "entryRelativePath",
    "files",
    "relativePath",
    "contents",
    "env",
    "ports",
    "port",
    "protocol",
    "config",
    "image",
    "pullPolicy",
    "registryUrl",
    "inspect",
    "type",
    "cols",
    "rows",
    "0",
    "1",
    "4294967294",
    "4294967295",
    "__proto__",
    "",
];

pub fn nasty_key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => nasty_string(),
    ]
    .boxed()
}

pub fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        nasty_number(),
        nasty_string().prop_map(Value::String),
    ]
    .boxed()
}

/// Any JSON value, with keys biased towards the ones the schemas name.
pub fn json_value() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(5, 96, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec((nasty_key(), inner), 0..8)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
        .boxed()
}

/// Path components meant to escape, confuse or overflow.
pub const PATH_PARTS: &[&str] = &[
    "",
    ".",
    "..",
    "...",
    "a",
    "telo.yaml",
    "\\",
    "..\\",
    "\\..",
    "%2e%2e",
    "%2f",
    "%00",
    "\u{FF0E}\u{FF0E}",
    "\u{FF0F}",
    "\u{2215}",
    "\u{2024}\u{2024}",
    "\u{FE52}\u{FE52}",
    "\u{202E}",
    "\u{200B}",
    ".\u{301}",
    "e\u{301}",
    "\u{E9}",
    "\u{1F600}",
    "C:",
    "\\\\?\\C:",
    "~",
    "$HOME",
    "\0",
    " ",
    "\n",
];

pub fn hostile_path() -> BoxedStrategy<String> {
    let part = prop_oneof![
        6 => prop::sample::select(PATH_PARTS).prop_map(str::to_owned),
        1 => "[a-z.]{250,260}",
        1 => any::<String>(),
    ];
    let separator = prop::sample::select(&["/", "//", "/./", "\\", ""][..]);
    (
        prop::option::of(prop::sample::select(&["/", "//", "./", "../"][..])),
        prop::collection::vec((part, separator), 0..12),
        prop::option::of(Just("/")),
    )
        .prop_map(|(lead, parts, trail)| {
            let mut path = lead.unwrap_or_default().to_owned();
            for (part, separator) in parts {
                path.push_str(&part);
                path.push_str(separator);
            }
            path.push_str(trail.unwrap_or_default());
            path
        })
        .boxed()
}

// ---------------------------------------------------------------------------
// Bundle path invariants

/// An accepted path, joined to a bundle root, names a file strictly inside it.
pub fn check_accepted_path(path: &str) -> Result<(), TestCaseError> {
    prop_assert!(!path.contains('\0'), "NUL in {path:?}");
    prop_assert!(!path.is_empty());
    prop_assert!(!path.starts_with('/') && !path.ends_with('/'), "{path:?}");
    prop_assert!(path.len() <= 4096, "{} bytes", path.len());
    let root = Path::new("/srv/bundle-root");
    let joined = root.join(path);
    let mut inside = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                return Err(TestCaseError::fail(format!("'..' in {path:?}")));
            }
            Component::CurDir => return Err(TestCaseError::fail(format!("'.' in {path:?}"))),
            other => inside.push(other),
        }
    }
    prop_assert!(
        inside.starts_with(root) && inside != root,
        "{path:?} escapes"
    );
    for segment in path.split('/') {
        prop_assert!(!segment.is_empty() && segment != "." && segment != "..");
        prop_assert!(segment.len() <= 255, "a {}-byte component", segment.len());
    }
    Ok(())
}
