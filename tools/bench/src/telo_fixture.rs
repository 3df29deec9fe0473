//! The real Telo kernel, where one is given (telo-runner ships none): where
//! it is, and the example apps rendered into session bundles.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// What the fixture's examples import modules through; replaced with the
/// installed `modules/` directory before a bundle is sent.
pub const MODULES_PLACEHOLDER: &str = "@TELO_MODULES@";

/// Names a Telo CLI layout (`bin/telo`, `modules/`).
pub const KERNEL_DIR_ENV: &str = "TELO_REAL_KERNEL_DIR";

/// The installed kernel: its `bin/telo` wrapper and its std modules.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub telo: PathBuf,
    pub modules: PathBuf,
}

/// `bin/telo` under `$TELO_REAL_KERNEL_DIR`; nothing when it is unset or
/// empty (there is no default kernel).
pub fn default_telo_path(kernel_dir: Option<&str>) -> Option<PathBuf> {
    kernel_dir
        .filter(|d| !d.is_empty())
        .map(|dir| Path::new(dir).join("bin/telo"))
}

/// The repository's copy of the fixture (`<workspace>/../shared/telo`).
pub fn fixture_source_dir() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // tools/bench → the workspace → the directory holding it.
    let beside_workspace = crate_dir
        .ancestors()
        .nth(3)
        .unwrap_or_else(|| Path::new("/"));
    beside_workspace.join("shared/telo")
}

pub fn default_examples_dir() -> PathBuf {
    fixture_source_dir().join("examples")
}

fn install_hint() -> String {
    format!(
        "telo-runner ships no Telo CLI: set {KERNEL_DIR_ENV} to a Telo CLI layout you have \
         (bin/telo, modules/; ../shared/telo/install.sh lays one out from a build), or pass \
         --telo <path>"
    )
}

impl Kernel {
    /// The kernel at `telo` (default: [`default_telo_path`]) with the
    /// `modules/` installed beside its `bin/`.
    pub fn locate(telo: Option<&Path>) -> anyhow::Result<Kernel> {
        let telo = match telo {
            Some(path) => path.to_path_buf(),
            None => default_telo_path(std::env::var(KERNEL_DIR_ENV).ok().as_deref())
                .with_context(|| format!("no real Telo kernel given; {}", install_hint()))?,
        };
        if !telo.is_file() {
            bail!(
                "the real Telo kernel is not installed: {} does not exist; {}",
                telo.display(),
                install_hint()
            );
        }
        let modules = telo
            .parent()
            .and_then(Path::parent)
            .map(|dir| dir.join("modules"))
            .filter(|m| m.is_dir())
            .with_context(|| {
                format!(
                    "no modules/ directory beside the bin/ of {}; {}",
                    telo.display(),
                    install_hint()
                )
            })?;
        Ok(Kernel { telo, modules })
    }
}

/// One file of a session bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    pub relative_path: String,
    pub contents: String,
}

/// An example's text with its module imports pointing at `modules`.
pub fn render(text: &str, modules: &Path) -> String {
    text.replace(MODULES_PLACEHOLDER, &modules.display().to_string())
}

/// Every file of the example `dir` (minus the kernel's `.telo/` cache and
/// `node_modules/`), rendered for `modules`, in path order.
pub fn load_example(dir: &Path, modules: &Path) -> anyhow::Result<Vec<BundleFile>> {
    if !dir.join("telo.yaml").is_file() {
        bail!(
            "{} is not a Telo example (no telo.yaml); pass --examples <dir of the fixture's examples>",
            dir.display()
        );
    }
    let mut files = Vec::new();
    collect(dir, "", modules, &mut files)?;
    files.sort_by(|a, b| a.relative_path.cmp(&b.relative_path));
    Ok(files)
}

fn collect(
    dir: &Path,
    prefix: &str,
    modules: &Path,
    files: &mut Vec<BundleFile>,
) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == ".telo" || name == "node_modules" {
            continue;
        }
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect(&path, &relative, modules, files)?;
        } else {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            files.push(BundleFile {
                relative_path: relative,
                contents: render(&text, modules),
            });
        }
    }
    Ok(())
}

/// Writes the bundle's files under `dir`, as the runner stages them.
pub fn write_bundle(files: &[BundleFile], dir: &Path) -> anyhow::Result<()> {
    for file in files {
        let path = dir.join(&file.relative_path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &file.contents)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// What a session is started with, beside its bundle.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    pub image: String,
    pub env: Vec<(String, String)>,
    pub tcp_ports: Vec<u16>,
    pub inspect: bool,
}

/// The `POST /v1/sessions` body for a bundle whose entry is `telo.yaml`.
pub fn session_body(files: &[BundleFile], options: &SessionOptions) -> Value {
    let files: Vec<Value> = files
        .iter()
        .map(|f| json!({ "relativePath": f.relative_path, "contents": f.contents }))
        .collect();
    let env: serde_json::Map<String, Value> = options
        .env
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let ports: Vec<Value> = options
        .tcp_ports
        .iter()
        .map(|port| json!({ "port": port, "protocol": "tcp" }))
        .collect();
    json!({
        "bundle": { "entryRelativePath": "telo.yaml", "files": files },
        "env": env,
        "ports": ports,
        "config": { "image": options.image, "pullPolicy": "missing" },
        "inspect": options.inspect,
    })
}

/// Terminal output as plain text (escape sequences and carriage returns
/// removed), so a line can be found in what a PTY relayed: the same reading
/// the runner's kernel self-check uses.
pub use runner_local::process::check_run::strip_ansi;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kernel_dir_variable_names_a_kernel() {
        assert_eq!(
            default_telo_path(Some("/opt/telo")),
            Some(PathBuf::from("/opt/telo/bin/telo"))
        );
        assert_eq!(default_telo_path(Some("")), None);
        assert_eq!(default_telo_path(None), None);
    }

    #[test]
    fn a_missing_kernel_names_the_installer() {
        let err = Kernel::locate(Some(Path::new("/nonexistent/bin/telo"))).unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("/nonexistent/bin/telo does not exist"),
            "{text}"
        );
        assert!(text.contains("set TELO_REAL_KERNEL_DIR"), "{text}");
    }

    #[test]
    fn every_placeholder_is_replaced_with_the_modules_dir() {
        let text =
            "imports:\n  Http: \"@TELO_MODULES@/http-server\"\n  Run: \"@TELO_MODULES@/run\"\n";
        let rendered = render(text, Path::new("/k/modules"));
        assert_eq!(
            rendered,
            "imports:\n  Http: \"/k/modules/http-server\"\n  Run: \"/k/modules/run\"\n"
        );
    }

    #[test]
    fn an_example_is_loaded_rendered_without_the_kernel_cache() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("telo.yaml"), "x: @TELO_MODULES@/console\n").unwrap();
        std::fs::create_dir_all(dir.path().join("modules/console")).unwrap();
        std::fs::write(dir.path().join("modules/console/telo.yaml"), "y\n").unwrap();
        std::fs::create_dir_all(dir.path().join(".telo")).unwrap();
        std::fs::write(dir.path().join(".telo/cache"), "z").unwrap();
        let files = load_example(dir.path(), Path::new("/m")).unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.relative_path.as_str()).collect();
        assert_eq!(paths, ["modules/console/telo.yaml", "telo.yaml"]);
        assert_eq!(files[1].contents, "x: /m/console\n");

        let out = tempfile::tempdir().unwrap();
        write_bundle(&files, out.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(out.path().join("modules/console/telo.yaml")).unwrap(),
            "y\n"
        );
    }

    #[test]
    fn the_session_body_carries_env_ports_and_inspect() {
        let files = [BundleFile {
            relative_path: "telo.yaml".into(),
            contents: "kind: Telo.Application\n".into(),
        }];
        let body = session_body(
            &files,
            &SessionOptions {
                image: "local".into(),
                env: vec![("PORT".into(), "8123".into())],
                tcp_ports: vec![8123],
                inspect: false,
            },
        );
        assert_eq!(
            body,
            json!({
                "bundle": {
                    "entryRelativePath": "telo.yaml",
                    "files": [{"relativePath": "telo.yaml", "contents": "kind: Telo.Application\n"}],
                },
                "env": {"PORT": "8123"},
                "ports": [{"port": 8123, "protocol": "tcp"}],
                "config": {"image": "local", "pullPolicy": "missing"},
                "inspect": false,
            })
        );
    }

    #[test]
    fn colour_and_title_sequences_are_stripped() {
        let text =
            "\u{1b}[32m✓\u{1b}[0m Hello \u{1b}]0;title\u{7}from \u{1b}[1;2mTelo!\u{1b}[K\r\n";
        assert_eq!(strip_ansi(text), "✓ Hello from Telo!\n");
    }
}
