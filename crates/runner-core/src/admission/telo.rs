//! The telo version gate of `POST /v1/sessions` and `PUT /apps` (0.17): a
//! request names the release each app runs, and is refused before a session
//! exists when this runner cannot run exactly that release.
//!
//! Order (the spec leaves part of it open; ours is documented in the
//! README): a version named on a runner without `features.teloVersions` →
//! `telo_version_unsupported`; a text that is not a version, named for only
//! some apps, or a request-level `telo` beside `apps` →
//! `invalid_telo_version`; a watch session's version below the floor, then
//! one the backend cannot supply → `telo_version_unavailable`, naming the
//! app, the version and why. Apps are checked in request order; the first
//! refusal wins.

use runner_api::telo::{TeloRefusal, TeloVersion, below_floor_reason, requested_versions};
use runner_api::watch::{AppSpec, SessionMode};

use super::BackendChecks;

/// The versions `apps` name, checked against what `backend` can run, one
/// per app; `None` when the request names none.
pub(super) fn check_versions(
    backend: &dyn BackendChecks,
    request_telo: Option<&str>,
    apps_sent: bool,
    apps: &[AppSpec],
    mode: SessionMode,
) -> Result<Option<Vec<TeloVersion>>, TeloRefusal> {
    let named = request_telo.is_some() || apps.iter().any(|app| app.telo.is_some());
    if !named {
        return Ok(None);
    }
    if !backend.offers_telo_versions() {
        return Err(TeloRefusal::Unsupported);
    }
    let Some(versions) = requested_versions(request_telo, apps_sent, apps)? else {
        return Ok(None);
    };
    for (app, version) in apps.iter().zip(&versions) {
        if mode == SessionMode::Watch && version.below_watch_floor() {
            return Err(TeloRefusal::unavailable(
                &app.name,
                version,
                below_floor_reason(version),
            ));
        }
    }
    for (app, version) in apps.iter().zip(&versions) {
        backend
            .supply_telo(version, mode)
            .map_err(|reason| TeloRefusal::unavailable(&app.name, version, reason.to_string()))?;
    }
    Ok(Some(versions))
}

/// Writes the checked versions onto the apps (a request-level `telo` onto
/// the default app).
pub(super) fn pin_versions(apps: &mut [AppSpec], versions: Option<&[TeloVersion]>) {
    if let Some(versions) = versions {
        for (app, version) in apps.iter_mut().zip(versions) {
            app.telo = Some(version.to_string());
        }
    }
}
