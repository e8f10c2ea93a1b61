//! A sample parent for a rule: the object `check` renders every child with.
//!
//! Its spec fills every field the rule's `schema` declares, so that as many
//! template branches as one parent can reach are reached: a field's value
//! from `defaults` (or the schema's `default`/`enum`/`const`/`examples`)
//! when there is one, else 2 (moved into the schema's bounds) for a number
//! and the field's own name for a string (a DNS label, so it makes valid
//! names); but `true` for every boolean and at least one item in every
//! list, whatever `defaults` says (`expose: false` and `hosts: []` would
//! leave an `includeWhen`/`forEach` child unseen). When the rule's schema refuses that (a pattern, a bound, a
//! `oneOf`), the sample falls back to `defaults` and the required fields
//! alone. A built-in parent kind (a rule decorating Deployments) has no
//! `schema`: its sample spec is filled the same way from the kind's own
//! schema in the bundle. For a rule with a `schema`, a second sample
//! empties every list the schema lets be empty, since one item in every
//! list never shows what a template does with none.

use serde_json::{Map, Value, json};

use crate::plan::{PLACEHOLDER_UID, deep_merge};
use crate::rules::CompiledRule;
use crate::rules::model::Scope;

/// Deepest schema nesting sampled (schemas can refer to themselves
/// through `$defs`, which a sample does not follow anyway).
const MAX_DEPTH: usize = 16;

/// How much of a schema a sample fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Every declared field; one item in every list.
    Rich,
    /// The required fields alone.
    Lean,
    /// As `Rich`, but every list empty (`[]`) where the schema allows one
    /// (no `minItems` above 0), whatever `defaults` says.
    EmptyLists,
}

impl Fill {
    fn rich(self) -> bool {
        self != Fill::Lean
    }
}

/// Sample parents to try in order: the rich one, then the lean one.
pub fn parents(rule: &CompiledRule, scope: Scope) -> Vec<Value> {
    let spec_rule = &rule.rule.spec;
    let defaults = spec_rule.defaults.clone().unwrap_or_else(|| json!({}));
    let parent = |spec: Value| sample_parent(rule, scope, spec);
    let none = Map::new();
    let Some(schema) = &spec_rule.schema else {
        // A built-in parent kind: its own schema, from the bundle.
        let defs = super::builtin::definitions();
        let spec = super::builtin::schema_of(&rule.parent)
            .and_then(|root| resolve(&root, defs).pointer("/properties/spec").cloned());
        return match spec {
            Some(spec) if rule.parent.is_builtin() => {
                vec![
                    parent(sample(&spec, Some(&defaults), "spec", Fill::Rich, 0, defs)),
                    parent(defaults),
                ]
            }
            _ => vec![parent(defaults)],
        };
    };
    let rich = sample(schema, Some(&defaults), "spec", Fill::Rich, 0, &none);
    let lean = deep_merge(
        &sample(schema, None, "spec", Fill::Lean, 0, &none),
        &defaults,
    );
    vec![parent(rich), parent(lean)]
}

/// The rich sample parent with every list in its spec empty, where the
/// rule's `schema` allows that: what a template that only ever saw one
/// item (a loop, `| first`, `[0]`) does with none. `None` for a rule
/// without a `schema` (a built-in parent kind's lists, such as a Pod's
/// containers, are seldom empty, though their schemas allow it).
pub fn with_empty_lists(rule: &CompiledRule, scope: Scope) -> Option<Value> {
    let schema = rule.rule.spec.schema.as_ref()?;
    let defaults = rule.rule.spec.defaults.clone().unwrap_or_else(|| json!({}));
    let none = Map::new();
    let spec = sample(schema, Some(&defaults), "spec", Fill::EmptyLists, 0, &none);
    Some(sample_parent(rule, scope, spec))
}

/// A parent of the rule's kind with `spec`, named `sample`, selected by
/// the rule's selector.
fn sample_parent(rule: &CompiledRule, scope: Scope, spec: Value) -> Value {
    let spec_rule = &rule.rule.spec;
    let mut metadata = json!({
        "name": "sample",
        "uid": PLACEHOLDER_UID,
        "generation": 1,
    });
    if scope == Scope::Namespaced {
        let ns = spec_rule
            .parent
            .namespaces
            .first()
            .cloned()
            .unwrap_or_else(|| "default".into());
        metadata["namespace"] = json!(ns);
    }
    // The parent the rule's selector selects.
    if let Some(selector) = &spec_rule.parent.selector
        && !selector.match_labels.is_empty()
    {
        metadata["labels"] = json!(selector.match_labels);
    }
    json!({
        "apiVersion": rule.parent.api_version(),
        "kind": rule.parent.kind,
        "metadata": metadata,
        "spec": spec,
    })
}

/// Follows `$ref`s into `defs` (the bundle's bare definition names).
fn resolve<'s>(mut schema: &'s Value, defs: &'s Map<String, Value>) -> &'s Value {
    for _ in 0..8 {
        let Some(name) = schema.get("$ref").and_then(Value::as_str) else {
            break;
        };
        match defs.get(name.rsplit('/').next().unwrap_or(name)) {
            Some(target) => schema = target,
            None => break,
        }
    }
    schema
}

/// A value for `schema`; `given` is what `defaults` says there; `fill`
/// how much to fill.
fn sample(
    schema: &Value,
    given: Option<&Value>,
    name: &str,
    fill: Fill,
    depth: usize,
    defs: &Map<String, Value>,
) -> Value {
    let rich = fill.rich();
    let schema = resolve(schema, defs);
    let declared = |key: &str| schema.get(key).filter(|v| !v.is_null());
    let typ = schema.get("type").and_then(Value::as_str).or_else(|| {
        // `type: [string, "null"]`: the first that is not null.
        schema
            .get("type")
            .and_then(Value::as_array)
            .and_then(|ts| ts.iter().filter_map(Value::as_str).find(|t| *t != "null"))
    });
    let is_object = typ == Some("object") || (typ.is_none() && schema.get("properties").is_some());
    if is_object && depth < MAX_DEPTH {
        let mut out = match given {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        // A map (`labels`, `matchLabels`): one entry, when nothing is given.
        if let Some(extra @ Value::Object(_)) = schema.get("additionalProperties")
            && rich
            && out.is_empty()
        {
            let value = sample(extra, None, name, fill, depth + 1, defs);
            out.insert(string_for(name, &json!({})), value);
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (key, prop) in props {
                if !rich && !required.contains(&key.as_str()) {
                    continue;
                }
                let value = sample(prop, out.get(key), key, fill, depth + 1, defs);
                out.insert(key.clone(), value);
            }
        }
        return Value::Object(out);
    }
    if typ == Some("array") {
        let items = schema.get("items").cloned().unwrap_or(json!({}));
        let min_items = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        return match given {
            _ if fill == Fill::EmptyLists && min_items == 0 => json!([]),
            Some(Value::Array(list)) if !list.is_empty() || !rich => Value::Array(list.clone()),
            _ if rich => json!([sample(&items, None, name, fill, depth + 1, defs)]),
            _ => json!([]),
        };
    }
    // `expose: false` in `defaults` would hide what `expose` turns on.
    if rich && typ == Some("boolean") {
        return json!(true);
    }
    if let Some(v) = given {
        return v.clone();
    }
    if let Some(v) = declared("default").or_else(|| declared("const")) {
        return v.clone();
    }
    for key in ["enum", "examples"] {
        if let Some(first) = schema
            .get(key)
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            return first.clone();
        }
    }
    // 2 (more than one reaches `> 1` branches: a PodDisruptionBudget for
    // several replicas), moved into `minimum`..`maximum` when they exclude it.
    let bound = |key: &str, exclusive: &str, step: f64| {
        schema.get(key).and_then(Value::as_f64).or_else(|| {
            schema
                .get(exclusive)
                .and_then(Value::as_f64)
                .map(|m| m + step)
        })
    };
    let mut n = 2.0_f64;
    if let Some(min) = bound("minimum", "exclusiveMinimum", 1.0) {
        n = n.max(min);
    }
    if let Some(max) = bound("maximum", "exclusiveMaximum", -1.0) {
        n = n.min(max);
    }
    match typ {
        Some("boolean") => json!(true),
        // An integer schema's bounds are integers.
        Some("integer") => json!(n.ceil() as i64),
        Some("number") => json!(n),
        _ => json!(string_for(name, schema)),
    }
}

/// A string sample: the field's name made a DNS label, padded to
/// `minLength` and cut to `maxLength`.
fn string_for(name: &str, schema: &Value) -> String {
    let mut s: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if s.is_empty() || !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        s.insert_str(0, "sample");
    }
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    while (s.len() as u64) < min {
        s.push('x');
    }
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
        s.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    }
    s
}
