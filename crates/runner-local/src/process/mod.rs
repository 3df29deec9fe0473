//! Starting and stopping processes: the one spawner thread, a process on a
//! terminal or on pipes, its process group, the processes of a sandbox as
//! the host sees them, and finding a program on `PATH`.

pub mod args_file;
pub mod executable;
pub mod group;
pub mod pipes;
pub mod pty;
pub mod spawner;
pub mod tree;
