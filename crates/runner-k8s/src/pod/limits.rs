//! Resource limits of a session pod: the operator's ceilings, lowered where a
//! request asks for less (docs/contract.md §9.6).
//!
//! The `/v1` contract carries no per-request limits today, so the effective
//! limits are the ceilings; the clamp exists so that plumbing requests through
//! later cannot bypass them.

use runner_api::js::js_number;

use crate::config::LimitCeilings;

/// What a request may ask for; absent fields take the ceiling.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestedLimits {
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub ephemeral_storage: Option<String>,
    pub ttl_seconds: Option<u64>,
}

/// The limits a pod is built with. Quantities are strings as Kubernetes takes
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveLimits {
    pub cpu: String,
    pub memory: String,
    pub ephemeral_storage: String,
    pub ttl_seconds: u64,
}

/// Each requested value at or under its ceiling is kept exactly as written;
/// anything above, or anything either side cannot be read as a quantity,
/// yields the ceiling. Refusing to compare is the safe answer: an unreadable
/// request never loosens a ceiling, and an unreadable ceiling is still the
/// operator's word.
pub fn clamp_limits(
    ceilings: &LimitCeilings,
    requested: Option<&RequestedLimits>,
) -> EffectiveLimits {
    let asked = |pick: fn(&RequestedLimits) -> Option<&String>| requested.and_then(pick);
    EffectiveLimits {
        cpu: clamp_quantity(&ceilings.cpu, asked(|r| r.cpu.as_ref()), parse_cpu_millis),
        memory: clamp_quantity(
            &ceilings.memory,
            asked(|r| r.memory.as_ref()),
            parse_memory_bytes,
        ),
        ephemeral_storage: clamp_quantity(
            &ceilings.ephemeral_storage,
            asked(|r| r.ephemeral_storage.as_ref()),
            parse_memory_bytes,
        ),
        ttl_seconds: match requested.and_then(|r| r.ttl_seconds) {
            Some(ttl) if ttl > 0 => ttl.min(ceilings.ttl_seconds),
            _ => ceilings.ttl_seconds,
        },
    }
}

fn clamp_quantity(
    ceiling: &str,
    requested: Option<&String>,
    parse: fn(&str) -> Option<f64>,
) -> String {
    let Some(requested) = requested else {
        return ceiling.to_owned();
    };
    match (parse(requested), parse(ceiling)) {
        (Some(asked), Some(limit)) if asked <= limit => requested.clone(),
        _ => ceiling.to_owned(),
    }
}

/// A CPU quantity in millicores: `"50m"` → 50, `"1"` → 1000, `"0.5"` → 500.
///
/// Numbers are read the way the reference reads them (JavaScript `Number`),
/// except that an empty number (`"m"`) and negative or infinite values are not
/// quantities: JavaScript reads `""` as 0, which would let a request of `"m"`
/// pass the clamp and then be rejected by the apiserver.
pub fn parse_cpu_millis(quantity: &str) -> Option<f64> {
    let text = quantity.trim();
    let millis = match text.strip_suffix('m') {
        Some(number) => quantity_number(number)?,
        None => (quantity_number(text)? * 1000.0).round(),
    };
    Some(millis)
}

/// A memory or storage quantity in bytes: `"100Mi"`, `"1Gi"`, `"1000"`, `"5M"`.
/// Binary suffixes `Ki Mi Gi Ti`, decimal `K M G T` and `k`; a plain or
/// decimal-point number, optionally followed by spaces and the suffix. No
/// exponents and no `Pi`/`Ei`, as the reference.
pub fn parse_memory_bytes(quantity: &str) -> Option<f64> {
    let text = quantity.trim();
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, rest) = text.split_at(number_end);
    if !is_plain_decimal(number) {
        return None;
    }
    let suffix = rest.trim_start_matches(char::is_whitespace);
    let scale = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "K" | "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    Some(value * scale)
}

/// `digits` or `digits.digits`.
fn is_plain_decimal(text: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    match text.split_once('.') {
        Some((whole, fraction)) => digits(whole) && digits(fraction),
        None => digits(text),
    }
}

fn quantity_number(text: &str) -> Option<f64> {
    if text.trim().is_empty() {
        return None;
    }
    js_number(text).filter(|n| n.is_finite() && *n >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// The ceilings of the reference's own limits test.
    fn ceilings() -> LimitCeilings {
        LimitCeilings {
            cpu: "50m".into(),
            memory: "100Mi".into(),
            ttl_seconds: 3600,
            ephemeral_storage: "512Mi".into(),
        }
    }

    fn request(cpu: &str, memory: &str, storage: &str, ttl: u64) -> RequestedLimits {
        RequestedLimits {
            cpu: Some(cpu.into()),
            memory: Some(memory.into()),
            ephemeral_storage: Some(storage.into()),
            ttl_seconds: Some(ttl),
        }
    }

    fn effective(cpu: &str, memory: &str, storage: &str, ttl: u64) -> EffectiveLimits {
        EffectiveLimits {
            cpu: cpu.into(),
            memory: memory.into(),
            ephemeral_storage: storage.into(),
            ttl_seconds: ttl,
        }
    }

    #[test]
    fn without_a_request_the_ceilings_apply() {
        assert_eq!(
            clamp_limits(&ceilings(), None),
            effective("50m", "100Mi", "512Mi", 3600)
        );
        assert_eq!(
            clamp_limits(&ceilings(), Some(&RequestedLimits::default())),
            effective("50m", "100Mi", "512Mi", 3600)
        );
    }

    #[test]
    fn a_request_above_the_ceilings_is_clamped_to_them() {
        let asked = request("2", "4Gi", "10Gi", 99_999);
        assert_eq!(
            clamp_limits(&ceilings(), Some(&asked)),
            effective("50m", "100Mi", "512Mi", 3600)
        );
    }

    #[test]
    fn a_request_under_the_ceilings_is_honoured_verbatim() {
        let asked = request("20m", "64Mi", "256Mi", 600);
        assert_eq!(
            clamp_limits(&ceilings(), Some(&asked)),
            effective("20m", "64Mi", "256Mi", 600)
        );
    }

    #[test]
    fn an_unreadable_request_falls_back_to_the_ceilings() {
        let asked = request("garbage", "??", "lots", 0);
        assert_eq!(
            clamp_limits(&ceilings(), Some(&asked)),
            effective("50m", "100Mi", "512Mi", 3600)
        );
    }

    #[test]
    fn an_unreadable_ceiling_is_kept_as_written() {
        let odd = LimitCeilings {
            cpu: "lots".into(),
            memory: "1Pi".into(),
            ttl_seconds: 60,
            ephemeral_storage: "1Gi".into(),
        };
        let asked = request("1m", "1Ki", "1Ki", 30);
        assert_eq!(
            clamp_limits(&odd, Some(&asked)),
            effective("lots", "1Pi", "1Ki", 30)
        );
    }

    #[test]
    fn an_equal_request_is_honoured_in_its_own_spelling() {
        let asked = request("0.05", "104857600", "0.5Gi", 3600);
        assert_eq!(
            clamp_limits(&ceilings(), Some(&asked)),
            effective("0.05", "104857600", "0.5Gi", 3600)
        );
    }

    #[rstest]
    #[case("50m", Some(50.0))]
    #[case("1", Some(1000.0))]
    #[case("0.5", Some(500.0))]
    #[case(" 250m ", Some(250.0))]
    #[case("1.5m", Some(1.5))]
    #[case("0.0004", Some(0.0))]
    #[case("nope", None)]
    #[case("", None)]
    #[case("m", None)]
    #[case("-1", None)]
    #[case("Infinity", None)]
    #[case("1Gi", None)]
    fn cpu_quantities_read_as_millicores(#[case] quantity: &str, #[case] millis: Option<f64>) {
        assert_eq!(parse_cpu_millis(quantity), millis, "{quantity:?}");
    }

    #[rstest]
    #[case("100Mi", Some(104_857_600.0))]
    #[case("1Gi", Some(1_073_741_824.0))]
    #[case("1000", Some(1000.0))]
    #[case("5M", Some(5_000_000.0))]
    #[case("2Ki", Some(2048.0))]
    #[case("1Ti", Some(1_099_511_627_776.0))]
    #[case("3k", Some(3000.0))]
    #[case("3K", Some(3000.0))]
    #[case("2G", Some(2e9))]
    #[case("1T", Some(1e12))]
    #[case("1.5Gi", Some(1_610_612_736.0))]
    #[case("64 Mi", Some(67_108_864.0))]
    #[case("bad", None)]
    #[case("", None)]
    #[case("Mi", None)]
    #[case("1Pi", None)]
    #[case("1e3", None)]
    #[case("1m", None)]
    #[case("-1Mi", None)]
    #[case(".5Mi", None)]
    #[case("5.Mi", None)]
    fn memory_quantities_read_as_bytes(#[case] quantity: &str, #[case] bytes: Option<f64>) {
        assert_eq!(parse_memory_bytes(quantity), bytes, "{quantity:?}");
    }
}
