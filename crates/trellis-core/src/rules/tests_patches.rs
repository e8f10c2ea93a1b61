//! `check` on `spec.patches` and `deletionPolicy`.

use std::fs;

use super::*;

const HEAD: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent: {apiVersion: demo.trellis.dev/v1, kind: App, scope: Namespaced}\n  children:\n    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n      deletionPolicy: retain\n      template: '{metadata: {name: c}}'\n";

const PATCH: &str = "  patches:\n    - id: label\n      apiVersion: v1\n      kind: ConfigMap\n      template: '{metadata: {name: t, labels: {a: b}}}'\n";

fn errors(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("rule.yaml"), text).unwrap();
    match load_dir(dir.path()) {
        Ok(_) => Vec::new(),
        Err(diags) => diags.iter().map(ToString::to_string).collect(),
    }
}

fn has(errors: &[String], text: &str) -> bool {
    errors.iter().any(|e| e.contains(text))
}

#[test]
fn a_rule_with_patches_and_a_retained_child_compiles() {
    assert_eq!(errors(&format!("{HEAD}{PATCH}")), Vec::<String>::new());
    let set = testing::load_texts(&[("r.yaml", &format!("{HEAD}{PATCH}"))]);
    let rule = &set.rules[0];
    assert_eq!(rule.patches.len(), 1);
    assert_eq!(rule.patch_order, vec![0]);
    assert!(rule.retains_children());
}

#[test]
fn patch_ids_are_unique_across_children_related_and_patches() {
    let e = errors(&format!(
        "{HEAD}{PATCH}    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n      template: '{{metadata: {{name: u}}}}'\n"
    ));
    assert!(has(&e, "spec.patches[1].id"), "{e:?}");
    assert!(
        has(&e, "unique across children, related and patches"),
        "{e:?}"
    );
    let e = errors(&format!(
        "{HEAD}{PATCH}    - id: label\n      apiVersion: v1\n      kind: ConfigMap\n      template: '{{metadata: {{name: u}}}}'\n"
    ));
    assert!(has(&e, "duplicate patch id `label`"), "{e:?}");
}

#[test]
fn a_child_can_neither_wait_for_nor_read_a_patch() {
    let text = format!("{HEAD}      dependsOn: [label]\n{PATCH}");
    let e = errors(&text);
    assert!(has(&e, "`label` is a patch"), "{e:?}");
    let text = HEAD.replace(
        "{metadata: {name: c}}",
        "{metadata: {name: {{ patches.label.metadata.name }}}}",
    );
    let e = errors(&format!("{text}{PATCH}"));
    assert!(has(&e, "`patches` is not available here"), "{e:?}");
}

#[test]
fn patches_may_wait_for_each_other_but_not_in_a_cycle() {
    let cycle = "  patches:\n    - id: a\n      apiVersion: v1\n      kind: ConfigMap\n      dependsOn: [b]\n      template: '{metadata: {name: t}}'\n    - id: b\n      apiVersion: v1\n      kind: ConfigMap\n      template: '{metadata: {name: {{ patches.a.metadata.name }}}}'\n";
    let e = errors(&format!("{HEAD}{cycle}"));
    assert!(has(&e, "dependency cycle: a -> b -> a"), "{e:?}");
    let e = errors(&format!(
        "{HEAD}{}",
        cycle.replace("      dependsOn: [b]\n", "")
    ));
    assert!(e.is_empty(), "{e:?}");
}

#[test]
fn a_cluster_scoped_target_of_a_namespaced_parent_needs_allow_cross_namespace() {
    let ns = "  patches:\n    - id: ns\n      apiVersion: v1\n      kind: Namespace\n      template: '{metadata: {name: t, labels: {a: b}}}'\n";
    let e = errors(&format!("{HEAD}{ns}"));
    assert!(has(&e, "spec.patches[0].kind"), "{e:?}");
    assert!(has(&e, "allowCrossNamespace"), "{e:?}");
    let allowed = ns.replace(
        "kind: Namespace\n",
        "kind: Namespace\n      allowCrossNamespace: true\n",
    );
    assert!(errors(&format!("{HEAD}{allowed}")).is_empty());
}

#[test]
fn status_reads_patches_by_declared_id_only() {
    let status = "  status:\n    conditions:\n      - type: Labelled\n        when: \"patches.nope is defined\"\n        reason: L\n";
    let e = errors(&format!("{HEAD}{PATCH}{status}"));
    assert!(has(&e, "the rule has no patch `nope`"), "{e:?}");
    let ok = status.replace("nope", "label");
    assert!(errors(&format!("{HEAD}{PATCH}{ok}")).is_empty());
}

#[test]
fn an_unknown_deletion_policy_or_patch_field_is_refused() {
    let e = errors(&HEAD.replace("deletionPolicy: retain", "deletionPolicy: orphan"));
    assert!(has(&e, "deletionPolicy"), "{e:?}");
    let e = errors(&format!("{HEAD}{PATCH}      adopt: true\n"));
    assert!(has(&e, "adopt"), "{e:?}");
}
