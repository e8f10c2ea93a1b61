//! `propagate:`: the parent's labels and annotations that the rule names
//! (exact keys, or prefixes ending in `*`) copied onto a child's metadata.
//! The template's own keys win, and so do trellis's (its labels are set
//! after, and keys under `trellis.dev/` are never copied). A key removed
//! from the parent is simply no longer sent, and server-side apply removes
//! it from the child, where trellis's field manager was its only owner.

use serde_json::{Map, Value};

use crate::labels::{LABEL_MANAGED_BY, TRELLIS_PREFIX};
use crate::rules::model::Propagate;

/// Most keys copied onto one child (labels and annotations together).
pub const MAX_PROPAGATED_KEYS: usize = 128;
/// Most bytes (keys and values) copied onto one child.
pub const MAX_PROPAGATED_BYTES: usize = 64 * 1024;

/// Whether `key` matches `pattern` (exact, or a prefix ending in `*`).
fn matches(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => pattern == key,
    }
}

/// Copies the keys `propagate` names from `parent`'s metadata into
/// `meta` (a rendered child's metadata) where the template did not set
/// them; `Err` when the parent would grow the child past the limits.
pub(super) fn propagate(
    propagate: &Propagate,
    parent: &Value,
    meta: &mut Map<String, Value>,
) -> Result<(), String> {
    let mut count = 0;
    let mut bytes = 0;
    for (field, patterns) in [
        ("labels", &propagate.labels),
        ("annotations", &propagate.annotations),
    ] {
        let Some(source) = parent
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
        else {
            continue;
        };
        let copied: Vec<(&String, &Value)> = source
            .iter()
            .filter(|(k, v)| {
                v.is_string()
                    && !k.starts_with(TRELLIS_PREFIX)
                    && k.as_str() != LABEL_MANAGED_BY
                    && patterns.iter().any(|p| matches(p, k))
            })
            .collect();
        if copied.is_empty() {
            continue;
        }
        let target = meta
            .entry(field)
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(target) = target else {
            return Err(format!("metadata.{field} must be a mapping"));
        };
        for (key, value) in copied {
            if target.contains_key(key) {
                continue;
            }
            count += 1;
            bytes += key.len() + value.as_str().map_or(0, str::len);
            target.insert(key.clone(), value.clone());
        }
    }
    if count > MAX_PROPAGATED_KEYS || bytes > MAX_PROPAGATED_BYTES {
        return Err(format!(
            "propagate copies {count} keys ({bytes} bytes) from the parent, more than the \
             limit of {MAX_PROPAGATED_KEYS} keys or {MAX_PROPAGATED_BYTES} bytes; name fewer keys in spec.propagate"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(labels: &[&str], annotations: &[&str]) -> Propagate {
        Propagate {
            labels: labels.iter().map(|s| s.to_string()).collect(),
            annotations: annotations.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn copies_exact_keys_and_prefixes_and_the_template_wins() {
        let parent = json!({"metadata": {
            "labels": {"team": "a", "example.com/cost": "7", "example.com/tier": "gold", "other": "x"},
            "annotations": {"note": "hi", "skip": "me"}
        }});
        let mut meta = json!({"name": "c", "labels": {"team": "template"}})
            .as_object()
            .cloned()
            .unwrap();
        propagate(
            &spec(&["team", "example.com/*"], &["note"]),
            &parent,
            &mut meta,
        )
        .unwrap();
        assert_eq!(
            Value::Object(meta),
            json!({"name": "c",
                "labels": {"team": "template", "example.com/cost": "7", "example.com/tier": "gold"},
                "annotations": {"note": "hi"}})
        );
    }

    #[test]
    fn never_copies_keys_trellis_writes() {
        let parent = json!({"metadata": {"labels": {
            "trellis.dev/deletion-policy": "retain",
            "trellis.dev/bucket": "3",
            "app.kubernetes.io/managed-by": "helm",
            "app.kubernetes.io/part-of": "shop"
        }}});
        let mut meta = Map::new();
        propagate(&spec(&["*"], &[]), &parent, &mut meta).unwrap();
        assert_eq!(
            Value::Object(meta),
            json!({"labels": {"app.kubernetes.io/part-of": "shop"}})
        );
    }

    #[test]
    fn a_key_gone_from_the_parent_is_not_sent() {
        let mut meta = Map::new();
        propagate(&spec(&["team"], &[]), &json!({"metadata": {}}), &mut meta).unwrap();
        assert!(
            meta.is_empty(),
            "no labels map is made for nothing: {meta:?}"
        );
    }

    #[test]
    fn a_parent_cannot_grow_a_child_past_the_limits() {
        let many: Map<String, Value> = (0..=MAX_PROPAGATED_KEYS)
            .map(|i| (format!("k{i}"), json!("v")))
            .collect();
        let parent = json!({"metadata": {"labels": many}});
        let err = propagate(&spec(&["k*"], &[]), &parent, &mut Map::new()).unwrap_err();
        assert!(err.contains("129 keys"), "{err}");
        let big = json!({"metadata": {"annotations": {"doc": "x".repeat(MAX_PROPAGATED_BYTES)}}});
        let err = propagate(&spec(&[], &["doc"]), &big, &mut Map::new()).unwrap_err();
        assert!(err.contains("bytes"), "{err}");
    }
}
