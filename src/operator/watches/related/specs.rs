//! Which related watches a rule needs, decided from the rule alone: a
//! selector with no template in it is a label-selected watch; anything else
//! watches the whole kind, in the parent's namespaces unless an entry may
//! read elsewhere.

use std::collections::BTreeMap;

use crate::kinds::Gvk;
use crate::operator::watches::selector_string;
use crate::rules::CompiledRule;
use crate::rules::model::{
    LabelSelector, LabelSelectorRequirement, RelatedSpec, TemplatedExpressions, TemplatedLabels,
};

/// One related watch a rule needs, decided from the rule alone (so a reload
/// that changes it restarts the rule's watches).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WatchSpec {
    pub gvk: Gvk,
    /// A static selector's label selector string: the watch lists only
    /// what it selects. `None`: the whole kind.
    pub labels: Option<String>,
    /// Some entry may read outside the parent's namespace
    /// (`allowCrossNamespace`, `allNamespaces`).
    pub anywhere: bool,
    /// Patch targets of this kind: a whole-kind watch that keeps the
    /// patch managers of `managedFields`, indexed by manager.
    pub patched: bool,
}

/// `{{`, `{%` or `{#`: a template, not a literal.
fn is_templated(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// The entry's selector when nothing in it is templated.
fn static_selector(spec: &RelatedSpec) -> Option<LabelSelector> {
    let sel = spec.selector.as_ref()?;
    let mut out = LabelSelector::default();
    match &sel.match_labels {
        None => {}
        Some(TemplatedLabels::Map(map)) => {
            for (k, v) in map {
                if is_templated(v) {
                    return None;
                }
                out.match_labels.insert(k.clone(), v.clone());
            }
        }
        Some(TemplatedLabels::Template(_)) => return None,
    }
    match &sel.match_expressions {
        None => {}
        Some(TemplatedExpressions::List(list)) => {
            for req in list {
                if req.values.iter().any(|v| is_templated(v)) {
                    return None;
                }
                out.match_expressions.push(LabelSelectorRequirement {
                    key: req.key.clone(),
                    operator: req.operator,
                    values: req.values.clone(),
                });
            }
        }
        Some(TemplatedExpressions::Template(_)) => return None,
    }
    Some(out)
}

/// The related watches of a rule: per kind, one watch of the whole kind when
/// any entry of it names objects or has a templated selector; otherwise one
/// label-selected watch per distinct static selector.
pub fn watch_specs(rule: &CompiledRule) -> Vec<WatchSpec> {
    let mut by_kind: BTreeMap<Gvk, Vec<&RelatedSpec>> = BTreeMap::new();
    for entry in &rule.related {
        by_kind
            .entry(entry.gvk.clone())
            .or_default()
            .push(&entry.spec);
    }
    for patch in &rule.patches {
        by_kind.entry(patch.gvk.clone()).or_default();
    }
    let mut out = Vec::new();
    for (gvk, entries) in by_kind {
        let anywhere = entries
            .iter()
            .any(|e| e.allow_cross_namespace || e.all_namespaces);
        let patches: Vec<_> = rule.patches.iter().filter(|p| p.gvk == gvk).collect();
        if !patches.is_empty() {
            // Targets are read by name: the whole kind.
            out.push(WatchSpec {
                gvk,
                labels: None,
                anywhere: anywhere || patches.iter().any(|p| p.spec.allow_cross_namespace),
                patched: true,
            });
            continue;
        }
        let selectors: Option<Vec<String>> = entries
            .iter()
            .map(|e| static_selector(e).map(|s| selector_string(&s)))
            .collect();
        match selectors {
            // An empty selector selects everything: a whole-kind watch.
            Some(mut labels) if labels.iter().all(|l| !l.is_empty()) => {
                labels.sort();
                labels.dedup();
                out.extend(labels.into_iter().map(|l| WatchSpec {
                    gvk: gvk.clone(),
                    labels: Some(l),
                    anywhere,
                    patched: false,
                }));
            }
            _ => out.push(WatchSpec {
                gvk,
                labels: None,
                anywhere,
                patched: false,
            }),
        }
    }
    out
}

/// Whether some entry of `gvk` reads by a selector with `matchLabels` (its
/// whole-kind watch then keeps a [`LabelIndex`]).
pub(super) fn reads_match_labels(rule: &CompiledRule, gvk: &Gvk) -> bool {
    rule.related.iter().any(|e| {
        &e.gvk == gvk
            && e.spec
                .selector
                .as_ref()
                .is_some_and(|s| s.match_labels.is_some())
    })
}
