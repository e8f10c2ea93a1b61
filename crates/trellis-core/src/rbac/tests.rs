use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::rules::load_dir;

fn load(dir: &Path) -> RuleSet {
    load_dir(dir).unwrap_or_else(|diags| {
        panic!(
            "rule set rejected:\n{}",
            diags
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        )
    })
}

/// The ClusterRole for one rule file's text.
fn role_for(rule: &str) -> Value {
    cluster_role(
        &crate::rules::testing::load_texts(&[("rule.yaml", rule)]),
        "trellis",
    )
}

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/rbac")
        .join(case)
}

/// Verbs granted on every object of (group, resource); empty when none.
fn verbs(role: &Value, group: &str, resource: &str) -> Vec<String> {
    let rules: Vec<&Value> = unrestricted(role)
        .filter(|r| r["apiGroups"] == json!([group]) && r["resources"] == json!([resource]))
        .collect();
    assert!(
        rules.len() <= 1,
        "{group}/{resource} is granted by several rules: {rules:?}"
    );
    rules
        .first()
        .map(|r| serde_json::from_value(r["verbs"].clone()).unwrap())
        .unwrap_or_default()
}

fn unrestricted(role: &Value) -> impl Iterator<Item = &Value> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("resourceNames").is_none())
}

/// `resourceNames` of the rules granting only `verb` on (group, resource).
fn named(role: &Value, group: &str, resource: &str, verb: &str) -> Vec<Vec<String>> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["apiGroups"] == json!([group])
                && r["resources"] == json!([resource])
                && r["verbs"] == json!([verb])
        })
        .filter_map(|r| r.get("resourceNames"))
        .map(|n| serde_json::from_value(n.clone()).unwrap())
        .collect()
}

const WEBAPP: &str = r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {name: webapp}
spec:
  parent: {apiVersion: demo.trellis.dev/v1, kind: WebApp}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
"#;

fn rule_with_children(parent: &str, children: &str) -> String {
    format!(
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {{name: r}}\nspec:\n  parent: {parent}\n  children:\n{children}"
    )
}

/// One RoleBinding child of a cluster-scoped CRD parent, with `role_ref`
/// (already indented for the template) as its roleRef part.
fn binding_rule(kind: &str, role_ref: &str) -> String {
    let template: String = format!(
            "metadata:\n  name: b\n  namespace: {{{{ spec.ns }}}}\n{role_ref}subjects: {{{{ spec.subjects }}}}\n"
        )
        .lines()
        .map(|l| format!("        {l}\n"))
        .collect();
    rule_with_children(
        "{apiVersion: demo.trellis.dev/v1, kind: Team, scope: Cluster}",
        &format!(
            "    - id: b\n      apiVersion: rbac.authorization.k8s.io/v1\n      kind: {kind}\n      template: |\n{template}"
        ),
    )
}

#[test]
fn grants_status_patch_only_for_crd_parents() {
    let crd = role_for(WEBAPP);
    assert_eq!(
        verbs(&crd, "demo.trellis.dev", "webapps"),
        ["get", "list", "watch"]
    );
    assert_eq!(verbs(&crd, "demo.trellis.dev", "webapps/status"), ["patch"]);

    let decorator = role_for(&rule_with_children(
        "{apiVersion: apps/v1, kind: Deployment}",
        "    - id: svc\n      apiVersion: v1\n      kind: Service\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
    ));
    assert_eq!(
        verbs(&decorator, "apps", "deployments"),
        ["get", "list", "watch"]
    );
    assert!(verbs(&decorator, "apps", "deployments/status").is_empty());
    assert!(
        !serde_json::to_string(&decorator)
            .unwrap()
            .contains("/status"),
        "a built-in parent gets no status writes"
    );
}

#[test]
fn uses_plural_overrides_for_parent_and_children() {
    let role = role_for(&rule_with_children(
        "{apiVersion: demo.trellis.dev/v1, kind: Octopus, plural: octopodes}",
        "    - id: c\n      apiVersion: demo.trellis.dev/v1\n      kind: Cactus\n      plural: cacti\n      template: |\n        metadata:\n          name: x\n",
    ));
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "octopodes"),
        ["get", "list", "watch"]
    );
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "octopodes/status"),
        ["patch"]
    );
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "cacti"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert!(verbs(&role, "demo.trellis.dev", "octopuses").is_empty());
}

#[test]
fn grants_child_verbs_per_policy() {
    let child = |id: &str, kind: &str, policy: &str| {
        format!(
            "    - id: {id}\n      apiVersion: v1\n      kind: {kind}\n      policy: {policy}\n      template: |\n        metadata:\n          name: {id}\n"
        )
    };
    let role = role_for(&rule_with_children(
        "{apiVersion: demo.trellis.dev/v1, kind: App}",
        &[
            child("a", "ConfigMap", "apply"),
            child("b", "Secret", "createOnly"),
            child("c", "Service", "recreate"),
        ]
        .concat(),
    ));
    assert_eq!(
        verbs(&role, "", "configmaps"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert_eq!(
        verbs(&role, "", "secrets"),
        ["get", "list", "watch", "create", "delete"]
    );
    assert_eq!(
        verbs(&role, "", "services"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
}

#[test]
fn merges_verbs_of_every_rule_on_one_resource() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), WEBAPP).unwrap();
    // A second rule makes the same kind createOnly and lists an event kind
    // the operator already needs: one PolicyRule each, verbs unioned.
    fs::write(
            dir.path().join("b.yaml"),
            rule_with_children(
                "{apiVersion: demo.trellis.dev/v1, kind: Other}",
                "    - id: c\n      apiVersion: v1\n      kind: ConfigMap\n      policy: createOnly\n      template: |\n        metadata:\n          name: c\n    - id: e\n      apiVersion: v1\n      kind: Event\n      template: |\n        metadata:\n          name: e\n",
            ),
        )
        .unwrap();
    let role = cluster_role(&load(dir.path()), "trellis");
    assert_eq!(
        verbs(&role, "", "configmaps"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert_eq!(
        verbs(&role, "", "events"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    let mut seen = BTreeSet::new();
    for rule in unrestricted(&role) {
        let key = (rule["apiGroups"].to_string(), rule["resources"].to_string());
        assert!(seen.insert(key.clone()), "{key:?} appears twice");
    }
}

#[test]
fn grants_what_the_operator_itself_needs() {
    let role = role_for(WEBAPP);
    assert_eq!(verbs(&role, "", "events"), ["create", "patch"]);
    assert_eq!(verbs(&role, "events.k8s.io", "events"), ["create", "patch"]);
    assert!(
        verbs(&role, "coordination.k8s.io", "leases").is_empty(),
        "Leases are granted in the operator's namespace only"
    );
    assert_eq!(
        verbs(&role, "apiextensions.k8s.io", "customresourcedefinitions"),
        ["get", "list", "watch"]
    );
    assert_eq!(
        verbs(&role, "authorization.k8s.io", "selfsubjectaccessreviews"),
        ["create"]
    );

    let empty = cluster_role(&RuleSet::default(), "x");
    assert_eq!(empty["rules"].as_array().unwrap().len(), 4);
}

#[test]
fn labels_and_annotates_the_cluster_role() {
    let role = role_for(WEBAPP);
    assert_eq!(role["apiVersion"], "rbac.authorization.k8s.io/v1");
    assert_eq!(role["kind"], "ClusterRole");
    assert_eq!(role["metadata"]["name"], "trellis");
    assert_eq!(
        role["metadata"]["labels"],
        json!({"app.kubernetes.io/name": "trellis"})
    );
    assert_eq!(
        role["metadata"]["annotations"],
        json!({"trellis.dev/generated-by": "trellis rbac"})
    );
}

#[test]
fn no_finalizer_verbs_when_every_child_is_owned() {
    let role = role_for(WEBAPP);
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "webapps"),
        ["get", "list", "watch"]
    );
}

#[test]
fn grants_finalizer_verbs_on_parent_when_deletion_is_ordered() {
    let role = role_for(&format!("{WEBAPP}  deletion: {{order: reverse}}\n"));
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "webapps"),
        ["get", "list", "watch", "update", "patch"]
    );
}

#[test]
fn grants_finalizer_verbs_for_cluster_scoped_child_of_namespaced_parent() {
    let role = role_for(&rule_with_children(
        "{apiVersion: demo.trellis.dev/v1, kind: Project}",
        "    - id: ns\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
    ));
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "projects"),
        ["get", "list", "watch", "update", "patch"]
    );
    assert_eq!(
        verbs(&role, "", "namespaces"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
}

#[test]
fn finalizer_verbs_follow_child_scope_override_without_cross_namespace() {
    // Without allowCrossNamespace the planner rejects this child, but the
    // role stays conservative: a cluster-scoped child (here by override)
    // of a parent of unknown scope may be unowned.
    let role = role_for(&rule_with_children(
        "{apiVersion: demo.trellis.dev/v1, kind: Project}",
        "    - id: g\n      apiVersion: demo.trellis.dev/v1\n      kind: Global\n      scope: Cluster\n      template: |\n        metadata:\n          name: g\n",
    ));
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "projects"),
        ["get", "list", "watch", "update", "patch"]
    );
}

#[test]
fn no_finalizer_verbs_for_cluster_scoped_child_of_cluster_scoped_parent() {
    let role = role_for(&rule_with_children(
        "{apiVersion: demo.trellis.dev/v1, kind: Tenant, scope: Cluster}",
        "    - id: ns\n      apiVersion: v1\n      kind: Namespace\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
    ));
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "tenants"),
        ["get", "list", "watch"]
    );
}

#[test]
fn grants_finalizer_verbs_for_cross_namespace_child_whatever_the_parent_scope() {
    for scope in ["", ", scope: Cluster"] {
        let role = role_for(&rule_with_children(
            &format!("{{apiVersion: demo.trellis.dev/v1, kind: Tenant{scope}}}"),
            "    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      allowCrossNamespace: true\n      template: |\n        metadata:\n          name: x\n          namespace: shared\n",
        ));
        assert_eq!(
            verbs(&role, "demo.trellis.dev", "tenants"),
            ["get", "list", "watch", "update", "patch"],
            "parent{scope}"
        );
    }
}

#[test]
fn static_cluster_role_ref_grants_bind_with_resource_names() {
    let role = cluster_role(&load(&fixture("tenant")), "trellis");
    assert_eq!(
        named(&role, RBAC_GROUP, "clusterroles", "bind"),
        [["admin"]]
    );
    assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());
    assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
    assert!(named(&role, RBAC_GROUP, "roles", "bind").is_empty());
}

#[test]
fn static_role_ref_to_a_role_grants_bind_on_roles_by_name() {
    let role = role_for(&binding_rule(
        "RoleBinding",
        "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: \"Role\"  # local\n  name: 'deployer'\n",
    ));
    assert_eq!(named(&role, RBAC_GROUP, "roles", "bind"), [["deployer"]]);
    assert!(named(&role, RBAC_GROUP, "clusterroles", "bind").is_empty());
    assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());
}

#[test]
fn templated_role_ref_name_grants_bind_without_resource_names() {
    let role = role_for(&binding_rule(
        "RoleBinding",
        "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {{ spec.role }}\n",
    ));
    assert_eq!(verbs(&role, RBAC_GROUP, "clusterroles"), ["bind"]);
    assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
    assert!(named(&role, RBAC_GROUP, "clusterroles", "bind").is_empty());
}

#[test]
fn templated_role_ref_kind_grants_bind_on_both_role_kinds_by_name() {
    let role = role_for(&binding_rule(
        "RoleBinding",
        "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: {{ spec.kind }}\n  name: view\n",
    ));
    assert_eq!(named(&role, RBAC_GROUP, "clusterroles", "bind"), [["view"]]);
    assert_eq!(named(&role, RBAC_GROUP, "roles", "bind"), [["view"]]);
}

#[test]
fn unreadable_role_ref_grants_bind_on_every_role_the_binding_can_reference() {
    for role_ref in [
        "roleRef: {{ spec.roleRef }}\n",
        "roleRef:\n{% if spec.admin %}\n  kind: ClusterRole\n  name: admin\n{% endif %}\n",
        "roleRef:\n  kind: ClusterRole\n  {% if spec.admin %}name: admin{% else %}name: view{% endif %}\n",
    ] {
        let role = role_for(&binding_rule("RoleBinding", role_ref));
        assert_eq!(
            verbs(&role, RBAC_GROUP, "clusterroles"),
            ["bind"],
            "{role_ref}"
        );
        assert_eq!(verbs(&role, RBAC_GROUP, "roles"), ["bind"], "{role_ref}");
    }
    // A ClusterRoleBinding can only reference a ClusterRole.
    let role = role_for(&binding_rule(
        "ClusterRoleBinding",
        "roleRef: {{ spec.roleRef }}\n",
    ));
    assert_eq!(verbs(&role, RBAC_GROUP, "clusterroles"), ["bind"]);
    assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
}

#[test]
fn reads_flow_style_role_refs() {
    let role = role_for(&binding_rule(
        "ClusterRoleBinding",
        "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: \"view\"}\n",
    ));
    assert_eq!(named(&role, RBAC_GROUP, "clusterroles", "bind"), [["view"]]);
    assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());

    let role = role_for(&binding_rule(
        "RoleBinding",
        "roleRef: {kind: ClusterRole,\n  name: {{ spec.prefix ~ \"-, x\" }}}\n",
    ));
    assert_eq!(verbs(&role, RBAC_GROUP, "clusterroles"), ["bind"]);
    assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
}

#[test]
fn role_refs_in_alternative_branches_are_all_bound_by_name() {
    let role = role_for(&binding_rule(
        "RoleBinding",
        "{% if spec.admin %}\nroleRef:\n  kind: ClusterRole\n  name: admin\n{% else %}\nroleRef:\n  kind: ClusterRole\n  name: view\n{% endif %}\n",
    ));
    assert_eq!(
        named(&role, RBAC_GROUP, "clusterroles", "bind"),
        [["admin", "view"]]
    );
    assert!(verbs(&role, RBAC_GROUP, "clusterroles").is_empty());
    assert!(verbs(&role, RBAC_GROUP, "roles").is_empty());
}

#[test]
fn unrestricted_bind_supersedes_bind_by_name() {
    let mut grants = Grants::default();
    bind_grants(
        BindingKind::RoleBinding,
        &[
            RoleRef {
                kind: Some("ClusterRole".into()),
                name: Some("view".into()),
            },
            RoleRef {
                kind: Some("ClusterRole".into()),
                name: None,
            },
        ],
        &mut grants,
    );
    assert_eq!(
        grants.into_rules(),
        [json!({"apiGroups": [RBAC_GROUP], "resources": ["clusterroles"], "verbs": ["bind"]})]
    );
}

#[test]
fn never_grants_wildcards() {
    for case in ["tenant", "webapp"] {
        let role = cluster_role(&load(&fixture(case)), "trellis");
        for rule in role["rules"].as_array().unwrap() {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                for value in rule
                    .get(field)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    assert!(
                        !value.as_str().unwrap().contains('*'),
                        "{case}: wildcard in {rule}"
                    );
                }
            }
        }
    }
}

#[test]
fn output_is_sorted_and_stable() {
    let role = cluster_role(&load(&fixture("webapp")), "trellis");
    let keys: Vec<(String, String, bool)> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["apiGroups"][0].as_str().unwrap().to_owned(),
                r["resources"][0].as_str().unwrap().to_owned(),
                r.get("resourceNames").is_some(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    for rule in role["rules"].as_array().unwrap() {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let order = [
            "get", "list", "watch", "create", "update", "patch", "delete", "bind",
        ];
        let positions: Vec<usize> = verbs
            .iter()
            .map(|v| order.iter().position(|o| o == v).unwrap())
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "verbs out of order: {rule}"
        );
    }
    assert_eq!(role, cluster_role(&load(&fixture("webapp")), "trellis"));
}

/// Compares with `tests/fixtures/rbac/<case>/expected.json`; run with
/// `TRELLIS_BLESS=1` to rewrite the golden files after a deliberate change.
#[test]
fn matches_golden_files() {
    for case in ["tenant", "webapp"] {
        let role = cluster_role(&load(&fixture(case)), "trellis");
        let path = fixture(case).join("expected.json");
        let actual = serde_json::to_string_pretty(&role).unwrap() + "\n";
        if std::env::var_os("TRELLIS_BLESS").is_some() {
            fs::write(&path, &actual).unwrap();
        }
        let expected = fs::read_to_string(&path).unwrap_or_default();
        assert!(
            expected == actual,
            "{case}: ClusterRole differs from {}:\n{actual}",
            path.display()
        );
    }
}

#[test]
fn patch_targets_get_read_and_patch_never_create_or_delete_and_retained_children_patch() {
    let role = role_for(
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: team\nspec:\n  parent: {apiVersion: demo.trellis.dev/v1, kind: Team}\n  children:\n    - id: data\n      apiVersion: v1\n      kind: PersistentVolumeClaim\n      policy: createOnly\n      deletionPolicy: retain\n      template: '{metadata: {name: d}}'\n  patches:\n    - id: ns\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      template: '{metadata: {name: n, labels: {a: b}}}'\n",
    );
    assert_eq!(
        verbs(&role, "", "namespaces"),
        ["get", "list", "watch", "patch"]
    );
    assert_eq!(
        verbs(&role, "", "persistentvolumeclaims"),
        ["get", "list", "watch", "create", "patch", "delete"],
        "a createOnly child that is retained is released with a patch"
    );
    assert_eq!(
        verbs(&role, "demo.trellis.dev", "teams"),
        ["get", "list", "watch", "update", "patch"],
        "its parents carry the cleanup finalizer"
    );
}

fn app_rule(child_kind: &str, extra: &str) -> String {
    format!(
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent: {{apiVersion: demo.trellis.dev/v1, kind: App}}\n  children:\n    - id: d\n      apiVersion: apps/v1\n      kind: {child_kind}\n      template: 'metadata: {{name: x}}'\n{extra}"
    )
}

const STAGED: &str = "  rollout:\n    steps: [{percent: 50}]\n";

#[test]
fn a_rule_with_rollout_lets_the_operator_keep_its_revision_configmaps_in_its_namespace_only() {
    let set = |extra: &str| {
        crate::rules::testing::load_texts(&[("rule.yaml", &app_rule("Deployment", extra))])
    };
    let plain = namespaced_role(&set(""), "trellis", "ops");
    assert!(verbs(&plain, "", "configmaps").is_empty());
    let staged = namespaced_role(&set(STAGED), "trellis", "ops");
    assert_eq!(
        verbs(&staged, "", "configmaps"),
        ["list", "watch", "create", "patch", "delete"],
        "listed and watched by label, applied, pruned: never a GET"
    );
    assert!(
        verbs(&cluster_role(&set(STAGED), "trellis"), "", "configmaps").is_empty(),
        "nothing cluster-wide for the revisions"
    );
}

#[test]
fn the_namespaced_role_holds_the_leases_every_replica_and_shard_needs() {
    let role = namespaced_role(&RuleSet::default(), "trellis", "ops");
    assert_eq!(role["kind"], "Role");
    assert_eq!(role["apiVersion"], "rbac.authorization.k8s.io/v1");
    assert_eq!(
        role["metadata"],
        json!({
            "name": "trellis",
            "namespace": "ops",
            "labels": {"app.kubernetes.io/name": "trellis"},
            "annotations": {"trellis.dev/generated-by": "trellis rbac"},
        })
    );
    assert_eq!(
        role["rules"],
        json!([{
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }])
    );
}

#[test]
fn all_roles_prints_the_cluster_roles_then_the_role() {
    let texts = [(
        "rule.yaml",
        app_rule("Deployment", "  serviceAccountName: app-sa\n"),
    )];
    let set = crate::rules::testing::load_texts(&[(texts[0].0, texts[0].1.as_str())]);
    let rules: Vec<&CompiledRule> = set.rules.iter().map(|r| r.as_ref()).collect();
    let kinds: Vec<(Value, Value)> = all_roles(&rules, "trellis", "ops", false)
        .iter()
        .map(|r| (r["kind"].clone(), r["metadata"]["name"].clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            (json!("ClusterRole"), json!("trellis")),
            (json!("ClusterRole"), json!("trellis-rule-app")),
            (json!("Role"), json!("trellis")),
        ]
    );
}

#[test]
fn an_older_live_version_adds_what_the_version_on_disk_dropped() {
    // On disk the rule makes StatefulSets; a rollout still runs a version
    // that made Deployments on some parents.
    let on_disk =
        crate::rules::testing::load_texts(&[("rule.yaml", &app_rule("StatefulSet", STAGED))]);
    let older =
        crate::rules::testing::load_texts(&[("rule.yaml", &app_rule("Deployment", STAGED))]);
    let rules: Vec<&CompiledRule> = on_disk
        .rules
        .iter()
        .chain(&older.rules)
        .map(|r| r.as_ref())
        .collect();
    let roles = all_roles(&rules, "trellis", "ops", false);
    assert_eq!(roles.len(), 2, "one ClusterRole, one Role");
    let child = ["get", "list", "watch", "create", "patch", "delete"];
    assert_eq!(verbs(&roles[0], "apps", "statefulsets"), child);
    assert_eq!(verbs(&roles[0], "apps", "deployments"), child);
    assert_eq!(
        verbs(&roles[0], "demo.trellis.dev", "apps"),
        ["get", "list", "watch"],
        "one rule for the parent kind both versions share"
    );
    assert!(verbs(&cluster_role(&on_disk, "trellis"), "apps", "deployments").is_empty());
}

#[test]
fn account_roles_of_several_versions_are_one_role_per_rule() {
    let account = "  serviceAccountName: app-sa\n";
    let on_disk = crate::rules::testing::load_texts(&[(
        "rule.yaml",
        &app_rule("StatefulSet", &format!("{account}{STAGED}")),
    )]);
    let older = crate::rules::testing::load_texts(&[(
        "rule.yaml",
        &app_rule("Deployment", &format!("{account}{STAGED}")),
    )]);
    let rules: Vec<&CompiledRule> = on_disk
        .rules
        .iter()
        .chain(&older.rules)
        .map(|r| r.as_ref())
        .collect();
    let roles = cluster_roles_of(&rules, "trellis", false);
    assert_eq!(
        roles.len(),
        2,
        "the operator's role and one for the account"
    );
    assert_eq!(roles[1]["metadata"]["name"], "trellis-rule-app");
    let child = ["get", "list", "watch", "create", "patch", "delete"];
    assert_eq!(verbs(&roles[1], "apps", "statefulsets"), child);
    assert_eq!(verbs(&roles[1], "apps", "deployments"), child);
}

#[test]
fn rbac_for_manage_crds_grants_create_and_patch_on_the_generated_crds_by_name() {
    let set = crate::rules::testing::load_texts(&[(
        "rule.yaml",
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent: {apiVersion: demo.example.com/v1, kind: Policy}\n  crd: {}\n",
    )]);
    let crd_rules = |role: &Value| -> Vec<Value> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["resources"] == json!(["customresourcedefinitions"]))
            .cloned()
            .collect()
    };
    let plain = cluster_role_with(&set, "trellis", false);
    assert_eq!(
        crd_rules(&plain),
        [
            json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]})
        ]
    );
    let managing = cluster_role_with(&set, "trellis", true);
    let named: Vec<Value> = crd_rules(&managing)
        .into_iter()
        .filter(|r| r.get("resourceNames").is_some())
        .collect();
    assert_eq!(
        named,
        [
            json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "resourceNames": ["policies.demo.example.com"], "verbs": ["create"]}),
            json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "resourceNames": ["policies.demo.example.com"], "verbs": ["patch"]}),
        ]
    );
}

#[test]
fn a_rule_with_spoke_children_watches_the_cluster_secrets_and_keeps_a_finalizer() {
    let set = |child_extra: &str| {
        let text = app_rule("Deployment", "").replace(
            "      template: 'metadata: {name: x}'\n",
            &format!("{child_extra}      template: 'metadata: {{name: x}}'\n"),
        );
        crate::rules::testing::load_texts(&[("rule.yaml", &text)])
    };
    let plain = set("");
    assert!(verbs(&namespaced_role(&plain, "trellis", "ops"), "", "secrets").is_empty());
    let placed = set("      cluster: spec.region\n");
    assert_eq!(
        verbs(&namespaced_role(&placed, "trellis", "ops"), "", "secrets"),
        ["list", "watch"],
        "the Secrets registering spokes, in the operator's namespace only"
    );
    assert!(verbs(&cluster_role(&placed, "trellis"), "", "secrets").is_empty());
    assert_eq!(
        verbs(
            &namespaced_role(&placed, "trellis", "ops"),
            "",
            "configmaps"
        ),
        ["get", "create", "patch"],
        "the record of spoke cleanups under way, in the operator's namespace only"
    );
    assert!(verbs(&namespaced_role(&plain, "trellis", "ops"), "", "configmaps").is_empty());
    assert_eq!(
        verbs(
            &cluster_role(&placed, "trellis"),
            "demo.trellis.dev",
            "apps"
        ),
        ["get", "list", "watch", "update", "patch"],
        "the cleanup finalizer takes spoke children away"
    );
}

#[test]
fn shards_add_patch_on_each_parent_kind_and_nothing_else() {
    let set = crate::rules::testing::load_texts(&[("rule.yaml", WEBAPP)]);
    let rules: Vec<&CompiledRule> = set.rules.iter().map(|r| r.as_ref()).collect();
    let plain = all_roles(&rules, "trellis", "ops", false);
    let sharded = all_roles_with(&rules, "trellis", "ops", false, true);
    assert_eq!(
        verbs(&plain[0], "demo.trellis.dev", "webapps"),
        ["get", "list", "watch"]
    );
    assert_eq!(
        verbs(&sharded[0], "demo.trellis.dev", "webapps"),
        ["get", "list", "watch", "patch"],
        "the bucket label"
    );
    assert_eq!(plain[1], sharded[1], "the Role is the same");
    assert_eq!(
        shard_label_permission(rules[0]).to_string(),
        "patch webapps.demo.trellis.dev"
    );
}
