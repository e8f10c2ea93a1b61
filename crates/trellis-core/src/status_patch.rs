//! The status a pass writes on its parent, as data: the failure marking of
//! a pass whose applies failed, whether anything changed, the fields no
//! longer produced (removed with `null`), the generation claimed without a
//! status subresource, and the leaves the API server may drop. The shell
//! (`operator::pass::status_write`) sends it; `trellis diff` dry-runs it.

use std::collections::BTreeSet;

use serde_json::{Value, json};

/// Turns `Synced` into `False/<reason>` (`ApplyError`, `PatchConflict`; and `Ready` too when it claimed
/// True), keeping the previous transition time when it was already False so
/// that a persistent failure does not rewrite the status on every retry.
pub fn mark_apply_error(
    status: &mut Value,
    reason: &str,
    message: &str,
    parent: &Value,
    now: &str,
) {
    let previous = parent
        .pointer("/status/conditions")
        .and_then(Value::as_array);
    let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) else {
        return;
    };
    for c in conditions.iter_mut() {
        let t = c
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if t == "Synced" || (t == "Ready" && c["status"] == "True") {
            let since = previous
                .and_then(|p| p.iter().find(|x| x["type"] == t.as_str()))
                .filter(|x| x["status"] == "False")
                .and_then(|x| x.get("lastTransitionTime"))
                .and_then(Value::as_str)
                .unwrap_or(now)
                .to_owned();
            c["status"] = json!("False");
            c["reason"] = json!(reason);
            c["message"] = json!(message);
            c["lastTransitionTime"] = json!(since);
        }
    }
}

/// True when every field of `new` already has that value in `current`.
pub fn status_unchanged(current: Option<&Value>, new: &Value) -> bool {
    let (Some(Value::Object(cur)), Value::Object(new)) = (current, new) else {
        return false;
    };
    new.iter().all(|(k, v)| cur.get(k) == Some(v))
}

/// Paths (as key segments) of every leaf in a status object, conditions excluded.
pub fn leaf_paths(value: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                if prefix.is_empty() && k == "conditions" {
                    continue;
                }
                prefix.push(k.clone());
                leaf_paths(v, prefix, out);
                prefix.pop();
            }
        }
        _ => out.push(prefix.clone()),
    }
}

/// JSON Pointer of a key path (keys may contain `.` or `/`, as quota keys do).
pub fn pointer(path: &[String]) -> String {
    path.iter()
        .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// Status fields of the rule that this pass no longer produces (their child
/// was pruned, say): removed with `null` in the merge patch, which would
/// otherwise keep them forever. Only after a clean pass: a failed one keeps
/// the last good values. Each entry is the highest key that can go without
/// taking anything else along.
pub fn stale_fields<'a>(
    paths: impl IntoIterator<Item = &'a [String]>,
    current: Option<&Value>,
    new: &Value,
) -> Vec<Vec<String>> {
    let Some(current) = current else {
        return Vec::new();
    };
    let synced = new
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Synced"));
    let clean =
        synced.is_some_and(|c| c["status"] == "True" || c["reason"] == "DependencyNotReady");
    if !clean {
        return Vec::new();
    }
    let mut out: Vec<Vec<String>> = Vec::new();
    for path in paths {
        if current.pointer(&pointer(path)).is_none() || new.pointer(&pointer(path)).is_some() {
            continue;
        }
        let mut top = path.len();
        while top > 1 {
            let up = &path[..top - 1];
            let lone = current
                .pointer(&pointer(up))
                .and_then(Value::as_object)
                .is_some_and(|m| m.len() == 1);
            if !lone || new.pointer(&pointer(up)).is_some() {
                break;
            }
            top -= 1;
        }
        let stale = path[..top].to_vec();
        if !out.contains(&stale) {
            out.push(stale);
        }
    }
    out
}

/// Sets `path` to `null` in `value`, creating the objects on the way.
fn set_null(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut here = value;
    for key in parents {
        if !here.get(key).is_some_and(Value::is_object) {
            here[key.as_str()] = json!({});
        }
        here = &mut here[key.as_str()];
    }
    here[last.as_str()] = Value::Null;
}

/// `status` without the leaves at the given dotted paths.
pub fn without_paths(status: &Value, dotted: &BTreeSet<String>) -> Value {
    let mut out = status.clone();
    for path in dotted {
        let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
        let Some((last, parents)) = segments.split_last() else {
            continue;
        };
        if let Some(map) = out
            .pointer_mut(&pointer(parents))
            .and_then(Value::as_object_mut)
        {
            map.remove(last);
        }
    }
    out
}

/// Without the `/status` subresource, a status write is a change outside
/// metadata and bumps `metadata.generation` by one. The status claims the
/// generation the write produces (the spec is the one observed), or each
/// write would leave `observedGeneration` behind and cause the next.
fn claim_next_generation(status: &mut Value, generation: i64) {
    let (now, next) = (json!(generation), json!(generation + 1));
    if status.get("observedGeneration") == Some(&now) {
        status["observedGeneration"] = next.clone();
    }
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if c.get("observedGeneration") == Some(&now) {
                c["observedGeneration"] = next.clone();
            }
        }
    }
}

/// The merge patch a pass sends for the parent's status (shared with
/// `trellis diff`, which dry-runs it): the new status; `null` for each rule
/// field this pass no longer produces; and, for a parent kind without the
/// `/status` subresource (`claim_generation`: its generation), the
/// generation the write itself produces.
pub fn status_patch(
    rule: &crate::rules::CompiledRule,
    current: Option<&Value>,
    status: &Value,
    claim_generation: Option<i64>,
) -> Value {
    let owned = rule.status_paths();
    let stale = stale_fields(owned.iter().map(Vec::as_slice), current, status);
    let mut status = status.clone();
    if let Some(generation) = claim_generation {
        claim_next_generation(&mut status, generation);
    }
    let mut patch = json!({ "status": status });
    for path in &stale {
        set_null(&mut patch["status"], path);
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncation_count_no_longer_produced_is_removed_and_the_inventory_replaced() {
        let rule = crate::rules::testing::rule_with_spec(
            "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  children: []\n  status:\n    inventory: true\n",
        );
        let current = json!({"children": [{"id": "a"}, {"id": "b"}], "childrenTruncated": 3});
        let new = json!({"children": [{"id": "a"}], "conditions": [{"type": "Synced", "status": "True"}]});
        let patch = status_patch(&rule, Some(&current), &new, None);
        assert_eq!(
            patch,
            json!({"status": {"children": [{"id": "a"}], "childrenTruncated": null,
                "conditions": [{"type": "Synced", "status": "True"}]}})
        );
        // A rule without an inventory leaves those fields to others.
        let plain = crate::rules::testing::rule_with_spec(
            "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  children: []\n",
        );
        let patch = status_patch(&plain, Some(&current), &new, None);
        assert!(
            patch["status"].get("childrenTruncated").is_none(),
            "{patch}"
        );
    }

    #[test]
    fn a_field_no_longer_produced_is_stale_up_to_its_highest_lone_key() {
        let owned: Vec<Vec<String>> =
            vec![vec!["extra".into(), "name".into()], vec!["kept".into()]];
        let paths = || owned.iter().map(Vec::as_slice);
        let synced = json!([{"type": "Synced", "status": "True"}]);
        let current = json!({"extra": {"name": "a"}, "kept": "y"});
        let new = json!({"kept": "y", "conditions": synced});
        assert_eq!(
            stale_fields(paths(), Some(&current), &new),
            [vec!["extra".to_owned()]]
        );
        // A sibling key the rule does not own keeps the parent object.
        let current = json!({"extra": {"name": "a", "other": 1}, "kept": "y"});
        assert_eq!(
            stale_fields(paths(), Some(&current), &new),
            [vec!["extra".to_owned(), "name".to_owned()]]
        );
        // A failed pass keeps the last good values.
        let failed = json!({"kept": "y", "conditions": [{"type": "Synced", "status": "False", "reason": "RenderError"}]});
        assert!(stale_fields(paths(), Some(&current), &failed).is_empty());
    }

    #[test]
    fn without_the_status_subresource_the_status_claims_the_next_generation() {
        let mut status = json!({"observedGeneration": 4, "conditions": [
            {"type": "Ready", "observedGeneration": 4},
            {"type": "Foreign", "observedGeneration": 2}
        ]});
        claim_next_generation(&mut status, 4);
        assert_eq!(status["observedGeneration"], 5);
        assert_eq!(status["conditions"][0]["observedGeneration"], 5);
        assert_eq!(status["conditions"][1]["observedGeneration"], 2);
    }

    #[test]
    fn nulls_a_path_and_leaves_out_dotted_paths() {
        let mut patch = json!({"a": 1});
        set_null(&mut patch, &["x".to_owned(), "y".to_owned()]);
        assert_eq!(patch, json!({"a": 1, "x": {"y": null}}));
        let dropped: BTreeSet<String> = ["x.y".to_owned()].into();
        assert_eq!(
            without_paths(&json!({"x": {"y": 1, "z": 2}}), &dropped),
            json!({"x": {"z": 2}})
        );
    }

    #[test]
    fn status_is_unchanged_when_every_field_matches() {
        let cur = json!({"a": 1, "b": {"c": 2}, "foreign": true});
        assert!(status_unchanged(
            Some(&cur),
            &json!({"a": 1, "b": {"c": 2}})
        ));
        assert!(!status_unchanged(Some(&cur), &json!({"a": 2})));
        assert!(!status_unchanged(None, &json!({"a": 1})));
    }

    #[test]
    fn lists_leaf_paths_without_conditions() {
        let mut out = Vec::new();
        let status = json!({"a": {"b": 1, "limits.cpu": [1]}, "conditions": [], "d": "x"});
        leaf_paths(&status, &mut Vec::new(), &mut out);
        let joined: Vec<String> = out.iter().map(|p| p.join("|")).collect();
        assert_eq!(joined, ["a|b", "a|limits.cpu", "d"]);
        assert_eq!(pointer(&out[1]), "/a/limits.cpu");
        assert!(
            status.pointer(&pointer(&out[1])).is_some(),
            "dotted keys resolve"
        );
    }

    #[test]
    fn apply_error_turns_synced_false_and_keeps_time_when_already_false() {
        let parent = json!({"status": {"conditions": [{"type": "Synced", "status": "False", "lastTransitionTime": "t0"}]}});
        // The plan saw Synced go True and stamped a fresh time; the failure keeps the old one.
        let mut status = json!({"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "t0"},
            {"type": "Synced", "status": "True", "lastTransitionTime": "t2"}
        ]});
        mark_apply_error(&mut status, "ApplyError", "boom", &parent, "t1");
        assert_eq!(status["conditions"][0]["status"], "False");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], "t1");
        assert_eq!(status["conditions"][1]["reason"], "ApplyError");
        assert_eq!(status["conditions"][1]["lastTransitionTime"], "t0");
    }
}
