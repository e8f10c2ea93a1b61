//! One pass offline, as `trellis render` prints it and the golden tests,
//! `check` and the LSP use it: which rule takes a parent and the document a
//! pass prints. The pass's inputs made up without a cluster (the scope of
//! kinds, observed objects labelled as trellis would have labelled them)
//! are `crate::plan::offline_input`'s.

use serde_json::{Value, json};

use crate::crd::offline::OfflineCrds;
use crate::kinds::Gvk;
use crate::plan::offline_input::{label_observed, offline_scope_with};
use crate::plan::{self, Input, ObjectKey, Observed};
use crate::rules::{CompiledRule, RuleSet};

/// Why no one rule takes a parent.
#[derive(Debug, thiserror::Error)]
pub enum NoRule {
    /// Rules of the parent's kind exist and none selects it: (rule, why).
    #[error("{}", not_selected(.0))]
    NotSelected(Vec<(String, String)>),
    #[error("no rule matches a parent of kind {0}")]
    NoneOfKind(Gvk),
    #[error("several rules match a parent of kind {gvk}: {}", names.join(", "))]
    Several { gvk: Gvk, names: Vec<String> },
}

fn not_selected(rules: &[(String, String)]) -> String {
    rules
        .iter()
        .map(|(name, why)| format!("rule {name} does not select this parent: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The rule for a parent object: same apiVersion/kind, and its namespaces and
/// selector (if any) match.
pub fn rule_for<'a>(set: &'a RuleSet, parent: &Value) -> Result<&'a CompiledRule, NoRule> {
    let api_version = parent
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = parent
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let gvk = Gvk::new(api_version, kind);
    let of_kind: Vec<&CompiledRule> = set.for_parent(&gvk).map(|r| r.as_ref()).collect();
    let candidates: Vec<&CompiledRule> = of_kind
        .iter()
        .copied()
        .filter(|r| crate::plan::parent_matches(r, parent))
        .collect();
    match candidates.as_slice() {
        [] if !of_kind.is_empty() => Err(NoRule::NotSelected(
            of_kind
                .iter()
                .map(|r| {
                    let why = crate::plan::why_not_selected(r, parent).unwrap_or_default();
                    (r.name.clone(), why)
                })
                .collect(),
        )),
        [] => Err(NoRule::NoneOfKind(gvk)),
        [one] => Ok(one),
        many => Err(NoRule::Several {
            gvk,
            names: many.iter().map(|r| r.name.clone()).collect(),
        }),
    }
}

/// Counts the parent file as observed: the operator's caches hold the
/// parent, so a patch of the parent itself (or a related entry reading it)
/// finds it there, and offline it must too. A parent file without a uid
/// takes the placeholder that labels and ownerReferences use; a copy of
/// the parent in `--observed` gives way to the file, which is the parent
/// this pass renders for.
fn observe_parent(observed: &mut Observed, parent: &Value) {
    let Some(key) = ObjectKey::of(parent) else {
        return;
    };
    let mut object = parent.clone();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.entry("uid")
            .or_insert_with(|| json!(plan::PLACEHOLDER_UID));
    }
    observed.objects.insert(key, object);
}

/// The document `trellis render` prints.
pub fn render_document(
    rule: &CompiledRule,
    parent: &Value,
    observed: Vec<Value>,
    now: &str,
) -> Value {
    render_document_with(rule, parent, observed, now, None)
}

/// One pass offline: the planner's [`plan::Plan`] for a parent and the
/// observed objects as the pass saw them (labelled, the parent counted).
/// `render` prints it and `trellis test` matches it: one pass for both.
pub struct Pass {
    pub plan: plan::Plan,
    pub observed: Observed,
}

/// The pass for `parent`, with CRD manifests (`--crds`) when given: the
/// parent's scope comes from its CRD, and its spec is checked against the
/// CRD's schema.
pub fn pass(
    rule: &CompiledRule,
    parent: &Value,
    observed: Vec<Value>,
    now: &str,
    crds: Option<&OfflineCrds>,
) -> Pass {
    let scope_of = offline_scope_with(rule, crate::crd::offline::parent_scope(rule, parent, crds));
    let mut observed = label_observed(rule, parent, observed, now, &scope_of);
    observe_parent(&mut observed, parent);
    let input = Input {
        parent,
        observed: &observed,
        now,
        scope_of: &scope_of,
        clusters: &crate::clusters::Clusters::offline(),
    };
    // A parent its CRD refuses would not even be stored: nothing to render.
    let refusals = crds
        .and_then(|c| c.find(&rule.parent))
        .map(|(_, version)| crate::crd::offline::validate_parent(version, parent))
        .unwrap_or_default();
    let mut plan = plan::plan(rule, &input);
    if !refusals.is_empty() {
        // What the pass would also have said is worth knowing too.
        let mut errors = std::mem::take(&mut plan.errors);
        errors.extend(refusals);
        plan = plan::refused_by_crd(rule, &input, errors);
    }
    Pass { plan, observed }
}

/// [`render_document`], with CRD manifests (`--crds`): the parent's scope
/// comes from its CRD, and its spec is checked against the CRD's schema.
pub fn render_document_with(
    rule: &CompiledRule,
    parent: &Value,
    observed: Vec<Value>,
    now: &str,
    crds: Option<&OfflineCrds>,
) -> Value {
    let Pass { plan, observed } = pass(rule, parent, observed, now, crds);
    // `createOnly` children that exist are never sent again: show them apart.
    let (kept, applied): (Vec<_>, Vec<_>) = plan.apply.iter().partition(|a| {
        a.policy == crate::rules::model::Policy::CreateOnly && observed.objects.contains_key(&a.key)
    });
    let mut doc = json!({
        "children": applied.iter().map(|a| a.object.clone()).collect::<Vec<_>>(),
        "status": plan.status,
        "pending": plan.pending,
        "rule": rule.name,
    });
    if plan.apply.iter().any(|a| a.key.cluster.is_some()) {
        // Where each child goes, when any goes to another cluster: the
        // objects themselves do not say (nothing on them names the cluster).
        doc["clusters"] = json!(
            applied
                .iter()
                .map(|a| json!({
                    "child": a.id,
                    "object": ObjectKey { cluster: None, ..a.key.clone() }.to_string(),
                    "cluster": a.key.cluster.as_deref().unwrap_or(crate::clusters::LOCAL),
                }))
                .collect::<Vec<_>>()
        );
    }
    if !rule.patches.is_empty() {
        // Contributions as they would be sent; one whose target is missing
        // (pending, TargetNotFound) has no uid and is not sent.
        doc["patches"] = json!(
            plan.patches
                .iter()
                .map(|p| p.object.clone())
                .collect::<Vec<_>>()
        );
    }
    if !plan.release.is_empty() {
        doc["release"] = json!(
            plan.release
                .iter()
                .map(|r| r.key.to_string())
                .collect::<Vec<_>>()
        );
    }
    if !plan.retain.is_empty() {
        doc["retain"] = json!(
            plan.retain
                .iter()
                .map(|d| d.key.to_string())
                .collect::<Vec<_>>()
        );
    }
    if !kept.is_empty() {
        doc["unchanged"] = json!(kept.iter().map(|a| a.key.to_string()).collect::<Vec<_>>());
    }
    if !plan.delete.is_empty() {
        doc["delete"] = json!(
            plan.delete
                .iter()
                .map(|d| d.key.to_string())
                .collect::<Vec<_>>()
        );
    }
    if !plan.errors.is_empty() {
        doc["errors"] = json!(plan.errors);
    }
    doc
}

#[cfg(test)]
mod tests;
