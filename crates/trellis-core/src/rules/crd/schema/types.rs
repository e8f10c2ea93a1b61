//! The type of a node: the `type` it declares (one type, a list with
//! `null`, integer with string) and, where it declares none, the one its
//! other keywords imply — a structural schema needs one on every node.

use serde_json::{Map, Value};

use super::*;

impl Converter {
    /// `type` as written: one type, a list with `null`, or integer+string.
    pub(super) fn declared_type(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        outer: Option<&Map<String, Value>>,
    ) -> Declared {
        let field = format!("{at}.type");
        let mut names: Vec<&str> = match s.get("type") {
            None => return Declared::default(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            Some(_) => {
                self.error(&field, "must be a type name or a list of them");
                return Declared::default();
            }
        };
        let nullable = names.contains(&"null");
        names.retain(|t| *t != "null");
        names.sort();
        names.dedup();
        if let Some(bad) = names.iter().find(|t| !TYPES.contains(t)) {
            self.error(&field, format!("unknown type `{bad}`"));
            return Declared::default();
        }
        let declared = match names.as_slice() {
            [] => {
                self.error(
                    &field,
                    "a field that can only be null has no equivalent in a CRD schema",
                );
                Declared::default()
            }
            [one] => Declared {
                ty: Some((*one).to_owned()),
                nullable,
                int_or_string: false,
            },
            ["integer", "string"] => Declared {
                ty: None,
                nullable,
                int_or_string: true,
            },
            ["integer", "number"] => Declared {
                ty: Some("number".into()),
                nullable,
                int_or_string: false,
            },
            many => {
                self.error(
                    &field,
                    format!(
                        "a field of several types ({}) has no equivalent in a CRD schema \
                         (only [integer, string], as x-kubernetes-int-or-string)",
                        many.join(", ")
                    ),
                );
                Declared::default()
            }
        };
        let Some(outer) = outer else {
            return declared;
        };
        // Inside a junctor a type may only restate the outer one.
        let outer_ty = outer.get("type").and_then(Value::as_str);
        let outer_ios = outer.get(INT_OR_STRING) == Some(&Value::Bool(true));
        let restates = match (&declared.ty, declared.int_or_string) {
            (Some(t), _) => {
                outer_ty == Some(t.as_str())
                    || (outer_ios && (t == "integer" || t == "string"))
                    || (outer_ty == Some("number") && t == "integer")
            }
            (None, true) => outer_ios,
            (None, false) => true,
        };
        if !restates || declared.nullable {
            self.error(
                &field,
                format!(
                    "a branch of a combinator may only restate the type around it ({}): \
                     branches of different types have no equivalent in a CRD schema",
                    outer_ty.unwrap_or(if outer_ios { "int-or-string" } else { "none" })
                ),
            );
        }
        Declared::default()
    }

    pub(super) fn infer_type(&mut self, s: &Map<String, Value>, at: &str) -> Inferred {
        let has = |keys: &[&str]| keys.iter().any(|k| s.contains_key(*k));
        if has(&[
            "properties",
            "additionalProperties",
            "required",
            "minProperties",
            "maxProperties",
        ]) {
            return Inferred::Type("object".into());
        }
        if has(&["items", "minItems", "maxItems", "uniqueItems"]) {
            return Inferred::Type("array".into());
        }
        let values: Vec<&Value> = match (s.get("enum"), s.get("const")) {
            (Some(Value::Array(e)), _) => e.iter().collect(),
            (None, Some(c)) => vec![c],
            _ => Vec::new(),
        };
        if !values.is_empty() {
            let mut types: Vec<&str> = values.iter().map(|v| json_type(v)).collect();
            types.sort();
            types.dedup();
            return match types.as_slice() {
                [one] if *one != "null" => Inferred::Type((*one).into()),
                ["integer", "number"] => Inferred::Type("number".into()),
                ["integer", "string"] => Inferred::IntOrString,
                _ => {
                    self.error(
                        &format!("{at}.enum"),
                        "values of several types need a `type:` (a CRD field has one type)",
                    );
                    Inferred::Unknown
                }
            };
        }
        if has(&["minLength", "maxLength", "pattern"]) {
            return Inferred::Type("string".into());
        }
        if has(&[
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ]) {
            return Inferred::Type("number".into());
        }
        // `anyOf: [{type: integer}, {type: string}]` and friends.
        for key in ["anyOf", "oneOf"] {
            let Some(branches) = s.get(key).and_then(Value::as_array) else {
                continue;
            };
            let mut types: Vec<&str> = Vec::new();
            for b in branches {
                match b.get("type").and_then(Value::as_str) {
                    Some(t) => types.push(t),
                    None => return Inferred::Unknown,
                }
            }
            types.sort();
            types.dedup();
            return match types.as_slice() {
                [one] => Inferred::Type((*one).into()),
                ["integer", "string"] => Inferred::IntOrString,
                _ => {
                    self.error(
                        &format!("{at}.{key}"),
                        format!(
                            "branches of different types ({}) have no equivalent in a CRD schema",
                            types.join(", ")
                        ),
                    );
                    Inferred::Unknown
                }
            };
        }
        Inferred::Unknown
    }
}
