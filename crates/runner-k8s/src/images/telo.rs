//! Which image runs a named telo release (0.17): `<repository>:<version>-<variant>`
//! for a published release, the operator's own image for an unreleased build,
//! pulled under the operator's policy. Plain functions over the configuration.

use runner_api::telo::TeloVersion;
use runner_core::TeloUnavailable;
use runner_core::types::PullPolicy;

pub const DEFAULT_TELO_IMAGE_REPOSITORY: &str = "telorun/node";
pub const DEFAULT_TELO_IMAGE_VARIANT: &str = "slim";

/// `RUNNER_TELO_IMAGE_*`, `RUNNER_TELO_UNRELEASED_IMAGE`, `RUNNER_PULL_POLICY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeloImageSource {
    pub repository: String,
    pub variant: String,
    /// The kernel image an unreleased build (`X+…`) runs; `None` refuses one.
    pub unreleased: Option<String>,
    /// The pull policy of every image the runner chooses itself.
    pub pull_policy: PullPolicy,
}

impl Default for TeloImageSource {
    fn default() -> Self {
        Self {
            repository: DEFAULT_TELO_IMAGE_REPOSITORY.to_owned(),
            variant: DEFAULT_TELO_IMAGE_VARIANT.to_owned(),
            unreleased: None,
            pull_policy: PullPolicy::Missing,
        }
    }
}

impl TeloImageSource {
    /// The image of `version`, or why there is none. An unreleased build has
    /// no published tag: the only image that can run it is one the operator
    /// built from that same tree.
    pub fn image_for(&self, version: &TeloVersion) -> Result<String, TeloUnavailable> {
        if version.is_unreleased() {
            return self.unreleased.clone().ok_or_else(|| {
                TeloUnavailable::UnreleasedWithoutImage {
                    version: version.to_string(),
                }
            });
        }
        Ok(format!("{}:{version}-{}", self.repository, self.variant))
    }

    /// [`Self::image_for`] of a version already checked at admission; the
    /// text is parsed again because the request carries it as a string.
    pub fn pin(&self, container: &str, version: &str) -> Result<TeloPin, String> {
        let parsed = TeloVersion::parse(version)
            .ok_or_else(|| format!("'{version}' is not a telo version"))?;
        Ok(TeloPin {
            container: container.to_owned(),
            version: parsed.to_string(),
            image: self
                .image_for(&parsed)
                .map_err(|reason| reason.to_string())?,
            pull_policy: self.pull_policy,
        })
    }
}

/// A container whose image the runner chose for a telo release, so that a
/// pull failure can say which release is missing instead of only which tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeloPin {
    pub container: String,
    pub version: String,
    pub image: String,
    /// `RUNNER_PULL_POLICY`: the operator's, never the request's.
    pub pull_policy: PullPolicy,
}

/// The containers of one pod that run a chosen telo release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeloPins(Vec<TeloPin>);

impl TeloPins {
    pub fn push(&mut self, pin: TeloPin) {
        self.0.push(pin);
    }

    pub fn of_container(&self, container: &str) -> Option<&TeloPin> {
        self.0.iter().find(|pin| pin.container == container)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Waiting reasons that mean the image itself is not there to run.
pub const IMAGE_WAIT_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// The start failure of a pinned container whose image cannot be had:
/// the release first (what the user chose), then the image and the
/// kubelet's own account.
pub fn unavailable_release_message(pin: &TeloPin, kubelet_problem: &str) -> String {
    format!(
        "telo {} is not available to this runner: image \"{}\" of container \"{}\" could not be pulled ({kubelet_problem})",
        pin.version, pin.image, pin.container
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(text: &str) -> TeloVersion {
        TeloVersion::parse(text).expect("a version")
    }

    #[test]
    fn a_release_runs_the_repository_tag_of_its_version_and_variant() {
        let source = TeloImageSource::default();
        assert_eq!(
            source.image_for(&version("0.96.0")).as_deref(),
            Ok("telorun/node:0.96.0-slim")
        );
        let custom = TeloImageSource {
            repository: "registry.lab/telo".into(),
            variant: "bookworm".into(),
            ..TeloImageSource::default()
        };
        assert_eq!(
            custom.image_for(&version("1.2.3-rc.1")).as_deref(),
            Ok("registry.lab/telo:1.2.3-rc.1-bookworm")
        );
    }

    #[test]
    fn an_unreleased_build_is_refused_without_an_operator_image() {
        let reason = TeloImageSource::default()
            .image_for(&version("0.97.0+unreleased"))
            .unwrap_err();
        assert_eq!(
            reason.to_string(),
            "0.97.0+unreleased is an unreleased build, which has no published image. Pin a \
             released telo version for this workspace, or have the runner's operator set \
             RUNNER_TELO_UNRELEASED_IMAGE to a kernel image built from that same tree"
        );
    }

    #[test]
    fn an_unreleased_build_runs_the_operator_image() {
        let source = TeloImageSource {
            unreleased: Some("registry.lab/telo:dev".into()),
            ..TeloImageSource::default()
        };
        assert_eq!(
            source.image_for(&version("0.97.0+abc")).as_deref(),
            Ok("registry.lab/telo:dev")
        );
    }

    #[test]
    fn a_pull_failure_of_a_pinned_container_names_the_release_and_the_image() {
        let pin = TeloImageSource::default()
            .pin("session", "0.99.0")
            .expect("a pin");
        assert_eq!(
            unavailable_release_message(&pin, "waiting: ErrImagePull: not found"),
            "telo 0.99.0 is not available to this runner: image \"telorun/node:0.99.0-slim\" of \
             container \"session\" could not be pulled (waiting: ErrImagePull: not found)"
        );
    }
}
