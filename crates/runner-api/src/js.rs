//! Small re-creations of JavaScript semantics the reference runner's
//! configuration depends on: `Number(string)`, `String.prototype.trim` and
//! the own-property order of an object's keys. An operator who moves an
//! environment (or an app catalog) from the reference runner must get the same
//! values and the same first error.

use serde_json::{Map, Value};

/// JavaScript's `WhiteSpace` and `LineTerminator` characters — the set
/// `String.prototype.trim` and `Number(string)` strip. It differs from Rust's
/// `char::is_whitespace` (U+FEFF is trimmed, U+0085 is not).
pub fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{9}' | '\u{A}' | '\u{B}' | '\u{C}' | '\u{D}' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

/// `String.prototype.trim`.
pub fn js_trim(raw: &str) -> &str {
    raw.trim_matches(is_js_whitespace)
}

/// JavaScript's `Number(string)`; `None` stands for `NaN`.
///
/// Accepted after trimming: the empty string (0), decimal literals with an
/// optional sign, fraction and exponent (`1.`, `.5`, `-1e3`), `Infinity` with
/// an optional sign, and unsigned `0x`/`0o`/`0b` integers of any length.
pub fn js_number(raw: &str) -> Option<f64> {
    let text = js_trim(raw);
    if text.is_empty() {
        return Some(0.0);
    }
    if let Some(radix_literal) = non_decimal_literal(text) {
        return radix_literal;
    }
    let unsigned = text
        .strip_prefix('+')
        .or_else(|| text.strip_prefix('-'))
        .unwrap_or(text);
    if unsigned == "Infinity" {
        return Some(if text.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    if !is_decimal_literal(unsigned) {
        return None;
    }
    // The grammar is checked above; Rust's parser is correctly rounded like
    // JavaScript's, so the value itself can be left to it.
    text.parse::<f64>().ok()
}

/// `digits [. digits] [e [+-] digits]` or `. digits [e ...]`, at least one
/// mantissa digit.
fn is_decimal_literal(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let (integer, fraction) = match mantissa.split_once('.') {
        Some((integer, fraction)) => (integer, fraction),
        None => (mantissa, ""),
    };
    let all_digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok =
        all_digits(integer) && all_digits(fraction) && !(integer.is_empty() && fraction.is_empty());
    let exponent_ok = exponent.is_none_or(|exponent| {
        let digits = exponent
            .strip_prefix('+')
            .or_else(|| exponent.strip_prefix('-'))
            .unwrap_or(exponent);
        !digits.is_empty() && all_digits(digits)
    });
    mantissa_ok && exponent_ok
}

/// `Some(value)` when `text` has a `0x`/`0o`/`0b` prefix (value `None` when the
/// digits are invalid), `None` when it is not such a literal at all.
fn non_decimal_literal(text: &str) -> Option<Option<f64>> {
    let bytes = text.as_bytes();
    if bytes.len() < 2 || bytes[0] != b'0' {
        return None;
    }
    let radix = match bytes[1] {
        b'x' | b'X' => 16,
        b'o' | b'O' => 8,
        b'b' | b'B' => 2,
        _ => return None,
    };
    let digits = &text[2..];
    if digits.is_empty() {
        return Some(None);
    }
    let mut values = Vec::with_capacity(digits.len());
    for c in digits.chars() {
        match c.to_digit(radix) {
            Some(value) => values.push(value),
            None => return Some(None),
        }
    }
    Some(Some(radix_digits_to_f64(&values, radix.trailing_zeros())))
}

/// Correctly rounded value of a power-of-two-radix digit string of any length:
/// the leading digits go into a wide integer, the rest only contribute a sticky
/// bit (which is all round-to-nearest needs) and a power-of-two scale.
fn radix_digits_to_f64(digits: &[u32], bits_per_digit: u32) -> f64 {
    const MANTISSA_BITS: u32 = 120;
    let mut mantissa: u128 = 0;
    let mut used_bits = 0u32;
    let mut dropped_digits = 0u64;
    let mut sticky = false;
    for &digit in digits.iter().skip_while(|d| **d == 0) {
        if used_bits + bits_per_digit <= MANTISSA_BITS {
            mantissa = (mantissa << bits_per_digit) | u128::from(digit);
            used_bits += bits_per_digit;
        } else {
            dropped_digits += 1;
            sticky |= digit != 0;
        }
    }
    if sticky {
        // Far below bit 53 of a 120-bit mantissa, so it only breaks ties.
        mantissa |= 1;
    }
    let value = mantissa as f64;
    let scale = dropped_digits.saturating_mul(u64::from(bits_per_digit));
    let scale = i32::try_from(scale).unwrap_or(i32::MAX);
    value * 2f64.powi(scale)
}

/// Keys of a JSON object in JavaScript's own-property order: keys that are
/// array indices (canonical integers below 2^32 - 1) first, ascending, then
/// every other key in insertion order. `Object.entries`, `Object.keys` and
/// `for…in` all use it, so it decides which of several bad entries the
/// reference reports and in what order it lists things.
pub fn js_own_key_order(map: &Map<String, Value>) -> Vec<&str> {
    let mut indices: Vec<(u32, &str)> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for key in map.keys() {
        match array_index(key) {
            Some(index) => indices.push((index, key)),
            None => names.push(key),
        }
    }
    indices.sort_unstable_by_key(|(index, _)| *index);
    indices
        .into_iter()
        .map(|(_, key)| key)
        .chain(names)
        .collect()
}

fn array_index(key: &str) -> Option<u32> {
    let canonical = key == "0"
        || (!key.is_empty() && !key.starts_with('0') && key.bytes().all(|b| b.is_ascii_digit()));
    if !canonical {
        return None;
    }
    key.parse::<u32>().ok().filter(|index| *index != u32::MAX)
}

/// JavaScript's `Number.prototype.toString()` for a finite number: the
/// shortest round-tripping digits, in plain notation for decimal exponents in
/// `-7..21` and as `d.ddde±x` outside it (`1e+21`, `1e-7`).
pub fn js_number_to_string(number: f64) -> String {
    if number.is_nan() {
        return "NaN".to_owned();
    }
    if number == 0.0 {
        return "0".to_owned();
    }
    if number.is_infinite() {
        return if number > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        }
        .to_owned();
    }
    let sign = if number < 0.0 { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits as `d[.ddd]e<exp>`.
    let scientific = format!("{:e}", number.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i64 = exponent.parse().unwrap_or(0);
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    // JavaScript's `n`: the decimal point sits after the first `n` digits.
    let n = exponent + 1;
    let body = if k <= n && n <= 21 {
        let zeros = usize::try_from(n - k).unwrap_or(0);
        format!("{digits}{}", "0".repeat(zeros))
    } else if 0 < n && n <= 21 {
        let split = usize::try_from(n).unwrap_or(0);
        format!("{}.{}", &digits[..split], &digits[split..])
    } else if -6 < n && n <= 0 {
        let zeros = usize::try_from(-n).unwrap_or(0);
        format!("0.{}{digits}", "0".repeat(zeros))
    } else {
        let exponent_sign = if n - 1 < 0 { '-' } else { '+' };
        let magnitude = (n - 1).abs();
        match digits.split_at_checked(1) {
            Some((first, rest)) if !rest.is_empty() => {
                format!("{first}.{rest}e{exponent_sign}{magnitude}")
            }
            _ => format!("{digits}e{exponent_sign}{magnitude}"),
        }
    };
    format!("{sign}{body}")
}

/// JavaScript's `Number(value)` for a JSON value: `null` is 0, booleans are
/// 0 and 1, strings go through [`js_number`]; arrays and objects (whose
/// conversion depends on their contents) count as no number.
pub fn js_number_of_value(value: &Value) -> Option<f64> {
    match value {
        Value::Null => Some(0.0),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::Number(n) => n.as_f64(),
        Value::String(s) => js_number(s),
        Value::Array(_) | Value::Object(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    #[rstest]
    #[case("", Some(0.0))]
    #[case("   ", Some(0.0))]
    #[case("\u{FEFF}\t\n 42 \u{A0}\u{3000}", Some(42.0))]
    #[case("42", Some(42.0))]
    #[case("+42", Some(42.0))]
    #[case("-42", Some(-42.0))]
    #[case("007", Some(7.0))]
    #[case("1.", Some(1.0))]
    #[case(".5", Some(0.5))]
    #[case("-.5e1", Some(-5.0))]
    #[case("1e3", Some(1000.0))]
    #[case("1E+3", Some(1000.0))]
    #[case("25e-1", Some(2.5))]
    #[case("1e400", Some(f64::INFINITY))]
    #[case("0x10", Some(16.0))]
    #[case("0XfF", Some(255.0))]
    #[case("0o17", Some(15.0))]
    #[case("0b101", Some(5.0))]
    #[case("Infinity", Some(f64::INFINITY))]
    #[case("+Infinity", Some(f64::INFINITY))]
    #[case("-Infinity", Some(f64::NEG_INFINITY))]
    #[case("infinity", None)]
    #[case("inf", None)]
    #[case("NaN", None)]
    #[case(".", None)]
    #[case("+", None)]
    #[case("e3", None)]
    #[case("1e", None)]
    #[case("1e+", None)]
    #[case("1.2.3", None)]
    #[case("1_000", None)]
    #[case("12px", None)]
    #[case("0x", None)]
    #[case("0xg", None)]
    #[case("0b2", None)]
    #[case("-0x10", None)]
    #[case("+0x10", None)]
    #[case("0x1.5", None)]
    #[case("\u{85}1", None)]
    fn js_number_follows_javascript_number_of_string(
        #[case] raw: &str,
        #[case] expected: Option<f64>,
    ) {
        assert_eq!(js_number(raw), expected, "Number({raw:?})");
    }

    #[test]
    fn js_number_keeps_the_sign_of_negative_zero() {
        let zero = js_number("-0").unwrap();
        assert_eq!(zero, 0.0);
        assert!(zero.is_sign_negative());
    }

    #[test]
    fn js_number_rounds_long_hex_literals_correctly() {
        // 2^64 + 1 rounds to 2^64; 2^53 + 1 rounds to even (2^53).
        assert_eq!(
            js_number("0x10000000000000001"),
            Some(18_446_744_073_709_551_616.0)
        );
        assert_eq!(js_number("0x20000000000001"), Some(9_007_199_254_740_992.0));
        // 2^53 + 3 rounds up to 2^53 + 4.
        assert_eq!(js_number("0x20000000000003"), Some(9_007_199_254_740_996.0));
        let huge = format!("0x1{}", "0".repeat(300));
        assert_eq!(js_number(&huge), Some(f64::INFINITY));
        // A tie broken by a far-away non-zero digit rounds up.
        let just_above_tie = format!("0x20000000000001{}1", "0".repeat(40));
        let expected = 9_007_199_254_740_994.0 * 2f64.powi(41 * 4);
        assert_eq!(js_number(&just_above_tie), Some(expected));
    }

    #[test]
    fn object_keys_follow_javascript_own_property_order() {
        let value =
            json!({"b": 1, "10": 2, "a": 3, "2": 4, "01": 5, "0": 6, "4294967295": 7, "-1": 8});
        let Value::Object(map) = value else {
            unreachable!()
        };
        assert_eq!(
            js_own_key_order(&map),
            vec!["0", "2", "10", "b", "a", "01", "4294967295", "-1"]
        );
    }
}
