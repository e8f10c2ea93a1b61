//! Releasing a retained child (`deletionPolicy: retain`): the object stays,
//! and nothing of trellis's stays on it.
//!
//! One write, not an apply (an apply by trellis's manager would remove the
//! fields it owns, values included): a merge patch, guarded by the object's
//! `resourceVersion`, that removes the ownerReference to the parent, every
//! `trellis.dev/` label and annotation and `app.kubernetes.io/managed-by:
//! trellis`, and replaces `metadata.managedFields` by the entries of every
//! other manager (the API server then records no entry for this write, which
//! only removes fields). The values stay, unowned; the garbage collector
//! leaves the object, and no field manager named `trellis…` remains.

use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::{Map, Value, json};

use tracing::info;

use crate::operator::context::{Error, RuleCtx};
use crate::operator::watches::discovery::Resolved;
use crate::plan::{LABEL_MANAGED_BY, LABEL_PARENT_UID, MANAGED_BY};

/// The merge patch that releases `obj` (as read live, with its
/// `managedFields`); `None` when nothing of trellis's is left on it.
pub fn release_patch(obj: &Value) -> Option<Value> {
    let meta = obj.get("metadata")?;
    let parent_uid = meta
        .pointer(&format!("/labels/{}", LABEL_PARENT_UID.replace('/', "~1")))
        .and_then(Value::as_str);
    let mut out = Map::new();
    let mut changed = false;
    for map in ["labels", "annotations"] {
        let Some(entries) = meta.get(map).and_then(Value::as_object) else {
            continue;
        };
        let gone: Map<String, Value> = entries
            .iter()
            .filter(|(k, v)| {
                k.starts_with("trellis.dev/")
                    || (map == "labels"
                        && k.as_str() == LABEL_MANAGED_BY
                        && v.as_str() == Some(MANAGED_BY))
            })
            .map(|(k, _)| (k.clone(), Value::Null))
            .collect();
        if !gone.is_empty() {
            changed = true;
            out.insert(map.into(), Value::Object(gone));
        }
    }
    if let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) {
        let kept: Vec<&Value> = refs
            .iter()
            .filter(|r| parent_uid.is_none_or(|uid| r["uid"] != uid))
            .collect();
        if kept.len() != refs.len() {
            changed = true;
            out.insert("ownerReferences".into(), json!(kept));
        }
    }
    if let Some(managers) = meta.get("managedFields").and_then(Value::as_array) {
        let kept: Vec<&Value> = managers
            .iter()
            .filter(|m| {
                !m["manager"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("trellis")
            })
            .collect();
        if kept.len() != managers.len() {
            changed = true;
            // An empty list would keep the live entries: one empty entry
            // clears them all.
            out.insert(
                "managedFields".into(),
                if kept.is_empty() {
                    json!([{}])
                } else {
                    json!(kept)
                },
            );
        }
    }
    if !changed {
        return None;
    }
    if let Some(rv) = meta.get("resourceVersion") {
        out.insert("resourceVersion".into(), rv.clone());
    }
    Some(json!({ "metadata": out }))
}

/// The field manager of the release write. It records nothing (the write
/// only removes fields), and is not named `trellis…` should it ever do.
const RELEASE_MANAGER: &str = "retained-release";

/// Releases the object `name` through `api`: read live (the caches keep no
/// `managedFields`), patched, read again when someone wrote in between.
/// `Ok(false)` when it is gone or holds nothing of trellis's.
pub async fn release_child(
    api: &kube::Api<DynamicObject>,
    name: &str,
) -> Result<bool, kube::Error> {
    let params = PatchParams {
        field_manager: Some(RELEASE_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    for _ in 0..5 {
        let Some(live) = api.get_opt(name).await? else {
            return Ok(false);
        };
        let live = serde_json::to_value(&live).unwrap_or_default();
        let Some(patch) = release_patch(&live) else {
            return Ok(false);
        };
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            // Someone wrote since the read: read again.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(err) => return Err(err),
        }
    }
    Err(kube::Error::Api(Box::new(kube::core::Status {
        code: 409,
        message: format!("{name} keeps changing under trellis: release it again later"),
        ..kube::core::Status::default()
    })))
}

/// Releases every retained child in `retain` (no longer rendered, or of a
/// deleted parent) through the rule's writer.
pub(in crate::operator) async fn retain_all(
    ctx: &RuleCtx,
    rule: &crate::rules::CompiledRule,
    retain: &[crate::plan::Delete],
    parent_uid: &str,
    errors: &mut Vec<Error>,
) -> Result<(), Error> {
    for child in retain {
        let Some(kind) = ctx.child_kind(&child.key.group, &child.key.kind) else {
            continue;
        };
        let api = ctx.api_for(kind, child.key.namespace.as_deref());
        ctx.check_write(parent_uid)?;
        match release_child(&api, &child.key.name).await {
            Ok(true) => {
                info!(rule = %rule.name, child = %child.id, object = %child.key, "released (deletionPolicy: retain)");
                ctx.shared.metrics.child_op(&rule.name, "release");
            }
            Ok(false) => {}
            Err(source) => errors.push(ctx.attribute(Error::Apply {
                key: child.key.to_string(),
                source,
            })),
        }
    }
    Ok(())
}

/// What both clean-ups after a removed rule start from.
struct Removed {
    /// The parents whose children and contributions are released.
    uids: std::collections::BTreeSet<String>,
    /// The rule's account's client: the rule's writes, even after it.
    writer: kube::Client,
    /// Where the rule's parents were watched.
    ours: Vec<Option<String>>,
}

impl Removed {
    /// `None`: nothing to do (no parents, or this replica may not write).
    fn of(
        shared: &crate::operator::Shared,
        rule: &crate::rules::CompiledRule,
        parents: &[DynamicObject],
    ) -> Option<Removed> {
        use kube::ResourceExt;
        let uids: std::collections::BTreeSet<String> =
            parents.iter().filter_map(|p| p.uid()).collect();
        if uids.is_empty() || !shared.gate.may_write() {
            return None;
        }
        Some(Removed {
            uids,
            writer: shared
                .identities
                .client(rule.rule.spec.service_account_name.as_deref()),
            ours: crate::operator::supervisor::scopes(rule, &shared.namespaces),
        })
    }

    /// `obj`'s `Api`, as the rule's account.
    fn api(&self, kind: &Resolved, obj: &DynamicObject) -> kube::Api<DynamicObject> {
        use kube::ResourceExt;
        kind.api(self.writer.clone(), obj.namespace().as_deref())
    }
}

/// After a rule is removed: its retained children of `parents` are
/// released, and with `contributions` (`onRuleRemoved: delete`) every patch
/// contribution of those parents is taken back. Found by live lists (the
/// rule's caches are gone), written as the rule's account.
pub(in crate::operator) async fn after_rule_removed(
    shared: &crate::operator::Shared,
    rule: &crate::rules::CompiledRule,
    kinds: &crate::operator::watches::discovery::RuleKinds,
    parents: &[DynamicObject],
    contributions: bool,
) {
    use kube::ResourceExt;
    use kube::api::ListParams;
    let Some(removed) = Removed::of(shared, rule, parents) else {
        return;
    };
    let everywhere = vec![None];
    let selector = ListParams::default().labels(&format!(
        "{}={},{}={}",
        crate::plan::LABEL_RULE,
        rule.name,
        crate::plan::LABEL_DELETION_POLICY,
        crate::plan::RETAIN
    ));
    for kind in &kinds.children {
        let anywhere = crate::operator::watches::children_anywhere(rule, &kind.gvk);
        let scopes = if anywhere { &everywhere } else { &removed.ours };
        let list = match crate::operator::supervisor::list_in(shared, kind, scopes, &selector).await
        {
            Ok(list) => list,
            Err(err) => {
                tracing::warn!(rule = %rule.name, kind = %kind.gvk, "cannot list retained children: {err}");
                continue;
            }
        };
        for child in list {
            let mine = child
                .labels()
                .get(LABEL_PARENT_UID)
                .is_some_and(|u| removed.uids.contains(u));
            if !mine || shared.gate.check().is_err() {
                continue;
            }
            match release_child(&removed.api(kind, &child), &child.name_any()).await {
                Ok(_) => {
                    info!(rule = %rule.name, kind = %kind.gvk, name = %child.name_any(), "released (deletionPolicy: retain; rule removed)")
                }
                Err(err) => {
                    tracing::warn!(rule = %rule.name, name = %child.name_any(), "cannot release retained child: {err}")
                }
            }
        }
    }
    if contributions {
        release_contributions(shared, rule, &kinds.related, parents).await;
    }
}

/// Takes back every contribution of `parents` (their rule's patches) to
/// objects of `kinds`, found by a live list of each kind the rule patches.
pub(in crate::operator) async fn release_contributions(
    shared: &crate::operator::Shared,
    rule: &crate::rules::CompiledRule,
    kinds: &[Resolved],
    parents: &[DynamicObject],
) {
    use kube::api::ListParams;
    let Some(removed) = Removed::of(shared, rule, parents) else {
        return;
    };
    let everywhere = vec![None];
    for kind in kinds {
        let patches: Vec<_> = rule.patches.iter().filter(|p| p.gvk == kind.gvk).collect();
        if patches.is_empty() {
            continue;
        }
        let anywhere = patches.iter().any(|p| p.spec.allow_cross_namespace);
        let scopes = if anywhere || !kind.namespaced {
            &everywhere
        } else {
            &removed.ours
        };
        let list = match crate::operator::supervisor::list_in(
            shared,
            kind,
            scopes,
            &ListParams::default(),
        )
        .await
        {
            Ok(list) => list,
            Err(err) => {
                tracing::warn!(rule = %rule.name, kind = %kind.gvk, "cannot list patch targets: {err}");
                continue;
            }
        };
        for target in list {
            let mut value = serde_json::to_value(&target).unwrap_or_default();
            // List items may come without their types.
            value["apiVersion"] = json!(kind.gvk.api_version());
            value["kind"] = json!(kind.gvk.kind);
            let Some(key) = crate::plan::ObjectKey::of(&value) else {
                continue;
            };
            for uid in &removed.uids {
                let manager = crate::plan::field_manager(&rule.name, uid);
                if !crate::plan::has_manager(&value, &manager) || shared.gate.check().is_err() {
                    continue;
                }
                let release = crate::plan::Release::of(key.clone(), &value);
                match super::patch_writes::release(&removed.api(kind, &target), &release, &manager)
                    .await
                {
                    Ok(()) => {
                        info!(rule = %rule.name, target = %key, "contribution released (rule removed with onRuleRemoved: delete, or the kind no longer patched)")
                    }
                    Err(err) => {
                        tracing::warn!(rule = %rule.name, target = %key, "cannot release contribution: {err}")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_removes_owner_labels_annotations_and_trellis_managers_only() {
        let live = json!({"metadata": {
            "name": "data", "resourceVersion": "42",
            "labels": {"app.kubernetes.io/managed-by": "trellis", "trellis.dev/rule": "team",
                       "trellis.dev/child": "data", "trellis.dev/parent-uid": "p1",
                       "trellis.dev/deletion-policy": "retain", "app": "db"},
            "annotations": {"trellis.dev/render-hash": "abc", "note": "keep"},
            "ownerReferences": [
                {"kind": "Team", "name": "t", "uid": "p1", "controller": true},
                {"kind": "Other", "name": "o", "uid": "x9"}],
            "managedFields": [
                {"manager": "trellis/team", "operation": "Apply"},
                {"manager": "kube-controller-manager", "operation": "Update"}]}});
        let patch = release_patch(&live).expect("something to release");
        assert_eq!(
            patch,
            json!({"metadata": {
                "labels": {"app.kubernetes.io/managed-by": null, "trellis.dev/rule": null,
                           "trellis.dev/child": null, "trellis.dev/parent-uid": null,
                           "trellis.dev/deletion-policy": null},
                "annotations": {"trellis.dev/render-hash": null},
                "ownerReferences": [{"kind": "Other", "name": "o", "uid": "x9"}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}],
                "resourceVersion": "42"}})
        );
    }

    #[test]
    fn a_release_of_an_object_only_trellis_managed_clears_managed_fields() {
        let live = json!({"metadata": {"name": "d", "resourceVersion": "1",
            "labels": {"trellis.dev/rule": "r"},
            "managedFields": [{"manager": "trellis/r", "operation": "Apply"}]}});
        let patch = release_patch(&live).unwrap();
        assert_eq!(patch["metadata"]["managedFields"], json!([{}]));
        assert!(patch["metadata"].get("ownerReferences").is_none());
    }

    #[test]
    fn nothing_of_trellis_left_means_no_write() {
        let live = json!({"metadata": {"name": "d", "labels": {"app": "x"},
            "managedFields": [{"manager": "kubectl", "operation": "Update"}]}});
        assert_eq!(release_patch(&live), None);
    }
}
