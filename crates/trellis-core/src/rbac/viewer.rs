//! The read-only ClusterRole for a person or a CI job looking at what the
//! rules keep (`trellis tree`, `trellis rbac --viewer`): get, list and
//! watch on every kind the rules read or write — parents, children,
//! related kinds, patch targets — and nothing else. The same reads the
//! operator's caches need ([`read_grants`]), so the two cannot drift.

use serde_json::Value;

use super::{Grants, read_grants, role_object};
use crate::rules::CompiledRule;

/// The viewer's ClusterRole, named `<name>-viewer`.
pub fn viewer_role(rules: &[&CompiledRule], name: &str) -> Value {
    let mut grants = Grants::default();
    for rule in rules {
        read_grants(rule, &mut grants);
    }
    let mut role = role_object(&viewer_role_name(name), grants, None);
    role["metadata"]["annotations"]["trellis.dev/for"] = "trellis tree".into();
    role
}

/// `<name>-viewer`.
pub fn viewer_role_name(name: &str) -> String {
    format!("{name}-viewer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_viewer_reads_every_kind_a_rule_touches_and_writes_nothing() {
        let set = crate::rules::testing::load_texts(&[(
            "a.yaml",
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {name: app}\nspec:\n  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  related:\n    - {id: src, apiVersion: v1, kind: Secret, name: x}\n  children:\n    - id: web\n      apiVersion: apps/v1\n      kind: Deployment\n      template: |\n        metadata: {name: x}\n  patches:\n    - id: label\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      template: |\n        metadata: {name: x, labels: {a: b}}\n",
        )]);
        let rules: Vec<&CompiledRule> = set.rules.iter().map(|r| r.as_ref()).collect();
        let role = viewer_role(&rules, "trellis");
        assert_eq!(role["kind"], "ClusterRole");
        assert_eq!(role["metadata"]["name"], "trellis-viewer");
        let mut grants: Vec<(String, String, Vec<String>)> = role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(|r| {
                let s = |k: &str| r[k][0].as_str().unwrap_or_default().to_owned();
                let verbs = r["verbs"].as_array().expect("verbs");
                let verbs = verbs.iter().filter_map(|v| v.as_str()).map(str::to_owned);
                (s("apiGroups"), s("resources"), verbs.collect())
            })
            .collect();
        grants.sort();
        let read = || vec!["get".to_owned(), "list".into(), "watch".into()];
        assert_eq!(
            grants,
            [
                ("", "namespaces"),
                ("", "secrets"),
                ("apps", "deployments"),
                ("demo.trellis.dev", "apps"),
            ]
            .map(|(g, r)| (g.to_owned(), r.to_owned(), read()))
        );
    }
}
