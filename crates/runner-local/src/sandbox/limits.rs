//! What one local session may use: memory, processes, CPU, disk.
//!
//! Without bounds one session allocated 2 GiB, ran 400 processes and wrote
//! 1 GiB into its directory, on a machine every other session shares. The
//! bounds are enforced in two layers:
//! - **rlimits, always** (sandboxed sessions): `prlimit` inside the sandbox
//!   sets them, hard and soft, for the workload and everything it starts.
//!   `RLIMIT_NPROC` is counted per user *namespace* since Linux 5.14, and
//!   every sandbox has its own, so it bounds one session's processes and
//!   threads, not the runner's user as a whole — except for a runner running
//!   as root, whose processes the kernel never counts. `RLIMIT_DATA` bounds
//!   each process's private writable memory (what `malloc` and V8's heap
//!   commit; not the address space a Node.js process reserves, which is many
//!   times its use, so `RLIMIT_AS` would refuse to start it);
//!   `RLIMIT_FSIZE` bounds any one file by the disk bound; `RLIMIT_CORE` is
//!   0, so a crashing workload writes no core file into its directory.
//! - **a cgroup v2 child per sandbox** where the host delegates a cgroup to
//!   the runner (see `cgroup`): `memory.max`, `pids.max` and `cpu.max`
//!   bound the session as a whole, whatever its processes do.
//!
//! [`prlimit_argv`] and the parsers are pure; `/proc/self/limits` is read by
//! [`RunnerLimits::read`].

use std::ffi::OsString;
use std::path::Path;

use runner_core::config::{ConfigError, Env, Setting};

pub const RUNNER_LOCAL_MAX_MEMORY: Setting = Setting {
    name: "RUNNER_LOCAL_MAX_MEMORY",
    default: "1Gi",
    description: "Memory of one session: each of its processes' private writable memory (RLIMIT_DATA), and the whole session's where the host delegates a cgroup v2 to the runner (memory.max). Bytes, or with a Ki/Mi/Gi suffix.",
};

pub const RUNNER_LOCAL_MAX_PROCESSES: Setting = Setting {
    name: "RUNNER_LOCAL_MAX_PROCESSES",
    default: "512",
    description: "Processes and threads of one session (RLIMIT_NPROC in the session's own user namespace; pids.max with a delegated cgroup, which a runner running as root needs for this bound).",
};

pub const RUNNER_LOCAL_MAX_CPU: Setting = Setting {
    name: "RUNNER_LOCAL_MAX_CPU",
    default: "1",
    description: "CPUs one session may use (1, 0.5, 500m); enforced only where the host delegates a cgroup v2 to the runner (cpu.max).",
};

pub const RUNNER_LOCAL_MAX_DISK: Setting = Setting {
    name: "RUNNER_LOCAL_MAX_DISK",
    default: "1Gi",
    description: "Bytes one session's directory may hold (any one file: RLIMIT_FSIZE; the whole directory: checked every second, a run session past it is stopped and failed, a watch session's apps are taken down). Bytes, or with a Ki/Mi/Gi suffix.",
};

/// Typed for `SessionLimits::default`; the local config's tests prove it is
/// [`RUNNER_LOCAL_MAX_PROCESSES`]'s documented default.
pub const DEFAULT_MAX_PROCESSES: u64 = 512;
/// Open files per process: far above what a Telo server needs, far below
/// what exhausts the host's file table.
pub const MAX_OPEN_FILES: u64 = 4096;
/// The largest a sandbox's private `/tmp` (and `/var/tmp`) may grow: they
/// are memory, so they are bounded apart from the session's directory.
pub const MAX_PRIVATE_TMP_BYTES: u64 = 256 << 20;

pub const BYTES_RULE: &str = "be a byte size such as 512Mi, 1Gi or 1073741824";
const CPU_RULE: &str = "be a number of CPUs such as 1, 0.5 or 500m";

/// One session's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Per process (`RLIMIT_DATA`) and, with a cgroup, for the session.
    pub memory_bytes: u64,
    /// Processes and threads of the session.
    pub processes: u64,
    /// Thousandths of a CPU (cgroup only).
    pub cpu_millis: u64,
    /// The session's directory, and any one file (`RLIMIT_FSIZE`).
    pub disk_bytes: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 1 << 30,
            processes: DEFAULT_MAX_PROCESSES,
            cpu_millis: 1000,
            disk_bytes: 1 << 30,
        }
    }
}

impl SessionLimits {
    /// The size of each private `/tmp` of a sandbox.
    pub fn private_tmp_bytes(&self) -> u64 {
        self.disk_bytes.min(MAX_PRIVATE_TMP_BYTES)
    }
}

/// Reads the four variables; each bad one is refused by name.
pub fn load_session_limits(env: &Env) -> Result<SessionLimits, ConfigError> {
    let bytes = |setting: Setting| -> Result<u64, ConfigError> {
        let raw = setting.string_or_default(env);
        parse_bytes(&raw)
            .filter(|bytes| *bytes > 0)
            .ok_or_else(|| ConfigError::invalid(setting.name, BYTES_RULE, &raw))
    };
    let memory_bytes = bytes(RUNNER_LOCAL_MAX_MEMORY)?;
    let disk_bytes = bytes(RUNNER_LOCAL_MAX_DISK)?;
    let processes = RUNNER_LOCAL_MAX_PROCESSES.positive_int(env)?;
    let raw_cpu = RUNNER_LOCAL_MAX_CPU.string_or_default(env);
    let cpu_millis = parse_cpu_millis(&raw_cpu)
        .filter(|millis| *millis > 0)
        .ok_or_else(|| ConfigError::invalid(RUNNER_LOCAL_MAX_CPU.name, CPU_RULE, &raw_cpu))?;
    Ok(SessionLimits {
        memory_bytes,
        processes,
        cpu_millis,
        disk_bytes,
    })
}

/// `1073741824`, `512Mi`, `1Gi`, `2G` (Kubernetes' quantity suffixes).
pub fn parse_bytes(raw: &str) -> Option<u64> {
    let raw = raw.trim();
    let digits_end = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (number, suffix) = raw.split_at(digits_end);
    let number: u64 = number.parse().ok()?;
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    number.checked_mul(unit)
}

/// `1`, `0.5`, `500m` → thousandths of a CPU.
pub fn parse_cpu_millis(raw: &str) -> Option<u64> {
    let raw = raw.trim();
    if raw.is_empty() {
        return None;
    }
    if let Some(millis) = raw.strip_suffix('m') {
        return millis.parse().ok();
    }
    let (whole, fraction) = raw.split_once('.').unwrap_or((raw, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let fraction: u64 = format!("{fraction:0<3}").parse().ok()?;
    whole.checked_mul(1000)?.checked_add(fraction)
}

/// The runner's own hard limits, which no workload can be given more of:
/// `prlimit` above them fails, and with it the session's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunnerLimits {
    pub open_files: Option<u64>,
    pub processes: Option<u64>,
}

impl RunnerLimits {
    /// From `/proc/self/limits`; what cannot be read is taken as unlimited.
    pub fn read() -> Self {
        std::fs::read_to_string("/proc/self/limits")
            .map(|text| Self::parse(&text))
            .unwrap_or_default()
    }

    /// The hard column of `Max open files` and `Max processes`.
    pub fn parse(text: &str) -> Self {
        let hard = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|value| value.parse().ok())
        };
        Self {
            open_files: hard("Max open files"),
            processes: hard("Max processes"),
        }
    }
}

/// `prlimit --nproc=… --data=… --fsize=… --nofile=… --core=0 --`: run
/// inside the sandbox before the workload, so the limits hold for it and
/// everything it starts, hard and soft (a workload cannot raise them).
pub fn prlimit_argv(
    prlimit: &Path,
    limits: &SessionLimits,
    runner: &RunnerLimits,
) -> Vec<OsString> {
    let capped = |wanted: u64, hard: Option<u64>| hard.map_or(wanted, |hard| wanted.min(hard));
    vec![
        prlimit.as_os_str().to_owned(),
        format!("--nproc={}", capped(limits.processes, runner.processes)).into(),
        format!("--data={}", limits.memory_bytes).into(),
        format!("--fsize={}", limits.disk_bytes).into(),
        format!("--nofile={}", capped(MAX_OPEN_FILES, runner.open_files)).into(),
        "--core=0".into(),
        "--".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_take_kubernetes_suffixes() {
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        assert_eq!(parse_bytes(" 512Mi "), Some(512 << 20));
        assert_eq!(parse_bytes("1Gi"), Some(1 << 30));
        assert_eq!(parse_bytes("2G"), Some(2_000_000_000));
        for bad in ["", "Mi", "1.5Gi", "1gb", "-1", "99999999999Ti"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cpus_are_whole_fractional_or_thousandths() {
        assert_eq!(parse_cpu_millis("1"), Some(1000));
        assert_eq!(parse_cpu_millis("0.5"), Some(500));
        assert_eq!(parse_cpu_millis(".25"), Some(250));
        assert_eq!(parse_cpu_millis("250m"), Some(250));
        assert_eq!(parse_cpu_millis("2.125"), Some(2125));
        for bad in ["", "x", "1.2345", "1.x", "m"] {
            assert_eq!(parse_cpu_millis(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_defaults_bound_every_session() {
        let limits = load_session_limits(&Env::new()).unwrap();
        assert_eq!(limits, SessionLimits::default());
        assert_eq!(limits.private_tmp_bytes(), MAX_PRIVATE_TMP_BYTES);
    }

    #[test]
    fn each_bad_variable_is_refused_by_name() {
        let refused = |var: &str, value: &str| {
            load_session_limits(&runner_core::config::env_from_pairs(&[(var, value)]))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused("RUNNER_LOCAL_MAX_MEMORY", "lots"),
            "RUNNER_LOCAL_MAX_MEMORY must be a byte size such as 512Mi, 1Gi or 1073741824, got 'lots'."
        );
        assert_eq!(
            refused("RUNNER_LOCAL_MAX_DISK", "0"),
            "RUNNER_LOCAL_MAX_DISK must be a byte size such as 512Mi, 1Gi or 1073741824, got '0'."
        );
        assert_eq!(
            refused("RUNNER_LOCAL_MAX_CPU", "fast"),
            "RUNNER_LOCAL_MAX_CPU must be a number of CPUs such as 1, 0.5 or 500m, got 'fast'."
        );
        assert!(
            refused("RUNNER_LOCAL_MAX_PROCESSES", "0").starts_with("RUNNER_LOCAL_MAX_PROCESSES")
        );
    }

    #[test]
    fn the_workload_is_never_given_more_than_the_runner_has() {
        let limits = SessionLimits {
            memory_bytes: 1 << 30,
            processes: 512,
            cpu_millis: 1000,
            disk_bytes: 1 << 20,
        };
        let runner = RunnerLimits::parse(
            "Limit                     Soft Limit           Hard Limit           Units\n\
             Max processes             96362                96362                processes\n\
             Max open files            1024                 2048                 files\n",
        );
        assert_eq!(
            runner,
            RunnerLimits {
                open_files: Some(2048),
                processes: Some(96362)
            }
        );
        let argv = prlimit_argv(Path::new("/usr/bin/prlimit"), &limits, &runner);
        assert_eq!(
            argv,
            [
                "/usr/bin/prlimit",
                "--nproc=512",
                "--data=1073741824",
                "--fsize=1048576",
                "--nofile=2048",
                "--core=0",
                "--"
            ]
        );
        let unlimited = RunnerLimits::parse(
            "Max processes             unlimited            unlimited            processes\n",
        );
        assert_eq!(unlimited, RunnerLimits::default());
    }
}
