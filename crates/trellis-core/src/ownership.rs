//! Whose a live object is: trellis's own child for this parent and rule,
//! or someone else's — another parent, another rule, another controller,
//! or a person — and the render hash the apply that made it recorded.
//! The operator refuses to write someone else's object; `trellis diff`
//! reports it the same way.
//!
//! Whose a *field* is, for `handOff`: a field another manager has changed
//! is recorded as that manager's in the object's `managedFields` (an
//! update takes ownership; `kubectl scale` is recorded as manager
//! `kubectl`, subresource `scale`, owning `f:spec.f:replicas`). That
//! record is the whole state: it survives restarts, and trellis never
//! remembers a hand-off of its own.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::labels::{ANNOTATION_RENDER_HASH, LABEL_PARENT_UID, LABEL_RULE};

/// At most this many `handOff` paths per child, each at most
/// [`MAX_HAND_OFF_SEGMENTS`] keys deep and [`MAX_HAND_OFF_CHARS`] long.
pub const MAX_HAND_OFF_PATHS: usize = 32;
pub const MAX_HAND_OFF_SEGMENTS: usize = 16;
pub const MAX_HAND_OFF_CHARS: usize = 256;

/// Why a `handOff` entry is not a field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error(
        "`{0}` is not a field path: keys are separated by `.`, and a key with `.` or `/` is written `[\"key\"]`"
    )]
    Malformed(String),
    #[error(
        "`{0}` is longer than {MAX_HAND_OFF_CHARS} characters or deeper than {MAX_HAND_OFF_SEGMENTS} keys"
    )]
    TooLong(String),
}

/// A field path as keys: `spec.replicas`, `metadata.annotations["a/b"]`.
/// Lists are not addressed (their items have no stable key here).
pub fn parse_path(text: &str) -> Result<Vec<String>, PathError> {
    let malformed = || PathError::Malformed(text.to_owned());
    if text.len() > MAX_HAND_OFF_CHARS {
        return Err(PathError::TooLong(text.to_owned()));
    }
    let mut keys = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(quoted) = rest.strip_prefix('[') {
            // A JSON string, then `]`.
            let end = quoted.find("\"]").ok_or_else(malformed)? + 1;
            let key: String = serde_json::from_str(&quoted[..end]).map_err(|_| malformed())?;
            keys.push(key);
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            let key = &rest[..end];
            if key.is_empty() || key.contains([']', '"']) {
                return Err(malformed());
            }
            keys.push(key.to_owned());
            rest = &rest[end..];
        }
        if let Some(after) = rest.strip_prefix('.') {
            if after.is_empty() || after.starts_with('[') {
                return Err(malformed());
            }
            rest = after;
        } else if !rest.is_empty() && !rest.starts_with('[') {
            return Err(malformed());
        }
    }
    if keys.is_empty() || keys.iter().any(String::is_empty) {
        return Err(malformed());
    }
    if keys.len() > MAX_HAND_OFF_SEGMENTS {
        return Err(PathError::TooLong(text.to_owned()));
    }
    Ok(keys)
}

/// The `handOff` paths of `paths` that some field manager other than
/// `ours` owns on `live` (the path itself or any field under it): another
/// controller or person has changed them, and trellis leaves them be.
pub fn handed_off<'p>(live: &Value, paths: &'p [Vec<String>], ours: &str) -> Vec<&'p [String]> {
    let Some(managers) = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let others: Vec<&Value> = managers
        .iter()
        .filter(|m| m.get("manager").and_then(Value::as_str) != Some(ours))
        .filter_map(|m| m.get("fieldsV1"))
        .collect();
    paths
        .iter()
        .filter(|path| {
            others.iter().any(|fields| {
                path.iter()
                    .try_fold(*fields, |node, key| node.get(format!("f:{key}")))
                    .is_some()
            })
        })
        .map(Vec::as_slice)
        .collect()
}

/// `object` without the fields at `paths` (an object emptied by the
/// removal is left empty: server-side apply reads `{}` as "no fields").
pub fn without_fields(object: &Value, paths: &[&[String]]) -> Value {
    let mut out = object.clone();
    for path in paths {
        let Some((last, parents)) = path.split_last() else {
            continue;
        };
        let parent = parents
            .iter()
            .try_fold(&mut out, |node, key| node.get_mut(key.as_str()));
        if let Some(Value::Object(map)) = parent {
            map.shift_remove(last.as_str());
        }
    }
    out
}

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
    // Another hub's object in a shared spoke is never taken, adopt or not.
    if let Some(other) = label(existing, crate::labels::LABEL_HUB)
        && Some(&other) != label(desired, crate::labels::LABEL_HUB).as_ref()
    {
        return Some(format!("hub {other}"));
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

    fn keys(path: &str) -> Vec<String> {
        parse_path(path).unwrap()
    }

    #[test]
    fn another_hubs_object_is_foreign_even_to_adopt() {
        let obj = |hub: &str, uid: &str| {
            json!({"metadata": {"labels": {
                "trellis.dev/hub": hub, "trellis.dev/parent-uid": uid, "trellis.dev/rule": "app"}}})
        };
        let desired = obj("hub-a", "u1");
        assert_eq!(foreign_owner(&obj("hub-a", "u1"), &desired, false), None);
        assert_eq!(
            foreign_owner(&obj("hub-b", "u1"), &desired, true).as_deref(),
            Some("hub hub-b")
        );
        let unlabelled = json!({"metadata": {"labels": {"trellis.dev/hub": "hub-b"}}});
        assert_eq!(
            foreign_owner(&unlabelled, &desired, true).as_deref(),
            Some("hub hub-b")
        );
    }

    #[test]
    fn hand_off_paths_read_dots_and_quoted_keys() {
        assert_eq!(keys("spec.replicas"), ["spec", "replicas"]);
        assert_eq!(
            keys(r#"metadata.annotations["example.com/owner"]"#),
            ["metadata", "annotations", "example.com/owner"]
        );
        assert_eq!(keys(r#"a["b.c"].d"#), ["a", "b.c", "d"]);
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "a[b]",
            r#"a["b"#,
            r#"a.["b"]"#,
            r#"a["b"]c"#,
        ] {
            assert!(
                matches!(parse_path(bad), Err(PathError::Malformed(_))),
                "{bad:?} is refused"
            );
        }
        let deep = vec!["a"; MAX_HAND_OFF_SEGMENTS + 1].join(".");
        assert!(matches!(parse_path(&deep), Err(PathError::TooLong(_))));
    }

    #[test]
    fn a_field_another_manager_owns_is_handed_off_and_ours_is_not() {
        let live = json!({"metadata": {"managedFields": [
            {"manager": "trellis/web", "operation": "Apply",
             "fieldsV1": {"f:spec": {"f:selector": {}, "f:template": {}}}},
            {"manager": "kubectl", "operation": "Update", "subresource": "scale",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            {"manager": "kube-controller-manager", "operation": "Update",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:deployment.kubernetes.io/revision": {}}}}}
        ]}});
        let paths = vec![
            keys("spec.replicas"),
            keys("spec.selector"),
            keys("metadata.annotations"),
            keys("spec.paused"),
        ];
        let taken = handed_off(&live, &paths, "trellis/web");
        assert_eq!(
            taken,
            [&paths[0][..], &paths[2][..]],
            "replicas (kubectl scale) and annotations (a key under it) are someone else's"
        );
        // The same fields are ours when we are the only manager.
        assert!(handed_off(&live, &paths[1..2], "trellis/web").is_empty());
        // No managedFields at all (a cache that drops them): nothing known.
        assert!(handed_off(&json!({"metadata": {}}), &paths, "trellis/web").is_empty());
    }

    #[test]
    fn handed_off_fields_leave_the_apply() {
        let object = json!({"spec": {"replicas": 2, "template": {"x": 1}}, "metadata": {"annotations": {"a/b": "1", "c": "2"}}});
        let replicas = keys("spec.replicas");
        let annotation = keys(r#"metadata.annotations["a/b"]"#);
        let missing = keys("spec.nothing.here");
        let out = without_fields(&object, &[&replicas, &annotation, &missing]);
        assert_eq!(
            out,
            json!({"spec": {"template": {"x": 1}}, "metadata": {"annotations": {"c": "2"}}})
        );
    }

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
