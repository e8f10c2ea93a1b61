//! Which related watches a rule needs, decided from the rule alone: a
//! selector with no template in it is a label-selected watch; anything else
//! watches the whole kind, in the parent's namespaces unless an entry may
//! read elsewhere.
//!
//! Pure, so that both the operator (which runs these watches) and hot
//! reload (which restarts a rule whose watches change) ask the same
//! question of the core. Running the watches is the operator's
//! (`operator::watches::related` in the binary crate).

use std::collections::BTreeMap;

use crate::kinds::Gvk;
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
/// Entries read from other clusters (`cluster:`) are not among them: see
/// [`spoke_watch_specs`].
pub fn watch_specs(rule: &CompiledRule) -> Vec<WatchSpec> {
    let mut by_kind: BTreeMap<Gvk, Vec<&RelatedSpec>> = BTreeMap::new();
    for entry in rule.related.iter().filter(|e| e.cluster.is_none()) {
        by_kind
            .entry(entry.gvk.clone())
            .or_default()
            .push(&entry.spec);
    }
    for patch in &rule.patches {
        by_kind.entry(patch.gvk.clone()).or_default();
    }
    specs_by_kind(rule, by_kind)
}

/// The watches every spoke keeps for the entries a rule reads there
/// (`cluster:` on a related entry): decided as at home, per kind, from
/// those entries only (patches are never placed in spokes).
pub fn spoke_watch_specs(rule: &CompiledRule) -> Vec<WatchSpec> {
    let mut by_kind: BTreeMap<Gvk, Vec<&RelatedSpec>> = BTreeMap::new();
    for entry in rule.related.iter().filter(|e| e.cluster.is_some()) {
        by_kind
            .entry(entry.gvk.clone())
            .or_default()
            .push(&entry.spec);
    }
    specs_by_kind(rule, by_kind)
}

fn specs_by_kind(rule: &CompiledRule, by_kind: BTreeMap<Gvk, Vec<&RelatedSpec>>) -> Vec<WatchSpec> {
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
            .map(|e| static_selector(e).map(|s| s.query()))
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
pub fn reads_match_labels(rule: &CompiledRule, gvk: &Gvk) -> bool {
    rule.related.iter().any(|e| {
        &e.gvk == gvk
            && e.spec
                .selector
                .as_ref()
                .is_some_and(|s| s.match_labels.is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n";
    const CHILD: &str = "  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n";

    fn specs(related: &str) -> Vec<WatchSpec> {
        let rule =
            crate::rules::testing::rule_with_spec(&format!("{PARENT}  related:\n{related}{CHILD}"));
        assert_eq!(
            rule.related.len(),
            related.matches("- id:").count(),
            "rule loads"
        );
        watch_specs(&rule)
    }

    #[test]
    fn a_static_selector_is_a_label_selected_watch() {
        let s = specs(
            "    - id: envs\n      apiVersion: v1\n      kind: Namespace\n      selector:\n        matchLabels: {env: prod}\n        matchExpressions:\n          - {key: tier, operator: In, values: [a, b]}\n",
        );
        assert_eq!(
            s,
            vec![WatchSpec {
                gvk: Gvk::new("v1", "Namespace"),
                labels: Some("env=prod,tier in (a,b)".into()),
                anywhere: false,
                patched: false,
            }]
        );
    }

    #[test]
    fn a_templated_selector_or_a_name_watches_the_whole_kind() {
        let s = specs(
            "    - id: envs\n      apiVersion: v1\n      kind: Namespace\n      selector:\n        matchLabels: {env: \"{{ spec.env }}\"}\n    - id: settings\n      apiVersion: v1\n      kind: ConfigMap\n      name: \"{{ spec.from }}\"\n",
        );
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|w| w.labels.is_none()), "{s:?}");
    }

    #[test]
    fn a_name_read_of_a_kind_also_serves_its_static_selectors() {
        let s = specs(
            "    - id: sel\n      apiVersion: v1\n      kind: ConfigMap\n      selector:\n        matchLabels: {a: b}\n    - id: one\n      apiVersion: v1\n      kind: ConfigMap\n      name: fixed\n      allowCrossNamespace: true\n      namespace: other\n",
        );
        assert_eq!(
            s,
            vec![WatchSpec {
                gvk: Gvk::new("v1", "ConfigMap"),
                labels: None,
                anywhere: true,
                patched: false,
            }]
        );
    }

    #[test]
    fn an_empty_selector_watches_the_whole_kind() {
        let s = specs(
            "    - id: all\n      apiVersion: v1\n      kind: Namespace\n      selector: {}\n",
        );
        assert_eq!(s[0].labels, None);
    }

    #[test]
    fn a_patch_target_kind_is_one_whole_kind_watch_that_keeps_patch_managers() {
        let rule = crate::rules::testing::rule_with_spec(
            "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  related:\n    - id: sel\n      apiVersion: v1\n      kind: Namespace\n      selector:\n        matchLabels: {a: b}\n  patches:\n    - id: ns\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      template: '{metadata: {name: x, labels: {t: u}}}'\n",
        );
        assert_eq!(
            watch_specs(&rule),
            vec![WatchSpec {
                gvk: Gvk::new("v1", "Namespace"),
                labels: None,
                anywhere: true,
                patched: true,
            }]
        );
    }

    #[test]
    fn entries_read_in_spokes_are_watched_there_not_at_home() {
        let s = specs(
            "    - id: here\n      apiVersion: v1\n      kind: Secret\n      name: a\n    - id: there\n      apiVersion: v1\n      kind: ConfigMap\n      cluster: spec.region\n      selector:\n        matchLabels: {app: x}\n",
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].gvk, Gvk::new("v1", "Secret"));
        let rule = crate::rules::testing::rule_with_spec(&format!(
            "{PARENT}  related:\n    - id: there\n      apiVersion: v1\n      kind: ConfigMap\n      cluster: spec.region\n      selector:\n        matchLabels: {{app: x}}\n{CHILD}"
        ));
        assert_eq!(
            spoke_watch_specs(&rule),
            vec![WatchSpec {
                gvk: Gvk::new("v1", "ConfigMap"),
                labels: Some("app=x".into()),
                anywhere: false,
                patched: false,
            }]
        );
    }
}
