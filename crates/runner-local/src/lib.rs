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
//! `config` reads the environment, `launch` decides what runs (pure data),
//! `sandbox` what a sandbox shows and how it is started, `sandbox_check`
//! whether this host can start one, `work_dir` owns the per-session
//! directories and `kernel_cache` the kernel caches (the runner's warmed
//! ones and each session's own), `spawner`, `pty`, `pipes`,
//! `process_group` and `proc_tree` do the process work, `session` turns the
//! process's end into one terminal status, `kernel_check`,
//! `kernel_fingerprint` and `kernel_monitor` find out whether the Telo CLI
//! can run at all, `watch` runs watch sessions (one process per app over a
//! workspace the runner edits), and `backend` ties them to the core's
//! `Backend` seam.

#![forbid(unsafe_code)]

mod backend;
pub mod config;
pub mod disk_bound;
pub mod kernel;
pub(crate) mod kernel_cache;
pub(crate) mod launch;
pub mod process;
pub mod sandbox;
pub(crate) mod session;
pub(crate) mod watch;
pub(crate) mod work_root;

pub use backend::{LocalBackend, LocalBackendError};
pub use config::{BubblewrapConfig, LOCAL_ENV_VARS, LocalConfig, SandboxConfig, load_local_config};
pub use kernel::monitor::KernelHealth;
