//! What a spoke's credentials need (`trellis rbac --cluster NAME`): the
//! verbs of every child a rule may place in that spoke — one whose
//! `cluster:` is the constant NAME, or an expression (it may name any
//! cluster) — and nothing else: the hub keeps the parents, the spoke only
//! children. Retained children are released with a patch there too.
//!
//! A rule with `serviceAccountName` writes its spoke children as that
//! account there too (`system:serviceaccount:<operator namespace>:<name>`,
//! impersonated by the Secret's credentials): the Secret's role then only
//! reads those kinds (the hub's watches there) and may impersonate the
//! account (by `resourceNames`), and the writes go to one more ClusterRole,
//! `<name>-spoke-<cluster>-rule-<rule>`, to bind to that account in the
//! spoke.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Grants, READ, Verb, child_resource, child_verbs, role_object};
use crate::rules::CompiledRule;
use crate::rules::model::DeletionPolicy;

/// The ClusterRole `<name>-spoke-<cluster>` for the Secret's account in
/// the spoke `cluster` (see [`spoke_roles`]).
pub fn spoke_role(rules: &[&CompiledRule], name: &str, cluster: &str) -> Value {
    spoke_roles(rules, name, cluster).swap_remove(0)
}

/// Every ClusterRole the spoke `cluster` needs: first the Secret's
/// account's, `<name>-spoke-<cluster>`, then one per rule with an account
/// placing children there, `<name>-spoke-<cluster>-rule-<rule>`.
pub fn spoke_roles(rules: &[&CompiledRule], name: &str, cluster: &str) -> Vec<Value> {
    let mut own = Grants::default();
    // Rule name → what its account writes there.
    let mut accounts: BTreeMap<&str, Grants> = BTreeMap::new();
    for rule in rules {
        let account = rule.rule.spec.service_account_name.as_deref();
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
            let mut verbs = child_verbs(child.spec.policy);
            if child.spec.deletion_policy == DeletionPolicy::Retain {
                verbs.push(Verb::Patch);
            }
            match account {
                None => own.allow(&child.gvk.group, &resource, &verbs),
                Some(account) => {
                    own.allow(&child.gvk.group, &resource, READ);
                    own.allow_named("", "serviceaccounts", Verb::Impersonate, account);
                    accounts.entry(rule.name.as_str()).or_default().allow(
                        &child.gvk.group,
                        &resource,
                        &verbs,
                    );
                }
            }
        }
    }
    // Related entries read there: the spoke's watches, with the Secret's
    // credentials.
    for rule in rules {
        for related in rule.related.iter().filter(|r| r.cluster.is_some()) {
            let placed = match related.spec.cluster.as_deref() {
                Some(src) => crate::rules::names::quoted_constant(src).is_none_or(|c| c == cluster),
                None => false,
            };
            if placed {
                let resource = related
                    .spec
                    .plural
                    .clone()
                    .unwrap_or_else(|| crate::kinds::plural(&related.gvk));
                own.allow(&related.gvk.group, &resource, READ);
            }
        }
    }
    let spoke_name = format!("{name}-spoke-{cluster}");
    let mut roles = vec![role_object(&spoke_name, own, None)];
    for (rule, grants) in accounts {
        roles.push(role_object(
            &format!("{spoke_name}-rule-{rule}"),
            grants,
            Some(rule),
        ));
    }
    for role in &mut roles {
        role["metadata"]["annotations"]["trellis.dev/cluster"] = cluster.into();
    }
    roles
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

    #[test]
    fn a_rule_with_an_account_writes_in_the_spoke_as_that_account() {
        let set = crate::rules::testing::load_texts(&[(
            "a.yaml",
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {name: app}\nspec:\n  serviceAccountName: app-writer\n  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  children:\n    - id: web\n      apiVersion: apps/v1\n      kind: Deployment\n      cluster: spec.region\n      template: 'metadata: {name: x}'\n",
        )]);
        let rules: Vec<&CompiledRule> = set.rules.iter().map(|r| r.as_ref()).collect();
        let roles = spoke_roles(&rules, "trellis", "eu");
        assert_eq!(roles.len(), 2);
        let own = &roles[0]["rules"];
        let text = own.to_string();
        assert!(
            text.contains("\"impersonate\"") && text.contains("\"app-writer\""),
            "{own:#}"
        );
        assert!(
            !text.contains("\"create\""),
            "the Secret's account only reads: {own:#}"
        );
        assert_eq!(roles[1]["metadata"]["name"], "trellis-spoke-eu-rule-app");
        assert_eq!(
            roles[1]["metadata"]["annotations"]["trellis.dev/rule"],
            "app"
        );
        let writes = roles[1]["rules"].to_string();
        assert!(
            writes.contains("deployments") && writes.contains("\"create\""),
            "{writes}"
        );
    }
}
