//! The controllers a scripted application loads, and the kernel cache they
//! are kept in: what a real kernel's start spends its time on.
//!
//! The real kernel builds each `pkg:telo/local/js` controller from source
//! (esbuild) and installs each `pkg:npm` controller (npm) the first time it
//! loads it, keeping the result in its cache: `TELO_CACHE_DIR`, else `.telo/`
//! beside the entry manifest. A later load finds it there and costs next to
//! nothing. On a terminal it shows the work as it happens:
//!
//! ```text
//!   ⬇ telo:local/js#WritelineController source-build…
//!   ✓ telo:local/js#WritelineController (local, 57ms)
//! ```
//!
//! (the `✓` line drawn over the `⬇` one), and nothing when the cache had
//! it; off a terminal it prints nothing either way. fake-telo does the same
//! for the `controllers` a script lists, with the cold cost the script gives
//! (`coldMs`), so a test sees a cold start cost time and write the cache, and
//! a warm one not.
//!
//! The real kernel keys its npm install roots by where the cache sits
//! relative to the kernel's own packages (the install root's `package.json`
//! names them by relative `file:` paths), so a cache copied to another
//! depth misses its npm installs and installs again, while its source
//! builds, keyed by their sources, still hit. fake-telo keys an npm install
//! by the path from `<cache>/npm` to its own executable's directory, so the
//! same holds.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The variable that moves the kernel cache, as the real kernel reads it.
pub const CACHE_DIR_VAR: &str = "TELO_CACHE_DIR";

/// One controller the application loads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Controller {
    /// Its package URL as the kernel shortens it in progress lines
    /// (`telo:local/js#WritelineController`,
    /// `npm:@telorun/http-server@0.28.0#http-server-api`).
    pub purl: String,
    /// What a cold load does.
    #[serde(default)]
    pub work: Work,
    /// How long a cold load takes (a warm one takes no time).
    #[serde(default = "default_cold_ms")]
    pub cold_ms: u64,
}

fn default_cold_ms() -> u64 {
    50
}

/// The work a cold load does, named as the kernel names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Work {
    /// A `pkg:telo/local/js` controller built from its sources.
    #[default]
    SourceBuild,
    /// A `pkg:npm` controller installed into the cache's npm root.
    NpmInstall,
}

impl Work {
    fn label(self) -> &'static str {
        match self {
            Work::SourceBuild => "source-build",
            Work::NpmInstall => "npm-install",
        }
    }

    /// Where the kernel keeps a controller of this kind in its cache.
    fn cache_subdir(self) -> &'static str {
        match self {
            Work::SourceBuild => "controller-src",
            Work::NpmInstall => "npm",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot write the kernel cache at {}", path.display())]
pub struct CacheError {
    path: PathBuf,
    #[source]
    source: io::Error,
}

/// The kernel cache for `entry`: `TELO_CACHE_DIR` when set and not empty,
/// else `.telo/` in the entry manifest's directory.
pub fn cache_dir(entry: &Path, cache_var: Option<&str>) -> PathBuf {
    match cache_var.filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => entry
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .join(".telo"),
    }
}

/// The file that says the cache holds `controller`.
pub fn cache_entry(cache: &Path, controller: &Controller) -> PathBuf {
    let mut digest = Sha256::new();
    digest.update(controller.purl.as_bytes());
    if controller.work == Work::NpmInstall {
        digest.update(b"\0");
        digest.update(realm(cache).as_os_str().as_encoded_bytes());
    }
    let key = hex::encode(&digest.finalize()[..8]);
    let dir = cache.join(controller.work.cache_subdir()).join(key);
    match controller.work {
        Work::SourceBuild => dir.join("bundle.mjs"),
        Work::NpmInstall => dir.join(".telo-state.json"),
    }
}

/// Where the kernel's own packages are, seen from the cache's npm
/// directory: a relative path, as the real kernel's install root records
/// them.
fn realm(cache: &Path) -> PathBuf {
    let npm = std::path::absolute(cache.join("npm")).unwrap_or_else(|_| cache.join("npm"));
    let kernel = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    relative_path(&npm, &kernel)
}

/// The path from directory `from` to `to`, both absolute, without
/// touching the file system (`..` where they part, then the rest of `to`).
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    path
}

/// Loads every controller in order: a cold one costs its `coldMs` and is
/// written to the cache, a cached one is free. Progress lines go to stdout
/// when it is a terminal.
pub fn load(entry: &Path, controllers: &[Controller]) -> Result<(), CacheError> {
    if controllers.is_empty() {
        return Ok(());
    }
    let cache = cache_dir(entry, std::env::var(CACHE_DIR_VAR).ok().as_deref());
    let on_terminal = io::stdout().is_terminal();
    for controller in controllers {
        let marker = cache_entry(&cache, controller);
        if marker.is_file() {
            continue;
        }
        let started = Instant::now();
        if on_terminal {
            progress(&working_line(controller));
        }
        thread::sleep(Duration::from_millis(controller.cold_ms));
        write_marker(&marker, controller)?;
        if on_terminal {
            // The kernel draws the finished line over the working one.
            progress(&format!(
                "\x1b[1A\x1b[1G\x1b[2K{}",
                done_line(controller, started.elapsed())
            ));
        }
    }
    Ok(())
}

/// `  ⬇ <purl> <work>…`
pub fn working_line(controller: &Controller) -> String {
    format!("  ⬇ {} {}…", controller.purl, controller.work.label())
}

/// `  ✓ <purl> (local, <ms>ms)`, or seconds with one decimal from 1 s.
pub fn done_line(controller: &Controller, took: Duration) -> String {
    let millis = took.as_millis();
    let took = if millis >= 1000 {
        format!("{:.1}s", took.as_secs_f64())
    } else {
        format!("{millis}ms")
    };
    format!("  ✓ {} (local, {took})", controller.purl)
}

fn progress(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn write_marker(marker: &Path, controller: &Controller) -> Result<(), CacheError> {
    let error = |source| CacheError {
        path: marker.to_path_buf(),
        source,
    };
    if let Some(dir) = marker.parent() {
        std::fs::create_dir_all(dir).map_err(error)?;
    }
    std::fs::write(marker, format!("{}\n", controller.purl)).map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(purl: &str, work: Work) -> Controller {
        Controller {
            purl: purl.to_owned(),
            work,
            cold_ms: 0,
        }
    }

    #[test]
    fn the_cache_is_telo_cache_dir_else_beside_the_entry() {
        assert_eq!(
            cache_dir(Path::new("/app/telo.yaml"), Some("/cache")),
            PathBuf::from("/cache")
        );
        assert_eq!(
            cache_dir(Path::new("/app/telo.yaml"), Some("")),
            PathBuf::from("/app/.telo")
        );
        assert_eq!(
            cache_dir(Path::new("telo.yaml"), None),
            PathBuf::from("./.telo")
        );
    }

    #[test]
    fn source_builds_and_npm_installs_live_where_the_kernel_keeps_them() {
        let build = cache_entry(
            Path::new("/c"),
            &controller("telo:local/js#Say", Work::SourceBuild),
        );
        assert!(build.starts_with("/c/controller-src"), "{build:?}");
        assert!(build.ends_with("bundle.mjs"), "{build:?}");
        let install = cache_entry(
            Path::new("/c"),
            &controller("npm:@telorun/http-server@0.28.0#api", Work::NpmInstall),
        );
        assert!(install.starts_with("/c/npm"), "{install:?}");
    }

    #[test]
    fn a_relative_path_climbs_to_where_the_two_part() {
        assert_eq!(
            relative_path(Path::new("/w/cache/npm"), Path::new("/opt/telo/bin")),
            PathBuf::from("../../../opt/telo/bin")
        );
        assert_eq!(
            relative_path(Path::new("/opt/cache/npm"), Path::new("/opt/telo")),
            PathBuf::from("../../telo")
        );
    }

    #[test]
    fn progress_lines_read_as_the_kernels() {
        let say = controller("telo:local/js#Say", Work::SourceBuild);
        assert_eq!(working_line(&say), "  ⬇ telo:local/js#Say source-build…");
        assert_eq!(
            done_line(&say, Duration::from_millis(57)),
            "  ✓ telo:local/js#Say (local, 57ms)"
        );
        let npm = controller("npm:x@1#y", Work::NpmInstall);
        assert_eq!(working_line(&npm), "  ⬇ npm:x@1#y npm-install…");
        assert_eq!(
            done_line(&npm, Duration::from_millis(1300)),
            "  ✓ npm:x@1#y (local, 1.3s)"
        );
    }
}
