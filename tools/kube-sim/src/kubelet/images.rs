//! The image table: which local behaviour an image reference stands for,
//! and how a pull of it goes (present, pulled, or failing exactly like a
//! registry that does not have it).

use std::path::PathBuf;

use globset::{Glob, GlobMatcher};

/// What running a container of an image means here.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageBehaviour {
    /// The `telo` CLI: `telo …` runs `fake-telo …`; `sh -c` scripts run with
    /// `telo` on `PATH`.
    FakeTelo,
    /// An app image whose entrypoint runs `fake-telo run <entry>`.
    FakeTeloEntry(PathBuf),
    /// busybox as the bundle init container: `wget` + `tar` in the script
    /// are done by a built-in that really downloads and unpacks; any other
    /// script runs with the host's `/bin/sh`.
    BundleFetcher,
    /// Runs the container's command on the host as given (paths mapped).
    Host,
    /// An image whose executables are the files of this host directory
    /// (`/usr/local/bin` of the image, say): the command's program is
    /// looked up there by its file name. The runner's own image, built from
    /// the same binary the tests run.
    Binaries(PathBuf),
    /// An image whose `ENTRYPOINT` is this host program: a container's
    /// `args` follow it; a `command` replaces it and is looked up beside
    /// it, as in [`Self::Binaries`]. The runner's image as a Deployment
    /// runs it (`args: ["serve"]`).
    Entrypoint(PathBuf),
    /// No process at all: the container prints one line when it starts
    /// and runs until it is killed. For scale benchmarks.
    Virtual,
    /// The registry refuses the pull with this message.
    PullError(String),
}

impl ImageBehaviour {
    /// Parses the `--image <glob>=<behaviour>` right-hand side.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "fake-telo" => Ok(Self::FakeTelo),
            "bundle-fetcher" => Ok(Self::BundleFetcher),
            "host" => Ok(Self::Host),
            "virtual" => Ok(Self::Virtual),
            "pull-error" => Ok(Self::PullError(String::new())),
            other => {
                if let Some(path) = other.strip_prefix("fake-telo:") {
                    Ok(Self::FakeTeloEntry(PathBuf::from(path)))
                } else if let Some(dir) = other.strip_prefix("bin:") {
                    Ok(Self::Binaries(PathBuf::from(dir)))
                } else if let Some(program) = other.strip_prefix("entrypoint:") {
                    Ok(Self::Entrypoint(PathBuf::from(program)))
                } else if let Some(msg) = other.strip_prefix("pull-error:") {
                    Ok(Self::PullError(msg.to_string()))
                } else {
                    Err(format!(
                        "unknown image behaviour {other:?}: expected fake-telo, fake-telo:<entry>, bundle-fetcher, host, bin:<dir>, entrypoint:<program>, virtual or pull-error[:<message>]"
                    ))
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Rule {
    pattern: String,
    matcher: GlobMatcher,
    behaviour: ImageBehaviour,
}

/// Image glob → behaviour; the first matching rule wins, rules added by the
/// user before the defaults.
///
/// The table says what an image *does*; the registry says whether it
/// *exists*. With no published globs every image the table knows can be
/// pulled, as before. Once any is given the registry is closed: an image
/// that matches none is not found, whatever its behaviour, so a test can
/// say "this tag was never published" the way a real registry would.
#[derive(Debug, Clone, Default)]
pub struct ImageTable {
    rules: Vec<Rule>,
    defaults: Vec<Rule>,
    published: Vec<(String, GlobMatcher)>,
}

fn rule(pattern: &str, behaviour: ImageBehaviour) -> Result<Rule, String> {
    let glob = Glob::new(pattern).map_err(|e| format!("invalid image glob {pattern:?}: {e}"))?;
    Ok(Rule {
        pattern: pattern.to_string(),
        matcher: glob.compile_matcher(),
        behaviour,
    })
}

impl ImageTable {
    /// The default table: Telo kernel images run fake-telo, busybox is the
    /// bundle fetcher.
    pub fn with_defaults() -> Self {
        let defaults = [
            ("telorun/node:*", ImageBehaviour::FakeTelo),
            ("*telo*", ImageBehaviour::FakeTelo),
            ("busybox:*", ImageBehaviour::BundleFetcher),
            ("busybox", ImageBehaviour::BundleFetcher),
        ]
        .into_iter()
        .filter_map(|(p, b)| rule(p, b).ok())
        .collect();
        Self {
            rules: Vec::new(),
            defaults,
            published: Vec::new(),
        }
    }

    /// Declares that the registry holds the images matching `pattern` (and,
    /// from the first call on, only what such patterns match).
    pub fn publish(&mut self, pattern: &str) -> Result<(), String> {
        let glob = Glob::new(pattern)
            .map_err(|e| format!("invalid published-image glob {pattern:?}: {e}"))?;
        self.published
            .push((pattern.to_string(), glob.compile_matcher()));
        Ok(())
    }

    /// Whether a registry holds `image`: always, unless published globs
    /// were given and none matches it.
    pub fn is_published(&self, image: &str) -> bool {
        if self.published.is_empty() {
            return true;
        }
        let short = short_reference(image);
        let full = normalize(image);
        self.published.iter().any(|(_, matcher)| {
            matcher.is_match(image) || matcher.is_match(&short) || matcher.is_match(&full)
        })
    }

    /// What a pull of `image` yields: its behaviour when the registry holds
    /// it and the table knows it, `None` (not found) otherwise.
    pub fn pullable(&self, image: &str) -> Option<&ImageBehaviour> {
        if !self.is_published(image) {
            return None;
        }
        self.lookup(image)
    }

    pub fn published_patterns(&self) -> Vec<String> {
        self.published.iter().map(|(p, _)| p.clone()).collect()
    }

    pub fn add(&mut self, pattern: &str, behaviour: ImageBehaviour) -> Result<(), String> {
        self.rules.push(rule(pattern, behaviour)?);
        Ok(())
    }

    /// Parses `<glob>=<behaviour>`.
    pub fn add_spec(&mut self, spec: &str) -> Result<(), String> {
        let (glob, behaviour) = spec
            .rsplit_once('=')
            .ok_or_else(|| format!("--image expects <glob>=<behaviour>, got {spec:?}"))?;
        self.add(glob, ImageBehaviour::parse(behaviour)?)
    }

    pub fn lookup(&self, image: &str) -> Option<&ImageBehaviour> {
        let short = short_reference(image);
        self.rules
            .iter()
            .chain(self.defaults.iter())
            .find(|r| r.matcher.is_match(image) || r.matcher.is_match(&short))
            .map(|r| &r.behaviour)
    }

    pub fn patterns(&self) -> Vec<String> {
        self.rules
            .iter()
            .chain(self.defaults.iter())
            .map(|r| r.pattern.clone())
            .collect()
    }
}

/// `docker.io/library/busybox:stable` → `busybox:stable`, so globs written
/// against short names match normalized references too.
fn short_reference(image: &str) -> String {
    image
        .strip_prefix("docker.io/library/")
        .or_else(|| image.strip_prefix("docker.io/"))
        .unwrap_or(image)
        .to_string()
}

/// The fully qualified reference containerd reports (`busybox:stable` →
/// `docker.io/library/busybox:stable`; no tag → `:latest`).
pub fn normalize(image: &str) -> String {
    let (name, suffix) = match image.find('@') {
        Some(i) => (&image[..i], &image[i..]),
        None => match image.rfind(':') {
            Some(i) if !image[i..].contains('/') => (&image[..i], &image[i..]),
            _ => (image, ":latest"),
        },
    };
    let first = name.split('/').next().unwrap_or("");
    let has_registry =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let full = if has_registry {
        name.to_string()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    };
    format!("{full}{suffix}")
}

/// `InvalidImageName`'s message, when the reference cannot be parsed.
pub fn invalid_reference(image: &str) -> Option<String> {
    let name = image.split(['@']).next().unwrap_or(image);
    let repo = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    let why = if image.is_empty() || image.chars().any(|c| c.is_whitespace()) {
        "invalid reference format"
    } else if repo.chars().any(|c| c.is_ascii_uppercase()) {
        "invalid reference format: repository name must be lowercase"
    } else if repo.starts_with(['-', '.', '_', '/'])
        || repo.ends_with(['-', '.', '_', '/'])
        || repo.contains("//")
    {
        "invalid reference format"
    } else {
        return None;
    };
    Some(format!(
        "Failed to apply default image tag {image:?}: couldn't parse image name {image:?}: {why}"
    ))
}

/// What containerd says when a registry has no such image.
pub fn not_found_message(image: &str) -> String {
    let full = normalize(image);
    format!(
        "rpc error: code = NotFound desc = failed to pull and unpack image {full:?}: failed to resolve reference {full:?}: {full}: not found"
    )
}

/// A stable fake digest for an image (`imageID`).
pub fn image_id(image: &str) -> String {
    let full = normalize(image);
    let repo = full.split([':', '@']).next().unwrap_or(&full).to_string();
    // FNV-1a, stretched to 64 hex characters: stable across runs.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in full.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let hex: String = (0..4)
        .map(|i| format!("{:016x}", h.rotate_left(i * 16)))
        .collect();
    format!("{repo}@sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_map_telo_and_busybox() {
        let t = ImageTable::with_defaults();
        assert_eq!(
            t.lookup("telorun/node:24-slim"),
            Some(&ImageBehaviour::FakeTelo)
        );
        assert_eq!(
            t.lookup("ghcr.io/acme/telo-kernel:1"),
            Some(&ImageBehaviour::FakeTelo)
        );
        assert_eq!(
            t.lookup("busybox:stable"),
            Some(&ImageBehaviour::BundleFetcher)
        );
        assert_eq!(
            t.lookup("docker.io/library/busybox:1.36"),
            Some(&ImageBehaviour::BundleFetcher)
        );
        assert_eq!(t.lookup("nginx:1.27"), None);
    }

    #[test]
    fn user_rules_win_over_defaults() {
        let mut t = ImageTable::with_defaults();
        t.add_spec("busybox:*=host").expect("parses");
        assert_eq!(t.lookup("busybox:stable"), Some(&ImageBehaviour::Host));
        assert!(t.add_spec("nope").is_err());
        assert!(t.add_spec("x=teleport").is_err());
        t.add_spec("telo-runner:*=bin:/opt/bin").expect("parses");
        assert_eq!(
            t.lookup("telo-runner:1"),
            Some(&ImageBehaviour::Binaries(PathBuf::from("/opt/bin")))
        );
    }

    #[test]
    fn without_published_globs_every_known_image_can_be_pulled() {
        let t = ImageTable::with_defaults();
        assert!(t.is_published("telorun/node:0.99.0-slim"));
        assert_eq!(
            t.pullable("telorun/node:0.99.0-slim"),
            Some(&ImageBehaviour::FakeTelo)
        );
        assert_eq!(t.pullable("nginx:1.27"), None);
    }

    #[test]
    fn published_globs_close_the_registry_to_everything_else() {
        let mut t = ImageTable::with_defaults();
        t.publish("telorun/node:0.96.*").expect("parses");
        t.publish("docker.io/library/busybox:*").expect("parses");
        assert_eq!(
            t.pullable("telorun/node:0.96.0-slim"),
            Some(&ImageBehaviour::FakeTelo)
        );
        assert_eq!(
            t.pullable("docker.io/telorun/node:0.96.1-slim"),
            Some(&ImageBehaviour::FakeTelo)
        );
        assert_eq!(
            t.pullable("busybox:stable"),
            Some(&ImageBehaviour::BundleFetcher)
        );
        assert_eq!(t.pullable("telorun/node:0.99.0-slim"), None);
        assert_eq!(
            t.lookup("telorun/node:0.99.0-slim"),
            Some(&ImageBehaviour::FakeTelo),
            "what an image does is unchanged; only whether it exists"
        );
        assert!(t.publish("[").is_err());
    }

    #[test]
    fn references_normalize_like_containerd() {
        assert_eq!(
            normalize("busybox:stable"),
            "docker.io/library/busybox:stable"
        );
        assert_eq!(normalize("telorun/node"), "docker.io/telorun/node:latest");
        assert_eq!(normalize("ghcr.io/a/b:1"), "ghcr.io/a/b:1");
        assert_eq!(normalize("localhost:5000/x"), "localhost:5000/x:latest");
    }

    #[test]
    fn uppercase_repositories_are_invalid_names() {
        assert!(
            invalid_reference("Busybox:1")
                .is_some_and(|m| m.ends_with("repository name must be lowercase"))
        );
        assert!(invalid_reference("busybox:1").is_none());
        assert!(invalid_reference("has space").is_some());
    }
}
