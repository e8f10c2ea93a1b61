//! What a spoke's credentials need (`trellis rbac --cluster NAME`): the
//! verbs of every child a rule may place in that spoke — one whose
//! `cluster:` is the constant NAME, or an expression (it may name any
//! cluster) — and nothing else: the hub keeps the parents, the spoke only
//! children. Retained children are released with a patch there too.

use serde_json::Value;

use super::{Grants, Verb, child_resource, child_verbs, role_object};
use crate::rules::CompiledRule;
use crate::rules::model::DeletionPolicy;

/// The ClusterRole `<name>-spoke-<cluster>` for the Secret's account in
/// the spoke `cluster`.
pub fn spoke_role(rules: &[&CompiledRule], name: &str, cluster: &str) -> Value {
    let mut grants = Grants::default();
    for rule in rules {
        for child in &rule.children {
            let Some(src) = child.spec.cluster.as_deref() else {
                continue;
            };
            let placed = match crate::rules::names::quoted_constant(src) {
                Some(constant) => constant == cluster,
                None => true,
            };
            if !placed {
                continue;
            }
            let resource = child_resource(child);
            grants.allow(&child.gvk.group, &resource, &child_verbs(child.spec.policy));
            if child.spec.deletion_policy == DeletionPolicy::Retain {
                grants.allow(&child.gvk.group, &resource, &[Verb::Patch]);
            }
        }
    }
    let mut role = role_object(&format!("{name}-spoke-{cluster}"), grants, None);
    role["metadata"]["annotations"]["trellis.dev/cluster"] = cluster.into();
    role
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spoke_role_grants_the_children_placed_there_only() {
        let set = crate::rules::testing::load_texts(&[(
            "a.yaml",
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {name: app}\nspec:\n  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  children:\n    - id: home\n      apiVersion: v1\n      kind: Secret\n      template: 'metadata: {name: x}'\n    - id: web\n      apiVersion: apps/v1\n      kind: Deployment\n      cluster: spec.region\n      template: 'metadata: {name: x}'\n    - id: dns\n      apiVersion: v1\n      kind: ConfigMap\n      cluster: \"'shared-infra'\"\n      policy: createOnly\n      template: 'metadata: {name: x}'\n",
        )]);
        let rules: Vec<&CompiledRule> = set.rules.iter().map(|r| r.as_ref()).collect();
        let grants = |role: &Value| -> Vec<(String, Vec<String>)> {
            role["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["resources"][0].as_str().unwrap().to_owned(),
                        serde_json::from_value(r["verbs"].clone()).unwrap(),
                    )
                })
                .collect()
        };
        let eu = spoke_role(&rules, "trellis", "eu-prod-1");
        assert_eq!(eu["kind"], "ClusterRole");
        assert_eq!(eu["metadata"]["name"], "trellis-spoke-eu-prod-1");
        assert_eq!(
            grants(&eu),
            [(
                "deployments".to_owned(),
                ["get", "list", "watch", "create", "patch", "delete"]
                    .map(String::from)
                    .to_vec()
            )],
            "the expression may name eu-prod-1; the constant does not, the hub's Secret is not there"
        );
        let infra = grants(&spoke_role(&rules, "trellis", "shared-infra"));
        assert!(
            infra
                .iter()
                .any(|(r, v)| r == "configmaps" && !v.contains(&"patch".to_owned()))
        );
        assert!(!infra.iter().any(|(r, _)| r == "secrets"));
    }
}
