//! Rules that load and render, and still surprise at run time: `check`
//! warns about them. Here: a child that reads a required related object
//! only through a var. Vars add no dependency (the contract: a var sees
//! whatever is observed), so while the object is missing the child is not
//! held back as `RelatedNotFound`: it renders without the object, or its
//! var fails and the whole pass errors. `dependsOn: [<related>]` holds it back as a direct read would.
//! (Reserved labels in templates are `conform::reserved_labels`'.)

use std::collections::{BTreeMap, BTreeSet};

use crate::render::scan_calls;
use crate::rules::{CompiledRule, Diagnostic};

/// A warning per (child, related entry) read only through vars.
pub fn required_related_through_vars(rule: &CompiledRule) -> Vec<Diagnostic> {
    let via = related_read_by_vars(rule);
    let mut out = Vec::new();
    for (i, child) in rule.children.iter().enumerate() {
        let vars: Vec<&str> = rule
            .vars
            .iter()
            .map(|v| v.name.as_str())
            .filter(|name| child.reads_vars.any || child.reads_vars.names.contains(*name))
            .collect();
        // related index → the first var the child reads it through.
        let mut through: BTreeMap<usize, &str> = BTreeMap::new();
        for name in vars {
            for &k in via.get(name).into_iter().flatten() {
                through.entry(k).or_insert(name);
            }
        }
        for (k, var) in through {
            let related = &rule.related[k].spec;
            // A `selector:` entry is a list, empty when nothing matches; an
            // optional one holds nothing back by design.
            if related.optional || related.name.is_none() || child.depends_on_related.contains(&k) {
                continue;
            }
            let at = format!("spec.children[{i}]");
            out.push(Diagnostic::warning(
                &rule.file,
                rule.lines.line_of(&format!("{at}.id")),
                &at,
                format!(
                    "child `{}` reads related `{}` only through var `{var}`, and vars add no \
                     dependency: while `{}` is missing the child is not held back (pending, \
                     RelatedNotFound), it renders without it or the var fails the pass; add \
                     `dependsOn: [{}]` to the child",
                    child.spec.id, related.id, related.id, related.id
                ),
            ));
        }
    }
    out
}

/// Var name → the related entries it reads, itself or through the vars
/// before it.
fn related_read_by_vars(rule: &CompiledRule) -> BTreeMap<&str, BTreeSet<usize>> {
    let mut via: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for (var, spec) in rule.vars.iter().zip(&rule.rule.spec.vars) {
        // As the compiler reads them: an expression is scanned as `{{ expr }}`.
        let calls = match (&spec.value, &spec.template) {
            (Some(value), _) => scan_calls(&format!("{{{{ {value} }}}}")),
            (None, Some(template)) => scan_calls(template),
            (None, None) => continue,
        };
        let mut reads: BTreeSet<usize> = calls
            .reads
            .iter()
            .filter(|(root, _)| root == "related")
            .filter_map(|(_, id)| rule.related.iter().position(|r| &r.spec.id == id))
            .collect();
        if calls.dynamic.contains("related") {
            reads.extend(0..rule.related.len());
        }
        for (name, before) in &via {
            if var.reads.any || var.reads.names.contains(*name) {
                reads.extend(before.iter().copied());
            }
        }
        via.insert(&var.name, reads);
    }
    via
}

#[cfg(test)]
mod tests {
    use super::required_related_through_vars;

    const RULE: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}
  related:
    - {id: source, apiVersion: v1, kind: ConfigMap, name: src}
    - {id: maybe, apiVersion: v1, kind: ConfigMap, name: opt, optional: true}
    - {id: all, apiVersion: v1, kind: ConfigMap, selector: {}}
  vars:
    - {name: data, value: related.source.data}
    - {name: copy, value: vars.data}
    - {name: others, value: \"related.maybe is defined and related.all | length > 0\"}
  children:
    - id: through-vars
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: a}
        data: {{ vars.copy }}
    - id: waits
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [source]
      template: |
        metadata: {name: b}
        data: {{ vars.data }}
    - id: direct
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: c}
        data: {{ related.source.data }}
        other: {{ vars.data }}
    - id: harmless
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: d}
        data: {x: {{ vars.others | string }}}
";

    #[test]
    fn a_required_related_read_only_through_a_var_is_warned_about() {
        let rule = crate::rules::testing::rule_with_spec(RULE);
        let warnings = required_related_through_vars(&rule);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let w = &warnings[0];
        assert_eq!(w.field, "spec.children[0]");
        assert_eq!(w.line, Some(16));
        assert!(
            w.message
                .starts_with("child `through-vars` reads related `source` only through var `copy`"),
            "{w}"
        );
        assert!(
            w.message
                .ends_with("add `dependsOn: [source]` to the child"),
            "{w}"
        );
    }

    #[test]
    fn check_warns_about_labels_trellis_overwrites_on_their_template_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("app.yaml"),
            "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {name: app}
spec:
  parent: {apiVersion: demo.trellis.dev/v1, kind: App}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: x
          labels:
            app.kubernetes.io/managed-by: helm
            demo.trellis.dev/team: a
        data:
          note: \"trellis.dev/rule: not a label\"
    - id: flow
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: y, labels: {trellis.dev/child: mine}}
",
        )
        .unwrap();
        let checked = crate::offline::check::diagnostics(
            &[dir.path().to_owned()],
            crate::render::Limits::default(),
            &crate::rules::load::disk(),
            &Default::default(),
        );
        let found: Vec<String> = checked
            .diagnostics
            .iter()
            .filter(|d| d.message.contains("overwrites"))
            .map(|d| format!("{}:{}", d.line.unwrap_or(0), d.field))
            .collect();
        assert_eq!(
            found,
            [
                "14:children[0] (config) ConfigMap",
                "22:children[1] (flow) ConfigMap"
            ],
            "{:?}",
            checked.diagnostics
        );
    }
}
