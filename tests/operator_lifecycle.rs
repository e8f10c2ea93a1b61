//! `trellis run` against the real control plane: deletion, rules starting
//! late, several rules in one process, and permissions.
mod support;

use k8s_openapi::api::authorization::v1::ResourceAttributes;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use support::operator::{
    Cleanup, LogCapture, Operator, QUIET, TestKind, WAIT, assert_absent, condition_state,
    install_kind, rule_set, service_account_with_role, wait_condition, wait_exists, wait_finalizer,
    wait_for, wait_gone,
};

/// One ConfigMap per parent; `@NAME@` is the rule's name.
const CONFIG_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: @NAME@
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-" ~ rule.name }}
        data:
          rule: {{ rule.name }}
  status:
    fields:
      - path: child
        from: config
        jsonPath: $.metadata.name
"#;

fn config_rule(kind: &TestKind, name: &str) -> String {
    kind.rule(CONFIG_RULE).replace("@NAME@", name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_parent_lets_the_garbage_collector_remove_its_children() {
    let ns = support::namespace().await;
    // Kept installed: on a cluster that has run this test before, the
    // garbage collector knows the kind and acts within a second.
    let app = TestKind::lasting("gc.trellis.test", "App");
    app.install(&ns.client).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&config_rule(&app, "app")]);
    app.create(&ns, "shop", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "shop-app").await;
    let parents = app.api(&ns);
    // Every child is owned: no finalizer is needed, none is added.
    let parent = wait_for(&parents, "shop", "the parent's status", |p| {
        condition_state(p, "Synced").map(|_| p.clone())
    })
    .await;
    assert!(parent.finalizers().is_empty(), "{:?}", parent.finalizers());

    parents
        .delete("shop", &DeleteParams::background())
        .await
        .expect("delete parent");
    wait_gone(&parents, "shop", WAIT).await;
    // Up to 30 s more when the garbage collector has yet to discover the kind.
    wait_gone(&cms, "shop-app", std::time::Duration::from_secs(90)).await;
    operator.stop().await;
}

/// A cluster-scoped child of a namespaced parent (no ownerReference can
/// reach it) and a namespaced child that depends on it; deletion in reverse.
const TEARDOWN_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: teardown
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: role
      apiVersion: rbac.authorization.k8s.io/v1
      kind: ClusterRole
      allowCrossNamespace: true
      template: |
        metadata:
          name: {{ spec.roleName }}
        rules:
          - apiGroups: [""]
            resources: [configmaps]
            verbs: [get]
    - id: config
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [role]
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        data:
          role: {{ spec.roleName }}
  deletion:
    order: reverse
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_deletion_removes_a_cluster_scoped_child_behind_a_finalizer() {
    let ns = support::namespace().await;
    let (app, mut cleanup) = install_kind(&ns, "Team").await;
    let role_name = support::unique_name("trellis-test-team");
    cleanup.add::<ClusterRole>(&role_name);
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(TEARDOWN_RULE)]);
    let parent = app
        .create(&ns, "blue", json!({"roleName": role_name}), &[])
        .await;
    let roles: Api<ClusterRole> = Api::all(ns.client.clone());
    let cms: Api<ConfigMap> = ns.api();

    let role = wait_exists(&roles, &role_name).await;
    assert!(
        role.owner_references().is_empty(),
        "{:?}",
        role.owner_references()
    );
    assert_eq!(
        role.labels().get("trellis.dev/parent-uid"),
        parent.uid().as_ref()
    );
    wait_exists(&cms, "blue").await;
    let parents = app.api(&ns);
    wait_finalizer(&parents, "blue").await;

    parents
        .delete("blue", &DeleteParams::background())
        .await
        .expect("delete parent");
    // The dependent ConfigMap goes before the ClusterRole it depends on.
    support::eventually(
        "both children to be deleted, in reverse order",
        WAIT,
        || async {
            let role = roles.get_opt(&role_name).await.map_err(|e| e.to_string())?;
            let cm = cms.get_opt("blue").await.map_err(|e| e.to_string())?;
            match (role, cm) {
                (None, None) => Ok(()),
                (None, Some(_)) => {
                    panic!("the ClusterRole was deleted before the ConfigMap depending on it")
                }
                _ => Err("children remain".to_owned()),
            }
        },
    )
    .await;
    wait_gone(&parents, "blue", WAIT).await;
    operator.stop().await;
}

#[tokio::test]
async fn a_rule_whose_crd_is_installed_later_activates_by_itself() {
    let logs = LogCapture::start();
    let ns = support::namespace().await;
    let app = TestKind::new("Late");
    let _cleanup = Cleanup::crds(&[&app]);
    let operator = Operator::start(&ns.client, ns.name(), &[&config_rule(&app, "late")]);
    support::eventually("the rule to wait for its kind", WAIT, || async {
        let lines = logs.lines();
        lines
            .iter()
            .any(|l| l.contains("waiting") && l.contains("rule=late"))
            .then_some(())
            .ok_or(lines)
    })
    .await;

    app.install(&ns.client).await;
    app.create(&ns, "shop", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "shop-late").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_whose_crd_is_removed_and_reinstalled_resumes() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Again").await;
    let operator = Operator::start(&ns.client, ns.name(), &[&config_rule(&app, "again")]);
    app.create(&ns, "one", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "one-again").await;

    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    crds.delete(&app.crd_name(), &DeleteParams::default())
        .await
        .expect("delete CRD");
    wait_gone(&crds, &app.crd_name(), WAIT).await;
    app.install(&ns.client).await;
    app.create(&ns, "two", json!({}), &[]).await;
    wait_exists(&cms, "two-again").await;
    wait_condition(&app.api(&ns), "two", "Ready", "True").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rules_on_two_kinds_work_side_by_side() {
    let ns = support::namespace().await;
    let app = TestKind::new("App");
    let job = app.sibling("Job");
    let _cleanup = Cleanup::crds(&[&app, &job]);
    app.install(&ns.client).await;
    job.install(&ns.client).await;
    let operator = Operator::start(
        &ns.client,
        ns.name(),
        &[&config_rule(&app, "apps"), &config_rule(&job, "jobs")],
    );
    app.create(&ns, "a", json!({}), &[]).await;
    job.create(&ns, "j", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    let a = wait_exists(&cms, "a-apps").await;
    let j = wait_exists(&cms, "j-jobs").await;
    assert_eq!(a.owner_references()[0].kind, "App");
    assert_eq!(j.owner_references()[0].kind, "Job");
    for (kind, name, child) in [(&app, "a", "a-apps"), (&job, "j", "j-jobs")] {
        wait_for(&kind.api(&ns), name, "the parent's status", |p| {
            match (condition_state(p, "Ready")?, &p.data["status"]["child"]) {
                ((s, _), Value::String(c)) if s == "True" && c == child => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    // Each rule makes only its own children.
    assert_absent(&cms, "a-jobs", "rule jobs does not watch App").await;
    assert_absent(&cms, "j-apps", "rule apps does not watch Job").await;
    operator.stop().await;
}

/// Binds the ClusterRole `trellis rbac` prints for `rule` to a ServiceAccount
/// of the test, minus `drop_verb` on ConfigMaps; returns a client acting as it.
async fn service_account_client(
    ns: &support::TestNamespace,
    rule: &str,
    drop_verb: Option<&str>,
    cleanup: &mut Cleanup,
) -> Client {
    let name = support::unique_name("trellis-test-sa");
    let mut role = trellis::rbac::cluster_role(&rule_set(&[rule]), &name);
    if let Some(verb) = drop_verb {
        for r in role["rules"].as_array_mut().expect("rules") {
            if r["resources"] == json!(["configmaps"]) {
                let verbs = r["verbs"].as_array_mut().expect("verbs");
                verbs.retain(|v| v != verb);
            }
        }
    }
    let probe = ResourceAttributes {
        resource: Some("configmaps".into()),
        verb: Some("get".into()),
        namespace: Some(ns.name().to_owned()),
        ..Default::default()
    };
    service_account_with_role(ns, role, probe, cleanup).await
}

fn forbidden_lines(logs: &LogCapture) -> Vec<String> {
    logs.lines()
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
        .collect()
}

#[tokio::test]
async fn a_service_account_with_the_role_trellis_rbac_prints_runs_the_rule() {
    let logs = LogCapture::start();
    let ns = support::namespace().await;
    let (app, mut cleanup) = install_kind(&ns, "App").await;
    let rule = config_rule(&app, "rbac");
    let client = service_account_client(&ns, &rule, None, &mut cleanup).await;
    let operator = Operator::start(&client, ns.name(), &[&rule]);
    app.create(&ns, "shop", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "shop-rbac").await;
    wait_condition(&app.api(&ns), "shop", "Ready", "True").await;
    operator.stop().await;
    assert_eq!(forbidden_lines(&logs), Vec::<String>::new());
}

#[tokio::test]
async fn a_rule_missing_a_permission_stays_inactive_without_a_storm_of_403s() {
    let logs = LogCapture::start();
    let ns = support::namespace().await;
    let (app, mut cleanup) = install_kind(&ns, "App").await;
    let rule = config_rule(&app, "limited");
    let client = service_account_client(&ns, &rule, Some("patch"), &mut cleanup).await;
    let operator = Operator::start(&client, ns.name(), &[&rule]);
    app.create(&ns, "shop", json!({}), &[]).await;

    let inactive = support::eventually("the rule to be reported inactive", WAIT, || async {
        let lines = logs.lines();
        lines
            .iter()
            .find(|l| l.contains("inactive") && l.contains("rule=limited"))
            .cloned()
            .ok_or(lines)
    })
    .await;
    assert!(
        inactive.contains("patch configmaps in namespace"),
        "the message names the missing permission: {inactive}"
    );
    tokio::time::sleep(QUIET).await;
    let cms: Api<ConfigMap> = ns.api();
    assert_absent(&cms, "shop-limited", "the rule is inactive").await;
    let parent = app.api(&ns).get("shop").await.expect("parent");
    assert!(parent.data.get("status").is_none(), "{:?}", parent.data);
    assert_eq!(forbidden_lines(&logs), Vec::<String>::new());
    operator.stop().await;
}

/// Stopped at any moment of a rule's start — before its watches have
/// listed anything, too — the operator still stops promptly (the controller
/// used to wait forever for a parent list that its own shutdown had cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_stopped_while_its_rule_starts_stops_promptly() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    app.create(&ns, "shop", json!({}), &[]).await;
    let rule = config_rule(&app, "early");
    for delay_ms in (0..=200).step_by(20) {
        let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        // Panics unless the operator exits within WAIT.
        operator.stop().await;
    }
}
