//! The README's configuration section is generated from the same tables as
//! `serve --help`, so the two cannot drift. Run with `UPDATE_README=1` to
//! rewrite the section after changing a variable.
#![allow(clippy::unwrap_used)]

const BEGIN: &str =
    "<!-- env:begin (generated from the configuration tables; see tests/readme.rs) -->";
const END: &str = "<!-- env:end -->";

#[test]
fn the_readme_documents_every_environment_variable_as_help_does() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme.find(BEGIN).expect("README has the env:begin marker") + BEGIN.len();
    let end = readme.find(END).expect("README has the env:end marker");
    let generated = telo_runner::cli::env_markdown();
    let current = &readme[start..end];
    if current.trim() == generated.trim() {
        return;
    }
    if std::env::var_os("UPDATE_README").is_some() {
        let updated = format!(
            "{}\n{}\n{}",
            &readme[..start],
            generated.trim(),
            &readme[end..]
        );
        std::fs::write(&path, updated).unwrap();
        return;
    }
    panic!(
        "README's configuration section is stale; run `UPDATE_README=1 cargo test -p telo-runner --test readme`"
    );
}
