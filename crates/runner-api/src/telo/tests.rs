use super::*;
use crate::watch::IoMode;
use proptest::prelude::*;
use rstest::rstest;

fn app(name: &str, telo: Option<&str>) -> AppSpec {
    AppSpec {
        name: name.into(),
        entry_relative_path: "telo.yaml".into(),
        ports: vec![],
        io: IoMode::Tty,
        telo: telo.map(str::to_owned),
    }
}

#[rstest]
#[case("0.95.0")]
#[case("1.2.3-rc.1")]
#[case("1.2.3-rc-1.x")]
#[case("1.2.3+unreleased")]
#[case("1.2.3-beta.2+build.7")]
#[case("01.002.0003")]
fn release_texts_match(#[case] text: &str) {
    assert_eq!(TeloVersion::parse(text).unwrap().as_str(), text);
}

#[rstest]
#[case("")]
#[case("1.2")]
#[case("1.2.3.4")]
#[case("v1.2.3")]
#[case("1.2.3-")]
#[case("1.2.3+")]
#[case("1.2.3+a+b")]
#[case("1.2.3-ü")]
#[case("1.2.3 ")]
#[case("latest")]
#[case("1.2.x")]
#[case("１.2.3")]
fn other_texts_do_not(#[case] text: &str) {
    assert_eq!(TeloVersion::parse(text), None);
}

#[rstest]
#[case("0.94.9", true)]
#[case("0.95.0", false)]
#[case("0.95.0-rc.1", false)]
#[case("0.100.0", false)]
#[case("0.81.0", true)]
#[case("1.0.0", false)]
#[case("00000.95.0", false)]
#[case("0.95.0+unreleased", false)]
fn the_floor_compares_the_numbers_only(#[case] text: &str, #[case] below: bool) {
    assert_eq!(TeloVersion::parse(text).unwrap().below_watch_floor(), below);
}

#[test]
fn unreleased_is_any_build_metadata() {
    assert!(
        TeloVersion::parse("0.96.0+unreleased")
            .unwrap()
            .is_unreleased()
    );
    assert!(!TeloVersion::parse("0.96.0-rc.1").unwrap().is_unreleased());
}

#[test]
fn a_request_level_version_is_the_default_apps() {
    let versions = requested_versions(Some("0.96.0"), false, &[app("app", None)]).unwrap();
    assert_eq!(versions.unwrap()[0].as_str(), "0.96.0");
}

#[test]
fn a_request_level_version_beside_apps_is_ambiguous() {
    let err = requested_versions(Some("0.96.0"), true, &[app("web", None)]).unwrap_err();
    assert_eq!(err.code(), "invalid_telo_version");
    assert!(err.to_string().contains("on each app"), "{err}");
}

#[test]
fn every_app_or_none_names_a_version() {
    assert_eq!(
        requested_versions(None, true, &[app("a", None)]).unwrap(),
        None
    );
    let err =
        requested_versions(None, true, &[app("a", Some("0.96.0")), app("b", None)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "app 'b' names no telo version while others do \u{2014} name one on every app or on none"
    );
}

#[test]
fn a_malformed_version_names_its_app() {
    let err = requested_versions(None, true, &[app("web", Some("latest"))]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "telo version 'latest' of app 'web' is not a release version (major.minor.patch, optionally -prerelease and +build)"
    );
}

#[test]
fn unavailable_carries_app_version_and_reason() {
    let version = TeloVersion::parse("0.81.0").unwrap();
    let err = TeloRefusal::unavailable("app", &version, below_floor_reason(&version));
    assert_eq!(err.code(), "telo_version_unavailable");
    assert_eq!(
        err.to_string(),
        "telo 0.81.0 cannot be run for app 'app': telo 0.81.0 is older than 0.95.0, the oldest release a runner is verified to supervise (watch mode, the debug stream and the workspace marker)"
    );
    let details = err.details().unwrap();
    assert_eq!((details.app, details.version), ("app", "0.81.0"));
}

proptest! {
    /// The parser agrees with the pattern's grammar on generated texts.
    #[test]
    fn parse_agrees_with_the_grammar(
        core in "[0-9]{1,4}\\.[0-9]{1,4}\\.[0-9]{1,4}",
        pre in proptest::option::of("[0-9A-Za-z.-]{1,8}"),
        build in proptest::option::of("[0-9A-Za-z.-]{1,8}"),
    ) {
        let mut text = core.clone();
        if let Some(pre) = &pre { text.push('-'); text.push_str(pre); }
        if let Some(build) = &build { text.push('+'); text.push_str(build); }
        prop_assert!(TeloVersion::parse(&text).is_some(), "{}", text);
    }

    #[test]
    fn ordering_matches_integers(a in 0u32..2000, b in 0u32..2000) {
        let va = TeloVersion::parse(&format!("0.{a}.0")).unwrap();
        let vb = TeloVersion::parse(&format!("0.{b}.0")).unwrap();
        prop_assert_eq!(va.cmp_core(&vb), a.cmp(&b));
    }
}
