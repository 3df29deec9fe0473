//! Timestamps as clients see them: ISO-8601 UTC with milliseconds and `Z`
//! (JavaScript's `Date.prototype.toISOString`).

use time::OffsetDateTime;
use time::macros::format_description;

pub fn iso(at: OffsetDateTime) -> String {
    let format =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    at.to_offset(time::UtcOffset::UTC)
        .format(&format)
        .unwrap_or_else(|_| at.unix_timestamp().to_string())
}

pub fn iso_now() -> String {
    iso(OffsetDateTime::now_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_to_iso_string() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(1_767_225_600_123_456_789).unwrap();
        assert_eq!(iso(at), "2026-01-01T00:00:00.123Z");
    }
}
