//! Container paths → host paths. A container sees its volumes at their
//! mount paths (`/app`, `/work`); here each volume is a directory of the
//! pod's sandbox, so every path a process is given is rewritten to it.

use std::path::{Path, PathBuf};

/// The mounts of one container, longest mount path first.
#[derive(Debug, Clone, Default)]
pub struct Mounts {
    entries: Vec<(String, PathBuf)>,
}

impl Mounts {
    pub fn new(mut entries: Vec<(String, PathBuf)>) -> Self {
        for (mp, _) in &mut entries {
            while mp.len() > 1 && mp.ends_with('/') {
                mp.pop();
            }
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.0.len()));
        Self { entries }
    }

    /// The host path of a container path under a mount.
    pub fn map_path(&self, path: &str) -> Option<PathBuf> {
        self.entries.iter().find_map(|(mp, host)| {
            if path == mp {
                Some(host.clone())
            } else {
                path.strip_prefix(mp.as_str())
                    .and_then(|rest| rest.strip_prefix('/'))
                    .map(|rest| host.join(rest))
            }
        })
    }

    /// A command-line argument: a path, or `--opt=/path`.
    pub fn map_arg(&self, arg: &str) -> String {
        if let Some(p) = self.map_path(arg) {
            return p.to_string_lossy().into_owned();
        }
        if let Some((opt, value)) = arg.split_once('=')
            && let Some(p) = self.map_path(value)
        {
            return format!("{opt}={}", p.to_string_lossy());
        }
        arg.to_string()
    }

    /// A shell script: every mount path that starts a path token is
    /// replaced (`-C /app`, `"/app/x"`, `$HOME/…` stays as is).
    pub fn map_script(&self, script: &str) -> String {
        let mut out = String::with_capacity(script.len());
        let bytes = script.as_bytes();
        let mut i = 0;
        'outer: while i < script.len() {
            let boundary = i == 0
                || matches!(
                    bytes[i - 1],
                    b' ' | b'\t' | b'\n' | b'"' | b'\'' | b'=' | b'(' | b';'
                );
            if boundary && bytes[i] == b'/' {
                for (mp, host) in &self.entries {
                    if script[i..].starts_with(mp.as_str()) {
                        let end = i + mp.len();
                        let next = bytes.get(end).copied();
                        if matches!(
                            next,
                            None | Some(b'/' | b' ' | b'"' | b'\'' | b';' | b'\n' | b'\t' | b')')
                        ) {
                            out.push_str(&host.to_string_lossy());
                            i = end;
                            continue 'outer;
                        }
                    }
                }
            }
            let ch = script[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
        out
    }

    pub fn host_of(&self, mount_path: &str) -> Option<&Path> {
        self.entries
            .iter()
            .find(|(mp, _)| mp == mount_path)
            .map(|(_, h)| h.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts() -> Mounts {
        Mounts::new(vec![
            ("/app".into(), PathBuf::from("/sb/app")),
            ("/tmp".into(), PathBuf::from("/sb/tmp")),
            ("/home/telo".into(), PathBuf::from("/sb/home")),
        ])
    }

    #[test]
    fn paths_under_mounts_are_rewritten() {
        let m = mounts();
        assert_eq!(
            m.map_path("/app/telo.yaml"),
            Some(PathBuf::from("/sb/app/telo.yaml"))
        );
        assert_eq!(m.map_path("/app"), Some(PathBuf::from("/sb/app")));
        assert_eq!(m.map_path("/apple"), None);
        assert_eq!(m.map_arg("--dir=/tmp/x"), "--dir=/sb/tmp/x");
        assert_eq!(m.map_arg("0.0.0.0:9230"), "0.0.0.0:9230");
    }

    #[test]
    fn scripts_have_their_mount_paths_rewritten() {
        let m = mounts();
        let script =
            r#"set -e; wget -qO /tmp/body.tgz "http://h/x"; tar xzf /tmp/body.tgz -C /app"#;
        assert_eq!(
            m.map_script(script),
            r#"set -e; wget -qO /sb/tmp/body.tgz "http://h/x"; tar xzf /sb/tmp/body.tgz -C /sb/app"#
        );
        assert_eq!(m.map_script("cat /application"), "cat /application");
    }
}
