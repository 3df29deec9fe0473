//! A session's output marks on its pod (a watch session's: on its record):
//! written by a runner handing the session over, read by the runner that
//! adopts it (`runner_core`'s
//! `session::carry` says what they are for).

use std::collections::BTreeMap;

use kube::Api;
use kube::api::{Patch, PatchParams};
use runner_core::session::OutputMarks;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Where a pod keeps the marks its last owner left.
pub const OUTPUT_MARKS_ANNOTATION: &str = "telo.run/output-marks";

/// One app's marks as the annotation holds them.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    app: String,
    /// `[seq, end byte]` pairs.
    points: Vec<(u64, u64)>,
    /// The bytes before the last point, in hex.
    tail: String,
}

pub(crate) fn encode(marks: &[OutputMarks]) -> String {
    let stored: Vec<Stored> = marks
        .iter()
        .map(|m| Stored {
            app: m.app.clone(),
            points: m.points.clone(),
            tail: hex::encode(&m.tail),
        })
        .collect();
    serde_json::to_string(&stored).unwrap_or_default()
}

/// The marks `annotations` hold; none when absent or unreadable (a
/// resuming client is then told of a gap, as after a crash).
pub(crate) fn decode(annotations: Option<&BTreeMap<String, String>>) -> Vec<OutputMarks> {
    let Some(text) = annotations.and_then(|a| a.get(OUTPUT_MARKS_ANNOTATION)) else {
        return Vec::new();
    };
    let Ok(stored) = serde_json::from_str::<Vec<Stored>>(text) else {
        return Vec::new();
    };
    stored
        .into_iter()
        .filter_map(|s| {
            let ascending = s
                .points
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1);
            Some(OutputMarks {
                app: s.app,
                points: s.points,
                tail: hex::decode(s.tail).ok()?,
            })
            .filter(|_| ascending)
        })
        .collect()
}

/// Leaves `marks` on `name` of `api`: a run session's pod, or a watch
/// session's record.
pub(crate) async fn leave<K>(
    api: &Api<K>,
    name: &str,
    marks: &[OutputMarks],
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"annotations": {OUTPUT_MARKS_ANNOTATION: encode(marks)}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_come_back_as_they_were_left() {
        let marks = vec![OutputMarks {
            app: "app".into(),
            points: vec![(7, 10), (8, 25)],
            tail: b"line\r\n".to_vec(),
        }];
        let annotations = BTreeMap::from([(OUTPUT_MARKS_ANNOTATION.to_owned(), encode(&marks))]);
        assert_eq!(decode(Some(&annotations)), marks);
    }

    #[test]
    fn marks_out_of_order_or_unreadable_are_none() {
        for text in [
            r#"[{"app":"app","points":[[8,25],[7,10]],"tail":""}]"#,
            r#"[{"app":"app","points":[[7,10]],"tail":"zz"}]"#,
            "not json",
        ] {
            let annotations =
                BTreeMap::from([(OUTPUT_MARKS_ANNOTATION.to_owned(), text.to_owned())]);
            assert!(decode(Some(&annotations)).is_empty(), "{text}");
        }
        assert!(decode(None).is_empty());
    }
}
