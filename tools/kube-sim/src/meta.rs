//! Object-metadata helpers shared by the apiserver and the simulated
//! controllers: timestamps, uids, generated names and typed accessors over
//! `serde_json::Value` objects.

use rand::RngExt;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The alphabet the apiserver draws `generateName` suffixes from (no vowels,
/// no look-alike digits, so a generated name never spells a word).
const NAME_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Length of the random suffix appended to `generateName`.
pub const GENERATED_SUFFIX_LEN: usize = 5;
/// Longest prefix kept from `generateName`: 63 minus the suffix.
pub const MAX_GENERATE_NAME_PREFIX: usize = 63 - GENERATED_SUFFIX_LEN;

/// `metav1.Time`: RFC 3339 in UTC with second precision, as the apiserver
/// writes `creationTimestamp`, `startTime` and condition transition times.
pub fn now_timestamp() -> String {
    format_timestamp(OffsetDateTime::now_utc())
}

pub fn format_timestamp(at: OffsetDateTime) -> String {
    let at = at.replace_nanosecond(0).unwrap_or(at);
    at.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

/// `metav1.MicroTime`: RFC 3339 with microseconds (events' `eventTime`).
pub fn now_micro_timestamp() -> String {
    let now = OffsetDateTime::now_utc();
    let micros = now.microsecond();
    let secs = format_timestamp(now);
    // "…T01:02:03Z" → "…T01:02:03.000123Z"
    let stem = secs.trim_end_matches('Z');
    format!("{stem}.{micros:06}Z")
}

pub fn parse_timestamp(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

/// A random version-4 UUID, formatted like the apiserver's `metadata.uid`.
pub fn new_uid() -> String {
    let mut bytes: [u8; 16] = rand::rng().random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `generateName` + five random characters, the prefix cut so the result
/// stays within 63 characters (the apiserver's `SimpleNameGenerator`).
pub fn generate_name(prefix: &str) -> String {
    let prefix: String = prefix.chars().take(MAX_GENERATE_NAME_PREFIX).collect();
    let mut rng = rand::rng();
    let suffix: String = (0..GENERATED_SUFFIX_LEN)
        .map(|_| {
            let i = rng.random_range(0..NAME_SUFFIX_ALPHABET.len());
            char::from(NAME_SUFFIX_ALPHABET[i])
        })
        .collect();
    format!("{prefix}{suffix}")
}

/// Lower-case hex of `n` random bytes (event-name suffixes, container ids).
pub fn random_hex(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

pub fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// The `metadata` map, created when missing or not an object.
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let map = obj.as_object_mut().expect("just made an object");
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut().expect("just made an object")
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    metadata(obj)?.get(field)?.as_str()
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid").unwrap_or("")
}

pub fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    metadata(obj)?.get("labels")?.as_object()
}

pub fn deletion_timestamp(obj: &Value) -> Option<&str> {
    meta_str(obj, "deletionTimestamp")
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    metadata(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The grace period a pod being deleted has: `deletionGracePeriodSeconds`,
/// else its `terminationGracePeriodSeconds`, else 30.
pub fn current_grace(pod: &Value) -> i64 {
    metadata(pod)
        .and_then(|m| m.get("deletionGracePeriodSeconds"))
        .and_then(Value::as_i64)
        .or_else(|| path(pod, "spec.terminationGracePeriodSeconds").and_then(Value::as_i64))
        .unwrap_or(30)
}

/// Walks a dotted path (`status.phase`) through nested objects.
pub fn path<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(obj, |v, key| v.get(key))
}

pub fn path_str<'a>(obj: &'a Value, dotted: &str) -> Option<&'a str> {
    path(obj, dotted)?.as_str()
}

/// The object at `dotted`, created (with intermediate objects) when absent.
pub fn path_mut<'a>(obj: &'a mut Value, dotted: &str) -> &'a mut Value {
    let mut cur = obj;
    for key in dotted.split('.') {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        cur = cur
            .as_object_mut()
            .expect("just made an object")
            .entry(key)
            .or_insert(Value::Null);
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_keep_the_prefix_and_stay_within_63_chars() {
        let long = "a".repeat(80);
        let name = generate_name(&long);
        assert_eq!(name.len(), 63);
        let short = generate_name("telo-run-");
        assert!(short.starts_with("telo-run-"));
        assert_eq!(short.len(), "telo-run-".len() + 5);
    }

    #[test]
    fn uids_are_version_4_uuids() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
    }

    #[test]
    fn timestamps_have_second_precision() {
        let ts = now_timestamp();
        assert!(ts.ends_with('Z'));
        assert_eq!(ts.len(), "2024-01-02T03:04:05Z".len());
        assert!(parse_timestamp(&ts).is_some());
        assert_eq!(
            now_micro_timestamp().len(),
            "2024-01-02T03:04:05.000000Z".len()
        );
    }
}
