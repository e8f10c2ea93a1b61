//! Whether a rule's cluster-scoped children can ever be applied: a
//! cluster-scoped child of a namespaced parent needs `allowCrossNamespace`
//! (RULES.md, "What the operator guarantees"), or the operator refuses it on
//! every pass, so `check` refuses the rule whenever the parent's scope is
//! known. The rule says it by `spec.parent.scope`, by the `crd:` block
//! trellis generates (namespaced by default) or, for a built-in kind, by
//! the built-in table. A custom parent kind of undeclared scope gets a
//! warning from the rule alone; `check --crds` then settles it from the
//! kind's CustomResourceDefinition ([`settle`]).

use super::{Checker, CompiledRule};
use crate::kinds::Gvk;
use crate::rules::model::{ChildSpec, RuleSpec, Scope};
use crate::rules::{Diagnostic, Severity};

/// The child's own scope: its `scope:` or the built-in table.
fn cluster_scoped(child: &ChildSpec) -> bool {
    let scope = child
        .scope
        .unwrap_or_else(|| crate::kinds::scope(&Gvk::new(&child.api_version, &child.kind)));
    scope == Scope::Cluster && !child.allow_cross_namespace
}

/// The parent's scope as the rule declares it; `None` when only the kind's
/// CRD (or discovery, when running) can tell.
fn declared_parent_scope(spec: &RuleSpec) -> Option<Scope> {
    let gvk = Gvk::new(&spec.parent.api_version, &spec.parent.kind);
    spec.parent
        .scope
        .or_else(|| {
            spec.crd
                .as_ref()
                .map(|c| c.scope.unwrap_or(Scope::Namespaced))
        })
        .or_else(|| gvk.is_builtin().then(|| crate::kinds::scope(&gvk)))
}

/// The finding on a cluster-scoped child (not allowed across namespaces)
/// when the parent's scope is `parent` (`None`: unknown).
fn finding(kind: &str, parent: Option<Scope>) -> Option<(Severity, String)> {
    match parent {
        Some(Scope::Namespaced) => Some((
            Severity::Error,
            format!(
                "`{kind}` is cluster-scoped and the parent is namespaced: the child can never be applied without `allowCrossNamespace: true`"
            ),
        )),
        Some(Scope::Cluster) => None,
        None => Some((
            Severity::Warning,
            format!(
                "`{kind}` is cluster-scoped: if the parent is namespaced the child can never be applied without `allowCrossNamespace: true` (set `spec.parent.scope` to say which, or give `check` the kind's CRD with `--crds`)"
            ),
        )),
    }
}

/// The load-time check of one child (`at` is `spec.children[i]`).
pub(super) fn check(ck: &mut Checker, at: &str, spec: &RuleSpec, child: &ChildSpec) {
    if !cluster_scoped(child) {
        return;
    }
    let field = format!("{at}.kind");
    match finding(&child.kind, declared_parent_scope(spec)) {
        Some((Severity::Error, message)) => ck.error(&field, message),
        Some((Severity::Warning, message)) => ck.warning(&field, message),
        None => {}
    }
}

/// The parent's scope learnt from its CRD (`check --crds`) settles what the
/// rule alone could only warn about: the warnings [`check`] gave `rule` for
/// an undeclared scope are taken out of `warnings`, and the errors they
/// become (a namespaced parent) are returned. The CRD is what the cluster
/// will serve, so it wins over a rule that declares another scope (as it
/// does for `render --crds`); a rule that declares the CRD's scope was
/// judged at load time already.
pub fn settle(
    rule: &CompiledRule,
    parent: Scope,
    warnings: &mut Vec<Diagnostic>,
) -> Vec<Diagnostic> {
    let spec = &rule.rule.spec;
    if declared_parent_scope(spec) == Some(parent) {
        return Vec::new();
    }
    let mut errors = Vec::new();
    for (i, child) in spec.children.iter().enumerate() {
        if !cluster_scoped(child) {
            continue;
        }
        let field = format!("spec.children[{i}].kind");
        if let Some((_, undecided)) = finding(&child.kind, None) {
            warnings
                .retain(|w| !(w.file == rule.file && w.field == field && w.message == undecided));
        }
        if let Some((Severity::Error, message)) = finding(&child.kind, Some(parent)) {
            errors.push(Diagnostic::error(
                &rule.file,
                rule.lines.line_of(&field),
                &field,
                message,
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleSet;

    /// A rule of a custom parent kind (`parent` is its extra YAML, e.g. a
    /// `scope:`) with a Namespace child and a ConfigMap child.
    fn load(parent: &str) -> RuleSet {
        let dir = tempfile::tempdir().expect("temp dir");
        let text = format!(
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r\nspec:\n  parent: {{apiVersion: demo.trellis.dev/v1, kind: Team{parent}}}\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: 'metadata: {{name: x}}'\n    - id: space\n      apiVersion: v1\n      kind: Namespace\n      template: 'metadata: {{name: x}}'\n"
        );
        std::fs::write(dir.path().join("r.yaml"), text).expect("write");
        RuleSet::load(&[dir.path().to_path_buf()], Default::default()).expect("loads")
    }

    #[test]
    fn a_namespaced_crd_turns_the_undecided_warning_into_an_error_naming_the_child() {
        let mut set = load("");
        assert_eq!(set.warnings.len(), 1, "{:?}", set.warnings);
        let rule = set.rules[0].clone();
        let errors = settle(&rule, Scope::Namespaced, &mut set.warnings);
        assert!(set.warnings.is_empty(), "{:?}", set.warnings);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].severity, Severity::Error);
        assert_eq!(errors[0].field, "spec.children[1].kind");
        assert_eq!(errors[0].line, Some(14));
        assert!(
            errors[0]
                .message
                .contains("`Namespace` is cluster-scoped and the parent is namespaced")
        );
    }

    #[test]
    fn a_cluster_scoped_crd_settles_the_warning_with_no_error() {
        let mut set = load("");
        let rule = set.rules[0].clone();
        assert!(settle(&rule, Scope::Cluster, &mut set.warnings).is_empty());
        assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    }

    #[test]
    fn the_crd_wins_over_a_declared_scope_and_agreeing_ones_are_not_judged_twice() {
        let mut set = load(", scope: Cluster");
        assert!(set.warnings.is_empty(), "{:?}", set.warnings);
        let rule = set.rules[0].clone();
        let errors = settle(&rule, Scope::Namespaced, &mut set.warnings);
        assert_eq!(
            errors.len(),
            1,
            "a namespaced CRD: the child can never apply"
        );
        assert!(settle(&rule, Scope::Cluster, &mut set.warnings).is_empty());
    }
}
