//! The split of `trellis rbac` for rules with `serviceAccountName`.

use super::*;

/// A rule `name` with one ConfigMap child (apply), one RoleBinding child to
/// the static ClusterRole `view`, a related Secret, a `deletion:` (so the
/// finalizer), and `account` when given.
fn rule(name: &str, account: Option<&str>) -> String {
    let account = account
        .map(|a| format!("  serviceAccountName: {a}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {{name: {name}}}
spec:
{account}  parent: {{apiVersion: demo.trellis.dev/v1, kind: {kind}}}
  deletion: {{order: reverse}}
  related:
    - id: creds
      apiVersion: v1
      kind: Secret
      name: "{{{{ spec.secret }}}}"
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name }}}}
    - id: reader
      apiVersion: rbac.authorization.k8s.io/v1
      kind: RoleBinding
      template: |
        metadata:
          name: {{{{ parent.metadata.name }}}}
        roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}}
        subjects: []
"#,
        kind = format!("K{name}").replace('-', ""),
    )
}

fn roles(texts: &[(&str, &str)]) -> Vec<Value> {
    cluster_roles(&crate::rules::testing::load_texts(texts), "trellis", false)
}

/// (group, resource, verbs, resourceNames) of each PolicyRule.
fn grants(role: &Value) -> Vec<(String, String, Vec<String>, Vec<String>)> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let list = |v: &Value| -> Vec<String> {
                v.as_array()
                    .map(|a| a.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
                    .unwrap_or_default()
            };
            (
                list(&r["apiGroups"]).join(","),
                list(&r["resources"]).join(","),
                list(&r["verbs"]),
                list(&r["resourceNames"]),
            )
        })
        .collect()
}

fn verbs_on(role: &Value, group: &str, resource: &str) -> Vec<String> {
    grants(role)
        .into_iter()
        .filter(|(g, r, _, names)| g == group && r == resource && names.is_empty())
        .flat_map(|(_, _, v, _)| v)
        .collect()
}

fn named_on(role: &Value, group: &str, resource: &str, verb: &str) -> Vec<String> {
    grants(role)
        .into_iter()
        .filter(|(g, r, v, _)| g == group && r == resource && v == &[verb.to_owned()])
        .flat_map(|(_, _, _, names)| names)
        .collect()
}

#[test]
fn without_accounts_the_output_is_the_one_role_of_before() {
    let text = rule("plain", None);
    let set = crate::rules::testing::load_texts(&[("r.yaml", &text)]);
    let all = cluster_roles(&set, "trellis", false);
    assert_eq!(all, vec![cluster_role(&set, "trellis")]);
    let role = &all[0];
    assert_eq!(
        verbs_on(role, "", "configmaps"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert!(named_on(role, "", "serviceaccounts", "impersonate").is_empty());
    assert!(verbs_on(role, "authorization.k8s.io", "subjectaccessreviews").is_empty());
}

#[test]
fn a_rule_with_an_account_gets_its_own_role_with_its_writes_and_reads() {
    let text = rule("web", Some("web-writer"));
    let all = roles(&[("r.yaml", &text)]);
    assert_eq!(all.len(), 2, "{all:#?}");
    let account = &all[1];
    assert_eq!(account["metadata"]["name"], "trellis-rule-web");
    assert_eq!(
        account["metadata"]["annotations"]["trellis.dev/rule"],
        "web"
    );
    assert_eq!(
        verbs_on(account, "", "configmaps"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert_eq!(
        verbs_on(account, "rbac.authorization.k8s.io", "rolebindings"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert_eq!(
        named_on(account, "rbac.authorization.k8s.io", "clusterroles", "bind"),
        ["view"]
    );
    assert_eq!(verbs_on(account, "", "secrets"), ["get", "list", "watch"]);
    assert_eq!(
        verbs_on(account, "demo.trellis.dev", "kwebs"),
        ["get", "list", "watch"],
        "the account reads the parent, never writes it"
    );
    assert!(verbs_on(account, "demo.trellis.dev", "kwebs/status").is_empty());
    assert!(verbs_on(account, "coordination.k8s.io", "leases").is_empty());
    assert!(verbs_on(account, "", "events").is_empty());
}

#[test]
fn the_operator_keeps_reads_parent_writes_and_impersonation_not_the_rules_writes() {
    let text = rule("web", Some("web-writer"));
    let operator = &roles(&[("r.yaml", &text)])[0];
    assert_eq!(operator["metadata"]["name"], "trellis");
    for (group, resource) in [
        ("", "configmaps"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("", "secrets"),
    ] {
        assert_eq!(
            verbs_on(operator, group, resource),
            ["get", "list", "watch"],
            "{group}/{resource}: caches only"
        );
    }
    assert!(
        named_on(
            operator,
            "rbac.authorization.k8s.io",
            "clusterroles",
            "bind"
        )
        .is_empty(),
        "binding is the account's"
    );
    assert_eq!(
        verbs_on(operator, "demo.trellis.dev", "kwebs"),
        ["get", "list", "watch", "update", "patch"],
        "the finalizer stays the operator's"
    );
    assert_eq!(
        verbs_on(operator, "demo.trellis.dev", "kwebs/status"),
        ["patch"]
    );
    assert_eq!(
        named_on(operator, "", "serviceaccounts", "impersonate"),
        ["web-writer"]
    );
    assert_eq!(
        named_on(operator, "", "serviceaccounts", "get"),
        ["web-writer"]
    );
    assert!(
        verbs_on(operator, "", "serviceaccounts").is_empty(),
        "never every account"
    );
    assert_eq!(
        verbs_on(operator, "authorization.k8s.io", "subjectaccessreviews"),
        ["create"]
    );
    assert!(
        verbs_on(operator, "coordination.k8s.io", "leases").is_empty(),
        "Leases are in the operator's Role, in its namespace"
    );
}

#[test]
fn mixed_sets_keep_the_writes_of_rules_without_an_account_in_the_operator_role() {
    let with = rule("web", Some("web-writer"));
    let without = rule("plain", None);
    let other = rule("db", Some("db-writer"));
    let all = roles(&[("a.yaml", &with), ("b.yaml", &without), ("c.yaml", &other)]);
    let names: Vec<&str> = all
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["trellis", "trellis-rule-db", "trellis-rule-web"]);
    let operator = &all[0];
    // `plain` writes ConfigMaps and binds `view` with the operator's rights.
    assert_eq!(
        verbs_on(operator, "", "configmaps"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert_eq!(
        named_on(
            operator,
            "rbac.authorization.k8s.io",
            "clusterroles",
            "bind"
        ),
        ["view"]
    );
    assert_eq!(
        named_on(operator, "", "serviceaccounts", "impersonate"),
        ["db-writer", "web-writer"]
    );
}

#[test]
fn the_account_preflight_reads_every_kind_the_rule_reads() {
    let text = rule("web", Some("web-writer"));
    let set = crate::rules::testing::load_texts(&[("r.yaml", &text)]);
    let checks: Vec<String> = account_read_permissions(&set.rules[0])
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(
        checks,
        [
            "get configmaps",
            "list configmaps",
            "watch configmaps",
            "get secrets",
            "list secrets",
            "watch secrets",
            "get kwebs.demo.trellis.dev",
            "list kwebs.demo.trellis.dev",
            "watch kwebs.demo.trellis.dev",
            "get rolebindings.rbac.authorization.k8s.io",
            "list rolebindings.rbac.authorization.k8s.io",
            "watch rolebindings.rbac.authorization.k8s.io",
        ]
    );
    let plain = rule("plain", None);
    let set = crate::rules::testing::load_texts(&[("r.yaml", &plain)]);
    assert!(account_read_permissions(&set.rules[0]).is_empty());
}

#[test]
fn the_operator_preflight_no_longer_asks_for_the_rules_writes() {
    let text = rule("web", Some("web-writer"));
    let set = crate::rules::testing::load_texts(&[("r.yaml", &text)]);
    let asked: Vec<String> = rule_permissions(&set.rules[0])
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert!(asked.contains(&"impersonate serviceaccounts named web-writer".to_owned()));
    assert!(asked.contains(&"patch kwebs/status.demo.trellis.dev".to_owned()));
    for write in ["create configmaps", "delete configmaps", "patch configmaps"] {
        assert!(!asked.contains(&write.to_owned()), "{write}: {asked:?}");
    }
}
