//! Finalizing a parent: the cleanup finalizer, its patch contributions
//! released, children removed (retained ones released) in reverse
//! dependency order (one wave per child id) when the rule asks, a live
//! check that none is left, and the finalizer released.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{
    DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tracing::info;

use crate::operator::FINALIZER;
use crate::operator::context::{Error, RuleCtx, parent_key};
use crate::plan::{LABEL_CHILD, LABEL_PARENT_UID, LABEL_RULE, ObjectKey};
use crate::rules::model::DeletionPolicy;

pub(in crate::operator) async fn set_finalizers(
    ctx: &RuleCtx,
    parent: &DynamicObject,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    ctx.check_write(&parent.uid().unwrap_or_default())?;
    // resourceVersion makes this a compare-and-swap: other finalizers are never lost.
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": parent.resource_version(),
        }
    });
    ctx.parent_api(parent)
        .patch(
            &parent.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(Error::Finalizer)?;
    Ok(())
}

/// The children of this parent that exist, by a live list per child kind
/// (not the cache), as objects of their metadata: a child created moments
/// ago that the cache has not seen, or one in a namespace the rule's
/// watches no longer cover (a reload narrowed its namespaces).
async fn live_children(
    ctx: &RuleCtx,
    parent: &DynamicObject,
    uid: &str,
) -> Result<Vec<Value>, Error> {
    let rule = ctx.rule();
    let selector = format!("{LABEL_RULE}={},{LABEL_PARENT_UID}={uid}", rule.name);
    let params = kube::api::ListParams::default().labels(&selector);
    let mut out = Vec::new();
    for kind in &ctx.kinds.children {
        // Children live in the parent's namespace unless the rule lets them out.
        let anywhere = crate::operator::watches::children_anywhere(&rule, &kind.gvk);
        let namespace = parent.namespace().filter(|_| !anywhere);
        let api = ctx.api_for(kind, namespace.as_deref());
        match api.list_metadata(&params).await {
            Ok(list) => out.extend(list.items.into_iter().map(|c| {
                json!({
                    "apiVersion": kind.gvk.api_version(),
                    "kind": kind.gvk.kind,
                    "metadata": c.metadata,
                })
            })),
            Err(source) => {
                return Err(ctx.attribute(Error::Delete {
                    key: format!("children of kind {}", kind.gvk),
                    source,
                }));
            }
        }
    }
    Ok(out)
}

/// A parent being deleted: remove children (in reverse dependency order when
/// asked, one wave per child id), then release the finalizer.
pub(in crate::operator) async fn finalize(
    parent: &DynamicObject,
    ctx: &RuleCtx,
    uid: &str,
) -> Result<Action, Error> {
    if !parent.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    match remove_children(parent, ctx, uid, "parent is being deleted").await? {
        Removal::Waiting(after) => Ok(Action::requeue(after)),
        Removal::Done { .. } => {
            release_finalizer(ctx, parent).await?;
            info!(rule = %ctx.rule().name, parent = %parent_key(parent), "children removed; finalizer released");
            Ok(Action::await_change())
        }
    }
}

/// Drops trellis's finalizer from `parent` (as read), keeping the others.
pub(in crate::operator) async fn release_finalizer(
    ctx: &RuleCtx,
    parent: &DynamicObject,
) -> Result<(), Error> {
    let rest: Vec<String> = parent
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(ctx, parent, rest).await
}

/// Where removing a parent's children stands after one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::operator) enum Removal {
    /// Deletes were sent (or a child the cache missed is still there):
    /// look again after this long.
    Waiting(Duration),
    /// Nothing of the rule's is left on the parent's children or targets;
    /// `acted` when this round released or deleted anything.
    Done { acted: bool },
}

/// One round of taking a parent's children and contributions away, as on
/// its deletion: patch contributions released, then children deleted
/// (retained ones released), in reverse dependency order when the rule asks
/// for it, a live check that none is left. `why` ends each log line.
pub(in crate::operator) async fn remove_children(
    parent: &DynamicObject,
    ctx: &RuleCtx,
    uid: &str,
    why: &str,
) -> Result<Removal, Error> {
    let rule = &ctx.rule();
    // Contributions to objects the rule does not own go first.
    let released = super::patch_writes::release_parent(ctx, rule, uid).await?;
    // A spoke never listed (unreachable since the operator started) may
    // hold children of this parent that no cache shows: wait for it.
    let unlisted = ctx.shared.clusters.never_listed(rule);
    if !unlisted.is_empty() {
        let note = format!(
            "waiting to remove children in other clusters: {} not listed yet (unreachable?)",
            unlisted.join(", ")
        );
        info!(rule = %rule.name, parent = %parent_key(parent), "{note}");
        ctx.warn(parent, crate::clusters::UNREACHABLE, note).await;
        return Ok(Removal::Waiting(Duration::from_secs(2)));
    }
    let mut observed = ctx.observed(uid);
    if observed.is_empty() {
        // The cache may not have seen a child created moments ago, or may
        // not cover its namespace any more: ask the API server before
        // letting the parent go.
        observed = live_children(ctx, parent, uid).await?;
        if observed.is_empty() {
            return Ok(Removal::Done { acted: released });
        }
    }
    let id_of = |o: &Value| {
        o.pointer("/metadata/labels")
            .and_then(|l| l.get(LABEL_CHILD))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let ordered = rule.rule.spec.deletion.is_some();
    let wave: Vec<&Value> = if ordered {
        // Last in dependency order goes first; ids the rule no longer has go first of all.
        let rank = |o: &Value| {
            let id = id_of(o);
            rule.order
                .iter()
                .position(|&i| Some(&rule.children[i].spec.id) == id.as_ref())
                .map(|p| p + 1)
                .unwrap_or(usize::MAX)
        };
        let top = observed.iter().map(rank).max();
        observed.iter().filter(|o| Some(rank(o)) == top).collect()
    } else {
        observed.iter().collect()
    };
    let clusters = ctx.shared.clusters.view(rule);
    let mut held = Vec::new();
    for obj in wave {
        // Going already, or deleted by an earlier round (or pass) while
        // the cache still shows it: not deleted again.
        let child_uid = obj.pointer("/metadata/uid").and_then(Value::as_str);
        if obj.pointer("/metadata/deletionTimestamp").is_some() || ctx.own.was_deleted(child_uid) {
            continue;
        }
        let Some(key) = ObjectKey::placed(obj) else {
            continue;
        };
        // Never in a spoke that does not answer (or is no longer
        // registered): the parent waits, saying so.
        if let Some(why) = clusters.hold(key.cluster.as_deref()) {
            held.push(format!("{key}: {}", why.message));
            continue;
        }
        let Ok(api) = ctx.child_api(&key) else {
            continue;
        };
        // A retained child is released (kept, with nothing of trellis's
        // left), in its turn, instead of deleted.
        let retained = crate::plan::retained(obj)
            || id_of(obj)
                .and_then(|id| rule.child(&id))
                .is_some_and(|c| c.spec.deletion_policy == DeletionPolicy::Retain);
        if retained {
            ctx.check_write(uid)?;
            match super::release::release_child(&api, &key.name).await {
                Ok(_) => {
                    info!(rule = %rule.name, parent = %parent_key(parent), object = %key, "released (deletionPolicy: retain; {why})")
                }
                Err(source) => {
                    return Err(ctx.attribute(Error::Apply {
                        key: key.to_string(),
                        source,
                    }));
                }
            }
            continue;
        }
        let params = DeleteParams {
            preconditions: child_uid.map(|u| Preconditions {
                uid: Some(u.to_owned()),
                resource_version: None,
            }),
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        ctx.check_write(uid)?;
        match api.delete(&key.name, &params).await {
            Ok(_) => {
                ctx.own.deleted(child_uid);
                info!(rule = %rule.name, parent = %parent_key(parent), object = %key, "deleted ({why})")
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(source) => {
                return Err(ctx.attribute(Error::Delete {
                    key: key.to_string(),
                    source,
                }));
            }
        }
    }
    if !held.is_empty() {
        let note = format!(
            "waiting to remove children in other clusters: {}",
            held.join("; ")
        );
        info!(rule = %rule.name, parent = %parent_key(parent), "{note}");
        ctx.warn(parent, crate::clusters::UNREACHABLE, note).await;
    }
    // Watches on the children wake us as they go; poll as a safety net.
    Ok(Removal::Waiting(Duration::from_secs(2)))
}
