//! Source comments cite the project's own documents by section: a number of
//! docs/contract.md (`docs/contract.md §5.3`) or a heading of
//! docs/architecture.md (`docs/architecture.md § The local backend`). A
//! citation of a section that was renumbered away, or of a document that is
//! not in the repository, sends the reader nowhere; these tests catch both.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The section sign.
const SECTION: char = '\u{a7}';

const CONTRACT: &str = "docs/contract.md";
const ARCHITECTURE: &str = "docs/architecture.md";

/// Names of documents that live outside the repository. A source that names
/// one cites text its readers do not have.
const OUTSIDE_DOCUMENTS: [&str; 6] = [
    "contract-watch",
    "k8s-runner.md",
    "design.md",
    "shared/spec",
    "spec/contract",
    "/work/shared",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every text file under `crates/` and `tools/`, by path relative to the
/// repository, except this test (which names what it forbids).
fn sources() -> Vec<(String, String)> {
    let root = repo_root();
    let this_file = Path::new(file!())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mut found = Vec::new();
    let mut pending: Vec<PathBuf> = vec![root.join("crates"), root.join("tools")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                if !(name.starts_with('.')
                    || name == "target"
                    || name == "node_modules"
                    || name == "__pycache__")
                {
                    pending.push(path);
                }
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if relative.ends_with(&format!("telo-runner/tests/{this_file}")) {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(&path) {
                found.push((relative, text));
            }
        }
    }
    found.sort();
    found
}

/// The numbers of docs/contract.md's sections (`4`, `4.3`), from headings of
/// the form `## 4. Title` and `### 4.3 Title`.
fn contract_sections(contract: &str) -> Vec<String> {
    contract
        .lines()
        .filter_map(|line| {
            let heading = line
                .strip_prefix("### ")
                .or_else(|| line.strip_prefix("## "))?;
            let number = heading.split_whitespace().next()?.trim_end_matches('.');
            (!number.is_empty() && number.chars().all(|c| c.is_ascii_digit() || c == '.'))
                .then(|| number.to_owned())
        })
        .collect()
}

/// The titles of docs/architecture.md's `##` sections.
fn architecture_headings(architecture: &str) -> BTreeSet<String> {
    architecture
        .lines()
        .filter_map(|line| line.strip_prefix("## "))
        .map(|title| title.trim().to_owned())
        .collect()
}

/// A section number (`7`, `7.3`) at the start of `text`, and its length.
fn section_number(text: &str) -> Option<(&str, usize)> {
    let end = text
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map_or(text.len(), |(at, _)| at);
    let number = text[..end].trim_end_matches('.');
    (!number.is_empty() && number.starts_with(|c: char| c.is_ascii_digit()))
        .then_some((number, end))
}

/// What a line cites by section: `(document, section)` pairs, and the
/// section signs that are part of no citation of a document in the
/// repository.
#[derive(Debug, Default)]
struct LineCitations {
    contract: Vec<String>,
    architecture: Vec<String>,
    stray: usize,
}

fn citations_in(line: &str) -> LineCitations {
    let mut found = LineCitations::default();
    let signs: Vec<usize> = line.match_indices(SECTION).map(|(at, _)| at).collect();
    let mut accounted = BTreeSet::new();
    // `docs/contract.md §7.3`, continued by `, §7.7` or `–§7.9`.
    let contract_lead = format!("{CONTRACT} {SECTION}");
    for (start, _) in line.match_indices(&contract_lead) {
        let mut at = start + contract_lead.len() - SECTION.len_utf8();
        loop {
            accounted.insert(at);
            let after = &line[at + SECTION.len_utf8()..];
            let Some((number, len)) = section_number(after) else {
                break;
            };
            found.contract.push(number.to_owned());
            let rest = &after[len..];
            let joiner = [", ", "\u{2013}", "-"]
                .into_iter()
                .find(|joiner| rest.starts_with(&format!("{joiner}{SECTION}")));
            match joiner {
                Some(joiner) => at += SECTION.len_utf8() + len + joiner.len(),
                None => break,
            }
        }
    }
    // `docs/architecture.md § The local backend` (the path may be quoted).
    for &at in &signs {
        if accounted.contains(&at) {
            continue;
        }
        let before = line[..at].trim_end().trim_end_matches('`');
        if before.ends_with(ARCHITECTURE) {
            accounted.insert(at);
            let title: String = line[at + SECTION.len_utf8()..]
                .chars()
                .take_while(|c| !matches!(c, '.' | ')' | ',' | ';' | ':'))
                .collect();
            found.architecture.push(title.trim().to_owned());
        }
    }
    found.stray = signs.iter().filter(|at| !accounted.contains(at)).count();
    found
}

#[test]
fn every_section_citation_names_a_section_that_exists() {
    let root = repo_root();
    let contract = std::fs::read_to_string(root.join(CONTRACT)).unwrap();
    let architecture = std::fs::read_to_string(root.join(ARCHITECTURE)).unwrap();
    let sections: BTreeSet<String> = contract_sections(&contract).into_iter().collect();
    let headings = architecture_headings(&architecture);
    assert!(
        sections.len() > 20,
        "{CONTRACT} has numbered sections: {sections:?}"
    );

    let mut problems = Vec::new();
    let mut cited = 0;
    for (path, text) in sources() {
        for (index, line) in text.lines().enumerate() {
            let at = format!("{path}:{}", index + 1);
            let citations = citations_in(line);
            for number in &citations.contract {
                cited += 1;
                if !sections.contains(number) {
                    problems.push(format!("{at}: {CONTRACT} has no {SECTION}{number}"));
                }
            }
            for title in &citations.architecture {
                cited += 1;
                if !headings.contains(title) {
                    problems.push(format!("{at}: {ARCHITECTURE} has no section '{title}'"));
                }
            }
            if citations.stray > 0 {
                problems.push(format!(
                    "{at}: a {SECTION} that cites neither {CONTRACT} by number nor \
                     {ARCHITECTURE} by heading: {}",
                    line.trim()
                ));
            }
        }
    }
    assert!(cited > 0, "no source cites {CONTRACT}; is the scan broken?");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_contract_numbers_each_section_once_and_its_own_references_resolve() {
    let contract = std::fs::read_to_string(repo_root().join(CONTRACT)).unwrap();
    let numbers = contract_sections(&contract);
    let unique: BTreeSet<&String> = numbers.iter().collect();
    assert_eq!(unique.len(), numbers.len(), "duplicate section numbers");
    let mut missing = Vec::new();
    for (at, _) in contract.match_indices(SECTION) {
        if let Some((number, _)) = section_number(&contract[at + SECTION.len_utf8()..])
            && !numbers.iter().any(|known| known == number)
        {
            missing.push(number.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "{CONTRACT} refers to sections it does not have: {missing:?}"
    );
}

#[test]
fn no_source_cites_a_document_outside_the_repository() {
    let bare = [
        format!("contract {SECTION}"),
        format!("design {SECTION}"),
        format!("spec {SECTION}"),
    ];
    let mut problems = Vec::new();
    for (path, text) in sources() {
        for (index, line) in text.lines().enumerate() {
            let named = OUTSIDE_DOCUMENTS
                .iter()
                .map(|name| name.to_string())
                .chain(bare.iter().cloned())
                .find(|name| line.contains(name.as_str()));
            if let Some(name) = named {
                problems.push(format!(
                    "{path}:{}: cites '{name}', which is not in the repository: {}",
                    index + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn citations_are_read_as_written() {
    let line = format!(
        "//! x ({CONTRACT} {SECTION}7.3, {SECTION}7.7) and ({CONTRACT} {SECTION}9.9\u{2013}{SECTION}9.14)."
    );
    let found = citations_in(&line);
    assert_eq!(found.contract, ["7.3", "7.7", "9.9", "9.14"]);
    assert_eq!(found.stray, 0);

    let found = citations_in(&format!(
        "See `{ARCHITECTURE}` {SECTION} The local backend."
    ));
    assert_eq!(found.architecture, ["The local backend"]);
    assert_eq!(found.stray, 0);

    let found = citations_in(&format!("(RFC 6455 {SECTION}7.4.1)"));
    assert_eq!(found.stray, 1);
    assert!(found.contract.is_empty());

    let found = citations_in(&format!("({CONTRACT} {SECTION}4)."));
    assert_eq!(found.contract, ["4"]);
}

/// Where a source path the documents name lives: `runner-core/src/…` is a
/// crate's (by its package name or its directory), `tools/…` and
/// `crates/…` are the repository's.
fn source_path_exists(path: &str) -> bool {
    let root = repo_root();
    let path = path.split("::").next().unwrap().trim_end_matches('/');
    let (krate, rest) = path.split_once("/src/").unwrap_or((path, ""));
    let dirs: Vec<String> = if krate.starts_with("crates/") || krate.starts_with("tools/") {
        vec![krate.to_owned()]
    } else {
        let short = krate
            .strip_prefix("runner-workspace-service")
            .map(|_| "workspace-service".to_owned())
            .or_else(|| {
                krate
                    .strip_prefix("runner-workspace")
                    .map(|_| "workspace".to_owned())
            })
            .unwrap_or_else(|| krate.to_owned());
        vec![format!("crates/{short}"), format!("tools/{short}")]
    };
    dirs.iter().any(|dir| {
        let full = if rest.is_empty() {
            root.join(dir)
        } else {
            root.join(dir).join("src").join(rest)
        };
        full.exists()
    })
}

/// The source paths a document names in backticks: a full one
/// (`runner-k8s/src/pod/labels.rs`) and, within the same parentheses, the
/// short ones after it (`status.rs`, `warm_pool/`), which live beside it or
/// below its crate's `src/` (either, as `beside|from-src`).
fn named_source_paths(document: &str) -> Vec<String> {
    let mut named = Vec::new();
    for group in document.split('(').skip(1) {
        let group = group.split(')').next().unwrap();
        let mut base: Option<String> = None;
        let mut beside: Option<String> = None;
        for (i, piece) in group.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            if piece.contains("/src/") && !piece.contains(' ') {
                let full = piece.split("::").next().unwrap();
                let dir = full.rsplit_once('/').map_or(full, |(dir, _)| dir);
                base = Some(format!("{}/src/", full.split("/src/").next().unwrap()));
                beside = Some(format!("{dir}/"));
                named.push(piece.to_owned());
            } else if let (Some(base), Some(beside)) = (&base, &beside) {
                let short = piece.split("::").next().unwrap();
                let is_path = (short.ends_with(".rs") || short.ends_with('/'))
                    && short
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c == '_' || c == '/' || c == '.');
                if is_path {
                    // Beside the full path, or from its crate's source root.
                    named.push(format!("{beside}{piece}|{base}{piece}"));
                }
            }
        }
    }
    named
}

/// The documents send a reader to files that exist: a module moved or
/// renamed is followed by the README and docs/ that name it.
#[test]
fn every_source_path_the_documents_name_exists() {
    let root = repo_root();
    let mut missing = Vec::new();
    for document in [
        "README.md",
        "docs/architecture.md",
        "docs/reliability.md",
        "docs/benchmarks.md",
        CONTRACT,
    ] {
        let text = std::fs::read_to_string(root.join(document)).unwrap();
        for path in named_source_paths(&text) {
            if !path.split('|').any(source_path_exists) {
                missing.push(format!("{document}: {path}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths named in the documents that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn short_paths_are_read_beside_the_full_one_before_them() {
    let named = named_source_paths(
        "x (`runner-k8s/src/pod/labels.rs`, `status.rs`, `warm_pool/`, `fn x`) and (`runner-core/src/registry.rs::hand_over`)",
    );
    assert_eq!(
        named,
        [
            "runner-k8s/src/pod/labels.rs",
            "runner-k8s/src/pod/status.rs|runner-k8s/src/status.rs",
            "runner-k8s/src/pod/warm_pool/|runner-k8s/src/warm_pool/",
            "runner-core/src/registry.rs::hand_over",
        ]
    );
    assert!(source_path_exists("runner-core/src/registry.rs::hand_over"));
    assert!(source_path_exists("runner-workspace/src/lib.rs"));
    assert!(!source_path_exists("runner-core/src/no_such_module.rs"));
}
