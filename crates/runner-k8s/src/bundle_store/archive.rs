//! The staged bundle as a gzip'd ustar archive, unpacked in the pod by the
//! init image's `tar xzf` (busybox by default).
//!
//! Only what busybox reads is written: ustar headers, regular files, mode
//! 0644, owner 0:0, mtime 0, in the bundle's file order. No directory
//! entries: extraction creates parents as needed, and the pod's `fsGroup`
//! decides ownership anyway.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use runner_core::bundle_path::normalize_bundle_path;
use runner_core::types::RunBundle;
use tar::{EntryType, Header};

use super::BundleError;

/// Longest path the archive accepts. The reference stopped at the 100-byte
/// `name` field; we also use the ustar `prefix` field (155 bytes, joined
/// with a `/`), which busybox `tar` honours. One byte under the theoretical
/// 256 so a full prefix never has to go unterminated.
pub const MAX_TAR_PATH_BYTES: usize = 255;
const NAME_FIELD_BYTES: usize = 100;
const PREFIX_FIELD_BYTES: usize = 155;

/// Builds the tar.gz of `bundle`. Every path goes through the core traversal
/// guard first, so nothing can be unpacked outside `/app`.
pub fn bundle_tar_gz(bundle: &RunBundle) -> Result<Vec<u8>, BundleError> {
    let mut archive = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
    for file in &bundle.files {
        let name = normalize_bundle_path(&file.relative_path)?;
        if !fits_ustar(&name) {
            return Err(BundleError::PathTooLong(name));
        }
        let contents = file.contents.as_bytes();
        let mut header = Header::new_ustar();
        // Splits a long path into prefix and name exactly as `fits_ustar`
        // predicted (both take the longest prefix that fits).
        header.set_path(&name).map_err(BundleError::Archive)?;
        header.set_entry_type(EntryType::Regular);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(contents.len() as u64);
        header.set_cksum();
        archive
            .append(&header, contents)
            .map_err(BundleError::Archive)?;
    }
    let mut gzip = archive.into_inner().map_err(BundleError::Archive)?;
    gzip.flush().map_err(BundleError::Archive)?;
    gzip.finish().map_err(BundleError::Archive)
}

/// Whether `path` fits the ustar `name` field, or splits at a `/` into a
/// `prefix` and a `name` that each fit. A single component over 100 bytes
/// never fits; we emit no GNU or PAX extensions to carry it.
fn fits_ustar(path: &str) -> bool {
    if path.len() > MAX_TAR_PATH_BYTES {
        return false;
    }
    if path.len() <= NAME_FIELD_BYTES {
        return true;
    }
    // The longest prefix leaves the shortest name: if that name is too long,
    // every other split is too.
    // A `/` is one byte in UTF-8, so scanning bytes finds every split point.
    let prefix_window = &path.as_bytes()[..path.len().min(PREFIX_FIELD_BYTES + 1)];
    match prefix_window.iter().rposition(|&b| b == b'/') {
        Some(at) => at > 0 && path.len() - at - 1 <= NAME_FIELD_BYTES,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use flate2::read::GzDecoder;
    use proptest::prelude::*;
    use runner_core::types::BundleFile;

    use super::*;

    fn bundle(files: &[(&str, &str)]) -> RunBundle {
        RunBundle {
            entry_relative_path: "telo.yaml".to_owned(),
            files: files
                .iter()
                .map(|(path, contents)| BundleFile {
                    relative_path: (*path).to_owned(),
                    contents: (*contents).to_owned(),
                })
                .collect(),
        }
    }

    struct Unpacked {
        path: String,
        contents: String,
        mode: u32,
        uid: u64,
        gid: u64,
        mtime: u64,
        entry_type: EntryType,
        is_ustar: bool,
    }

    fn unpack(tar_gz: &[u8]) -> Vec<Unpacked> {
        let mut archive = tar::Archive::new(GzDecoder::new(tar_gz));
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let mut contents = String::new();
                entry.read_to_string(&mut contents).unwrap();
                let header = entry.header();
                Unpacked {
                    path: entry.path().unwrap().to_str().unwrap().to_owned(),
                    contents,
                    mode: header.mode().unwrap(),
                    uid: header.uid().unwrap(),
                    gid: header.gid().unwrap(),
                    mtime: header.mtime().unwrap(),
                    entry_type: header.entry_type(),
                    is_ustar: header.as_ustar().is_some(),
                }
            })
            .collect()
    }

    #[test]
    fn two_files_round_trip_in_order() {
        let tar_gz = bundle_tar_gz(&bundle(&[
            ("telo.yaml", "kind: Telo.Application\n"),
            ("sub/lib.yaml", "kind: Telo.Library\n"),
        ]))
        .unwrap();
        let files = unpack(&tar_gz);
        let names: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["telo.yaml", "sub/lib.yaml"]);
        assert_eq!(files[0].contents, "kind: Telo.Application\n");
        assert_eq!(files[1].contents, "kind: Telo.Library\n");
        for file in &files {
            assert_eq!(file.mode, 0o644);
            assert_eq!((file.uid, file.gid, file.mtime), (0, 0, 0));
            assert_eq!(file.entry_type, EntryType::Regular);
            assert!(file.is_ustar);
        }
    }

    #[test]
    fn paths_are_normalized_before_they_are_written() {
        let tar_gz = bundle_tar_gz(&bundle(&[("/./a/../telo.yaml", "x")])).unwrap();
        assert_eq!(unpack(&tar_gz)[0].path, "telo.yaml");
    }

    #[test]
    fn an_empty_bundle_is_a_valid_empty_archive() {
        let tar_gz = bundle_tar_gz(&bundle(&[])).unwrap();
        assert!(unpack(&tar_gz).is_empty());
    }

    #[test]
    fn traversal_is_rejected_with_the_core_message() {
        let error = bundle_tar_gz(&bundle(&[("telo.yaml", ""), ("../escape", "x")])).unwrap_err();
        assert!(matches!(error, BundleError::InvalidPath(_)));
        assert_eq!(error.to_string(), "invalid bundle relativePath '../escape'");
    }

    #[test]
    fn a_path_over_255_bytes_is_too_long_for_tar() {
        let long = format!("{}/{}", "d".repeat(150), "f".repeat(105));
        assert_eq!(long.len(), 256);
        let error = bundle_tar_gz(&bundle(&[(&long, "x")])).unwrap_err();
        assert!(matches!(error, BundleError::PathTooLong(_)));
        assert_eq!(
            error.to_string(),
            format!("bundle path too long for tar (max 255 bytes): '{long}'")
        );
    }

    #[test]
    fn a_single_component_over_100_bytes_is_too_long_for_tar() {
        let name = "n".repeat(101);
        let error = bundle_tar_gz(&bundle(&[(&name, "x")])).unwrap_err();
        assert!(error.to_string().contains("too long for tar"), "{error}");
        // A directory of 160 bytes cannot be the prefix either.
        let deep = format!("{}/f", "d".repeat(160));
        assert!(matches!(
            bundle_tar_gz(&bundle(&[(&deep, "x")])),
            Err(BundleError::PathTooLong(_))
        ));
    }

    #[test]
    fn paths_between_100_and_255_bytes_use_the_ustar_prefix() {
        let long = format!("{}/{}/{}", "a".repeat(100), "b".repeat(54), "c".repeat(99));
        assert_eq!(long.len(), 255);
        let tar_gz = bundle_tar_gz(&bundle(&[(&long, "deep")])).unwrap();
        let files = unpack(&tar_gz);
        assert_eq!(files[0].path, long);
        assert_eq!(files[0].contents, "deep");
    }

    #[test]
    fn path_limits_count_bytes_not_characters() {
        // 51 two-byte characters: 51 characters, 102 bytes, one component.
        let name = "é".repeat(51);
        assert!(matches!(
            bundle_tar_gz(&bundle(&[(&name, "")])),
            Err(BundleError::PathTooLong(_))
        ));
    }

    fn component() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9._-]{1,12}",
            "[a-zé]{40,110}",
            Just("..".to_owned()),
            Just(".".to_owned()),
        ]
    }

    fn relative_path() -> impl Strategy<Value = String> {
        (prop::bool::ANY, prop::collection::vec(component(), 1..6)).prop_map(|(absolute, parts)| {
            let joined = parts.join("/");
            if absolute {
                format!("/{joined}")
            } else {
                joined
            }
        })
    }

    proptest! {
        #[test]
        fn every_accepted_bundle_round_trips(
            files in prop::collection::vec((relative_path(), any::<String>()), 0..5)
        ) {
            let files: Vec<(&str, &str)> =
                files.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect();
            let expected: Result<Vec<(String, String)>, ()> = files
                .iter()
                .map(|(path, contents)| match normalize_bundle_path(path) {
                    Ok(name) if fits_ustar(&name) => Ok((name, (*contents).to_owned())),
                    _ => Err(()),
                })
                .collect();
            match (bundle_tar_gz(&bundle(&files)), expected) {
                (Ok(tar_gz), Ok(expected)) => {
                    let unpacked: Vec<(String, String)> = unpack(&tar_gz)
                        .into_iter()
                        .map(|f| (f.path, f.contents))
                        .collect();
                    prop_assert_eq!(unpacked, expected);
                }
                (Err(_), Err(())) => {}
                (built, expected) => {
                    return Err(TestCaseError::fail(format!(
                        "built {:?}, expected {:?}",
                        built.map(|_| ()),
                        expected
                    )));
                }
            }
        }

        #[test]
        fn only_paths_over_100_bytes_can_be_refused_for_length(path in relative_path()) {
            if let Ok(name) = normalize_bundle_path(&path) {
                if name.len() <= 100 {
                    prop_assert!(fits_ustar(&name));
                }
                if name.len() > MAX_TAR_PATH_BYTES {
                    prop_assert!(!fits_ustar(&name));
                }
            }
        }
    }
}
