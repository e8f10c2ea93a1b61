//! Whether an object fits an OpenAPI v3 schema the way the API server reads
//! it: fields the schema does not declare, and values of the wrong JSON type.
//! Nothing else (formats, patterns, bounds, CEL, required fields): those
//! depend on values a sample parent only imitates.
//!
//! One walker serves both sources of schemas: the bundled built-in
//! definitions (`$ref` between them; an object that declares no properties
//! is free-form, as `RawExtension` is) and a CRD's `openAPIV3Schema`
//! (structural: a field not declared is pruned unless
//! `x-kubernetes-preserve-unknown-fields` says keep it; `metadata` is the
//! built-in `ObjectMeta` whatever the CRD says).

use serde_json::{Map, Value};

use crate::field_path::push_key;

/// One thing wrong at a path of the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Where, written as a user reads it: `spec.template.spec.containers[0].image`.
    pub path: String,
    /// The keys along the path (indexes left out): to find the line a
    /// template writes it on.
    pub keys: Vec<String>,
    pub message: String,
}

/// Deepest nesting walked; deeper values are taken as they are (an object
/// this deep has other problems, and the walk must not overflow the stack).
const MAX_DEPTH: usize = 64;

/// The `$ref` target of built-in `ObjectMeta`.
pub const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Validates `object` against a schema. `definitions` resolves `$ref`s
/// (the built-in ones); `crd` says the root schema is a CRD's.
pub fn validate(
    object: &Value,
    root: &Value,
    definitions: &Map<String, Value>,
    crd: bool,
) -> Vec<Finding> {
    let mut walker = Walker {
        definitions,
        out: Vec::new(),
        keys: Vec::new(),
    };
    let mut path = String::new();
    if crd {
        walker.crd_resource(object, root, &mut path, 0);
    } else {
        walker.walk(object, root, &mut path, false, 0);
    }
    walker.out
}

struct Walker<'a> {
    definitions: &'a Map<String, Value>,
    out: Vec<Finding>,
    keys: Vec<String>,
}

impl<'a> Walker<'a> {
    fn report(&mut self, path: &str, message: String) {
        self.out.push(Finding {
            path: path.to_owned(),
            keys: self.keys.clone(),
            message,
        });
    }

    /// Follows `$ref` (the bundle writes bare definition names; an
    /// OpenAPI document writes `#/components/schemas/<name>`).
    fn resolve<'s>(&self, schema: &'s Value) -> Option<&'s Value>
    where
        'a: 's,
        Self: 's,
    {
        let mut schema = schema;
        for _ in 0..8 {
            match schema.get("$ref").and_then(Value::as_str) {
                Some(name) => {
                    let name = name.rsplit('/').next().unwrap_or(name);
                    schema = self.definitions.get(name)?;
                }
                None => return Some(schema),
            }
        }
        None
    }

    /// The root of a custom resource, or an embedded resource in one:
    /// `apiVersion` and `kind` are strings, `metadata` is `ObjectMeta`.
    fn crd_resource(&mut self, value: &Value, schema: &Value, path: &mut String, depth: usize) {
        let Value::Object(map) = value else {
            return self.walk(value, schema, path, true, depth);
        };
        let mut rest = Map::new();
        for (key, v) in map {
            let len = path.len();
            push_key(path, key);
            self.keys.push(key.clone());
            match key.as_str() {
                "apiVersion" | "kind" => {
                    self.walk(v, &serde_json::json!({"type": "string"}), path, true, depth)
                }
                "metadata" => {
                    let meta = serde_json::json!({ "$ref": OBJECT_META });
                    self.walk(v, &meta, path, false, depth + 1)
                }
                _ => {
                    rest.insert(key.clone(), v.clone());
                }
            }
            self.keys.pop();
            path.truncate(len);
        }
        self.walk(&Value::Object(rest), schema, path, true, depth);
    }

    fn walk(&mut self, value: &Value, schema: &Value, path: &mut String, crd: bool, depth: usize) {
        // `null` reads as "not set" wherever it is written.
        if value.is_null() || depth > MAX_DEPTH {
            return;
        }
        let Some(schema) = self.resolve(schema) else {
            return;
        };
        if let Some(want) = wrong_type(value, schema) {
            let found = describe(value);
            self.report(
                path,
                format!("wrong type: {found}, the schema wants {want}"),
            );
            return;
        }
        match value {
            Value::Object(map) => self.object(map, schema, path, crd, depth),
            Value::Array(items) => {
                let Some(item_schema) = schema.get("items") else {
                    return;
                };
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    self.walk(item, item_schema, path, crd, depth + 1);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }

    fn object(
        &mut self,
        map: &Map<String, Value>,
        schema: &Value,
        path: &mut String,
        crd: bool,
        depth: usize,
    ) {
        let preserve = schema
            .get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true);
        let embedded = crd
            && schema
                .get("x-kubernetes-embedded-resource")
                .and_then(Value::as_bool)
                == Some(true);
        if embedded && depth > 0 {
            // Walked again below without the flag: strip it by walking the
            // resource's parts here.
            let mut plain = schema.clone();
            if let Some(o) = plain.as_object_mut() {
                o.remove("x-kubernetes-embedded-resource");
            }
            return self.crd_resource(&Value::Object(map.clone()), &plain, path, depth);
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties");
        // Built-in kinds: an object declaring no fields at all is free-form
        // (RawExtension, FieldsV1). A CRD prunes what it does not declare.
        let free = preserve
            || additional == Some(&Value::Bool(true))
            || (!crd && properties.is_none() && additional.is_none());
        for (key, v) in map {
            let len = path.len();
            push_key(path, key);
            self.keys.push(key.clone());
            match properties.and_then(|p| p.get(key)) {
                Some(field_schema) => self.walk(v, field_schema, path, crd, depth + 1),
                None => match additional {
                    Some(extra @ Value::Object(_)) => self.walk(v, extra, path, crd, depth + 1),
                    _ if free => {}
                    _ => {
                        let hint = properties
                            .and_then(|p| closest(key, p.keys().map(String::as_str)))
                            .map(|k| format!(" (did you mean {k}?)"))
                            .unwrap_or_default();
                        self.report(path, format!("unknown field{hint}"));
                    }
                },
            }
            self.keys.pop();
            path.truncate(len);
        }
    }
}

/// What `schema` wants instead, when `value` is not of its type.
fn wrong_type(value: &Value, schema: &Value) -> Option<String> {
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
        || schema.get("format").and_then(Value::as_str) == Some("int-or-string");
    if int_or_string {
        return (!(is_integer(value) || value.is_string()))
            .then(|| "an integer or a string".into());
    }
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        return (!fits(value, want)).then(|| article(want));
    }
    // Untyped, with alternatives (Quantity: a string or a number): any fits.
    let alternatives: Vec<&str> = ["oneOf", "anyOf"]
        .iter()
        .filter_map(|k| schema.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(|alt| alt.get("type").and_then(Value::as_str))
        .collect();
    if alternatives.is_empty() || alternatives.iter().any(|t| fits(value, t)) {
        return None;
    }
    let wants: Vec<String> = alternatives.iter().map(|t| article(t)).collect();
    Some(wants.join(" or "))
}

fn is_integer(value: &Value) -> bool {
    value.is_i64() || value.is_u64()
}

fn fits(value: &Value, want: &str) -> bool {
    match want {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => is_integer(value),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    }
}

fn article(t: &str) -> String {
    match t {
        "object" | "array" | "integer" => format!("an {t}"),
        _ => format!("a {t}"),
    }
}

/// The value's JSON type, with the value when it is short.
fn describe(value: &Value) -> String {
    let t = match value {
        Value::Object(_) => "an object",
        Value::Array(_) => "a list",
        Value::String(_) => "a string",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    };
    match value {
        Value::String(_) | Value::Number(_) | Value::Bool(_) => {
            let shown = value.to_string();
            if shown.chars().count() <= 40 {
                format!("{t} ({shown})")
            } else {
                t.to_owned()
            }
        }
        _ => t.to_owned(),
    }
}

/// The declared field `key` most likely meant: the same letters in another
/// case, else the nearest by edit distance (at most 2, and less than half
/// the key).
pub fn closest<'k>(key: &str, known: impl Iterator<Item = &'k str>) -> Option<&'k str> {
    let mut best: Option<(usize, &str)> = None;
    for candidate in known {
        let d = if candidate.eq_ignore_ascii_case(key) {
            0
        } else {
            edit_distance(key, candidate)
        };
        if best.is_none_or(|(b, _)| d < b) {
            best = Some((d, candidate));
        }
    }
    best.filter(|&(d, _)| d <= 2 && d * 2 < key.chars().count().max(2))
        .map(|(_, k)| k)
}

/// Levenshtein distance, with a swap of two neighbours counting one
/// (`contianers` is one step from `containers`).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}
