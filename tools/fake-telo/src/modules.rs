//! The standard modules a manifest imports, and the controllers their
//! resources load: what the real kernel's `telo run` and `telo install`
//! spend their time on.
//!
//! The real kernel (0.81) resolves `imports:` (an alias per module, the
//! module by path: `Http: "/opt/telo/modules/http-server"`) and loads a
//! controller when the application declares a resource of one of its kinds
//! (`kind: Run.Value`) or invokes one of its exports (`!ref
//! Console.writeLine`); a module imported and never used costs next to
//! nothing. `telo install <manifest>` instead fetches every controller of
//! every imported module into the kernel cache: a `pkg:npm` one is
//! installed, a `pkg:telo/local/js` one fails with "bundle not found" (they
//! are built from source at run time only), so an install of the standard
//! modules exits 1 with its npm controllers installed all the same.
//!
//! fake-telo knows the modules the runner's tests use, each with the
//! controllers and cold costs measured on the real kernel: those are the
//! modules its "image" ships, wherever it is said to keep them. Another
//! module imported by path must be a directory (relative to the entry's),
//! as the real kernel reads it from there, and has no controllers; one
//! that is not there fails the start (`module not found`). An import from
//! a registry (`…@<version>`, or a URL) is not checked.

use std::path::Path;

use serde_yaml_ng::Value;

use crate::controllers::{Controller, Work};

/// One controller of a standard module, and the kinds (or exports) that
/// load it, matched without regard to case (`Console.writeLine` is an
/// instance of `Console.WriteLine`).
struct StdController {
    purl: &'static str,
    work: Work,
    cold_ms: u64,
    kinds: &'static [&'static str],
}

/// The standard modules fake-telo models, by directory name.
const MODULES: &[(&str, &[StdController])] = &[
    (
        "http-server",
        &[StdController {
            purl: "npm:@telorun/http-server@0.28.0#http-server-api",
            work: Work::NpmInstall,
            cold_ms: 1200,
            kinds: &["Server", "Api"],
        }],
    ),
    (
        "run",
        &[StdController {
            purl: "telo:local/js#Value",
            work: Work::SourceBuild,
            cold_ms: 45,
            kinds: &["Value"],
        }],
    ),
    (
        "console",
        &[StdController {
            purl: "telo:local/js#WritelineController",
            work: Work::SourceBuild,
            cold_ms: 55,
            kinds: &["WriteLine"],
        }],
    ),
    (
        "javascript",
        &[StdController {
            purl: "telo:local/js#Script",
            work: Work::SourceBuild,
            cold_ms: 15,
            kinds: &["Script"],
        }],
    ),
];

impl StdController {
    fn controller(&self) -> Controller {
        Controller {
            purl: self.purl.to_owned(),
            work: self.work,
            cold_ms: self.cold_ms,
        }
    }
}

/// What a manifest imports and uses of the standard modules.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Analysis {
    /// Every controller of every imported module (what `install` fetches).
    pub imported: Vec<Controller>,
    /// The controllers its resources and targets load (what `run` loads).
    pub used: Vec<Controller>,
}

/// The module an import names: the last part of its path, without a
/// version (`…/http-server`, `std/http-server@0.28.0`).
fn module_of(source: &str) -> Option<&'static [StdController]> {
    let last = source.trim_end_matches('/').rsplit('/').next()?;
    let name = last.split('@').next().unwrap_or(last);
    MODULES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, controllers)| *controllers)
}

fn push_unique(list: &mut Vec<Controller>, controller: Controller) {
    if !list.iter().any(|c| c.purl == controller.purl) {
        list.push(controller);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error("entry is not valid YAML")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("module not found: {0}")]
    ModuleNotFound(String),
}

/// Whether an import names a module on disk (not a registry or a URL).
fn is_path(source: &str) -> bool {
    !source.contains("://") && !source.contains('@')
}

/// Reads `manifest`'s imports, resources and targets; `base` is the
/// directory relative imports start from (the entry's).
pub fn analyse(manifest: &str, base: &Path) -> Result<Analysis, AnalysisError> {
    use serde::Deserialize;
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(manifest) {
        documents.push(Value::deserialize(document)?);
    }
    let mut aliases: Vec<(String, &'static [StdController])> = Vec::new();
    let mut targets: Vec<&Value> = Vec::new();
    for document in &documents {
        if let Some(imports) = document.get("imports").and_then(Value::as_mapping) {
            for (alias, source) in imports {
                let (Some(alias), Some(source)) = (alias.as_str(), source.as_str()) else {
                    continue;
                };
                match module_of(source) {
                    Some(module) => aliases.push((alias.to_owned(), module)),
                    None if is_path(source) && !base.join(source).is_dir() => {
                        return Err(AnalysisError::ModuleNotFound(source.to_owned()));
                    }
                    None => {}
                }
            }
        }
        if let Some(list) = document.get("targets").and_then(Value::as_sequence) {
            targets.extend(list);
        }
    }
    let mut analysis = Analysis::default();
    for (_, module) in &aliases {
        for controller in *module {
            push_unique(&mut analysis.imported, controller.controller());
        }
    }
    let lookup = |reference: &str| -> Option<Controller> {
        let (alias, kind) = reference.split_once('.')?;
        let (_, module) = aliases.iter().find(|(known, _)| known == alias)?;
        module
            .iter()
            .find(|c| c.kinds.iter().any(|k| k.eq_ignore_ascii_case(kind)))
            .map(StdController::controller)
    };
    for document in &documents {
        if let Some(controller) = document
            .get("kind")
            .and_then(Value::as_str)
            .and_then(lookup)
        {
            push_unique(&mut analysis.used, controller);
        }
    }
    for target in targets {
        let reference = match target.get("invoke") {
            Some(Value::Tagged(tagged)) if tagged.tag == "ref" => tagged.value.as_str(),
            _ => None,
        };
        if let Some(controller) = reference.and_then(lookup) {
            push_unique(&mut analysis.used, controller);
        }
    }
    Ok(analysis)
}

/// The manifest a path names: the file, or `telo.yaml` in a directory.
pub fn entry_file(path: &str) -> std::path::PathBuf {
    let path = Path::new(path);
    if path.is_dir() {
        path.join("telo.yaml")
    } else {
        path.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WARM_UP: &str = r#"
kind: Telo.Application
metadata: { name: WarmUp, version: 1.0.0 }
imports:
  Http: "/opt/telo/modules/http-server"
  Run: "/opt/telo/modules/run"
  Console: "/opt/telo/modules/console/"
  Other: "/opt/telo/modules/sqlite"
targets:
  - invoke: !ref Console.writeLine
    inputs: { output: "" }
  - invoke: !ref warmValue
---
kind: Run.Value
metadata: { name: warmValue }
value: {}
"#;

    fn purls(list: &[Controller]) -> Vec<&str> {
        list.iter().map(|c| c.purl.as_str()).collect()
    }

    #[test]
    fn imports_name_modules_and_resources_load_their_controllers() {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir(base.path().join("sqlite")).unwrap();
        let warm_up = WARM_UP.replace("/opt/telo/modules/sqlite", "./sqlite");
        let analysis = analyse(&warm_up, base.path()).unwrap();
        assert_eq!(
            purls(&analysis.imported),
            [
                "npm:@telorun/http-server@0.28.0#http-server-api",
                "telo:local/js#Value",
                "telo:local/js#WritelineController",
            ]
        );
        assert_eq!(
            purls(&analysis.used),
            ["telo:local/js#Value", "telo:local/js#WritelineController"]
        );
    }

    #[test]
    fn a_module_imported_and_never_used_loads_nothing() {
        let here = Path::new(".");
        let analysis = analyse(
            "kind: Telo.Application\nimports:\n  Http: \"std/http-server@0.28.0\"\n",
            here,
        )
        .unwrap();
        assert_eq!(purls(&analysis.imported).len(), 1);
        assert!(analysis.used.is_empty());
        assert_eq!(analyse("", here).unwrap(), Analysis::default());
    }

    #[test]
    fn a_module_that_is_not_there_is_not_found() {
        let error = analyse(
            "imports:\n  X: \"/opt/telo/modules/no-such-module\"\n",
            Path::new("/"),
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "module not found: /opt/telo/modules/no-such-module"
        );
        // A registry import is the registry's business.
        assert!(analyse("imports:\n  X: \"std/other@1.0.0\"\n", Path::new("/")).is_ok());
    }
}
