//! The schema walker: AJV's validation order and `coerceTypes: "array"`
//! coercions over the schemas of `schema.rs`.

use serde_json::{Number, Value};

use super::ValidationError;
use super::schema::{Additional, Schema};
use crate::js::{js_number, js_number_to_string, js_own_key_order};

/// Fastify's `dataVar` for bodies; instance paths are appended to it.
pub(super) const ROOT: &str = "body";

pub(super) fn fail(path: &str, message: impl std::fmt::Display) -> ValidationError {
    ValidationError {
        message: format!("{path} {message}"),
    }
}

/// `path` + `/` + the key as a JSON Pointer token (`~` → `~0`, `/` → `~1`).
pub(super) fn child_path(path: &str, key: &str) -> String {
    let token = key.replace('~', "~0").replace('/', "~1");
    format!("{path}/{token}")
}

/// Validates `value` against `schema`, coercing it in place as AJV does.
pub(super) fn check(schema: &Schema, value: &mut Value, path: &str) -> Result<(), ValidationError> {
    match schema {
        Schema::Named(_, inner) | Schema::Bounded(inner, _) | Schema::Described(inner, _) => {
            check(inner, value, path)
        }
        Schema::Object {
            required,
            properties,
            additional,
        } => {
            // Objects are never coerced, not even out of a one-element array.
            let Value::Object(map) = value else {
                return Err(fail(path, "must be object"));
            };
            if let Some(missing) = required.iter().find(|name| !map.contains_key(**name)) {
                return Err(fail(
                    path,
                    format_args!("must have required property '{missing}'"),
                ));
            }
            let is_declared = |key: &str| properties.iter().any(|(name, _)| *name == key);
            match additional {
                Additional::Keep => {}
                Additional::Strip => map.retain(|key, _| is_declared(key)),
                Additional::Each(each) => {
                    let extra: Vec<String> = js_own_key_order(map)
                        .into_iter()
                        .filter(|key| !is_declared(key))
                        .map(str::to_owned)
                        .collect();
                    for key in extra {
                        if let Some(item) = map.get_mut(&key) {
                            check(each, item, &child_path(path, &key))?;
                        }
                    }
                }
            }
            for (name, property) in *properties {
                if let Some(item) = map.get_mut(*name) {
                    check(property, item, &child_path(path, name))?;
                }
            }
            Ok(())
        }
        Schema::Array { items, min_items } => {
            if !value.is_array() {
                // A scalar (or null) where an array is expected is wrapped.
                if matches!(value, Value::Object(_)) {
                    return Err(fail(path, "must be array"));
                }
                *value = Value::Array(vec![value.take()]);
            }
            if let Value::Array(elements) = value {
                if elements.len() < *min_items {
                    return Err(fail(
                        path,
                        format_args!("must NOT have fewer than {min_items} items"),
                    ));
                }
                for (index, element) in elements.iter_mut().enumerate() {
                    check(items, element, &format!("{path}/{index}"))?;
                }
            }
            Ok(())
        }
        Schema::String {
            min_length,
            max_length,
            one_of,
        } => {
            let text = coerce(value, Scalar::String)
                .and_then(|_| value.as_str())
                .ok_or_else(|| fail(path, "must be string"))?;
            if let Some(allowed) = one_of
                && !allowed.contains(&text)
            {
                return Err(fail(path, "must be equal to one of the allowed values"));
            }
            if let Some(max) = max_length
                && text.chars().count() > *max
            {
                return Err(fail(
                    path,
                    format_args!("must NOT have more than {max} characters"),
                ));
            }
            if text.chars().count() < *min_length {
                return Err(fail(
                    path,
                    format_args!("must NOT have fewer than {min_length} characters"),
                ));
            }
            Ok(())
        }
        Schema::Integer { minimum, maximum } => {
            let number =
                coerce(value, Scalar::Integer).ok_or_else(|| fail(path, "must be integer"))?;
            let (low, high) = (*minimum as f64, *maximum as f64);
            if number > high {
                return Err(fail(path, format_args!("must be <= {maximum}")));
            }
            if number < low {
                return Err(fail(path, format_args!("must be >= {minimum}")));
            }
            // Store whole numbers as integers so typed deserialization
            // (`u16` ports) accepts `8080.0` and coerced values alike.
            *value = integer_value(number);
            Ok(())
        }
        Schema::Boolean => coerce(value, Scalar::Boolean)
            .map(|_| ())
            .ok_or_else(|| fail(path, "must be boolean")),
    }
}

#[derive(Clone, Copy)]
enum Scalar {
    String,
    Integer,
    Boolean,
}

/// AJV's `coerceTypes: "array"` for one scalar type. On success `value` holds
/// the coerced value and the result is `Some` (the number, for integers);
/// `None` means a type error.
///
/// A one-element array is unwrapped first; if its element still has the wrong
/// type, the scalar coercions are tried on the element.
fn coerce(value: &mut Value, target: Scalar) -> Option<f64> {
    if let Some(number) = matches_scalar(value, target) {
        return Some(number);
    }
    let candidate = match &*value {
        Value::Array(elements) if elements.len() == 1 => elements[0].clone(),
        other => other.clone(),
    };
    if let Some(number) = matches_scalar(&candidate, target) {
        *value = candidate;
        return Some(number);
    }
    let coerced = match (target, &candidate) {
        (Scalar::String, Value::Number(n)) => Value::String(js_number_to_string(number_f64(n))),
        (Scalar::String, Value::Bool(b)) => Value::String(b.to_string()),
        (Scalar::String, Value::Null) => Value::String(String::new()),
        (Scalar::Integer, Value::Bool(b)) => Value::from(u8::from(*b)),
        (Scalar::Integer, Value::Null) => Value::from(0),
        // `data && data == +data && !(data % 1)`: a non-empty string whose
        // `Number()` is whole. Non-finite results ("Infinity") would slip
        // through AJV's range keywords; we refuse them as non-integers.
        (Scalar::Integer, Value::String(text)) if !text.is_empty() => {
            let number = js_number(text).filter(|n| n.is_finite() && n.fract() == 0.0)?;
            integer_value(number)
        }
        (Scalar::Boolean, Value::String(text)) if text == "false" => Value::Bool(false),
        (Scalar::Boolean, Value::String(text)) if text == "true" => Value::Bool(true),
        (Scalar::Boolean, Value::Null) => Value::Bool(false),
        (Scalar::Boolean, Value::Number(n)) if number_f64(n) == 0.0 => Value::Bool(false),
        (Scalar::Boolean, Value::Number(n)) if number_f64(n) == 1.0 => Value::Bool(true),
        _ => return None,
    };
    let number = matches_scalar(&coerced, target);
    *value = coerced;
    number
}

/// `Some` when `value` already has the target type (with `strictNumbers`,
/// integers must be finite whole numbers); the number for integers, `0.0`
/// otherwise.
fn matches_scalar(value: &Value, target: Scalar) -> Option<f64> {
    match (target, value) {
        (Scalar::String, Value::String(_)) | (Scalar::Boolean, Value::Bool(_)) => Some(0.0),
        (Scalar::Integer, Value::Number(n)) => {
            let number = number_f64(n);
            (number.is_finite() && number.fract() == 0.0).then_some(number)
        }
        _ => None,
    }
}

/// The value JavaScript's `JSON.parse` would produce for this number.
fn number_f64(n: &Number) -> f64 {
    n.as_f64().unwrap_or(f64::NAN)
}

pub(super) fn integer_value(number: f64) -> Value {
    // -2^63..2^63: in range for i64, so the conversion is exact for a whole
    // number.
    const I64_RANGE: std::ops::Range<f64> =
        -9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0;
    if I64_RANGE.contains(&number) {
        Value::from(number as i64)
    } else {
        Number::from_f64(number).map_or(Value::Null, Value::Number)
    }
}
