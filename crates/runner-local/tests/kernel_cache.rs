//! The kernel cache Telo sessions start from: what one session's kernel
//! writes there stays that session's, counts against its disk bound and goes
//! with it.
//!
//! The kernel here is a shell script standing in for a hostile application
//! (a real Telo app's `JavaScript.Script` can write any file its kernel can):
//! it plants a controller bundle in `$TELO_CACHE_DIR`, looks for one, or
//! fills the cache.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};

use runner_api::telo::TeloVersion;
use runner_core::types::RunStatus;
use runner_local::kernel::cache_warm_up::WarmUpError;
use support::{Events, Harness, bundle_spec, limits, output_now, with_env};
use tempfile::TempDir;

/// Passes the self-check (no variable set); otherwise does what the
/// session's env asks of it.
const HOSTILE_KERNEL: &str = r#"#!/bin/sh
planted="$TELO_CACHE_DIR/controller-src/planted/bundle.mjs"
if [ -n "$PLANT" ]; then
  mkdir -p "$(dirname "$planted")" && head -c 262144 /dev/urandom > "$planted" && echo planted
fi
if [ -n "$LOOK" ]; then
  if [ -e "$planted" ]; then echo "found the planted bundle"; else echo "no planted bundle"; fi
fi
if [ -n "$FILL" ]; then
  mkdir -p "$TELO_CACHE_DIR"
  for i in 1 2 3 4 5 6; do head -c 524288 /dev/urandom > "$TELO_CACHE_DIR/fill$i"; done
  echo filled
  exec sleep 30
fi
exit 0
"#;

struct HostileKernel {
    dir: TempDir,
}

impl HostileKernel {
    fn new() -> Self {
        let kernel = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        support::install_script(&kernel.telo(), HOSTILE_KERNEL);
        kernel
    }

    fn telo(&self) -> PathBuf {
        self.dir.path().join("telo")
    }

    fn harness(&self, adjust: impl FnOnce(&mut runner_local::LocalConfig)) -> Harness {
        let telo = self.telo().to_string_lossy().into_owned();
        Harness::with(
            move |c| {
                c.telo = telo;
                c.path = "/usr/bin:/bin".to_owned();
                adjust(c);
            },
            limits(),
        )
    }
}

/// Every file under `dir`, with its size.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                files.push((entry.path(), meta.len()));
            }
        }
    }
    files
}

async fn run_to_end(harness: &Harness, env: &[(&str, &str)]) -> (RunStatus, String) {
    let session = harness.start(with_env(bundle_spec(serde_json::Value::Null), env));
    let status = Events::of(&session).terminal().await;
    (status, output_now(&session))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_one_session_plants_in_its_kernel_cache_reaches_no_later_session() {
    let kernel = HostileKernel::new();
    let harness = kernel.harness(|_| {});
    let (status, output) = run_to_end(&harness, &[("PLANT", "1")]).await;
    assert_eq!(status, RunStatus::Exited { code: 0 });
    assert_eq!(output, "planted\r\n");

    let (status, output) = run_to_end(&harness, &[("LOOK", "1")]).await;
    assert_eq!(status, RunStatus::Exited { code: 0 });
    assert_eq!(output, "no planted bundle\r\n");

    // Nor is any trace of it left where the runner keeps what sessions
    // share.
    let shared = harness.config.work_root.join(".kernel-cache");
    let traces: Vec<(PathBuf, u64)> = files_under(&shared)
        .into_iter()
        .filter(|(path, len)| path.to_string_lossy().contains("planted") || *len >= 262_144)
        .collect();
    assert!(traces.is_empty(), "the shared cache holds {traces:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_session_writes_into_its_kernel_cache_counts_against_its_disk_bound() {
    let kernel = HostileKernel::new();
    let harness = kernel.harness(|c| c.limits.disk_bytes = 1 << 20);
    let (status, output) = run_to_end(&harness, &[("FILL", "1")]).await;
    assert_eq!(
        status,
        RunStatus::failed(
            "the session's directory grew past its disk bound of 1 MiB (RUNNER_LOCAL_MAX_DISK) and the session was stopped"
        ),
        "{output:?}"
    );
}

/// What the warm-up and the sessions below load: a source build and an npm
/// install (whose cache entry depends on where the cache is seen).
const CONTROLLERS: &str = r#"[
  { "purl": "telo:local/js#WritelineController", "coldMs": 1 },
  { "purl": "npm:@telorun/http-server@0.28.0#http-server-api", "work": "npmInstall", "coldMs": 1 }
]"#;

/// A warm-up manifest for fake-telo: loads `controllers`, then exits with
/// `exit_code`.
fn warm_up_manifest(dir: &Path, controllers: &str, exit_code: u8) -> PathBuf {
    let path = dir.join("warm-up.yaml");
    std::fs::write(
        &path,
        format!(
            "kind: Telo.Application\nmetadata: {{ name: WarmUp }}\nfakeTelo: {{ controllers: {}, exitCode: {exit_code} }}\n",
            controllers.replace('\n', " ")
        ),
    )
    .unwrap();
    path
}

fn controllers_spec(extra: &[&str]) -> serde_json::Value {
    let mut controllers: Vec<serde_json::Value> = serde_json::from_str(CONTROLLERS).unwrap();
    controllers.extend(
        extra
            .iter()
            .map(|purl| serde_json::json!({ "purl": purl, "coldMs": 1 })),
    );
    serde_json::json!({ "controllers": controllers, "stdout": ["app output"] })
}

/// Every file under `dir` with its size and modification time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut files: Vec<_> = files_under(dir)
        .into_iter()
        .map(|(path, len)| {
            let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
            (path, len, modified)
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_start_warm_from_the_runners_cache_and_never_change_it() {
    let config = tempfile::tempdir().unwrap();
    let manifest = warm_up_manifest(config.path(), CONTROLLERS, 0);
    let harness = Harness::with(|c| c.kernel_cache.warm_up = Some(manifest), limits());
    let key = harness.backend.warm_kernel_cache(None).await.unwrap();
    let entry = harness
        .config
        .work_root
        .join(".kernel-cache")
        .join(key.as_str());
    let before = snapshot(&entry);
    assert_eq!(before.len(), 2, "{before:?}");

    // Everything it loads was warmed: no progress line on its terminal.
    let session = harness.start(bundle_spec(controllers_spec(&[])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert_eq!(output_now(&session), "app output\r\n");

    // One more controller: built into the session's own copy only.
    let session = harness.start(bundle_spec(controllers_spec(&["telo:local/js#Extra"])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    let output = output_now(&session);
    assert!(
        output.contains("⬇ telo:local/js#Extra source-build…")
            && !output.contains("WritelineController")
            && !output.contains("npm-install"),
        "{output:?}"
    );
    assert_eq!(snapshot(&entry), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_starts_before_the_warm_up_is_cold_and_starts_it() {
    let config = tempfile::tempdir().unwrap();
    let manifest = warm_up_manifest(config.path(), CONTROLLERS, 0);
    // A kernel chosen by version: no boot warm-up for it.
    let versions = tempfile::tempdir().unwrap();
    install_fake_telo(versions.path(), "1.0.0");
    let versions_dir = versions.path().to_owned();
    let harness = Harness::with(
        |c| {
            c.kernel_cache.warm_up = Some(manifest);
            c.telo_versions = Some(versions_dir);
        },
        limits(),
    );
    let cache = harness.config.work_root.join(".kernel-cache");
    let mut spec = bundle_spec(controllers_spec(&[]));
    spec.telo = Some("1.0.0".to_owned());
    let session = harness.start(spec.clone());
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert!(output_now(&session).contains("source-build"));
    // The warm-up it started: the next session of that kernel is warm.
    let version = TeloVersion::parse("1.0.0").unwrap();
    let key = harness
        .backend
        .warm_kernel_cache(Some(&version))
        .await
        .unwrap();
    assert!(cache.join(key.as_str()).is_dir());
    let session = harness.start(spec);
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    assert_eq!(output_now(&session), "app output\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_warm_up_is_never_used() {
    let config = tempfile::tempdir().unwrap();
    // The kernel fills the cache, then fails.
    let manifest = warm_up_manifest(config.path(), CONTROLLERS, 1);
    // And a previous runner died mid-warm-up, and sessions once wrote here
    // when this was their shared cache.
    let leftovers = [
        ".warming-kernel-unversioned-0123456789abcdef-9-0/telo/controller-src/x/bundle.mjs",
        "telo/controller-src/planted/bundle.mjs",
        "npm/_cacache/index",
    ];
    let harness = Harness::with(
        |c| {
            c.kernel_cache.warm_up = Some(manifest);
            for leftover in leftovers {
                let path = c.work_root.join(".kernel-cache").join(leftover);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, "left").unwrap();
            }
        },
        limits(),
    );
    let cache = harness.config.work_root.join(".kernel-cache");
    let err = harness.backend.warm_kernel_cache(None).await.unwrap_err();
    assert!(
        matches!(err, WarmUpError::Failed { code: 1, .. }),
        "{err:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let session = harness.start(bundle_spec(controllers_spec(&[])));
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    let output = output_now(&session);
    assert!(
        output.contains("⬇ telo:local/js#WritelineController source-build…"),
        "{output:?}"
    );
}

/// A kernel script for the bound's test: its warm-up (an entry that says
/// `warm-up`) caches 64 KiB.
const SIZED_KERNEL: &str = "#!/bin/sh\nif grep -q warm-up telo.yaml 2>/dev/null; then head -c 65536 /dev/urandom > \"$TELO_CACHE_DIR/warm.bin\"; fi\nexit 0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warmed_caches_stay_under_their_bound_evicting_the_least_recently_used() {
    let config = tempfile::tempdir().unwrap();
    let manifest = config.path().join("warm-up.yaml");
    std::fs::write(
        &manifest,
        "kind: Telo.Application\nmetadata: { name: warm-up }\n",
    )
    .unwrap();
    let versions = tempfile::tempdir().unwrap();
    let names = ["1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0"];
    for name in names {
        let bin = versions.path().join(name).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        support::install_script(&bin.join("telo"), SIZED_KERNEL);
    }
    // Room for two entries of ~72 KiB (the file and two directories), not
    // three.
    const BOUND: u64 = 160 << 10;
    let versions_dir = versions.path().to_owned();
    let harness = Harness::with(
        |c| {
            c.kernel_cache.warm_up = Some(manifest);
            c.kernel_cache.max_bytes = BOUND;
            c.telo_versions = Some(versions_dir);
            // Only the kernels chosen by version below: no configured one
            // whose boot warm-up would take room too.
            c.telo = "/nonexistent/telo".to_owned();
        },
        limits(),
    );
    let cache = harness.config.work_root.join(".kernel-cache");
    let entries = || {
        let mut names: Vec<String> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let total = || -> u64 { runner_local::disk_bound::usage(&cache) };
    let warm = |name: &str| {
        let version = TeloVersion::parse(name).unwrap();
        let backend = harness.backend.clone();
        async move { backend.warm_kernel_cache(Some(&version)).await.unwrap() }
    };
    let first = warm("1.0.0").await;
    let second = warm("2.0.0").await;
    assert_eq!(entries(), [first.to_string(), second.to_string()]);
    // A session started from the first makes it the most recently used.
    let mut spec = bundle_spec(serde_json::Value::Null);
    spec.telo = Some("1.0.0".to_owned());
    let session = harness.start(spec);
    assert_eq!(
        Events::of(&session).terminal().await,
        RunStatus::Exited { code: 0 }
    );
    let third = warm("3.0.0").await;
    assert_eq!(entries(), [first.to_string(), third.to_string()]);
    assert!(total() <= BOUND, "{} bytes", total());
    // Many more kernels: never past the bound, the newest kept.
    for name in &names[3..] {
        let key = warm(name).await;
        assert!(entries().contains(&key.to_string()), "{:?}", entries());
        assert_eq!(entries().len(), 2, "{:?}", entries());
        assert!(total() <= BOUND, "{} bytes", total());
    }
}

/// `<versions>/<name>/bin/telo`, running fake-telo.
fn install_fake_telo(versions: &Path, name: &str) {
    let bin = versions.join(name).join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(test_support::fake_telo::fake_telo_path(), bin.join("telo"))
        .unwrap();
}
