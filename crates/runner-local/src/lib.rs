//! The local backend of telo-runner: each session runs the Telo CLI (or an
//! operator app's command) as a local process in its own PTY, in a private
//! work directory, inside a bubblewrap sandbox of its own (no view of the
//! runner's processes, environment or files, nor of other sessions), with
//! exactly the session's environment plus `PATH`, `HOME`, `TERM`, `SHELL`
//! and `FORCE_COLOR` (and, for the Telo CLI, a kernel cache of its own, a
//! copy of the one the runner warmed: `TELO_CACHE_DIR`, `npm_config_cache`).
//! A stop asks the session's processes to end (SIGTERM) and kills the whole
//! sandbox after the stop grace period; the probe answers from a check of
//! the sandbox and a self-check of the kernel.
//!
//! The modules, each using only those listed after it:
//! - `backend` ties the others to the core's `Backend` seam: it starts run
//!   sessions and hands watch sessions to `watch`; `config` reads the
//!   environment.
//! - `watch`: watch sessions (one process per app over a workspace the
//!   runner edits), their record and each app's end.
//! - `session`: one running process as the core sees it (`LocalSession`),
//!   wired to its output and input (`session::wiring`), stopped, and
//!   followed to its one terminal status (`session::stop`).
//! - `kernel`: whether the Telo CLI can run at all (`check`, `fingerprint`,
//!   `monitor`), the installed releases (`versions`), and the runs that
//!   warm the kernel caches (`cache_warm_up`).
//! - `sandbox`: what a session's sandbox shows and how `bwrap` is started
//!   (`bubblewrap`), its bounds (`limits`, `cgroup`), and whether this host
//!   can start one (`check`).
//! - `launch`: what runs, as plain data: command line, directory,
//!   environment.
//! - `work_root`: each session's directory and the lock on the root.
//! - `kernel_cache`: the kernel caches on disk, the runner's warmed ones
//!   and each session's own.
//! - `disk_bound`: the bound on a session directory's size.
//! - `process`: starting a process (`plan`, on the `spawner` thread, in a
//!   `pty` or on `pipes`), signalling its `group`, the sandbox's processes
//!   (`tree`), finding a program (`executable`), and the short runs the
//!   checks make (`check_run`).

#![forbid(unsafe_code)]

mod backend;
pub mod config;
pub mod disk_bound;
pub mod kernel;
pub(crate) mod kernel_cache;
pub(crate) mod launch;
pub mod network;
pub mod process;
pub mod sandbox;
pub(crate) mod session;
pub(crate) mod watch;
pub(crate) mod work_root;

pub use backend::{LocalBackend, LocalBackendError};
pub use config::{BubblewrapConfig, LOCAL_SETTINGS, LocalConfig, SandboxConfig, load_local_config};
pub use kernel::monitor::KernelHealth;
