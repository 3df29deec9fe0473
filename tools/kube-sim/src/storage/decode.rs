//! What the apiserver's typed JSON decoder does to a body before anything
//! else sees it, for the kinds where a client can tell the difference from
//! storing the JSON as sent: wrongly typed fields are refused with Go's
//! `encoding/json` wording, `metav1.MicroTime` strings must parse with the
//! exact `RFC3339Micro` layout and come back normalised to UTC, and fields
//! the Go type does not have are dropped.

use serde_json::{Map, Value, json};
use time::{Date, Month, PrimitiveDateTime, Time};

use crate::kinds::ResourceInfo;

/// Decodes `obj` in place as the Go type of `info`; the error is the
/// decoder's message (the caller wraps it as a 400 or, for a patch, a 422).
pub fn decode(info: &ResourceInfo, obj: &mut Value) -> Result<(), String> {
    match info.kind {
        "Lease" => decode_lease(obj),
        _ => Ok(()),
    }
}

/// `v1.Lease`: `spec` is a struct (never omitted, `{}` when absent or null),
/// the rest of the top level besides type and object meta is unknown.
fn decode_lease(obj: &mut Value) -> Result<(), String> {
    let Some(top) = obj.as_object_mut() else {
        return Ok(());
    };
    top.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "spec"));
    let spec = match top.remove("spec") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(type_error(&other, "Lease", "spec", "v1.LeaseSpec"));
        }
    };
    let mut out = Map::new();
    for (key, value) in spec {
        if value.is_null() {
            // A null pointer field is simply unset.
            continue;
        }
        let field = format!("spec.{key}");
        let decoded = match key.as_str() {
            "holderIdentity" | "strategy" | "preferredHolder" => match value {
                Value::String(_) => value,
                other => return Err(type_error(&other, "LeaseSpec", &field, "string")),
            },
            "leaseDurationSeconds" | "leaseTransitions" => int32(&value)
                .map(|n| json!(n))
                .ok_or_else(|| type_error(&value, "LeaseSpec", &field, "int32"))?,
            "acquireTime" | "renewTime" => match &value {
                Value::String(s) => json!(parse_micro_time(s)?),
                // MicroTime's own unmarshaler decodes into a string first.
                other => return Err(type_error(other, "LeaseSpec", &field, "string")),
            },
            // Not a field of v1.LeaseSpec: the decoder ignores it.
            _ => continue,
        };
        out.insert(key, decoded);
    }
    top.insert("spec".into(), Value::Object(out));
    Ok(())
}

fn int32(v: &Value) -> Option<i32> {
    v.as_i64().and_then(|n| i32::try_from(n).ok())
}

/// `json.UnmarshalTypeError` with its struct-field context.
fn type_error(value: &Value, go_struct: &str, field: &str, go_type: &str) -> String {
    let what = match value {
        Value::String(_) => "string".to_string(),
        Value::Bool(_) => "bool".to_string(),
        Value::Array(_) => "array".to_string(),
        Value::Object(_) => "object".to_string(),
        Value::Number(n) => format!("number {n}"),
        Value::Null => "null".to_string(),
    };
    // A mistyped number names its value only when the target is numeric.
    let what = if go_type == "string" && value.is_number() {
        "number".to_string()
    } else {
        what
    };
    format!(
        "json: cannot unmarshal {what} into Go struct field {go_struct}.{field} of type {go_type}"
    )
}

/// `metav1.RFC3339Micro`, the only layout `MicroTime` accepts.
pub const RFC3339_MICRO: &str = "2006-01-02T15:04:05.000000Z07:00";

#[derive(Clone, Copy)]
enum Elem {
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    Micros,
    Zone,
}

/// The layout split the way Go's `nextStdChunk` splits it: literal prefix,
/// element, and the element's text in the layout.
const CHUNKS: &[(&str, Elem, &str)] = &[
    ("", Elem::Year, "2006"),
    ("-", Elem::Month, "01"),
    ("-", Elem::Day, "02"),
    ("T", Elem::Hour, "15"),
    (":", Elem::Minute, "04"),
    (":", Elem::Second, "05"),
    ("", Elem::Micros, ".000000"),
    ("", Elem::Zone, "Z07:00"),
];

fn quote(b: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(b))
}

fn digit(b: &[u8], i: usize) -> bool {
    b.get(i).is_some_and(u8::is_ascii_digit)
}

/// Go's `getnum`: one or (when not `fixed`, optionally) two digits.
fn getnum(b: &[u8], fixed: bool) -> Option<(i64, &[u8])> {
    if !digit(b, 0) {
        return None;
    }
    if !digit(b, 1) {
        if fixed {
            return None;
        }
        return Some((i64::from(b[0] - b'0'), &b[1..]));
    }
    Some((
        i64::from(b[0] - b'0') * 10 + i64::from(b[1] - b'0'),
        &b[2..],
    ))
}

/// Go's `atoi`: an optional sign, then only digits.
fn atoi(b: &[u8]) -> Option<i64> {
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: i64 = 0;
    for d in digits {
        n = n.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if neg { -n } else { n })
}

fn days_in(month: i64, year: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses a `MicroTime` the way Go's `time.Parse(RFC3339Micro, s)` does —
/// six fractional digits exactly, `Z` or a `±hh:mm` offset — and returns it
/// as the apiserver writes it back: in UTC. Errors are `time.ParseError`'s
/// text.
pub fn parse_micro_time(text: &str) -> Result<String, String> {
    let whole = text.as_bytes();
    let cannot = |value: &[u8], elem: &str| {
        format!(
            "parsing time {} as {}: cannot parse {} as {}",
            quote(whole),
            quote(RFC3339_MICRO.as_bytes()),
            quote(value),
            quote(elem.as_bytes())
        )
    };
    let out_of_range = |what: &str| format!("parsing time {}: {what} out of range", quote(whole));
    let (mut year, mut month, mut day, mut hour, mut minute, mut second) = (0, 0, 0, 0, 0, 0);
    let mut micros = 0;
    let mut offset_secs = 0;
    let mut value = whole;
    for (prefix, elem, layout_elem) in CHUNKS {
        for p in prefix.bytes() {
            if value.first() != Some(&p) {
                return Err(cannot(value, prefix));
            }
            value = &value[1..];
        }
        let hold = value;
        let parsed: Option<&[u8]> = match elem {
            Elem::Year => {
                if value.len() < 4 || !digit(value, 0) {
                    None
                } else {
                    atoi(&value[..4]).map(|y| {
                        year = y;
                        &value[4..]
                    })
                }
            }
            Elem::Month => getnum(value, true).map(|(m, rest)| {
                month = m;
                rest
            }),
            Elem::Day => getnum(value, true).map(|(d, rest)| {
                day = d;
                rest
            }),
            Elem::Hour => getnum(value, false).map(|(h, rest)| {
                hour = h;
                rest
            }),
            Elem::Minute => getnum(value, true).map(|(m, rest)| {
                minute = m;
                rest
            }),
            Elem::Second => getnum(value, true).map(|(s, rest)| {
                second = s;
                rest
            }),
            Elem::Micros => {
                if value.len() < 7 || !matches!(value[0], b'.' | b',') {
                    None
                } else {
                    match atoi(&value[1..7]) {
                        Some(n) if n < 0 => return Err(out_of_range("fractional second")),
                        Some(n) => {
                            micros = n;
                            Some(&value[7..])
                        }
                        None => None,
                    }
                }
            }
            Elem::Zone => {
                if value.first() == Some(&b'Z') {
                    Some(&value[1..])
                } else if value.len() < 6 || value[3] != b':' {
                    None
                } else {
                    let hh = getnum(&value[1..3], true).map(|(n, _)| n);
                    let mm = hh.and(getnum(&value[4..6], true).map(|(n, _)| n));
                    // Go records the later range problem of the two.
                    if mm.is_some_and(|m| m > 60) {
                        return Err(out_of_range("time zone offset minute"));
                    }
                    if hh.is_some_and(|h| h > 24) {
                        return Err(out_of_range("time zone offset hour"));
                    }
                    match (hh, mm) {
                        (Some(hh), Some(mm)) if matches!(value[0], b'+' | b'-') => {
                            offset_secs = (hh * 60 + mm) * 60;
                            if value[0] == b'-' {
                                offset_secs = -offset_secs;
                            }
                            Some(&value[6..])
                        }
                        _ => None,
                    }
                }
            }
        };
        let range = match elem {
            Elem::Month if parsed.is_some() && !(1..=12).contains(&month) => Some("month"),
            Elem::Hour if !(0..24).contains(&hour) => Some("hour"),
            Elem::Minute if !(0..60).contains(&minute) => Some("minute"),
            Elem::Second if parsed.is_some() && !(0..60).contains(&second) => Some("second"),
            _ => None,
        };
        if let Some(what) = range {
            return Err(out_of_range(what));
        }
        match parsed {
            Some(rest) => value = rest,
            None => return Err(cannot(hold, layout_elem)),
        }
    }
    if !value.is_empty() {
        return Err(format!(
            "parsing time {}: extra text: {}",
            quote(whole),
            quote(value)
        ));
    }
    if day < 1 || day > days_in(month, year) {
        return Err(out_of_range("day"));
    }
    let date = i32::try_from(year)
        .ok()
        .zip(
            u8::try_from(month)
                .ok()
                .and_then(|m| Month::try_from(m).ok()),
        )
        .and_then(|(y, m)| Date::from_calendar_date(y, m, day as u8).ok());
    let time = Time::from_hms_micro(hour as u8, minute as u8, second as u8, micros as u32).ok();
    let (Some(date), Some(time)) = (date, time) else {
        return Err(out_of_range("year"));
    };
    let utc =
        PrimitiveDateTime::new(date, time).assume_utc() - time::Duration::seconds(offset_secs);
    Ok(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        utc.year(),
        u8::from(utc.month()),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second(),
        utc.microsecond()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("2026-03-01T10:20:30.123456Z", "2026-03-01T10:20:30.123456Z")]
    #[case("2026-03-01T10:20:30.123456+02:00", "2026-03-01T08:20:30.123456Z")]
    #[case("2026-01-01T00:30:00,000001-01:00", "2026-01-01T01:30:00.000001Z")]
    #[case("2024-02-29T00:00:00.000000Z", "2024-02-29T00:00:00.000000Z")]
    fn micro_times_come_back_in_utc(#[case] input: &str, #[case] stored: &str) {
        assert_eq!(parse_micro_time(input).as_deref(), Ok(stored));
    }

    #[rstest]
    #[case(
        "2026-03-01T10:20:30Z",
        r#"parsing time "2026-03-01T10:20:30Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "Z" as ".000000""#
    )]
    #[case(
        "2026-03-01T10:20:30.123Z",
        r#"parsing time "2026-03-01T10:20:30.123Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse ".123Z" as ".000000""#
    )]
    #[case(
        "not a time",
        r#"parsing time "not a time" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "not a time" as "2006""#
    )]
    #[case(
        "2026/03/01T10:20:30.123456Z",
        r#"parsing time "2026/03/01T10:20:30.123456Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "/03/01T10:20:30.123456Z" as "-""#
    )]
    #[case(
        "2026-13-01T10:20:30.123456Z",
        r#"parsing time "2026-13-01T10:20:30.123456Z": month out of range"#
    )]
    #[case(
        "2026-02-30T10:20:30.123456Z",
        r#"parsing time "2026-02-30T10:20:30.123456Z": day out of range"#
    )]
    #[case(
        "2026-03-01T10:20:30.1234567Z",
        r#"parsing time "2026-03-01T10:20:30.1234567Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "7Z" as "Z07:00""#
    )]
    #[case(
        "2026-03-01T10:20:30.123456Zjunk",
        r#"parsing time "2026-03-01T10:20:30.123456Zjunk": extra text: "junk""#
    )]
    #[case(
        "2026-03-01T24:00:00.000000Z",
        r#"parsing time "2026-03-01T24:00:00.000000Z": hour out of range"#
    )]
    fn malformed_micro_times_fail_like_go(#[case] input: &str, #[case] message: &str) {
        assert_eq!(parse_micro_time(input), Err(message.to_string()));
    }

    #[test]
    fn lease_bodies_are_typed() {
        let lease = crate::kinds::id("leases").info();
        let mut ok = json!({"kind": "Lease", "status": {}, "spec": {
            "holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": null, "bogus": 1}});
        decode(lease, &mut ok).unwrap();
        assert_eq!(
            ok,
            json!({"kind": "Lease", "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})
        );
        let mut absent = json!({"kind": "Lease"});
        decode(lease, &mut absent).unwrap();
        assert_eq!(absent["spec"], json!({}));
        let mut bad = json!({"spec": {"leaseDurationSeconds": "15"}});
        assert_eq!(
            decode(lease, &mut bad).unwrap_err(),
            "json: cannot unmarshal string into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32"
        );
        let mut big = json!({"spec": {"leaseTransitions": 3_000_000_000u64}});
        assert_eq!(
            decode(lease, &mut big).unwrap_err(),
            "json: cannot unmarshal number 3000000000 into Go struct field LeaseSpec.spec.leaseTransitions of type int32"
        );
    }
}
