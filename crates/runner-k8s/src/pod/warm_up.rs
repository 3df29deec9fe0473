//! Warming a warm pod's kernel cache before the pod is offered.
//!
//! A session's kernel spends its start loading controllers: a `pkg:npm` one
//! is `npm install`ed (1-3 s for `http-server`), a `pkg:telo/local/js` one
//! is built from its sources (25-160 ms each), each into the kernel cache
//! (`TELO_CACHE_DIR`, the pod's own `telo-cache` volume). A warm pod does
//! that work before any session claims it: its `warm-up` init container
//! runs the pod's kernel image, with the `session` container's environment
//! and volumes, on a manifest importing the pool's modules
//! (`RUNNER_WARM_POOL_MODULES`):
//!
//! - `telo install` installs every `pkg:npm` controller of the imported
//!   modules (the real kernel exits 1 here, as it cannot fetch the
//!   source-built ones: they are built at run time; that is expected);
//! - `telo run` of the same manifest, which declares one resource of each
//!   module whose controller is built from source and exits, builds those.
//!
//! The pod only runs (and so only becomes claimable) once the init
//! container has ended. The cache is the pod's `emptyDir`: made in the pod,
//! used by the one session that claims it, gone with the pod.
//!
//! The modules are imported from the kernel image's `TELO_MODULES`
//! directory, where sessions import them from, so the npm install roots
//! (keyed by the path from the cache to the module) are the ones a
//! session's kernel looks for; the cache sits where the session's kernel
//! has it (`TELO_CACHE_DIR`).
//!
//! A warm-up that fails (no `TELO_MODULES` in the image, a module it does
//! not ship, a kernel that cannot run the manifest) does not fail the pod:
//! the init container says so on its last log line and ends well, and the
//! pod is offered with whatever its cache holds. The runner reads that line
//! once, as the pod becomes ready, logs a failure and counts both outcomes
//! (`telo_runner_warm_pool_warm_ups_total`). A pool whose warm-up always
//! fails is as useful as one without: its sessions start on running pods
//! and pay the cold loads, as cold pods do.

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Api;
use kube::api::LogParams;
use runner_core::types::PullPolicy;

use crate::pod::spec::{
    Resources, SESSION_RUNNER_ENV, TMP_MOUNT, WORK_DIR, env_var, hardened_container_security,
    pull_policy_to_k8s, resource_requirements, run_session_mounts,
};

/// The init container that warms the kernel cache.
pub const WARM_UP_CONTAINER: &str = "warm-up";
/// What the warm-up's last log line starts with.
pub const OUTCOME_PREFIX: &str = "telo-runner warm-up: ";
/// Where the warm-up manifest is written, and removed from once done.
const WARM_UP_DIR: &str = "telo-warm-up";
/// The longest each of the warm-up's kernel runs may take (where the image
/// has `timeout`): a hung one must not keep its pod from the pool for good.
pub const STEP_TIMEOUT_SECONDS: u32 = 300;

/// How a warm-up ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The configured modules' controllers are in the cache.
    Warm,
    /// It failed, for this reason; the pod is offered with a cold cache.
    Cold(String),
}

/// A module's alias in the warm-up manifest: its name in camel case
/// (`http-server` → `HttpServer`).
fn alias(module: &str) -> String {
    module
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

/// What the warm-up declares of a module whose controllers are built from
/// source, so its `telo run` builds them: targets, then resources. A
/// module not listed is imported only (`telo install` covers its `pkg:npm`
/// controllers; a source-built one is then built by the session).
fn uses(module: &str, alias: &str) -> (Vec<String>, Vec<String>) {
    match module {
        "console" => (
            vec![format!(
                "  - invoke: !ref {alias}.writeLine\n    inputs:\n      output: \"warm-up done\"\n"
            )],
            Vec::new(),
        ),
        "run" => (
            vec!["  - invoke: !ref warmUpValue\n".to_owned()],
            vec![format!(
                "kind: {alias}.Value\nmetadata:\n  name: warmUpValue\nvalue: {{}}\n"
            )],
        ),
        "javascript" => (
            vec!["  - invoke: !ref warmUpScript\n".to_owned()],
            vec![format!(
                "kind: {alias}.Script\nmetadata:\n  name: warmUpScript\ncode: |\n  function main() {{ return {{}} }}\n"
            )],
        ),
        _ => (Vec::new(), Vec::new()),
    }
}

/// The warm-up manifest for `modules`, each imported from `modules_dir`
/// (written as is: the script passes `${m}`).
pub fn manifest(modules: &[String], modules_dir: &str) -> String {
    let mut imports = String::new();
    let mut targets = String::new();
    let mut resources = String::new();
    for module in modules {
        let alias = alias(module);
        imports.push_str(&format!("  {alias}: \"{modules_dir}/{module}\"\n"));
        let (module_targets, module_resources) = uses(module, &alias);
        targets.extend(module_targets);
        for resource in module_resources {
            resources.push_str("---\n");
            resources.push_str(&resource);
        }
    }
    let targets = if targets.is_empty() {
        String::new()
    } else {
        format!("targets:\n{targets}")
    };
    format!(
        "kind: Telo.Application\nmetadata:\n  name: TeloRunnerWarmUp\n  version: 1.0.0\n\
         imports:\n{imports}{targets}{resources}"
    )
}

/// The init container's script: writes the manifest, installs, runs, and
/// ends well whatever happened, its last line the [`Outcome`].
pub fn script(modules: &[String]) -> String {
    let manifest = manifest(modules, "${m}");
    format!(
        "say() {{ echo \"{OUTCOME_PREFIX}$*\"; }}\n\
         m=\"${{TELO_MODULES:-}}\"\n\
         if [ -z \"$m\" ]; then say 'cold: the kernel image sets no TELO_MODULES'; exit 0; fi\n\
         d={TMP_MOUNT}/{WARM_UP_DIR}\n\
         mkdir -p \"$d\" && cat > \"$d/telo.yaml\" <<EOF || {{ say 'cold: cannot write the warm-up manifest'; exit 0; }}\n\
         {manifest}EOF\n\
         cd \"$d\" || {{ say 'cold: cannot enter the warm-up directory'; exit 0; }}\n\
         t=; if command -v timeout >/dev/null 2>&1; then t='timeout {STEP_TIMEOUT_SECONDS}'; fi\n\
         $t telo install ./telo.yaml\n\
         $t telo run ./telo.yaml </dev/null\n\
         rc=$?\n\
         cd / && rm -rf \"$d\"\n\
         if [ \"$rc\" -ne 0 ]; then say \"cold: the warm-up run exited $rc\"; exit 0; fi\n\
         say warm\n"
    )
}

/// The `warm-up` init container of a warm pod of `image`: the kernel image,
/// the `session` container's environment, volumes, limits and hardening.
pub fn container(
    image: &str,
    pull_policy: PullPolicy,
    resources: &Resources,
    modules: &[String],
) -> Container {
    Container {
        name: WARM_UP_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some(pull_policy_to_k8s(pull_policy).to_owned()),
        working_dir: Some(WORK_DIR.to_owned()),
        command: Some(vec!["sh".to_owned(), "-c".to_owned(), script(modules)]),
        env: Some(
            SESSION_RUNNER_ENV
                .iter()
                .map(|(name, value)| env_var(name, (*value).to_owned()))
                .collect(),
        ),
        resources: Some(resource_requirements(resources)),
        volume_mounts: Some(run_session_mounts()),
        security_context: Some(hardened_container_security()),
        ..Container::default()
    }
}

/// The outcome a warm-up's log ends with; `None`: it said none (it did not
/// end, or its log is gone).
pub fn outcome_of(log: &str) -> Option<Outcome> {
    let last = log.lines().rev().find(|line| !line.trim().is_empty())?;
    let said = last.trim().strip_prefix(OUTCOME_PREFIX)?;
    Some(match said.strip_prefix("cold: ") {
        Some(reason) => Outcome::Cold(reason.to_owned()),
        None if said == "warm" => Outcome::Warm,
        None => Outcome::Cold(said.to_owned()),
    })
}

/// Whether `pod` was made with a warm-up, by its status (the pod informer
/// keeps no spec).
pub fn has_warm_up(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.init_container_statuses.as_ref())
        .is_some_and(|inits| inits.iter().any(|c| c.name == WARM_UP_CONTAINER))
}

/// Reads how pod `name`'s warm-up ended, from its log's last line.
pub async fn read_outcome(pods: &Api<Pod>, name: &str) -> Result<Option<Outcome>, String> {
    let params = LogParams {
        container: Some(WARM_UP_CONTAINER.to_owned()),
        tail_lines: Some(3),
        ..LogParams::default()
    };
    pods.logs(name, &params)
        .await
        .map(|log| outcome_of(&log))
        .map_err(|err| crate::cluster::api_error::api_reason(&err))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn the_manifest_imports_every_module_and_uses_the_source_built_ones() {
        let text = manifest(
            &modules(&["http-server", "run", "console", "javascript", "sqlite"]),
            "/opt/telo/modules",
        );
        insta::assert_snapshot!(text);
        assert_eq!(text.matches("\n---\n").count(), 2, "{text}");
    }

    /// The manifest goes through an unquoted here-document: nothing in it
    /// may be read by `sh` but the modules directory.
    #[test]
    fn the_manifest_has_nothing_sh_would_expand() {
        let text = manifest(
            &modules(&["http-server", "run", "console", "javascript"]),
            "/m",
        );
        assert!(!text.contains(['$', '`', '\\']), "{text}");
        assert!(!text.lines().any(|line| line == "EOF"));
    }

    #[test]
    fn module_aliases_are_camel_case() {
        assert_eq!(alias("http-server"), "HttpServer");
        assert_eq!(alias("kv-store-memory"), "KvStoreMemory");
        assert_eq!(alias("run"), "Run");
    }

    #[test]
    fn the_last_line_says_how_it_ended() {
        assert_eq!(
            outcome_of("npm noise\n12 failed\ntelo-runner warm-up: warm\n"),
            Some(Outcome::Warm)
        );
        assert_eq!(
            outcome_of("telo-runner warm-up: cold: the warm-up run exited 1\n\n"),
            Some(Outcome::Cold("the warm-up run exited 1".to_owned()))
        );
        assert_eq!(outcome_of("telo-runner warm-up: warm\nmore\n"), None);
        assert_eq!(outcome_of(""), None);
    }

    /// The script under `sh`, with a `telo` that records what it was run
    /// as and a `TELO_MODULES`: installs, runs, cleans up, says `warm`; a
    /// failing run says `cold`; no `TELO_MODULES` says `cold` and runs
    /// nothing. It always ends well.
    #[test]
    fn the_script_installs_runs_and_always_ends_well() {
        use std::os::unix::fs::PermissionsExt;
        let run = |telo_body: &str, modules_dir: Option<&str>| {
            let bin = tempfile::tempdir().unwrap();
            let tmp = tempfile::tempdir().unwrap();
            let telo = bin.path().join("telo");
            std::fs::write(&telo, format!("#!/bin/sh\n{telo_body}\n")).unwrap();
            std::fs::set_permissions(&telo, std::fs::Permissions::from_mode(0o755)).unwrap();
            let script = script(&modules(&["http-server", "run"]))
                .replace(TMP_MOUNT, &tmp.path().display().to_string());
            let mut command = std::process::Command::new("sh");
            command
                .args(["-c", &script])
                .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
                .env_remove("TELO_MODULES");
            if let Some(dir) = modules_dir {
                command.env("TELO_MODULES", dir);
            }
            let out = command.output().unwrap();
            let left = std::fs::read_dir(tmp.path()).unwrap().count();
            (out, left)
        };
        let (out, left) = run(
            "echo \"telo $1 $2 $(grep -c '/m/' telo.yaml)\"; [ \"$1\" = run ] || exit 1",
            Some("/m"),
        );
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "telo install ./telo.yaml 2\ntelo run ./telo.yaml 2\ntelo-runner warm-up: warm\n"
        );
        assert_eq!(left, 0, "the warm-up directory is removed");

        let (out, _) = run("[ \"$1\" = install ] || exit 3", Some("/m"));
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            outcome_of(&String::from_utf8_lossy(&out.stdout)),
            Some(Outcome::Cold("the warm-up run exited 3".to_owned()))
        );

        let (out, _) = run("echo ran", None);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "telo-runner warm-up: cold: the kernel image sets no TELO_MODULES\n"
        );
    }
}
