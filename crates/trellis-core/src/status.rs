//! Readiness of observed children, status fields (JSONPath or expression),
//! and conditions with honest transition times.
//!
//! Pure functions over JSON values; `plan` decides when to call them.

use serde_json::{Map, Value, json};

use crate::json_path::{is_singular, query_value};

use crate::rules::{CompiledField, FieldSource};

/// Condition types whose status decides default readiness.
const READINESS_CONDITIONS: &[&str] = &["Available", "Ready", "Complete"];

/// Default readiness when a child has no `readyWhen`: it exists, its
/// controller has seen its latest generation, and its well-known conditions
/// are True. `Err` says why not.
pub fn default_ready(obj: &Value) -> Result<(), String> {
    let generation = obj.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = obj
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if let (Some(generation), Some(observed)) = (generation, observed)
        && observed < generation
    {
        return Err(format!(
            "status.observedGeneration {observed} is behind metadata.generation {generation}"
        ));
    }
    let conditions = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for c in conditions {
        let type_ = c.get("type").and_then(Value::as_str).unwrap_or_default();
        if READINESS_CONDITIONS.contains(&type_) {
            let status = c.get("status").and_then(Value::as_str).unwrap_or("Unknown");
            if status != "True" {
                let message = c.get("message").and_then(Value::as_str).unwrap_or_default();
                return Err(format!("condition {type_} is {status}: {message}")
                    .trim_end_matches([':', ' '])
                    .to_owned());
            }
        }
    }
    Ok(())
}

/// Evaluates a JSONPath field on an observed child (a list of objects for
/// `forEach` children). A singular query (RFC 9535: only name and index
/// segments, one selector each) yields its one value or `None`; any other
/// query (wildcards, slices, filters, descendants, several selectors)
/// always yields a list, empty when nothing matches, so a field's type never
/// depends on how many children happen to match.
pub fn json_path_value(field: &CompiledField, observed: &Value) -> Option<Value> {
    let FieldSource::JsonPath { query, .. } = &field.source else {
        return None;
    };
    query_value(query, observed)
}

/// [`json_path_value`] when the child is not observed at all (not created
/// yet, or excluded in this pass): nothing matches, so a singular query
/// yields `None` and any other `[]` — a field's type does not depend on
/// whether the child exists either.
pub fn json_path_unobserved(field: &CompiledField) -> Option<Value> {
    let FieldSource::JsonPath { query, .. } = &field.source else {
        return None;
    };
    (!is_singular(query)).then(|| Value::Array(Vec::new()))
}

/// Sets `value` at `path` under `root`, creating objects on the way.
pub fn set_path(root: &mut Map<String, Value>, path: &[String], value: Value) {
    let Some((last, init)) = path.split_last() else {
        return;
    };
    let mut current = root;
    for seg in init {
        let entry = current
            .entry(seg.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        let Value::Object(next) = entry else {
            return;
        };
        current = next;
    }
    current.insert(last.clone(), value);
}

/// Longest condition message (metav1.Condition allows 32768 bytes).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A condition as trellis decides it, before transition times are settled.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Condition {
    pub fn new(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

/// Builds the `conditions` list: ours in order, each keeping the previous
/// `lastTransitionTime` when its status did not change; conditions of types
/// trellis does not own are kept as they are.
pub fn merge_conditions(
    previous: Option<&Value>,
    ours: &[Condition],
    generation: Option<i64>,
    now: &str,
) -> Value {
    let previous: &[Value] = previous
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let find = |t: &str| {
        previous
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(t))
    };
    let mut out: Vec<Value> = Vec::with_capacity(ours.len() + previous.len());
    for c in ours {
        let status = if c.status { "True" } else { "False" };
        let since = find(&c.type_)
            .filter(|p| p.get("status").and_then(Value::as_str) == Some(status))
            .and_then(|p| p.get("lastTransitionTime"))
            .and_then(Value::as_str)
            .unwrap_or(now);
        let mut cond = json!({
            "type": c.type_,
            "status": status,
            "reason": c.reason,
            "message": truncate(&c.message, MAX_MESSAGE_BYTES),
            "lastTransitionTime": since,
        });
        if let Some(g) = generation {
            cond["observedGeneration"] = json!(g);
        }
        out.push(cond);
    }
    for p in previous {
        let t = p.get("type").and_then(Value::as_str).unwrap_or_default();
        if !ours.iter().any(|c| c.type_ == t) {
            out.push(p.clone());
        }
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_without_status_is_ready_by_default() {
        assert!(default_ready(&json!({"metadata": {"name": "x"}})).is_ok());
    }

    #[test]
    fn lagging_observed_generation_is_not_ready() {
        let obj = json!({"metadata": {"generation": 3}, "status": {"observedGeneration": 2}});
        let err = default_ready(&obj).unwrap_err();
        assert!(err.contains("behind"), "{err}");
    }

    #[test]
    fn false_well_known_condition_is_not_ready() {
        let obj = json!({"status": {"conditions": [
            {"type": "Progressing", "status": "False"},
            {"type": "Available", "status": "False", "message": "0/2 up"}
        ]}});
        assert_eq!(
            default_ready(&obj).unwrap_err(),
            "condition Available is False: 0/2 up"
        );
        let ok = json!({"status": {"conditions": [{"type": "Available", "status": "True"}]}});
        assert!(default_ready(&ok).is_ok());
    }

    #[test]
    fn keeps_transition_time_while_status_unchanged() {
        let prev = json!([
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Synced", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Foreign", "status": "True"}
        ]);
        let ours = [
            Condition::new("Ready", true, "AllChildrenReady", ""),
            Condition::new("Synced", false, "RenderError", "boom"),
        ];
        let out = merge_conditions(Some(&prev), &ours, Some(4), "2026-11-29T00:00:00Z");
        assert_eq!(out[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(out[1]["lastTransitionTime"], "2026-11-29T00:00:00Z");
        assert_eq!(out[1]["observedGeneration"], 4);
        assert_eq!(out[2]["type"], "Foreign", "foreign conditions are kept");
    }

    #[test]
    fn long_messages_are_cut_to_the_condition_limit() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let out = merge_conditions(
            None,
            &[Condition::new("Ready", false, "X", long)],
            None,
            "t",
        );
        let message = out[0]["message"].as_str().unwrap();
        assert!(message.len() <= MAX_MESSAGE_BYTES);
        assert!(message.ends_with('…'));
        assert_eq!(truncate("short", 10), "short");
    }

    fn query(text: &str, on: Value) -> Option<Value> {
        let parsed = jsonpath_rust::parser::parse_json_path(text).unwrap();
        query_value(&parsed, &on)
    }

    #[test]
    fn a_singular_json_path_yields_a_value_or_nothing() {
        let obj = json!({"status": {"ready": 2, "list": [1, 2]}});
        assert_eq!(query("$.status.ready", obj.clone()), Some(json!(2)));
        assert_eq!(query("$['status']['list'][0]", obj.clone()), Some(json!(1)));
        assert_eq!(query("$.status.list", obj.clone()), Some(json!([1, 2])));
        assert_eq!(query("$.status.missing", obj), None);
    }

    #[test]
    fn any_other_json_path_always_yields_a_list() {
        let obj = json!({"items": [{"n": "a"}, {"n": "b", "x": 1}]});
        // One match is a one-element list, none an empty one.
        assert_eq!(query("$.items[?@.x].n", obj.clone()), Some(json!(["b"])));
        assert_eq!(query("$.items[?@.y].n", obj.clone()), Some(json!([])));
        assert_eq!(query("$.items[*].n", obj.clone()), Some(json!(["a", "b"])));
        assert_eq!(query("$.items[0:1].n", obj.clone()), Some(json!(["a"])));
        assert_eq!(query("$..x", obj.clone()), Some(json!([1])));
        assert_eq!(query("$.items[0,1].n", obj), Some(json!(["a", "b"])));
    }

    #[test]
    fn an_unobserved_child_yields_nothing_or_an_empty_list() {
        let field = |text: &str| CompiledField {
            path: vec!["x".into()],
            source: FieldSource::JsonPath {
                child: "c".into(),
                query: jsonpath_rust::parser::parse_json_path(text).unwrap(),
                text: text.into(),
            },
            default: Some(json!(0)),
            reads_vars: Default::default(),
        };
        for singular in ["$", "$.status.ready", "$.items[0]"] {
            assert_eq!(json_path_unobserved(&field(singular)), None, "{singular}");
        }
        for other in ["$.items[*]", "$..x", "$.items[?@.x]", "$.items[0:1]"] {
            assert_eq!(
                json_path_unobserved(&field(other)),
                Some(json!([])),
                "{other}"
            );
        }
    }

    #[test]
    fn sets_nested_paths() {
        let mut root = Map::new();
        set_path(&mut root, &["a".into(), "b".into()], json!(1));
        set_path(&mut root, &["a".into(), "c".into()], json!(2));
        assert_eq!(Value::Object(root), json!({"a": {"b": 1, "c": 2}}));
    }
}
