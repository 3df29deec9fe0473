//! `resource.Quantity`: parsing and canonical printing of the amounts quota
//! accounting adds up (`500m`, `512Mi`, `16`).

/// An amount in thousandths of a unit (cpu millicores; memory milli-bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Quantity {
    pub milli: i128,
    /// Printed with binary suffixes (Ki, Mi, Gi) when it parsed with one.
    pub binary: bool,
}

impl Quantity {
    pub fn from_count(n: i128) -> Self {
        Self {
            milli: n * 1000,
            binary: false,
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
            .unwrap_or(text.len());
        let (num, suffix) = text.split_at(split);
        if num.is_empty() {
            return None;
        }
        let (mult_num, mult_den, binary): (i128, i128, bool) = match suffix {
            "" => (1, 1, false),
            "m" => (1, 1000, false),
            "k" => (1_000, 1, false),
            "M" => (1_000_000, 1, false),
            "G" => (1_000_000_000, 1, false),
            "T" => (1_000_000_000_000, 1, false),
            "Ki" => (1 << 10, 1, true),
            "Mi" => (1 << 20, 1, true),
            "Gi" => (1 << 30, 1, true),
            "Ti" => (1 << 40, 1, true),
            s if s.starts_with('e') || s.starts_with('E') => {
                let exp: u32 = s[1..].parse().ok()?;
                (10i128.checked_pow(exp)?, 1, false)
            }
            _ => return None,
        };
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        let negative = int_part.starts_with('-');
        let int_digits = int_part.trim_start_matches(['+', '-']);
        let int: i128 = if int_digits.is_empty() {
            0
        } else {
            int_digits.parse().ok()?
        };
        // value * 1000 * mult_num / mult_den, keeping up to 9 fraction digits.
        let frac_digits: String = frac_part.chars().take(9).collect();
        let frac: i128 = if frac_digits.is_empty() {
            0
        } else {
            frac_digits.parse().ok()?
        };
        let frac_scale = 10i128.pow(frac_digits.len() as u32);
        let scaled = (int * frac_scale + frac) * 1000 * mult_num / (mult_den * frac_scale);
        Some(Self {
            milli: if negative { -scaled } else { scaled },
            binary,
        })
    }

    /// The canonical form the apiserver prints (`500m`, `2`, `512Mi`).
    pub fn canonical(&self) -> String {
        let m = self.milli;
        if m % 1000 != 0 {
            return format!("{m}m");
        }
        let units = m / 1000;
        if self.binary && units != 0 {
            for (suffix, size) in [
                ("Ti", 1i128 << 40),
                ("Gi", 1 << 30),
                ("Mi", 1 << 20),
                ("Ki", 1 << 10),
            ] {
                if units % size == 0 {
                    return format!("{}{suffix}", units / size);
                }
            }
        }
        units.to_string()
    }

    pub fn plus(self, other: Quantity) -> Quantity {
        Quantity {
            milli: self.milli + other.milli,
            binary: self.binary || other.binary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_cpu_and_memory() {
        assert_eq!(Quantity::parse("500m").map(|q| q.milli), Some(500));
        assert_eq!(
            Quantity::parse("0.5").map(|q| q.canonical()),
            Some("500m".into())
        );
        assert_eq!(
            Quantity::parse("16").map(|q| q.canonical()),
            Some("16".into())
        );
        assert_eq!(
            Quantity::parse("512Mi").map(|q| q.canonical()),
            Some("512Mi".into())
        );
        let sum = Quantity::parse("512Mi")
            .zip(Quantity::parse("512Mi"))
            .map(|(a, b)| a.plus(b).canonical());
        assert_eq!(sum, Some("1Gi".into()));
        assert_eq!(
            Quantity::parse("1e3").map(|q| q.canonical()),
            Some("1k".replace('k', "000"))
        );
        assert_eq!(Quantity::parse("abc"), None);
    }
}
