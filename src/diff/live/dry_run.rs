//! What each write of a pass would do, decided as the operator decides
//! and, where it would write, answered by the API server with a dry-run:
//! a child's apply, a contribution's patch, the parent's status. Apart from
//! `live.rs`, which gathers what a pass reads and plans it.

use kube::Client;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{Kinds, api, to_value};
use crate::diff::{ChildChange, FieldChange, field_changes, object_changes};
use crate::ownership::{foreign_owner, live_render_hash};
use crate::plan::{ANNOTATION_RENDER_HASH, Apply, ObjectKey};
use crate::rules::CompiledRule;
use crate::rules::model::Policy;
use crate::status_patch::status_patch;

/// What the operator's apply of one child would do, decided as it decides
/// and, where it would write, answered by a dry-run.
pub(super) async fn child_change(
    client: &Client,
    rule: &CompiledRule,
    kinds: &Kinds,
    apply: &Apply,
    observed: Option<&Value>,
) -> ChildChange {
    let refused = |why: String| ChildChange::Refused { why };
    let Some(kind) = kinds.find(&apply.key.group, &apply.key.kind) else {
        return refused(format!("{}: kind not resolved", apply.key));
    };
    let api = api(client, kind, apply.key.namespace.as_deref());
    let mut live = observed.cloned();
    if live.is_none() {
        // Not labelled for this parent: new, or someone else's.
        match api.get_opt(&apply.key.name).await {
            Err(e) => return refused(format!("reading {}: {e}", apply.key)),
            Ok(Some(existing)) => {
                let existing = to_value(existing, kind);
                let adopt = rule.child(&apply.id).is_some_and(|c| c.spec.adopt);
                if let Some(owner) = foreign_owner(&existing, &apply.object, adopt) {
                    return refused(format!("{} exists and belongs to {owner}", apply.key));
                }
                live = Some(existing);
            }
            Ok(None) => {}
        }
    }
    let manager = format!("trellis/{}", rule.name);
    match (apply.policy, &live) {
        (Policy::CreateOnly, Some(_)) => return ChildChange::Unchanged,
        (Policy::CreateOnly, None) => {
            let object: DynamicObject = match serde_json::from_value(apply.object.clone()) {
                Ok(o) => o,
                Err(e) => return refused(format!("{}: {e}", apply.key)),
            };
            let params = PostParams {
                dry_run: true,
                field_manager: Some(manager),
            };
            return match api.create(&params, &object).await {
                Ok(_) => ChildChange::Create {
                    object: apply.object.clone(),
                },
                Err(e) => refused(format!("creating {}: {e}", apply.key)),
            };
        }
        (Policy::Recreate, Some(l)) if live_render_hash(l) != Some(apply.hash.as_str()) => {
            return ChildChange::Recreate {
                fields: rendered_changes(l, &apply.object),
            };
        }
        (_, Some(l))
            if live_render_hash(l) == Some(apply.hash.as_str())
                && !crate::drift::drifted(&apply.compared(), l) =>
        {
            return ChildChange::Unchanged;
        }
        _ => {}
    }
    let params = PatchParams::apply(&manager).force().dry_run();
    // Listed objects carry their managedFields: what is handed off is known.
    let body = match &live {
        Some(l) => apply.body_over(l, &manager),
        None => std::borrow::Cow::Borrowed(&apply.object),
    };
    match api
        .patch(&apply.key.name, &params, &Patch::Apply(&*body))
        .await
    {
        Err(e) => refused(format!("applying {}: {e}", apply.key)),
        Ok(after) => {
            let after = to_value(after, kind);
            match &live {
                // What trellis sets, not the server's defaults and
                // allocations (a dry-run even picks a cluster IP).
                None => ChildChange::Create {
                    object: apply.object.clone(),
                },
                Some(l) => {
                    let fields = without_hash_noise(object_changes(l, &after));
                    if fields.is_empty() {
                        ChildChange::Unchanged
                    } else {
                        ChildChange::Update { fields }
                    }
                }
            }
        }
    }
}

/// What one contribution (or the empty apply of a release) would change on
/// its target: a dry-run apply with the parent's own field manager, forced
/// only when the patch says so (a conflict is what the pass would fail on).
pub(super) async fn patch_change(
    client: &Client,
    kinds: &Kinds,
    (key, body): (&ObjectKey, &Value),
    live: Option<&Value>,
    manager: &str,
    force: bool,
) -> ChildChange {
    let refused = |why: String| ChildChange::Refused { why };
    let Some(kind) = kinds.find(&key.group, &key.kind) else {
        return refused(format!("{key}: kind not resolved"));
    };
    let Some(live) = live else {
        return refused(format!("{key} is not observed"));
    };
    let mut params = PatchParams::apply(manager).dry_run();
    if force {
        params = params.force();
    }
    match api(client, kind, key.namespace.as_deref())
        .patch(&key.name, &params, &Patch::Apply(body))
        .await
    {
        Err(e) => refused(format!("patching {key}: {e}")),
        Ok(after) => {
            let fields = object_changes(live, &to_value(after, kind));
            if fields.is_empty() {
                ChildChange::Unchanged
            } else {
                ChildChange::Update { fields }
            }
        }
    }
}

/// For `recreate` (no dry-run of a delete-and-create): the rendered fields
/// whose live value differs.
fn rendered_changes(live: &Value, rendered: &Value) -> Vec<FieldChange> {
    without_hash_noise(
        object_changes(live, rendered)
            .into_iter()
            .filter(|f| f.after.is_some())
            .collect(),
    )
}

/// The render hash changes with every other change: noise beside them, the
/// one change worth showing when alone.
fn without_hash_noise(mut fields: Vec<FieldChange>) -> Vec<FieldChange> {
    let hash = format!("metadata.annotations[\"{ANNOTATION_RENDER_HASH}\"]");
    if fields.len() > 1 {
        fields.retain(|f| f.path != hash);
    }
    fields
}

/// The parent's status write, dry: the same merge patch the operator sends.
pub(super) async fn status_changes(
    client: &Client,
    rule: &CompiledRule,
    kinds: &Kinds,
    parent: &Value,
    name: &str,
    namespace: Option<&str>,
    status: &Value,
) -> Result<Vec<FieldChange>, super::LiveError> {
    let api = api(client, &kinds.parent, namespace);
    let claim = if kinds.parent.status_subresource {
        None
    } else {
        parent
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
    };
    let patch = status_patch(rule, parent.get("status"), status, claim);
    let params = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let result = if kinds.parent.status_subresource {
        api.patch_status(name, &params, &Patch::Merge(&patch)).await
    } else {
        api.patch(name, &params, &Patch::Merge(&patch)).await
    };
    let after = result.map_err(super::LiveError::api(format!("status of {name}")))?;
    let after = after.data.get("status").cloned().unwrap_or(json!({}));
    let before = parent.get("status").cloned().unwrap_or(json!({}));
    let mut changes = field_changes(&before, &after);
    for c in &mut changes {
        c.path = if c.path == "." {
            "status".into()
        } else if c.path.starts_with('[') {
            format!("status{}", c.path)
        } else {
            format!("status.{}", c.path)
        };
    }
    Ok(changes)
}
