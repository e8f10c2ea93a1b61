//! The parent as a pass sees it: whether a rule covers it, its identity
//! ([`ParentInfo`]), whether its namespace fits its kind's scope, its
//! effective spec (`defaults` merged under `.spec`, checked against
//! `schema`), and the object templates read as `parent`.
//!
//! Nothing here renders children or writes status: a refusal is returned
//! for `plan` to turn into the pass's errors.

use serde_json::{Map, Value, json};

use super::observed::metadata_without_noise;
use super::{Input, PLACEHOLDER_UID, selector_matches};
use crate::rules::CompiledRule;
use crate::rules::model::Scope;

/// Whether `parent` falls under the rule's `namespaces` and `selector`.
pub fn parent_matches(rule: &CompiledRule, parent: &Value) -> bool {
    why_not_selected(rule, parent).is_none()
}

/// Why the rule does not select `parent` (its namespace outside the rule's
/// `namespaces`, or its labels outside `selector`); `None` when it does.
pub fn why_not_selected(rule: &CompiledRule, parent: &Value) -> Option<String> {
    let spec = &rule.rule.spec.parent;
    let namespace = parent
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    if !spec.namespaces.is_empty()
        && !namespace.is_some_and(|ns| spec.namespaces.iter().any(|n| n == ns))
    {
        return Some(format!(
            "its namespace {} is not among the rule's namespaces ({})",
            namespace.unwrap_or("(none)"),
            spec.namespaces.join(", ")
        ));
    }
    let selector = spec.selector.as_ref()?;
    let labels = parent
        .pointer("/metadata/labels")
        .and_then(Value::as_object);
    if selector_matches(selector, labels) {
        return None;
    }
    Some(format!(
        "its labels ({}) do not match the rule's parent.selector ({})",
        labels
            .map(|l| {
                l.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| "none".to_owned()),
        selector.query()
    ))
}

/// Deep-merges `over` onto `base`: objects merge key by key, anything else replaces.
pub fn deep_merge(base: &Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            let mut out = b.clone();
            for (k, v) in o {
                let merged = match out.get(k) {
                    Some(existing) => deep_merge(existing, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, over) => over.clone(),
    }
}

/// Where a schema error points, written the way a user reads it:
/// `spec.hosts[0]`, `spec.labels["app.kubernetes.io/name"]`.
fn spec_path(spec: &Value, at: &jsonschema::paths::Location) -> String {
    let mut out = String::from("spec");
    let mut here = Some(spec);
    for segment in at.iter() {
        let key = match segment {
            jsonschema::paths::LocationSegment::Index(i) => {
                if let Some(Value::Array(items)) = here {
                    out.push_str(&format!("[{i}]"));
                    here = items.get(i);
                    continue;
                }
                i.to_string()
            }
            jsonschema::paths::LocationSegment::Property(p) => p.into_owned(),
        };
        crate::field_path::push_key(&mut out, &key);
        here = here.and_then(|v| v.get(&key));
    }
    out
}

/// `namespace/name`, or `name` for a parent without a namespace.
pub(super) fn parent_name(info: &ParentInfo) -> String {
    match &info.namespace {
        Some(ns) => format!("{ns}/{}", info.name),
        None => info.name.clone(),
    }
}

/// What the pass reads of the parent's identity.
pub(super) struct ParentInfo {
    pub(super) name: String,
    pub(super) namespace: Option<String>,
    pub(super) uid: String,
    pub(super) generation: Option<i64>,
    pub(super) api_version: String,
    pub(super) kind: String,
}

impl ParentInfo {
    pub(super) fn of(parent: &Value) -> ParentInfo {
        let s = |p: &str| parent.pointer(p).and_then(Value::as_str).map(str::to_owned);
        ParentInfo {
            name: s("/metadata/name").unwrap_or_default(),
            namespace: s("/metadata/namespace"),
            uid: s("/metadata/uid").unwrap_or_else(|| PLACEHOLDER_UID.to_owned()),
            generation: parent
                .pointer("/metadata/generation")
                .and_then(Value::as_i64),
            api_version: s("/apiVersion").unwrap_or_default(),
            kind: s("/kind").unwrap_or_default(),
        }
    }
}

/// Why the parent's namespace does not fit its kind's scope (asked of the
/// caller, never guessed from the object): children's namespaces and owner
/// references follow from it. The whole message, naming the parent.
pub(super) fn scope_error(rule: &CompiledRule, info: &ParentInfo, input: &Input) -> Option<String> {
    let kind = &rule.parent.kind;
    let message = match ((input.scope_of)(&rule.parent), &info.namespace) {
        (Scope::Namespaced, None) => format!(
            "the parent has no metadata.namespace ({kind} is namespaced; if it is not, \
             set spec.parent.scope: Cluster in the rule)"
        ),
        (Scope::Cluster, Some(_)) => {
            "cluster-scoped parent must not have metadata.namespace".to_owned()
        }
        _ => return None,
    };
    Some(format!("{kind} {}: {message}", parent_name(info)))
}

/// The parent's `.spec` with the rule's `defaults` merged under it, or what
/// the rule's `schema` finds wrong with it, each naming its field.
pub(super) fn effective_spec(rule: &CompiledRule, parent: &Value) -> Result<Value, Vec<String>> {
    let spec = match (&rule.rule.spec.defaults, parent.get("spec")) {
        (Some(d), Some(s)) => deep_merge(d, s),
        (Some(d), None) => d.clone(),
        (None, Some(s)) => s.clone(),
        (None, None) => json!({}),
    };
    if let Some(schema) = &rule.schema {
        let problems: Vec<String> = schema
            .iter_errors(&spec)
            .map(|e| format!("{}: {e}", spec_path(&spec, e.instance_path())))
            .collect();
        if !problems.is_empty() {
            return Err(problems);
        }
    }
    Ok(spec)
}

/// The parent as templates see it: its effective `spec` in place of its
/// own, without noise. Built field by field so the old spec and the managed
/// fields are never copied.
pub(super) fn with_spec(parent: &Value, spec: Value) -> Value {
    let mut spec = Some(spec);
    let mut out: Map<String, Value> = parent
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let v = match k.as_str() {
                "spec" => spec.take().unwrap_or_default(),
                "metadata" => metadata_without_noise(v),
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    if let Some(spec) = spec {
        out.insert("spec".to_owned(), spec);
    }
    Value::Object(out)
}

/// The context every template of a pass starts from: `parent`, `spec`,
/// `metadata` and `rule`. Converted once: `spec` and `metadata` are the
/// parent's own values (shared, not copies), which halves the conversion
/// cost of a pass.
pub fn parent_context(rule: &CompiledRule, parent: &Value) -> minijinja::Value {
    let parent_value = crate::render::to_value(parent);
    let field = |name: &str| {
        parent_value
            .get_attr(name)
            .ok()
            .filter(|v| !v.is_undefined())
            .unwrap_or_else(|| minijinja::Value::from(()))
    };
    minijinja::context! {
        spec => field("spec"),
        metadata => field("metadata"),
        parent => parent_value,
        rule => minijinja::context! { name => rule.name.clone() },
    }
}
