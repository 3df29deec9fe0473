//! Which warmed cache a kernel's sessions start from: one per kernel and
//! warm-up manifest, named after both.
//!
//! What the kernel caches is keyed by what it was built from (a controller
//! bundle by its module's sources, an npm install root by the kernel's own
//! packages), so a cache warmed by one kernel with one manifest holds
//! exactly what that kernel would build for those modules, and nothing of
//! any session. Another kernel release, another installation of the CLI, or
//! another manifest is another cache.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::process::executable::FileStamp;

/// Every entry's directory name starts with this: no session id (twelve
/// base32 letters) and none of the runner's own names (`.warming-…`) can.
pub const ENTRY_PREFIX: &str = "kernel-";
/// Hex digits of the digest in an entry's name.
const DIGEST_HEX_LEN: usize = 16;
/// Longest version text kept in a name.
const VERSION_CHARS: usize = 64;

/// The kernel sessions run, as far as its cache is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIdentity {
    /// The Telo CLI as sessions run it (resolved, absolute).
    pub telo: PathBuf,
    /// The release it says it is (`telo --version`), or the one it was
    /// chosen by (`RUNNER_LOCAL_TELO_VERSIONS`).
    pub version: Option<String>,
    /// For a kernel that names no release: its executable as `stat` sees
    /// it, so a rebuilt kernel never starts from its predecessor's cache.
    pub stamp: Option<FileStamp>,
}

/// The name of one warmed cache under the shared cache's root.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(String);

impl CacheKey {
    /// `kernel-<version>-<digest>`: the version for whoever lists the
    /// directory, the digest over everything the cache depends on.
    pub fn derive(kernel: &KernelIdentity, warm_up_manifest: &[u8]) -> Self {
        let mut digest = Sha256::new();
        let mut field = |name: &str, value: &[u8]| {
            digest.update(name.as_bytes());
            digest.update((value.len() as u64).to_le_bytes());
            digest.update(value);
        };
        field("telo", kernel.telo.as_os_str().as_encoded_bytes());
        match (&kernel.version, &kernel.stamp) {
            (Some(version), _) => field("version", version.as_bytes()),
            (None, Some(stamp)) => field(
                "stamp",
                format!(
                    "{}:{}.{}:{}:{}",
                    stamp.len, stamp.mtime.0, stamp.mtime.1, stamp.dev, stamp.inode
                )
                .as_bytes(),
            ),
            (None, None) => field("unidentified", b""),
        }
        field("warm-up", warm_up_manifest);
        let digest = hex::encode(digest.finalize());
        let version = kernel
            .version
            .as_deref()
            .map_or_else(|| "unversioned".to_owned(), name_safe);
        Self(format!(
            "{ENTRY_PREFIX}{version}-{}",
            &digest[..DIGEST_HEX_LEN]
        ))
    }

    /// The key a directory name is, if it is one: anything else under the
    /// cache's root is not a complete entry.
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix(ENTRY_PREFIX)?;
        let (version, digest) = rest.rsplit_once('-')?;
        let well_formed = !version.is_empty()
            && version.chars().count() <= VERSION_CHARS
            && version.chars().all(is_name_safe)
            && digest.len() == DIGEST_HEX_LEN
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        well_formed.then(|| Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_name_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '_')
}

fn name_safe(version: &str) -> String {
    version
        .chars()
        .take(VERSION_CHARS)
        .map(|c| if is_name_safe(c) { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_core::ids::is_session_id;

    fn kernel(version: Option<&str>) -> KernelIdentity {
        KernelIdentity {
            telo: PathBuf::from("/opt/telo/bin/telo"),
            version: version.map(str::to_owned),
            stamp: None,
        }
    }

    fn stamp(inode: u64) -> FileStamp {
        FileStamp {
            path: PathBuf::from("/opt/telo/bin/telo"),
            len: 10,
            mtime: (1, 2),
            dev: 3,
            inode,
        }
    }

    #[test]
    fn a_key_names_the_release_and_digests_the_rest() {
        let key = CacheKey::derive(&kernel(Some("0.81.0")), b"imports: {}");
        let name = key.as_str();
        assert!(name.starts_with("kernel-0.81.0-"), "{name}");
        assert_eq!(name.len(), "kernel-0.81.0-".len() + 16);
        assert_eq!(CacheKey::parse(name), Some(key.clone()));
        assert_eq!(
            key,
            CacheKey::derive(&kernel(Some("0.81.0")), b"imports: {}")
        );
    }

    #[test]
    fn another_release_installation_or_manifest_is_another_cache() {
        let base = CacheKey::derive(&kernel(Some("0.81.0")), b"a");
        assert_ne!(base, CacheKey::derive(&kernel(Some("0.82.0")), b"a"));
        assert_ne!(base, CacheKey::derive(&kernel(Some("0.81.0")), b"b"));
        let elsewhere = KernelIdentity {
            telo: PathBuf::from("/usr/local/bin/telo"),
            ..kernel(Some("0.81.0"))
        };
        assert_ne!(base, CacheKey::derive(&elsewhere, b"a"));
    }

    #[test]
    fn a_kernel_without_a_release_is_known_by_its_file() {
        let built = |inode| KernelIdentity {
            stamp: Some(stamp(inode)),
            ..kernel(None)
        };
        let first = CacheKey::derive(&built(1), b"a");
        assert!(first.as_str().starts_with("kernel-unversioned-"), "{first}");
        assert_eq!(first, CacheKey::derive(&built(1), b"a"));
        assert_ne!(first, CacheKey::derive(&built(2), b"a"));
        // A release is the kernel's word for what it is: a reinstall of the
        // same release keeps its cache.
        let released = |inode| KernelIdentity {
            stamp: Some(stamp(inode)),
            ..kernel(Some("1.0.0"))
        };
        assert_eq!(
            CacheKey::derive(&released(1), b"a"),
            CacheKey::derive(&released(2), b"a")
        );
    }

    #[test]
    fn a_version_is_made_safe_for_a_directory_name() {
        let key = CacheKey::derive(&kernel(Some("1.0.0-rc/../x y")), b"a");
        assert!(key.as_str().starts_with("kernel-1.0.0_rc_.._x_y-"), "{key}");
        assert_eq!(CacheKey::parse(key.as_str()), Some(key));
    }

    #[test]
    fn only_names_the_runner_gives_entries_are_entries() {
        for name in [
            "telo",
            "npm",
            ".warming-kernel-0.81.0-0123456789abcdef-1",
            "kernel-0.81.0-0123456789ABCDEF",
            "kernel-0.81.0-0123456789abcde",
            "kernel--0123456789abcdef",
            "kernel-a/b-0123456789abcdef",
            "abcdefgh2345",
        ] {
            assert_eq!(CacheKey::parse(name), None, "{name}");
        }
        let key = CacheKey::parse("kernel-0.81.0-0123456789abcdef").unwrap();
        assert!(!is_session_id(key.as_str()));
    }
}
