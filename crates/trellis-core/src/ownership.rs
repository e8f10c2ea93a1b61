//! Whose a live object is: trellis's own child for this parent and rule,
//! or someone else's — another parent, another rule, another controller,
//! or a person — and the render hash the apply that made it recorded.
//! The operator refuses to write someone else's object; `trellis diff`
//! reports it the same way.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::labels::{ANNOTATION_RENDER_HASH, LABEL_PARENT_UID, LABEL_RULE};

/// The owner named for an object trellis did not make.
fn someone_else<'a>(managers: impl Iterator<Item = &'a str>) -> String {
    let managers: Vec<&str> = managers.collect();
    if managers.is_empty() {
        "someone else: it was not created by trellis for this parent".to_owned()
    } else {
        format!(
            "someone else (managed by {}): it was not created by trellis for this parent",
            managers.join(", ")
        )
    }
}

/// Who an existing object belongs to, when not to the parent (and rule)
/// of `desired`: another parent's controller reference or uid label,
/// another rule's label, or — for an object without trellis's labels —
/// whoever made it. Such an object is never written unless the rule lets
/// the child `adopt` it and it has no controller owner.
pub fn foreign_owner(existing: &Value, desired: &Value, adopt: bool) -> Option<String> {
    let label = |obj: &Value, name: &str| {
        obj.pointer("/metadata/labels")
            .and_then(|l| l.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let uid = label(desired, LABEL_PARENT_UID);
    let rule = label(desired, LABEL_RULE);
    let controller = existing
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|refs| refs.iter().find(|r| r["controller"] == true));
    if let Some(owner) = controller
        && owner["uid"].as_str() != uid.as_deref()
    {
        return Some(format!(
            "{} {}",
            owner["kind"].as_str().unwrap_or_default(),
            owner["name"].as_str().unwrap_or_default()
        ));
    }
    match (
        label(existing, LABEL_PARENT_UID),
        label(existing, LABEL_RULE),
    ) {
        (Some(other), _) if Some(&other) != uid.as_ref() => Some(format!("parent uid {other}")),
        (_, Some(other)) if Some(&other) != rule.as_ref() => Some(format!("rule {other}")),
        (Some(_), Some(_)) => None,
        _ if adopt && controller.is_none() => None,
        _ => Some(someone_else(
            existing
                .pointer("/metadata/managedFields")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|m| m["manager"].as_str())
                .collect::<BTreeSet<&str>>()
                .into_iter(),
        )),
    }
}

/// The render hash recorded on a live child by the apply that made it.
pub fn live_render_hash(live: &Value) -> Option<&str> {
    live.pointer("/metadata/annotations")
        .and_then(|a| a.get(ANNOTATION_RENDER_HASH))
        .and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_not_made_for_this_parent_and_rule_is_never_taken_over() {
        let desired = json!({"metadata": {"labels": {
            "trellis.dev/rule": "app", "trellis.dev/parent-uid": "u1"}}});
        let ours = json!({"metadata": {
            "labels": {"trellis.dev/rule": "app", "trellis.dev/parent-uid": "u1"},
            "ownerReferences": [{"kind": "App", "name": "a", "uid": "u1", "controller": true}]}});
        assert_eq!(foreign_owner(&ours, &desired, false), None);
        let unmanaged = json!({"metadata": {"name": "x",
            "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]}});
        assert_eq!(
            foreign_owner(&unmanaged, &desired, false).as_deref(),
            Some(
                "someone else (managed by kubectl-create): it was not created by trellis for this parent"
            )
        );
        assert_eq!(
            foreign_owner(&unmanaged, &desired, true),
            None,
            "adopt: true takes it over"
        );
        let controlled = json!({"metadata": {"name": "x",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "u9", "controller": true}]}});
        assert_eq!(
            foreign_owner(&controlled, &desired, true).as_deref(),
            Some("ReplicaSet rs"),
            "adopt never takes an object another controller owns"
        );
        let other_parent = json!({"metadata": {
            "labels": {"trellis.dev/rule": "app", "trellis.dev/parent-uid": "u2"},
            "ownerReferences": [{"kind": "App", "name": "b", "uid": "u2", "controller": true}]}});
        assert_eq!(
            foreign_owner(&other_parent, &desired, false).as_deref(),
            Some("App b")
        );
        let unowned = json!({"metadata": {"labels": {"trellis.dev/parent-uid": "u2"}}});
        assert_eq!(
            foreign_owner(&unowned, &desired, false).as_deref(),
            Some("parent uid u2")
        );
        let other_rule = json!({"metadata": {"labels": {
            "trellis.dev/rule": "db", "trellis.dev/parent-uid": "u1"}}});
        assert_eq!(
            foreign_owner(&other_rule, &desired, true).as_deref(),
            Some("rule db")
        );
    }
}
