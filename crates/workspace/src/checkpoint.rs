//! A checkpoint's stored form: the snapshot's files as JSON, gzip-compressed.
//! The workspace service encodes it where the files are (the session's pod
//! spends the CPU, and the runner receives only what it stores); the runner
//! decodes it when a session resumes.

use std::io::{Read as _, Write as _};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use runner_api::watch::WorkspaceCheckpointFile;

/// Why a checkpoint could not be encoded or read back.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointCodecError {
    #[error("could not encode the checkpoint: {0}")]
    Encode(String),
    #[error("the checkpoint cannot be read: {0}")]
    Decode(String),
    #[error("the checkpoint expands to more than {max} bytes")]
    TooLarge { max: u64 },
}

/// The stored form of `files`.
pub fn encode(files: &[WorkspaceCheckpointFile]) -> Result<Vec<u8>, CheckpointCodecError> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    // Serialized straight into the compressor: the JSON is never held whole.
    serde_json::to_writer(&mut encoder, files)
        .map_err(|err| CheckpointCodecError::Encode(err.to_string()))?;
    encoder
        .flush()
        .and_then(|()| encoder.finish())
        .map_err(|err| CheckpointCodecError::Encode(err.to_string()))
}

/// The files of a stored checkpoint, refusing one that expands past
/// `max_expanded` bytes (a stored checkpoint edited into a decompression
/// bomb).
pub fn decode(
    bytes: &[u8],
    max_expanded: u64,
) -> Result<Vec<WorkspaceCheckpointFile>, CheckpointCodecError> {
    let mut json = Vec::new();
    GzDecoder::new(bytes)
        .take(max_expanded.saturating_add(1))
        .read_to_end(&mut json)
        .map_err(|err| CheckpointCodecError::Decode(err.to_string()))?;
    if json.len() as u64 > max_expanded {
        return Err(CheckpointCodecError::TooLarge { max: max_expanded });
    }
    serde_json::from_slice(&json).map_err(|err| CheckpointCodecError::Decode(err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_api::watch::FileEncoding;

    #[test]
    fn files_survive_the_round_trip_and_a_bomb_is_refused() {
        let files = vec![WorkspaceCheckpointFile {
            path: "telo.yaml".into(),
            hash: "h".into(),
            content: "kind: Telo.Application\n".repeat(1000),
            encoding: FileEncoding::Utf8,
        }];
        let stored = encode(&files).expect("encodes");
        assert!(stored.len() < 2000, "{}", stored.len());
        assert_eq!(decode(&stored, 1 << 20).expect("reads"), files);
        assert!(matches!(
            decode(&stored, 100),
            Err(CheckpointCodecError::TooLarge { max: 100 })
        ));
        assert!(matches!(
            decode(b"not gzip", 1 << 20),
            Err(CheckpointCodecError::Decode(_))
        ));
    }
}
