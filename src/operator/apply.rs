//! Applying one child: the foreign-owner check (an object made for another
//! parent, rule or person is never taken over unless the rule lets the
//! child `adopt` it), the create-only and recreate policies, the skip when
//! the live object carries this rendering's hash and has not drifted, and
//! the server-side apply.

use std::collections::BTreeSet;

use kube::api::{
    DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use serde_json::Value;
use tracing::info;

use super::context::{Error, RuleCtx};
use crate::plan::{ANNOTATION_RENDER_HASH, Apply, LABEL_PARENT_UID, LABEL_RULE};
use crate::rules::model::Policy;

/// What happened to one child.
pub(super) enum Outcome {
    Unchanged,
    Created,
    Updated,
}

pub(super) async fn apply_child(
    ctx: &RuleCtx,
    apply: &Apply,
    live: Option<&Value>,
) -> Result<Outcome, Error> {
    let fail = |source| Error::Apply {
        key: apply.key.to_string(),
        source,
    };
    let Some(kind) = ctx.child_kind(&apply.key.group, &apply.key.kind) else {
        return Err(Error::Plan(format!("{}: kind not resolved", apply.key)));
    };
    let api = ctx.api_for(kind, apply.key.namespace.as_deref());
    // Whether the object exists, even where the cache has not caught up:
    // decides between "created" and "applied" in logs and Events.
    let mut existed = live.is_some();
    if live.is_none() {
        // Not among this parent's cached children: new, not in the cache yet,
        // or made for another parent (two parents rendering one name), which
        // a forced apply would silently take over.
        if let Some(existing) = api.get_opt(&apply.key.name).await.map_err(fail)? {
            existed = true;
            let existing = serde_json::to_value(&existing).unwrap_or_default();
            let adopt = ctx
                .rule()
                .children
                .iter()
                .any(|c| c.spec.id == apply.id && c.spec.adopt);
            if let Some(owner) = foreign_owner(&existing, &apply.object, adopt) {
                return Err(Error::Conflict {
                    key: apply.key.to_string(),
                    owner,
                });
            }
            if apply.policy == Policy::CreateOnly {
                return Ok(Outcome::Unchanged);
            }
        } else if apply.policy == Policy::CreateOnly {
            // A create, not an apply: should the object appear meanwhile it
            // is kept as it is (a `rand_alnum` secret is never re-rolled).
            let object: DynamicObject = serde_json::from_value(apply.object.clone())
                .map_err(|e| Error::Plan(format!("{}: {e}", apply.key)))?;
            let params = PostParams {
                field_manager: Some(ctx.field_manager()),
                ..PostParams::default()
            };
            ctx.shared.gate.check()?;
            return match api.create(&params, &object).await {
                Ok(_) => Ok(Outcome::Created),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Unchanged),
                Err(source) => Err(fail(source)),
            };
        }
    }
    match (apply.policy, live) {
        (Policy::CreateOnly, Some(_)) => return Ok(Outcome::Unchanged),
        (Policy::Recreate, Some(live)) if live_render_hash(live) != Some(apply.hash.as_str()) => {
            let uid = live.pointer("/metadata/uid").and_then(Value::as_str);
            let params = DeleteParams {
                preconditions: uid.map(|u| Preconditions {
                    uid: Some(u.to_owned()),
                    resource_version: None,
                }),
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            ctx.shared.gate.check()?;
            api.delete(&apply.key.name, &params)
                .await
                .map_err(|source| Error::Delete {
                    key: apply.key.to_string(),
                    source,
                })?;
            info!(rule = %ctx.rule().name, object = %apply.key, "deleted to recreate with a changed rendering");
            // The create follows once the deletion is observed.
            return Ok(Outcome::Updated);
        }
        _ => {}
    }
    // Nothing to send when the live object carries this rendering's hash
    // and still holds every field trellis sets: this survives a restart or
    // a failover (the hash is on the object), and ignores what others add.
    if let Some(live) = live
        && live_render_hash(live) == Some(apply.hash.as_str())
        && !crate::drift::drifted(&apply.object, live)
    {
        return Ok(Outcome::Unchanged);
    }

    let params = PatchParams::apply(&ctx.field_manager()).force();
    api.patch(&apply.key.name, &params, &Patch::Apply(&apply.object))
        .await
        .map_err(fail)?;
    Ok(if existed {
        Outcome::Updated
    } else {
        Outcome::Created
    })
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
        _ => {
            let managers: BTreeSet<&str> = existing
                .pointer("/metadata/managedFields")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|m| m["manager"].as_str())
                .collect();
            Some(if managers.is_empty() {
                "someone else: it was not created by trellis for this parent".to_owned()
            } else {
                format!(
                    "someone else (managed by {}): it was not created by trellis for this parent",
                    managers.into_iter().collect::<Vec<_>>().join(", ")
                )
            })
        }
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
