//! `trellis run` against the real control plane: children and status.
//!
//! Each test runs the operator in-process, watching only its own namespace,
//! with a parent kind in an API group of its own (see `support::operator`).
mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use support::operator::{
    Cleanup, Operator, QUIET, TestKind, WAIT, assert_absent, condition, condition_state,
    wait_exists, wait_for, wait_gone,
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

/// Installs a fresh parent kind and starts the operator with `rule` for it.
async fn app_setup(
    ns: &support::TestNamespace,
    kind: &str,
    rule: &str,
) -> (TestKind, Cleanup, Operator) {
    let app = TestKind::new(kind);
    let cleanup = Cleanup::crds(&[&app]);
    app.install(&ns.client).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(rule)]);
    (app, cleanup, operator)
}

fn data(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get(key)).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_a_parent_creates_labelled_owned_children_and_writes_status() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "App", APP_RULE).await;
    let parent = app
        .create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let uid = parent.uid().expect("parent uid");
    let cms: Api<ConfigMap> = ns.api();

    let cm = wait_exists(&cms, "shop-config").await;
    assert_eq!(data(&cm, "greeting").as_deref(), Some("hi"));
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
    let parent = wait_for(
        &parents,
        "shop",
        "Ready=True on the parent",
        |p| match condition_state(p, "Ready")? {
            (s, _) if s == "True" => Ok(p.clone()),
            other => Err(format!("Ready is {other:?}")),
        },
    )
    .await;
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
    let events: Api<Event> = ns.api();
    support::eventually("a Created Event on the parent", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|e| {
                e.reason.as_deref() == Some("Created")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("shop")
            })
            .map(|_| ())
            .ok_or_else(|| format!("{} events, none Created for shop", list.items.len()))
    })
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updating_the_parent_spec_updates_children_and_observed_generation() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "App", APP_RULE).await;
    app.create(&ns, "shop", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    let parents = app.api(&ns);

    // The rule's default fills the missing greeting.
    let cm = wait_exists(&cms, "shop-config").await;
    assert_eq!(data(&cm, "greeting").as_deref(), Some("hello"));
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
    wait_for(
        &cms,
        "shop-config",
        "the ConfigMap to follow the spec",
        |cm| match data(cm, "greeting").as_deref() {
            Some("bonjour") => Ok(()),
            other => Err(format!("greeting is {other:?}")),
        },
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
    let (app, _cleanup, operator) = app_setup(&ns, "Site", PRUNE_RULE).await;
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
    let c = wait_for(
        &cms,
        "web-host-c",
        "web-host-c to carry its new index",
        |cm| match data(cm, "index").as_deref() {
            Some("1") => Ok(cm.clone()),
            other => Err(format!("index is {other:?}")),
        },
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_spec_sets_synced_false_invalid_spec_and_leaves_children_untouched() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "App", APP_RULE).await;
    app.create(&ns, "shop", json!({"greeting": "hi", "replicas": 2}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    let parents = app.api(&ns);
    wait_for(
        &parents,
        "shop",
        "Synced=True",
        |p| match condition_state(p, "Synced")? {
            (s, _) if s == "True" => Ok(()),
            other => Err(format!("Synced is {other:?}")),
        },
    )
    .await;
    let before = cms.get("shop-config").await.expect("child");

    // Invalid (replicas < 1), and with a greeting that would change the child.
    app.patch(
        &ns,
        "shop",
        json!({"spec": {"greeting": "changed", "replicas": 0}}),
    )
    .await;
    let parent = wait_for(
        &parents,
        "shop",
        "Synced=False/InvalidSpec",
        |p| match condition_state(p, "Synced")? {
            (s, r) if s == "False" && r == "InvalidSpec" => Ok(p.clone()),
            other => Err(format!("Synced is {other:?}")),
        },
    )
    .await;
    let synced = condition(&parent, "Synced").expect("Synced");
    let message = synced["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.replicas"),
        "message names the field: {message}"
    );
    assert_eq!(parent.data["status"]["observedGeneration"], json!(2));
    assert_eq!(condition_state(&parent, "Ready").unwrap().0, "False");

    let events: Api<Event> = ns.api();
    support::eventually("a Warning InvalidSpec Event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|e| {
                e.reason.as_deref() == Some("InvalidSpec") && e.type_.as_deref() == Some("Warning")
            })
            .map(|_| ())
            .ok_or_else(|| "no InvalidSpec event yet".to_owned())
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
    assert_eq!(data(&after, "greeting").as_deref(), Some("hi"));
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
        wait_for(
            &parents,
            "orders",
            "Synced=False/DependencyNotReady",
            |p| match condition_state(p, "Synced")? {
                (s, r) if s == "False" && r == "DependencyNotReady" => Ok(p.clone()),
                other => Err(format!("Synced is {other:?}")),
            },
        )
        .await;
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
    assert_eq!(data(&app, "database").as_deref(), Some("orders-db"));
    wait_for(
        &parents,
        "orders",
        "Ready=True and Synced=True",
        |p| match (condition_state(p, "Ready")?, condition_state(p, "Synced")?) {
            ((r, _), (s, _)) if r == "True" && s == "True" => Ok(()),
            other => Err(format!("Ready, Synced: {other:?}")),
        },
    )
    .await;
    operator.stop().await;
}

const DRIFT_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: drift
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
          name: {{ parent.metadata.name }}
        data:
          mode: {{ spec.mode }}
    # No replicas: whoever scales the Deployment owns that field.
    - id: web
      apiVersion: apps/v1
      kind: Deployment
      template: |
        metadata:
          name: {{ parent.metadata.name }}
          annotations:
            demo.trellis.dev/mode: {{ spec.mode }}
        spec:
          selector:
            matchLabels: {app: {{ parent.metadata.name }}}
          template:
            metadata:
              labels: {app: {{ parent.metadata.name }}}
            spec:
              containers:
                - name: web
                  image: registry.example/web:1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drifted_children_are_restored_and_fields_the_template_omits_are_left_alone() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "Svc", DRIFT_RULE).await;
    app.create(&ns, "api", json!({"mode": "fast"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    let deployments: Api<Deployment> = ns.api();
    let original = wait_exists(&cms, "api").await;
    wait_exists(&deployments, "api").await;

    // Deleted by someone else: recreated.
    cms.delete("api", &DeleteParams::default())
        .await
        .expect("delete child");
    wait_for(&cms, "api", "the deleted ConfigMap to be recreated", |cm| {
        (cm.uid() != original.uid())
            .then_some(())
            .ok_or_else(|| "still the old object".to_owned())
    })
    .await;

    // A field the template sets is restored; a label it does not set stays.
    let edit = json!({"metadata": {"labels": {"added-by": "someone"}}, "data": {"mode": "slow"}});
    cms.patch("api", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit child");
    let restored = wait_for(&cms, "api", "data.mode to be restored", |cm| {
        match data(cm, "mode").as_deref() {
            Some("fast") => Ok(cm.clone()),
            other => Err(format!("mode is {other:?}")),
        }
    })
    .await;
    assert_eq!(
        restored.labels().get("added-by").map(String::as_str),
        Some("someone")
    );

    // Scaled by someone else, with a template field edited in the same write:
    // the annotation is restored, the replicas stay.
    let scale = json!({
        "metadata": {"annotations": {"demo.trellis.dev/mode": "slow"}},
        "spec": {"replicas": 3}
    });
    deployments
        .patch("api", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .expect("scale");
    let web = wait_for(
        &deployments,
        "api",
        "the Deployment annotation to be restored",
        |d| match d
            .annotations()
            .get("demo.trellis.dev/mode")
            .map(String::as_str)
        {
            Some("fast") => Ok(d.clone()),
            other => Err(format!("annotation is {other:?}")),
        },
    )
    .await;
    assert_eq!(web.spec.as_ref().and_then(|s| s.replicas), Some(3));
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_status_is_not_written_again() {
    let ns = support::namespace().await;
    let rule = APP_RULE.replace("  status:\n", "  resync: 1s\n  status:\n");
    let (app, _cleanup, operator) = app_setup(&ns, "App", &rule).await;
    app.create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let parents = app.api(&ns);
    wait_for(&parents, "shop", "Ready=True and Synced=True", |p| {
        match (condition_state(p, "Ready")?, condition_state(p, "Synced")?) {
            ((r, _), (s, _)) if r == "True" && s == "True" => Ok(()),
            other => Err(format!("Ready, Synced: {other:?}")),
        }
    })
    .await;
    // Let the reconciles that the status write itself triggered settle.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = parents.get("shop").await.expect("parent");

    // A reconcile that happens (it restores the child) but changes no status.
    let cms: Api<ConfigMap> = ns.api();
    let edit = json!({"data": {"greeting": "edited"}});
    cms.patch("shop-config", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit child");
    wait_for(
        &cms,
        "shop-config",
        "the child to be restored",
        |cm| match data(cm, "greeting").as_deref() {
            Some("hi") => Ok(()),
            other => Err(format!("greeting is {other:?}")),
        },
    )
    .await;
    // And resyncs every second.
    tokio::time::sleep(QUIET).await;
    let after = parents.get("shop").await.expect("parent");
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "the parent was written: status before {} after {}",
        before.data["status"],
        after.data["status"]
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_parent_gets_no_children_until_the_annotation_is_removed() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "App", APP_RULE).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_kind_without_status_subresource_is_written_once_and_settles() {
    let ns = support::namespace().await;
    let app = TestKind::new("App");
    let _cleanup = Cleanup::crds(&[&app]);
    support::apply_crd(&ns.client, &app.crd_without_status_subresource()).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(APP_RULE)]);
    app.create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let parents = app.api(&ns);
    wait_for(&parents, "shop", "Ready=True", |p| {
        match condition_state(p, "Ready")? {
            (s, _) if s == "True" => Ok(()),
            other => Err(format!("Ready is {other:?}")),
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = parents.get("shop").await.expect("parent");
    assert_eq!(before.data["status"]["greeting"], "hi");
    tokio::time::sleep(QUIET).await;
    let after = parents.get("shop").await.expect("parent");
    assert_eq!(
        (after.resource_version(), after.metadata.generation),
        (before.resource_version(), before.metadata.generation),
        "the parent keeps being written: status {}",
        after.data["status"]
    );
    // The status claims the generation its own write produced.
    let generation = after.metadata.generation.expect("generation");
    assert_eq!(
        after.data["status"]["observedGeneration"],
        json!(generation)
    );
    let ready = condition(&after, "Ready").expect("Ready");
    assert_eq!(ready["observedGeneration"], json!(generation), "{ready}");
    operator.stop().await;
}

const STALE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: stale
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
  status:
    fields:
      - path: extra.name
        from: extra
        jsonPath: $.metadata.name
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_field_whose_source_child_is_pruned_is_removed() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "App", STALE_RULE).await;
    app.create(&ns, "shop", json!({"extra": true}), &[]).await;
    let parents = app.api(&ns);
    wait_for(&parents, "shop", "status.extra.name", |p| {
        match &p.data["status"]["extra"]["name"] {
            serde_json::Value::String(s) if s == "shop-extra" => Ok(()),
            other => Err(format!("{other}")),
        }
    })
    .await;
    app.patch(&ns, "shop", json!({"spec": {"extra": false}}))
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_gone(&cms, "shop-extra", WAIT).await;
    wait_for(&parents, "shop", "status.extra.name to go", |p| {
        let status = &p.data["status"];
        if status["observedGeneration"] == json!(2) && status["extra"]["name"].is_null() {
            Ok(())
        } else {
            Err(format!("status {status}"))
        }
    })
    .await;
    operator.stop().await;
}

/// Every parent renders the same child name: a mistake the operator must
/// not turn into parents taking the object from each other.
const CLASH_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: clash
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
          name: shared
        data:
          owner: {{ parent.metadata.name }}
  status:
    fields:
      - path: owner
        value: "metadata.name"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_belongs_to_another_parent_is_not_taken_over() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "App", CLASH_RULE).await;
    let first = app.create(&ns, "first", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "shared").await;

    app.create(&ns, "second", json!({}), &[]).await;
    let parents = app.api(&ns);
    let second = wait_for(
        &parents,
        "second",
        "Synced=False on the second parent",
        |p| match condition_state(p, "Synced")? {
            (s, r) if s == "False" => Ok((r, p.clone())),
            other => Err(format!("Synced is {other:?}")),
        },
    )
    .await;
    let message = condition(&second.1, "Synced").expect("Synced")["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("another parent"),
        "{}: {message}",
        second.0
    );
    tokio::time::sleep(QUIET).await;
    let cm = cms.get("shared").await.expect("child");
    assert_eq!(data(&cm, "owner").as_deref(), Some("first"));
    assert_eq!(
        cm.labels().get("trellis.dev/parent-uid"),
        first.uid().as_ref()
    );
    assert_eq!(
        cm.owner_references().len(),
        1,
        "{:?}",
        cm.owner_references()
    );
    assert_eq!(Some(&cm.owner_references()[0].uid), first.uid().as_ref());
    operator.stop().await;
}

const CREATE_ONLY_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: secret
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: password
      apiVersion: v1
      kind: Secret
      policy: createOnly
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-password" }}
        stringData:
          password: {{ rand_alnum(24) }}
          user: {{ spec.user }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_child_is_created_once_and_never_updated() {
    use k8s_openapi::api::core::v1::Secret;
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "Db", CREATE_ONLY_RULE).await;
    app.create(&ns, "orders", json!({"user": "alice"}), &[])
        .await;
    let secrets: Api<Secret> = ns.api();
    let created = wait_exists(&secrets, "orders-password").await;
    let value = |s: &Secret, k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let password = value(&created, "password").expect("password");
    assert_eq!(password.len(), 24);

    // Spec changes and reconciles do not touch it (nor re-roll the password).
    app.patch(&ns, "orders", json!({"spec": {"user": "bob"}}))
        .await;
    wait_for(
        &app.api(&ns),
        "orders",
        "the new generation to be observed",
        |p| {
            (p.data["status"].is_null() || p.data["status"]["observedGeneration"] == json!(2))
                .then_some(())
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .await;
    tokio::time::sleep(QUIET).await;
    let kept = secrets.get("orders-password").await.expect("secret");
    assert_eq!(kept.resource_version(), created.resource_version());
    assert_eq!(value(&kept, "user").as_deref(), Some("alice"));

    // Deleted: created again, from the current spec.
    secrets
        .delete("orders-password", &DeleteParams::default())
        .await
        .expect("delete");
    let again = wait_for(
        &secrets,
        "orders-password",
        "the secret to be recreated",
        |s| {
            (s.uid() != created.uid())
                .then(|| s.clone())
                .ok_or_else(|| "still the old one".to_owned())
        },
    )
    .await;
    assert_eq!(value(&again, "user").as_deref(), Some("bob"));
    assert_ne!(value(&again, "password"), Some(password));
    operator.stop().await;
}

const RECREATE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: recreate
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      policy: recreate
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        immutable: true
        data:
          version: {{ spec.version }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreate_child_is_replaced_when_its_rendering_changes() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = app_setup(&ns, "Rel", RECREATE_RULE).await;
    app.create(&ns, "v", json!({"version": "1"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    let first = wait_exists(&cms, "v").await;
    assert!(
        first.annotations().contains_key("trellis.dev/render-hash"),
        "{:?}",
        first.annotations()
    );

    // An immutable ConfigMap cannot be updated: it must be replaced.
    app.patch(&ns, "v", json!({"spec": {"version": "2"}})).await;
    let second = wait_for(
        &cms,
        "v",
        "the ConfigMap to be replaced",
        |cm| match data(cm, "version").as_deref() {
            Some("2") => Ok(cm.clone()),
            other => Err(format!("version is {other:?}")),
        },
    )
    .await;
    assert_ne!(second.uid(), first.uid());
    assert_ne!(
        second.annotations().get("trellis.dev/render-hash"),
        first.annotations().get("trellis.dev/render-hash")
    );
    operator.stop().await;
}
