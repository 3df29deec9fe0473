//! The container engine and the locally built images the container tests
//! run (`scripts/engine.sh`, `scripts/image.sh`; `.ci/run` starts the one
//! and builds the others, and exports where they are). A test that needs
//! them fails, naming what to run, when they are missing: it never skips.

use std::process::{Command, Output};

/// The images `scripts/image.sh` builds, by role.
#[derive(Debug, Clone, Copy)]
pub enum Image {
    /// The runner (`telo-runner:dev`).
    Runner,
    /// The real Telo kernel's image (`telorun/node:0.81.0-slim`), built
    /// only where a kernel is given: its tests are real-kernel tests.
    Session,
    /// The stand-in kernel image (`telo-runner/fake-telo:dev`): fake-telo as
    /// `telo`, laid out like the real kernel's image.
    FakeKernel,
    /// The init container's image (`busybox:stable`).
    Init,
    /// A Debian base with coreutils (`telo-runner/debian:bookworm`).
    Base,
}

impl Image {
    /// The image's reference, as `scripts/image.sh env` exports it.
    pub fn reference(self) -> String {
        let (var, default) = match self {
            Image::Runner => ("TELO_RUNNER_IMAGE_RUNNER", "telo-runner:dev"),
            Image::Session => ("TELO_RUNNER_IMAGE_SESSION", "telorun/node:0.81.0-slim"),
            Image::FakeKernel => ("TELO_RUNNER_IMAGE_FAKE_KERNEL", "telo-runner/fake-telo:dev"),
            Image::Init => ("TELO_RUNNER_IMAGE_INIT", "busybox:stable"),
            Image::Base => ("TELO_RUNNER_IMAGE_BASE", "telo-runner/debian:bookworm"),
        };
        std::env::var(var).unwrap_or_else(|_| default.to_owned())
    }
}

/// Where the session image keeps the Telo modules, for rendering the
/// fixture's examples (`@TELO_MODULES@`) to run inside it.
pub fn image_modules_dir() -> String {
    std::env::var("TELO_RUNNER_IMAGE_MODULES").unwrap_or_else(|_| "/opt/telo/modules".to_owned())
}

/// The engine's client, checked to answer and to hold `images`.
pub fn engine(images: &[Image]) -> String {
    let client =
        std::env::var("TELO_RUNNER_CONTAINER_ENGINE").unwrap_or_else(|_| "docker".to_owned());
    let info = Command::new(&client)
        .args(["info", "--format", "{{.ID}}"])
        .output();
    assert!(
        info.as_ref().is_ok_and(|out| out.status.success()),
        "no container engine answers through '{client}': run `scripts/engine.sh start` \
         (and export what `scripts/image.sh env` prints) before the container tests"
    );
    for image in images {
        let reference = image.reference();
        let present = Command::new(&client)
            .args(["image", "inspect", "--format", "{{.Id}}", &reference])
            .output()
            .is_ok_and(|out| out.status.success());
        let how = match image {
            Image::Session => {
                "give a real kernel (TELO_REAL_KERNEL_DIR) and run `scripts/image.sh session`"
            }
            _ => "run `scripts/image.sh all` before the container tests",
        };
        assert!(present, "image {reference} is missing: {how}");
    }
    client
}

/// Runs the engine's client with `args` and returns what it printed.
pub fn run(client: &str, args: &[&str]) -> Output {
    Command::new(client)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("run {client} {args:?}: {err}"))
}

/// A container started by a test, removed (with its state) when the test
/// ends, whatever happens.
pub struct Container {
    pub client: String,
    pub id: String,
}

impl Container {
    /// `docker run -d <args>`; panics with the engine's words on a refusal.
    pub fn start(client: &str, args: &[&str]) -> Container {
        let mut full = vec!["run", "-d"];
        full.extend_from_slice(args);
        let out = run(client, &full);
        assert!(
            out.status.success(),
            "docker run {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Container {
            client: client.to_owned(),
            id: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        }
    }

    /// Everything the container wrote so far, stdout and stderr.
    pub fn logs(&self) -> String {
        let out = run(&self.client, &["logs", &self.id]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(&self.client)
            .args(["rm", "-f", &self.id])
            .output();
    }
}

/// An image a test built for itself, removed when the test ends.
pub struct TestImage {
    pub client: String,
    pub tag: String,
}

impl TestImage {
    /// Builds `tag` from `dockerfile` with `files` (relative path, contents,
    /// executable) as its context.
    pub fn build(client: &str, tag: &str, dockerfile: &str, files: &[(&str, &str, bool)]) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let context = tempfile::tempdir().expect("build context");
        std::fs::write(context.path().join("Dockerfile"), dockerfile).expect("Dockerfile");
        for (path, contents, executable) in files {
            let file = context.path().join(path);
            std::fs::write(&file, contents).expect("context file");
            let mode = if *executable { 0o755 } else { 0o644 };
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
                .expect("context file mode");
        }
        let out = Command::new(client)
            .args(["build", "-q", "-t", tag])
            .arg(context.path())
            .output()
            .unwrap_or_else(|err| panic!("run {client} build: {err}"));
        assert!(
            out.status.success(),
            "building {tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TestImage {
            client: client.to_owned(),
            tag: tag.to_owned(),
        }
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let _ = Command::new(&self.client)
            .args(["rmi", "-f", &self.tag])
            .output();
    }
}
