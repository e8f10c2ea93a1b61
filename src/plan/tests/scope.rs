//! A child's `scope:` is an offline hint (RULES.md, "Shape"): the planner
//! takes every scope from its input, which is discovery on a live cluster,
//! so a wrong hint never moves a child's namespace there.

use super::*;

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
