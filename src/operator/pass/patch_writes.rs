//! Sending patches: one parent's contributions to objects the rule does not
//! own, and taking them back.
//!
//! A contribution is a server-side apply with the parent's own field
//! manager (`trellis/<rule>/<parent uid>`), never forced unless the patch
//! says `force: true`, carrying the target's uid so that a target gone by
//! now is never re-created. A field another manager owns comes back as a
//! 409 naming manager and field: [`Error::PatchConflict`], the target
//! untouched. A release is the empty apply with the same manager: it
//! removes exactly that manager's fields.
//!
//! What was contributed before is found on the targets themselves: the
//! caches keep, of every object's `managedFields`, the entries of patch
//! managers ([`managers_of_patches`]), and nothing else.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use kube::api::{DynamicObject, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use tracing::{info, warn};

use crate::operator::context::{Error, RuleCtx};
use crate::operator::lock;
use crate::operator::watches::discovery::Resolved;
use crate::plan::{ObjectKey, PatchApply, Release};
use crate::rules::CompiledRule;

/// The hash each (parent uid, target) was last sent with by this process,
/// and how to take it back: an unchanged contribution the target still
/// holds is not sent again, and a parent deleted before the caches show
/// what it just contributed still releases it.
#[derive(Default)]
pub struct Memo(Mutex<HashMap<(String, ObjectKey), (String, Release)>>);

impl Memo {
    fn sent(&self, parent_uid: &str, key: &ObjectKey) -> Option<String> {
        lock(&self.0)
            .get(&(parent_uid.to_owned(), key.clone()))
            .map(|(hash, _)| hash.clone())
    }

    fn remember(&self, parent_uid: &str, patch: &PatchApply) {
        let mut memo = lock(&self.0);
        if memo.len() > 8192 {
            memo.clear();
        }
        let release = Release::of(patch.key.clone(), &patch.object);
        memo.insert(
            (parent_uid.to_owned(), patch.key.clone()),
            (patch.hash.clone(), release),
        );
    }

    /// What this process sent for the parent with `parent_uid`.
    fn of(&self, parent_uid: &str) -> Vec<Release> {
        lock(&self.0)
            .iter()
            .filter(|((uid, _), _)| uid == parent_uid)
            .map(|(_, (_, r))| r.clone())
            .collect()
    }

    pub fn forget(&self, parent_uid: &str, key: &ObjectKey) {
        lock(&self.0).remove(&(parent_uid.to_owned(), key.clone()));
    }
}

/// The resolved kind of a patch target.
fn target_kind<'a>(ctx: &'a RuleCtx, key: &ObjectKey) -> Option<&'a Resolved> {
    ctx.kinds
        .related
        .iter()
        .find(|k| k.gvk.group == key.group && k.gvk.kind == key.kind)
}

/// What became of one contribution.
pub(in crate::operator) enum Sent {
    /// The target holds it and it was sent before with this body.
    Unchanged,
    /// Applied: the target as the API server answered.
    Applied(Value),
    /// The target went (or was replaced) since it was observed: nothing
    /// written; the next pass finds it missing.
    Gone,
}

/// Sends one contribution of the parent with `parent_uid`, unless the
/// target holds it and it was sent with this body before.
pub(in crate::operator) async fn apply_patch(
    ctx: &RuleCtx,
    patch: &PatchApply,
    manager: &str,
    parent_uid: &str,
) -> Result<Sent, Error> {
    if patch.uid.is_none() {
        return Ok(Sent::Gone);
    }
    if patch.held && ctx.patches.sent(parent_uid, &patch.key).as_deref() == Some(&patch.hash) {
        return Ok(Sent::Unchanged);
    }
    let Some(kind) = target_kind(ctx, &patch.key) else {
        return Err(Error::Plan(format!("{}: kind not resolved", patch.key)));
    };
    let api = ctx.api_for(kind, patch.key.namespace.as_deref());
    let mut params = PatchParams::apply(manager);
    if patch.force {
        params = params.force();
    }
    ctx.check_write(parent_uid)?;
    match api
        .patch(&patch.key.name, &params, &Patch::Apply(&patch.object))
        .await
    {
        Ok(written) => {
            ctx.patches.remember(parent_uid, patch);
            Ok(Sent::Applied(
                serde_json::to_value(&written).unwrap_or_default(),
            ))
        }
        Err(kube::Error::Api(e)) if target_gone(&e) => {
            ctx.patches.forget(parent_uid, &patch.key);
            Ok(Sent::Gone)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::PatchConflict {
            key: patch.key.to_string(),
            message: e.message.clone(),
        }),
        Err(source) => Err(Error::Apply {
            key: patch.key.to_string(),
            source,
        }),
    }
}

/// Sends every contribution of `plan` not sent yet in this pass with its
/// body (`sent`); a target the API server answered for is observed from
/// then on. Whether anything was written.
pub(in crate::operator) async fn send_all(
    ctx: &RuleCtx,
    rule: &CompiledRule,
    plan: &crate::plan::Plan,
    observed: &mut crate::plan::Observed,
    parent_uid: &str,
    sent: &mut BTreeMap<ObjectKey, String>,
    errors: &mut Vec<Error>,
) -> Result<bool, Error> {
    let manager = crate::plan::field_manager(&rule.name, parent_uid);
    let mut wrote = false;
    for patch in &plan.patches {
        if patch.uid.is_none() || sent.get(&patch.key) == Some(&patch.hash) {
            continue;
        }
        sent.insert(patch.key.clone(), patch.hash.clone());
        match apply_patch(ctx, patch, &manager, parent_uid).await {
            Ok(Sent::Unchanged) | Ok(Sent::Gone) => {}
            Ok(Sent::Applied(target)) => {
                info!(rule = %rule.name, parent_uid, patch = %patch.id, target = %patch.key, "contributed");
                ctx.shared.metrics.child_op(&rule.name, "patch");
                observed.objects.insert(patch.key.clone(), target);
                wrote = true;
            }
            Err(Error::NotLeader(not)) => return Err(not.into()),
            Err(err) => {
                warn!(rule = %rule.name, patch = %patch.id, target = %patch.key, "{err}");
                ctx.count_api_error(&err);
                errors.push(ctx.attribute(err));
            }
        }
    }
    Ok(wrote)
}

/// Takes back every contribution in `releases` (a clean pass's, or a
/// deleted parent's).
pub(in crate::operator) async fn release_all(
    ctx: &RuleCtx,
    rule: &CompiledRule,
    releases: &[Release],
    parent_uid: &str,
    errors: &mut Vec<Error>,
) -> Result<(), Error> {
    let manager = crate::plan::field_manager(&rule.name, parent_uid);
    for r in releases {
        match release_in(ctx, r, &manager, parent_uid).await {
            Ok(()) => {
                info!(rule = %rule.name, target = %r.key, "contribution released");
                ctx.shared.metrics.child_op(&rule.name, "release");
            }
            Err(Error::NotLeader(not)) => return Err(not.into()),
            Err(err) => errors.push(ctx.attribute(err)),
        }
    }
    Ok(())
}

/// Takes back every contribution of a parent being deleted (or leaving the
/// rule): those the caches show under its manager, and those this process
/// sent that the caches may not show yet. `Ok(true)` when there were any.
pub(in crate::operator) async fn release_parent(
    ctx: &RuleCtx,
    rule: &CompiledRule,
    parent_uid: &str,
) -> Result<bool, Error> {
    let manager = crate::plan::field_manager(&rule.name, parent_uid);
    let mut releases: BTreeMap<ObjectKey, Release> = ctx
        .patches
        .of(parent_uid)
        .into_iter()
        .map(|r| (r.key.clone(), r))
        .collect();
    for (key, obj) in crate::plan::RelatedSource::managed_by(&*ctx.related, &manager) {
        releases.insert(key.clone(), Release::of(key, &obj));
    }
    let releases: Vec<Release> = releases.into_values().collect();
    let mut errors = Vec::new();
    release_all(ctx, rule, &releases, parent_uid, &mut errors).await?;
    match errors.into_iter().next() {
        Some(err) => Err(err),
        None => Ok(!releases.is_empty()),
    }
}

/// The `Synced` reason of a pass whose writes failed: `PatchConflict` when a
/// patch met another manager's field, else `ApplyError`.
pub(in crate::operator) fn failure_reason(errors: &[Error]) -> &'static str {
    if errors
        .iter()
        .any(|e| matches!(e, Error::PatchConflict { .. }))
    {
        "PatchConflict"
    } else {
        "ApplyError"
    }
}

/// The API server's answer when the uid the body carries is not the
/// target's: gone (409 "uid mismatch"), or replaced by an object of the
/// same name (422, the uid is immutable), or not there at all.
fn target_gone(e: &kube::core::Status) -> bool {
    e.code == 404
        || (e.code == 409 && e.message.contains("uid mismatch"))
        || (e.code == 422 && e.message.contains("metadata.uid"))
}

/// Takes back one contribution: the empty apply with the same manager.
/// A target gone (or replaced) holds nothing of it any more.
pub(in crate::operator) async fn release(
    api: &kube::Api<DynamicObject>,
    release: &Release,
    manager: &str,
) -> Result<(), Error> {
    match api
        .patch(
            &release.key.name,
            &PatchParams::apply(manager),
            &Patch::Apply(&release.body()),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if target_gone(&e) => Ok(()),
        Err(source) => Err(Error::Apply {
            key: release.key.to_string(),
            source,
        }),
    }
}

/// [`release`] through the rule's writer.
pub(in crate::operator) async fn release_in(
    ctx: &RuleCtx,
    release_of: &Release,
    manager: &str,
    parent_uid: &str,
) -> Result<(), Error> {
    let Some(kind) = target_kind(ctx, &release_of.key) else {
        return Err(Error::Plan(format!(
            "{}: kind not resolved (the rule no longer patches it?)",
            release_of.key
        )));
    };
    let api = ctx.api_for(kind, release_of.key.namespace.as_deref());
    ctx.check_write(parent_uid)?;
    release(&api, release_of, manager).await?;
    ctx.patches.forget(parent_uid, &release_of.key);
    Ok(())
}

/// One `managedFields` entry, as much of it as the caches keep.
#[derive(Serialize, Deserialize)]
struct Manager {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    manager: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    operation: Option<String>,
    #[serde(
        default,
        rename = "apiVersion",
        skip_serializing_if = "Option::is_none"
    )]
    api_version: Option<String>,
}

/// Whether a `managedFields` text holds a string `"trellis/<a>/<b>..."`.
fn mentions_patch_manager(raw: &str) -> bool {
    raw.match_indices("\"trellis/").any(|(at, m)| {
        let rest = &raw[at + m.len()..];
        let end = rest.find('"').unwrap_or(rest.len());
        rest[..end].contains('/')
    })
}

/// Whether `name` is a patch manager: `trellis/<rule>/<parent uid>`.
fn is_patch_manager(name: &str) -> bool {
    name.strip_prefix("trellis/")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(rule, uid)| !rule.is_empty() && !uid.is_empty())
}

/// Of a `managedFields` text, the entries of patch managers (without their
/// fields), as a raw list; `None` when there is none. Only these tell which
/// parents contributed to an object; the rest (which mirror the object's
/// depth) is dropped unparsed.
pub(in crate::operator) fn managers_of_patches(raw: &str) -> Option<Box<RawValue>> {
    // Every child carries `trellis/<rule>`: only a string with one more
    // `/` is worth a parse (this runs on every event of every cache).
    if !mentions_patch_manager(raw) {
        return None;
    }
    let entries: Vec<Manager> = serde_json::from_str(raw).ok()?;
    let kept: Vec<Manager> = entries
        .into_iter()
        .filter(|m| m.manager.as_deref().is_some_and(is_patch_manager))
        .collect();
    if kept.is_empty() {
        return None;
    }
    serde_json::value::to_raw_value(&kept).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caches_keep_only_patch_managers_without_their_fields() {
        let raw = r#"[
            {"manager": "kubectl-create", "operation": "Update", "fieldsV1": {"f:data": {}}},
            {"manager": "trellis/app", "operation": "Apply", "fieldsV1": {"f:data": {}}},
            {"manager": "trellis/app/uid-1", "operation": "Apply", "apiVersion": "v1",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}}
        ]"#;
        let kept = managers_of_patches(raw).expect("one patch manager");
        assert_eq!(
            kept.get(),
            r#"[{"manager":"trellis/app/uid-1","operation":"Apply","apiVersion":"v1"}]"#
        );
        assert!(
            managers_of_patches(r#"[{"manager": "trellis/app", "operation": "Apply"}]"#).is_none(),
            "a child's manager is not a patch manager"
        );
        assert!(managers_of_patches(r#"[{"manager": "kubectl"}]"#).is_none());
        assert!(managers_of_patches("not json \"trellis/a/b\"").is_none());
        assert!(!mentions_patch_manager(
            r#"[{"manager":"trellis/app","fieldsV1":{"f:data":{"f:a/b":{}}}}]"#
        ));
        assert!(mentions_patch_manager(r#"[{"manager":"trellis/app/u1"}]"#));
    }

    #[test]
    fn a_patch_conflict_is_the_reason_of_a_pass_that_met_one() {
        let conflict = Error::PatchConflict {
            key: "Namespace a".into(),
            message: "Apply failed with 1 conflict".into(),
        };
        assert_eq!(failure_reason(&[Error::Plan("x".into())]), "ApplyError");
        assert_eq!(
            failure_reason(&[Error::Plan("x".into()), conflict]),
            "PatchConflict"
        );
    }

    #[test]
    fn a_target_gone_or_replaced_is_told_from_a_conflict() {
        let status = |code, message: &str| kube::core::Status {
            code,
            message: message.to_owned(),
            ..kube::core::Status::default()
        };
        assert!(target_gone(&status(
            409,
            "Operation cannot be fulfilled on configmaps \"t\": uid mismatch: the provided object specified uid u1, and no existing object was found"
        )));
        assert!(target_gone(&status(
            422,
            "ConfigMap \"t\" is invalid: metadata.uid: Invalid value: \"u1\": field is immutable"
        )));
        assert!(target_gone(&status(404, "not found")));
        assert!(!target_gone(&status(
            409,
            "Apply failed with 1 conflict: conflict with \"kubectl-label\" using v1: .metadata.labels.owner"
        )));
    }
}
