//! The keywords of each type (numbers' bounds, arrays' items, objects'
//! properties, the `allOf`/`anyOf`/`oneOf`/`not` combinators) mapped to
//! their structural equivalent, and every keyword without one refused by
//! name.

use serde_json::{Map, Value, json};

use super::*;

impl Converter {
    pub(super) fn numbers(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        out: &mut Map<String, Value>,
    ) {
        if let Some(v) = s.get("multipleOf") {
            out.insert("multipleOf".into(), v.clone());
        }
        // 2020-12 writes the bound itself in `exclusiveMinimum`; OpenAPI v3.0
        // writes `minimum` and a boolean. Keep the stricter bound.
        for (bound, exclusive, stricter) in [
            ("minimum", "exclusiveMinimum", 1.0),
            ("maximum", "exclusiveMaximum", -1.0),
        ] {
            let inclusive = s.get(bound);
            match (inclusive, s.get(exclusive)) {
                (_, Some(Value::Bool(_))) => self.error(
                    &format!("{at}.{exclusive}"),
                    "in JSON Schema 2020-12 this is the bound itself (a number), not a boolean",
                ),
                (Some(i), Some(e)) => {
                    let (iv, ev) = (i.as_f64().unwrap_or(0.0), e.as_f64().unwrap_or(0.0));
                    if (ev - iv) * stricter >= 0.0 {
                        out.insert(bound.into(), e.clone());
                        out.insert(exclusive.into(), json!(true));
                    } else {
                        out.insert(bound.into(), i.clone());
                    }
                }
                (None, Some(e)) => {
                    out.insert(bound.into(), e.clone());
                    out.insert(exclusive.into(), json!(true));
                }
                (Some(i), None) => {
                    out.insert(bound.into(), i.clone());
                }
                (None, None) => {}
            }
        }
    }

    pub(super) fn array(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        outer: Option<&Map<String, Value>>,
        ty: Option<&str>,
        out: &mut Map<String, Value>,
    ) {
        match s.get("items") {
            Some(Value::Array(_)) => self.error(
                &format!("{at}.items"),
                "a list of item schemas (a tuple) has no equivalent in a CRD schema: \
                 every item has the same schema",
            ),
            Some(items) => {
                let field = format!("{at}.items");
                let outer_items = match outer {
                    Some(o) => match o.get("items").and_then(Value::as_object) {
                        Some(oi) => Some(oi),
                        None => {
                            self.error(&field, declared_outside("items"));
                            None
                        }
                    },
                    None => None,
                };
                if outer.is_none() || outer_items.is_some() {
                    let converted = self.node(items, &field, outer_items);
                    out.insert("items".into(), Value::Object(converted));
                }
            }
            None if ty == Some("array") && outer.is_none() => {
                out.insert("items".into(), json!({PRESERVE: true}));
            }
            None => {}
        }
        for key in ["minItems", "maxItems"] {
            if let Some(v) = s.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        if s.get("uniqueItems") == Some(&Value::Bool(true)) {
            let field = format!("{at}.uniqueItems");
            let item_ty = out
                .get("items")
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str);
            if outer.is_some() {
                self.error(&field, junctor_only_checks("uniqueItems"));
            } else if s.contains_key("x-kubernetes-list-type") {
                // The author chose the list type; theirs wins.
            } else if matches!(item_ty, Some("string" | "integer" | "number" | "boolean")) {
                out.insert("x-kubernetes-list-type".into(), json!("set"));
            } else {
                self.error(
                    &field,
                    "`uniqueItems` has no equivalent in a CRD schema for items that are not \
                     scalars: use `x-kubernetes-list-type: map` with `x-kubernetes-list-map-keys`",
                );
            }
        }
    }

    pub(super) fn object(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        outer: Option<&Map<String, Value>>,
        ty: Option<&str>,
        keeps_anything: bool,
        out: &mut Map<String, Value>,
    ) {
        let properties = s.get("properties").and_then(Value::as_object);
        if let Some(props) = properties {
            let outer_props = outer.map(|o| o.get("properties").and_then(Value::as_object));
            let mut converted = Map::new();
            for (name, prop) in props {
                let field = format!("{at}.properties.{name}");
                let outer_prop = match outer_props {
                    None => None,
                    Some(op) => match op.and_then(|op| op.get(name)).and_then(Value::as_object) {
                        Some(p) => Some(p),
                        None => {
                            self.error(&field, declared_outside(&format!("property `{name}`")));
                            continue;
                        }
                    },
                };
                converted.insert(
                    name.clone(),
                    Value::Object(self.node(prop, &field, outer_prop)),
                );
            }
            out.insert("properties".into(), Value::Object(converted));
        }
        if let Some(required) = s.get("required") {
            out.insert("required".into(), required.clone());
        }
        for key in ["minProperties", "maxProperties"] {
            if let Some(v) = s.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        let field = format!("{at}.additionalProperties");
        match s.get("additionalProperties") {
            Some(_) if outer.is_some() => {
                self.error(&field, junctor_only_checks("additionalProperties"));
            }
            // Undeclared fields are pruned: the CRD way of saying no extras.
            Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => {
                out.insert(PRESERVE.into(), json!(true));
            }
            Some(schema) if properties.is_some() => {
                let _ = schema;
                self.error(
                    &field,
                    "a CRD object has either `properties` or `additionalProperties` (a map), \
                     not both",
                );
            }
            Some(schema) => {
                let converted = self.node(schema, &field, None);
                out.insert("additionalProperties".into(), Value::Object(converted));
            }
            None => {
                if ty == Some("object")
                    && outer.is_none()
                    && properties.is_none()
                    && !keeps_anything
                {
                    // `type: object` alone accepts any field in JSON Schema.
                    out.insert(PRESERVE.into(), json!(true));
                }
            }
        }
    }

    pub(super) fn junctors(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        out: &mut Map<String, Value>,
    ) {
        let around = out.clone();
        for key in JUNCTORS {
            let Some(value) = s.get(*key) else { continue };
            let Some(branches) = value.as_array() else {
                self.error(&format!("{at}.{key}"), "must be a list of schemas");
                continue;
            };
            let converted: Vec<Value> = branches
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    Value::Object(self.node(b, &format!("{at}.{key}[{i}]"), Some(&around)))
                })
                .collect();
            out.insert((*key).into(), Value::Array(converted));
        }
        if let Some(not) = s.get("not") {
            let converted = self.node(not, &format!("{at}.not"), Some(&around));
            out.insert("not".into(), Value::Object(converted));
        }
    }

    pub(super) fn refuse_unknown(&mut self, s: &Map<String, Value>, at: &str) {
        const HANDLED: &[&str] = &[
            "type",
            "title",
            "description",
            "nullable",
            "format",
            "enum",
            "const",
            "multipleOf",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "minLength",
            "maxLength",
            "pattern",
            "items",
            "minItems",
            "maxItems",
            "uniqueItems",
            "properties",
            "required",
            "additionalProperties",
            "minProperties",
            "maxProperties",
            "default",
            "example",
            "examples",
            "allOf",
            "anyOf",
            "oneOf",
            "not",
        ];
        for key in s.keys() {
            let k = key.as_str();
            if HANDLED.contains(&k) || EXTENSIONS.contains(&k) || IGNORED.contains(&k) {
                continue;
            }
            let message = if k.starts_with("x-kubernetes-") {
                format!("unknown extension `{k}` (known: {})", EXTENSIONS.join(", "))
            } else {
                refusal(k)
            };
            self.error(&format!("{at}.{k}"), message);
        }
    }
}
