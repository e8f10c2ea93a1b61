//! A pass's inputs made up without a cluster, for `trellis render`,
//! `check` and conform's sample renders: the scope of kinds (the rule's
//! hints, then the built-in table) where the operator asks discovery, and
//! observed objects labelled as trellis would have labelled them where the
//! operator reads the labels from the cluster.

use serde_json::{Value, json};

use super::{
    Input, LABEL_CHILD, LABEL_PARENT_UID, LABEL_RULE, ObjectKey, Observed, PLACEHOLDER_UID,
};
use crate::kinds::{self, Gvk, Scope};
use crate::rules::CompiledRule;

/// Scope of a kind offline: for the parent kind, the rule's
/// `spec.parent.scope`, else its generated CRD's (`crd:`); else the built-in
/// table (children may override it per child).
pub fn offline_scope(rule: &CompiledRule) -> impl Fn(&Gvk) -> Scope + '_ {
    let hint = rule.rule.spec.parent.scope.or_else(|| {
        rule.rule
            .spec
            .crd
            .as_ref()
            .map(|_| crate::rules::crd::scope(&rule.rule))
    });
    offline_scope_with(rule, hint)
}

/// Like [`offline_scope`], with the parent kind's scope given. A child's or
/// related entry's `scope:` hint comes next, then the built-in table. Hints
/// are offline only: on a live cluster discovery alone says (the planner
/// never reads them), so a wrong hint cannot move a child's namespace.
pub fn offline_scope_with(rule: &CompiledRule, hint: Option<Scope>) -> impl Fn(&Gvk) -> Scope + '_ {
    move |gvk: &Gvk| {
        if gvk.group == rule.parent.group
            && gvk.kind == rule.parent.kind
            && let Some(scope) = hint
        {
            return scope;
        }
        let same = |g: &Gvk| g.group == gvk.group && g.kind == gvk.kind;
        let children = rule
            .children
            .iter()
            .filter(|c| same(&c.gvk))
            .map(|c| c.spec.scope);
        let related = rule
            .related
            .iter()
            .filter(|r| same(&r.gvk))
            .map(|r| r.spec.scope);
        children
            .chain(related)
            .flatten()
            .next()
            .unwrap_or_else(|| kinds::scope(gvk))
    }
}

/// Gives unlabelled observed objects the labels trellis would have put on
/// them, by matching kind and name against a render. Hand-written
/// `--observed` files can then omit the labels.
///
/// A child held back by `dependsOn` is only rendered once its dependencies
/// are found ready, so this labels, renders again and labels again until a
/// pass labels nothing new (each pass that does adds at least one child id).
pub fn label_observed(
    rule: &CompiledRule,
    parent: &Value,
    mut observed: Vec<Value>,
    now: &str,
    scope_of: &dyn Fn(&Gvk) -> Scope,
) -> Observed {
    let uid = parent
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or(PLACEHOLDER_UID)
        .to_owned();
    for _ in 0..=rule.children.len() {
        let labelled = Observed::from_objects(observed.iter().cloned());
        let trial = super::plan(
            rule,
            &Input {
                parent,
                observed: &labelled,
                now,
                scope_of,
                clusters: &crate::clusters::Clusters::offline(),
            },
        );
        let mut changed = false;
        for obj in &mut observed {
            let has_label = obj
                .pointer("/metadata/labels")
                .and_then(|l| l.get(LABEL_CHILD))
                .is_some();
            if has_label {
                continue;
            }
            let Some(key) = ObjectKey::placed(obj) else {
                continue;
            };
            // The namespace counts when the file gives one: a related
            // object (config-propagation's source ConfigMap) shares its
            // copies' kind and name, and is not one of them.
            let Some(apply) = trial.apply.iter().find(|a| {
                a.key.group == key.group
                    && a.key.kind == key.kind
                    && a.key.name == key.name
                    && a.key.cluster == key.cluster
                    && (key.namespace.is_none() || key.namespace == a.key.namespace)
            }) else {
                continue;
            };
            let meta = &mut obj["metadata"];
            if meta.get("namespace").is_none()
                && let Some(ns) = &apply.key.namespace
            {
                meta["namespace"] = json!(ns);
            }
            let labels = &mut meta["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            labels[LABEL_RULE] = json!(rule.name);
            labels[LABEL_CHILD] = json!(apply.id);
            labels[LABEL_PARENT_UID] = json!(uid);
            changed = true;
        }
        if !changed {
            break;
        }
    }
    Observed::from_objects(observed)
}
