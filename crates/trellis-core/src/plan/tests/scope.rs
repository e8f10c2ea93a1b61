//! Namespaces and scopes: a child's namespace under a namespaced parent
//! (its own unless the rule allows others), a parent whose namespace does
//! not fit its kind's scope, the namespace a child of a cluster-scoped
//! parent must name; and a child's `scope:`, an offline hint (RULES.md,
//! "Shape"): the planner takes every scope from its input, which is
//! discovery on a live cluster, so a wrong hint never moves a child's
//! namespace there.

use super::*;

#[test]
fn rejects_other_namespace_unless_rule_allows() {
    let other = CM.replace(
        "        data:\n",
        "          namespace: elsewhere\n        data:\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{other}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(
        p.errors[0].contains("allowCrossNamespace"),
        "{:?}",
        p.errors
    );

    let allowed = other.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      allowCrossNamespace: true\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{allowed}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].key.namespace.as_deref(), Some("elsewhere"));
    assert!(
        p.apply[0].object["metadata"]
            .get("ownerReferences")
            .is_none(),
        "no cross-namespace owner"
    );
    assert!(p.needs_finalizer);
}

#[test]
fn cluster_scoped_child_of_namespaced_parent_needs_permission() {
    let ns = "    - id: space\n      apiVersion: v1\n      kind: Namespace\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n";
    let r = rule(&format!("{PARENT_KIND}  children:\n{ns}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(p.errors[0].contains("cluster-scoped"), "{:?}", p.errors);

    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}",
        ns.replace(
            "      kind: Namespace\n",
            "      kind: Namespace\n      allowCrossNamespace: true\n"
        )
    ));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply[0].key.namespace, None);
    assert!(!p.apply[0].owned);
    assert!(p.needs_finalizer, "cleanup needs the finalizer");
}

/// Like [`run`], with the parent kind `App` cluster-scoped.
fn run_cluster_parent(rule: &CompiledRule, parent: &Value, observed: Vec<Value>) -> Plan {
    let scope_of = |gvk: &Gvk| {
        if gvk.kind == "App" {
            Scope::Cluster
        } else {
            kinds::scope(gvk)
        }
    };
    plan(
        rule,
        &Input {
            parent,
            observed: &Observed::from_objects(observed),
            now: NOW,
            scope_of: &scope_of,
            clusters: &crate::clusters::Clusters::offline(),
        },
    )
}

fn without_namespace(mut parent: Value) -> Value {
    parent["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    parent
}

#[test]
fn a_parent_that_is_not_an_object_is_an_error_not_a_panic() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    for parent in [json!([1, "two", {"parent": 3}]), json!(3), json!(null)] {
        let p = run_cluster_parent(&r, &parent, vec![]);
        assert!(p.apply.is_empty(), "{parent}");
        assert_eq!(p.errors, ["App: the parent is not an object"], "{parent}");
        assert_eq!(
            p.failure_reason,
            Some(crate::plan::FailureReason::InvalidSpec)
        );
    }
}

#[test]
fn namespaced_parent_without_namespace_is_an_error() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let cm = live("ConfigMap", "a-cm", "cm", json!({}));
    let p = run(&r, &without_namespace(parent(json!({}))), vec![cm]);
    assert!(p.apply.is_empty());
    assert!(p.delete.is_empty(), "nothing is pruned");
    assert_eq!(
        p.errors,
        [
            "App a: the parent has no metadata.namespace (App is namespaced; \
             if it is not, set spec.parent.scope: Cluster in the rule)"
        ],
        "{:?}",
        p.errors
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::RenderError)
    );
    let synced = condition(&p, "Synced");
    assert_eq!(synced["status"], "False");
    assert_eq!(synced["reason"], "RenderError");
    assert_eq!(p.status.as_ref().unwrap()["observedGeneration"], 3);
}

#[test]
fn cluster_scoped_parent_with_namespace_is_an_error() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let p = run_cluster_parent(&r, &parent(json!({})), vec![]);
    assert!(p.apply.is_empty());
    assert_eq!(
        p.errors,
        ["App ns/a: cluster-scoped parent must not have metadata.namespace"],
        "{:?}",
        p.errors
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::RenderError)
    );
}

#[test]
fn namespaced_child_of_cluster_scoped_parent_must_name_namespace() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}"));
    let cluster_parent = without_namespace(parent(json!({})));
    let p = run_cluster_parent(&r, &cluster_parent, vec![]);
    assert!(
        p.errors[0].contains("must set metadata.namespace"),
        "{:?}",
        p.errors
    );

    let named = CM.replace(
        "        data:\n",
        "          namespace: team\n        data:\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{named}"));
    let p = run_cluster_parent(&r, &cluster_parent, vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.apply[0].owned, "a cluster-scoped owner is allowed");
}

/// A ConfigMap child of a cluster-scoped parent, wrongly hinted cluster-scoped.
const WRONG_HINT: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App, scope: Cluster}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      scope: Cluster
      template: |
        metadata:
          name: settings
          namespace: team-a
";

#[test]
fn discovery_wins_over_a_childs_scope_hint_on_a_live_cluster() {
    let r = rule(WRONG_HINT);
    let p = run_cluster_parent(&r, &without_namespace(parent(json!({}))), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply.len(), 1);
    assert_eq!(p.apply[0].object["metadata"]["namespace"], "team-a");
}
