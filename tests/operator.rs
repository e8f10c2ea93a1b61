//! `trellis run` against the real control plane: a parent's children and
//! status through its life (create, update, prune, invalid spec, dependsOn,
//! pause). When status is (not) written: `operator_status.rs`. What the
//! operator does when children change under it, and child policies:
//! `operator_children.rs`.
//!
//! Each test runs the operator in-process, watching only its own namespace,
//! with a parent kind in an API group of its own (see `support::operator`).
mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use support::operator::{
    Cleanup, Operator, QUIET, TestKind, WAIT, assert_absent, condition, condition_state,
    config_data, start_with_new_kind, wait_condition, wait_condition_reason, wait_data, wait_event,
    wait_exists, wait_for, wait_gone, wait_ready_and_synced,
};

/// One ConfigMap per parent, and status fields from the spec and the child.
const APP_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  schema:
    type: object
    properties:
      greeting: {type: string}
      replicas: {type: integer, minimum: 1}
  defaults:
    greeting: hello
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
          labels:
            app.kubernetes.io/name: app
        data:
          greeting: {{ spec.greeting }}
  status:
    fields:
      - path: greeting
        value: "spec.greeting"
      - path: config.name
        from: config
        jsonPath: $.metadata.name
        default: none
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_a_parent_creates_labelled_owned_children_and_writes_status() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", APP_RULE).await;
    let parent = app
        .create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let uid = parent.uid().expect("parent uid");
    let cms: Api<ConfigMap> = ns.api();

    let cm = wait_exists(&cms, "shop-config").await;
    assert_eq!(config_data(&cm, "greeting").as_deref(), Some("hi"));
    let labels = cm.labels();
    for (k, v) in [
        ("app.kubernetes.io/managed-by", "trellis"),
        ("trellis.dev/rule", "app"),
        ("trellis.dev/child", "config"),
        ("trellis.dev/parent-uid", uid.as_str()),
        ("app.kubernetes.io/name", "app"),
    ] {
        assert_eq!(
            labels.get(k).map(String::as_str),
            Some(v),
            "label {k}: {labels:?}"
        );
    }
    let owners = cm.owner_references();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = &owners[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        (app.api_version().as_str(), "App", "shop")
    );
    assert_eq!(owner.uid, uid);
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    let managers: Vec<(String, String)> = cm
        .managed_fields()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("trellis/app".into(), "Apply".into())),
        "managedFields: {managers:?}"
    );

    let parents = app.api(&ns);
    let parent = wait_condition(&parents, "shop", "Ready", "True").await;
    let status = &parent.data["status"];
    assert_eq!(status["observedGeneration"], json!(1), "{status}");
    assert_eq!(status["greeting"], "hi", "{status}");
    assert_eq!(status["config"]["name"], "shop-config", "{status}");
    let ready = condition(&parent, "Ready").expect("Ready");
    assert_eq!(ready["reason"], "AllChildrenReady", "{ready}");
    assert_eq!(ready["observedGeneration"], json!(1), "{ready}");
    assert!(ready["lastTransitionTime"].is_string(), "{ready}");
    assert_eq!(
        condition_state(&parent, "Synced").unwrap(),
        ("True".into(), "Applied".into())
    );

    // The creation is told as an Event on the parent.
    wait_event(&ns, "a Created Event on the parent", |e| {
        e.reason.as_deref() == Some("Created")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("shop")
    })
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updating_the_parent_spec_updates_children_and_observed_generation() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", APP_RULE).await;
    app.create(&ns, "shop", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    let parents = app.api(&ns);

    // The rule's default fills the missing greeting.
    let cm = wait_exists(&cms, "shop-config").await;
    assert_eq!(config_data(&cm, "greeting").as_deref(), Some("hello"));
    wait_for(&parents, "shop", "status for generation 1", |p| {
        (p.data["status"]["observedGeneration"] == json!(1))
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;

    let updated = app
        .patch(&ns, "shop", json!({"spec": {"greeting": "bonjour"}}))
        .await;
    let generation = updated.metadata.generation.expect("generation");
    assert_eq!(generation, 2);
    wait_data(
        &cms,
        "shop-config",
        "the ConfigMap to follow the spec",
        "greeting",
        "bonjour",
    )
    .await;
    let parent = wait_for(&parents, "shop", "status for generation 2", |p| {
        let status = &p.data["status"];
        if status["observedGeneration"] == json!(generation) && status["greeting"] == "bonjour" {
            Ok(p.clone())
        } else {
            Err(format!("status {status}"))
        }
    })
    .await;
    for type_ in ["Ready", "Synced"] {
        let c = condition(&parent, type_).expect("condition");
        assert_eq!(c["status"], "True", "{c}");
        assert_eq!(c["observedGeneration"], json!(generation), "{c}");
    }
    operator.stop().await;
}

const PRUNE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: prune
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      includeWhen: "spec.extra"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
    - id: host
      apiVersion: v1
      kind: ConfigMap
      forEach: "spec.hosts"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-host-" ~ item }}
        data:
          host: {{ item }}
          index: {{ index | string }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_when_turning_false_and_a_removed_for_each_item_prune_their_children() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "Site", PRUNE_RULE).await;
    app.create(
        &ns,
        "web",
        json!({"extra": true, "hosts": ["a", "b", "c"]}),
        &[],
    )
    .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "web-extra").await;
    let mut uids = Vec::new();
    for host in ["a", "b", "c"] {
        uids.push(wait_exists(&cms, &format!("web-host-{host}")).await.uid());
    }

    app.patch(
        &ns,
        "web",
        json!({"spec": {"extra": false, "hosts": ["a", "c"]}}),
    )
    .await;
    wait_gone(&cms, "web-extra", WAIT).await;
    wait_gone(&cms, "web-host-b", WAIT).await;

    // The remaining items keep their objects (named after the item, not its index).
    let a = cms.get("web-host-a").await.expect("web-host-a");
    assert_eq!(a.uid(), uids[0]);
    let c = wait_data(
        &cms,
        "web-host-c",
        "web-host-c to carry its new index",
        "index",
        "1",
    )
    .await;
    assert_eq!(c.uid(), uids[2]);
    let managed = cms
        .list(&ListParams::default().labels("trellis.dev/rule=prune"))
        .await
        .expect("list");
    let mut names: Vec<String> = managed.items.iter().map(|c| c.name_any()).collect();
    names.sort();
    assert_eq!(names, ["web-host-a", "web-host-c"]);
    operator.stop().await;
}

/// A child whose readiness is the parent's `spec.ready`, and one to prune.
const READY_WHEN_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: typed
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      includeWhen: "spec.extra"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
    - id: probe
      apiVersion: v1
      kind: ConfigMap
      readyWhen: "spec.ready"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-probe" }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_when_that_is_not_a_boolean_is_a_render_error_and_prunes_nothing() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "Probe", READY_WHEN_RULE).await;
    app.create(&ns, "p", json!({"extra": true, "ready": true}), &[])
        .await;
    let parents = app.api(&ns);
    wait_ready_and_synced(&parents, "p").await;
    let cms: Api<ConfigMap> = ns.api();
    let extra = wait_exists(&cms, "p-extra").await;

    // `extra` is no longer wanted, but the pass fails: nothing is pruned.
    app.patch(&ns, "p", json!({"spec": {"extra": false, "ready": "yes"}}))
        .await;
    let parent = wait_condition_reason(&parents, "p", "Synced", "False", "RenderError").await;
    let message = condition(&parent, "Synced").expect("Synced")["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("probe") && message.contains("spec.ready"),
        "the message names the child and the expression: {message}"
    );
    assert_eq!(condition_state(&parent, "Ready").unwrap().0, "False");
    tokio::time::sleep(QUIET).await;
    let kept = cms.get("p-extra").await.expect("p-extra is not pruned");
    assert_eq!(kept.uid(), extra.uid());

    // Once the expression is a boolean again, the pass is clean and prunes.
    app.patch(&ns, "p", json!({"spec": {"ready": true}})).await;
    wait_gone(&cms, "p-extra", WAIT).await;
    wait_ready_and_synced(&parents, "p").await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_spec_sets_synced_false_invalid_spec_and_leaves_children_untouched() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", APP_RULE).await;
    app.create(&ns, "shop", json!({"greeting": "hi", "replicas": 2}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    let parents = app.api(&ns);
    wait_condition(&parents, "shop", "Synced", "True").await;
    let before = cms.get("shop-config").await.expect("child");

    // Invalid (replicas < 1), and with a greeting that would change the child.
    app.patch(
        &ns,
        "shop",
        json!({"spec": {"greeting": "changed", "replicas": 0}}),
    )
    .await;
    let parent = wait_condition_reason(&parents, "shop", "Synced", "False", "InvalidSpec").await;
    let synced = condition(&parent, "Synced").expect("Synced");
    let message = synced["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.replicas"),
        "message names the field: {message}"
    );
    assert_eq!(parent.data["status"]["observedGeneration"], json!(2));
    assert_eq!(condition_state(&parent, "Ready").unwrap().0, "False");

    wait_event(&ns, "a Warning InvalidSpec Event", |e| {
        e.reason.as_deref() == Some("InvalidSpec") && e.type_.as_deref() == Some("Warning")
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let after = cms
        .get("shop-config")
        .await
        .expect("the child still exists");
    assert_eq!(after.uid(), before.uid());
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "the child was written"
    );
    assert_eq!(config_data(&after, "greeting").as_deref(), Some("hi"));
    operator.stop().await;
}

const DEPENDS_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: stack
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: db
      apiVersion: @API_VERSION@
      kind: Database
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-db" }}
        spec:
          size: {{ spec.size }}
      readyWhen: "self.status.ready | default(false)"
    - id: app
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [db]
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-app" }}
        data:
          database: {{ children.db.metadata.name }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depends_on_holds_back_a_child_until_its_dependency_is_ready() {
    let ns = support::namespace().await;
    let stack = TestKind::new("Stack");
    let database = stack.sibling("Database");
    let _cleanup = Cleanup::crds(&[&stack, &database]);
    stack.install(&ns.client).await;
    database.install(&ns.client).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&stack.rule(DEPENDS_RULE)]);

    stack.create(&ns, "orders", json!({"size": 3}), &[]).await;
    let databases = database.api(&ns);
    let db = wait_exists(&databases, "orders-db").await;
    assert_eq!(db.data["spec"]["size"], json!(3));
    let parents = stack.api(&ns);
    let parent =
        wait_condition_reason(&parents, "orders", "Synced", "False", "DependencyNotReady").await;
    let synced = condition(&parent, "Synced").expect("Synced");
    let message = synced["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"app\"") && message.contains("\"db\""),
        "{message}"
    );
    // Ready names the first child that is not: the database itself.
    let ready = condition(&parent, "Ready").expect("Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("ChildNotReady"))
    );
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"db\"") && message.contains("readyWhen"),
        "{message}"
    );
    let cms: Api<ConfigMap> = ns.api();
    assert_absent(&cms, "orders-app", "its dependency is not ready").await;

    databases
        .patch_status(
            "orders-db",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}})),
        )
        .await
        .expect("mark the database ready");
    let app = wait_exists(&cms, "orders-app").await;
    assert_eq!(config_data(&app, "database").as_deref(), Some("orders-db"));
    wait_ready_and_synced(&parents, "orders").await;
    operator.stop().await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_parent_gets_no_children_until_the_annotation_is_removed() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", APP_RULE).await;
    app.create(&ns, "paused", json!({}), &[("trellis.dev/paused", "true")])
        .await;
    app.create(&ns, "running", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();

    // The operator is at work: the other parent gets its child.
    wait_exists(&cms, "running-config").await;
    tokio::time::sleep(QUIET).await;
    assert_absent(&cms, "paused-config", "its parent is paused").await;
    let parent = app.api(&ns).get("paused").await.expect("parent");
    assert!(
        parent.data.get("status").is_none(),
        "status written: {:?}",
        parent.data
    );

    app.patch(
        &ns,
        "paused",
        json!({"metadata": {"annotations": {"trellis.dev/paused": null}}}),
    )
    .await;
    wait_exists(&cms, "paused-config").await;
    operator.stop().await;
}
