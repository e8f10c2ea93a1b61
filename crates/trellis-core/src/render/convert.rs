//! Filters that turn text into values: `fromjson`, `fromyaml` (under the rule
//! loader's size and depth budgets) and `quantity` (Kubernetes quantities).

use minijinja::{Error, ErrorKind, Value};

use super::filters::string_arg;
use crate::yaml;

fn invalid(filter: &str, message: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{filter}: {message}"))
}

/// Nesting depth of a JSON value (a scalar is 0).
fn depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

pub fn fromjson(value: &Value) -> Result<Value, Error> {
    let text = string_arg("fromjson", value)?;
    let limits = yaml::Limits::FILES;
    if text.len() > limits.max_bytes {
        return Err(invalid(
            "fromjson",
            format!("input is larger than {} bytes", limits.max_bytes),
        ));
    }
    let parsed: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid("fromjson", e))?;
    if depth(&parsed) > limits.max_depth {
        return Err(invalid(
            "fromjson",
            format!("nested deeper than {} levels", limits.max_depth),
        ));
    }
    Ok(super::to_value(&parsed))
}

pub fn fromyaml(value: &Value) -> Result<Value, Error> {
    let text = string_arg("fromyaml", value)?;
    let parsed =
        yaml::parse_data(&text, &yaml::Limits::FILES).map_err(|e| invalid("fromyaml", e))?;
    Ok(super::to_value(&parsed))
}

/// `"500m"` → 0.5, `"1Gi"` → 1073741824, `"2"` → 2, `"1e3"` → 1000.
pub fn quantity(value: &Value) -> Result<Value, Error> {
    let text = string_arg("quantity", value)?;
    let number = parse_quantity(text.trim())
        .ok_or_else(|| invalid("quantity", format!("`{text}` is not a Kubernetes quantity")))?;
    if number.fract() == 0.0 && number.abs() < 9.0e15 {
        Ok(Value::from(number as i64))
    } else {
        Ok(Value::from(number))
    }
}

/// A Kubernetes quantity in base units; `None` when `text` is not one.
pub fn parse_quantity(text: &str) -> Option<f64> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() || number == "+" || number == "-" {
        return None;
    }
    let base: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().ok()?;
            10f64.powi(e)
        }
        _ => return None,
    };
    Some(base * multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_become_numbers_in_base_units() {
        assert_eq!(quantity(&Value::from("500m")).unwrap(), Value::from(0.5));
        assert_eq!(
            quantity(&Value::from("1Gi")).unwrap(),
            Value::from(1_073_741_824)
        );
        assert_eq!(quantity(&Value::from("2")).unwrap(), Value::from(2));
        assert_eq!(quantity(&Value::from("1.5k")).unwrap(), Value::from(1500));
        assert_eq!(quantity(&Value::from("1e3")).unwrap(), Value::from(1000));
        assert!(quantity(&Value::from("12 apples")).is_err());
        assert!(quantity(&Value::from("Gi")).is_err());
        assert!(quantity(&Value::UNDEFINED).is_err());
    }

    #[test]
    fn fromjson_and_fromyaml_parse_within_budgets() {
        let v = fromjson(&Value::from(r#"{"a": [1, 2]}"#)).unwrap();
        assert_eq!(v.get_attr("a").unwrap().len(), Some(2));
        let v = fromyaml(&Value::from("a: 0400\nb: [x]\n")).unwrap();
        assert_eq!(
            v.get_attr("a").unwrap(),
            Value::from(400),
            "data is YAML 1.2"
        );
        assert!(fromjson(&Value::from("{")).is_err());
        let deep = format!("{}{}", "[".repeat(60), "]".repeat(60));
        assert!(fromjson(&Value::from(deep.as_str())).is_err());
        assert!(fromyaml(&Value::from(deep.as_str())).is_err());
        assert!(fromjson(&Value::UNDEFINED).is_err());
    }
}
