//! Which host processes run inside a sandbox: everything below the
//! sandbox's init (the child of the `bwrap` the runner started), read from
//! `/proc` as the runner's PID namespace sees it.
//!
//! A stop must ask the workload to end (SIGTERM) without signalling `bwrap`
//! itself, which dies of SIGTERM and takes the sandbox with it — the
//! workload would get no time to shut down. The workload and its children
//! are in process groups and sessions of their own (`setsid` children
//! included), but every process of the sandbox's PID namespace descends from
//! its init: orphans are re-parented to it.

use std::collections::HashMap;

use nix::unistd::Pid;

/// `(pid, parent pid)` of every process readable in `/proc`.
pub fn process_table() -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            Some((pid, parent_pid(&stat)?))
        })
        .collect()
}

/// The parent pid from a `/proc/<pid>/stat` line: `<pid> (<comm>) <state>
/// <ppid> …`, where the command name may hold spaces and parentheses.
pub fn parent_pid(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// Every descendant of `leader`'s children — not `leader` (`bwrap`), not its
/// children (the sandbox's init) — in `table`.
pub fn below_sandbox_init(table: &[(i32, i32)], leader: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for &(pid, ppid) in table {
        children.entry(ppid).or_default().push(pid);
    }
    let mut found = Vec::new();
    let mut pending: Vec<i32> = children
        .get(&leader)
        .into_iter()
        .flatten()
        .flat_map(|init| children.get(init).into_iter().flatten().copied())
        .collect();
    while let Some(pid) = pending.pop() {
        // A pid seen twice would mean a cycle in a table read while
        // processes came and went: never loop on it.
        if found.contains(&pid) || pid == leader {
            continue;
        }
        found.push(pid);
        pending.extend(children.get(&pid).into_iter().flatten().copied());
    }
    found
}

/// The workload processes of the sandbox `bwrap` process `leader` runs.
pub fn sandbox_processes(leader: Pid) -> Vec<Pid> {
    below_sandbox_init(&process_table(), leader.as_raw())
        .into_iter()
        .map(Pid::from_raw)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_a_command_name_with_spaces_and_parentheses() {
        assert_eq!(parent_pid("42 (sh) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_pid("42 (a (b) c) R 1 42 42 0"), Some(1));
        assert_eq!(parent_pid("42 (sh"), None);
        assert_eq!(parent_pid(""), None);
    }

    #[test]
    fn everything_below_the_init_is_found_and_neither_bwrap_nor_init_is() {
        // 100 bwrap → 101 init → 102 workload → 103 child → 104 grandchild;
        // 105 a daemon the init adopted; 200 an unrelated process tree.
        let table = [
            (1, 0),
            (100, 50),
            (101, 100),
            (102, 101),
            (103, 102),
            (104, 103),
            (105, 101),
            (200, 1),
            (201, 200),
        ];
        let mut found = below_sandbox_init(&table, 100);
        found.sort_unstable();
        assert_eq!(found, [102, 103, 104, 105]);
    }

    #[test]
    fn a_sandbox_still_being_set_up_has_no_workload_yet() {
        assert_eq!(below_sandbox_init(&[(100, 50)], 100), Vec::<i32>::new());
        assert_eq!(
            below_sandbox_init(&[(100, 50), (101, 100)], 100),
            Vec::<i32>::new()
        );
    }

    #[test]
    fn a_cycle_in_a_torn_table_ends() {
        let table = [(101, 100), (102, 101), (103, 102), (102, 103)];
        let mut found = below_sandbox_init(&table, 100);
        found.sort_unstable();
        assert_eq!(found, [102, 103]);
    }
}
