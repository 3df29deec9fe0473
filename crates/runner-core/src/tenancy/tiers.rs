//! The tiers file (`RUNNER_TIERS_FILE`): named sets of limits, and which
//! tenant is in which tier. YAML or JSON:
//!
//! ```yaml
//! tiers:
//!   default: { sessions: 4, requestsPerMinute: 600 }
//!   anonymous: { sessions: 1, startsPerMinute: 2 }
//!   team: { sessions: 20, cpu: "8", memory: 16Gi }
//! tenants:
//!   acme: team
//! ```
//!
//! A limit left out is unlimited. `default` covers the tenants the file does
//! not name, `anonymous` the clients of anonymous mode; either may be left
//! out (then unlimited).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The tier of tenants the file does not name.
pub const DEFAULT_TIER: &str = "default";
/// The tier of anonymous mode's clients.
pub const ANONYMOUS_TIER: &str = "anonymous";

/// One tier's limits; `None` is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TierLimits {
    /// Live sessions (run and watch, not suspended ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u64>,
    /// Live watch sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_sessions: Option<u64>,
    /// Suspended watch sessions kept (checked when a watch session is
    /// created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_sessions: Option<u64>,
    /// Summed CPU limits of live sessions, in millicores (the file may say
    /// `"2"`, `"500m"` or a number).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "cpu_millis",
        serialize_with = "cpu_text"
    )]
    pub cpu: Option<u64>,
    /// Summed memory limits of live sessions, in bytes (`"4Gi"`, `"512M"`
    /// or a number of bytes).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "memory_bytes"
    )]
    pub memory: Option<u64>,
    /// Seconds of live sessions per UTC day, summed over the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_seconds_per_day: Option<u64>,
    /// `/v1` requests per minute, per principal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Session creations per minute, per principal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_per_minute: Option<u32>,
}

/// A parsed tiers file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tiers {
    #[serde(default)]
    pub tiers: BTreeMap<String, TierLimits>,
    #[serde(default)]
    pub tenants: BTreeMap<String, String>,
}

impl Tiers {
    /// Parses a tiers file (YAML, of which JSON is a part) and checks that
    /// every tenant names a tier the file defines.
    pub fn parse(text: &str) -> Result<Self, String> {
        let tiers: Tiers = serde_yaml_ng::from_str(text).map_err(|err| err.to_string())?;
        for (tenant, tier) in &tiers.tenants {
            if !tiers.tiers.contains_key(tier) {
                return Err(format!(
                    "tenant '{tenant}' is in tier '{tier}', which the file does not define"
                ));
            }
        }
        Ok(tiers)
    }

    /// The tier a tenant is in and its limits (unlimited when the file has
    /// no such tier).
    pub fn of_tenant(&self, tenant: &str, anonymous: bool) -> (String, TierLimits) {
        let name = if anonymous {
            ANONYMOUS_TIER
        } else {
            self.tenants
                .get(tenant)
                .map(String::as_str)
                .unwrap_or(DEFAULT_TIER)
        };
        let limits = self.tiers.get(name).cloned().unwrap_or_default();
        (name.to_owned(), limits)
    }
}

fn cpu_millis<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<u64>, D::Error> {
    quantity(
        de,
        parse_cpu_millis,
        "a CPU amount such as 2, 0.5 or \"500m\"",
    )
}

fn memory_bytes<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<u64>, D::Error> {
    quantity(
        de,
        parse_memory_bytes,
        "a memory amount such as \"4Gi\", \"512M\" or a number of bytes",
    )
}

fn cpu_text<S: serde::Serializer>(value: &Option<u64>, ser: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(millis) => ser.serialize_str(&format!("{millis}m")),
        None => ser.serialize_none(),
    }
}

fn quantity<'de, D: serde::Deserializer<'de>>(
    de: D,
    parse: fn(&str) -> Option<u64>,
    expected: &'static str,
) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(f64),
        Text(String),
    }
    let raw = Option::<Raw>::deserialize(de)?;
    let text = match raw {
        None => return Ok(None),
        Some(Raw::Number(number)) => number.to_string(),
        Some(Raw::Text(text)) => text,
    };
    parse(text.trim())
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("'{text}' is not {expected}")))
}

/// A Kubernetes-style CPU quantity (`2`, `0.5`, `500m`) in millicores.
pub fn parse_cpu_millis(text: &str) -> Option<u64> {
    let (number, scale) = match text.strip_suffix('m') {
        Some(millis) => (millis, 1.0),
        None => (text, 1000.0),
    };
    let value: f64 = number.parse().ok()?;
    (value.is_finite() && value >= 0.0).then(|| (value * scale).ceil() as u64)
}

/// A Kubernetes-style memory quantity (`512Mi`, `1G`, `1048576`) in bytes.
pub fn parse_memory_bytes(text: &str) -> Option<u64> {
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("K", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(suffix, scale)| text.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((text, 1.0));
    let value: f64 = number.parse().ok()?;
    (value.is_finite() && value >= 0.0).then(|| (value * scale).ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_files_parse_to_the_same_tiers() {
        let yaml = "tiers:\n  default: { sessions: 2, cpu: \"1500m\", memory: 1Gi }\n  team: { sessions: 20, requestsPerMinute: 600 }\ntenants:\n  acme: team\n";
        let json = r#"{"tiers": {"default": {"sessions": 2, "cpu": 1.5, "memory": 1073741824}, "team": {"sessions": 20, "requestsPerMinute": 600}}, "tenants": {"acme": "team"}}"#;
        let from_yaml = Tiers::parse(yaml).unwrap();
        assert_eq!(from_yaml, Tiers::parse(json).unwrap());
        let (tier, limits) = from_yaml.of_tenant("acme", false);
        assert_eq!((tier.as_str(), limits.sessions), ("team", Some(20)));
        let (tier, limits) = from_yaml.of_tenant("globex", false);
        assert_eq!(tier, "default");
        assert_eq!(limits.cpu, Some(1500));
        assert_eq!(limits.memory, Some(1 << 30));
        assert_eq!(limits.starts_per_minute, None);
        let (tier, limits) = from_yaml.of_tenant("acme", true);
        assert_eq!(
            (tier.as_str(), limits),
            ("anonymous", TierLimits::default())
        );
    }

    #[test]
    fn a_broken_file_says_what_is_wrong() {
        assert!(
            Tiers::parse("tiers: {default: {sessionz: 1}}")
                .unwrap_err()
                .contains("sessionz")
        );
        assert!(
            Tiers::parse("tiers: {default: {cpu: lots}}")
                .unwrap_err()
                .contains("'lots' is not a CPU amount")
        );
        assert_eq!(
            Tiers::parse("tiers: {}\ntenants: {acme: gold}").unwrap_err(),
            "tenant 'acme' is in tier 'gold', which the file does not define"
        );
        assert!(Tiers::parse("tiers: {default: {sessions: -1}}").is_err());
    }

    #[test]
    fn quantities_read_like_kubernetes_quantities() {
        assert_eq!(parse_cpu_millis("2"), Some(2000));
        assert_eq!(parse_cpu_millis("0.5"), Some(500));
        assert_eq!(parse_cpu_millis("250m"), Some(250));
        assert_eq!(parse_cpu_millis("-1"), None);
        assert_eq!(parse_memory_bytes("512Mi"), Some(512 << 20));
        assert_eq!(parse_memory_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_memory_bytes("42"), Some(42));
        assert_eq!(parse_memory_bytes("1Xi"), None);
    }
}
