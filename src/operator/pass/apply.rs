//! Applying one child: the foreign-owner check (an object made for another
//! parent, rule or person is never taken over unless the rule lets the
//! child `adopt` it), the create-only and recreate policies, the skip when
//! the live object carries this rendering's hash and has not drifted, and
//! the server-side apply.

use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use serde_json::Value;
use tracing::info;

use crate::operator::context::{Error, RuleCtx};
use crate::ownership::{foreign_owner, live_render_hash};
use crate::plan::Apply;
use crate::rules::model::Policy;

/// What happened to one child.
pub(in crate::operator) enum Outcome {
    Unchanged,
    /// Written moments ago with this rendering, not in the cache yet: not
    /// sent again (the pass checks once more later).
    Unseen,
    Created,
    Updated,
}

/// The outcome, and the object as the API server answered a write: the
/// pass reads it as observed state instead of waiting for the watch.
pub(in crate::operator) struct Applied {
    pub outcome: Outcome,
    pub object: Option<Value>,
}

impl Applied {
    /// Nothing sent. `arrived` is the object when the pass did not have it
    /// but the cache does now: the pass must count it as observed, or its
    /// status would leave out what is there, and a clean pass removes the
    /// fields it no longer produces (at 10,000 parents, 2 statuses lost
    /// their `service` field to a Service whose watch event landed between
    /// the pass taking its children and applying them).
    fn unchanged(arrived: Option<&Value>) -> Applied {
        Applied {
            outcome: Outcome::Unchanged,
            object: arrived.cloned(),
        }
    }

    fn written(outcome: Outcome, object: DynamicObject) -> Applied {
        Applied {
            outcome,
            object: serde_json::to_value(&object).ok(),
        }
    }
}

/// Applies one child of the parent with uid `parent_uid`; `live` is the
/// object as this parent's cached children hold it.
///
/// A child not among them is new, not cached yet, or someone else's, and
/// is written without a read first: what the caches know decides what they
/// can (another parent's object, one this process just made), and the API
/// server refuses the rest: every new child, `createOnly` or not, is sent
/// as a create-only apply ([`create_only`]), which meets 409 whenever the
/// object exists. So an object someone else made is never written, not
/// even for a moment. Only a refused write is followed by a read, to name
/// the owner.
pub(in crate::operator) async fn apply_child(
    ctx: &RuleCtx,
    apply: &Apply,
    live: Option<&Value>,
    parent_uid: &str,
) -> Result<Applied, Error> {
    let fail = apply_failed(apply);
    let api = ctx.child_api(&apply.key).map_err(Error::Plan)?;
    let adopt = ctx
        .rule()
        .children
        .iter()
        .any(|c| c.spec.id == apply.id && c.spec.adopt);
    let conflict = |owner| Error::Conflict {
        key: apply.key.to_string(),
        owner,
    };
    // Not among this parent's children when the pass took them, but in the
    // rule's cache now: another parent's (or unlabelled) object, or this
    // parent's, arrived since; the cache knows which. Or among them, and
    // the cache holds a later version now: the pass took its children
    // before this process's last write of the child came back through the
    // watch, whose event also ended what `created` kept of that write —
    // decided on the version taken, the child was written twice. Looked
    // for only when the version taken is not this rendering's: a pass that
    // finds its children as rendered (the steady state) pays nothing.
    let stale = |taken: &Value| live_render_hash(taken) != Some(apply.hash.as_str());
    let arrived = match live {
        Some(taken) if !stale(taken) => None,
        Some(taken) => match ctx.newer_cached(&apply.key, taken) {
            Some(object) => {
                if let Some(owner) = foreign_owner(&object, &apply.object, adopt) {
                    return Err(conflict(owner));
                }
                Some(object)
            }
            None => None,
        },
        None => match ctx.cached_child(&apply.key) {
            Some(object) => {
                if let Some(owner) = foreign_owner(&object, &apply.object, adopt) {
                    return Err(conflict(owner));
                }
                Some(object)
            }
            None => None,
        },
    };
    let live = arrived.as_ref().or(live);
    // Whether this parent's object is known to exist: a forced apply
    // (ours to overwrite) rather than an unforced one (maybe someone's).
    let mut ours = live.is_some();
    if let Some(live) = live {
        match ctx.created_for(&apply.key) {
            // The cache shows an older version than this process wrote
            // moments ago: a relist (a watch restarted for new buckets, or
            // after a 410) served before the write replaced the newer
            // object. Writing again would send the same thing twice; the
            // watch brings the write, and the pass looks again.
            Some((uid, hash, true))
                if uid == parent_uid
                    && hash == apply.hash
                    && live_render_hash(live) != Some(hash.as_str()) =>
            {
                return Ok(Applied {
                    outcome: Outcome::Unseen,
                    object: None,
                });
            }
            Some(_) => ctx.forget_created(&apply.key),
            None => {}
        }
    } else if let Some((uid, hash, fresh)) = ctx.created_for(&apply.key) {
        // Made by this process moments ago; the cache has not seen it yet.
        if uid != parent_uid {
            return Err(conflict(format!("parent uid {uid}")));
        }
        if fresh && hash == apply.hash {
            return Ok(Applied {
                outcome: Outcome::Unseen,
                object: None,
            });
        }
        ours = true;
    }
    let manager = ctx.field_manager();
    if live.is_none() && apply.policy == Policy::CreateOnly {
        // Made as every new child is made (the create-only apply below), but
        // never forced nor applied again: should the object exist it is
        // kept as it is (a `rand_alnum` secret is never re-rolled).
        return create_only_child(ctx, &api, apply, adopt, &manager, parent_uid).await;
    }
    match (apply.policy, live) {
        (Policy::CreateOnly, Some(live)) => {
            return Ok(
                match label_bucket(ctx, &api, apply, live, &manager, parent_uid).await? {
                    Some(labelled) => Applied::written(Outcome::Updated, labelled),
                    None => Applied::unchanged(arrived.as_ref()),
                },
            );
        }
        (Policy::Recreate, Some(live)) if live_render_hash(live) != Some(apply.hash.as_str()) => {
            return recreate(ctx, &api, apply, live, parent_uid).await;
        }
        _ => {}
    }
    // Nothing to send when the live object carries this rendering's hash
    // and still holds every field trellis sets: this survives a restart or
    // a failover (the hash is on the object), and ignores what others add.
    // A `handOff` field differs from the rendering only once someone else
    // has changed it, and then it is theirs: never drift.
    if let Some(live) = live
        && live_render_hash(live) == Some(apply.hash.as_str())
        && !crate::drift::drifted(&apply.compared(), live)
    {
        return Ok(Applied::unchanged(arrived.as_ref()));
    }

    ctx.check_write(parent_uid)?;
    if ours {
        let params = PatchParams::apply(&manager).force();
        let body = body_for(&api, apply, &manager).await?;
        let written = api
            .patch(&apply.key.name, &params, &Patch::Apply(&body))
            .await
            .map_err(fail)?;
        // Remembered until the cache shows it (see above).
        ctx.remember_created(&apply.key, parent_uid, &apply.hash);
        let outcome = if live.is_some() {
            Outcome::Updated
        } else {
            Outcome::Created
        };
        return Ok(Applied::written(outcome, written));
    }
    // Unknown to the caches: most likely new, and made by the create-only
    // apply; refused, it exists: ours after all (made by an earlier
    // process, not cached yet) or adopted, its fields are taken.
    create_or_take(ctx, &api, apply, adopt, &manager, parent_uid).await
}

/// [`Apply::body_over`] a child known to exist: one read of it (the
/// caches keep no `managedFields`), only when it has `handOff` paths; gone
/// by now, the whole rendering, which the apply then creates.
async fn body_for(api: &Api<DynamicObject>, apply: &Apply, manager: &str) -> Result<Value, Error> {
    if apply.hand_off.is_empty() {
        return Ok(apply.object.clone());
    }
    let live = api
        .get_opt(&apply.key.name)
        .await
        .map_err(apply_failed(apply))?;
    Ok(match live {
        Some(live) => apply
            .body_over(&serde_json::to_value(&live).unwrap_or_default(), manager)
            .into_owned(),
        None => apply.object.clone(),
    })
}

/// How a failed apply of `apply` reads.
fn apply_failed(apply: &Apply) -> impl Fn(kube::Error) -> Error + '_ {
    |source| Error::Apply {
        key: apply.key.to_string(),
        source,
    }
}

/// A `createOnly` child the caches do not know: made as every new child is
/// made, never forced nor applied again.
async fn create_only_child(
    ctx: &RuleCtx,
    api: &Api<DynamicObject>,
    apply: &Apply,
    adopt: bool,
    manager: &str,
    parent_uid: &str,
) -> Result<Applied, Error> {
    let fail = apply_failed(apply);
    ctx.check_write(parent_uid)?;
    match create_only(api, apply, manager).await {
        Ok(made) => {
            ctx.remember_created(&apply.key, parent_uid, &apply.hash);
            Ok(Applied::written(Outcome::Created, made))
        }
        Err(kube::Error::Api(e)) if refused(&e) => {
            // Ours, and newer than the cache: the pass reads it, or its
            // status would say the child does not exist yet until some
            // later event (a restart over a killed process's last
            // creates hit it).
            let (existing, _) = whose(api, apply, adopt, e).await?;
            if let Some(labelled) =
                label_bucket(ctx, api, apply, &existing, manager, parent_uid).await?
            {
                return Ok(Applied::written(Outcome::Updated, labelled));
            }
            Ok(Applied {
                outcome: Outcome::Unchanged,
                object: Some(existing),
            })
        }
        Err(source) => Err(fail(source)),
    }
}

/// `recreate`: a live child whose rendering changed is deleted; the create
/// follows once the deletion is observed.
async fn recreate(
    ctx: &RuleCtx,
    api: &Api<DynamicObject>,
    apply: &Apply,
    live: &Value,
    parent_uid: &str,
) -> Result<Applied, Error> {
    let uid = live.pointer("/metadata/uid").and_then(Value::as_str);
    let params = DeleteParams {
        preconditions: uid.map(|u| Preconditions {
            uid: Some(u.to_owned()),
            resource_version: None,
        }),
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    ctx.check_write(parent_uid)?;
    api.delete(&apply.key.name, &params)
        .await
        .map_err(|source| Error::Delete {
            key: apply.key.to_string(),
            source,
        })?;
    info!(rule = %ctx.rule().name, object = %apply.key, "deleted to recreate with a changed rendering");
    // The create follows once the deletion is observed.
    Ok(Applied {
        outcome: Outcome::Updated,
        object: None,
    })
}

/// A child unknown to the caches: the create-only apply, then, refused
/// (it exists, and is ours or adopted), a forced apply.
async fn create_or_take(
    ctx: &RuleCtx,
    api: &Api<DynamicObject>,
    apply: &Apply,
    adopt: bool,
    manager: &str,
    parent_uid: &str,
) -> Result<Applied, Error> {
    let fail = apply_failed(apply);
    match create_only(api, apply, manager).await {
        Ok(written) => {
            ctx.remember_created(&apply.key, parent_uid, &apply.hash);
            Ok(Applied::written(Outcome::Created, written))
        }
        Err(kube::Error::Api(e)) if refused(&e) => {
            let (existing, e) = whose(api, apply, adopt, e).await?;
            if e.code == 422 {
                return Err(fail(kube::Error::Api(e)));
            }
            let body = apply.body_over(&existing, manager);
            let written = api
                .patch(
                    &apply.key.name,
                    &PatchParams::apply(manager).force(),
                    &Patch::Apply(&body),
                )
                .await
                .map_err(fail)?;
            ctx.remember_created(&apply.key, parent_uid, &apply.hash);
            Ok(Applied::written(Outcome::Updated, written))
        }
        Err(source) => Err(fail(source)),
    }
}

/// A `createOnly` child is never applied again, so one made before children
/// carried `trellis.dev/bucket` gets that label alone, once (a merge patch:
/// an apply of the label alone would drop every field it made). Without
/// it, a replica under `--shards` would never see the child.
async fn label_bucket(
    ctx: &RuleCtx,
    api: &kube::Api<DynamicObject>,
    apply: &Apply,
    live: &Value,
    manager: &str,
    parent_uid: &str,
) -> Result<Option<DynamicObject>, Error> {
    let label = |o: &Value| {
        o.pointer("/metadata/labels")
            .and_then(|l| l.get(crate::shard::LABEL_BUCKET))
            .cloned()
    };
    let Some(want) = label(&apply.object) else {
        return Ok(None);
    };
    if label(live).as_ref() == Some(&want) {
        return Ok(None);
    }
    ctx.check_write(parent_uid)?;
    let patch = serde_json::json!({"metadata": {"labels": {crate::shard::LABEL_BUCKET: want}}});
    let params = PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    let labelled = api
        .patch(&apply.key.name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Apply {
            key: apply.key.to_string(),
            source,
        })?;
    info!(rule = %ctx.rule().name, object = %apply.key, "labelled with its bucket (createOnly: never applied again)");
    Ok(Some(labelled))
}

/// The create-only apply, how every child is made: an unforced apply
/// carrying a `resourceVersion` no stored object has
/// ([`NO_STORED_VERSION`]). Should the object exist, the API server refuses
/// it (409), so an object someone else made is never touched, not even for
/// a moment; when it does not exist it is created with this manager's
/// `Apply` ownership, so a field later removed from the template is removed
/// from the object (a POST would record an `Update` entry, whose fields a
/// later apply cannot remove).
async fn create_only(
    api: &kube::Api<DynamicObject>,
    apply: &Apply,
    manager: &str,
) -> Result<DynamicObject, kube::Error> {
    let mut create = apply.object.clone();
    if let Some(meta) = create.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(
            "resourceVersion".to_owned(),
            Value::String(NO_STORED_VERSION.to_owned()),
        );
    }
    api.patch(
        &apply.key.name,
        &PatchParams::apply(manager),
        &Patch::Apply(&create),
    )
    .await
}

/// A refusal of the create-only apply worth a read: the object exists
/// (409), or the API server rejects the object as it stands (422), which
/// an existing object may explain.
fn refused(e: &kube::core::Status) -> bool {
    e.code == 409 || e.code == 422
}

/// After a refused create-only apply: the existing object when it is this
/// parent's (or `adopt` takes it), with the refusal. Someone else's is a
/// [`Error::Conflict`] naming the owner; none at all, the refusal itself.
async fn whose(
    api: &kube::Api<DynamicObject>,
    apply: &Apply,
    adopt: bool,
    refusal: Box<kube::core::Status>,
) -> Result<(Value, Box<kube::core::Status>), Error> {
    let fail = |source| Error::Apply {
        key: apply.key.to_string(),
        source,
    };
    let Some(existing) = api.get_opt(&apply.key.name).await.map_err(fail)? else {
        return Err(fail(kube::Error::Api(refusal)));
    };
    let existing = serde_json::to_value(&existing).unwrap_or_default();
    match foreign_owner(&existing, &apply.object, adopt) {
        Some(owner) => Err(Error::Conflict {
            key: apply.key.to_string(),
            owner,
        }),
        None => Ok((existing, refusal)),
    }
}

/// The `resourceVersion` of a create-only apply. An object's version is the
/// etcd revision of its last write, and etcd's first write makes revision
/// 2: no stored object has version 1, so an apply naming it is refused
/// (409) whenever the object exists, and creates it otherwise.
const NO_STORED_VERSION: &str = "1";
