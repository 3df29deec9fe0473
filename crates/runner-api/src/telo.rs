//! Telo version selection (runner-core 0.17): a request names the kernel
//! release each app runs, and the runner runs exactly that release or
//! refuses the request before a session exists.
//!
//! This module holds what every side agrees on — the version text's rule,
//! the floor watch sessions need, how the request's versions are read — and
//! the refusals with their messages. Which versions a backend can supply is
//! the backend's business.

use std::cmp::Ordering;
use std::fmt;

use serde::Serialize;

use crate::watch::AppSpec;

/// The version text's rule, as the reference writes it.
pub const TELO_VERSION_PATTERN: &str = r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$";

/// The oldest release a runner is verified to supervise in a watch session:
/// it needs the kernel's `--watch`, its debug stream's run events and the
/// workspace marker.
pub const MIN_SUPERVISABLE_TELO: &str = "0.95.0";

/// The config keys a request leaves out once it names a version: the
/// version says what runs and the runner pulls it under its own policy.
pub const SUPERSEDED_BY_TELO: [&str; 2] = ["image", "pullPolicy"];

/// A version text that matches [`TELO_VERSION_PATTERN`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TeloVersion {
    text: String,
    /// Byte length of `major.minor.patch`.
    core_len: usize,
}

impl TeloVersion {
    /// `None` when `text` does not match the pattern.
    pub fn parse(text: &str) -> Option<Self> {
        let (core, rest) = split_core(text)?;
        let mut parts = core.split('.');
        let well_formed = (0..3).all(|_| {
            parts
                .next()
                .is_some_and(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
        }) && parts.next().is_none();
        if !well_formed || !valid_suffixes(rest) {
            return None;
        }
        Some(Self {
            text: text.to_owned(),
            core_len: core.len(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// An unreleased build's identity (`X+unreleased`, any build metadata):
    /// no published artifact carries it.
    pub fn is_unreleased(&self) -> bool {
        self.text.contains('+')
    }

    /// Compares `major.minor.patch` numerically, ignoring any pre-release
    /// or build suffix, as the floor check does.
    pub fn cmp_core(&self, other: &Self) -> Ordering {
        let ours = self.text[..self.core_len].split('.');
        let theirs = other.text[..other.core_len].split('.');
        for (a, b) in ours.zip(theirs) {
            let order = cmp_digits(a, b);
            if order != Ordering::Equal {
                return order;
            }
        }
        Ordering::Equal
    }

    /// Older than [`MIN_SUPERVISABLE_TELO`].
    pub fn below_watch_floor(&self) -> bool {
        let floor = Self::parse(MIN_SUPERVISABLE_TELO).expect("the floor is a version");
        self.cmp_core(&floor) == Ordering::Less
    }
}

impl fmt::Display for TeloVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `major.minor.patch` and what follows it (starting at `-` or `+`).
fn split_core(text: &str) -> Option<(&str, &str)> {
    let end = text.find(['-', '+']).unwrap_or(text.len());
    Some((&text[..end], &text[end..]))
}

/// `(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?`. The pre-release class holds `-`
/// but not `+`, so the first `+` starts the build part.
fn valid_suffixes(rest: &str) -> bool {
    let ident = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    };
    let (pre, build) = match rest.find('+') {
        Some(plus) => (&rest[..plus], Some(&rest[plus + 1..])),
        None => (rest, None),
    };
    let pre_ok = pre.is_empty() || pre.strip_prefix('-').is_some_and(ident);
    pre_ok && build.is_none_or(ident)
}

/// Decimal digit strings of any length, compared by value.
fn cmp_digits(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// A request's version choice refused before anything starts; the error
/// code is the `error` of its `400`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TeloRefusal {
    /// The runner does not run chosen versions (no `features.teloVersions`).
    #[error(
        "this runner does not run a chosen telo version (its /v1/capabilities has no features.teloVersions) \u{2014} leave `telo` out to run the kernel it provides"
    )]
    Unsupported,
    /// Not a version text, or named for only some apps.
    #[error("{message}")]
    Invalid { message: String },
    /// A version that cannot be had, and why.
    #[error("telo {version} cannot be run for app '{app}': {reason}")]
    Unavailable {
        app: String,
        version: String,
        reason: String,
    },
}

impl TeloRefusal {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unsupported => "telo_version_unsupported",
            Self::Invalid { .. } => "invalid_telo_version",
            Self::Unavailable { .. } => "telo_version_unavailable",
        }
    }

    /// The keys the `400` body carries beside `error` and `message`.
    pub fn details(&self) -> Option<UnavailableDetails<'_>> {
        match self {
            Self::Unavailable {
                app,
                version,
                reason,
            } => Some(UnavailableDetails {
                app,
                version,
                reason,
            }),
            _ => None,
        }
    }

    pub fn unavailable(app: &str, version: &TeloVersion, reason: impl Into<String>) -> Self {
        Self::Unavailable {
            app: app.to_owned(),
            version: version.to_string(),
            reason: reason.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UnavailableDetails<'a> {
    pub app: &'a str,
    pub version: &'a str,
    pub reason: &'a str,
}

/// The reason a watch session cannot run a release below the floor.
pub fn below_floor_reason(version: &TeloVersion) -> String {
    format!(
        "telo {version} is older than {MIN_SUPERVISABLE_TELO}, the oldest release a runner is verified to supervise (watch mode, the debug stream and the workspace marker)"
    )
}

/// The versions a request names, one per app in order, read and checked
/// for form: every app names one or none does. A request-level `telo` is
/// the version of the one app of a request without `apps`; beside `apps`
/// it is ambiguous and refused. `Ok(None)`: no version is named.
pub fn requested_versions(
    request_telo: Option<&str>,
    apps_sent: bool,
    apps: &[AppSpec],
) -> Result<Option<Vec<TeloVersion>>, TeloRefusal> {
    if let Some(text) = request_telo {
        if apps_sent {
            return Err(TeloRefusal::Invalid {
                message: "`telo` names the version of a request's one app; a request with `apps` names it on each app instead".to_owned(),
            });
        }
        return parse_named(text, None).map(|version| Some(vec![version; apps.len()]));
    }
    let named = apps.iter().filter(|app| app.telo.is_some()).count();
    if named == 0 {
        return Ok(None);
    }
    if named < apps.len() {
        let missing = apps
            .iter()
            .find(|app| app.telo.is_none())
            .map(|app| app.name.as_str())
            .unwrap_or_default();
        return Err(TeloRefusal::Invalid {
            message: format!(
                "app '{missing}' names no telo version while others do \u{2014} name one on every app or on none"
            ),
        });
    }
    apps.iter()
        .map(|app| parse_named(app.telo.as_deref().unwrap_or_default(), Some(&app.name)))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn parse_named(text: &str, app: Option<&str>) -> Result<TeloVersion, TeloRefusal> {
    TeloVersion::parse(text).ok_or_else(|| TeloRefusal::Invalid {
        message: match app {
            Some(app) => format!(
                "telo version '{text}' of app '{app}' is not a release version (major.minor.patch, optionally -prerelease and +build)"
            ),
            None => format!(
                "telo version '{text}' is not a release version (major.minor.patch, optionally -prerelease and +build)"
            ),
        },
    })
}

/// The `invalid_config` message for a superseded key sent beside a version.
pub fn superseded_config_message(key: &str) -> String {
    match key {
        "image" => "`config.image` and an application's `telo` version both say what runs; send one. `config.image` is deprecated \u{2014} name the telo version instead.".to_owned(),
        "pullPolicy" => "`config.pullPolicy` does not apply to a session whose applications name their `telo` version: the runner pulls a version's image under its operator's policy. Omit it.".to_owned(),
        other => format!("`config.{other}` does not apply to a session whose applications name their `telo` version. Omit it."),
    }
}

#[cfg(test)]
mod tests;
