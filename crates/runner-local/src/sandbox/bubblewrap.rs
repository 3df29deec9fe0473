//! The session sandbox: every session process runs inside bubblewrap
//! (`bwrap`), in its own user, PID, mount, IPC, UTS and cgroup namespaces,
//! sharing only the runner's network namespace (its ports must stay reachable
//! on loopback, and the kernel's `--inspect` port with them).
//!
//! Without it a workload was the runner's child, as the runner's user, and
//! `/proc/$PPID/environ` gave it every secret of the runner's environment,
//! `RUNNER_AUTH_TOKENS_FILE` gave it the path of a file it could then read,
//! and a `setsid` child outlived its session. Inside the sandbox a workload
//! sees:
//! - read-only: the system directories (`/usr`, `/bin`, `/lib*`, `/sbin`),
//!   the few files of `/etc` a program needs to run ([`ETC_ENTRIES`]: users,
//!   name resolution, certificates, time zone, linker cache), and the
//!   installation of the program it runs (the Telo CLI and the first `node`
//!   on its `PATH`, or an app's program; see [`installation_dirs`]);
//! - read-write: its own session directory and, for Telo sessions, its
//!   own kernel cache (a directory inside its session directory, shown at
//!   [`KERNEL_CACHE_MOUNT`]; see `kernel_cache`);
//! - private: `/proc` of its own PID namespace (no process of the runner or
//!   of another session), a minimal `/dev`, empty `/tmp` and `/var/tmp`.
//!
//! The work root is covered by an empty directory before the session's own
//! directory is shown, so no other session's directory can show through a
//! read-only installation that happens to contain it; the runner's secret
//! files (`RUNNER_AUTH_TOKENS_FILE`) are covered by `/dev/null` wherever a
//! mount would show them. Every capability is dropped, no further user
//! namespace can be created inside, and the root is read-only.
//!
//! The sandbox's arguments — the workload's environment among them — reach
//! `bwrap` through a memory file (`--args`), never its command line (which
//! every local user can read in `/proc`) nor its own environment (a session
//! env naming `LD_PRELOAD` would otherwise load a library into `bwrap`
//! itself, which runs as the runner's user outside any namespace). A
//! one-line `sh` opens that file as descriptor 3 and becomes `bwrap`.
//!
//! With a terminal, the workload is started by `setsid --ctty`: a session of
//! its own whose controlling terminal is the PTY, so Ctrl-C and resizes reach
//! the workload, not `bwrap` (a SIGINT to `bwrap` would kill the sandbox
//! without letting the workload shut down).
//!
//! [`bwrap_args`] and [`host_command`] are pure; [`HostLayout::read`],
//! [`installation_dirs`] and [`crate::process::args_file::ArgsFile`] do the I/O.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use crate::kernel_cache::KERNEL_CACHE_MOUNT;
use crate::launch::LaunchPlan;
use crate::process::args_file::ArgsFile;
use crate::process::group::Members;
use crate::process::plan::SpawnPlan;
use crate::sandbox::cgroup::{CgroupTree, SessionCgroup};
use crate::sandbox::limits::{RunnerLimits, SessionLimits, prlimit_argv};

/// Directories a program needs to run at all, shown read-only (or, when the
/// host has them as symlinks — `/bin -> usr/bin` — as the same symlinks).
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// What of `/etc` a workload sees, each read-only where the host has it:
/// who users are, how names resolve, which certificates to trust, the time
/// zone, the linker's cache, Debian's alternatives (targets of symlinks in
/// `/usr/bin`), terminal descriptions. Nothing else: `/etc` holds the
/// operator's configuration, credentials among it (`/etc/npmrc`,
/// `/etc/shadow`).
pub const ETC_ENTRIES: &[&str] = &[
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki",
    "/etc/crypto-policies",
    "/etc/terminfo",
    "/etc/mime.types",
];

/// Empty, private and writable in every sandbox.
pub const PRIVATE_TMP_DIRS: &[&str] = &["/tmp", "/var/tmp"];

/// Opens the arguments file (`$1`) as descriptor 3 and becomes `bwrap`
/// (`$0`) with the command line that follows.
pub const EXEC_BWRAP: &str = "f=$1; shift; exec \"$0\" --args 3 -- \"$@\" 3<\"$f\"";

/// [`EXEC_BWRAP`] after moving itself into the session's cgroup (`$1`,
/// its `cgroup.procs`), so every process of the sandbox starts there; a
/// sandbox that cannot be bounded does not start.
pub const EXEC_BWRAP_IN_CGROUP: &str =
    "g=$1; f=$2; shift 2; echo $$ > \"$g\" || exit 125; exec \"$0\" --args 3 -- \"$@\" 3<\"$f\"";

/// The empty directory covering the work root holds only the mount points
/// of what is shown in it.
pub const MASK_TMPFS_BYTES: u64 = 1 << 20;

/// One system directory as the host has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    Dir(PathBuf),
    /// `path` is a symlink to `target` (as written in the link).
    Symlink {
        path: PathBuf,
        target: PathBuf,
    },
}

impl SystemEntry {
    fn dir(&self) -> Option<&Path> {
        match self {
            SystemEntry::Dir(dir) => Some(dir),
            SystemEntry::Symlink { .. } => None,
        }
    }
}

/// The host's system directories, read once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostLayout {
    pub system: Vec<SystemEntry>,
}

impl HostLayout {
    /// Which of [`SYSTEM_DIRS`] the host has, and how.
    pub fn read() -> Self {
        let system = SYSTEM_DIRS
            .iter()
            .map(Path::new)
            .filter_map(|path| {
                let meta = std::fs::symlink_metadata(path).ok()?;
                if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(path).ok()?;
                    Some(SystemEntry::Symlink {
                        path: path.to_owned(),
                        target,
                    })
                } else if meta.is_dir() {
                    Some(SystemEntry::Dir(path.to_owned()))
                } else {
                    None
                }
            })
            .collect();
        Self { system }
    }

    /// Whether `path` is already shown by a system directory.
    pub fn shows(&self, path: &Path) -> bool {
        self.system
            .iter()
            .filter_map(SystemEntry::dir)
            .any(|dir| path.starts_with(dir))
    }
}

/// Everything one sandbox is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec<'a> {
    pub layout: &'a HostLayout,
    /// Shown read-only at their own paths (the program's installation).
    pub read_only: &'a [PathBuf],
    /// Covered by an empty directory before `read_write` is shown: the work
    /// root, so only the session's own directory in it is visible.
    pub masked: &'a Path,
    /// Shown read-write at their own paths (the session's directory).
    pub read_write: &'a [PathBuf],
    /// The session's own kernel cache, shown read-write at
    /// [`KERNEL_CACHE_MOUNT`].
    pub kernel_cache: Option<&'a Path>,
    /// Files of the runner covered by `/dev/null` where a mount shows them.
    pub hidden: &'a [PathBuf],
    pub cwd: &'a Path,
    /// The workload's whole environment.
    pub env: &'a [(String, String)],
    /// The size of each private `/tmp`: memory, bounded apart from the
    /// session's directory.
    pub private_tmp_bytes: u64,
}

/// `bwrap`'s arguments, up to (not including) the command.
pub fn bwrap_args(spec: &SandboxSpec<'_>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&std::ffi::OsStr]| args.extend(items.iter().map(|a| a.to_os_string()));
    push(&[
        "--unshare-all".as_ref(),
        "--share-net".as_ref(),
        // Implied when unprivileged, but not when the runner is root: then
        // the workload would keep every capability of the host's root.
        "--unshare-user".as_ref(),
        "--disable-userns".as_ref(),
        "--cap-drop".as_ref(),
        "ALL".as_ref(),
        // The sandbox dies with the runner, even a SIGKILLed one.
        "--die-with-parent".as_ref(),
        "--clearenv".as_ref(),
    ]);
    for (name, value) in spec.env {
        push(&["--setenv".as_ref(), name.as_ref(), value.as_ref()]);
    }
    for entry in &spec.layout.system {
        match entry {
            SystemEntry::Dir(dir) => push(&["--ro-bind".as_ref(), dir.as_ref(), dir.as_ref()]),
            SystemEntry::Symlink { path, target } => {
                push(&["--symlink".as_ref(), target.as_ref(), path.as_ref()]);
            }
        }
    }
    for entry in ETC_ENTRIES {
        push(&["--ro-bind-try".as_ref(), entry.as_ref(), entry.as_ref()]);
    }
    push(&[
        "--proc".as_ref(),
        "/proc".as_ref(),
        "--dev".as_ref(),
        "/dev".as_ref(),
    ]);
    let tmp_size = spec.private_tmp_bytes.to_string();
    for dir in PRIVATE_TMP_DIRS {
        push(&[
            "--size".as_ref(),
            tmp_size.as_ref(),
            "--tmpfs".as_ref(),
            dir.as_ref(),
        ]);
    }
    // After the private /tmp, so an installation under /tmp shows through it.
    for dir in spec.read_only {
        push(&["--ro-bind".as_ref(), dir.as_ref(), dir.as_ref()]);
    }
    let mask_size = MASK_TMPFS_BYTES.to_string();
    push(&[
        "--size".as_ref(),
        mask_size.as_ref(),
        "--tmpfs".as_ref(),
        spec.masked.as_ref(),
    ]);
    for dir in spec.read_write {
        push(&["--bind".as_ref(), dir.as_ref(), dir.as_ref()]);
    }
    if let Some(cache) = spec.kernel_cache {
        push(&[
            "--bind".as_ref(),
            cache.as_ref(),
            KERNEL_CACHE_MOUNT.as_ref(),
        ]);
    }
    for file in spec.hidden {
        if shown(spec, file) {
            push(&["--ro-bind".as_ref(), "/dev/null".as_ref(), file.as_ref()]);
        }
    }
    push(&[
        "--remount-ro".as_ref(),
        "/".as_ref(),
        "--chdir".as_ref(),
        spec.cwd.as_ref(),
    ]);
    args
}

/// Whether a mount of `spec` makes host path `file` visible.
fn shown(spec: &SandboxSpec<'_>, file: &Path) -> bool {
    let under_masked_root = file.starts_with(spec.masked)
        && !spec
            .read_write
            .iter()
            .map(PathBuf::as_path)
            .chain(spec.kernel_cache)
            .any(|dir| file.starts_with(dir));
    if under_masked_root {
        return false;
    }
    spec.layout.shows(file)
        || ETC_ENTRIES.iter().any(|entry| file.starts_with(entry))
        || spec
            .read_only
            .iter()
            .chain(spec.read_write)
            .map(PathBuf::as_path)
            .chain(spec.kernel_cache)
            .any(|dir| file.starts_with(dir))
}

/// The programs a sandboxed launch is made of, resolved on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPrograms {
    pub sh: PathBuf,
    pub bwrap: PathBuf,
    /// util-linux's (or busybox's) `setsid`, run inside the sandbox.
    pub setsid: PathBuf,
    /// util-linux's `prlimit`, which sets the session's rlimits inside.
    pub prlimit: PathBuf,
}

/// Which session the workload runs in, inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadSession {
    /// A session of its own whose controlling terminal is the PTY it was
    /// started on (`setsid --ctty`).
    Terminal,
    /// A session of its own with no controlling terminal (`setsid`): a
    /// workload on pipes.
    Detached,
    /// The sandbox's (a short check).
    Shared,
}

/// What the runner executes: `sh -c EXEC_BWRAP bwrap <args file> [setsid
/// [--ctty]] <argv>`, the workload in `session` — or, with a cgroup,
/// `sh -c EXEC_BWRAP_IN_CGROUP bwrap <cgroup.procs> <args file> …`.
pub fn host_command(
    programs: &SandboxPrograms,
    args_file: &Path,
    cgroup_procs: Option<&Path>,
    argv: &[OsString],
    session: WorkloadSession,
) -> Vec<OsString> {
    let script = if cgroup_procs.is_some() {
        EXEC_BWRAP_IN_CGROUP
    } else {
        EXEC_BWRAP
    };
    let mut command: Vec<OsString> = vec![
        programs.sh.clone().into(),
        "-c".into(),
        script.into(),
        programs.bwrap.clone().into(),
    ];
    command.extend(cgroup_procs.map(OsString::from));
    command.push(args_file.into());
    match session {
        WorkloadSession::Terminal => {
            command.push(programs.setsid.clone().into());
            command.push("--ctty".into());
        }
        WorkloadSession::Detached => command.push(programs.setsid.clone().into()),
        WorkloadSession::Shared => {}
    }
    command.extend(argv.iter().cloned());
    command
}

/// What a sandbox shows of the host besides the system and the runner's
/// own read-only paths.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionMounts<'a> {
    /// Shown read-only at their own paths (the program's installation).
    pub read_only: &'a [PathBuf],
    /// Shown read-write at their own paths.
    pub read_write: &'a [PathBuf],
    /// A Telo session's own kernel cache, shown read-write at
    /// [`KERNEL_CACHE_MOUNT`].
    pub kernel_cache: Option<&'a Path>,
}

/// A sandbox known to work on this host (see `sandbox::check`), ready to
/// wrap launches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub programs: SandboxPrograms,
    pub layout: HostLayout,
    pub work_root: PathBuf,
    pub home: Option<PathBuf>,
    pub hidden: Vec<PathBuf>,
    /// Shown read-only in every sandbox (`RUNNER_LOCAL_SANDBOX_READ_ONLY`).
    pub read_only: Vec<PathBuf>,
    /// What each sandbox's workload may use.
    pub limits: SessionLimits,
    /// The runner's own hard limits, which cap the workload's.
    pub runner_limits: RunnerLimits,
    /// Where each sandbox gets a cgroup of its own, when the host delegates.
    pub cgroups: Option<Arc<CgroupTree>>,
}

impl Sandbox {
    /// The directories showing the installations of `programs` (see
    /// [`installation_dirs`]), each once.
    pub fn installations(&self, programs: &[&Path]) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for program in programs {
            for dir in
                installation_dirs(program, &self.layout, self.home.as_deref(), &self.work_root)
            {
                if dirs.iter().any(|known| dir.starts_with(known)) {
                    continue;
                }
                dirs.retain(|known| !known.starts_with(&dir));
                dirs.push(dir);
            }
        }
        dirs
    }

    /// What runs `plan` in this sandbox, with `mounts` shown besides the
    /// system, the workload in `session`.
    pub fn spawn_plan(
        &self,
        plan: LaunchPlan,
        mounts: SessionMounts<'_>,
        session: WorkloadSession,
    ) -> std::io::Result<SpawnPlan> {
        let read_only: Vec<PathBuf> = mounts
            .read_only
            .iter()
            .chain(&self.read_only)
            .cloned()
            .collect();
        let args = bwrap_args(&SandboxSpec {
            layout: &self.layout,
            read_only: &read_only,
            masked: &self.work_root,
            read_write: mounts.read_write,
            kernel_cache: mounts.kernel_cache,
            hidden: &self.hidden,
            cwd: &plan.cwd,
            env: &plan.env,
            private_tmp_bytes: self.limits.private_tmp_bytes(),
        });
        let cgroup = match &self.cgroups {
            Some(tree) => Some(tree.child(&self.limits).map_err(std::io::Error::other)?),
            None => None,
        };
        let procs = cgroup.as_ref().map(SessionCgroup::procs);
        // The limits hold for the workload and all it starts; the
        // workload runs under `setsid`, then `prlimit`.
        let argv: Vec<OsString> =
            prlimit_argv(&self.programs.prlimit, &self.limits, &self.runner_limits)
                .into_iter()
                .chain(plan.argv)
                .collect();
        // Kept as long as the session (with its arguments): the cgroup
        // goes when the session does.
        let args_file = ArgsFile::new(&args)?.keeping(cgroup);
        Ok(SpawnPlan {
            argv: host_command(
                &self.programs,
                &args_file.path(),
                procs.as_deref(),
                &argv,
                session,
            ),
            cwd: plan.cwd,
            // Nothing of the session's environment reaches `sh` and `bwrap`.
            env: Vec::new(),
            controlling_tty: false,
            members: Members::Sandbox,
            args_file: Some(args_file),
        })
    }
}

/// The directories that make up the installation of `program` (an
/// absolute path), as the sandbox shows it: for the path as given and for
/// the file it finally names (through symlinks), the directory holding it —
/// or, when that directory is a `bin`, its parent (`<prefix>/bin/telo` →
/// `<prefix>`, where a wrapper keeps its runtime and modules). A directory
/// that is `/` or holds `home` or `work_root` is never shown whole: the
/// program file alone is, then. Directories the system directories already
/// show are left out.
pub fn installation_dirs(
    program: &Path,
    layout: &HostLayout,
    home: Option<&Path>,
    work_root: &Path,
) -> Vec<PathBuf> {
    let mut paths = vec![program.to_owned()];
    if let Ok(canonical) = std::fs::canonicalize(program)
        && canonical != program
    {
        paths.push(canonical);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for path in paths {
        let shown = installation_root(&path, home, work_root);
        if layout.shows(&shown) || dirs.iter().any(|dir| shown.starts_with(dir)) {
            continue;
        }
        dirs.retain(|dir| !dir.starts_with(&shown));
        dirs.push(shown);
    }
    dirs
}

/// Pure part of [`installation_dirs`] for one path.
pub fn installation_root(path: &Path, home: Option<&Path>, work_root: &Path) -> PathBuf {
    let Some(dir) = path.parent() else {
        return path.to_owned();
    };
    let candidate = match dir.file_name() {
        Some(name) if name == "bin" => dir.parent().unwrap_or(dir),
        _ => dir,
    };
    let too_wide = |dir: &Path| {
        dir.parent().is_none()
            || home.is_some_and(|home| home.starts_with(dir))
            || work_root.starts_with(dir)
    };
    if !too_wide(candidate) {
        candidate.to_owned()
    } else if candidate != dir && !too_wide(dir) {
        dir.to_owned()
    } else {
        path.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged_usr() -> HostLayout {
        HostLayout {
            system: vec![
                SystemEntry::Dir("/usr".into()),
                SystemEntry::Symlink {
                    path: "/bin".into(),
                    target: "usr/bin".into(),
                },
                SystemEntry::Symlink {
                    path: "/lib64".into(),
                    target: "usr/lib64".into(),
                },
            ],
        }
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// The arguments following the first occurrence of `flag`, pairwise.
    fn pairs_after(args: &[String], flag: &str) -> Vec<(String, String)> {
        args.windows(3)
            .filter(|w| w[0] == flag)
            .map(|w| (w[1].clone(), w[2].clone()))
            .collect()
    }

    fn spec<'a>(
        layout: &'a HostLayout,
        read_only: &'a [PathBuf],
        read_write: &'a [PathBuf],
        hidden: &'a [PathBuf],
        env: &'a [(String, String)],
    ) -> SandboxSpec<'a> {
        SandboxSpec {
            layout,
            read_only,
            masked: Path::new("/srv/work"),
            read_write,
            kernel_cache: None,
            hidden,
            cwd: Path::new("/srv/work/abcdefgh2345/app"),
            env,
            private_tmp_bytes: 1 << 20,
        }
    }

    #[test]
    fn every_namespace_but_the_network_is_private_and_no_capability_is_kept() {
        let layout = merged_usr();
        let args = strings(&bwrap_args(&spec(&layout, &[], &[], &[], &[])));
        assert_eq!(
            args[..9],
            [
                "--unshare-all",
                "--share-net",
                "--unshare-user",
                "--disable-userns",
                "--cap-drop",
                "ALL",
                "--die-with-parent",
                "--clearenv",
                "--ro-bind",
            ]
        );
        assert_eq!(
            args[args.len() - 4..],
            ["--remount-ro", "/", "--chdir", "/srv/work/abcdefgh2345/app"]
        );
    }

    #[test]
    fn the_environment_is_set_inside_exactly_as_given() {
        let layout = merged_usr();
        let env = vec![
            ("A B".to_owned(), "x\ny 'z'".to_owned()),
            ("PATH".to_owned(), "/usr/bin".to_owned()),
        ];
        let args = strings(&bwrap_args(&spec(&layout, &[], &[], &[], &env)));
        assert_eq!(
            pairs_after(&args, "--setenv"),
            [
                ("A B".to_owned(), "x\ny 'z'".to_owned()),
                ("PATH".to_owned(), "/usr/bin".to_owned())
            ]
        );
    }

    #[test]
    fn system_dirs_are_read_only_and_symlinks_stay_symlinks() {
        let layout = merged_usr();
        let args = strings(&bwrap_args(&spec(&layout, &[], &[], &[], &[])));
        assert_eq!(
            pairs_after(&args, "--ro-bind"),
            [("/usr".to_owned(), "/usr".to_owned())]
        );
        assert_eq!(
            pairs_after(&args, "--symlink"),
            [
                ("usr/bin".to_owned(), "/bin".to_owned()),
                ("usr/lib64".to_owned(), "/lib64".to_owned())
            ]
        );
        let etc: Vec<String> = pairs_after(&args, "--ro-bind-try")
            .into_iter()
            .map(|(source, dest)| {
                assert_eq!(source, dest);
                source
            })
            .collect();
        assert_eq!(etc, ETC_ENTRIES);
        assert!(!etc.iter().any(|e| e == "/etc" || e.contains("shadow")));
    }

    #[test]
    fn the_work_root_is_masked_before_the_sessions_own_directory_is_shown() {
        let layout = merged_usr();
        let read_only = vec![PathBuf::from("/tmp/kernel"), PathBuf::from("/srv")];
        let read_write = vec![PathBuf::from("/srv/work/abcdefgh2345")];
        let args = strings(&bwrap_args(&SandboxSpec {
            kernel_cache: Some(Path::new("/srv/work/abcdefgh2345/kernel-cache")),
            ..spec(&layout, &read_only, &read_write, &[], &[])
        }));
        let position = |needle: &[&str]| {
            args.windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} missing from {args:?}"))
        };
        let tmp = position(&["--tmpfs", "/tmp"]);
        let kernel = position(&["--ro-bind", "/tmp/kernel", "/tmp/kernel"]);
        let srv = position(&["--ro-bind", "/srv", "/srv"]);
        let mask = position(&["--tmpfs", "/srv/work"]);
        let session = position(&["--bind", "/srv/work/abcdefgh2345", "/srv/work/abcdefgh2345"]);
        // The session's own cache, at the one path every kernel sees it.
        let cache = position(&[
            "--bind",
            "/srv/work/abcdefgh2345/kernel-cache",
            KERNEL_CACHE_MOUNT,
        ]);
        assert!(tmp < kernel && kernel < srv && srv < mask && mask < session && session < cache);
        assert!(position(&["--proc", "/proc"]) < tmp);
        assert!(position(&["--dev", "/dev"]) < tmp);
        assert!(position(&["--tmpfs", "/var/tmp"]) < kernel);
        // Nothing of the work root is shown but the session's directory.
        let shown_under_work: Vec<&String> = args
            .iter()
            .filter(|arg| arg.starts_with("/srv/work/"))
            .collect();
        assert!(
            shown_under_work
                .iter()
                .all(|arg| arg.starts_with("/srv/work/abcdefgh2345")),
            "{shown_under_work:?}"
        );
    }

    #[test]
    fn a_runner_file_is_covered_only_where_a_mount_would_show_it() {
        let layout = merged_usr();
        let read_only = vec![PathBuf::from("/opt/telo")];
        let read_write = vec![PathBuf::from("/srv/work/abcdefgh2345")];
        let hidden = vec![
            PathBuf::from("/usr/local/etc/tokens"),
            PathBuf::from("/opt/telo/tokens"),
            PathBuf::from("/etc/ssl/private/tokens"),
            PathBuf::from("/srv/work/abcdefgh2345/tokens"),
            // Not shown by anything: nothing to cover.
            PathBuf::from("/etc/telo-runner/tokens"),
            PathBuf::from("/root/tokens"),
            PathBuf::from("/srv/work/zzzzzzzz7777/tokens"),
        ];
        let args = strings(&bwrap_args(&spec(
            &layout,
            &read_only,
            &read_write,
            &hidden,
            &[],
        )));
        let covered: Vec<String> = pairs_after(&args, "--ro-bind")
            .into_iter()
            .filter(|(source, _)| source == "/dev/null")
            .map(|(_, dest)| dest)
            .collect();
        assert_eq!(
            covered,
            [
                "/usr/local/etc/tokens",
                "/opt/telo/tokens",
                "/etc/ssl/private/tokens",
                "/srv/work/abcdefgh2345/tokens"
            ]
        );
    }

    #[test]
    fn the_host_runs_sh_which_becomes_bwrap_reading_its_arguments_from_fd_3() {
        let programs = SandboxPrograms {
            sh: "/bin/sh".into(),
            bwrap: "/usr/bin/bwrap".into(),
            setsid: "/usr/bin/setsid".into(),
            prlimit: "/usr/bin/prlimit".into(),
        };
        let argv: Vec<OsString> = vec!["/opt/telo/bin/telo".into(), "run".into()];
        let with_terminal = host_command(
            &programs,
            Path::new("/proc/7/fd/9"),
            None,
            &argv,
            WorkloadSession::Terminal,
        );
        assert_eq!(
            strings(&with_terminal),
            [
                "/bin/sh",
                "-c",
                EXEC_BWRAP,
                "/usr/bin/bwrap",
                "/proc/7/fd/9",
                "/usr/bin/setsid",
                "--ctty",
                "/opt/telo/bin/telo",
                "run"
            ]
        );
        let detached = host_command(
            &programs,
            Path::new("/proc/7/fd/9"),
            None,
            &argv,
            WorkloadSession::Detached,
        );
        assert_eq!(
            strings(&detached)[5..],
            ["/usr/bin/setsid", "/opt/telo/bin/telo", "run"]
        );
        let shared = host_command(
            &programs,
            Path::new("/proc/7/fd/9"),
            None,
            &argv,
            WorkloadSession::Shared,
        );
        assert_eq!(strings(&shared)[5..], ["/opt/telo/bin/telo", "run"]);
        let bounded = host_command(
            &programs,
            Path::new("/proc/7/fd/9"),
            Some(Path::new("/sys/fs/cgroup/sessions/s1-0/cgroup.procs")),
            &argv,
            WorkloadSession::Shared,
        );
        assert_eq!(
            strings(&bounded)[2..],
            [
                EXEC_BWRAP_IN_CGROUP,
                "/usr/bin/bwrap",
                "/sys/fs/cgroup/sessions/s1-0/cgroup.procs",
                "/proc/7/fd/9",
                "/opt/telo/bin/telo",
                "run"
            ]
        );
    }

    #[test]
    fn private_tmp_directories_and_the_work_root_mask_are_bounded_in_size() {
        let layout = merged_usr();
        let args = strings(&bwrap_args(&spec(&layout, &[], &[], &[], &[])));
        let sized: Vec<(String, String)> = args
            .windows(4)
            .filter(|w| w[0] == "--size" && w[2] == "--tmpfs")
            .map(|w| (w[3].clone(), w[1].clone()))
            .collect();
        assert_eq!(
            sized,
            [
                ("/tmp".to_owned(), "1048576".to_owned()),
                ("/var/tmp".to_owned(), "1048576".to_owned()),
                ("/srv/work".to_owned(), MASK_TMPFS_BYTES.to_string()),
            ]
        );
    }

    #[test]
    fn an_installation_is_the_prefix_of_its_bin_directory() {
        let work = Path::new("/tmp/telo-runner-sessions");
        let home = Some(Path::new("/home/op"));
        let root = |p: &str| installation_root(Path::new(p), home, work);
        assert_eq!(
            root("/home/op/.cache/telo/bin/telo"),
            Path::new("/home/op/.cache/telo")
        );
        assert_eq!(root("/opt/telo/bin/telo"), Path::new("/opt/telo"));
        assert_eq!(root("/opt/tools/telo"), Path::new("/opt/tools"));
        assert_eq!(
            root("/home/op/target/debug/fake-telo"),
            Path::new("/home/op/target/debug")
        );
    }

    #[test]
    fn an_installation_never_shows_the_root_the_home_or_the_work_root_whole() {
        let work = Path::new("/tmp/telo-runner-sessions");
        let home = Some(Path::new("/home/op"));
        let root = |p: &str| installation_root(Path::new(p), home, work);
        // `/home/op/bin` is a `bin` of the home: its prefix is the home.
        assert_eq!(root("/home/op/bin/telo"), Path::new("/home/op/bin"));
        assert_eq!(root("/home/op/telo"), Path::new("/home/op/telo"));
        assert_eq!(root("/home/telo"), Path::new("/home/telo"));
        assert_eq!(root("/bin/telo"), Path::new("/bin"));
        assert_eq!(root("/telo"), Path::new("/telo"));
        assert_eq!(root("/tmp/telo"), Path::new("/tmp/telo"));
    }

    #[test]
    fn installations_under_the_system_dirs_add_nothing() {
        let layout = merged_usr();
        let dirs = installation_dirs(
            Path::new("/usr/bin/sh"),
            &layout,
            None,
            Path::new("/srv/work"),
        );
        assert_eq!(dirs, Vec::<PathBuf>::new());
    }
}
