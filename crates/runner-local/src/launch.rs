//! What a session process is started with — command line, working directory
//! and environment — as plain data, decided before anything is spawned.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::kernel_cache::SessionCache;
use crate::process::group::Members;
use crate::process::plan::SpawnPlan;

/// Terminal type workloads see: the client renders an xterm-compatible
/// terminal with 256 colours.
pub const TERM: &str = "xterm-256color";
/// `SHELL` is always present in a PTY child (the PTY library fills it from
/// the password database when unset); a fixed value keeps host details out.
pub const SHELL: &str = "/bin/sh";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    /// `argv[0]` is an absolute path.
    pub argv: Vec<OsString>,
    pub cwd: PathBuf,
    /// The complete environment, each name once.
    pub env: Vec<(String, String)>,
}

impl LaunchPlan {
    /// This plan as it is, in a process group of its own.
    pub fn unsandboxed(self) -> SpawnPlan {
        SpawnPlan {
            argv: self.argv,
            cwd: self.cwd,
            env: self.env,
            controlling_tty: true,
            members: Members::Group,
            args_file: None,
        }
    }
}

/// `telo run [--inspect 127.0.0.1:<port> --no-open] ./<entry>`. The entry is
/// passed as `./…` so the CLI reads it as a local file (never as a module
/// reference or, for a name starting with `-`, as an option).
pub fn telo_argv(telo: &Path, entry: &str, inspect_port: Option<u16>) -> Vec<OsString> {
    let mut argv = vec![telo.as_os_str().to_owned(), "run".into()];
    if let Some(port) = inspect_port {
        argv.push("--inspect".into());
        argv.push(format!("127.0.0.1:{port}").into());
        argv.push("--no-open".into());
    }
    argv.push(format!("./{entry}").into());
    argv
}

/// An app's configured command line, with its program resolved.
pub fn app_argv(program: &Path, command: &[String]) -> Vec<OsString> {
    std::iter::once(program.as_os_str().to_owned())
        .chain(command.iter().skip(1).map(OsString::from))
        .collect()
}

/// The workload's whole environment: the session env, then what a process
/// needs to run at all. Nothing of the runner's own environment is included
/// except the configured `PATH`.
///
/// `HOME` is always the session's own directory — a session pointing it at a
/// shared place would defeat the per-session isolation. With a
/// `kernel_cache` (Telo sessions; an operator's app is its own program and
/// gets none), `TELO_CACHE_DIR` and `npm_config_cache` point into it, and
/// the session env cannot move them either: the runner owns that directory's
/// lifecycle (it is counted against the session's disk bound and removed
/// with it), and a cache pointed elsewhere would be written where nothing
/// bounds or cleans it. `PATH`, `TERM`, `SHELL` and `FORCE_COLOR` are
/// defaults the session env may override.
pub fn workload_env(
    session_env: &[(String, String)],
    home: &Path,
    path: &str,
    kernel_cache: Option<&SessionCache>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::with_capacity(session_env.len() + 7);
    for (name, value) in session_env {
        // Later duplicates win, as with any environment assignment.
        set_var(&mut env, name, value, true);
    }
    set_var(&mut env, "HOME", &home.to_string_lossy(), true);
    if let Some(cache) = kernel_cache {
        set_var(
            &mut env,
            "TELO_CACHE_DIR",
            &cache.telo_dir().to_string_lossy(),
            true,
        );
        // npm reads its settings from the environment case-insensitively, so
        // an `NPM_CONFIG_CACHE` from the session must not survive beside ours.
        env.retain(|(name, _)| !name.eq_ignore_ascii_case(NPM_CACHE_VAR));
        set_var(
            &mut env,
            NPM_CACHE_VAR,
            &cache.npm_dir().to_string_lossy(),
            true,
        );
    }
    set_var(&mut env, "PATH", path, false);
    set_var(&mut env, "FORCE_COLOR", "1", false);
    set_var(&mut env, "TERM", TERM, false);
    set_var(&mut env, "SHELL", SHELL, false);
    env
}

/// `env` (a [`workload_env`]) for a workload on pipes rather than a
/// terminal: the `FORCE_COLOR` default is dropped, so colour is what the
/// program decides for a pipe — unless `session_env` itself sets it.
pub fn without_forced_colour(
    mut env: Vec<(String, String)>,
    session_env: &[(String, String)],
) -> Vec<(String, String)> {
    if !session_env.iter().any(|(name, _)| name == "FORCE_COLOR") {
        env.retain(|(name, _)| name != "FORCE_COLOR");
    }
    env
}

const NPM_CACHE_VAR: &str = "npm_config_cache";

fn set_var(env: &mut Vec<(String, String)>, name: &str, value: &str, overwrite: bool) {
    match env.iter_mut().find(|(existing, _)| existing == name) {
        Some(entry) if overwrite => value.clone_into(&mut entry.1),
        Some(_) => {}
        None => env.push((name.to_owned(), value.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn telo_runs_the_entry_relative_to_the_app_directory() {
        let argv = telo_argv(Path::new("/usr/bin/telo"), "app/telo.yaml", None);
        assert_eq!(argv, ["/usr/bin/telo", "run", "./app/telo.yaml"]);
    }

    #[test]
    fn inspect_listens_on_loopback_and_never_opens_a_browser() {
        let argv = telo_argv(Path::new("/usr/bin/telo"), "telo.yaml", Some(40123));
        assert_eq!(
            argv,
            [
                "/usr/bin/telo",
                "run",
                "--inspect",
                "127.0.0.1:40123",
                "--no-open",
                "./telo.yaml"
            ]
        );
    }

    #[test]
    fn an_app_command_keeps_its_arguments() {
        let command = vec!["agent".to_owned(), "--serve".to_owned(), "x y".to_owned()];
        assert_eq!(
            app_argv(Path::new("/opt/agent"), &command),
            ["/opt/agent", "--serve", "x y"]
        );
    }

    #[test]
    fn the_environment_is_the_session_env_plus_the_basics() {
        let env = workload_env(
            &pairs(&[("FOO", "1"), ("TELO_REGISTRY_URL", "http://r.test")]),
            Path::new("/w/id/home"),
            "/usr/bin:/bin",
            None,
        );
        assert_eq!(
            env,
            pairs(&[
                ("FOO", "1"),
                ("TELO_REGISTRY_URL", "http://r.test"),
                ("HOME", "/w/id/home"),
                ("PATH", "/usr/bin:/bin"),
                ("FORCE_COLOR", "1"),
                ("TERM", "xterm-256color"),
                ("SHELL", "/bin/sh"),
            ])
        );
    }

    #[test]
    fn the_session_env_may_override_defaults_but_not_home() {
        let env = workload_env(
            &pairs(&[
                ("PATH", "/custom"),
                ("HOME", "/root"),
                ("FORCE_COLOR", "0"),
                ("FOO", "a"),
                ("FOO", "b"),
            ]),
            Path::new("/w/id/home"),
            "/usr/bin",
            None,
        );
        assert_eq!(
            env,
            pairs(&[
                ("PATH", "/custom"),
                ("HOME", "/w/id/home"),
                ("FORCE_COLOR", "0"),
                ("FOO", "b"),
                ("TERM", "xterm-256color"),
                ("SHELL", "/bin/sh"),
            ])
        );
    }

    #[test]
    fn a_workload_on_pipes_gets_no_forced_colour_unless_the_session_asks() {
        let session = pairs(&[("FOO", "1")]);
        let env = workload_env(&session, Path::new("/w/id/home"), "/usr/bin", None);
        assert_eq!(
            without_forced_colour(env, &session),
            pairs(&[
                ("FOO", "1"),
                ("HOME", "/w/id/home"),
                ("PATH", "/usr/bin"),
                ("TERM", "xterm-256color"),
                ("SHELL", "/bin/sh"),
            ])
        );
        let session = pairs(&[("FORCE_COLOR", "3")]);
        let env = workload_env(&session, Path::new("/w/id/home"), "/usr/bin", None);
        let kept = without_forced_colour(env, &session);
        assert!(kept.contains(&("FORCE_COLOR".to_owned(), "3".to_owned())));
    }

    #[test]
    fn a_telo_session_gets_its_own_kernel_cache_and_cannot_move_it() {
        let cache = SessionCache::new(PathBuf::from("/w/id/kernel-cache"), true);
        let env = workload_env(
            &pairs(&[
                ("TELO_CACHE_DIR", "/elsewhere"),
                ("NPM_CONFIG_CACHE", "/elsewhere/npm"),
                ("npm_config_cache", "/elsewhere/npm2"),
                ("FOO", "1"),
            ]),
            Path::new("/w/id/home"),
            "/usr/bin",
            Some(&cache),
        );
        assert_eq!(
            env,
            pairs(&[
                ("TELO_CACHE_DIR", "/var/cache/telo-kernel/telo"),
                ("FOO", "1"),
                ("HOME", "/w/id/home"),
                ("npm_config_cache", "/var/cache/telo-kernel/npm"),
                ("PATH", "/usr/bin"),
                ("FORCE_COLOR", "1"),
                ("TERM", "xterm-256color"),
                ("SHELL", "/bin/sh"),
            ])
        );
    }
}
